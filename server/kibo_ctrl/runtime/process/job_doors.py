"""The runtime's job doors: one per running instance with cgroups (forkserver.py, `Door`).

A guest job forked from its instance's door is born in the instance's cgroups instead of
moving itself there, which on cgroup v1 waits for an RCU grace period (~16 ms here: it was
nearly all of a first `exec` of `true`). A door is opened as its instance's supervisor is
spawned, so its own move overlaps the launch; closed when the instance stops, is destroyed
or is reset, and after `idle_s` without a job (a door and its spare are forked
interpreters: ~3 MiB that an idle workspace should not keep); reaped as soon as it dies otherwise (its guest's end
kills everything in the cgroups). An instance without a door (adopted after a control-plane
restart, or idle) gets one at its next job, which itself goes through the fork server, so
the jobs of a workspace in use are fast. Without a door, jobs work as before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from .fork_client import Door, ForkServer

__all__ = ["IDLE_S", "JobDoors"]

log = logging.getLogger(__name__)

# How long a door stays open without a job (ProcessOptions.job_door_idle_s).
IDLE_S = 60.0


class JobDoors:
    def __init__(self, forks: ForkServer, idle_s: float = IDLE_S) -> None:
        self.forks = forks
        self.idle_s = idle_s
        self._doors: dict[str, Door] = {}
        self._used: dict[str, float] = {}  # when each open door last forked a job (loop time)
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def open(self, instance_id: str, directory: Path, cgroups: bool) -> None:
        """Open `instance_id`'s door (a fresh one: its cgroups may be new), in the event loop.
        `cgroups`: whether the instance has any (else its jobs need no door)."""
        self.close(instance_id)
        if not cgroups or self.idle_s <= 0:
            return
        try:
            with open(directory / "supervisor.log", "ab") as output:
                door = self.forks.door(directory, output.fileno())
        except OSError as error:
            log.warning("%s: no job door (%s): its jobs move into its cgroups themselves", instance_id, error)
            return
        self._doors[instance_id] = door
        loop = asyncio.get_running_loop()
        if door.child.pidfd >= 0:
            loop.add_reader(door.child.pidfd, self._died, instance_id, door)
        self._used[instance_id] = loop.time()
        self._timers[instance_id] = loop.call_later(self.idle_s, self._idle, instance_id)

    def _idle(self, instance_id: str) -> None:
        """Close a door unused for idle_s; else look again when it would be."""
        if instance_id not in self._doors:
            return
        loop = asyncio.get_running_loop()
        left = self._used[instance_id] + self.idle_s - loop.time()
        if left > 0:
            self._timers[instance_id] = loop.call_later(left, self._idle, instance_id)
        else:
            self.close(instance_id)

    def _died(self, instance_id: str, door: Door) -> None:
        """Reap a door that died (its guest's end, say): the next job opens another."""
        self._unwatch(door)
        door.close()

    def get(self, instance_id: str, directory: Path, cgroups: bool) -> ForkServer | Door:
        """Where `instance_id`'s next job is forked: its door; else the fork server, and a
        new door is opened for the jobs after it (none yet, closed when idle, dead, refused)."""
        door = self._doors.get(instance_id)
        if door is None or not door.open:
            self.open(instance_id, directory, cgroups)
            return self.forks
        self._used[instance_id] = asyncio.get_running_loop().time()
        return door

    def close(self, instance_id: str) -> None:
        door = self._doors.pop(instance_id, None)
        self._used.pop(instance_id, None)
        timer = self._timers.pop(instance_id, None)
        if timer is not None:
            timer.cancel()
        if door is not None:
            self._unwatch(door)
            door.close()

    @staticmethod
    def _unwatch(door: Door) -> None:
        if door.child.pidfd >= 0:
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                asyncio.get_running_loop().remove_reader(door.child.pidfd)

    def close_all(self) -> None:
        for instance_id in list(self._doors):
            self.close(instance_id)
