"""The supervisor's client side: the line-JSON protocol on its abstract unix socket.

A mixin of `Supervisor` (supervisor.py, which holds the state these methods use and whose
main loop calls `accept` and `read` when the socket or a client is readable): the listening
socket (`listen`), clients of our own uid only (`accept`, `drop`), the messages to them
(`send`, `broadcast`, `set_state`: every state change goes to every client) and their one
request, a stop (`read`, `request_stop`). The messages are described in supervisor.py's
docstring. Why a file of its own: supervisor.py is the entry point, the main loop and the
exit; starting the guest is supervisor_guest.py.

Standard library only, like supervisor.py, which imports it by path (it runs as
`python -I -S`) at its top: the fork server (forkserver.py) has it loaded before it forks
supervisors, which then share its pages."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

    from kibo_ctrl.runtime.process import guest_start


class Clients:
    """Supervisor's methods that serve its clients (a mixin: see the module docstring)."""

    if TYPE_CHECKING:
        # What these methods use of the Supervisor (supervisor.py sets it up).
        spec: dict[str, Any]
        state: str
        why: str
        guest: subprocess.Popen[bytes] | guest_start.Started | None
        guest_pid: int
        clients: dict[int, socket.socket]
        buffers: dict[int, bytes]
        selector: selectors.BaseSelector
        stop_force: bool | None
        stop_deadline: float
        stop_waiters: list[socket.socket]

        def log(self, message: str) -> None: ...
        def save_state(self) -> None: ...
        def guest_alive(self) -> bool: ...
        def finish_stop(self) -> None: ...
        def force_kill(self) -> None: ...
        def signal_entry(self, signum: int) -> None: ...

    def listen(self) -> socket.socket:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind("\0" + self.spec["socket"])
        server.listen(16)
        server.setblocking(False)
        self.selector.register(server, selectors.EVENT_READ, "listen")
        return server

    def send(self, client: socket.socket, message: dict[str, Any]) -> None:
        try:
            client.setblocking(True)
            client.settimeout(1.0)
            client.sendall(json.dumps(message).encode() + b"\n")
            client.setblocking(False)
        except OSError:
            self.drop(client)

    def broadcast(self, message: dict[str, Any]) -> None:
        for client in list(self.clients.values()):
            self.send(client, message)

    def set_state(self, state: str, why: str = "", **extra: Any) -> None:
        self.state, self.why = state, why
        self.save_state()
        self.broadcast({"state": state, "why": why, "guest_pid": self.guest_pid, **extra})

    def accept(self, server: socket.socket) -> None:
        client, _ = server.accept()
        creds = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            client.close()
            return
        client.setblocking(False)
        self.clients[client.fileno()] = client
        self.buffers[client.fileno()] = b""
        self.selector.register(client, selectors.EVENT_READ, "client")
        self.send(client, {"state": self.state, "why": self.why, "guest_pid": self.guest_pid})

    def drop(self, client: socket.socket) -> None:
        fd = client.fileno()
        if fd in self.clients:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(client)
            del self.clients[fd]
            del self.buffers[fd]
        if client in self.stop_waiters:
            self.stop_waiters.remove(client)
        client.close()

    def read(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.drop(client)
            return
        fd = client.fileno()
        self.buffers[fd] += data
        while b"\n" in self.buffers.get(fd, b""):
            line, self.buffers[fd] = self.buffers[fd].split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if request.get("op") == "stop":
                self.request_stop(client, bool(request.get("force")))

    def request_stop(self, client: socket.socket, force: bool) -> None:
        self.stop_waiters.append(client)
        if self.stop_force is None or (force and not self.stop_force):
            self.stop_force = force
            self.set_state("stopping", "force" if force else "graceful")
            if not self.guest_alive():
                self.finish_stop()
            elif force:
                self.force_kill()
            else:
                self.stop_deadline = time.monotonic() + float(self.spec["grace_s"])
                target = self.guest_pid or (self.guest.pid if self.guest else 0)
                self.log(f"graceful stop: SIGTERM to the guest ({target})")
                self.signal_entry(signal.SIGTERM)
