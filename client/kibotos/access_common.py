"""What kibotos.WorkspaceAccess and kibotos.AsyncWorkspaceAccess share (the processes and files of a
running workspace, kibotos/aio_access.py): the events they yield, the requests they build, and
the few helpers whose blocking and awaitable forms differ (`*_async` here, renamed by
kibotos._generate for the blocking twin).

Argument errors found before any call are TypeError or ValueError; every error of the server is a
KiboError subclass (kibotos.errors), and local file errors stay OSError.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, Protocol, TypeVar

from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from .errors import ConflictError, KiboError, UnauthenticatedError

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_PART_BYTES",
    "FileChange",
    "ProcessDropped",
    "ProcessEvent",
    "ProcessExit",
    "ProcessOutput",
    "ProcessReplayed",
    "ProcessResult",
    "Selector",
    "TransferProgress",
    "WatchEvent",
    "WatchOverflow",
    "WatchReady",
]

T = TypeVar("T")

# The server takes at most 2 MiB in one WriteWorkspaceUpload and 1 MiB in one SendWorkspaceProcessInput.
MAX_PART_BYTES = 2 << 20
MAX_INPUT_BYTES = 1 << 20
# What a download's data is read into before it is written out, per read of the source pipe (tar).
_PIPE_READ = 1 << 20
# A PTY's rows and columns fit a uint16 (struct winsize).
_MAX_PTY = 0xFFFF

# (bytes moved so far, the whole size when known): called as a transfer goes.
TransferProgress = Callable[[int, int | None], object]


# -- processes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessOutput:
    """A chunk of a process's output, as it came: "stdout", "stderr", or "pty" (a terminal's)."""

    stream: Literal["stdout", "stderr", "pty"]
    data: bytes


@dataclass(frozen=True)
class ProcessDropped:
    """`count` bytes of output are missing before the next chunk: older than what the node keeps
    (128 KiB a process), or dropped while this follower did not read."""

    count: int


@dataclass(frozen=True)
class ProcessReplayed:
    """Connecting with replay=True to a process that runs, once: the output the node kept when the
    call began has all come; what follows comes as the process writes it (a reader of the logs
    so far stops here). An ended process's ProcessExit comes instead."""


@dataclass(frozen=True)
class ProcessExit:
    """How the process ended, the last event (128 + N when killed by signal N)."""

    exit_code: int


ProcessEvent = ProcessOutput | ProcessDropped | ProcessReplayed | ProcessExit


@dataclass(frozen=True)
class ProcessResult:
    """A foreground process run to its end (Processes.run): a PTY's output is in `stdout`."""

    pid: int
    tag: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    # Output bytes missing from stdout/stderr (only when the process wrote faster than it was read).
    dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class _Started(Protocol):
    @property
    def pid(self) -> int: ...


# A process: its pid in the guest (int), its tag (str), or what start() returned.
Selector = int | str | _Started


def selector(process: Selector) -> dp.ProcessSelector:
    if isinstance(process, bool):
        raise TypeError("a process is its pid (int), its tag (str) or the handle start() returned")
    if isinstance(process, int):
        if process <= 0:
            raise ValueError(f"a pid is positive, not {process}")
        return dp.ProcessSelector(pid=process)
    if isinstance(process, str):
        if not process:
            raise ValueError("a tag is not empty")
        return dp.ProcessSelector(tag=process)
    pid = getattr(process, "pid", None)
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise TypeError("a process is its pid (int), its tag (str) or the handle start() returned")
    return dp.ProcessSelector(pid=pid)


def pty_size(pty: tuple[int, int]) -> dp.PtySize:
    rows, cols = pty
    if not (0 < rows <= _MAX_PTY and 0 < cols <= _MAX_PTY):
        raise ValueError(f"a terminal's size is (rows, cols), each 1 to {_MAX_PTY}: not {pty!r}")
    return dp.PtySize(rows=rows, cols=cols)


def start_request(
    argv: Sequence[str],
    shell: str,
    env: Mapping[str, str] | None,
    cwd: str,
    user: str,
    pty: tuple[int, int] | None,
    tag: str,
    stdin: bytes,
    close_stdin: bool,
    background: bool,
) -> dp.StartWorkspaceProcessRequest:
    if isinstance(argv, str | bytes):
        raise TypeError("argv is a list of arguments (no shell): for a shell line give shell=line")
    if bool(argv) == bool(shell):
        raise ValueError("give the command as argv or as shell (a line for /bin/sh -c), exactly one")
    request = dp.StartWorkspaceProcessRequest(
        argv=list(argv),
        shell=shell,
        env=dict(env or {}),
        working_dir=cwd,
        user=user,
        tag=tag,
        background=background,
        stdin=stdin,
        close_stdin=close_stdin,
    )
    if pty is not None:
        request.pty.CopyFrom(pty_size(pty))
    return request


def process_event(response: dp.StartWorkspaceProcessResponse | dp.ConnectWorkspaceProcessResponse) -> ProcessEvent:
    kind = response.WhichOneof("event")
    if kind == "stdout":
        return ProcessOutput("stdout", response.stdout)
    if kind == "stderr":
        return ProcessOutput("stderr", response.stderr)
    if kind == "pty":
        return ProcessOutput("pty", response.pty)
    if kind == "dropped_bytes":
        return ProcessDropped(int(response.dropped_bytes))
    if kind == "replayed":
        return ProcessReplayed()
    if kind == "exit_code":
        return ProcessExit(int(response.exit_code))
    raise KiboError(f"the process's stream sent an event this client does not know ({kind or 'none'})")


def no_exit_code() -> KiboError:
    return KiboError("the process's output stream ended without an exit code; it may still run")


class Collector:
    """Folds process events into a ProcessResult."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.dropped = 0
        self.exit_code: int | None = None

    def add(self, event: ProcessEvent) -> None:
        if isinstance(event, ProcessExit):
            self.exit_code = event.exit_code
        elif isinstance(event, ProcessDropped):
            self.dropped += event.count
        elif isinstance(event, ProcessReplayed):
            pass
        elif event.stream == "stderr":
            self.stderr += event.data
        else:
            self.stdout += event.data

    def result(self, pid: int, tag: str) -> ProcessResult:
        if self.exit_code is None:
            raise no_exit_code()
        return ProcessResult(pid, tag, self.exit_code, bytes(self.stdout), bytes(self.stderr), self.dropped)


def input_parts(data: bytes, close: bool) -> list[tuple[bytes, bool]]:
    """`data` in parts the server takes (1 MiB each); the last one closes stdin when `close`."""
    view = memoryview(data)
    parts = [(bytes(view[i : i + MAX_INPUT_BYTES]), False) for i in range(0, len(view), MAX_INPUT_BYTES)]
    if not parts:
        parts = [(b"", False)]
    last, _ = parts[-1]
    parts[-1] = (last, close)
    return parts


# -- credentials ----------------------------------------------------------------------------------


def refused_credential(error: KiboError) -> bool:
    """The data-plane credential was refused (revoked by a stop, revoke, delete or new start)."""
    return isinstance(error, UnauthenticatedError) and error.field == "credential"


# -- files ----------------------------------------------------------------------------------------

FileChangeKind = Literal["create", "write", "remove", "rename", "chmod"]
_KINDS: dict[int, FileChangeKind] = {
    dp.FILE_EVENT_TYPE_CREATE: "create",
    dp.FILE_EVENT_TYPE_WRITE: "write",
    dp.FILE_EVENT_TYPE_REMOVE: "remove",
    dp.FILE_EVENT_TYPE_RENAME: "rename",
    dp.FILE_EVENT_TYPE_CHMOD: "chmod",
}


@dataclass(frozen=True)
class WatchReady:
    """The watch is in place: every change from now on is streamed (the first event)."""


@dataclass(frozen=True)
class FileChange:
    """A change under the watched directory. A rename's `path` is the old name and `new_path` the
    new one (empty when it moved out of the watch)."""

    kind: FileChangeKind
    path: str
    new_path: str = ""
    is_directory: bool = False


@dataclass(frozen=True)
class WatchOverflow:
    """The guest's kernel dropped events (its queue overflowed): rescan what matters."""


WatchEvent = WatchReady | FileChange | WatchOverflow


def watch_event(response: dp.WatchWorkspaceDirectoryResponse) -> WatchEvent:
    kind = response.WhichOneof("event")
    if kind == "ready":
        return WatchReady()
    if kind == "overflow":
        return WatchOverflow()
    if kind == "change" and response.change.type in _KINDS:
        change = response.change
        return FileChange(_KINDS[change.type], change.path, change.new_path, change.is_directory)
    raise KiboError(f"the watch sent an event this client does not know ({kind or 'none'})")


# "... it has taken 4194304 bytes; go on from offset 4194304": the offset a refused part's message
# names (it names the refused offset too), when its ErrorInfo metadata does not give it.
_GO_ON_FROM = re.compile(r"\bgo on from offset (\d{1,19})\b")


def server_offset(error: KiboError) -> int | None:
    """The offset to go on from that a refused upload part names (FAILED_PRECONDITION, CONFLICT on
    the field `offset`: the bytes the server has taken); None for any other error (e.g. the upload
    has finished: field `upload_id`)."""
    if not isinstance(error, ConflictError) or error.reason != "CONFLICT" or error.field not in ("", "offset"):
        return None
    given = error.metadata.get("offset", "")
    if given.isdigit():
        return int(given)
    found = _GO_ON_FROM.search(error.message)
    return int(found.group(1)) if found else None


def resumed_mismatch(first: dp.FileInfo, again: dp.FileInfo) -> KiboError | None:
    """A download resumed after a broken stream must read the same file: its size and mtime."""
    if first.size == again.size and first.modify_time == again.modify_time:
        return None
    return ConflictError(
        f"{first.path} changed while it was downloaded (the stream broke and the file was not the same when "
        "it was resumed): download it again"
    )


def read_part(source: IO[bytes], size: int = MAX_PART_BYTES) -> bytes:
    """Up to `size` bytes of `source`, fewer only at its end (a pipe's reads come in pieces)."""
    part = bytearray()
    while len(part) < size:
        piece = source.read(size - len(part))
        if not piece:
            break
        part += piece
    return bytes(part)


def local_size(source: IO[bytes]) -> int | None:
    """The size of a regular file's remaining bytes, else None (a pipe, a socket)."""
    try:
        status = os.fstat(source.fileno())
        position = source.tell()
    except (OSError, AttributeError, ValueError):
        return None
    return max(status.st_size - position, 0) if stat.S_ISREG(status.st_mode) else None


class Meter:
    """Calls the progress callback after each part moved (an upload's 2 MiB, a download's message)."""

    def __init__(self, progress: TransferProgress | None, total: int | None, done: int = 0) -> None:
        self.progress = progress
        self.total = total
        self.done = done

    def add(self, count: int) -> None:
        self.done += count
        if self.progress is not None:
            self.progress(self.done, self.total)

    def finish(self) -> None:
        """At the end (an empty file's only call)."""
        if self.progress is not None and self.done == 0:
            self.progress(self.done, self.total)


# -- directories as tar streams -------------------------------------------------------------------


def _check_tar_filters() -> None:
    if not hasattr(tarfile, "data_filter"):  # Python 3.11.4+ (PEP 706)
        raise RuntimeError("copying directories needs tarfile's extraction filters: Python 3.11.4 or later")


# What data_filter sets too: the owners in the archive are not applied here.
_NO_OWNER: dict[str, Any] = {"uid": None, "gid": None, "uname": None, "gname": None}


def _member_filter(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo | None:
    """What of a workspace's tar stream is made here: files, directories and symlinks (kept as
    links, whatever they point at, as `docker cp` does) under `destination` only; a hard link only
    to a file of the archive; nothing that writes through a link or outside `destination`
    (tarfile checks each path's real path); devices and FIFOs are skipped; no owner is applied."""
    if member.isdev():
        return None
    if member.issym():
        kept = tarfile.tar_filter(member, destination)
        return kept.replace(**_NO_OWNER, deep=False)
    return tarfile.data_filter(member, destination)


class _Pipe:
    """A thread at one end of an OS pipe: the tar stream is made or unpacked there while the
    caller moves it in parts through the other end (never whole in memory). Each side closes only
    its own end (a descriptor closed under another thread's read could be reused meanwhile)."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.reader = os.fdopen(read_fd, "rb", buffering=0)
        self.writer = os.fdopen(write_fd, "wb", buffering=0)
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _run(self, work: Callable[[], None], its_end: IO[bytes]) -> None:
        def guarded() -> None:
            try:
                work()
            except BaseException as error:  # raised in the caller's thread
                self.error = error
            finally:
                its_end.close()

        self._thread = threading.Thread(target=guarded, name="kibotos-tar", daemon=True)
        self._thread.start()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _raise(self) -> None:
        self._join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


class TarSource(_Pipe):
    """A local directory's contents as a pax tar stream: read `reader` until EOF, then check().
    Symlinks are archived as links (never followed); sockets are left out (tar has no form for
    them). Use it as a context manager: leaving it ends the thread."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        _check_tar_filters()
        root = Path(directory)
        if not root.is_dir():
            raise NotADirectoryError(f"{root}: not a directory")
        super().__init__()

        def write() -> None:
            with tarfile.open(fileobj=self.writer, mode="w|", format=tarfile.PAX_FORMAT) as archive:
                for entry in sorted(os.listdir(root)):
                    archive.add(str(root / entry), arcname=entry, recursive=True)

        self._run(write, self.writer)

    def check(self) -> None:
        """After EOF: raise what went wrong making the stream (a file that could not be read)."""
        self._raise()

    def __enter__(self) -> TarSource:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.reader.close()  # the thread's next write fails (EPIPE): it ends
        self._join()


class TarSink(_Pipe):
    """Unpacks a tar stream written with write() into a local directory (made if missing), by
    _member_filter's rules; finish() ends the stream and raises what the unpacking refused. Use
    it as a context manager: leaving it ends the thread."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        _check_tar_filters()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._ended = False
        super().__init__()

        def read() -> None:
            with tarfile.open(fileobj=self.reader, mode="r|") as archive:
                archive.extractall(str(self.directory), filter=_member_filter)

        self._run(read, self.reader)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view and not self._ended:
                view = view[self.writer.write(view) or 0 :]
        except BrokenPipeError:
            self._raise()  # the unpacking stopped: its error, if it failed
            self._ended = True  # else it reached the archive's end: what follows is padding

    def finish(self) -> None:
        if not self.writer.closed:
            self.writer.close()  # EOF for the thread
        self._raise()

    def __enter__(self) -> TarSink:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if not self.writer.closed:
            self.writer.close()
        self._join()


# -- blocking and awaitable forms (kibotos._generate renames the *_async ones) ----------------------


async def offload_async(function: Callable[..., T], *arguments: Any) -> T:
    """Run blocking I/O (a pipe to a tar thread, a local file's 2 MiB part) off the event loop."""
    return await asyncio.to_thread(function, *arguments)


def offload(function: Callable[..., T], *arguments: Any) -> T:
    return function(*arguments)


async def sleep_async(seconds: float) -> None:
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    time.sleep(seconds)
