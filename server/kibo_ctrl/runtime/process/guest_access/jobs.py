"""One data-plane job in a guest (guest_exec.py as a child process), with bounded memory.

Back-pressure, end to end: the job's stdout and stderr are pipes read `CHUNK` bytes at a
time into a queue of `QUEUE_CHUNKS` chunks. When the consumer (the RPC handler, which
awaits each write to its client) stops taking chunks, the queue fills, the readers stop
reading, each pipe's reader pauses at 2 x CHUNK buffered, the kernel's pipe buffer
(64 KiB) fills and the guest's command blocks in write(2). So a job holds at most about
QUEUE_CHUNKS + 4 chunks of the server's memory (~0.5 MiB), whatever the guest writes.
A job may ask for larger reads (`read_size`, at most MAX_READ_SIZE: a download's, whose
messages are then larger and fewer): then its bound is QUEUE_CHUNKS + 4 of those.

A job ends its command (SIGKILL to the process group of guest_exec, which the command and
whatever it starts share, even inside the guest's PID namespace) when:
- its consumer leaves (the client cancelled or disconnected: the generator is closed),
- its timeout passes (Exit(124)),
- its `stop` event is set (the credential it runs under was revoked, or the workspace is
  stopping or being deleted): the kill is done at once by a watcher task, even while the
  consumer is blocked on a client that does not read, and the job raises JobStopped;
- guest_exec dies without saying how its command ended (killed under it: by the guest's
  memory limit, say): the command goes too, and the job ends as a guest error.
A process that leaves the process group (setsid, a daemon) is the guest's: only the end of
the guest (stop, delete) reaches it.

The pipes are the server's own (not asyncio's subprocess pipes), so ending a job closes them
even while their readers are paused or a detached process still holds the other end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

from ...base import Exit, GuestRefused, JobStopped, Output
from ..fork_client import Child, Door, ForkServer

log = logging.getLogger(__name__)

GUEST_EXEC = Path(__file__).with_name("guest_exec.py")
# One read from a pipe, and one message to the client (well under the 4 MiB message limit).
CHUNK = 1 << 16
# Chunks queued between the pipes and the consumer.
QUEUE_CHUNKS = 4
# A job's own read size (`read_size`) is at most this.
MAX_READ_SIZE = 1 << 20


_EOF = None


async def _pump(name: str, reader: asyncio.StreamReader, queue: asyncio.Queue[Output | None], size: int) -> None:
    while chunk := await reader.read(size):
        await queue.put(Output(name, chunk))  # blocks while the consumer does not take: back-pressure
    await queue.put(_EOF)


async def _feed(transport: asyncio.WriteTransport, protocol: _WriteProtocol, data: bytes) -> None:
    if data:
        transport.write(data)
        await protocol.drained()
    transport.close()


class _WriteProtocol(asyncio.Protocol):
    """Enough of a protocol for a write pipe: waits for the pipe to drain."""

    def __init__(self) -> None:
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        self.closed = False

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.resume_writing()

    async def drained(self) -> None:
        while self._paused and not self.closed:
            self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed


def _protocol_of(reader: asyncio.StreamReader) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: asyncio.StreamReaderProtocol(reader)


def _killpg(process: asyncio.subprocess.Process | Child) -> None:
    """SIGKILL the job's process group (its ID is guest_exec's PID: a new session). A fork
    server's child is not ours to reap, so its PID is checked not to be another's by now."""
    if isinstance(process, Child) and not process.group_is_its():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _kill_when(stop: asyncio.Event, process: asyncio.subprocess.Process | Child) -> None:
    await stop.wait()
    _killpg(process)


async def _start(
    instance_dir: Path, job: dict[str, Any], fds: tuple[int, int, int, int], forks: ForkServer | Door | None
) -> asyncio.subprocess.Process | Child:
    """guest_exec.py in a new session with (stdin, stdout, stderr, status) at 0, 1, 2, 3:
    forked from the instance's job door or the fork server, or else exec'd."""
    if forks is not None:
        argv = [str(instance_dir), json.dumps({**job, "status_fd": 3})]
        try:
            return await asyncio.to_thread(forks.spawn, "guest_exec", argv, list(fds))
        except OSError as error:
            log.warning("the fork server failed (%s): starting the guest job anew", error)
    stdin, stdout, stderr, status = fds
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        str(GUEST_EXEC),
        str(instance_dir),
        json.dumps({**job, "status_fd": status}),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        pass_fds=(status,),
        start_new_session=True,
    )


async def run_guest_exec(
    instance_dir: Path,
    job: dict[str, Any],
    stdin: bytes = b"",
    seconds: float = 0.0,
    stop: asyncio.Event | None = None,
    forks: ForkServer | Door | None = None,
) -> AsyncGenerator[Output | Exit, None]:
    """Run `job` in the guest of `instance_dir` (see guest_exec.py): its output, then how it
    ended. Raises GuestRefused if the job could not run, JobStopped if `stop` was set."""
    loop = asyncio.get_running_loop()
    status_read, status_write = os.pipe()
    stdin_read, stdin_write = os.pipe()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    parent_ends = [status_read, stdin_write, out_read, err_read]
    try:
        process = await _start(instance_dir, job, (stdin_read, out_write, err_write, status_write), forks)
    except BaseException:
        for fd in parent_ends:
            os.close(fd)
        raise
    finally:
        for fd in (status_write, stdin_read, out_write, err_write):
            os.close(fd)
    # The parent's pipe ends: each is handed to a transport (which closes it), or closed here.
    out_file, err_file = os.fdopen(out_read, "rb", buffering=0), os.fdopen(err_read, "rb", buffering=0)
    in_file = os.fdopen(stdin_write, "wb", buffering=0)
    unowned = [out_file, err_file, in_file]
    queue: asyncio.Queue[Output | None] = asyncio.Queue(QUEUE_CHUNKS)
    size = min(MAX_READ_SIZE, max(CHUNK, int(job.get("read_size") or CHUNK)))
    transports: list[asyncio.BaseTransport] = []
    tasks: list[asyncio.Task[None]] = []
    watcher = loop.create_task(_kill_when(stop, process)) if stop is not None else loop.create_future()
    ending = loop.create_task(process.wait())
    status = _Status(status_read)
    timed_out = stopped = exited = False
    open_streams = 2
    try:
        for name, file in (("stdout", out_file), ("stderr", err_file)):
            reader = asyncio.StreamReader(limit=size, loop=loop)
            transport, _ = await loop.connect_read_pipe(_protocol_of(reader), file)
            unowned.remove(file)
            transports.append(transport)
            tasks.append(loop.create_task(_pump(name, reader, queue, size)))
        write_transport, write_protocol = await loop.connect_write_pipe(_WriteProtocol, in_file)
        unowned.remove(in_file)
        transports.append(write_transport)
        tasks.append(loop.create_task(_feed(write_transport, write_protocol, stdin)))
        deadline = loop.time() + seconds if seconds > 0 else None
        # The output until both streams end, then guest_exec's exit (a command may close
        # its streams and run on): each wait bounded by the timeout and the stop event.
        while open_streams or not exited:
            if watcher.done():
                stopped = True
                break
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                timed_out = True
                break
            # The job is over at its status line (guest_exec's exit may take a while yet),
            # or at guest_exec's exit without one.
            if not exited and (status.line.done() or ending.done()):
                exited = True
                if b"\n" not in status.read():
                    # Killed under its command (the guest's memory limit, say): the command,
                    # which would run on holding the streams, goes with its job.
                    _killpg(process)
            if not open_streams:
                if not exited:
                    ends = (ending, status.line, watcher)
                    await asyncio.wait(ends, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                continue
            if queue.empty():
                getter = loop.create_task(queue.get())
                waits = (getter, watcher) if exited else (getter, watcher, ending, status.line)
                await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()  # asyncio.Queue.get loses no item when cancelled
                    continue
                item = getter.result()
            else:
                item = queue.get_nowait()
            if item is _EOF:
                open_streams -= 1
            else:
                yield item
    finally:
        watcher.cancel()
        if not exited:
            # The whole job: guest_exec, the command and what it started.
            _killpg(process)
        for task in tasks:
            task.cancel()
        for pipe in transports:
            pipe.close()  # closes our pipe ends, paused or not
        for file in unowned:
            file.close()
        if ending.done() or not status.line.done():
            await ending  # the one wait on the process (a second one would take over its pidfd's reader)
        else:
            _LINGERING.add(ending)  # done with its status line: its exit is waited for meanwhile
            ending.add_done_callback(_LINGERING.discard)
        status_line = status.close().split(b"\n", 1)[0]
    if stopped:
        raise JobStopped("the job was stopped")
    if timed_out:
        yield Exit(124)
        return
    try:
        ended = json.loads(status_line)
    except ValueError:
        ended = {"status": "error", "error": f"the guest job ended without a status (exit {process.returncode})"}
    if ended.get("status") == "ok":
        yield Exit(int(ended.get("code", 0)))
    else:
        raise GuestRefused(str(ended.get("status")), str(ended.get("error")), str(ended.get("errno") or ""))


# The waits on jobs that ended at their status line, until their guest_exec has exited.
_LINGERING: set[asyncio.Task[int]] = set()
# More than guest_exec ever writes to its status pipe (one short JSON line).
STATUS_LIMIT = 1 << 16


class _Status:
    """guest_exec's status pipe, read as it is written: `line` is done once its line (or the
    pipe's end, or more than STATUS_LIMIT) is in."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._data = b""
        self._loop = asyncio.get_running_loop()
        self.line: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self.read)

    def read(self) -> bytes:
        """Take what is in the pipe now; what it said so far."""
        while not self.line.done():
            try:
                chunk = os.read(self._fd, STATUS_LIMIT)
            except BlockingIOError:
                break
            self._data += chunk
            if not chunk or b"\n" in self._data or len(self._data) > STATUS_LIMIT:
                self._loop.remove_reader(self._fd)
                self.line.set_result(None)
        return self._data

    def close(self) -> bytes:
        """All it said (once guest_exec has exited: all it will say); the pipe is closed."""
        data = self.read()
        if not self.line.done():
            self._loop.remove_reader(self._fd)
            self.line.cancel()
        os.close(self._fd)
        return data
