"""The data plane's processes (StartWorkspaceProcess, ConnectWorkspaceProcess, ...), kept by the
workspace's node (runtime.base.GuestProcesses).

Each call is authorized by its credential and tracked like an exec (data_plane.py): a revoke,
stop, force stop or delete ends a running Start or Connect stream (and an input call waiting
for the process to read) with UNAUTHENTICATED. A process belongs to the credential revision it
was started under (`owner`): the DataPlane's hub listener has the node end those of an older
revision, and the node ends them all with the execution. A foreground start follows its process
with `hold` (its output waits for this client: back-pressure to the guest, as an exec) and
kills it when the call ends before it does; a background one returns once it runs.

Every field is checked here first (INVALID_ARGUMENT naming it), without a regex: sizes, NUL
bytes, the tag's characters, the reserved "kibo-" prefix (uploads' tags), PTY sizes, signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncGenerator, Awaitable
from contextlib import aclosing
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from ..domain.access import Caller
from ..domain.errors import InvalidArgument, KiboError, Unimplemented
from ..domain.guest_errors import file_error
from ..domain.validation import quote
from ..runtime.base import (
    RESERVED_TAG_PREFIX,
    Dropped,
    Exit,
    GuestProcesses,
    GuestRefused,
    JobStopped,
    Output,
    ProcessSpec,
    Replayed,
    Selector,
)
from .data_plane_errors import refused as refused_error
from .data_plane_errors import revoked
from .data_plane_sessions import Session

if TYPE_CHECKING:
    from .data_plane import DataPlane

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R", dp.StartWorkspaceProcessResponse, dp.ConnectWorkspaceProcessResponse)

# Bounds on a start's command: arguments, environment entries, and their bytes together (well
# under the kernel's ARG_MAX of 2 MiB, so an exec never fails for its size).
MAX_ARGS = 4096
MAX_ENV = 4096
MAX_COMMAND_BYTES = 1 << 20
# PATH_MAX: a longer working directory can never be entered.
MAX_PATH_BYTES = 4095
# A guest user: a name of its /etc/passwd (these characters) or a number.
MAX_USER_CHARS = 64
USER_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-@$")
# A tag: 1-64 of [A-Za-z0-9._-].
MAX_TAG_CHARS = 64
TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
# A terminal's rows and columns.
MAX_PTY_SIZE = 1000
# One input call's bytes (and a start's stdin).
MAX_INPUT_BYTES = 1 << 20
MAX_SIGNAL = 64

# Kills of foreground processes whose call ended first (kept until done; failures logged).
_KILLS: set[asyncio.Task[None]] = set()


class DataPlaneProcesses:
    def __init__(self, data_plane: DataPlane) -> None:
        self._dp = data_plane

    async def _processes(self, session: Session) -> tuple[GuestProcesses, str]:
        """The runtime keeping the workspace's processes, and its instance."""
        runtime, instance_id, _ = await self._dp._authorize(session)
        if not isinstance(runtime, GuestProcesses):
            raise Unimplemented("this workspace's runtime keeps no processes")
        return runtime, instance_id

    async def start_workspace_process(
        self, request: dp.StartWorkspaceProcessRequest, caller: Caller
    ) -> AsyncGenerator[dp.StartWorkspaceProcessResponse, None]:
        argv, env, cwd, user, tag, pty = _start_arguments(request)
        with self._dp.sessions.track(*self._dp._claims(request.credential)) as session:
            runtime, instance_id = await self._processes(session)
            spec = ProcessSpec(
                argv=argv,
                env=env,
                cwd=cwd,
                user=user,
                tag=tag,
                pty=pty,
                stdin=request.stdin,
                close_stdin=request.close_stdin,
                owner=session.revision,
            )
            try:
                info = await runtime.start_guest_process(instance_id, spec)
            except GuestRefused as refused:
                raise _start_refused(refused, cwd) from None
            if session.stop.is_set():
                # Revoked while it started: the revoke's end may have missed it.
                _kill(runtime, instance_id, info.pid)
                raise self._dp_revoked(session)
            started = dp.StartWorkspaceProcessResponse(started=dp.ProcessStarted(pid=info.pid, tag=info.tag))
            if request.background:
                yield started
                return
            items = runtime.follow_guest_process(instance_id, info.pid, replay=True, stop=session.stop, hold=True)
            ended = False
            try:
                async with aclosing(items):
                    # Attached at once (its output waits for it), while `started` goes out.
                    first = asyncio.ensure_future(anext(items))
                    try:
                        yield started
                        item = await first
                    finally:
                        if not first.done():
                            first.cancel()
                            with contextlib.suppress(BaseException):
                                await first
                    while True:
                        if isinstance(item, Replayed):  # (replayed only so that nothing is missed)
                            item = await anext(items)
                            continue
                        ended = isinstance(item, Exit)
                        yield _event(dp.StartWorkspaceProcessResponse, item)
                        if ended:
                            return
                        item = await anext(items)
            except StopAsyncIteration:
                return
            except JobStopped:
                raise self._dp_revoked(session) from None
            except GuestRefused as refused:
                raise _refused(refused, "process") from None
            finally:
                if not ended:
                    _kill(runtime, instance_id, info.pid)  # a foreground process ends with its call

    async def connect_workspace_process(
        self, request: dp.ConnectWorkspaceProcessRequest, caller: Caller
    ) -> AsyncGenerator[dp.ConnectWorkspaceProcessResponse, None]:
        selector = _selector(request.process)
        with self._dp.sessions.track(*self._dp._claims(request.credential)) as session:
            runtime, instance_id = await self._processes(session)
            items = runtime.follow_guest_process(instance_id, selector, replay=request.replay, stop=session.stop)
            try:
                async with aclosing(items):
                    async for item in items:
                        if isinstance(item, Replayed):
                            yield dp.ConnectWorkspaceProcessResponse(replayed=True)
                        else:
                            yield _event(dp.ConnectWorkspaceProcessResponse, item)
            except JobStopped:
                raise self._dp_revoked(session) from None
            except GuestRefused as refused:
                raise _refused(refused, "process") from None

    async def list_workspace_processes(
        self, request: dp.ListWorkspaceProcessesRequest, caller: Caller
    ) -> dp.ListWorkspaceProcessesResponse:
        with self._dp.sessions.track(*self._dp._claims(request.credential)) as session:
            runtime, instance_id = await self._processes(session)
            try:
                found = await runtime.list_guest_processes(instance_id)
            except GuestRefused as refused:
                raise _refused(refused, "process") from None
        listed = []
        for info in found:
            if info.upload:
                continue  # the data plane's own (files' uploads)
            started = Timestamp()
            started.FromNanoseconds(int(info.start_time * 1e9))
            listed.append(
                dp.WorkspaceProcess(
                    pid=info.pid,
                    tag=info.tag,
                    argv=list(info.argv),
                    pty=info.pty,
                    running=info.running,
                    exit_code=info.exit_code,
                    start_time=started,
                    working_dir=info.cwd,
                    user=info.user,
                )
            )
        return dp.ListWorkspaceProcessesResponse(processes=listed)

    async def send_workspace_process_input(
        self, request: dp.SendWorkspaceProcessInputRequest, caller: Caller
    ) -> dp.SendWorkspaceProcessInputResponse:
        selector = _selector(request.process)
        if len(request.data) > MAX_INPUT_BYTES:
            raise InvalidArgument(f"data is larger than {MAX_INPUT_BYTES >> 20} MiB: send it in parts", field="data")
        with self._dp.sessions.track(*self._dp._claims(request.credential)) as session:
            runtime, instance_id = await self._processes(session)
            sent = runtime.send_guest_process_input(instance_id, selector, request.data, request.close_stdin)
            await self._while_valid(session, sent)
        return dp.SendWorkspaceProcessInputResponse()

    async def signal_workspace_process(
        self, request: dp.SignalWorkspaceProcessRequest, caller: Caller
    ) -> dp.SignalWorkspaceProcessResponse:
        selector = _selector(request.process)
        signum = request.signal or signal.SIGTERM
        if not 1 <= signum <= MAX_SIGNAL:
            raise InvalidArgument(f"signal {request.signal}: 1 to {MAX_SIGNAL} (0: SIGTERM)", field="signal")
        with self._dp.sessions.track(*self._dp._claims(request.credential)) as session:
            runtime, instance_id = await self._processes(session)
            await self._while_valid(session, runtime.signal_guest_process(instance_id, selector, signum))
        return dp.SignalWorkspaceProcessResponse()

    async def resize_workspace_process(
        self, request: dp.ResizeWorkspaceProcessRequest, caller: Caller
    ) -> dp.ResizeWorkspaceProcessResponse:
        selector = _selector(request.process)
        if not request.HasField("size"):
            raise InvalidArgument("size: give the terminal's rows and cols", field="size")
        rows, cols = _pty_size(request.size, "size")
        with self._dp.sessions.track(*self._dp._claims(request.credential)) as session:
            runtime, instance_id = await self._processes(session)
            await self._while_valid(session, runtime.resize_guest_process(instance_id, selector, rows, cols))
        return dp.ResizeWorkspaceProcessResponse()

    async def _while_valid(self, session: Session, call: Awaitable[T]) -> T:
        """`call`, unless its credential is revoked first (then it is cancelled: UNAUTHENTICATED)."""
        task = asyncio.ensure_future(call)
        stopped = asyncio.ensure_future(session.stop.wait())
        try:
            await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task.cancelled():
            raise self._dp_revoked(session)
        try:
            return task.result()
        except GuestRefused as refused:
            if session.stop.is_set():
                raise self._dp_revoked(session) from None
            raise _refused(refused, "process") from None

    @staticmethod
    def _dp_revoked(session: Session) -> KiboError:
        return revoked(session)


def _refused(refused: GuestRefused, field: str) -> KiboError:
    return refused_error(refused, "", field)


def _start_refused(refused: GuestRefused, cwd: str) -> KiboError:
    """A start's refusal: the user (invalid), the working directory (an OS error), the tag in use."""
    if refused.status == "invalid":
        return InvalidArgument(str(refused), field="user")
    if refused.status == "os-error":
        return file_error(refused.errno, cwd, str(refused), "working_dir")
    return refused_error(refused, cwd, "tag" if refused.status == "conflict" else "working_dir")


def _event(kind: type[R], item: Output | Dropped | Exit) -> R:
    if isinstance(item, Exit):
        return kind(exit_code=item.code)
    if isinstance(item, Dropped):
        return kind(dropped_bytes=item.count)
    if item.stream == "pty":
        return kind(pty=item.data)
    if item.stream == "stderr":
        return kind(stderr=item.data)
    return kind(stdout=item.data)


def _kill(runtime: GuestProcesses, instance_id: str, pid: int) -> None:
    """SIGKILL to the process's group, in a task of its own (its caller may be cancelled)."""

    async def kill() -> None:
        with contextlib.suppress(GuestRefused):  # ended meanwhile
            await runtime.signal_guest_process(instance_id, pid, signal.SIGKILL)

    task = asyncio.get_running_loop().create_task(kill())
    _KILLS.add(task)
    task.add_done_callback(_killed)


def _killed(task: asyncio.Task[None]) -> None:
    _KILLS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("ending a foreground process failed: %s", task.exception())


# -- what a request may ask -----------------------------------------------------------------------


def _no_nul(value: str, field: str) -> None:
    if "\0" in value:
        raise InvalidArgument(f"{field} must not contain NUL bytes", field=field)


def _start_arguments(
    request: dp.StartWorkspaceProcessRequest,
) -> tuple[tuple[str, ...], dict[str, str], str, str, str, tuple[int, int] | None]:
    """(argv, env, working directory, user, tag, pty size) of a start, each checked."""
    if request.argv and request.shell:
        raise InvalidArgument("give argv or shell, not both", field="argv")
    if request.shell:
        _no_nul(request.shell, "shell")
        argv: tuple[str, ...] = ("/bin/sh", "-c", request.shell)
    elif request.argv:
        if len(request.argv) > MAX_ARGS:
            raise InvalidArgument(f"argv: at most {MAX_ARGS} arguments", field="argv")
        argv = tuple(request.argv)
        if not argv[0]:
            raise InvalidArgument("argv: the command (argv[0]) is empty", field="argv")
        for arg in argv:
            _no_nul(arg, "argv")
    else:
        raise InvalidArgument("argv: give the command to run (or shell: a line for /bin/sh -c)", field="argv")
    size = sum(len(arg.encode()) + 1 for arg in argv)
    if len(request.env) > MAX_ENV:
        raise InvalidArgument(f"env: at most {MAX_ENV} variables", field="env")
    env = dict(request.env)
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise InvalidArgument(f"env: {quote(key)} is not a variable name", field="env")
        _no_nul(value, "env")
        size += len(key.encode()) + len(value.encode()) + 2
    if size > MAX_COMMAND_BYTES:
        raise InvalidArgument(f"argv and env: more than {MAX_COMMAND_BYTES >> 20} MiB together", field="argv")
    cwd = request.working_dir or "/"
    if len(cwd.encode()) > MAX_PATH_BYTES:
        raise InvalidArgument(f"working_dir is longer than {MAX_PATH_BYTES} bytes", field="working_dir")
    _no_nul(cwd, "working_dir")
    if not cwd.startswith("/"):
        raise InvalidArgument(f"working_dir {quote(cwd)} is not an absolute path", field="working_dir")
    user = request.user
    if user and (len(user) > MAX_USER_CHARS or not all(c in USER_CHARS for c in user)):
        raise InvalidArgument(
            f"user {quote(user)}: a name of the guest's /etc/passwd or a number (1-{MAX_USER_CHARS} of "
            "letters, digits and ._-@$)",
            field="user",
        )
    tag = _tag(request.tag, "tag") if request.tag else ""
    pty = _pty_size(request.pty, "pty") if request.HasField("pty") else None
    if len(request.stdin) > MAX_INPUT_BYTES:
        raise InvalidArgument(f"stdin: more than {MAX_INPUT_BYTES >> 20} MiB (send the rest as input)", field="stdin")
    return argv, env, cwd, user, tag, pty


def _tag(tag: str, field: str) -> str:
    """1-64 of [A-Za-z0-9._-] (checked per character: no regex), not "kibo-..." (the data plane's)."""
    if not 1 <= len(tag) <= MAX_TAG_CHARS or not all(c in TAG_CHARS for c in tag):
        raise InvalidArgument(f"{field} {quote(tag)}: 1 to {MAX_TAG_CHARS} of letters, digits and ._-", field=field)
    if tag.startswith(RESERVED_TAG_PREFIX):
        raise InvalidArgument(f"{field}: tags starting {RESERVED_TAG_PREFIX!r} are reserved", field=field)
    return tag


def _pty_size(size: dp.PtySize, field: str) -> tuple[int, int]:
    for name, value in (("rows", size.rows), ("cols", size.cols)):
        if not 1 <= value <= MAX_PTY_SIZE:
            raise InvalidArgument(f"{field}.{name} {value}: 1 to {MAX_PTY_SIZE}", field=f"{field}.{name}")
    return size.rows, size.cols


def _selector(selector: dp.ProcessSelector) -> Selector:
    """A process by pid (> 0) or tag."""
    which = selector.WhichOneof("selector")
    if which == "pid":
        if selector.pid <= 0:
            raise InvalidArgument(f"process.pid {selector.pid}: a pid is positive", field="process.pid")
        return selector.pid
    if which == "tag":
        return _tag(selector.tag, "process.tag")
    raise InvalidArgument("process: give its pid or its tag", field="process")
