"""The data plane (kibo.ctrl.v1.DataPlaneService): run commands and move files in a
running workspace. What kibotos.Client and kibotos.AsyncClient share.

    credential = client.issue_data_plane_credential(workspace_id).credential
    result = client.exec_workspace_command(credential, ["sh", "-c", "echo hi"])
    client.write_workspace_file(credential, "/data/notes.txt", b"kept across stops")
    content = client.read_workspace_file(credential, "/data/notes.txt")

A credential is issued while the workspace is AVAILABLE (a control-plane call: it needs
an admin token when the server checks tokens) and is refused (UnauthenticatedError) after
a stop, force stop, revoke, delete or new start; a firecracker guest reboot keeps it.
A command still running at such a revoke, stop or delete is killed, and its stream ends
with UnauthenticatedError ("revoked while the call ran"). A file error in the guest has
the code of its cause: a name too long is InvalidArgumentError, a read-only file system or
a directory where a file is wanted ConflictError (reason GUEST_ERROR), a full file system
ResourceExhaustedError, the guest's own file permissions PermissionDeniedError.
Meanwhile (the guest restarting) calls fail with UnavailableError: issuing, reading and
writing retry it for `retry_unavailable` seconds; running a command never does (see
`exec_workspace_command`). Files are read and written in one message each (the server
takes up to 3 MiB), at paths under a volume mount such as /data.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from .errors import KiboError, UnavailableError, WrongPortError
from .settle import Backoff

__all__ = [
    "DEFAULT_RETRY_UNAVAILABLE",
    "MAX_FILE_BYTES",
    "ExecEvent",
    "ExecExit",
    "ExecOutput",
    "ExecResult",
]

T = TypeVar("T")

# How long issuing, reading and writing retry UNAVAILABLE by default (a guest reboot, a
# server restart), seconds.
DEFAULT_RETRY_UNAVAILABLE = 30.0
# The largest file ReadWorkspaceFile / WriteWorkspaceFile move (the server's limit).
MAX_FILE_BYTES = 3 << 20


@dataclass(frozen=True)
class ExecOutput:
    """A chunk of the command's output, as it came."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ExecExit:
    """How the command ended, the last event: its exit code (124 when its timeout passed,
    126 when it could not run, 127 when not found, 128 + N when killed by signal N)."""

    exit_code: int


ExecEvent = ExecOutput | ExecExit


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# -- requests ------------------------------------------------------------------------------


def exec_request(
    credential: str,
    argv: Sequence[str],
    stdin: bytes,
    env: Mapping[str, str] | None,
    working_dir: str,
    timeout: float | None,
) -> dp.ExecWorkspaceCommandRequest:
    if isinstance(argv, str | bytes):
        raise TypeError("argv is a list of arguments (no shell): for a shell line give ['sh', '-c', line]")
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must not be negative")
    return dp.ExecWorkspaceCommandRequest(
        credential=credential,
        argv=list(argv),
        stdin=stdin,
        env=dict(env or {}),
        working_dir=working_dir,
        timeout_seconds=math.ceil(timeout) if timeout else 0,
    )


def exec_deadline(timeout: float | None, call_timeout: float | None) -> float | None:
    """The gRPC deadline of an exec: none without a command timeout (a command may run for
    hours); with one, the server ends the command then, so allow one call timeout more."""
    if not timeout:
        return None
    return math.ceil(timeout) + (call_timeout or DEFAULT_RETRY_UNAVAILABLE)


def event_of(response: dp.ExecWorkspaceCommandResponse) -> ExecEvent:
    kind = response.WhichOneof("output")
    if kind == "stdout":
        return ExecOutput("stdout", response.stdout)
    if kind == "stderr":
        return ExecOutput("stderr", response.stderr)
    return ExecExit(response.exit_code)


def no_exit_code() -> KiboError:
    return KiboError("the command's output stream ended without an exit code; it may not have finished")


class Collector:
    """Folds exec events into an ExecResult."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.exit_code: int | None = None

    def add(self, event: ExecEvent) -> None:
        if isinstance(event, ExecExit):
            self.exit_code = event.exit_code
        elif event.stream == "stdout":
            self.stdout += event.data
        else:
            self.stderr += event.data

    def result(self) -> ExecResult:
        if self.exit_code is None:
            raise no_exit_code()
        return ExecResult(self.exit_code, bytes(self.stdout), bytes(self.stderr))


def check_file_size(content: bytes) -> None:
    if len(content) > MAX_FILE_BYTES:
        raise ValueError(
            f"content is {len(content)} bytes; the data plane writes files up to {MAX_FILE_BYTES >> 20} MiB"
        )


# -- retrying UNAVAILABLE ------------------------------------------------------------------------


class _Retry:
    """UNAVAILABLE (a guest restarting, a server restarting) is retried with backoff until
    `seconds` pass; every other error, and the last UNAVAILABLE, is raised."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + max(seconds, 0.0)
        self.backoff = Backoff(0.05, 1.0, 2.0, jitter=0.2)

    def delay(self, error: KiboError) -> float:
        if not isinstance(error, UnavailableError) or isinstance(error, WrongPortError):
            raise error
        delay = self.backoff.next()
        if time.monotonic() + delay > self.deadline:
            raise error
        return delay


def retrying(call: Callable[[], T], seconds: float) -> T:
    retry = _Retry(seconds)
    while True:
        try:
            return call()
        except KiboError as error:
            delay = retry.delay(error)
        time.sleep(delay)


async def retrying_async(call: Callable[[], Awaitable[T]], seconds: float) -> T:
    retry = _Retry(seconds)
    while True:
        try:
            return await call()
        except KiboError as error:
            delay = retry.delay(error)
        await asyncio.sleep(delay)
