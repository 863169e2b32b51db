"""The change feed: how each replica on one PostgreSQL database publishes every commit, its
own and the others', to its hub, in commit order, with no gap.

The writer (postgres.py) records each commit's `Changes` in `kibo_changes` under the next
sequence number, inside the commit and under the write lock: sequence order is commit order
and no number is skipped. Before that, still under the lock, it reads the rows other
replicas committed since it last looked, and after COMMIT it publishes them and then its own,
in order. A listener thread (LISTEN kibo_changes) wakes on the others' NOTIFY, and at least
every POLL_S, and reads the rows after the last one published: a NOTIFY lost while its
connection was down costs a delay, never a change. `Feed.deliver` (on the event loop) drops
what was already published, so the two paths may overlap freely."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg

from .base import Changes

log = logging.getLogger("kibo.store")

CHANNEL = "kibo_changes"
POLL_S = 1.0
# Rows kept for replicas that fall behind (a restarted replica starts from the newest).
RETAIN = 100_000
PRUNE_EVERY = 1_000
_ENCODER = msgspec.json.Encoder()
_CHANGES = msgspec.json.Decoder(Changes)

Entry = tuple[int, Changes]


def newest(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM kibo_changes").fetchone()
    return 0 if row is None else int(row[0])


def _decode(rows: list[tuple[Any, ...]]) -> list[Entry]:
    return [(int(seq), _CHANGES.decode(bytes(data))) for seq, data in rows]


class Feed:
    """One replica's side of the feed. `origin` names this replica's rows."""

    def __init__(self, origin: str, publish: Callable[[Changes], None], start_after: int) -> None:
        self.origin = origin
        self._publish = publish
        # Published to the listeners (the event loop writes it; the threads only read it).
        self.published = start_after
        # Everything up to here is on its way to `deliver` from the writer (writer thread only),
        # and from the listener (listener thread only).
        self._written = start_after
        self._read = start_after

    def record(self, conn: psycopg.Connection[Any], changes: Changes) -> list[Entry]:
        """In the writer's transaction, under the write lock: the others' rows since the last
        look, then this commit's (if it changed anything), to publish after COMMIT."""
        seen = max(self._written, self.published)
        top = newest(conn)
        entries = []
        if top > seen:
            rows = conn.execute("SELECT seq, data FROM kibo_changes WHERE seq > %s ORDER BY seq", (seen,)).fetchall()
            entries = _decode(rows)
        if changes:
            top += 1
            conn.execute(
                "INSERT INTO kibo_changes (seq, origin, data) VALUES (%s, %s, %s)",
                (top, self.origin, _ENCODER.encode(changes)),
            )
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{self.origin} {top}"))
            if top % PRUNE_EVERY == 0:
                conn.execute("DELETE FROM kibo_changes WHERE seq <= %s", (top - RETAIN,))
            entries.append((top, changes))
        return entries

    def written(self, entries: list[Entry]) -> None:
        """After COMMIT (writer thread): these are on their way to `deliver`."""
        if entries:
            self._written = entries[-1][0]

    def deliver(self, entries: list[Entry]) -> None:
        """On the event loop: publish what follows the last published, in order."""
        for seq, changes in entries:
            if seq <= self.published:
                continue
            if seq != self.published + 1:
                # Cannot happen (every path reads from the last published on); if it did, the
                # listener's next read fills the gap before anything after it is published.
                log.error("change feed: %d follows %d; waiting for the rows between", seq, self.published)
                return
            self.published = seq
            self._publish(changes)

    def listen(
        self, dsn: str, loop: asyncio.AbstractEventLoop, stop: threading.Event, connect: Callable[[str], Any]
    ) -> None:
        """The listener thread: wake on the others' NOTIFY (or every POLL_S), read on."""
        conn: psycopg.Connection[Any] | None = None
        while not stop.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = connect(dsn)
                    conn.execute(f"LISTEN {CHANNEL}")
                    # What was committed while this connection was down (or before it was up).
                    while self._catch_up(conn, loop):
                        pass
                woken = foreign = False
                for notice in conn.notifies(timeout=POLL_S, stop_after=1):
                    woken = True
                    foreign = notice.payload.split(" ")[0] != self.origin
                # Our own commits reach `deliver` from the writer; read on for the others', and
                # on every quiet POLL_S in case a NOTIFY was lost.
                if foreign or not woken:
                    while self._catch_up(conn, loop):
                        pass
            except psycopg.Error as error:
                log.warning("change feed: %s; reconnecting", type(error).__name__)
                if conn is not None:
                    conn.close()
                conn = None
                stop.wait(POLL_S)
        if conn is not None:
            conn.close()

    def _catch_up(self, conn: psycopg.Connection[Any], loop: asyncio.AbstractEventLoop, limit: int = 1000) -> bool:
        """Hand the rows after `after` to `deliver`; True when there may be more."""
        after = max(self.published, self._read)
        rows = conn.execute(
            "SELECT seq, data FROM kibo_changes WHERE seq > %s ORDER BY seq LIMIT %s", (after, limit)
        ).fetchall()
        if rows:
            entries = _decode(rows)
            self._read = entries[-1][0]
            loop.call_soon_threadsafe(self.deliver, entries)
        return len(rows) == limit
