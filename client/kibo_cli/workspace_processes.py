"""`kibo workspace shell|start-process|ps|kill|logs` and `exec --tty`: processes in a running
workspace, kept by its node (kibotos' workspace_access(...).processes).

A terminal session (shell, exec --tty) runs the guest's process on a PTY of the local terminal's
size: the local terminal is put in raw mode, so every key (Ctrl-C, Ctrl-Z, Ctrl-D included) goes
to the guest, each batch of keys a SendWorkspaceProcessInput; a SIGWINCH resizes the guest's
terminal (ResizeWorkspaceProcess); the terminal is restored however kibo leaves (the process's
exit, an error, SIGTERM or SIGHUP), and kibo exits with the process's exit code."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
import termios
import tty
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any

import kibotos
import typer
from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from . import data_plane, output, parsing
from .exit_codes import ExitCode
from .output import Format, note
from .session import OutputOpt, connect, fail, handle, settings

WorkspaceId = Annotated[str, typer.Argument(help="The workspace ID (ws-...).", show_default=False)]
ProcessArg = Annotated[
    str, typer.Argument(metavar="PID|TAG", help="The process: its pid in the guest (a number) or its tag.")
]
UserOpt = Annotated[
    str,
    typer.Option("--user", "-u", help="A user of the guest (a name of its /etc/passwd, or a number). Default root."),
]

# The shell of `kibo workspace shell`: bash when the guest has it, else sh; a login shell, so
# that the guest's /etc/profile sets its PATH and prompt.
SHELL_LINE = "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"
_DEFAULT_SIZE = (24, 80)


def process_selector(text: str) -> int | str:
    """PID|TAG: a number is a pid, anything else a tag."""
    return int(text) if text.isdigit() else text


def signal_number(text: str) -> int:
    """TERM, SIGTERM, term or 15 -> 15; a usage error for anything else."""
    if text.isdigit():
        number = int(text)
        if 1 <= number <= 64:
            return number
    else:
        name = text.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        found = getattr(signal.Signals, name, None)
        if isinstance(found, signal.Signals):
            return int(found)
    raise fail(f"--signal {text}: give a signal name (TERM, KILL, INT, HUP...) or a number 1-64", ExitCode.USAGE)


def _access(client: kibotos.Client, workspace_id: str) -> kibotos.WorkspaceAccess:
    """The workspace's data plane, its credential issued now (so that a workspace that is not
    AVAILABLE is reported with the next step to take)."""
    access = client.workspace_access(workspace_id, retry_unavailable=data_plane.RETRY_SECONDS)
    try:
        access.credential()
    except kibotos.KiboError as error:
        raise data_plane.explain(error, workspace_id) from None
    return access


async def _access_async(client: kibotos.AsyncClient, workspace_id: str) -> kibotos.AsyncWorkspaceAccess:
    access = client.workspace_access(workspace_id, retry_unavailable=data_plane.RETRY_SECONDS)
    try:
        await access.credential()
    except kibotos.KiboError as error:
        raise data_plane.explain(error, workspace_id) from None
    return access


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- a terminal session ---------------------------------------------------------------------------


def _window() -> tuple[int, int]:
    """The local terminal's (rows, cols)."""
    for stream in (sys.stdout, sys.stdin, sys.stderr):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError, AttributeError):
            continue
        if size.lines > 0 and size.columns > 0:
            return size.lines, size.columns
    return _DEFAULT_SIZE


def require_terminal(command: str) -> None:
    stream = sys.stdin
    if stream is None or not stream.isatty():
        raise fail(
            f"{command} needs a terminal: its stdin is not one",
            ExitCode.USAGE,
            hint="run it from a terminal; to run a command with input from a pipe: kibo workspace exec ID -- CMD",
        )


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The terminal in raw mode (no echo, no line editing, no signals from keys) until the end."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _terminal_session(
    workspace_id: str,
    argv: Sequence[str],
    shell: str,
    env: Mapping[str, str],
    cwd: str,
    user: str,
    limit: float | None,
) -> int:
    """Run a process on a PTY with this terminal as its own; its exit code."""
    environment = {"TERM": os.environ.get("TERM") or "xterm-256color", **env}
    async with settings().async_client() as client:
        access = await _access_async(client, workspace_id)
        processes = access.processes
        handle = await processes.start(
            argv, shell=shell, env=environment, cwd=cwd, user=user, pty=_window(), background=False
        )
        async with handle:
            fd = sys.stdin.fileno()
            with _raw(fd):
                try:
                    async with asyncio.timeout(limit):
                        return await _pump(processes, handle, fd)
                except TimeoutError:
                    return 124  # as exec's --timeout; leaving `async with handle` kills it


async def _pump(processes: kibotos.AsyncProcesses, handle: kibotos.AsyncProcessHandle, fd: int) -> int:
    """Keys to the process, its output to stdout, resizes after SIGWINCH, until it exits; SIGTERM
    and SIGHUP end the session (the process is killed with the call) with 128 + N."""
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[bytes] = asyncio.Queue()
    resized = asyncio.Event()
    ended: asyncio.Future[int] = loop.create_future()

    def on_keys() -> None:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""  # EIO: the terminal hung up
        if not data:
            loop.remove_reader(fd)
            return
        keys.put_nowait(data)

    def on_signal(number: int) -> None:
        if not ended.done():
            ended.set_result(128 + number)

    async def send_keys() -> None:
        while True:
            data = await keys.get()
            while not keys.empty():
                data += keys.get_nowait()
            try:
                await processes.send_input(handle, data)
            except (kibotos.ConflictError, kibotos.NotFoundError):
                await asyncio.Future()  # it ended meanwhile: its exit comes on the output stream

    async def send_sizes() -> None:
        while True:
            await resized.wait()
            resized.clear()
            rows, cols = _window()
            try:
                await processes.resize(handle, rows, cols)
            except (kibotos.ConflictError, kibotos.NotFoundError):
                await asyncio.Future()

    async def show_output() -> int:
        async for event in handle:
            if isinstance(event, kibotos.ProcessOutput):
                _write(sys.stdout.fileno(), event.data)
            elif isinstance(event, kibotos.ProcessExit):
                return event.exit_code
        raise kibotos.KiboError("the terminal's stream ended without an exit code")

    loop.add_reader(fd, on_keys)
    loop.add_signal_handler(signal.SIGWINCH, resized.set)
    for number in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(number, on_signal, int(number))
    tasks: set[asyncio.Future[Any]] = {ended, loop.create_task(send_keys()), loop.create_task(send_sizes())}
    output_task = loop.create_task(show_output())
    tasks.add(output_task)
    try:
        while True:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if output_task in done:
                return output_task.result()
            if ended in done:
                return ended.result()
            for task in done:
                task.result()  # a sender's error ends the session
            tasks -= done
    finally:
        loop.remove_reader(fd)
        loop.remove_signal_handler(signal.SIGWINCH)
        for number in (signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(number)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def terminal(
    workspace_id: str,
    argv: Sequence[str] = (),
    *,
    shell: str = "",
    env: Mapping[str, str] | None = None,
    cwd: str = "",
    user: str = "",
    limit: float | None = None,
    what: str = "kibo workspace shell",
) -> int:
    """A terminal session (see the module), its exit code; stdin must be a terminal."""
    require_terminal(what)
    return asyncio.run(_terminal_session(workspace_id, argv, shell, env or {}, cwd, user, limit))


@handle
def shell(
    workspace_id: WorkspaceId,
    user: UserOpt = "",
    cwd: Annotated[str, typer.Option("--cwd", "-w", help="Its working directory in the guest (default /).")] = "",
) -> None:
    """Open an interactive shell in an AVAILABLE workspace.

    bash (else sh), as a login shell, on a terminal of this terminal's size, which follows its
    resizes. Every key goes to the guest (Ctrl-C interrupts
    what runs there; `exit` or Ctrl-D ends the shell); kibo exits with the shell's exit code.
    Needs a terminal (stdin). The shell is killed if kibo is ended (SIGTERM, SIGHUP) or the
    workspace stops."""
    raise typer.Exit(terminal(workspace_id, shell=SHELL_LINE, cwd=cwd, user=user))


# -- background processes -------------------------------------------------------------------------


@handle
def start_process(
    workspace_id: WorkspaceId,
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The command and its arguments, after -- (or --shell).", metavar="CMD", show_default=False),
    ] = None,
    shell_line: Annotated[
        str | None, typer.Option("--shell", "-c", help="A line for /bin/sh -c instead of CMD.", show_default=False)
    ] = None,
    tag: Annotated[str, typer.Option("--tag", "-t", help="A name to find it by (unique among the running ones).")] = "",
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="KEY=VALUE added to its environment (repeatable)."),
    ] = None,
    workdir: Annotated[str, typer.Option("--workdir", "-w", help="Its working directory in the guest.")] = "/",
    user: UserOpt = "",
    fmt: OutputOpt = Format.text,
) -> None:
    """Start a process in an AVAILABLE workspace in the background, and print its pid and tag.

    It runs on after kibo returns, with no input, until it exits or the workspace stops (a stop,
    revoke or delete kills it). Follow its output with kibo workspace logs ID PID|TAG --follow;
    list it with kibo workspace ps ID; end it with kibo workspace kill ID PID|TAG."""
    if bool(command) == bool(shell_line):
        raise fail("give the command after -- or as --shell LINE (one of the two)", ExitCode.USAGE)
    try:
        environment = parsing.pairs(env, "--env")
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    with connect() as client:
        processes = _access(client, workspace_id).processes
        started = processes.start(
            command or (), shell=shell_line or "", env=environment, cwd=workdir, user=user, tag=tag, close_stdin=True
        )
    if fmt is Format.json:
        output.emit_json({"pid": started.pid, "tag": started.tag})
        return
    output.stdout().print(f"{started.pid}{' ' + started.tag if started.tag else ''}", markup=False)
    note(f"next: kibo workspace logs {workspace_id} {started.tag or started.pid} --follow")


def _state(process: dp.WorkspaceProcess) -> str:
    if process.running:
        return "running"
    if process.exit_code > 128:
        return f"killed ({_signal_name(process.exit_code - 128)})"
    return f"exited {process.exit_code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@handle
def ps(workspace_id: WorkspaceId, fmt: OutputOpt = Format.text) -> None:
    """List the processes started in a workspace (start-process, shell, exec --tty).

    Those of its current execution: the running ones and the last ended ones, with their exit
    codes."""
    with connect() as client:
        found = _access(client, workspace_id).processes.list()
    if fmt is Format.json:
        output.emit_json([output.to_dict(p) for p in found])
        return
    table = output.table("PID", "TAG", "STATE", "PTY", "USER", "STARTED", "WORKDIR", "COMMAND")
    for process in found:
        table.add_row(
            str(process.pid),
            process.tag or "-",
            _state(process),
            "yes" if process.pty else "no",
            process.user or "root",
            output.when(process.start_time),
            process.working_dir or "/",
            shlex.join(process.argv),
        )
    output.stdout().print(table)


@handle
def kill(
    workspace_id: WorkspaceId,
    process: ProcessArg,
    signal_name: Annotated[
        str, typer.Option("--signal", "-s", help="The signal: a name (TERM, KILL, INT, HUP...) or a number.")
    ] = "TERM",
) -> None:
    """Send a signal to a process of the workspace (SIGTERM by default, as kill(1))."""
    number = signal_number(signal_name)
    with connect() as client:
        _access(client, workspace_id).processes.signal(process_selector(process), number)
    note(f"{workspace_id}: {_signal_name(number)} sent to {process}")


@handle
def logs(
    workspace_id: WorkspaceId,
    process: ProcessArg,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Go on with its output as it comes, until it exits (Ctrl-C to leave)."),
    ] = False,
) -> None:
    """Print a process's output (with --follow, as it comes).

    What the workspace kept (its last 128 KiB), stdout to stdout and stderr to stderr; with
    --follow, then its output as it comes, until it exits (a line on stderr says how). Without
    --follow kibo stops at the end of what was kept. Leaving never stops the process."""
    try:
        code = asyncio.run(_logs(workspace_id, process_selector(process), follow))
    except KeyboardInterrupt:
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    if code is not None:
        note(f"kibo: {process} {'exited with ' + str(code) if code < 128 else _signalled(code)}")


def _signalled(code: int) -> str:
    return f"was killed by {_signal_name(code - 128)} (exit code {code})"


async def _logs(workspace_id: str, process: int | str, follow: bool) -> int | None:
    """Print the output; the exit code once it came (None: still running)."""
    async with settings().async_client() as client:
        access = await _access_async(client, workspace_id)
        events = access.processes.connect(process, replay=True)
        try:
            async for event in events:
                if isinstance(event, kibotos.ProcessExit):
                    return event.exit_code
                if isinstance(event, kibotos.ProcessReplayed):
                    if not follow:
                        return None  # what was kept has all come: the logs so far
                    continue
                if isinstance(event, kibotos.ProcessDropped):
                    note(f"kibo: [{event.count} bytes of output not kept]")
                    continue
                stream = (sys.stderr if event.stream == "stderr" else sys.stdout).buffer
                stream.write(event.data)
                stream.flush()
            return None
        finally:
            await events.aclose()
