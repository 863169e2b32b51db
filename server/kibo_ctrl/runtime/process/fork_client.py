"""The control plane's side of the fork server (forkserver.py): `ForkServer` starts the
server and asks it for children, `Door` is the handle on a guest's job door, and `Child` is a
process either of them forked, followed through its pidfd.

Why apart from forkserver.py: that file is the server's own program, run as a script in a
process that imports only the standard library and the two scripts it forks (every child
shares its pages); this one runs in the control plane, with its threads, asyncio and logging.
The wire format (one SOCK_SEQPACKET message each way, fds as SCM_RIGHTS) is forkserver.py's,
and its helpers are used from there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from . import forkserver
from .forkserver import DOOR, MESSAGE, TITLE_ROOM, fds_of, rights

__all__ = ["Child", "Door", "ForkServer"]

log = logging.getLogger(__name__)


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


class Child:
    """A process the fork server started: followed through its pidfd (not our child: its
    exit status is the kernel's, so `returncode` is -1 once it has exited)."""

    def __init__(self, pid: int, pidfd: int, ours: bool) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.ours = ours  # our child (a guest job: fork_sibling): reaped here
        self.returncode: int | None = None
        self.started = _start_time(pid)

    def group_is_its(self) -> bool:
        """Whether process group `pid` can only be this child's (it leads a new session):
        ours and not reaped yet, or the PID runs this child still, or no process has it (then
        only the group's other members hold the ID, which the kernel does not hand out again
        while they live)."""
        if self.ours and self.returncode is None:
            return True
        now = _start_time(self.pid)
        return now is None or now == self.started

    def poll(self) -> int | None:
        if self.returncode is None and self.pidfd >= 0:
            readable, _, _ = select.select([self.pidfd], [], [], 0)
            if readable:
                self._exited()
        return self.returncode

    def _exited(self) -> None:
        self.returncode = -1
        if self.ours:
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(self.pid, 0)  # it has exited: at once
                self.returncode = os.waitstatus_to_exitcode(status)
        os.close(self.pidfd)
        self.pidfd = -1

    async def wait(self) -> int:
        if self.poll() is None:
            loop = asyncio.get_running_loop()
            done = loop.create_future()

            def exited() -> None:
                if not done.done():
                    done.set_result(None)

            loop.add_reader(self.pidfd, exited)
            try:
                await done
            finally:
                loop.remove_reader(self.pidfd)
            self._exited()
        assert self.returncode is not None
        return self.returncode

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class _Gone(OSError):
    """The server at the other end of the channel has exited."""


def _ask(sock: socket.socket, request: bytes, fds: list[int], who: str) -> Child:
    """One request to a fork server or a door: the child it forked, or OSError (_Gone if the
    server is gone; then nothing was forked)."""
    try:
        sock.sendmsg([request], [rights(fds)])
        message, ancillary, _, _ = sock.recvmsg(MESSAGE, socket.CMSG_SPACE(4))
    except OSError as error:
        raise _Gone(f"{who} is gone: {error}") from None
    received = fds_of(ancillary)
    if not message:
        for fd in received:
            os.close(fd)
        raise _Gone(f"{who} exited")
    reply = json.loads(message)
    if "pid" not in reply or len(received) != 1:
        for fd in received:
            os.close(fd)
        raise OSError(f"{who} refused: {reply.get('error', reply)}")
    return Child(int(reply["pid"]), received[0], bool(reply.get("sibling")))


class Door:
    """The control plane's handle on a guest's job door (see the module docstring): `spawn`
    forks a guest job of its instance there, or, once the door is closed or broken, from
    the fork server (the job then moves itself into the cgroups, as without a door)."""

    def __init__(self, directory: str, sock: socket.socket, child: Child, fallback: ForkServer) -> None:
        self.directory = directory
        self.child = child
        self.fallback = fallback
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        return self._sock is not None

    def spawn(self, program: str, argv: list[str], fds: list[int], userns: tuple[int, int, int] | None = None) -> Child:
        request = json.dumps({"program": program, "argv": argv}).encode()
        with self._lock:
            if self._sock is not None:
                try:
                    return _ask(self._sock, request, fds, "the job door")
                except OSError as error:
                    self._shut()
                    if not isinstance(error, _Gone):
                        log.warning("%s: its job door refused (%s)", self.directory, error)
        return self.fallback.spawn(program, argv, fds, userns)

    def _shut(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Close the door: it is ended and reaped here (jobs it forked run on)."""
        with self._lock:
            self._shut()
        if self.child.pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.child.pidfd, signal.SIGKILL)
            if self.child.ours:
                self.child._exited()  # killed: reaped at once
            else:
                self.child.close()


class ForkServer:
    """The control plane's handle: starts the server on first use (again if it died) and
    asks it for children; `spawn` raises OSError when no server can be had (then the
    caller execs the script as before)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server now (else at the first spawn); OSError is left to that spawn."""
        with self._lock, contextlib.suppress(OSError):
            if self._sock is None or not self._alive():
                self._restart()

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", forkserver.__file__, str(theirs.fileno()), " " * TITLE_ROOM],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,
                pass_fds=(theirs.fileno(),),
                cwd="/",
                start_new_session=True,  # a Ctrl-C at the control plane's terminal is not for it
            )
        finally:
            theirs.close()
        self._sock = ours
        return ours

    def spawn(self, program: str, argv: list[str], fds: list[int], userns: tuple[int, int, int] | None = None) -> Child:
        """Fork `program` (supervisor or guest_exec) with `argv` and fds (0, 1, 2, 3, ...);
        a supervisor may be handed a pre-made user namespace of mapping `userns`."""
        request = json.dumps({"program": program, "argv": argv, "userns": userns}).encode()
        with self._lock:
            for attempt in (1, 2):
                sock = self._sock if self._sock is not None and self._alive() else self._restart()
                try:
                    return _ask(sock, request, fds, "the fork server")
                except _Gone:
                    self._drop()
                    if attempt == 2:
                        raise
        raise OSError("unreachable")

    def door(self, directory: Path, log: int) -> Door:
        """Open the job door of the instance in `directory` (its cgroups are made): jobs it
        forks are born in them. `log` gets what it writes. OSError if it cannot be had."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            child = self.spawn(DOOR, [str(directory)], [null, log, log, theirs.fileno()])
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(null)
        return Door(str(directory), ours, child, self)

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _restart(self) -> socket.socket:
        self._drop()
        return self._start()

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(5)
            self._process = None

    def close(self) -> None:
        """Stop the server (closing its channel ends it); the children run on."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._process is not None:
                try:
                    self._process.wait(5)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(5)
                self._process = None
