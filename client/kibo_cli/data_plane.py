"""`kibo workspace exec` and `kibo workspace cp`: use a running workspace through the data
plane. Each run issues a fresh data-plane credential (the workspace must be AVAILABLE),
then runs the command or moves the file with it."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Annotated, BinaryIO

import grpc
import kibotos
import typer
from kibotos.data_plane import MAX_FILE_BYTES
from typer._click import core as click_core  # typer 0.29 vendors click: its exceptions are these
from typer._click import exceptions as click_exceptions
from typer.core import TyperCommand

from . import parsing
from .exit_codes import ExitCode, of
from .output import note
from .session import _recovery, fail, handle, report, timeout_seconds
from .session import connect as _connect

WorkspaceId = Annotated[str, typer.Argument(help="The workspace ID (ws-...).", show_default=False)]
# Reading and writing retry a restarting guest this long (issuing the credential first
# does not retry, so an unreachable server is reported at once).
RETRY_SECONDS = 10.0
# WORKSPACE_ID:/path: the ID has no `/`, so `./a:b` and `/x:y` are local paths.
_REMOTE = re.compile(r"(?P<workspace>[^/:]+):(?P<path>.*)", re.DOTALL)

EXEC_HELP = (
    "Run a command in an AVAILABLE workspace, streaming its output; exit with its exit code.\n\n"
    "Put the command after --: kibo workspace exec ID -- sh -c 'ls /data | wc -l'. It runs "
    "without a shell, in the guest's namespaces, as the guest sees its files (volumes at their "
    "mount paths, e.g. /data). Its stdout and stderr come out on kibo's stdout and stderr as "
    "they are produced. When kibo's stdin is not a terminal it is read to its end and given to "
    "the command (up to 3 MiB; --no-stdin to give nothing).\n\n"
    "Exit status: the command's own exit code (124 when --timeout passed, 126 when it could not "
    "run, 127 when not found, 128+N when killed by signal N). When kibo itself fails it prints "
    "a `kibo:` line on stderr and exits with the code of the table in kibo --help (e.g. 4: the "
    "workspace is not AVAILABLE). A command is never resent: if the connection breaks while it "
    "runs, kibo says it may have run and exits 8. Ctrl-C stops the command (exit 130)."
)

CP_HELP = (
    "Copy a file into or out of an AVAILABLE workspace.\n\n"
    "Exactly one side is WORKSPACE_ID:/path, an absolute path under one of the workspace's "
    "volume mounts (e.g. ws-...:/data/notes.txt); the other is a local file, or - for stdin "
    "(upload) or stdout (download). Upload: the workspace file is created or replaced "
    "atomically, with the local file's permission bits (0644 from stdin); a remote path ending "
    "in / takes the local file's name. Download: into an existing local directory the file "
    "keeps its name. Up to 3 MiB per file; directories are not copied."
)


def _local_error(error: OSError, what: str) -> typer.Exit:
    return fail(f"cannot {what} {error.filename or ''}: {error.strerror}", ExitCode.ERROR)


def _explain(error: kibotos.KiboError, workspace_id: str) -> typer.Exit:
    """Report an error of issuing or using a credential, with the next step, and exit."""
    report(error)
    if isinstance(error, kibotos.ConflictError) and not error.hint:
        state = error.workspace_state
        if state == "STOPPED":
            note(f"next: start it first: kibo workspace start {workspace_id}")
        elif state == "FAILED":
            note(f"next: {_recovery(workspace_id)}")
        elif state in ("CREATING", "STARTING"):
            note(f"next: wait until it is AVAILABLE: kibo workspace wait {workspace_id}")
    elif error.code == grpc.StatusCode.UNIMPLEMENTED:
        note("next: the data plane needs a server running real sandboxes (kibo-ctrl serve --runtime process)")
    return typer.Exit(int(of(error)))


def _issue(client: kibotos.Client, workspace_id: str) -> str:
    try:
        return client.issue_data_plane_credential(workspace_id, retry_unavailable=0).credential
    except kibotos.KiboError as error:
        raise _explain(error, workspace_id) from None


def _refused_credential(error: kibotos.KiboError, workspace_id: str) -> typer.Exit:
    """A data-plane call failed; an UNAUTHENTICATED one means the fresh credential was revoked."""
    if isinstance(error, kibotos.UnauthenticatedError):
        note(f"kibo: UNAUTHENTICATED: {error.message}")
        note(f"      {workspace_id} was stopped, restarted or its access revoked meanwhile; nothing was done")
        return typer.Exit(int(ExitCode.NOT_ALLOWED))
    return _explain(error, workspace_id)


def _stdin_bytes() -> bytes:
    stream = sys.stdin
    if stream is None:
        return b""
    data = stream.buffer.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise fail(
            f"stdin is larger than {MAX_FILE_BYTES >> 20} MiB, the most one exec or cp carries",
            ExitCode.INVALID_ARGUMENT,
            hint="split the data into parts (e.g. cp each part, then cat them in the workspace)",
        )
    return data


def _write(stream: BinaryIO, data: bytes) -> None:
    stream.write(data)
    stream.flush()


# -- exec ----------------------------------------------------------------------------------


class ExecCommand(TyperCommand):
    """`kibo workspace exec`: an unknown option is most often the command's own option given
    without `--` before the command; say so instead of only "No such option"."""

    def parse_args(self, ctx: click_core.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click_exceptions.NoSuchOption as error:
            raise click_exceptions.UsageError(
                f"{error.format_message()}. To pass options to the command, put -- before it: "
                "kibo workspace exec ID -- CMD [ARG]... (e.g. -- ls -l /data)",
                ctx,
            ) from None


@handle
def exec_command(
    workspace_id: WorkspaceId,
    command: Annotated[
        list[str],
        typer.Argument(help="The command and its arguments, after --.", metavar="CMD", show_default=False),
    ],
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout", help="Kill the command after this long (e.g. 30s, 5m); it then exits 124. Default: no limit."
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="KEY=VALUE added to the command's environment (repeatable)."),
    ] = None,
    workdir: Annotated[
        str, typer.Option("--workdir", "-w", help="Working directory of the command in the guest.")
    ] = "/",
    no_stdin: Annotated[
        bool, typer.Option("--no-stdin", "-n", help="Give the command no input, even when stdin is not a terminal.")
    ] = False,
) -> None:
    try:
        environment = parsing.pairs(env, "--env")
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    limit = timeout_seconds(timeout) if timeout is not None else None
    if limit is not None and limit <= 0:
        raise fail("--timeout must be positive", ExitCode.USAGE)
    stdin = b"" if no_stdin or sys.stdin is None or sys.stdin.isatty() else _stdin_bytes()
    out, err = sys.stdout.buffer, sys.stderr.buffer
    with _connect() as client:
        credential = _issue(client, workspace_id)
        events = client.exec_workspace_command_stream(
            credential, command, stdin=stdin, env=environment, working_dir=workdir, timeout=limit
        )
        started, code = False, None
        try:
            for event in events:
                if isinstance(event, kibotos.ExecExit):
                    code = event.exit_code
                    break
                started = True
                _write(out if event.stream == "stdout" else err, event.data)
        except KeyboardInterrupt:
            raise fail("interrupted: the command was stopped", ExitCode.INTERRUPTED) from None
        except BrokenPipeError:
            # Like a command killed by SIGPIPE; nothing more can be written to stdout.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(128 + 13) from None
        except kibotos.KiboError as error:
            # A rejection before the command ran carries the server's reason; anything else
            # (the connection broke, a stream without an exit code) may have come after.
            rejected = not started and (bool(error.reason) or error.code == grpc.StatusCode.UNIMPLEMENTED)
            if rejected:
                raise _refused_credential(error, workspace_id) from None
            report(error)
            note("kibo: the command may have run (or may still run); its exit code is unknown. It was not resent.")
            raise typer.Exit(int(of(error) if error.code is not None else ExitCode.UNAVAILABLE)) from None
        finally:
            events.close()  # cancels the call if still open: the server kills the command
    # The SDK's stream ends with the exit code or raises, so `code` is set here.
    raise typer.Exit(code if code is not None else int(ExitCode.UNAVAILABLE))


# -- cp ------------------------------------------------------------------------------------


def _side(text: str) -> tuple[str, str] | None:
    """(workspace ID, path) when `text` names a workspace file, else None (a local path)."""
    match = _REMOTE.fullmatch(text)
    if match is None:
        return None
    return match["workspace"], match["path"]


@handle
def cp(
    src: Annotated[str, typer.Argument(help="WORKSPACE_ID:/path, a local file, or - (stdin).", show_default=False)],
    dst: Annotated[str, typer.Argument(help="WORKSPACE_ID:/path, a local file or directory, or - (stdout).")],
) -> None:
    source, target = _side(src), _side(dst)
    if (source is None) == (target is None):
        raise fail(
            "give exactly one side as WORKSPACE_ID:/path (the other is a local path or -)",
            ExitCode.USAGE,
            hint="kibo workspace cp notes.txt ws-...:/data/notes.txt, or the other way round",
        )
    remote = source or target
    assert remote is not None
    workspace_id, path = remote
    if not path.startswith("/"):
        raise fail(
            f"{workspace_id}:{path}: the workspace path must be absolute, under a volume mount (e.g. /data/...)",
            ExitCode.USAGE,
        )
    if target is not None:
        _upload(src, workspace_id, path)
    else:
        _download(workspace_id, path, dst)


def _upload(local: str, workspace_id: str, path: str) -> None:
    mode = 0
    if local == "-":
        if path.endswith("/"):
            raise fail(f"{workspace_id}:{path}: name the file to write from stdin", ExitCode.USAGE)
        content = _stdin_bytes()
    else:
        file = Path(local)
        try:
            if file.is_dir():
                raise fail(f"{local} is a directory: cp copies one file", ExitCode.USAGE)
            mode = file.stat().st_mode & 0o777
            if file.stat().st_size > MAX_FILE_BYTES:
                raise fail(
                    f"{local} is larger than {MAX_FILE_BYTES >> 20} MiB, the most cp carries",
                    ExitCode.INVALID_ARGUMENT,
                )
            content = file.read_bytes()
        except OSError as error:
            raise _local_error(error, "read") from None
        if path.endswith("/"):
            path += file.name
    with _connect() as client:
        credential = _issue(client, workspace_id)
        try:
            size = client.write_workspace_file(credential, path, content, mode=mode, retry_unavailable=RETRY_SECONDS)
        except kibotos.KiboError as error:
            raise _refused_credential(error, workspace_id) from None
    note(f"{workspace_id}:{path}: {size} bytes written")


def _download(workspace_id: str, path: str, local: str) -> None:
    with _connect() as client:
        credential = _issue(client, workspace_id)
        try:
            content = client.read_workspace_file(credential, path, retry_unavailable=RETRY_SECONDS)
        except kibotos.KiboError as error:
            raise _refused_credential(error, workspace_id) from None
    if local == "-":
        _write(sys.stdout.buffer, content)
        return
    file = Path(local)
    if file.is_dir():
        file = file / PurePosixPath(path).name
    temporary = file.with_name(f".{file.name}.kibo-{os.getpid()}.tmp")
    try:
        temporary.write_bytes(content)
        temporary.replace(file)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise _local_error(error, "write") from None
    note(f"{file}: {len(content)} bytes from {workspace_id}:{path}")
