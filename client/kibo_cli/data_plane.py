"""`kibo workspace exec`: run a command in a running workspace through the data plane, and what
the data-plane commands share (workspace_processes.py, workspace_files.py). Each run issues a
fresh data-plane credential (the workspace must be AVAILABLE), then uses it."""

from __future__ import annotations

import contextlib
import os
import sys
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
    "runs, kibo says it may have run and exits 8. Ctrl-C stops the command (exit 130).\n\n"
    "--tty (-t) runs it on a terminal instead, as kibo workspace shell does: kibo's terminal (its "
    "stdin must be one) in raw mode, every key to the command (Ctrl-C too), its size followed, "
    "exit code passed through."
)


def explain(error: kibotos.KiboError, workspace_id: str) -> typer.Exit:
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
        raise explain(error, workspace_id) from None


def _refused_credential(error: kibotos.KiboError, workspace_id: str) -> typer.Exit:
    """A data-plane call failed; an UNAUTHENTICATED one means the fresh credential was revoked."""
    if isinstance(error, kibotos.UnauthenticatedError):
        note(f"kibo: UNAUTHENTICATED: {error.message}")
        note(f"      {workspace_id} was stopped, restarted or its access revoked meanwhile; nothing was done")
        return typer.Exit(int(ExitCode.NOT_ALLOWED))
    return explain(error, workspace_id)


def stdin_bytes() -> bytes:
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


def write_out(stream: BinaryIO, data: bytes) -> None:
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
    tty: Annotated[
        bool, typer.Option("--tty", "-t", help="Run it on a terminal: this one, in raw mode (stdin must be one).")
    ] = False,
) -> None:
    try:
        environment = parsing.pairs(env, "--env")
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    limit = timeout_seconds(timeout) if timeout is not None else None
    if limit is not None and limit <= 0:
        raise fail("--timeout must be positive", ExitCode.USAGE)
    if tty:
        if no_stdin:
            raise fail("--no-stdin and --tty: a terminal's input is its keys", ExitCode.USAGE)
        from .workspace_processes import terminal  # it uses this module's helpers

        raise typer.Exit(
            terminal(workspace_id, command, env=environment, cwd=workdir, limit=limit, what="kibo workspace exec --tty")
        )
    stdin = b"" if no_stdin or sys.stdin is None or sys.stdin.isatty() else stdin_bytes()
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
                write_out(out if event.stream == "stdout" else err, event.data)
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
