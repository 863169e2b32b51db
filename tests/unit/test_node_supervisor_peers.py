"""The node supervisor's socket against hostile peers (node_supervisor.py).

Who may connect is the node supervisor's own uid; what such a peer sends must not crash it,
leak what it was sent, or make it hold an instance: only a supervisor of its own data
directory hands one over, and only once it said "go" and exited. Replays each attack on a
real node supervisor (the script, on a temporary data directory).

The forged hand-overs are well-formed in every way but their sender: the descriptors a real
supervisor sends (the instance's flocked lock, its listening socket, a pidfd of a running
"sandbox", a status pipe), in its order, with its message. The same hand-over from a
supervisor of this data directory is held and served (`test_a_well_formed_handover_is_held_
and_served`), so each refusal is the sender check's, not a malformed message's."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kibo_ctrl.runtime.process as process_package
import pytest

SCRIPT = Path(process_package.__file__).with_name("node_supervisor.py")
NOBODY = 65534


@dataclass
class Node:
    name: str  # its abstract socket
    process: subprocess.Popen[bytes]
    data_dir: Path


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    data_dir = tmp_path / "data"
    (data_dir / "runtime").mkdir(parents=True)
    (data_dir / "instances").mkdir()
    name = f"kibo-test-node-supervisor/{os.getpid()}-{time.monotonic_ns()}"
    log = open(tmp_path / "node.log", "wb")  # noqa: SIM115 - the child's, closed below
    process = subprocess.Popen([sys.executable, "-I", "-S", str(SCRIPT), str(data_dir), name], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                connect(name).close()
                break
            except ConnectionRefusedError:
                time.sleep(0.01)
        yield Node(name, process, data_dir.resolve())
    finally:
        process.kill()
        process.wait()
        log.close()


@pytest.fixture
def sandbox() -> Iterator[subprocess.Popen[bytes]]:
    """A running process that stands for an instance's bwrap (a hand-over sends its pidfd)."""
    process = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def connect(name: str) -> socket.socket:
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel.settimeout(5)
    try:
        channel.connect("\0" + name)
    except OSError:
        channel.close()
        raise
    return channel


def descriptors(process: subprocess.Popen[bytes]) -> list[str]:
    """What a process holds open (the targets of its /proc/PID/fd links)."""
    held = []
    for number in os.listdir(f"/proc/{process.pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            held.append(os.readlink(f"/proc/{process.pid}/fd/{number}"))
    return held


def test_garbage_and_unexpected_messages_are_refused(node: Node) -> None:
    for message in (b"\xff\xfe not json", b"[1, 2]", b'{"go": true}', b'{"what": 1}', b"{}"):
        with connect(node.name) as channel:
            channel.send(message)
            answer = json.loads(channel.recv(65536))
            assert "error" in answer, message
            assert channel.recv(65536) == b""  # and the connection is closed
    assert node.process.poll() is None


# A supervisor's hand-over, as supervisor_handover.py makes it, by a script whose file name
# and arguments are the test's choice: `SCRIPT INSTANCE_DIR NODE_NAME SANDBOX_PID MODE [UID]`.
# It takes the instance's lock, binds its socket, opens a pidfd of the sandbox and a status
# pipe, (as UID, if given) sends them, and prints the answer ("closed" if none). Taken, with
# MODE "go": it says go and exits; "go-wait": says go and exits once its stdin is closed.
HANDOVER = r"""
import fcntl, json, os, socket, sys
instance, name, sandbox, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
spec = json.load(open(os.path.join(instance, "spec.json")))
lock = os.open(os.path.join(instance, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind("\0" + spec["socket"])
server.listen(16)
pidfd = os.pidfd_open(sandbox)
status_read, status_write = os.pipe()
stat = open(f"/proc/{sandbox}/stat").read()
started = int(stat[stat.rindex(")") + 2:].split()[19])
message = {"sandbox_pid": sandbox, "sandbox_start": started, "status_number": status_write,
           "guest_pid": sandbox, "guest_start": started, "oom_base": 0, "state": "ready", "why": "",
           "output": False, "output_logged": 0, "clients": [], "sync_dirs": 0}
if len(sys.argv) > 5:
    os.setgroups([])
    os.setgid(int(sys.argv[5]))
    os.setuid(int(sys.argv[5]))
channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
channel.settimeout(5)
channel.connect("\0" + name)
try:
    socket.send_fds(channel, [json.dumps({"handover": message}).encode()], [lock, server.fileno(), pidfd, status_read])
    answer = channel.recv(65536).decode()
except OSError:
    answer = ""
print(answer or "closed", flush=True)
if answer and json.loads(answer).get("ok") and mode.startswith("go"):
    channel.send(b'{"go": true}')
    if mode == "go-wait":
        sys.stdin.read()
"""


def instance(data_dir: Path, name: str = "w-1") -> tuple[Path, str]:
    """An instance directory of `data_dir` with the spec its supervisor would have; (it, its socket)."""
    directory = data_dir / "instances" / name
    directory.mkdir(parents=True)
    socket_name = f"kibo-test-instance/{os.getpid()}-{time.monotonic_ns()}"
    spec = {
        "socket": socket_name,
        "sync_paths": [],
        "force_sync_s": 1,
        "grace_s": 1,
        "cgroup_procs": [],
        "oom_file": "",
        "reboot_code": 201,
        "poweroff_code": 202,
        "personality": "process",
    }
    (directory / "spec.json").write_text(json.dumps(spec))
    return directory, socket_name


@contextlib.contextmanager
def hand_over(
    tmp_path: Path,
    script_name: str,
    directory: Path,
    node: Node,
    sandbox: subprocess.Popen[bytes],
    mode: str,
    *uid: int,
) -> Iterator[subprocess.Popen[str]]:
    """Run the hand-over script as `script_name` (a supervisor is a `supervisor.py`)."""
    script = tmp_path / "bin" / script_name
    script.parent.mkdir(exist_ok=True)
    script.write_text(HANDOVER)
    command = [sys.executable, str(script), str(directory), node.name, str(sandbox.pid), mode, *map(str, uid)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as sender:
        try:
            yield sender
        finally:
            sender.kill()


def answer_of(sender: subprocess.Popen[str]) -> str:
    assert sender.stdout is not None
    return sender.stdout.readline().strip()


def greeting(socket_name: str, within: float) -> dict[str, object] | None:
    """The first line whoever serves the instance's socket says to a new client; None if no
    one answers within `within` seconds (a connection waits in the backlog of a socket no one serves)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(within)
        client.connect("\0" + socket_name)
        try:
            line = client.recv(65536)
        except TimeoutError:
            return None
        return dict(json.loads(line.split(b"\n")[0])) if line else None


def assert_refused(node: Node, sender: subprocess.Popen[str], directory: Path, why: str) -> None:
    """Refused (the answer says `why`; "closed": no answer), nothing of it held or written."""
    answer = answer_of(sender)
    assert sender.wait(10) == 0
    if why == "closed":
        assert answer == "closed", answer
    else:
        refused = json.loads(answer)
        assert "error" in refused and why in refused["error"], answer
    time.sleep(0.1)
    assert str(directory / "lock") not in descriptors(node.process)  # what it was sent is closed
    assert not (directory / "state.json").exists()  # the node supervisor never held it
    assert node.process.poll() is None


def test_a_well_formed_handover_is_held_and_served(
    node: Node, sandbox: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """The control: a supervisor of this data directory hands over, says go and exits; the
    node supervisor then holds the instance (its state.json, its lock), answers its socket,
    and follows its sandbox: killed, the instance exits as a supervisor's would."""
    directory, socket_name = instance(node.data_dir)
    with hand_over(tmp_path, "supervisor.py", directory, node, sandbox, "go") as sender:
        assert json.loads(answer_of(sender)) == {"ok": True}
        assert sender.wait(10) == 0
    deadline = time.monotonic() + 5
    while not (directory / "state.json").exists():
        assert time.monotonic() < deadline, "the node supervisor did not take the instance"
        time.sleep(0.02)
    state = json.loads((directory / "state.json").read_text())
    assert state["parked"] is True and state["supervisor_pid"] == node.process.pid, state
    assert str(directory / "lock") in descriptors(node.process)
    assert greeting(socket_name, 5) == {"state": "ready", "why": "", "guest_pid": sandbox.pid}
    sandbox.kill()
    sandbox.wait()
    deadline = time.monotonic() + 5
    while not (directory / "exit.json").exists():
        assert time.monotonic() < deadline, "the sandbox's end was not seen"
        time.sleep(0.02)
    assert json.loads((directory / "exit.json").read_text())["reason"] == "exit"
    assert node.process.poll() is None


def test_a_handover_from_a_supervisor_of_another_data_directory_is_refused(
    node: Node, sandbox: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """A supervisor, by its command line, but of an instance of another data directory (another
    kibo on this host, same uid): the node supervisor holds only its own data directory's."""
    directory, _ = instance(tmp_path / "other-data")
    with hand_over(tmp_path, "supervisor.py", directory, node, sandbox, "go") as sender:
        assert_refused(node, sender, directory, "is not an instance of")


def test_a_handover_from_a_process_that_is_no_supervisor_is_refused(
    node: Node, sandbox: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """The same hand-over, for an instance of this data directory, from a program that is no
    supervisor.py (its command line names the instance all the same): refused."""
    directory, _ = instance(node.data_dir)
    with hand_over(tmp_path, "forger.py", directory, node, sandbox, "go") as sender:
        assert_refused(node, sender, directory, "")


def test_a_handover_from_another_uid_is_refused(node: Node, sandbox: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """A supervisor of this data directory in every other way, but of another uid: its
    connection is closed unanswered; nothing it sent is held."""
    assert os.geteuid() == 0, "this test sends from another uid: run it as root"
    directory, _ = instance(node.data_dir)
    with hand_over(tmp_path, "supervisor.py", directory, node, sandbox, "go", NOBODY) as sender:
        assert_refused(node, sender, directory, "closed")


def test_a_handover_is_served_only_once_its_supervisor_has_exited(
    node: Node, sandbox: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """A supervisor that said go but has not exited still serves the instance as far as anyone
    knows: the node supervisor neither answers its socket nor records it as held until it is gone."""
    directory, socket_name = instance(node.data_dir)
    with hand_over(tmp_path, "supervisor.py", directory, node, sandbox, "go-wait") as sender:
        assert sender.stdin is not None
        assert json.loads(answer_of(sender)) == {"ok": True}
        assert greeting(socket_name, 1.0) is None  # not served while the supervisor lives
        assert not (directory / "state.json").exists()
        sender.stdin.close()  # now it exits
        assert sender.wait(10) == 0
    assert greeting(socket_name, 5) == {"state": "ready", "why": "", "guest_pid": sandbox.pid}
    assert json.loads((directory / "state.json").read_text())["supervisor_pid"] == node.process.pid


def test_too_many_descriptors_are_refused_and_closed(node: Node) -> None:
    before = len(os.listdir(f"/proc/{node.process.pid}/fd"))
    pipes = [os.pipe() for _ in range(40)]
    try:
        with connect(node.name) as channel:
            fds = [fd for pair in pipes for fd in pair][:80]
            socket.send_fds(channel, [b'{"handover": {}}'], fds)
            answer = json.loads(channel.recv(65536))
            assert "error" in answer  # truncated: over MAX_FDS
    finally:
        for read, write in pipes:
            os.close(read)
            os.close(write)
    time.sleep(0.1)
    assert len(os.listdir(f"/proc/{node.process.pid}/fd")) <= before
    assert node.process.poll() is None


def test_a_runtime_connection_is_held_and_dropped(node: Node) -> None:
    with connect(node.name) as channel:
        channel.send(b'{"runtime": true}')
        channel.settimeout(0.3)
        with pytest.raises(TimeoutError):
            channel.recv(65536)  # no answer: it is held
    assert node.process.poll() is None


FAKE_SUPERVISOR = """
import json, os, socket, sys
name = sys.argv[2]
channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
channel.connect("\\0" + name)
read, write = os.pipe()
message = {"handover": {"sandbox_pid": 1, "sandbox_start": 1, "status_number": 3, "guest_pid": 1,
           "guest_start": 0, "oom_base": 0, "state": "ready", "why": "", "output": False,
           "output_logged": 0, "clients": [""], "sync_dirs": 0}}
listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
# Five descriptors as the message says, but a pipe where its client's socket is due.
socket.send_fds(channel, [json.dumps(message).encode()], [read, listening.fileno(), read, write, read])
print(channel.recv(65536).decode())
"""


def test_a_supervisor_handing_over_what_is_no_socket_is_refused(node: Node, tmp_path: Path) -> None:
    """A process that passes for a supervisor of this data directory (its command line) but
    sends a pipe where a client's socket is due: refused, and nothing of it is kept."""
    script = tmp_path / "supervisor.py"
    script.write_text(FAKE_SUPERVISOR)
    directory = node.data_dir / "instances" / "w-1"
    directory.mkdir()
    (directory / "spec.json").write_text("{}")
    before = len(os.listdir(f"/proc/{node.process.pid}/fd"))
    done = subprocess.run(
        [sys.executable, str(script), str(directory), node.name], capture_output=True, timeout=10, check=True
    )
    assert "error" in json.loads(done.stdout)
    time.sleep(0.1)
    assert len(os.listdir(f"/proc/{node.process.pid}/fd")) <= before
    assert node.process.poll() is None
