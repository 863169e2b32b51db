"""TCP connections to ports inside a running guest (`GuestPorts`, runtime/base.py): an
exposure's last hop, on the node that runs the guest.

The socket is made inside the guest's network namespace and connects to 127.0.0.1:PORT
there, so a server in the guest answers whether it bound 0.0.0.0 or its own loopback, and
the host's own ports (the API, the node link, PostgreSQL, anything on the host's loopback)
are never what an exposure reaches: a guest without a namespace of its own (`--sandbox
none`) is refused.

How the namespace is entered, and why so:

- `setns(CLONE_NEWNET)` moves only the calling thread, and a socket stays in the namespace
  it was made in. So a thread of its own (started for this, ended after: no pooled thread
  can be left in a guest's namespace) enters the guest's namespace, makes the socket and
  goes back; the connect is made on the event loop, non-blocking (a refusal on loopback is
  answered at once: ECONNREFUSED), and the connected socket handed to asyncio's streams.
- The namespace is the guest process's: /proc/<guest pid>/ns/net, the pid and its start
  time as the instance's supervisor wrote them (state.json, in the data directory: not the
  guest's to write). /proc/<pid> is opened once as a directory handle, which keeps meaning
  that process (once it exits, what is opened through it fails), and the process's start
  time is read through the same handle: a pid reused by another process after the guest
  ended is never entered. No path the guest controls is followed (/proc is the kernel's).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import socket
import threading
from pathlib import Path

from ...base import GuestRefused, GuestStream

CLONE_NEWNET = 0x40000000
# What one read answers at most, and the reader's buffer (it pauses the socket past it): 256
# KiB, as the exposure listener reads, so a download costs a quarter of the Python per byte
# (bench/exposure_proxy.py: 0.19x direct at 64 KiB, 0.43-0.53x at 256 KiB).
CHUNK = 256 * 1024
# A loopback connect is answered at once unless the listener's backlog is full (the SYN is
# then dropped and retried): give up after this.
CONNECT_TIMEOUT_S = 5.0

_libc = ctypes.CDLL(None, use_errno=True)


def check_port(port: int) -> None:
    """A TCP port a connection can be made to: 1 to 65535 (GuestRefused "invalid")."""
    if not 1 <= port <= 65535:
        raise GuestRefused("invalid", f"port {port}: a guest port is 1 to 65535")


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _open_process(pid: int, start: int) -> int:
    """A directory handle on /proc/PID, if PID runs and is the process that started at
    `start` (clock ticks after boot, /proc/PID/stat's 22nd field); else -1."""
    if pid <= 0:
        return -1
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        stat_fd = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        try:
            stat = os.read(stat_fd, 4096).decode()
        finally:
            os.close(stat_fd)
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X") or int(fields[19]) != start:
            os.close(proc)
            return -1
    except (OSError, ValueError, IndexError):
        os.close(proc)
        return -1
    return proc


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def _socket_in(netns: int) -> socket.socket:
    """A TCP socket made in the network namespace `netns` (an open ns/net handle), by a
    thread of its own that enters it and goes back."""
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def work() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            failed.append(error)
            return
        try:
            _setns(netns)
            try:
                made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            finally:
                _setns(own)  # and the thread ends: nothing else ever runs in it
        except OSError as error:
            failed.append(error)
        finally:
            os.close(own)

    thread = threading.Thread(target=work, name="kibo-guest-port", daemon=True)
    thread.start()
    thread.join()
    if failed or not made:
        for sock in made:
            sock.close()
        raise failed[0] if failed else OSError("no socket was made")
    return made[0]


def guest_socket(directory: Path) -> socket.socket:
    """A TCP socket in the network namespace of the guest of the instance in `directory`
    (blocking, cheap: call it in a thread). GuestRefused("unavailable") when the guest does
    not run, or has no network namespace of its own."""
    spec = _read_json(directory / "spec.json")
    if spec.get("isolation") != "bwrap":
        raise GuestRefused(
            "unavailable", "exposures need the bwrap sandbox: this guest shares the host's network (--sandbox none)"
        )
    state = _read_json(directory / "state.json")
    pid = state.get("guest_pid")
    start = state.get("guest_start")
    proc = -1
    if state.get("state") == "ready" and isinstance(pid, int) and isinstance(start, int):
        proc = _open_process(pid, start)
    if proc < 0:
        raise GuestRefused("unavailable", "the guest is not running (it may be restarting): retry")
    try:
        try:
            netns = os.open("ns/net", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        except OSError:
            raise GuestRefused("unavailable", "the guest is not running (it may be restarting): retry") from None
        try:
            return _socket_in(netns)
        except OSError as error:
            raise GuestRefused("unavailable", f"cannot enter the guest's network: {error.strerror or error}") from None
        finally:
            os.close(netns)
    finally:
        os.close(proc)


async def open_guest_port(directory: Path, port: int) -> GuestStream:
    """A connection to 127.0.0.1:`port` in the guest of the instance in `directory` (see the
    module docstring). GuestRefused: "invalid" (port), "unavailable", "port-closed"."""
    check_port(port)
    sock = await asyncio.to_thread(guest_socket, directory)
    try:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await loop.sock_connect(sock, ("127.0.0.1", port))
        except ConnectionRefusedError:
            raise GuestRefused("port-closed", f"nothing listens on port {port} in the guest") from None
        except TimeoutError:
            raise GuestRefused(
                "unavailable", f"port {port} in the guest did not accept in {CONNECT_TIMEOUT_S:g} s (backlog full?)"
            ) from None
        except OSError as error:
            raise GuestRefused("unavailable", f"port {port} in the guest: {error.strerror or error}") from None
        reader, writer = await asyncio.open_connection(sock=sock, limit=CHUNK)
    except BaseException:
        sock.close()
        raise
    return SocketStream(reader, writer)


class SocketStream:
    """A GuestStream over a connected socket (asyncio streams: the reader pauses the socket
    past CHUNK buffered, a write waits while the kernel's and the transport's buffers are full)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._closed = False

    async def read(self) -> bytes:
        if self._closed:
            return b""
        try:
            return await self._reader.read(CHUNK)
        except OSError:  # reset by the guest
            return b""

    async def write(self, data: bytes) -> None:
        if self._closed or self._writer.is_closing():
            raise ConnectionResetError("the connection to the guest is closed")
        self._writer.write(data)
        await self._writer.drain()

    async def write_eof(self) -> None:
        if self._closed or self._writer.is_closing():
            return
        with contextlib.suppress(OSError):
            self._writer.write_eof()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Cut, not a graceful close: what is still buffered toward the guest is dropped.
        self._writer.transport.abort()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
