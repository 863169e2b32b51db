"""What the node supervisor holds of one instance (`Held`), got in one of two ways.

- `handed_over`: from a supervisor's hand-over (supervisor_handover.py): the descriptors it
  sent, in its order, and its message.
- `readopt`: after the node supervisor's own restart, from what the machine still has. The
  guests did not die with the old node supervisor (nothing ties them to it), but its
  descriptors did; so they are found again from state.json and /proc: the instance's lock
  is taken again (free: its holder died), its socket name bound again, bwrap followed by a
  pidfd (if it is still the process started then), and bwrap's own ends of the status and
  output pipes re-opened for reading through /proc/PID/fd (a pipe lives as long as a
  writer holds it; its unread bytes, the exit code to come included, are still there).
  What cannot be had again: the synced trees' directories (they were in the dead
  supervisor's mount namespace), so a graceful stop of a re-adopted guest reports
  `synced: false` and the runtime syncs the images once they are unmounted, as for a VMM
  that is gone (runtime.py `stop`); and the console output written while no one read it
  (its writers got EPIPE).

Standard library only (node_supervisor.py imports it by path)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process.supervisor_os import pidfd_if
else:  # imported by path, as node_supervisor.py (a script) imports it: its siblings
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from supervisor_os import pidfd_if


@dataclass
class Held:
    lock_fd: int
    server: socket.socket
    pidfd: int  # bwrap's
    sandbox_pid: int
    sandbox_start: int
    status_fd: int  # bwrap's --json-status-fd, read end; -1: none
    status_number: int  # its write end's number in bwrap
    output_fd: int  # the guest's output, read end; -1: none
    guest_pid: int
    guest_start: int
    oom_base: int
    state: str
    why: str
    output_logged: int = 0
    clients: list[tuple[socket.socket, bytes]] = field(default_factory=list)  # with what they half-sent
    sync_dirs: list[int] = field(default_factory=list)


def handed_over(message: dict[str, Any], fds: list[int]) -> Held:
    """See supervisor_handover.py for the message and the order of the descriptors. Raises
    (ValueError, OSError: a descriptor that is no socket where one is due) owning none of
    `fds`: the caller closes them."""
    output, pending = bool(message["output"]), [base64.b64decode(b) for b in message["clients"]]
    if len(fds) != 4 + output + len(pending) + int(message["sync_dirs"]):
        raise ValueError("the descriptors do not match the message")
    taken = iter(fds)
    lock_fd, server_fd, pidfd, status_fd = next(taken), next(taken), next(taken), next(taken)
    output_fd = next(taken) if output else -1
    made: list[socket.socket] = []
    try:
        for fd in [server_fd] + [next(taken) for _ in pending]:
            made.append(socket.socket(fileno=fd))
    except BaseException:
        for wrapped in made:
            wrapped.detach()  # not closed by the socket object: the caller closes every fd
        raise
    server, clients = made[0], list(zip(made[1:], pending, strict=True))
    return Held(
        lock_fd=lock_fd,
        server=server,
        pidfd=pidfd,
        sandbox_pid=int(message["sandbox_pid"]),
        sandbox_start=int(message.get("sandbox_start") or 0),
        status_fd=status_fd,
        status_number=int(message.get("status_number", -1)),
        output_fd=output_fd,
        guest_pid=int(message["guest_pid"]),
        guest_start=int(message["guest_start"] or 0),
        oom_base=int(message["oom_base"]),
        state=str(message["state"]),
        why=str(message["why"]),
        output_logged=int(message["output_logged"]),
        clients=clients,
        sync_dirs=[next(taken) for _ in range(int(message["sync_dirs"]))],
    )


class Gone(Exception):
    """The instance's guest ended while no one held it."""


def readopt(directory: Path, state: dict[str, Any], socket_name: str) -> Held | None:
    """The instance again (see the module docstring); None if another process holds it;
    Gone if its guest is not running any more (its lock is then held by no one)."""
    lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        return None
    opened: list[int] = [lock_fd]
    try:
        pid, started = int(state.get("sandbox_pid") or 0), int(state.get("sandbox_start") or 0)
        # Without its start time a PID could be anyone's: not re-adopted.
        pidfd = pidfd_if(pid, started) if pid > 0 and started else -1
        if pidfd < 0:
            raise Gone("the guest is not running")
        opened.append(pidfd)
        number = int(state.get("status_fd", -1))
        status_fd = _reader_of(pid, number) if number >= 0 else -1
        if status_fd >= 0:
            opened.append(status_fd)
        output_fd = _reader_of(pid, 1)
        if output_fd >= 0:
            opened.append(output_fd)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind("\0" + socket_name)
            server.listen(16)
        except OSError:
            server.close()
            raise
        recorded = str(state.get("state") or "ready")
        return Held(
            lock_fd=lock_fd,
            server=server,
            pidfd=pidfd,
            sandbox_pid=pid,
            sandbox_start=started,
            status_fd=status_fd,
            status_number=number,
            output_fd=output_fd,
            guest_pid=int(state.get("guest_pid") or 0),
            guest_start=int(state.get("guest_start") or 0),
            oom_base=int(state.get("oom_base") or 0),
            # A stop in progress was the old node supervisor's: whoever asked asks again.
            state="ready" if recorded == "stopping" else recorded,
            why="" if recorded == "stopping" else str(state.get("why") or ""),
        )
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise


def _reader_of(pid: int, number: int) -> int:
    """A read end of the pipe that is fd `number` of process `pid`; -1 if it is no pipe."""
    try:
        fd = os.open(f"/proc/{pid}/fd/{number}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    return fd


def release(held: Held) -> None:
    """Close what `held` holds (a hand-over or re-adoption that went no further)."""
    held.server.close()
    for client, _ in held.clients:
        client.close()
    for fd in (held.lock_fd, held.pidfd, held.status_fd, held.output_fd, *held.sync_dirs):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def read_state(directory: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((directory / "state.json").read_text())
        if isinstance(data, dict):
            return data
    return {}
