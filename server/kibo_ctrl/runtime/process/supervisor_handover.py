"""A supervisor's hand-over of its ready guest to the node supervisor (`--supervisor node`).

Why: an idle workspace's supervisor is a Python process of its own, ~2.9 MiB of private
memory beside a guest of ~0.5 MiB (bench/process_runtime.py), and no per-workspace Python
process gets under ~1.4 MiB (issue 14's note). With `--supervisor node`, a supervisor
launches its guest as before (mounts, bwrap, readiness) and, once the guest is ready, hands
it to the node supervisor (node_supervisor.py: one process per data directory, started by
the runtime), then exits. What it hands over is everything that makes it the instance's
VMM, as descriptors (SCM_RIGHTS), so nothing is re-opened or re-checked by path:

- the instance's flocked lock file (the lock stays held: `lock_held` still means "a VMM holds
  this instance"), the protocol's listening socket and its connected clients (the control
  plane's handle keeps its connection and sees no change), with any request half-read;
- a pidfd of bwrap (its exit, and signals that cannot hit a reused PID), the read end of
  bwrap's --json-status-fd (its exit code: the node supervisor is not bwrap's parent and
  cannot wait for it), the guest's output pipe;
- a directory of each synced tree (the layer and the volumes) opened in this process's mount
  namespace, where the images are mounted: the node supervisor syncs those (`syncfs` of
  /proc/self/fd/N), since the namespace goes with this process.

The guest was started without a death signal tied to this process (guest_start.py), so it
lives on. The images' filesystems stay mounted in the guest's own mount namespace and
through those directories.

Protocol (SOCK_SEQPACKET on the node supervisor's abstract name, which must be served by our
own uid: anyone else who took the name gets nothing): {"handover": {...}} with the
descriptors, answered {"ok": true} (or {"error": ...}: we keep the instance); then {"go":
true}, after which this process exits at once. The node supervisor serves the instance only
once it has "go" and this process is gone, so the two never serve it at once; without "go"
(we gave up waiting, or died) it drops what it was sent.

Standard library only, like supervisor.py, which imports it by path."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import socket
import struct
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

    from kibo_ctrl.runtime.process import guest_start

# The most descriptors one hand-over carries, and the most clients it takes along.
MAX_FDS = 64
MAX_CLIENTS = 16
MESSAGE = 1 << 20
# How long the node supervisor has to answer before we keep the instance.
ANSWER_S = 2.0


class HandOver:
    """Supervisor's hand-over (a mixin: see the module docstring)."""

    if TYPE_CHECKING:
        # What these methods use of the Supervisor (supervisor.py sets it up).
        spec: dict[str, Any]
        state: str
        why: str
        guest: subprocess.Popen[bytes] | guest_start.Started | None
        guest_pid: int
        pidfd: int
        status_fd: int
        status_number: int
        sandbox_start: int
        output_fd: int
        output_logged: int
        lock_fd: int
        server: socket.socket | None
        clients: dict[int, socket.socket]
        buffers: dict[int, bytes]
        oom_base: int
        stop_force: bool | None
        parked: bool
        selector: selectors.BaseSelector

        def log(self, message: str) -> None: ...
        def guest_alive(self) -> bool: ...

    handover_tried = False

    def can_hand_over(self) -> bool:
        """Whether to try now: asked for, not tried yet, nothing in progress."""
        return (
            bool(self.spec.get("node_supervisor"))
            and not self.handover_tried
            and not self.parked
            and self.status_fd >= 0
            and self.pidfd >= 0
            and self.lock_fd >= 0
            and self.server is not None
            and self.guest_alive()
            and self.stop_force is None
            and len(self.clients) <= MAX_CLIENTS
        )

    def hand_over(self) -> None:
        """Hand the instance to the node supervisor and exit; returns (keeping it) if that
        cannot be done. Tried once per supervisor."""
        self.handover_tried = True
        opened: list[int] = []
        try:
            for path in self.spec["sync_paths"]:
                opened.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as channel:
                channel.settimeout(ANSWER_S)
                channel.connect("\0" + str(self.spec["node_supervisor"]))
                creds = channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                peer, uid, _ = struct.unpack("3i", creds)
                if uid != os.getuid():
                    raise OSError(f"the node supervisor's name is held by uid {uid}")
                message, fds = self._handover_message(opened)
                socket.send_fds(channel, [json.dumps({"handover": message}).encode()], fds)
                answer = json.loads(channel.recv(MESSAGE) or b"{}")
                if not answer.get("ok"):
                    raise OSError(f"refused: {answer.get('error') or 'no answer'}")
                if not self.guest_alive() or self.stop_force is not None:
                    raise OSError("the instance changed meanwhile")  # it has not read "go": it drops it
                channel.send(b'{"go": true}')
        except (OSError, ValueError) as error:
            self.log(f"kept: not handed to the node supervisor ({error})")
            for fd in opened:
                os.close(fd)
            return
        self.log(f"the guest is handed to the node supervisor (PID {peer}): exiting")
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os._exit(0)

    def _handover_message(self, sync_dirs: list[int]) -> tuple[dict[str, Any], list[int]]:
        assert self.guest is not None and self.server is not None
        clients = list(self.clients.values())
        fds = [self.lock_fd, self.server.fileno(), self.pidfd, self.status_fd]
        if self.output_fd >= 0:
            fds.append(self.output_fd)
        fds += [c.fileno() for c in clients] + sync_dirs
        message = {
            "sandbox_pid": self.guest.pid,
            "sandbox_start": self.sandbox_start,
            "status_number": self.status_number,
            "guest_pid": self.guest_pid,
            "guest_start": getattr(self, "guest_start", 0),
            "oom_base": self.oom_base,
            "state": self.state,
            "why": self.why,
            "output": self.output_fd >= 0,
            "output_logged": self.output_logged,
            # What each client sent that is not a whole line yet.
            "clients": [base64.b64encode(self.buffers.get(c.fileno(), b"")).decode() for c in clients],
            "sync_dirs": len(sync_dirs),
        }
        return message, fds
