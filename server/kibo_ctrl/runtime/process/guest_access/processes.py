"""Processes started in running guests and kept by the node: the process runtime's
`GuestProcesses` (runtime/base.py, whose docstrings are the contract), a table per instance.

A process is one guest_exec.py in "process" mode (guest_process.py), forked from the
instance's job door like an exec, with five fds: stdin, stdout and stderr (pipes, or all
three the slave of a PTY this server opened on the host and keeps the master of: output is
read and keystrokes written there, a resize is TIOCSWINSZ on it), a status pipe (first
"started" with the pid in the guest, then how it ended) and a control pipe (signals; its
end kills the command's group: nothing runs on unsupervised once this server is gone).

Output: one reader per stream (add_reader on the fd, no task) moves it into a ring of
PROCESS_REPLAY_BYTES in chunks with absolute offsets; each follower has a cursor. A follower
that falls behind the ring gets `Dropped(n)` and goes on from the ring's start. A `hold`
follower (a foreground start's) is never dropped: the readers stop reading while the ring's
unread part for it is full, so the guest's command blocks in write(2) (as an exec's). A
fresh process's output also waits, for FIRST_FOLLOW_S at most, for its first hold follower
(its starter, which attaches just after the start returns): nothing of a foreground
command's first output is dropped. Memory: at most the ring and one chunk per process
(PROCESS_REPLAY_BYTES + CHUNK), MAX_GUEST_PROCESSES running and MAX_ENDED_PROCESSES kept
per instance, whatever the guest writes and whatever a follower does.

Input: written non-blocking; while the pipe (or the terminal's input queue) is full the
call waits for it to drain (back-pressure); `offset` is checked against the bytes taken so
far (an upload's part sent twice is refused, "conflict"). An upload not written for
UPLOAD_IDLE_S gets SIGTERM (guest_files.py removes what it made).

Ends: `end_guest_processes` (a revoke's, by owner), `forget` (the instance's stop, destroy
or release), and the command's own exit, after which what is left of its group is killed
(guest_process.py). A kill closes the control pipe (guest_exec kills the group) and kills
the group from here too (its leader's pid checked by its start time, as fork_client.Child
checks), so a guest_exec killed under its command (the guest's memory limit) leaves nothing
running."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import logging
import os
import signal
import struct
import sys
import termios
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...base import (
    MAX_ENDED_PROCESSES,
    MAX_GUEST_PROCESSES,
    MAX_UPLOADS,
    PROCESS_REPLAY_BYTES,
    UPLOAD_IDLE_S,
    Dropped,
    Exit,
    GuestRefused,
    JobStopped,
    Output,
    ProcessInfo,
    ProcessSpec,
    Replayed,
    Selector,
)
from ..fork_client import Child, Door, ForkServer

log = logging.getLogger(__name__)

GUEST_EXEC = Path(__file__).with_name("guest_exec.py")
# One read from a stream (and the most a chunk of the ring holds).
CHUNK = 1 << 16
# How long a fresh process's output waits for its first hold follower (its foreground starter).
FIRST_FOLLOW_S = 0.5
# After the command's exit, what is still read from its streams at most (a process that left
# its group may hold them open and write on: it is the guest's, not this process's).
DRAIN_BYTES = 1 << 20
# More than guest_exec ever writes to its status pipe (two short JSON lines).
STATUS_LIMIT = 1 << 16

# Where an instance's guest jobs are forked (its door, else the fork server; None: exec'd).
Site = Callable[[str], tuple[Path, ForkServer | Door | None]]


@dataclass(eq=False)
class _Cursor:
    """A follower's place: the next chunk's sequence number and its byte offset."""

    seq: int
    offset: int


class _Ring:
    """The output kept: chunks (stream, bytes) with absolute offsets, oldest first."""

    def __init__(self) -> None:
        self.chunks: deque[tuple[str, bytes]] = deque()
        self.first_seq = 0
        self.start = 0  # the offset of the first kept byte
        self.end = 0  # all output so far

    def append(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))
        self.end += len(data)

    def evict(self, floor: int) -> None:
        """Drop the oldest chunks while more than PROCESS_REPLAY_BYTES are kept, never one
        ending after `floor` (a hold follower's cursor)."""
        while self.end - self.start > PROCESS_REPLAY_BYTES and self.chunks:
            size = len(self.chunks[0][1])
            if self.start + size > floor:
                return
            self.chunks.popleft()
            self.first_seq += 1
            self.start += size


@dataclass(eq=False)
class _Stream:
    fd: int
    name: str
    open: bool = True
    paused: bool = False


class _StatusLines:
    """guest_exec's status pipe, read as it is written; `on_line` gets each whole line."""

    def __init__(self, fd: int, on_line: Callable[[dict[str, Any]], None]) -> None:
        self.fd = fd
        self._on_line = on_line
        self._data = b""
        self._total = 0
        self.closed = False
        os.set_blocking(fd, False)
        asyncio.get_running_loop().add_reader(fd, self.read)

    def read(self) -> None:
        while not self.closed:
            try:
                chunk = os.read(self.fd, STATUS_LIMIT)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            self._total += len(chunk)
            if not chunk or self._total > STATUS_LIMIT:
                self.close()
                return
            self._data += chunk
            while b"\n" in self._data:
                line, self._data = self._data.split(b"\n", 1)
                try:
                    parsed = json.loads(line)
                except ValueError:
                    parsed = None
                self._on_line(parsed if isinstance(parsed, dict) else {"status": "error", "error": "a bad status"})

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self.fd)
            os.close(self.fd)


class _Process:
    """One process of the table: its fds, readers, ring and followers (see the module docstring)."""

    def __init__(self, key: int, spec: ProcessSpec, handle: asyncio.subprocess.Process | Child) -> None:
        self.key = key
        self.spec = spec
        self.handle = handle
        self.loop = asyncio.get_running_loop()
        self.pid = 0
        self.host_pid = 0
        self.host_start = 0
        self.start_time = time.time()
        self.ring = _Ring()
        self.streams: list[_Stream] = []
        self.input_fd = -1  # the stdin pipe's write end, or the PTY's master
        self.master = -1
        self.control = -1
        self.status: _StatusLines | None = None
        self.received = 0
        self.stdin_closed = False
        self.input_lock = asyncio.Lock()
        self.sending = False
        self.last_input = self.loop.time()
        self.holds: set[_Cursor] = set()
        # The first hold follower's place, kept until it comes (FIRST_FOLLOW_S at most).
        self.first = _Cursor(0, 0)
        self.holds.add(self.first)
        self.waiters: list[asyncio.Future[None]] = []
        self.started: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.final = False  # the command's end is known (code or refusal)
        self.code = 0
        self.refusal: GuestRefused | None = None
        self.done = False  # ended and its output all read: followers get the end
        self.drained = 0
        self.timers: list[asyncio.TimerHandle] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.on_done: list[Callable[[], None]] = []
        # guest_exec's exit, awaited to the end (it is reaped there), never cancelled.
        self.exit_task: asyncio.Task[int] | None = None

    # -- what it is --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return not self.final

    def info(self) -> ProcessInfo:
        spec = self.spec
        return ProcessInfo(
            pid=self.pid,
            tag=spec.tag,
            argv=listed_argv(spec.argv),
            pty=spec.pty is not None,
            running=self.running,
            exit_code=self.code if self.final else 0,
            start_time=self.start_time,
            cwd=spec.cwd or "/",
            user=spec.user,
            received=self.received,
            upload=spec.job is not None,
        )

    def notify(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def changed(self, stop: asyncio.Task[Any] | None, writable: int = -1) -> None:
        """Until something changes (output, its end, `stop`; the fd `writable` can be written)."""
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        if writable >= 0:
            self.loop.add_writer(writable, _wake, waiter)
        try:
            await asyncio.wait([waiter] if stop is None else [waiter, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if writable >= 0:
                with contextlib.suppress(ValueError, OSError):
                    self.loop.remove_writer(writable)

    # -- reading -----------------------------------------------------------------------------

    def _room(self) -> bool:
        """Whether a chunk may be read now: no hold follower has a ring's worth unread."""
        return not self.holds or self.ring.end - min(c.offset for c in self.holds) < PROCESS_REPLAY_BYTES

    def pump(self, stream: _Stream) -> None:
        """Read `stream` into the ring: one chunk per wake-up; after the command's end, until
        there is nothing more (or DRAIN_BYTES). Pauses while there is no room."""
        while stream.open:
            if not self._room():
                if not stream.paused:
                    stream.paused = True
                    self.loop.remove_reader(stream.fd)
                return
            try:
                data = os.read(stream.fd, CHUNK)
            except BlockingIOError:
                if self.final:
                    self._close_stream(stream)
                return
            except OSError:  # EIO: a terminal whose slave is closed everywhere
                data = b""
            if not data or self.drained > DRAIN_BYTES:
                self._close_stream(stream)
                return
            self.ring.append(stream.name, data)
            self.ring.evict(min((c.offset for c in self.holds), default=self.ring.end))
            self.notify()
            if not self.final:
                return
            self.drained += len(data)

    def resume(self) -> None:
        """A hold follower moved on (or left): paused streams read again if there is room."""
        if not self._room():
            return
        for stream in self.streams:
            if stream.open and stream.paused:
                stream.paused = False
                if self.final:
                    self.pump(stream)
                else:
                    self.loop.add_reader(stream.fd, self.pump, stream)

    def release_first(self) -> None:
        if self.first in self.holds:
            self.holds.discard(self.first)
            self.resume()

    def _close_stream(self, stream: _Stream) -> None:
        stream.open = False
        if not stream.paused:
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(stream.fd)
        self._maybe_done()

    # -- its end -----------------------------------------------------------------------------

    def on_status(self, line: dict[str, Any]) -> None:
        if not self.started.done():
            self.started.set_result(line)
            return
        if self.final:
            return
        if line.get("status") == "ok":
            self.code = int(line.get("code") or 0)
        else:
            self.refusal = GuestRefused(str(line.get("status")), str(line.get("error")), str(line.get("errno") or ""))
        self.end_known()

    def end_known(self) -> None:
        """The command's end is known: what its streams still hold is read, then followers get it."""
        if self.final:
            return
        self.final = True
        self.release_first()
        for stream in list(self.streams):
            if stream.open and not stream.paused:
                self.pump(stream)
        self.notify()
        self._maybe_done()

    def exited(self) -> None:
        """guest_exec has exited: without its final line, it died under its command (killed
        in the guest, say by the guest's memory limit), whose group goes too."""
        if self.status is not None:
            self.status.read()
        if not self.started.done():
            self.started.set_result({"status": "error", "error": "the process's keeper in the guest died"})
        if not self.final:
            self.kill()
            self.refusal = GuestRefused("error", "the process's keeper in the guest died before its command ended")
            self.code = 128 + signal.SIGKILL
            self.end_known()

    def _maybe_done(self) -> None:
        if self.done or not self.final or any(s.open for s in self.streams):
            return
        self.done = True
        self.close_fds()
        self.notify()
        for callback in self.on_done:
            callback()

    def kill(self) -> None:
        """End the command's group: the control pipe's end (guest_exec kills it), and from here."""
        if self.control >= 0:
            os.close(self.control)
            self.control = -1
        if self.host_pid and _started_at(self.host_pid) == self.host_start:
            # Its leader has not been reaped: the group's ID is still its.
            with contextlib.suppress(OSError):
                os.killpg(self.host_pid, signal.SIGKILL)

    def close_fds(self) -> None:
        for timer in self.timers:
            timer.cancel()
        for stream in self.streams:
            if stream.open and not stream.paused:
                with contextlib.suppress(ValueError, OSError):
                    self.loop.remove_reader(stream.fd)
            stream.open = False
        fds = {stream.fd for stream in self.streams} | {self.input_fd, self.control}
        self.input_fd = self.control = self.master = -1
        for fd in fds - {-1}:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.streams = []

    def abandon(self) -> None:
        """The instance is gone (stop, destroy): killed, its fds closed, its followers told."""
        self.kill()
        if not self.started.done():
            self.started.set_result({"status": "unavailable", "error": "the guest is stopping"})
        if not self.final:
            self.final = True
            self.code = 128 + signal.SIGKILL
        self.holds.clear()
        self.done = True
        self.close_fds()
        if self.status is not None:
            self.status.close()
        for task in self.tasks:
            task.cancel()
        self.notify()


# A process's command as listed: the first LISTED_ARGV_BYTES of it (a start may carry 1 MiB of
# arguments; 48 of those in one ListWorkspaceProcesses answer would pass the 4 MiB message limit).
LISTED_ARGV_BYTES = 4096
# An upload ended (a revoke) has this long to remove what it staged before it is killed.
UPLOAD_END_GRACE_S = 2.0


def listed_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """`argv` cut to LISTED_ARGV_BYTES of UTF-8 in all, the cut argument ending with "..."."""
    kept: list[str] = []
    room = LISTED_ARGV_BYTES
    for word in argv:
        size = len(word.encode())
        if size <= room:
            kept.append(word)
            room -= size
            continue
        kept.append(word.encode()[: max(room, 0)].decode(errors="ignore") + "...")
        break
    return tuple(kept)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _started_at(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


@dataclass(eq=False)
class _Pending:
    """A start under way: counted against the caps, its tag taken."""

    tag: str
    upload: bool
    owner: int
    killed: bool = False


@dataclass(eq=False)
class _Instance:
    running: dict[int, _Process] = field(default_factory=dict)
    ended: deque[_Process] = field(default_factory=deque)
    pending: list[_Pending] = field(default_factory=list)


# guest_exec processes whose exit is still awaited after their instance was forgotten.
_LINGERING: set[asyncio.Task[Any]] = set()


class ProcessTable:
    """The GuestProcesses of the process runtime (see the module docstring)."""

    def __init__(self, site: Site, ready: Callable[[str], bool], upload_idle_s: float = UPLOAD_IDLE_S) -> None:
        self._site = site
        self._ready = ready
        self._upload_idle_s = upload_idle_s
        self._instances: dict[str, _Instance] = {}
        self._keys = itertools.count(1)

    # -- starting ----------------------------------------------------------------------------

    async def start(self, instance_id: str, spec: ProcessSpec) -> ProcessInfo:
        if not self._ready(instance_id):
            raise GuestRefused("unavailable", "the guest is not running or is restarting: retry")
        table = self._instances.setdefault(instance_id, _Instance())
        running = list(table.running.values())
        if len(running) + len(table.pending) >= MAX_GUEST_PROCESSES:
            raise GuestRefused(
                "limit", f"{MAX_GUEST_PROCESSES} processes run in this workspace already: end one first", "processes"
            )
        upload = spec.job is not None
        uploads = sum(p.spec.job is not None for p in running) + sum(p.upload for p in table.pending)
        if upload and uploads >= MAX_UPLOADS:
            raise GuestRefused("limit", f"{MAX_UPLOADS} uploads run in this workspace already", "uploads")
        if spec.tag and (any(p.spec.tag == spec.tag for p in running) or any(p.tag == spec.tag for p in table.pending)):
            raise GuestRefused("conflict", f"a running process has the tag {spec.tag!r}")
        pending = _Pending(spec.tag, upload, spec.owner)
        table.pending.append(pending)
        try:
            process = await self._spawn(instance_id, spec)
        finally:
            table.pending.remove(pending)
        if pending.killed or self._instances.get(instance_id) is not table:
            # Ended while it started (a revoke; the instance's stop): it does not run on.
            process.abandon()
            self._linger(process)
            if self._instances.get(instance_id) is not table:
                raise GuestRefused("unavailable", "the guest is stopping")
            return process.info()
        table.running[process.key] = process
        process.on_done.append(lambda: self._ended(table, process))
        if process.done:  # ended (and its output read) before it was in the table
            self._ended(table, process)
        if spec.job is not None:
            self._idle_check(process)
        if spec.stdin or spec.close_stdin:
            process.tasks.append(asyncio.create_task(self._feed(process, spec.stdin, spec.close_stdin)))
        return process.info()

    async def _spawn(self, instance_id: str, spec: ProcessSpec) -> _Process:
        directory, forks = self._site(instance_id)
        ours, theirs = _fds(spec.pty)
        job = {
            "mode": "process",
            "argv": list(spec.argv),
            "env": dict(spec.env),
            "cwd": spec.cwd or "/",
            "user": spec.user,
            "pty": spec.pty is not None,
            "job": dict(spec.job) if spec.job is not None else None,
        }
        try:
            handle = await _launch(directory, job, theirs, forks)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in set(theirs):
                os.close(fd)
        process = _Process(next(self._keys), spec, handle)
        status_read, process.control = ours[:2]
        if spec.pty is not None:
            process.master = process.input_fd = ours[2]
            process.streams = [_Stream(ours[2], "pty")]
        else:
            process.input_fd = ours[2]
            process.streams = [_Stream(ours[3], "stdout"), _Stream(ours[4], "stderr")]
        for fd in ours[1:]:
            os.set_blocking(fd, False)
        process.status = _StatusLines(status_read, process.on_status)
        process.exit_task = asyncio.create_task(handle.wait())
        process.exit_task.add_done_callback(lambda _: process.exited())
        try:
            first = await process.started
        except BaseException:  # cancelled: it must not run on unseen
            process.abandon()
            self._linger(process)
            raise
        if first.get("status") != "started":
            process.abandon()
            self._linger(process)
            raise GuestRefused(str(first.get("status")), str(first.get("error")), str(first.get("errno") or ""))
        process.pid = int(first.get("pid") or 0)
        process.host_pid = int(first.get("host_pid") or 0)
        process.host_start = int(first.get("start") or 0)
        for stream in process.streams:
            process.loop.add_reader(stream.fd, process.pump, stream)
        process.timers.append(process.loop.call_later(FIRST_FOLLOW_S, process.release_first))
        return process

    @staticmethod
    def _linger(process: _Process) -> None:
        """Its guest_exec's exit is still awaited (and reaped), off the table."""
        task = process.exit_task
        if task is not None and not task.done() and task not in _LINGERING:
            _LINGERING.add(task)
            task.add_done_callback(_LINGERING.discard)

    @staticmethod
    def _ended(table: _Instance, process: _Process) -> None:
        """Once its output is all read after its end: kept among the ended ones (the oldest go)."""
        if table.running.pop(process.key, None) is None:
            return
        table.ended.append(process)
        while len(table.ended) > MAX_ENDED_PROCESSES:
            ProcessTable._linger(table.ended.popleft())

    # -- looking -----------------------------------------------------------------------------

    def _find(self, instance_id: str, selector: Selector) -> _Process:
        table = self._instances.get(instance_id)
        if table is not None:
            if isinstance(selector, int):
                found = [p for p in table.running.values() if p.pid == selector]
                found += [p for p in reversed(table.ended) if p.pid == selector]
            else:
                found = [p for p in table.running.values() if p.spec.tag == selector]
                found += [p for p in reversed(table.ended) if p.spec.tag == selector]
            if found:
                return found[0]
        what = f"pid {selector}" if isinstance(selector, int) else f"tag {selector!r}"
        raise GuestRefused("not-found", f"no process with {what} in this workspace")

    async def list(self, instance_id: str) -> list[ProcessInfo]:
        table = self._instances.get(instance_id)
        if table is None:
            return []
        processes = sorted([*table.running.values(), *table.ended], key=lambda p: p.key)
        return [p.info() for p in processes]

    async def follow(
        self,
        instance_id: str,
        selector: Selector,
        replay: bool = False,
        stop: asyncio.Event | None = None,
        hold: bool = False,
    ) -> AsyncGenerator[Output | Dropped | Replayed | Exit, None]:
        process = self._find(instance_id, selector)
        ring = process.ring
        cursor = _Cursor(ring.first_seq, ring.start) if replay else _Cursor(ring.first_seq + len(ring.chunks), ring.end)
        if replay and ring.start:
            cursor.offset = 0  # what was not kept comes as Dropped first
        # With replay: Replayed once the cursor has passed what was kept when the follow began.
        replayed_at = ring.end if replay else None
        stopped = asyncio.create_task(stop.wait()) if stop is not None else None
        if hold and not process.done:
            process.holds.add(cursor)
            process.release_first()
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise JobStopped("the follower was stopped")
                if replayed_at is not None and cursor.offset >= replayed_at:
                    replayed_at = None
                    if not process.done:  # (an ended one's Exit says it all)
                        yield Replayed()
                    continue
                if cursor.offset < ring.start:
                    missed = ring.start - cursor.offset
                    cursor.seq, cursor.offset = ring.first_seq, ring.start
                    yield Dropped(missed)
                    continue
                index = cursor.seq - ring.first_seq
                if index < len(ring.chunks):
                    stream, data = ring.chunks[index]
                    cursor.seq += 1
                    cursor.offset += len(data)
                    if hold:
                        process.resume()
                    yield Output(stream, data)
                    continue
                if process.done:
                    if process.refusal is not None:
                        raise process.refusal
                    yield Exit(process.code)
                    return
                await process.changed(stopped)
        finally:
            if stopped is not None:
                stopped.cancel()
            if cursor in process.holds:
                process.holds.discard(cursor)
                process.resume()

    # -- input, signals, terminal ----------------------------------------------------------------

    async def send(
        self, instance_id: str, selector: Selector, data: bytes, close: bool = False, offset: int | None = None
    ) -> int:
        return await self._send(self._find(instance_id, selector), data, close, offset)

    async def _send(self, process: _Process, data: bytes, close: bool, offset: int | None) -> int:
        async with process.input_lock:
            if offset is not None and offset != process.received:
                raise GuestRefused(
                    "conflict", f"offset {offset} is not where the input is: {process.received} bytes were taken"
                )
            if process.final:
                raise GuestRefused("conflict", "the process has exited: it takes no more input")
            if process.stdin_closed and (data or close):
                raise GuestRefused("conflict", "the process's standard input is closed")
            process.sending = True
            try:
                await self._write(process, data)
            finally:
                process.sending = False
                process.last_input = process.loop.time()
            if close and process.master < 0 and process.input_fd >= 0:
                fd, process.input_fd = process.input_fd, -1
                os.close(fd)
                process.stdin_closed = True
            return process.received

    async def _write(self, process: _Process, data: bytes) -> None:
        """All of `data` to its stdin (or terminal), waiting while it does not read."""
        view = memoryview(data)
        while view:
            fd = process.input_fd
            if process.final or fd < 0:
                raise GuestRefused("conflict", f"the process ended before taking its input ({process.received} bytes)")
            try:
                written = os.write(fd, view[:CHUNK])
            except BlockingIOError:
                await process.changed(None, writable=fd)
                continue
            except OSError:  # EPIPE: it closed its stdin; EIO: its terminal is gone
                raise GuestRefused("conflict", "the process no longer reads its input") from None
            process.received += written
            process.last_input = process.loop.time()
            view = view[written:]

    async def _feed(self, process: _Process, data: bytes, close: bool) -> None:
        """A start's stdin, written as the first input (SendInput calls queue after it)."""
        with contextlib.suppress(GuestRefused, OSError):
            await self._send(process, data, close, None)

    def _idle_check(self, process: _Process) -> None:
        """An upload not written for upload_idle_s is cancelled (SIGTERM: it removes what it made)."""
        if process.final:
            return
        idle = process.loop.time() - process.last_input
        if process.sending or process.stdin_closed or idle < self._upload_idle_s:
            wait = self._upload_idle_s - (0 if process.sending or process.stdin_closed else idle)
            process.timers.append(process.loop.call_later(max(wait, 0.05), self._idle_check, process))
            return
        log.info("an upload (%s) was not written for %.0f s: cancelled", process.spec.tag, idle)
        with contextlib.suppress(GuestRefused):
            self._control(process, signal.SIGTERM)

    async def signal(self, instance_id: str, selector: Selector, signum: int) -> None:
        process = self._find(instance_id, selector)
        if process.final:
            raise GuestRefused("conflict", "the process has exited")
        self._control(process, signum)

    @staticmethod
    def _control(process: _Process, signum: int) -> None:
        if process.control < 0:
            raise GuestRefused("conflict", "the process is ending")
        try:
            os.write(process.control, json.dumps({"signal": signum}).encode() + b"\n")
        except BlockingIOError:
            raise GuestRefused("unavailable", "the process's keeper in the guest is not answering: retry") from None
        except OSError:
            raise GuestRefused("conflict", "the process is ending") from None

    async def resize(self, instance_id: str, selector: Selector, rows: int, cols: int) -> None:
        process = self._find(instance_id, selector)
        if process.spec.pty is None:
            raise GuestRefused("conflict", "the process has no terminal to resize")
        if process.final or process.master < 0:
            raise GuestRefused("conflict", "the process has exited")
        fcntl.ioctl(process.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    # -- ends --------------------------------------------------------------------------------------

    async def end(self, instance_id: str, keep_owner: int | None = None) -> None:
        table = self._instances.get(instance_id)
        if table is None:
            return
        for pending in table.pending:
            if keep_owner is None or pending.owner != keep_owner:
                pending.killed = True
        for process in list(table.running.values()):
            if keep_owner is not None and process.spec.owner == keep_owner:
                continue
            if process.spec.job is not None and process.control >= 0:
                # An upload: SIGTERM first, so that its job removes what it staged (an archive's
                # staging directory); SIGKILL after a grace, if it is still there.
                with contextlib.suppress(GuestRefused):
                    self._control(process, signal.SIGTERM)
                process.timers.append(asyncio.get_running_loop().call_later(UPLOAD_END_GRACE_S, process.kill))
            else:
                process.kill()

    def forget(self, instance_id: str) -> None:
        """The instance's guest ends (stop, destroy, release): its processes are killed and the
        table dropped (their fds closed, followers told); idempotent."""
        table = self._instances.pop(instance_id, None)
        if table is None:
            return
        for pending in table.pending:
            pending.killed = True
        for process in [*table.running.values(), *table.ended]:
            process.abandon()
            self._linger(process)

    def close(self) -> None:
        """At shutdown: every process ended (the control pipes' ends would do it anyway)."""
        for instance_id in list(self._instances):
            self.forget(instance_id)


def _fds(pty: tuple[int, int] | None) -> tuple[list[int], list[int]]:
    """A process's fds: ours (status, control, then the PTY's master, or stdin, stdout and
    stderr's ends) and the guest_exec's (stdin, stdout, stderr, status, control)."""
    made: list[int] = []
    try:
        for _ in range(2 if pty is not None else 5):
            made += os.pipe2(os.O_CLOEXEC)
        if pty is not None:
            made += os.openpty()
            fcntl.ioctl(made[4], termios.TIOCSWINSZ, struct.pack("HHHH", *pty, 0, 0))
    except BaseException:
        for fd in made:
            os.close(fd)
        raise
    status_read, status_write, control_read, control_write = made[:4]
    if pty is not None:
        master, slave = made[4:6]
        return [status_read, control_write, master], [slave, slave, slave, status_write, control_read]
    stdin_read, stdin_write, out_read, out_write, err_read, err_write = made[4:10]
    return (
        [status_read, control_write, stdin_write, out_read, err_read],
        [stdin_read, out_write, err_write, status_write, control_read],
    )


async def _launch(
    directory: Path, job: dict[str, Any], fds: list[int], forks: ForkServer | Door | None
) -> asyncio.subprocess.Process | Child:
    """guest_exec.py with (stdin, stdout, stderr, status, control) at 0-4: forked from the
    instance's job door or the fork server, or else exec'd."""
    if forks is not None:
        argv = [str(directory), json.dumps({**job, "status_fd": 3, "control_fd": 4})]
        try:
            return await asyncio.to_thread(forks.spawn, "guest_exec", argv, fds)
        except OSError as error:
            log.warning("the fork server failed (%s): starting the guest process anew", error)
    stdin, stdout, stderr, status, control = fds
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        str(GUEST_EXEC),
        str(directory),
        json.dumps({**job, "status_fd": status, "control_fd": control}),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        pass_fds=(status, control),
        start_new_session=True,
    )


class TableProcesses:
    """GuestProcesses (runtime/base.py) by delegation to `processes`: ProcessRuntime's."""

    processes: ProcessTable

    async def start_guest_process(self, instance_id: str, spec: ProcessSpec) -> ProcessInfo:
        return await self.processes.start(instance_id, spec)

    async def list_guest_processes(self, instance_id: str) -> list[ProcessInfo]:
        return await self.processes.list(instance_id)

    def follow_guest_process(
        self,
        instance_id: str,
        selector: Selector,
        replay: bool = False,
        stop: asyncio.Event | None = None,
        hold: bool = False,
    ) -> AsyncGenerator[Output | Dropped | Replayed | Exit, None]:
        return self.processes.follow(instance_id, selector, replay, stop, hold)

    async def send_guest_process_input(
        self, instance_id: str, selector: Selector, data: bytes, close: bool = False, offset: int | None = None
    ) -> int:
        return await self.processes.send(instance_id, selector, data, close, offset)

    async def signal_guest_process(self, instance_id: str, selector: Selector, signum: int) -> None:
        await self.processes.signal(instance_id, selector, signum)

    async def resize_guest_process(self, instance_id: str, selector: Selector, rows: int, cols: int) -> None:
        await self.processes.resize(instance_id, selector, rows, cols)

    async def end_guest_processes(self, instance_id: str, keep_owner: int | None = None) -> None:
        await self.processes.end(instance_id, keep_owner)
