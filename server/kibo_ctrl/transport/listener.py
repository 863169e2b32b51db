"""A listening socket that caps its open connections, in all and per client address.

The HTTP servers (uvicorn, hypercorn) accept through asyncio, which calls the listening
socket's `accept()`. This socket's `accept()` closes a connection past a cap at once,
before any protocol object exists for it, and the connection it hands out gives its
place back when it is closed. So the HTTP port never holds more than its cap of file
descriptors, whatever a client does, and the rest of the process (the gRPC port, the
store, the sandboxes) keeps the descriptors it needs (issue 10, finding 9)."""

from __future__ import annotations

import logging
import os
import socket
import time
import weakref
from collections import Counter
from typing import Any

log = logging.getLogger(__name__)

# How many refused connections accept() closes in one call before it lets the event loop
# run other work; the loop calls it again while connections wait.
REFUSALS_PER_CALL = 64
# At most one log line about refused connections per this many seconds.
REFUSAL_LOG_SECONDS = 10.0


class ConnectionCaps:
    """Counts open connections; says whether one more may be admitted."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.open = 0
        self._by_client: Counter[str] = Counter()
        self._refused_since_log = 0
        self._last_log = 0.0

    def admit(self, client: str) -> bool:
        if self.open >= self.total or self._by_client[client] >= self.per_client:
            self._note_refusal(client)
            return False
        self.open += 1
        self._by_client[client] += 1
        return True

    def release(self, client: str) -> None:
        self.open -= 1
        self._by_client[client] -= 1
        if self._by_client[client] <= 0:
            del self._by_client[client]

    def _note_refusal(self, client: str) -> None:
        # One line per interval, however fast connections are refused.
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._last_log >= REFUSAL_LOG_SECONDS:
            log.warning(
                "HTTP listener: refused %d connection(s) over its caps in the last %.0f s "
                "(open %d of %d; at most %d per client address; last from %s)",
                self._refused_since_log,
                min(now - self._last_log, REFUSAL_LOG_SECONDS) if self._last_log else 0.0,
                self.open,
                self.total,
                self.per_client,
                client,
            )
            self._refused_since_log = 0
            self._last_log = now


class _Place:
    """One admitted connection's place under the caps, given back exactly once."""

    def __init__(self, caps: ConnectionCaps, client: str) -> None:
        self._caps: ConnectionCaps | None = caps
        self._client = client

    def give_back(self) -> None:
        caps, self._caps = self._caps, None
        if caps is not None:
            caps.release(self._client)


class CountedConnection(socket.socket):
    """An accepted connection that gives its place back when it is closed (or collected)."""

    place: _Place

    def close(self) -> None:
        self.place.give_back()
        super().close()


class CappedListener(socket.socket):
    """A listening TCP socket whose accept() refuses connections past `caps`."""

    caps: ConnectionCaps

    def accept(self) -> tuple[socket.socket, Any]:
        for _ in range(REFUSALS_PER_CALL):
            fd, address = self._accept()  # type: ignore[attr-defined]
            client = str(address[0])
            if not self.caps.admit(client):
                os.close(fd)
                continue
            connection = CountedConnection(self.family, self.type, self.proto, fileno=fd)
            place = _Place(self.caps, client)
            connection.place = place
            # Also if a connection is dropped without close() (an error path in a library).
            weakref.finalize(connection, place.give_back)
            if socket.getdefaulttimeout() is None and self.gettimeout():
                connection.setblocking(True)
            return connection, address
        # asyncio treats this as "nothing more for now" and calls again on the next turn.
        raise BlockingIOError("refused connections over the caps; more are waiting")


def listen(host: str, port: int, caps: ConnectionCaps, backlog: int = 2048) -> CappedListener:
    """Bind and listen on HOST:PORT (IPv4 or IPv6) with a capped accept()."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = CappedListener(family, kind, proto)
    sock.caps = caps
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
