"""What every `kibo` command shares: connection settings, error reporting, confirmation,
and "send a command, settle it, wait for the workspace" with progress."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import kibotos
import typer
from kibotos.token_discovery import Discovery

from . import exit_codes, output, parsing
from .exit_codes import ExitCode
from .output import Format, note
from .progress import Progress

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R", bound=kibotos.CommandResponse)

DEFAULT_TIMEOUT = "1h"
# Resend often while a command executes: each resend is held by the server until the
# command finishes or its settle window passes, so this costs little.
CLI_SETTLE = kibotos.SettleOptions(initial_backoff=0.05, max_backoff=0.5)

# Options shared by many commands.
OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="Output format: text or json.")]
TimeoutOpt = Annotated[
    str, typer.Option("--timeout", help="How long to wait, e.g. 90s, 10m, 1h. Giving up cancels nothing.")
]
NoWaitOpt = Annotated[bool, typer.Option("--no-wait", help="Return once the command is accepted.")]
CommandIdOpt = Annotated[
    str | None,
    typer.Option(
        "--command-id",
        help="Command ID (idempotency key). Resend a command with its ID to get its result; default: a new one.",
    ),
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


@dataclass(frozen=True)
class Settings:
    server: str
    tls: bool = False
    ca_cert: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    # Where the token came from: --token, $KIBO_TOKEN or a local server's token file.
    discovery: Discovery | None = None

    @property
    def token(self) -> str | None:
        return self.discovery.token if self.discovery is not None else None

    def connection(self) -> kibotos.Connection:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        connection = kibotos.Connection.of(
            self.server,
            tls=self.tls,
            root_certificates=read(self.ca_cert),
            certificate_chain=read(self.cert),
            private_key=read(self.key),
            token=self.token,
        )
        if self.discovery is not None:
            connection = dataclasses.replace(connection, discovery=self.discovery)
        return connection

    def client(self) -> kibotos.Client:
        return kibotos.Client(connection=self.connection())

    def async_client(self) -> kibotos.AsyncClient:
        """For the commands that do several things at once (a terminal): open it in the event loop."""
        return kibotos.AsyncClient(connection=self.connection())


_current: list[Settings] = []


def use(settings: Settings) -> None:
    """Set by the top-level options (`kibo --server ...`) before any command runs."""
    _current[:] = [settings]


def settings() -> Settings:
    return _current[0] if _current else Settings(server=kibotos.resolve_address())


def connect() -> kibotos.Client:
    return settings().client()


def fail(message: str, code: ExitCode, *, hint: str = "") -> typer.Exit:
    note(f"kibo: {message}")
    if hint:
        note(f"next: {hint}")
    return typer.Exit(int(code))


def _recovery(workspace_id: str) -> str:
    return (
        f"to recover a FAILED workspace: kibo workspace stop --force {workspace_id}, then kibo workspace start "
        f"{workspace_id} (start directly if the force stop is rejected)"
    )


def report(error: kibotos.KiboError) -> None:
    """Print an SDK error: what happened, the reason, and the next step."""
    if isinstance(error, kibotos.CommandFailedError):
        code = error.status_code
        note(f"kibo: command {error.command_id} ended FAILED: {error.status.message or 'no message'}")
        if error.cancelled:
            note("      it was superseded or cancelled (CANCELLED)")
        elif code is not None:
            note(f"      error code {code.name}")
        workspace = error.workspace
        if workspace is not None and workspace.workspace_id:
            state = kibotos.state_name(workspace.state)
            failure = f": {workspace.failure.message}" if workspace.HasField("failure") else ""
            note(f"      workspace {workspace.workspace_id} is {state}{failure}")
            if state == "FAILED" and not workspace.deletion_started:
                note(f"next: {_recovery(workspace.workspace_id)}")
            elif state == "FAILED":
                note(f"next: delete again to finish: kibo workspace delete {workspace.workspace_id}")
        return
    if isinstance(error, kibotos.KiboTimeoutError):
        note(f"kibo: {error.message}")
        return
    parts = [p for p in (error.reason, f"workspace {error.workspace_state}" if error.workspace_state else "") if p]
    extra = f" ({', '.join(parts)})" if parts else ""
    code_name = error.code.name if error.code is not None else "ERROR"
    note(f"kibo: {code_name}: {error.message}{extra}")
    if error.field:
        note(f"      field: {error.field}")
    if isinstance(error, kibotos.ConflictError) and error.workspace_state == "DELETED":
        # The server's hint for a DELETED workspace speaks of a delete in progress; this one is done.
        note("next: the workspace is DELETED: it can only be read (kibo workspace get, events)")
    elif error.hint:
        note(f"next: {error.hint}")
    elif isinstance(error, kibotos.UnavailableError):
        note(f"next: is a kibo server running at {settings().server}? (--server or KIBO_SERVER)")
    elif isinstance(error, kibotos.UnauthenticatedError) and error.field != "credential":
        # (A refused data-plane credential is not about the token: no token advice.)
        if error.token_discovery:
            note(f"      {error.token_discovery}")
        note("next: pass --token or set KIBO_TOKEN")


def handle(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn SDK errors into a message on stderr and the documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except kibotos.KiboError as error:
            report(error)
            raise typer.Exit(int(exit_codes.of(error))) from None
        except KeyboardInterrupt:
            raise fail("interrupted; a command already sent goes on", ExitCode.INTERRUPTED) from None

    return wrapper


def command_id_or_new(command_id: str | None) -> str:
    """The --command-id given (checked like the server does: '' is INVALID_ARGUMENT, exit 5),
    else a new `kibo/<uuid>`."""
    return kibotos.check_command_id(command_id) if command_id is not None else kibotos.new_command_id("kibo")


def timeout_seconds(text: str) -> float:
    try:
        return parsing.duration(text)
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None


def confirm(question: str, yes: bool, *, require_terminal: bool) -> None:
    """Ask `question` unless --yes. With `require_terminal`, a missing terminal needs --yes."""
    if yes:
        return
    if require_terminal and not sys.stdin.isatty():
        raise fail("stdin is not a terminal, so there is no one to confirm", ExitCode.USAGE, hint="pass --yes")
    try:
        confirmed = typer.confirm(question, default=False, err=True)
    except typer.Abort:
        confirmed = False
    if not sys.stdin.isatty():
        note("")  # the answer was not echoed: end the prompt's line
    if not confirmed:
        raise fail("not confirmed; nothing was sent", ExitCode.NOT_CONFIRMED)


Send = Callable[[kibotos.SettleOptions, Callable[[kibotos.CommandResponse], object]], R]


def run_command(
    client: kibotos.Client,
    label: str,
    send: Send[R],
    *,
    timeout: float,
    deleted: bool = False,
    what: str = "the command",
) -> tuple[R, kibotos.WaitResult]:
    """Send and settle a command (resending the identical request), then wait until the
    workspace is steady; show progress meanwhile. Giving up exits 10 and cancels nothing."""
    deadline = time.monotonic() + timeout
    sent: list[kibotos.CommandResponse] = []

    def on_answer(response: kibotos.CommandResponse) -> None:
        sent.append(response)
        progress.on_answer(response)

    options = kibotos.SettleOptions(
        timeout=timeout, initial_backoff=CLI_SETTLE.initial_backoff, max_backoff=CLI_SETTLE.max_backoff
    )
    try:
        with Progress(label) as progress:
            response = send(options, on_answer)
            result = client.wait(
                response.workspace.workspace_id,
                response.command.command_id,
                deleted=deleted,
                timeout=max(0.1, deadline - time.monotonic()),
                on_update=progress.on_update,
            )
    except kibotos.KiboTimeoutError as error:
        command_id = error.command_id or (sent[-1].command.command_id if sent else "")
        workspace_id = sent[-1].workspace.workspace_id if sent else ""
        note(f"kibo: gave up waiting after {timeout:g}s; {what} goes on (giving up never cancels it)")
        if command_id:
            note(f"next: kibo command get {command_id}")
            if workspace_id:
                note(f"      kibo workspace wait {workspace_id} --command {command_id}")
        raise typer.Exit(int(ExitCode.WAIT_TIMEOUT)) from None
    return response, result


def accepted(response: kibotos.CommandResponse, fmt: Format) -> None:
    """--no-wait: say what was accepted and how to follow it."""
    if fmt is Format.json:
        output.emit_json({"workspace": output.to_dict(response.workspace), "command": output.to_dict(response.command)})
        return
    command = response.command
    workspace_id = response.workspace.workspace_id
    console = output.stdout()
    console.print(
        f"{workspace_id}: command {command.command_id} is {kibotos.command_state_name(command.state)}, "
        f"workspace {kibotos.state_name(response.workspace.state)}",
        markup=False,
    )
    if not kibotos.is_terminal(command):
        console.print(f"follow it: kibo workspace wait {workspace_id} --command {command.command_id}", markup=False)
