"""The runtime's side of the node supervisor (`--supervisor node`: node_supervisor.py).

The runtime starts the node supervisor of its data directory (or finds the one a previous
control plane started: it outlives a kill -9, holding its guests) and stays connected to it,
which keeps it from exiting while the runtime runs; a new supervisor is told its name in its
spec, and hands its guest over once ready (supervisor_handover.py). If the node supervisor
dies, its connection ends and a thread here starts another at once, which re-adopts the
guests it held (node_holdings.py) while their handles wait for it (supervisor_handle.py,
READOPT_S). If it cannot be had, specs name none and each instance keeps its own
supervisor, as with `--supervisor instance`."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["NodeSupervision"]

log = logging.getLogger(__name__)

SCRIPT = Path(__file__).with_name("node_supervisor.py")
# How long a node supervisor just started has to listen.
START_S = 5.0


class NodeSupervision:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:32]
        self.name = f"kibo-node-supervisor/{digest}"
        self._channel: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # launches write their specs in threads
        self._closing = False
        self._watcher: threading.Thread | None = None

    def name_for_launch(self) -> str:
        """The node supervisor's name for a new supervisor's spec ("" if there is none)."""
        with self._lock:
            if not self._connected():
                self._start()
            if self._channel is not None and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="node supervisor watch", daemon=True)
                self._watcher.start()
            return self.name if self._channel is not None else ""

    def _watch(self) -> None:
        """Start another node supervisor as soon as ours is gone (its guests wait for one)."""
        while not self._closing:
            channel = self._channel
            data = b""
            if channel is not None:
                with contextlib.suppress(OSError):
                    data = channel.recv(16)
            if self._closing:
                return
            if data:
                continue  # it never writes to us: nothing to do with it
            with self._lock:
                if self._channel is channel and channel is not None:
                    log.warning("the node supervisor exited: starting another (it re-adopts the guests)")
                    channel.close()
                    self._channel = None
            if channel is None:
                time.sleep(1.0)  # none could be started: try again later
            self.name_for_launch()

    def close(self) -> None:
        """At the runtime's shutdown: the node supervisor runs on while it holds guests."""
        self._closing = True
        with self._lock:
            if self._channel is not None:
                with contextlib.suppress(OSError):
                    self._channel.shutdown(socket.SHUT_RDWR)  # wakes the watcher
                self._channel.close()
                self._channel = None
            if self._process is not None:
                self._process.poll()  # reaped if it is gone already

    def _connected(self) -> bool:
        if self._channel is None:
            return False
        try:
            if self._channel.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return True  # it never writes to us, but that would not mean it is gone
        except BlockingIOError:
            return True
        except OSError:
            pass
        log.warning("the node supervisor is gone: starting another")
        self._channel.close()
        self._channel = None
        return False

    def _connect(self) -> socket.socket | None:
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            channel.connect("\0" + self.name)
            channel.send(b'{"runtime": true}')
        except OSError:
            channel.close()
            return None
        return channel

    def _start(self) -> None:
        self._channel = self._connect()  # one that outlived a previous control plane
        if self._channel is not None:
            return
        if self._process is not None:
            self._process.poll()
        (self.data_dir / "runtime").mkdir(parents=True, exist_ok=True)
        try:
            with open(self.data_dir / "runtime" / "node-supervisor.log", "ab") as output:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(SCRIPT), str(self.data_dir), self.name],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    start_new_session=True,
                )
        except OSError as error:
            log.warning("cannot start the node supervisor (%s): each instance keeps its own", error)
            return
        deadline = time.monotonic() + START_S
        while self._channel is None and time.monotonic() < deadline:
            if self._process.poll() not in (None, 75):  # 75: another one serves (we connect to it)
                break
            time.sleep(0.005)
            self._channel = self._connect()
        if self._channel is None:
            log.warning("the node supervisor did not start: each instance keeps its own supervisor")
            with contextlib.suppress(OSError):
                self._process.kill()
