"""The data plane's files anywhere in the guest: stat, list, mkdir, move, remove, download,
uploads, watch.

Each call runs guest jobs inside the guest's namespaces and root as its root user (the guest's
hands: guest_exec.py's file modes), so a path, and any symlink on it, leads only to another
place in the guest's own tree: the control plane never follows a guest path on the host. Paths
are checked here first (absolute, no NUL, at most PATH_MAX bytes: INVALID_ARGUMENT naming the
field); `..` and symlinks are the guest's to resolve, inside its root.

Calls are authorized by their credential and tracked like an exec (data_plane.py): a revoke,
stop, force stop or delete ends a running download or watch at once (its job killed in the
guest) with UNAUTHENTICATED. A download streams the guest job's output with its back-pressure
(runtime/process/guest_access/jobs.py): a client that does not read holds the guest's reader,
never the server's memory. At most MAX_DOWNLOADS downloads and MAX_WATCHES watches of one
workspace run at once on this server (RESOURCE_EXHAUSTED beyond).

An upload is a process in the guest kept by its node (runtime.base.GuestProcesses: the upload
ID is its tag, "kibo-upload-" and 16 hex digits): a "write" or "untar" file job reading its
standard input. Parts are input at their offset (the node refuses one that is not the count
taken: FAILED_PRECONDITION naming where to go on from); the last part closes the input and
commits (SIGUSR1: the end of input alone is also what a server that died leaves, and must not
put a half file in place), then the call follows the upload to its end. A cancel is SIGTERM:
the job removes what it made."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import secrets
import signal
from collections import OrderedDict, defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import msgspec
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from ..domain.access import Caller
from ..domain.errors import (
    Conflict,
    GuestError,
    InvalidArgument,
    KiboError,
    NotFound,
    QuotaExceeded,
    Unimplemented,
)
from ..runtime.base import (
    Exit,
    GuestAccess,
    GuestProcesses,
    GuestRefused,
    JobStopped,
    Output,
    ProcessInfo,
    ProcessSpec,
)
from .data_plane_errors import refused as _refused
from .data_plane_errors import revoked as _revoked
from .data_plane_sessions import Session

if TYPE_CHECKING:
    from .data_plane import DataPlane

log = logging.getLogger(__name__)

# PATH_MAX: a longer path can never be opened.
MAX_PATH_BYTES = 4095
MAX_DEPTH = 32
# One upload part (the proto's bound): well under the 4 MiB message limit.
MAX_PART_BYTES = 2 << 20
# Per workspace, on this server, at once.
MAX_DOWNLOADS = 4
MAX_WATCHES = 4
# What the guest's file jobs may answer: a listing (its lines are cut at 3 MiB in the guest),
# one line (a file's description, a change: two paths of PATH_MAX, JSON-escaped), an
# upload's error report.
MAX_ANSWER_BYTES = 4 << 20
MAX_LINE_BYTES = 64 << 10
MAX_ERROR_BYTES = 64 << 10
# A download's reads from its guest job, hence its messages (jobs.py `read_size`): gRPC's cost
# is per message. Measured (bench/data_plane.py's ceiling at the same message size, 256 MiB):
# 64 KiB 0.89x (407 MiB/s), 256 KiB 1.02x (1,264 MiB/s), 1 MiB 0.57x (1,154 MiB/s: the pipe
# and the event loop are the limit there, and the ceiling streams 512 KiB messages at 2 GiB/s).
# Memory: a job holds at most ~8 reads (jobs.py), so a download ~2 MiB, a workspace's four ~8 MiB.
READ_SIZE = 256 << 10
UPLOAD_PREFIX = "kibo-upload-"
UPLOAD_HEX = 16
HEX = frozenset("0123456789abcdef")
# An upload's file: permission bits of a new file.
MAX_MODE = 0o7777
# A cancel waits this long for the upload's job to have removed what it made.
CANCEL_WAIT_S = 10.0
# The paths of uploads started here, for their errors' messages (the oldest forgotten).
MAX_REMEMBERED_UPLOADS = 1024
# The commit of an upload (guest_files.COMMIT).
COMMIT = signal.SIGUSR1

TYPES = {
    "file": dp.FILE_TYPE_FILE,
    "directory": dp.FILE_TYPE_DIRECTORY,
    "symlink": dp.FILE_TYPE_SYMLINK,
    "other": dp.FILE_TYPE_OTHER,
}
EVENTS = {
    "create": dp.FILE_EVENT_TYPE_CREATE,
    "write": dp.FILE_EVENT_TYPE_WRITE,
    "remove": dp.FILE_EVENT_TYPE_REMOVE,
    "rename": dp.FILE_EVENT_TYPE_RENAME,
    "chmod": dp.FILE_EVENT_TYPE_CHMOD,
}
# Timestamp's range (years 1 to 9999): what is outside cannot be sent as JSON.
MIN_SECONDS, MAX_SECONDS = -62_135_596_800, 253_402_300_799


class _Info(msgspec.Struct, forbid_unknown_fields=True):
    """A file as guest_files.describe tells it."""

    path: str
    name: str
    type: str
    size: int
    mode: int
    uid: int
    gid: int
    owner: str
    group: str
    mtime_ns: int
    target: str


class _Change(msgspec.Struct, forbid_unknown_fields=True):
    """A line of a watch (guest_watch.py)."""

    ready: bool = False
    overflow: bool = False
    type: str = ""
    path: str = ""
    new_path: str = ""
    dir: bool = False


class _Truncated(msgspec.Struct, forbid_unknown_fields=True):
    truncated: bool


class _Report(msgspec.Struct):
    """An upload's error, as its job wrote it on stderr (guest_files._say_error)."""

    status: str
    error: str = ""
    errno: str = ""


_INFO = msgspec.json.Decoder(_Info)
_CHANGE = msgspec.json.Decoder(_Change)
_TRUNCATED = msgspec.json.Decoder(_Truncated)
_REPORT = msgspec.json.Decoder(_Report)


def _path(value: str, field: str) -> str:
    """An absolute guest path without NUL, at most PATH_MAX bytes; `..` is the guest's to
    resolve, inside its root."""
    if not value:
        raise InvalidArgument(f"{field}: give an absolute guest path", field=field)
    if len(value) > MAX_PATH_BYTES or len(value.encode()) > MAX_PATH_BYTES:
        raise InvalidArgument(f"{field} is longer than {MAX_PATH_BYTES} bytes", field=field)
    if "\0" in value:
        raise InvalidArgument(f"{field} contains a NUL byte", field=field)
    if not value.startswith("/"):
        raise InvalidArgument(f"{field} must be an absolute path (it starts with /)", field=field)
    return value


def _mode(value: int, field: str = "mode") -> int:
    if value > MAX_MODE:
        raise InvalidArgument(f"{field}: permission bits only (at most 0o7777)", field=field)
    return value


def _upload_id(value: str) -> str:
    hexes = value[len(UPLOAD_PREFIX) :]
    if not value.startswith(UPLOAD_PREFIX) or len(hexes) != UPLOAD_HEX or not set(hexes) <= HEX:
        raise InvalidArgument(
            f"upload_id is not an upload's ID ({UPLOAD_PREFIX} and {UPLOAD_HEX} hex digits)", field="upload_id"
        )
    return value


def _timestamp(nanoseconds: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(min(MAX_SECONDS * 10**9 + 999_999_999, max(MIN_SECONDS * 10**9, nanoseconds)))
    return stamp


def _text(value: str) -> str:
    """Valid UTF-8 for a proto string (the guest sends it so; a lone surrogate would not encode)."""
    return value.encode("utf-8", "replace").decode("utf-8")


def _file_info(info: _Info) -> dp.FileInfo:
    return dp.FileInfo(
        path=_text(info.path),
        name=_text(info.name),
        type=TYPES.get(info.type, dp.FILE_TYPE_OTHER),
        size=max(0, info.size),
        mode=info.mode & MAX_MODE,
        uid=info.uid & 0xFFFFFFFF,
        gid=info.gid & 0xFFFFFFFF,
        owner=_text(info.owner),
        group=_text(info.group),
        modify_time=_timestamp(info.mtime_ns),
        symlink_target=_text(info.target),
    )


def _bad_answer(what: str) -> GuestError:
    return GuestError(f"the guest's answer to {what} could not be read", hint="retry; the server log may say more")


def _lines(buffer: bytearray, data: bytes) -> Iterator[bytes]:
    """Complete lines of `buffer` + `data` (what is left of a line stays in `buffer`, bounded)."""
    buffer += data
    while (end := buffer.find(b"\n")) >= 0:
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        yield line
    if len(buffer) > MAX_LINE_BYTES:
        raise _bad_answer("a watch or a download")


class _Counted:
    """Calls of one kind running at once, by workspace (this server's)."""

    def __init__(self, kind: str, limit: int) -> None:
        self._kind = kind
        self._limit = limit
        self._running: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def take(self, workspace_id: str) -> Iterator[None]:
        used = self._running[workspace_id]
        if used >= self._limit:
            raise QuotaExceeded(
                f"{used} {self._kind} of this workspace run at once already: wait for one to end",
                quota=f"workspace_{self._kind}",
                limit=self._limit,
                used=used,
                requested=1,
            )
        self._running[workspace_id] = used + 1
        try:
            yield
        finally:
            self._running[workspace_id] -= 1
            if not self._running[workspace_id]:
                del self._running[workspace_id]


class DataPlaneFiles:
    def __init__(self, data_plane: DataPlane) -> None:
        self._dp = data_plane
        self._downloads = _Counted("downloads", MAX_DOWNLOADS)
        self._watches = _Counted("watches", MAX_WATCHES)
        # (instance, upload ID) -> its path, for messages only.
        self._uploads: OrderedDict[tuple[str, str], str] = OrderedDict()

    # -- the parts every call shares -------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _guest(self, credential: str) -> AsyncIterator[tuple[Session, GuestAccess, str]]:
        """The call tracked under its credential (a revoke sets its stop), and its guest."""
        with self._dp.sessions.track(*self._dp._claims(credential)) as session:
            runtime, instance_id, _ = await self._dp._authorize(session)
            yield session, runtime, instance_id

    async def _items(
        self,
        session: Session,
        runtime: GuestAccess,
        instance_id: str,
        job: dict[str, Any],
        path: str,
        field: str,
    ) -> AsyncGenerator[bytes, None]:
        """A file job's standard output as it comes; its errors as the API's."""
        items = runtime.guest_job(instance_id, job, b"", 0.0, session.stop)
        try:
            async with aclosing(items):
                async for item in items:
                    if isinstance(item, Exit):
                        if item.code != 0:
                            raise GuestError(f"{path}: the guest's file job failed (exit {item.code})", field=field)
                    elif isinstance(item, Output) and item.stream == "stdout":
                        yield item.data
        except JobStopped:
            raise _revoked(session) from None
        except GuestRefused as refused:
            raise _refused(refused, path, field) from None

    async def _answer(self, credential: str, job: dict[str, Any], path: str, field: str = "path") -> bytes:
        """A short job's whole output (bounded)."""
        answer = bytearray()
        async with self._guest(credential) as (session, runtime, instance_id):
            chunks = self._items(session, runtime, instance_id, job, path, field)
            async with aclosing(chunks):
                async for chunk in chunks:
                    answer += chunk
                    if len(answer) > MAX_ANSWER_BYTES:
                        raise _bad_answer(str(job["mode"]))
        return bytes(answer)

    # -- stat, list, mkdir, move, remove ---------------------------------------------------------

    async def stat_workspace_path(
        self, request: dp.StatWorkspacePathRequest, caller: Caller
    ) -> dp.StatWorkspacePathResponse:
        path = _path(request.path, "path")
        answer = await self._answer(request.credential, {"mode": "stat", "path": path}, path)
        try:
            info = _INFO.decode(answer)
        except msgspec.MsgspecError:
            raise _bad_answer("stat") from None
        return dp.StatWorkspacePathResponse(info=_file_info(info))

    async def list_workspace_directory(
        self, request: dp.ListWorkspaceDirectoryRequest, caller: Caller
    ) -> dp.ListWorkspaceDirectoryResponse:
        path = _path(request.path, "path")
        if request.depth > MAX_DEPTH:
            raise InvalidArgument(f"depth: at most {MAX_DEPTH}", field="depth")
        job = {"mode": "list", "path": path, "depth": request.depth or 1}
        answer = await self._answer(request.credential, job, path)
        response = dp.ListWorkspaceDirectoryResponse()
        try:
            for line in answer.splitlines():
                if line.startswith(b'{"truncated"'):
                    response.truncated = _TRUNCATED.decode(line).truncated
                else:
                    response.entries.append(_file_info(_INFO.decode(line)))
        except msgspec.MsgspecError:
            raise _bad_answer("a listing") from None
        return response

    async def make_workspace_directory(
        self, request: dp.MakeWorkspaceDirectoryRequest, caller: Caller
    ) -> dp.MakeWorkspaceDirectoryResponse:
        path = _path(request.path, "path")
        job = {"mode": "mkdir", "path": path, "parents": request.parents, "file_mode": _mode(request.mode) or 0o755}
        await self._answer(request.credential, job, path)
        return dp.MakeWorkspaceDirectoryResponse()

    async def move_workspace_path(
        self, request: dp.MoveWorkspacePathRequest, caller: Caller
    ) -> dp.MoveWorkspacePathResponse:
        source = _path(request.source, "source")
        destination = _path(request.destination, "destination")
        job = {"mode": "move", "source": source, "destination": destination}
        try:
            await self._answer(request.credential, job, source, "source")
        except InvalidArgument as refused:
            # The guest names the path it refused first (isolation "none": outside the volumes).
            if refused.message.startswith("destination"):
                refused.field = "destination"
            raise
        return dp.MoveWorkspacePathResponse()

    async def remove_workspace_path(
        self, request: dp.RemoveWorkspacePathRequest, caller: Caller
    ) -> dp.RemoveWorkspacePathResponse:
        path = _path(request.path, "path")
        if posixpath.normpath(path) in ("/", "//"):
            raise InvalidArgument("path: the guest's root is not removed", field="path")
        await self._answer(request.credential, {"mode": "remove", "path": path, "recursive": request.recursive}, path)
        return dp.RemoveWorkspacePathResponse()

    # -- downloads and watches -------------------------------------------------------------------

    async def download_workspace_file(
        self, request: dp.DownloadWorkspaceFileRequest, caller: Caller
    ) -> AsyncGenerator[dp.DownloadWorkspaceFileResponse, None]:
        path = _path(request.path, "path")
        if request.offset < 0:
            raise InvalidArgument("offset must not be negative", field="offset")
        if request.archive and request.offset:
            raise InvalidArgument("offset: an archive is streamed whole (an offset is for a file)", field="offset")
        job: dict[str, Any] = {"mode": "tar-out", "path": path, "read_size": READ_SIZE}
        if not request.archive:
            job = {"mode": "read", "path": path, "anywhere": True, "offset": request.offset, "read_size": READ_SIZE}
        async with self._guest(request.credential) as (session, runtime, instance_id):
            with self._downloads.take(session.workspace_id):
                head = bytearray()
                described = False
                chunks = self._items(session, runtime, instance_id, job, path, "path")
                try:
                    async with aclosing(chunks) as parts:
                        async for data in parts:
                            if described:
                                yield dp.DownloadWorkspaceFileResponse(data=data)
                                continue
                            head += data
                            end = head.find(b"\n")
                            if end < 0:
                                if len(head) > MAX_LINE_BYTES:
                                    raise _bad_answer("a download")
                                continue
                            try:
                                info = _INFO.decode(bytes(head[:end]))
                            except msgspec.MsgspecError:
                                raise _bad_answer("a download") from None
                            described = True
                            first = _file_info(info)
                            if request.archive:
                                first.size = 0  # the directory's; an archive's is not known ahead
                            yield dp.DownloadWorkspaceFileResponse(info=first)
                            if end + 1 < len(head):
                                yield dp.DownloadWorkspaceFileResponse(data=bytes(head[end + 1 :]))
                            head = bytearray()
                except GuestError as error:
                    if "(EISDIR)" in error.message:
                        error.hint = "a directory is downloaded with archive set (a tar stream)"
                    raise
                if not described:
                    raise _bad_answer("a download")

    async def watch_workspace_directory(
        self, request: dp.WatchWorkspaceDirectoryRequest, caller: Caller
    ) -> AsyncGenerator[dp.WatchWorkspaceDirectoryResponse, None]:
        path = _path(request.path, "path")
        job = {"mode": "watch", "path": path, "recursive": request.recursive}
        async with self._guest(request.credential) as (session, runtime, instance_id):
            with self._watches.take(session.workspace_id):
                buffer = bytearray()
                chunks = self._items(session, runtime, instance_id, job, path, "path")
                async with aclosing(chunks):
                    async for chunk in chunks:
                        for line in _lines(buffer, chunk):
                            yield _change(line)

    # -- uploads ---------------------------------------------------------------------------------

    def _keeper(self, runtime: GuestAccess) -> GuestProcesses:
        if not isinstance(runtime, GuestProcesses):
            raise Unimplemented("this workspace's runtime keeps no processes: it takes no uploads")
        return runtime

    def _remember(self, instance_id: str, upload_id: str, path: str) -> None:
        self._uploads[instance_id, upload_id] = path
        while len(self._uploads) > MAX_REMEMBERED_UPLOADS:
            self._uploads.popitem(last=False)

    def _about(self, instance_id: str, upload_id: str) -> str:
        """What an upload's errors are about: its path when it started here (by instance: another
        workspace's credential naming the ID learns nothing of it)."""
        return self._uploads.get((instance_id, upload_id), f"upload {upload_id}")

    async def start_workspace_upload(
        self, request: dp.StartWorkspaceUploadRequest, caller: Caller
    ) -> dp.StartWorkspaceUploadResponse:
        path = _path(request.path, "path")
        mode = _mode(request.mode)
        job: dict[str, Any] = {"mode": "untar" if request.archive else "write", "path": path, "anywhere": True}
        job |= {"parents": request.parents, "commit": True}
        if not request.archive:
            job["file_mode"] = mode or 0o644
        upload_id = f"{UPLOAD_PREFIX}{secrets.token_hex(UPLOAD_HEX // 2)}"
        async with self._guest(request.credential) as (session, runtime, instance_id):
            keeper = self._keeper(runtime)
            try:
                await keeper.start_guest_process(
                    instance_id, ProcessSpec(job=job, tag=upload_id, owner=session.revision)
                )
            except GuestRefused as refused:
                raise _refused(refused, path, "path") from None
            if session.stop.is_set():
                # Revoked while it started: the revoke's end of its processes may have missed it.
                with contextlib.suppress(GuestRefused):
                    await keeper.signal_guest_process(instance_id, upload_id, signal.SIGTERM)
                raise _revoked(session)
        self._remember(instance_id, upload_id, path)
        return dp.StartWorkspaceUploadResponse(upload_id=upload_id)

    async def write_workspace_upload(
        self, request: dp.WriteWorkspaceUploadRequest, caller: Caller
    ) -> dp.WriteWorkspaceUploadResponse:
        upload_id = _upload_id(request.upload_id)
        if len(request.data) > MAX_PART_BYTES:
            raise InvalidArgument(f"data: at most {MAX_PART_BYTES >> 20} MiB a part", field="data")
        if request.offset < 0:
            raise InvalidArgument("offset must not be negative", field="offset")
        async with self._guest(request.credential) as (session, runtime, instance_id):
            keeper = self._keeper(runtime)
            about = self._about(instance_id, upload_id)
            try:
                taken = await keeper.send_guest_process_input(
                    instance_id, upload_id, request.data, close=request.finish, offset=request.offset
                )
            except GuestRefused as refused:
                if session.stop.is_set():
                    raise _revoked(session) from None
                if refused.status == "not-found":
                    raise NotFound(f"upload {upload_id} not found (finished, cancelled or never started)") from None
                if refused.status != "conflict":
                    raise _refused(refused, about, "upload_id") from None
                return await self._refused_part(keeper, instance_id, upload_id, request, session)
            if not request.finish:
                return dp.WriteWorkspaceUploadResponse(size=taken)
            with contextlib.suppress(GuestRefused):  # ended already (an error): its end says how
                await keeper.signal_guest_process(instance_id, upload_id, COMMIT)
            await self._ended(keeper, instance_id, upload_id, session)
            return dp.WriteWorkspaceUploadResponse(size=taken, finished=True)

    async def _refused_part(
        self,
        keeper: GuestProcesses,
        instance_id: str,
        upload_id: str,
        request: dp.WriteWorkspaceUploadRequest,
        session: Session,
    ) -> dp.WriteWorkspaceUploadResponse:
        """A part the upload did not take: the offset is not where it is, or it takes no more input
        (its job failed: its error; or it was finished: a finish sent again is answered as the
        first was). The node may refuse the input of a failed upload before it knows its end."""
        info = await _process(keeper, instance_id, upload_id)
        if info is None:
            raise NotFound(f"upload {upload_id} not found (finished, cancelled or never started)")
        # At the offset, or taken in part by this call before it was refused (a part sent twice is
        # taken whole): it is not the offset, the upload stopped reading (it failed, or ended).
        at = info.received == request.offset or request.offset < info.received < request.offset + len(request.data)
        if info.running and not at:
            raise Conflict(
                f"offset {request.offset} is not where upload {upload_id} is: it has taken {info.received} bytes;"
                f" go on from offset {info.received}",
                field="offset",
                hint=f"send the part at offset {info.received}",
            )
        try:
            async with asyncio.timeout(CANCEL_WAIT_S):
                await self._ended(keeper, instance_id, upload_id, session)  # raises its error, if any
        except TimeoutError:
            raise Conflict(f"upload {upload_id} takes no more input", field="upload_id") from None
        taken = (await _process(keeper, instance_id, upload_id) or info).received
        if request.finish and request.offset + len(request.data) == taken:
            return dp.WriteWorkspaceUploadResponse(size=taken, finished=True)
        raise Conflict(f"upload {upload_id} has finished ({taken} bytes)", field="upload_id")

    async def _ended(self, keeper: GuestProcesses, instance_id: str, upload_id: str, session: Session) -> None:
        """Follow the upload to its end: nothing when its job succeeded, else its error."""
        errors = bytearray()
        code = 0
        about = self._about(instance_id, upload_id)
        items = keeper.follow_guest_process(instance_id, upload_id, replay=True, stop=session.stop)
        try:
            async with aclosing(items):
                async for item in items:
                    if isinstance(item, Exit):
                        code = item.code
                    elif isinstance(item, Output) and item.stream == "stderr" and len(errors) < MAX_ERROR_BYTES:
                        errors += item.data[: MAX_ERROR_BYTES - len(errors)]
        except JobStopped:
            raise _revoked(session) from None
        except GuestRefused as refused:
            raise _refused(refused, about, "path") from None
        if code == 0:
            return
        if code == 128 + signal.SIGTERM:
            raise Conflict(f"upload {upload_id} was cancelled (or not written for a minute)", field="upload_id")
        report = _last_report(bytes(errors))
        if report is not None:
            raise _refused(GuestRefused(report.status, report.error, report.errno), about, "path")
        raise GuestError(f"{about}: the upload failed in the guest (exit {code})", field="path")

    async def cancel_workspace_upload(
        self, request: dp.CancelWorkspaceUploadRequest, caller: Caller
    ) -> dp.CancelWorkspaceUploadResponse:
        upload_id = _upload_id(request.upload_id)
        async with self._guest(request.credential) as (session, runtime, instance_id):
            keeper = self._keeper(runtime)
            try:
                await keeper.signal_guest_process(instance_id, upload_id, signal.SIGTERM)
            except GuestRefused as refused:
                if refused.status == "not-found":
                    raise NotFound(f"upload {upload_id} not found (finished, cancelled or never started)") from None
                # Ended already: cancelled, failed, or finished (then it is in place: say so).
                info = await _process(keeper, instance_id, upload_id)
                if info is not None and not info.running and info.exit_code == 0:
                    raise Conflict(f"upload {upload_id} has finished: it is in place", field="upload_id") from None
                return dp.CancelWorkspaceUploadResponse()
            # Answered once its job has removed what it made.
            with contextlib.suppress(GuestRefused, KiboError, TimeoutError):
                async with asyncio.timeout(CANCEL_WAIT_S):
                    await self._ended(keeper, instance_id, upload_id, session)
            if session.stop.is_set():
                raise _revoked(session)
        self._uploads.pop((instance_id, upload_id), None)
        return dp.CancelWorkspaceUploadResponse()


async def _process(keeper: GuestProcesses, instance_id: str, upload_id: str) -> ProcessInfo | None:
    for info in await keeper.list_guest_processes(instance_id):
        if info.tag == upload_id:
            return info
    return None


def _last_report(errors: bytes) -> _Report | None:
    """The last status line an upload's job wrote on stderr (guest_files._say_error)."""
    for line in reversed(errors.splitlines()):
        with contextlib.suppress(msgspec.MsgspecError):
            return _REPORT.decode(line)
    return None


def _change(line: bytes) -> dp.WatchWorkspaceDirectoryResponse:
    try:
        change = _CHANGE.decode(line)
    except msgspec.MsgspecError:
        raise _bad_answer("a watch") from None
    if change.ready:
        return dp.WatchWorkspaceDirectoryResponse(ready=True)
    if change.overflow:
        return dp.WatchWorkspaceDirectoryResponse(overflow=True)
    return dp.WatchWorkspaceDirectoryResponse(
        change=dp.FileEvent(
            type=EVENTS.get(change.type, dp.FILE_EVENT_TYPE_UNSPECIFIED),
            path=_text(change.path),
            new_path=_text(change.new_path),
            is_directory=change.dir,
        )
    )
