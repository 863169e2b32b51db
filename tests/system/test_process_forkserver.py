"""The fork server (runtime/process/forkserver.py): a child forked from it is what the
exec'd script was: its command line, a session of its own, only the descriptors it was
given; a guest job is the caller's own child (reaped there); the server goes with its
caller's channel while its children run on; a dead server is replaced at the next spawn.
A job door (needs root and a writable cgroup hierarchy) forks jobs born in its instance's
cgroups, only its own instance's, only while those cgroups are the ones it joined; a dead,
refusing or closed door costs only speed (the job comes from the fork server). Each door job
was the door's spare, forked ahead and waiting for it; a dead spare costs only speed too,
and a door's end is its spare's.

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
from kibo_ctrl.runtime.process.cgroups import Cgroups
from kibo_ctrl.runtime.process.fork_client import Child, Door, ForkServer


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


@pytest.fixture
def cgroup_procs(tmp_path: Path) -> Iterator[list[str]]:
    """Two fresh cgroups (each in every hierarchy the runtime would use): their cgroup.procs."""
    if os.geteuid() != 0:
        pytest.skip("a job door needs root (it moves itself into a cgroup)")
    cgroups = Cgroups(f"test-{os.getpid()}-{tmp_path.name[-12:]}")
    if not cgroups.parents:
        pytest.skip("no writable cgroup hierarchy here")
    made = [cgroups.create(name, 1, 256) for name in ("door-a", "door-b")]
    yield [" ".join(limits.procs) for limits in made]
    for limits in made:
        Cgroups.remove(limits.dirs)
    cgroups.close()


def _in_cgroups(instance: Path, procs: str) -> None:
    spec = json.loads((instance / "spec.json").read_text())
    (instance / "spec.json").write_text(json.dumps({**spec, "cgroup_procs": procs.split()}))


def _cgroup_of(pid: int) -> set[str]:
    """The process's cgroups (its lines of /proc/PID/cgroup)."""
    return set(Path(f"/proc/{pid}/cgroup").read_text().splitlines())


def _cgroups_lines(output: bytes) -> set[str]:
    return set(output.decode().splitlines())


def _reference(procs: str) -> set[str]:
    """What /proc/PID/cgroup says for a process moved into the cgroups of these cgroup.procs."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        for path in procs.split():
            Path(path).write_text(str(sleeper.pid))
        return _cgroup_of(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


def _door(forks: ForkServer, instance: Path) -> Door:
    with open(instance / "door.log", "ab") as log:
        return forks.door(instance, log.fileno())


def _job(forks: ForkServer | Door, instance: Path, argv: list[str]) -> tuple[Child, int, int]:
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
        # Where its command runs: it went there itself (from `/`, where every child starts).
        assert Path(f"/proc/{child.pid}/cwd").resolve() == instance.parent
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


def _finish(child: Child, out_r: int, status_r: int) -> tuple[bytes, dict[str, object]]:
    select.select([child.pidfd], [], [], 10)
    # A door's job is the door's child (its spare): followed through its pidfd, not reaped here.
    assert child.poll() == (0 if child.ours else -1)
    output = os.read(out_r, 10000)
    status = json.loads(os.read(status_r, 1000))
    os.close(out_r)
    os.close(status_r)
    return output, status


def test_a_door_forks_its_instances_jobs_in_its_cgroups(
    forks: ForkServer, instance: Path, cgroup_procs: list[str]
) -> None:
    _in_cgroups(instance, cgroup_procs[0])
    wanted = _reference(cgroup_procs[0])
    assert wanted != _cgroup_of(os.getpid())
    door = _door(forks, instance)
    try:
        _wait_for(lambda: _cgroup_of(door.child.pid) == wanted)
        assert int(_stat(door.child.pid)[1]) == os.getpid(), "the door is the caller's child (reaped here)"
        words = Path(f"/proc/{door.child.pid}/cmdline").read_bytes().split(b"\0")
        assert words[:2] == [b"kibo-job-door", bytes(instance)]
        output, status = _finish(*_job(door, instance, ["cat", "/proc/self/cgroup"]))
        assert status == {"status": "ok", "code": 0, "error": "", "errno": ""}
        assert _cgroups_lines(output) == wanted, "born in the instance's cgroups"
        assert door.open
    finally:
        door.close()
    assert not Path(f"/proc/{door.child.pid}").exists(), "closed: ended and reaped, no zombie"


def test_a_door_refuses_another_instances_job_and_the_fork_server_runs_it(
    forks: ForkServer, instance: Path, cgroup_procs: list[str], tmp_path: Path
) -> None:
    _in_cgroups(instance, cgroup_procs[0])
    other = tmp_path / "ws-other-g1"
    other.mkdir()
    for name in ("spec.json", "state.json"):
        (other / name).write_bytes((instance / name).read_bytes())
    _in_cgroups(other, cgroup_procs[1])
    door = _door(forks, instance)
    try:
        output, status = _finish(*_job(door, other, ["cat", "/proc/self/cgroup"]))
        assert status["status"] == "ok"
        assert _cgroups_lines(output) == _reference(cgroup_procs[1]), "in its own instance's cgroups"
        assert not door.open, "a door that refused is not asked again"
    finally:
        door.close()


def test_a_door_whose_instance_changed_cgroups_refuses(
    forks: ForkServer, instance: Path, cgroup_procs: list[str]
) -> None:
    """A guest reset makes new cgroups: no job may run in the old ones."""
    _in_cgroups(instance, cgroup_procs[0])
    door = _door(forks, instance)
    try:
        _finish(*_job(door, instance, ["true"]))
        assert door.open
        _in_cgroups(instance, cgroup_procs[1])
        output, _ = _finish(*_job(door, instance, ["cat", "/proc/self/cgroup"]))
        assert _cgroups_lines(output) == _reference(cgroup_procs[1])
        assert not door.open
    finally:
        door.close()


def test_a_killed_door_costs_only_speed(forks: ForkServer, instance: Path, cgroup_procs: list[str]) -> None:
    """What the end of its guest does to a door (everything in its cgroups is killed)."""
    _in_cgroups(instance, cgroup_procs[0])
    door = _door(forks, instance)
    try:
        _wait_for(lambda: str(door.child.pid) in Path(cgroup_procs[0].split()[0]).read_text().split())
        os.kill(door.child.pid, signal.SIGKILL)
        _wait_for(lambda: _stat(door.child.pid)[0] == "Z")
        output, status = _finish(*_job(door, instance, ["cat", "/proc/self/cgroup"]))
        assert status["status"] == "ok"
        assert _cgroups_lines(output) == _reference(cgroup_procs[0])
        assert not door.open
    finally:
        door.close()
    assert not Path(f"/proc/{door.child.pid}").exists(), "reaped"


def test_a_door_for_an_instance_without_cgroups_exits(forks: ForkServer, instance: Path) -> None:
    door = _door(forks, instance)
    select.select([door.child.pidfd], [], [], 10)
    assert door.child.poll() == 1
    assert "no cgroup" in (instance / "door.log").read_text()
    door.close()


def _children_titled(parent: int, words: list[bytes]) -> list[int]:
    """The children of `parent` whose command line starts with `words` (a spare's title)."""
    title = b"\0".join(words) + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:  # a process may end between the listing and these reads: it is no child then
                if Path(f"/proc/{name}/cmdline").read_bytes().startswith(title) and int(_stat(int(name))[1]) == parent:
                    found.append(int(name))
            except OSError:
                continue
    return found


def _spares(door: Door, instance: Path) -> list[int]:
    """The door's spare(s): its children waiting for a job (their command line says so)."""
    return _children_titled(door.child.pid, [forkserver.SPARE.encode(), bytes(instance)])


def test_a_door_hands_each_job_to_a_spare_forked_ahead(
    forks: ForkServer, instance: Path, cgroup_procs: list[str]
) -> None:
    _in_cgroups(instance, cgroup_procs[0])
    wanted = _reference(cgroup_procs[0])
    door = _door(forks, instance)
    try:
        _wait_for(lambda: len(_spares(door, instance)) == 1)
        [spare] = _spares(door, instance)
        assert _cgroup_of(spare) == wanted, "born in the instance's cgroups"
        assert os.getsid(spare) == spare, "a session of its own already"
        fds = set(os.listdir(f"/proc/{spare}/fd"))
        assert fds == {"0", "1", "2", str(max(int(fd) for fd in fds))}, "its channel only: not the door's"
        child, out_r, status_r = _job(door, instance, ["cat", "/proc/self/cgroup"])
        assert child.pid == spare, "the job is the spare"
        assert not child.ours, "the door's child: followed through its pidfd"
        output, status = _finish(child, out_r, status_r)
        assert status["status"] == "ok" and _cgroups_lines(output) == wanted
        _wait_for(lambda: len(_spares(door, instance)) == 1)
        assert _spares(door, instance) != [spare], "a new spare for the next job"
        [after] = _spares(door, instance)
    finally:
        door.close()
    _wait_for(lambda: not Path(f"/proc/{after}").exists())  # a door's end is its spare's


def test_a_killed_spare_costs_only_speed(forks: ForkServer, instance: Path, cgroup_procs: list[str]) -> None:
    """What the guest's memory limit can do to a spare: the job gets a new one, runs once."""
    _in_cgroups(instance, cgroup_procs[0])
    door = _door(forks, instance)
    try:
        _wait_for(lambda: len(_spares(door, instance)) == 1)
        [spare] = _spares(door, instance)
        os.kill(spare, signal.SIGKILL)
        _wait_for(lambda: not Path(f"/proc/{spare}").exists())
        child, out_r, status_r = _job(door, instance, ["sh", "-c", "echo once"])
        assert child.pid != spare
        output, status = _finish(child, out_r, status_r)
        assert (output, status["status"]) == (b"once\n", "ok")
        assert door.open
    finally:
        door.close()


def _supervisor_spares(forks: ForkServer) -> list[int]:
    """The fork server's spare supervisor(s): its children waiting for a launch."""
    assert forks._process is not None
    return _children_titled(forks._process.pid, [forkserver.SUPERVISOR_SPARE.encode()])


def _busy_supervisor(forks: ForkServer, directory: Path) -> tuple[Child, Path]:
    """A supervisor started for an instance whose lock is held (by this test): it says so on
    its stderr and exits at once, having run nothing else. Returns it and its log."""
    log_path = directory / "supervisor.log"
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        child = forks.spawn("supervisor", [str(directory)], [null, log, log])
    finally:
        os.close(null)
        os.close(log)
    select.select([child.pidfd], [], [], 10)
    assert child.poll() is not None
    return child, log_path


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Path]:
    """An instance directory whose lock another supervisor (this test) holds."""
    import fcntl

    directory = tmp_path / "ws-busy-g1"
    directory.mkdir()
    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield directory
    os.close(fd)


def test_the_next_supervisor_is_a_spare_forked_ahead(forks: ForkServer, locked: Path) -> None:
    forks.start()
    _wait_for(lambda: len(_supervisor_spares(forks)) == 1)
    [spare] = _supervisor_spares(forks)
    assert os.getsid(spare) == spare, "a session of its own already"
    fds = set(os.listdir(f"/proc/{spare}/fd"))
    assert fds == {"0", "1", "2", str(max(int(fd) for fd in fds))}, "its channel only: not the server's"
    child, log = _busy_supervisor(forks, locked)
    assert child.pid == spare, "the supervisor is the spare"
    assert not child.ours, "the fork server's child, as every supervisor"
    assert "another supervisor runs this instance" in log.read_text(), "it ran supervisor.py's main"
    # The next one is forked a while after the launch, not beside it.
    _wait_for(lambda: len(_supervisor_spares(forks)) == 1)
    [after] = _supervisor_spares(forks)
    assert after != spare
    forks.close()
    _wait_for(lambda: not Path(f"/proc/{after}").exists())  # the server's end is its spare's


def test_a_killed_supervisor_spare_costs_only_speed(forks: ForkServer, locked: Path) -> None:
    forks.start()
    _wait_for(lambda: len(_supervisor_spares(forks)) == 1)
    [spare] = _supervisor_spares(forks)
    os.kill(spare, signal.SIGKILL)
    _wait_for(lambda: not Path(f"/proc/{spare}").exists())
    child, log = _busy_supervisor(forks, locked)
    assert child.pid != spare
    assert log.read_text().count("another supervisor runs this instance") == 1, "started once"
