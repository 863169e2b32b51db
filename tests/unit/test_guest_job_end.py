"""When a data-plane job is over (runtime/process/guest_jobs.py): at guest_exec's status line
once its streams have ended, without waiting for guest_exec's exit (freeing a forked
interpreter took ~1.5-3 ms of every command here); and, when guest_exec exits without a
status line (killed under its command), at that exit, taking the job's process group with it.

guest_exec is played by a fake whose exit the test decides; its process group is a real
`sleep` in a session of its own (the group the server would kill)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kibo_ctrl.runtime.base import Exit, GuestRefused, Output
from kibo_ctrl.runtime.process.guest_access import jobs as guest_jobs


class FakeJob:
    """What a fork server's spawn gives back: `pid` (the job's process group) and `wait()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.exit = asyncio.Event()

    async def wait(self) -> int:
        await self.exit.wait()
        self.returncode = 0
        return 0


class FakeForks:
    """Spawns a FakeJob: writes `output` to its stdout, closes its streams, then writes
    `status` (if any) to its status pipe and keeps that pipe open until the job exits."""

    def __init__(self, group: int, output: bytes, status: bytes) -> None:
        self.group = group
        self.output = output
        self.status = status
        self.job: FakeJob | None = None
        self._status_fd = -1

    def spawn(self, program: str, argv: list[str], fds: list[int]) -> FakeJob:
        stdin, stdout, stderr, status = (os.dup(fd) for fd in fds)
        os.write(stdout, self.output)
        for fd in (stdin, stdout, stderr):
            os.close(fd)
        if self.status:
            os.write(status, self.status)
        self._status_fd = status
        self.job = FakeJob(self.group)
        return self.job

    def exit(self) -> None:
        """guest_exec's exit: its status pipe's end goes with it."""
        assert self.job is not None
        os.close(self._status_fd)
        self.job.exit.set()


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield sleeper
    sleeper.kill()
    sleeper.wait()


async def _run(forks: FakeForks, tmp_path: Path) -> list[Any]:
    job = {"mode": "exec", "argv": ["true"]}
    runs = guest_jobs.run_guest_exec(tmp_path, job, forks=forks)  # type: ignore[arg-type]
    return [item async for item in runs]


async def test_a_job_ends_at_its_status_line_before_guest_exec_exits(
    group: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    line = json.dumps({"status": "ok", "code": 7, "error": "", "errno": ""}).encode() + b"\n"
    forks = FakeForks(group.pid, b"hello", line)
    items = await asyncio.wait_for(_run(forks, tmp_path), 10)
    assert items == [Output("stdout", b"hello"), Exit(7)]
    assert forks.job is not None and forks.job.returncode is None, "answered before guest_exec's exit"
    assert group.poll() is None, "a job that said how it ended keeps its group (what its command left)"
    assert len(guest_jobs._LINGERING) == 1, "its exit is still waited for"
    forks.exit()
    for _ in range(100):
        if not guest_jobs._LINGERING:
            break
        await asyncio.sleep(0.01)
    assert not guest_jobs._LINGERING, "and once it has exited, nothing of it is left"


async def test_a_job_that_exits_without_a_status_line_takes_its_group(
    group: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    forks = FakeForks(group.pid, b"", b"")
    running = asyncio.create_task(_run(forks, tmp_path))
    await asyncio.sleep(0.2)
    assert not running.done(), "no status line: the job is not over before guest_exec's exit"
    forks.exit()
    with pytest.raises(GuestRefused, match="without a status"):
        await asyncio.wait_for(running, 10)
    assert group.wait(10) < 0, "the job's process group was killed"
