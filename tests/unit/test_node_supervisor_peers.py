"""The node supervisor's socket against hostile peers (node_supervisor.py).

Who may connect is the node supervisor's own uid; what such a peer sends must not crash it,
leak what it was sent, or make it hold an instance: only a supervisor of its own data
directory hands one over, and only once it said "go" and exited. Replays each attack on a
real node supervisor (the script, on a temporary data directory)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import kibo_ctrl.runtime.process as process_package
import pytest

SCRIPT = Path(process_package.__file__).with_name("node_supervisor.py")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
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
        yield name, process
    finally:
        process.kill()
        process.wait()
        log.close()


def connect(name: str) -> socket.socket:
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel.settimeout(5)
    try:
        channel.connect("\0" + name)
    except OSError:
        channel.close()
        raise
    return channel


def test_garbage_and_unexpected_messages_are_refused(node: tuple[str, subprocess.Popen[bytes]]) -> None:
    name, process = node
    for message in (b"\xff\xfe not json", b"[1, 2]", b'{"go": true}', b'{"what": 1}', b"{}"):
        with connect(name) as channel:
            channel.send(message)
            answer = json.loads(channel.recv(65536))
            assert "error" in answer, message
            assert channel.recv(65536) == b""  # and the connection is closed
    assert process.poll() is None


def test_a_handover_from_a_process_that_is_no_supervisor_is_refused(
    node: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Descriptors sent by anything but a supervisor of its data directory are closed, not held."""
    name, process = node
    target = tmp_path / "victim"
    target.write_bytes(b"")
    fd = os.open(target, os.O_RDONLY)
    message = {
        "handover": {
            "sandbox_pid": 1,
            "guest_pid": 1,
            "guest_start": 0,
            "oom_base": 0,
            "state": "ready",
            "why": "",
            "output": False,
            "output_logged": 0,
            "clients": [],
            "sync_dirs": 0,
        }
    }
    try:
        with connect(name) as channel:
            socket.send_fds(channel, [json.dumps(message).encode()], [fd, fd, fd, fd])
            answer = json.loads(channel.recv(65536))
            assert "error" in answer
    finally:
        os.close(fd)
    held = [os.readlink(f"/proc/{process.pid}/fd/{n}") for n in os.listdir(f"/proc/{process.pid}/fd")]
    assert str(target) not in held  # what it was sent is closed
    assert process.poll() is None


def test_too_many_descriptors_are_refused_and_closed(node: tuple[str, subprocess.Popen[bytes]]) -> None:
    name, process = node
    before = len(os.listdir(f"/proc/{process.pid}/fd"))
    pipes = [os.pipe() for _ in range(40)]
    try:
        with connect(name) as channel:
            fds = [fd for pair in pipes for fd in pair][:80]
            socket.send_fds(channel, [b'{"handover": {}}'], fds)
            answer = json.loads(channel.recv(65536))
            assert "error" in answer  # truncated: over MAX_FDS
    finally:
        for read, write in pipes:
            os.close(read)
            os.close(write)
    time.sleep(0.1)
    assert len(os.listdir(f"/proc/{process.pid}/fd")) <= before
    assert process.poll() is None


def test_a_runtime_connection_is_held_and_dropped(node: tuple[str, subprocess.Popen[bytes]]) -> None:
    name, process = node
    with connect(name) as channel:
        channel.send(b'{"runtime": true}')
        channel.settimeout(0.3)
        with pytest.raises(TimeoutError):
            channel.recv(65536)  # no answer: it is held
    assert process.poll() is None


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


def test_a_supervisor_handing_over_what_is_no_socket_is_refused(
    node: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A process that passes for a supervisor of this data directory (its command line) but
    sends a pipe where a client's socket is due: refused, and nothing of it is kept."""
    name, process = node
    script = tmp_path / "supervisor.py"
    script.write_text(FAKE_SUPERVISOR)
    instance = Path(process.args[4]) / "instances" / "w-1"  # type: ignore[index]
    instance.mkdir()
    (instance / "spec.json").write_text("{}")
    before = len(os.listdir(f"/proc/{process.pid}/fd"))
    done = subprocess.run(
        [sys.executable, str(script), str(instance), name], capture_output=True, timeout=10, check=True
    )
    assert "error" in json.loads(done.stdout)
    time.sleep(0.1)
    assert len(os.listdir(f"/proc/{process.pid}/fd")) <= before
    assert process.poll() is None
