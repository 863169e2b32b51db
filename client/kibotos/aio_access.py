"""Processes and files of a running workspace, written once: AsyncWorkspaceAccess here (awaitable,
from AsyncClient.workspace_access) and kibotos.WorkspaceAccess, the same blocking (from
Client.workspace_access), which `python -m kibotos._generate` writes into access.py from this file
with unasync. Edit this file, then regenerate.

    with kibotos.Client() as client:
        workspace = client.workspace_access(workspace_id)
        web = workspace.processes.start(["python3", "-m", "http.server", "8000"], tag="web")
        for event in workspace.processes.connect("web"):      # its output, then its exit
            ...
        result = workspace.processes.run(["ls", "-l", "/"])   # ProcessResult(exit_code, stdout...)
        workspace.files.upload("/work/big.bin", "big.bin", progress=print)
        workspace.files.download_dir("/work/src", "./src")
        for event in workspace.files.watch_dir("/work", recursive=True):
            ...

A process started here belongs to the workspace's execution: a stop, force stop, revoke or delete
ends it. Paths are absolute guest paths, anywhere the guest's root reaches (its writable layer
and its volumes). Errors of the server are KiboError subclasses (kibotos.errors: a missing path
NotFoundError, a tag in use or a resize without a PTY ConflictError, too many processes or
uploads QuotaExceededError...); argument errors found before any call are TypeError/ValueError.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from signal import SIGKILL, SIGTERM
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import grpc
from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from . import access_common as common
from . import data_plane as dpl
from .access_common import ProcessEvent, ProcessExit, ProcessResult, Selector, TransferProgress, WatchEvent
from .errors import KiboError, UnavailableError, WrongPortError, from_rpc_error
from .settle import Backoff

if TYPE_CHECKING:
    from .aio import AsyncClient

__all__ = ["AsyncFiles", "AsyncProcessHandle", "AsyncProcesses", "AsyncWorkspaceAccess"]

LocalFile = str | os.PathLike[str] | IO[bytes]


class AsyncWorkspaceAccess:
    """The data plane of one workspace, which must be AVAILABLE: `processes` and `files`.

    Its data-plane credential is issued at the first call (client.issue_data_plane_credential, a
    control-plane call: it needs an admin token when the server checks tokens), unless one is given
    (`credential=`). A call refused because the credential was revoked is sent once more with a new
    credential when, and only when, the workspace was started again since (a new execution, whose
    credential this handle could not have had); a revoke, stop, force stop or delete within the
    same execution is not undone: its refusal (UnauthenticatedError) is raised, and a given
    credential is never replaced. A stream is sent again only when refused before its first
    message, so nothing runs twice.

    UNAVAILABLE (the guest restarting) is retried for `retry_unavailable` seconds by the calls safe
    to repeat: stat, list_dir, processes.list, resize, each part of an upload (its offset makes a
    resend harmless) and a file's download (resumed where it broke, if the file is unchanged)."""

    def __init__(
        self,
        client: AsyncClient,
        workspace_id: str,
        *,
        credential: str = "",
        retry_unavailable: float = dpl.DEFAULT_RETRY_UNAVAILABLE,
    ) -> None:
        self.client = client
        self.workspace_id = workspace_id
        self.retry_unavailable = retry_unavailable
        self._credential = credential
        # The execution generation of the credential this handle issued (None: given, or none yet).
        self._generation: int | None = None
        self.processes = AsyncProcesses(self)
        self.files = AsyncFiles(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.workspace_id!r})"

    async def credential(self) -> str:
        """The data-plane credential the calls carry (issued at the first call)."""
        if not self._credential:
            issued = await self.client.issue_data_plane_credential(
                self.workspace_id, retry_unavailable=self.retry_unavailable
            )
            self._credential, self._generation = issued.credential, issued.execution_generation
        return self._credential

    async def _renewed(self, refused: str, error: KiboError) -> str:
        """The credential to send a refused call with again, or `error` raised: see the class."""
        if not common.refused_credential(error):
            raise error
        if self._credential != refused:
            return self._credential  # another call renewed it meanwhile
        if self._generation is None:
            raise error
        try:
            issued = await self.client.issue_data_plane_credential(self.workspace_id, retry_unavailable=0)
        except KiboError:
            raise error from None
        if issued.execution_generation == self._generation:
            raise error  # the same execution: a revoke (or a stop and a delete) meant to cut this
        self._credential, self._generation = issued.credential, issued.execution_generation
        return self._credential

    async def _call(self, method: Any, request: Any) -> Any:
        connection = self.client.connection
        try:
            return await method(request, timeout=connection.timeout, metadata=connection.metadata())
        except grpc.RpcError as error:
            raise connection.explain(from_rpc_error(error)) from None

    async def _unary(self, method: Any, request: Any, *, retry: bool = False) -> Any:
        """One call with the credential (renewed once as the class says); UNAVAILABLE retried
        for retry_unavailable seconds when `retry`."""

        async def once() -> Any:
            credential = await self.credential()
            request.credential = credential
            try:
                return await self._call(method, request)
            except KiboError as error:
                request.credential = await self._renewed(credential, error)
                return await self._call(method, request)

        if not retry:
            return await once()
        return await dpl.retrying_async(once, self.retry_unavailable)

    async def _stream(self, method: Any, request: Any) -> AsyncGenerator[Any, None]:
        """A server stream's messages; sent again with a renewed credential only when refused
        before its first message. Closing the generator cancels the call."""
        credential = await self.credential()
        renewed = False
        connection = self.client.connection
        while True:
            request.credential = credential
            call = method(request, metadata=connection.metadata())
            received = False
            try:
                async for response in call:
                    received = True
                    yield response
                return
            except grpc.RpcError as error:
                failure = connection.explain(from_rpc_error(error))
            finally:
                call.cancel()
            if received or renewed:
                raise failure
            credential = await self._renewed(credential, failure)
            renewed = True


# -- processes ------------------------------------------------------------------------------------


async def _process_events(responses: AsyncGenerator[Any, None]) -> AsyncGenerator[ProcessEvent, None]:
    async with contextlib.aclosing(responses):
        async for response in responses:
            event = common.process_event(response)
            yield event
            if isinstance(event, ProcessExit):
                return
    raise common.no_exit_code()


class AsyncProcessHandle:
    """A process start() started: its `pid` in the guest and its `tag`.

    A foreground one's events (ProcessOutput, ProcessDropped, then ProcessExit) are this handle's
    to read (`async for event in handle`), with back-pressure: the process waits while they are
    not read. Closing the handle (or leaving `async with handle:`) before its exit cancels the call,
    which kills the process. A background one runs on by itself: processes.connect(handle)
    follows it."""

    def __init__(self, pid: int, tag: str, events: AsyncGenerator[ProcessEvent, None] | None) -> None:
        self.pid = pid
        self.tag = tag
        self._events = events

    def __repr__(self) -> str:
        kind = "background" if self.background else "foreground"
        return f"{type(self).__name__}(pid={self.pid}, tag={self.tag!r}, {kind})"

    @property
    def background(self) -> bool:
        return self._events is None

    def __aiter__(self) -> AsyncGenerator[ProcessEvent, None]:
        if self._events is None:
            raise TypeError("a background process's events are not on its handle: follow it with processes.connect")
        return self._events

    async def collect(self) -> ProcessResult:
        """Read a foreground process to its end: its exit code and output."""
        collector = common.Collector()
        async for event in self:
            collector.add(event)
        return collector.result(self.pid, self.tag)

    async def close(self) -> None:
        """A foreground process still running is killed (its call cancelled); idempotent."""
        if self._events is not None:
            await self._events.aclose()

    async def __aenter__(self) -> AsyncProcessHandle:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()


class AsyncProcesses:
    """Processes of the workspace (StartWorkspaceProcess and the calls around it). A process is
    named by its pid (int), its tag (str) or the handle start() returned. The node keeps them,
    running and the last 16 ended (with the last 128 KiB of their output); at most 32 run at once
    (QuotaExceededError past it)."""

    def __init__(self, access: AsyncWorkspaceAccess) -> None:
        self._access = access
        self._stub = access.client.data_plane

    async def start(
        self,
        argv: Sequence[str] = (),
        *,
        shell: str = "",
        env: Mapping[str, str] | None = None,
        cwd: str = "",
        user: str = "",
        pty: tuple[int, int] | None = None,
        tag: str = "",
        stdin: bytes = b"",
        close_stdin: bool = False,
        background: bool = True,
    ) -> AsyncProcessHandle:
        """Start `argv` (no shell), or `shell`: a line for /bin/sh -c; return once it runs.

        `env` is added to the guest's environment; `cwd` defaults to /; `user` is a guest user
        (a name of its /etc/passwd, or a number; root by default); `pty=(rows, cols)` gives it a
        terminal (its output then comes as "pty"); `tag` names it (unique among the running
        ones); `stdin` is written first, then closed when `close_stdin`.

        `background` (the default): it runs on after this call; follow it with connect().
        Otherwise the handle carries its events and closing the handle kills it (see
        AsyncProcessHandle). Never resent once it may have started."""
        request = common.start_request(argv, shell, env, cwd, user, pty, tag, stdin, close_stdin, background)
        responses = self._access._stream(self._stub.StartWorkspaceProcess, request)
        try:
            first = await anext(responses, None)
            if first is None or first.WhichOneof("event") != "started":
                raise KiboError("the process's stream did not begin with its start")
            if background:
                async for _ in responses:  # the server ends a background start's stream at once
                    pass
        except BaseException:
            await responses.aclose()
            raise
        started = first.started
        if background:
            return AsyncProcessHandle(started.pid, started.tag, None)
        return AsyncProcessHandle(started.pid, started.tag, _process_events(responses))

    async def run(
        self,
        argv: Sequence[str] = (),
        *,
        shell: str = "",
        env: Mapping[str, str] | None = None,
        cwd: str = "",
        user: str = "",
        pty: tuple[int, int] | None = None,
        tag: str = "",
        stdin: bytes = b"",
    ) -> ProcessResult:
        """Run a process in the foreground to its end (`stdin` given, then closed) and return its
        exit code and output (a non-zero exit code is a result, not an error)."""
        handle = await self.start(
            argv,
            shell=shell,
            env=env,
            cwd=cwd,
            user=user,
            pty=pty,
            tag=tag,
            stdin=stdin,
            close_stdin=True,
            background=False,
        )
        async with handle:
            return await handle.collect()

    def connect(self, process: Selector, *, replay: bool = True) -> AsyncGenerator[ProcessEvent, None]:
        """Follow a process: with `replay` the output the node kept first (its last 128 KiB), then
        its output as it comes, then its ProcessExit (at once for one that ended). Leaving the
        iteration leaves the process running."""
        request = dp.ConnectWorkspaceProcessRequest(process=common.selector(process), replay=replay)
        return _process_events(self._access._stream(self._stub.ConnectWorkspaceProcess, request))

    async def list(self) -> builtins.list[dp.WorkspaceProcess]:
        """The processes started through the data plane in this execution, running and ended."""
        response: dp.ListWorkspaceProcessesResponse = await self._access._unary(
            self._stub.ListWorkspaceProcesses, dp.ListWorkspaceProcessesRequest(), retry=True
        )
        return builtins.list(response.processes)

    async def send_input(self, process: Selector, data: bytes, *, close: bool = False) -> None:
        """Write `data` to the process's standard input (its terminal with a PTY: b"\\x03" is
        Ctrl-C), in parts of 1 MiB, each waiting while the process does not read; then close its
        stdin when `close` (no effect on a terminal: send b"\\x04" there)."""
        target = common.selector(process)
        for part, last in common.input_parts(bytes(data), close):
            request = dp.SendWorkspaceProcessInputRequest(process=target, data=part, close_stdin=last)
            await self._access._unary(self._stub.SendWorkspaceProcessInput, request)

    async def close_stdin(self, process: Selector) -> None:
        """End the process's input (it reads EOF)."""
        await self.send_input(process, b"", close=True)

    async def signal(self, process: Selector, signal: int = SIGTERM) -> None:
        """Send a signal (a number, or a signal.Signals) to the process; SIGTERM by default."""
        if isinstance(signal, bool) or not 1 <= int(signal) <= 64:
            raise ValueError(f"a signal is a number from 1 to 64, not {signal!r}")
        request = dp.SignalWorkspaceProcessRequest(process=common.selector(process), signal=int(signal))
        await self._access._unary(self._stub.SignalWorkspaceProcess, request)

    async def kill(self, process: Selector) -> None:
        """SIGKILL the process."""
        await self.signal(process, SIGKILL)

    async def resize(self, process: Selector, rows: int, cols: int) -> None:
        """Resize the process's terminal (it gets SIGWINCH); ConflictError without a PTY."""
        request = dp.ResizeWorkspaceProcessRequest(process=common.selector(process), size=common.pty_size((rows, cols)))
        await self._access._unary(self._stub.ResizeWorkspaceProcess, request, retry=True)


# -- files ----------------------------------------------------------------------------------------


async def _watch_events(responses: AsyncGenerator[Any, None]) -> AsyncGenerator[WatchEvent, None]:
    async with contextlib.aclosing(responses):
        async for response in responses:
            yield common.watch_event(response)


class AsyncFiles:
    """Files of the workspace, anywhere its root reaches, done inside the guest (a symlink leads
    only within the guest's own tree). Transfers stream in parts (never whole in memory, here or
    on the server) with back-pressure end to end."""

    def __init__(self, access: AsyncWorkspaceAccess) -> None:
        self._access = access
        self._stub = access.client.data_plane

    async def stat(self, path: str) -> dp.FileInfo:
        """What is at `path` (a symlink is described, not followed)."""
        response: dp.StatWorkspacePathResponse = await self._access._unary(
            self._stub.StatWorkspacePath, dp.StatWorkspacePathRequest(path=path), retry=True
        )
        return response.info

    async def list_dir(self, path: str, *, depth: int = 1) -> dp.ListWorkspaceDirectoryResponse:
        """A directory's entries, `depth` levels down (1: its own; at most 32): `entries` (at most
        10,000) and `truncated` when there were more."""
        if not 1 <= depth <= 32:
            raise ValueError(f"depth is 1 to 32, not {depth}")
        request = dp.ListWorkspaceDirectoryRequest(path=path, depth=depth)
        response: dp.ListWorkspaceDirectoryResponse = await self._access._unary(
            self._stub.ListWorkspaceDirectory, request, retry=True
        )
        return response

    async def make_dir(self, path: str, *, parents: bool = False, mode: int = 0) -> None:
        """Make a directory (`mode`: its permission bits, 0 for 0o755); with `parents` its missing
        parents too, and no error when it exists."""
        request = dp.MakeWorkspaceDirectoryRequest(path=path, parents=parents, mode=mode)
        await self._access._unary(self._stub.MakeWorkspaceDirectory, request)

    async def move(self, source: str, destination: str) -> None:
        """Rename a file or directory (a file at `destination` is replaced)."""
        request = dp.MoveWorkspacePathRequest(source=source, destination=destination)
        await self._access._unary(self._stub.MoveWorkspacePath, request)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a symlink (not what it points to) or a directory (`recursive` for one
        that is not empty)."""
        await self._access._unary(
            self._stub.RemoveWorkspacePath, dp.RemoveWorkspacePathRequest(path=path, recursive=recursive)
        )

    async def read(self, path: str) -> bytes:
        """A whole file's content (streamed, gathered here: for large files use download)."""
        buffer = io.BytesIO()
        await self.download(path, buffer)
        return buffer.getvalue()

    async def write(self, path: str, data: bytes, *, mode: int = 0, parents: bool = False) -> int:
        """Create or replace a file with `data` (put in place whole); its size."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data is bytes, not {type(data).__name__}")
        return await self.upload(path, io.BytesIO(bytes(data)), mode=mode, parents=parents)

    # -- uploads

    async def upload(
        self,
        path: str,
        source: LocalFile,
        *,
        mode: int = 0,
        parents: bool = False,
        archive: bool = False,
        progress: TransferProgress | None = None,
    ) -> int:
        """Create or replace the file at `path` with what `source` (a binary file object read to
        its end, or a local path) holds, streamed in parts of 2 MiB; the file is put in place whole
        once complete (never half-written); the size. `mode`: its permission bits (0: 0o644);
        `parents`: make its missing parent directories. `archive`: `source` is an uncompressed tar
        stream, unpacked into the directory `path` (made if missing).

        `progress(sent, total)` is called after each part (total: None unless `source` is a
        regular file). A part whose call broke is sent again; the server's FAILED_PRECONDITION on a part
        it already took names the offset it has, and the upload goes on from there. On any
        error the upload is cancelled: nothing of it is left in the guest."""
        if isinstance(source, str | os.PathLike):
            with open(source, "rb") as opened:  # noqa: ASYNC230 - opening is quick; the reads are offloaded
                return await self.upload(path, opened, mode=mode, parents=parents, archive=archive, progress=progress)
        meter = common.Meter(progress, common.local_size(source))
        return await self._upload(path, source, mode, parents, archive, meter, None)

    async def upload_dir(
        self,
        path: str,
        directory: str | os.PathLike[str],
        *,
        parents: bool = False,
        progress: TransferProgress | None = None,
    ) -> int:
        """Copy a local directory's contents into the directory `path` (made if missing; with
        `parents` its parents too) as a tar stream made as it is sent: files, directories and
        symlinks (kept as links, never followed); the bytes of the stream."""
        with common.TarSource(directory) as tar:
            meter = common.Meter(progress, None)
            return await self._upload(path, tar.reader, 0, parents, True, meter, tar.check)

    async def _upload(
        self,
        path: str,
        source: IO[bytes],
        mode: int,
        parents: bool,
        archive: bool,
        meter: common.Meter,
        complete: Callable[[], None] | None,
    ) -> int:
        request = dp.StartWorkspaceUploadRequest(path=path, mode=mode, archive=archive, parents=parents)
        started: dp.StartWorkspaceUploadResponse = await self._access._unary(self._stub.StartWorkspaceUpload, request)
        upload_id = started.upload_id
        try:
            offset = 0
            part = await common.offload_async(common.read_part, source)
            while True:
                # A short part is the end (read_part fills a part but at the end); a full one may be.
                following = (
                    await common.offload_async(common.read_part, source) if len(part) == common.MAX_PART_BYTES else b""
                )
                finish = not following
                if finish and complete is not None:
                    await common.offload_async(complete)  # the source's own error, before the finish
                offset = await self._write_part(upload_id, offset, part, finish)
                meter.add(len(part))
                if finish:
                    return offset
                part = following
        except BaseException:
            with contextlib.suppress(KiboError):  # else the server cancels it after 60 s idle
                await self._access._unary(
                    self._stub.CancelWorkspaceUpload, dp.CancelWorkspaceUploadRequest(upload_id=upload_id)
                )
            raise

    async def _write_part(self, upload_id: str, offset: int, part: bytes, finish: bool) -> int:
        """Send `part`, which starts at `offset`; the bytes the server has taken after it."""
        while True:
            if not part and not finish:
                return offset
            request = dp.WriteWorkspaceUploadRequest(upload_id=upload_id, offset=offset, data=part, finish=finish)
            try:
                response: dp.WriteWorkspaceUploadResponse = await self._access._unary(
                    self._stub.WriteWorkspaceUpload, request, retry=True
                )
            except KiboError as error:
                taken = common.server_offset(error)
                if taken is None or not offset < taken <= offset + len(part):
                    raise
                # A resend of a part the server took (its first answer was lost): go on from there.
                part, offset = part[taken - offset :], taken
                continue
            return int(response.size)

    # -- downloads

    async def download(
        self,
        path: str,
        target: LocalFile,
        *,
        offset: int = 0,
        archive: bool = False,
        progress: TransferProgress | None = None,
    ) -> int:
        """Write the file at `path`, from `offset`, into `target` (a binary file object, or a local
        path: created, or with `offset` written from there on), streamed; the bytes written.
        `archive`: the directory `path` as an uncompressed tar stream (symlinks kept as links).

        `progress(received, total)` is called after each message of data. A file's download whose stream broke
        (UNAVAILABLE) resumes where it was, for retry_unavailable seconds without progress, when
        the file's size and mtime are unchanged (else ConflictError)."""
        if offset < 0:
            raise ValueError("offset must not be negative")
        if archive and offset:
            raise ValueError("an archive is downloaded whole (no offset)")
        if isinstance(target, str | os.PathLike):
            with open(target, "r+b" if offset else "wb") as opened:  # noqa: ASYNC230 - as a file object's
                if offset:
                    opened.seek(offset)
                    opened.truncate()
                return await self.download(path, opened, offset=offset, archive=archive, progress=progress)
        return await self._download(path, offset, archive, target.write, False, progress)

    async def download_dir(
        self, path: str, directory: str | os.PathLike[str], *, progress: TransferProgress | None = None
    ) -> int:
        """Copy the directory `path` into the local `directory` (made if missing), unpacked as it
        comes: files, directories and symlinks (kept as links, as written in the guest). Nothing is
        written outside `directory` nor through a link; devices and FIFOs are skipped; the owners
        are not applied. The bytes of the tar stream."""
        with common.TarSink(directory) as sink:
            size = await self._download(path, 0, True, sink.write, True, progress)
            await common.offload_async(sink.finish)
            return size

    async def _download(
        self,
        path: str,
        offset: int,
        archive: bool,
        write: Callable[[bytes], object],
        blocking: bool,
        progress: TransferProgress | None,
    ) -> int:
        """The download loop: `write` each part (off the event loop when `blocking`: a pipe)."""
        request = dp.DownloadWorkspaceFileRequest(path=path, offset=offset, archive=archive)
        start = offset
        info: dp.FileInfo | None = None
        meter = common.Meter(progress, None)
        backoff = Backoff(0.05, 1.0, 2.0, jitter=0.2)
        waited = 0.0
        while True:
            request.offset = offset
            try:
                async with contextlib.aclosing(
                    self._access._stream(self._stub.DownloadWorkspaceFile, request)
                ) as responses:
                    async for response in responses:
                        if response.WhichOneof("part") == "info":
                            if info is None:
                                info = response.info
                                meter.total = None if archive else max(info.size - start, 0)
                            else:
                                changed = common.resumed_mismatch(info, response.info)
                                if changed is not None:
                                    raise changed
                            continue
                        if blocking:
                            await common.offload_async(write, response.data)
                        else:
                            write(response.data)
                        offset += len(response.data)
                        meter.add(len(response.data))
                        waited = 0.0
                meter.finish()
                return offset - start
            except UnavailableError as error:
                # A broken file download resumes from what was written; an archive cannot.
                if archive or isinstance(error, WrongPortError):
                    raise
                delay = backoff.next()
                if waited + delay > self._access.retry_unavailable:
                    raise
                waited += delay
                await common.sleep_async(delay)

    # -- watches

    def watch_dir(self, path: str, *, recursive: bool = False) -> AsyncGenerator[WatchEvent, None]:
        """Changes under the directory `path` (`recursive`: its subdirectories too, new ones
        included): WatchReady first, once the watch is in place, then each FileChange in the
        order the guest's kernel saw them (WatchOverflow when it dropped some). Never ends by
        itself: leave the iteration to end the watch."""
        request = dp.WatchWorkspaceDirectoryRequest(path=path, recursive=recursive)
        return _watch_events(self._access._stream(self._stub.WatchWorkspaceDirectory, request))
