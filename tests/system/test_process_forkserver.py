"""The fork server (runtime/process/forkserver.py): a child forked from it is what the
exec'd script was: its command line, a session of its own, only the descriptors it was
given; a guest job is the caller's own child (reaped there); the server goes with its
caller's channel while its children run on; a dead server is replaced at the next spawn.

A guest job is run against a fake instance in the unisolated mode (no namespaces, no
cgroup: no root needed), whose "guest" is a sleep of this test: guest_exec then runs a
command beside it, long enough to look at the job on the machine."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kibo_ctrl.runtime.process import forkserver
from kibo_ctrl.runtime.process.forkserver import ForkServer


def _stat(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def _wait_for(predicate: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def forks() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[Path]:
    """A fake running instance, unisolated: its guest is a sleep of ours."""
    guest = subprocess.Popen(["sleep", "60"])
    directory = tmp_path / "ws-test-g1"
    directory.mkdir()
    spec = {"isolation": "none", "mounts": [], "cgroup_procs": [], "guest_env": {"PATH": os.environ["PATH"]}}
    spec.update(cwd=str(tmp_path), seccomp_filter="")
    (directory / "spec.json").write_text(json.dumps(spec))
    state = {"state": "ready", "guest_pid": guest.pid, "guest_start": int(_stat(guest.pid)[19])}
    (directory / "state.json").write_text(json.dumps(state))
    yield directory
    guest.kill()
    guest.wait()


def _job(forks: ForkServer, instance: Path, argv: list[str]) -> tuple[forkserver.Child, int, int]:
    """Start a guest job; (the child, its stdout's read end, its status's read end)."""
    out_r, out_w = os.pipe()
    status_r, status_w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    job = json.dumps({"mode": "exec", "argv": argv, "status_fd": 3})
    try:
        child = forks.spawn("guest_exec", [str(instance), job], [null, out_w, out_w, status_w])
    finally:
        for fd in (null, out_w, status_w):
            os.close(fd)
    return child, out_r, status_r


def test_a_guest_job_is_the_callers_child_and_looks_like_the_script(forks: ForkServer, instance: Path) -> None:
    child, out_r, status_r = _job(forks, instance, ["sh", "-c", "echo started; exec sleep 30"])
    try:
        assert os.read(out_r, 100) == b"started\n"
        fields = _stat(child.pid)
        assert int(fields[1]) == os.getpid(), "the job's parent is the caller, not the fork server"
        assert os.getsid(child.pid) == child.pid, "a session of its own (its process group is killable)"
        words = Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")
        assert [w.decode() for w in words[:5]] == [
            sys.executable,
            "-I",
            "-S",
            str(forkserver.SCRIPTS["guest_exec"]),
            str(instance),
        ]
        # What it was given (stdin, stdout, stderr, the status pipe), and guest_exec's own
        # handle on its guest's /proc entry: nothing of the fork server (its channel, say).
        fds = {int(fd): os.readlink(f"/proc/{child.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{child.pid}/fd")}
        guest = json.loads((instance / "state.json").read_text())["guest_pid"]
        assert {fd for fd, target in fds.items() if target != f"/proc/{guest}"} == {0, 1, 2, 3}, fds
        assert Path(f"/proc/{child.pid}/cwd").resolve() == Path("/")
        assert child.group_is_its()
    finally:
        os.killpg(child.pid, signal.SIGKILL)
    select.select([child.pidfd], [], [], 10)
    assert child.poll() == -signal.SIGKILL, "reaped here: its real exit status"
    os.close(out_r)
    os.close(status_r)


def test_a_job_reports_its_command_and_exit_code(forks: ForkServer, instance: Path) -> None:
    child, out_r, status_r = _job(forks, instance, ["sh", "-c", "echo hi; exit 3"])
    select.select([child.pidfd], [], [], 10)
    assert child.poll() == 0
    assert os.read(out_r, 100) == b"hi\n"
    assert json.loads(os.read(status_r, 1000)) == {"status": "ok", "code": 3, "error": "", "errno": ""}
    os.close(out_r)
    os.close(status_r)


def test_the_server_goes_with_its_channel_and_its_children_run_on(forks: ForkServer, instance: Path) -> None:
    forks.start()
    assert forks._process is not None
    server = forks._process.pid
    child, out_r, status_r = _job(forks, instance, ["sh", "-c", "echo started; exec sleep 30"])
    assert os.read(out_r, 100) == b"started\n"
    forks.close()
    _wait_for(lambda: not Path(f"/proc/{server}").exists())
    assert child.poll() is None, "the job outlives the server"
    os.killpg(child.pid, signal.SIGKILL)
    select.select([child.pidfd], [], [], 10)
    assert child.poll() == -signal.SIGKILL
    os.close(out_r)
    os.close(status_r)


def test_a_killed_server_is_replaced_at_the_next_spawn(forks: ForkServer, instance: Path) -> None:
    forks.start()
    assert forks._process is not None
    first = forks._process.pid
    os.kill(first, signal.SIGKILL)
    _wait_for(lambda: forks._process is not None and forks._process.poll() is not None)
    child, out_r, status_r = _job(forks, instance, ["true"])
    assert forks._process is not None and forks._process.pid != first
    select.select([child.pidfd], [], [], 10)
    assert child.poll() == 0
    assert json.loads(os.read(status_r, 1000))["status"] == "ok"
    os.close(out_r)
    os.close(status_r)


def test_only_the_known_scripts_are_forked(forks: ForkServer) -> None:
    with pytest.raises(OSError, match="unknown program"):
        forks.spawn("sh", ["-c", "true"], [0, 1, 2])
