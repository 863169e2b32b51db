"""The control plane's handle on one instance supervisor: attach over its unix socket,
follow its messages and its exit, and turn them into reports."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ...domain.model import Backend
from ...domain.reports import ExitReason, GuestOomKill, GuestReset, GuestResponding, Report, VmmExited
from .supervisor_os import kill_cgroups

log = logging.getLogger(__name__)

# How long the handle of a guest the node supervisor held waits for a new node supervisor
# to re-adopt it after the old one died (node_supervision.py starts it at once).
READOPT_S = 10.0


class SupervisorHost(Protocol):
    """What a supervisor handle needs of the runtime that started it."""

    backend: Backend
    events: asyncio.Queue[Report]

    def instance_dir(self, instance_id: str) -> Path: ...

    def socket_name(self, instance_id: str) -> str: ...


def exit_report(instance_id: str, backend: Backend, info: dict[str, Any] | None) -> Report | None:
    """What a supervisor's exit means for the control plane (None: nothing to report)."""
    reason = (info or {}).get("reason")
    if reason in ("stopped", "not-ready", "spawn-failed"):
        return None  # a stop or a launch in progress reports it
    if reason == "oom":
        return VmmExited(instance_id, reason=ExitReason.HOST_OOM)
    if reason == "reboot":
        if backend is Backend.FIRECRACKER:
            return GuestReset(instance_id)
        return VmmExited(instance_id, reason=ExitReason.GUEST_RESET)
    if reason == "poweroff" and backend is Backend.KIBOVM:
        return VmmExited(instance_id, reason=ExitReason.GUEST_POWEROFF)
    return VmmExited(instance_id, reason=ExitReason.CRASH, detail=crash_detail(info))


def crash_detail(info: dict[str, Any] | None) -> str:
    """What ended, in this runtime's words (a sandbox has no VMM): the supervisor, gone without
    its exit.json, or the guest, whose init exited (exit.json's code, signal or error)."""
    if info is None:
        return (
            "the sandbox's supervisor is gone without a word (killed from outside, or the machine "
            "restarted); its guest ended with it"
        )
    if info.get("error"):
        return f"the sandbox ended: {info['error']}"
    if info.get("reason") != "exit":
        return f"the sandbox's supervisor exited ({info.get('reason')})"
    how = f"signal {info['signal']}" if info.get("signal") else f"code {info.get('code')}"
    return f"the sandbox's guest ended: its init exited ({how}), as a guest kernel panic would"


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def lock_held(directory: Path) -> bool:
    """Whether a live supervisor holds this instance (its flock; immune to PID reuse)."""
    try:
        fd = os.open(directory / "lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we may have taken
    return False


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name ([0]: state, [1]: parent, [19]: start)."""
    if pid <= 0:
        return []
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def running(pid: int, started: object) -> bool:
    """Whether PID runs (not a zombie) and, if `started` is known, is the process started then."""
    fields = proc_stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return not started or int(fields[19]) == started


def parent_pid(pid: int) -> int:
    fields = proc_stat(pid)
    return int(fields[1]) if fields else 0


def kill_supervisor(directory: Path) -> None:
    """SIGKILL the supervisor recorded in state.json, if it is still that process; of an
    instance the node supervisor holds, the guest (every process in its cgroups), whose
    exit the node supervisor then handles: the node supervisor holds others."""
    state = read_json(directory / "state.json") or {}
    if state.get("parked"):
        kill_cgroups(list((read_json(directory / "spec.json") or {}).get("cgroup_procs") or ()))
        return
    pid = int(state.get("supervisor_pid") or 0)
    if pid > 0 and start_time(pid) == state.get("supervisor_start"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Process(Protocol):
    """A supervisor process this control plane started: a Popen, or a fork server's Child."""

    def poll(self) -> int | None: ...


class Supervised:
    """The control plane's side of one supervisor: its connection and what it said."""

    def __init__(self, runtime: SupervisorHost, instance_id: str, process: Process | None) -> None:
        self.runtime = runtime
        self.instance_id = instance_id
        self.dir = runtime.instance_dir(instance_id)
        self.process = process
        # A re-attached supervisor (process None: the control plane restarted) is known by
        # what it last recorded until its socket says more; without this, a data-plane call
        # right after a restart found the guest "not answering" (state "") though it ran.
        recorded = (read_json(self.dir / "state.json") or {}) if process is None else {}
        self.state = str(recorded.get("state") or "")
        self.why = str(recorded.get("why") or "")
        self.exit_info: dict[str, Any] | None = None
        self.closed = False
        self.replies: list[dict[str, Any]] = []
        # > 0 while an operation (launch, stop, destroy) expects the supervisor to go.
        self.quiet = 0
        self.reported_idle = False
        self._changed = asyncio.Condition()
        self._writer: asyncio.StreamWriter | None = None
        self.task = asyncio.get_running_loop().create_task(self._monitor(), name=f"supervisor {instance_id}")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait(self, predicate: Callable[[], bool], seconds: float) -> bool:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(predicate), seconds)
            except TimeoutError:
                return predicate()
        return True

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        name = "\0" + self.runtime.socket_name(self.instance_id)
        while True:
            try:
                return await asyncio.open_unix_connection(name)
            except (ConnectionRefusedError, FileNotFoundError):
                pass
            starting = self.process is not None and self.process.poll() is None
            if not starting and not lock_held(self.dir):
                return None
            await asyncio.sleep(0.005)

    async def _monitor(self) -> None:
        try:
            while (connection := await self._connect()) is not None:
                reader, self._writer = connection
                try:
                    while line := await reader.readline():
                        try:
                            message = json.loads(line)
                        except ValueError:
                            continue
                        await self._receive(message)
                except (OSError, ValueError) as error:
                    log.warning("supervisor of %s: connection failed: %s", self.instance_id, error)
                finally:
                    self._writer.close()
                    self._writer = None
                if await self._gone():
                    break
                log.warning("the supervisor of %s dropped its connection but runs: reconnecting", self.instance_id)
        except asyncio.CancelledError:
            # The control plane shuts down: the supervisor runs on.
            if self._writer is not None:
                self._writer.close()
            raise
        await self._gone()
        await self._closed()

    async def _gone(self) -> bool:
        """After EOF: wait (briefly) until the supervisor has exited; reaps our own child.
        False: it runs (reconnect), as does a held guest re-adopted by a new node supervisor."""
        if self._held_by_node():
            deadline = asyncio.get_running_loop().time() + READOPT_S
            while asyncio.get_running_loop().time() < deadline:
                if lock_held(self.dir):
                    return False
                if (self.dir / "exit.json").exists():
                    return True
                await asyncio.sleep(0.05)
            return True
        process = self.process
        for _ in range(500):
            if process is not None:
                if process.poll() is not None:
                    return True
            elif not lock_held(self.dir):
                return True
            await asyncio.sleep(0.01)
        return False

    def _held_by_node(self) -> bool:
        """Whether the node supervisor held this instance and went without ending it."""
        state = read_json(self.dir / "state.json") or {}
        return bool(state.get("parked")) and not (self.dir / "exit.json").exists()

    async def _receive(self, message: dict[str, Any]) -> None:
        if "state" in message:
            self.state, self.why = str(message["state"]), str(message.get("why") or "")
            if self.state == "idle" and self.why == "poweroff" and not self.quiet and not self.reported_idle:
                # firecracker: the guest halted, the VMM runs on.
                self.reported_idle = True
                self.runtime.events.put_nowait(GuestResponding(self.instance_id, responding=False))
        elif "reply" in message:
            self.replies.append(message)
        elif "oom" in message:
            # The kernel killed a process over the guest's memory; the guest runs on.
            oom = message["oom"] if isinstance(message["oom"], dict) else {}
            with contextlib.suppress(TypeError, ValueError):
                report = GuestOomKill(
                    self.instance_id,
                    pid=int(oom.get("pid") or 0),
                    command=str(oom.get("command") or "")[:64],
                    count=max(1, int(oom.get("count") or 1)),
                )
                self.runtime.events.put_nowait(report)
        elif "exit" in message:
            self.exit_info = message["exit"]
        await self._notify()

    async def _closed(self) -> None:
        if self.exit_info is None:
            self.exit_info = read_json(self.dir / "exit.json")
        self.closed = True
        await self._notify()
        if not self.quiet:
            report = exit_report(self.instance_id, self.runtime.backend, self.exit_info)
            if report is not None:
                log.warning("instance %s: the supervisor exited: %s", self.instance_id, self.exit_info or "killed")
                self.runtime.events.put_nowait(report)

    async def stop(self, force: bool, seconds: float) -> dict[str, Any] | None:
        """Ask for a stop; the supervisor's reply, or None if it went without one / timed out."""
        if self._writer is None:
            await self.wait(lambda: self._writer is not None or self.closed, 5.0)
        if self.closed or self._writer is None:
            return None
        seen = len(self.replies)
        try:
            self._writer.write(json.dumps({"op": "stop", "force": force}).encode() + b"\n")
            await self._writer.drain()
        except OSError:
            pass
        await self.wait(lambda: len(self.replies) > seen or self.closed, seconds)
        return self.replies[seen] if len(self.replies) > seen else None
