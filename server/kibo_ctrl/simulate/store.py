"""The SQLite store run on the simulation's thread.

The real store (store/sqlite.py) commits on a writer thread and answers reads on reader
threads; their timing would make runs differ. This subclass keeps every query, the group
commit (all jobs queued in one loop iteration share one transaction, each in its SAVEPOINT)
and the gap between a commit and its publication (published by a callback of the loop, as
the writer thread does), but runs them as loop callbacks: the order is the loop's, which is
deterministic. It adds the faults a disk has: full (a real SQLITE_FULL, from a page cap) and
a crash between a commit and its publication. The database is in memory (`MemoryDatabase`
keeps it across the simulated crashes)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..domain.clock import Clock
from ..store.base import Changes, Reader, Tx
from ..store.sqlite import SqliteReader, SqliteStore, _Job, _read_transaction, _settle, _settle_all

T = TypeVar("T")
P = ParamSpec("P")


def _connect(path: Path) -> sqlite3.Connection:
    # In memory, not a file: the simulated crash loses no OS buffers (the process lives on),
    # so a file would add only system calls (a write per page and commit, a read per page a
    # new incarnation touches) and change nothing the invariants can see. The same queries,
    # transactions, savepoints and page cap (a full disk) apply; a rollback journal in memory
    # takes the place of the WAL (no other connection reads while the writer writes).
    return sqlite3.connect(f"file:{path}?mode=memory&cache=shared", isolation_level=None, uri=True)


class MemoryDatabase:
    """Keeps the in-memory database named `path` while the simulation runs: an incarnation's
    crash closes its store's connection, and the next one finds the database as it was."""

    def __init__(self, path: Path) -> None:
        self._conn = _connect(path)

    def close(self) -> None:
        self._conn.close()


class LoopStore(SqliteStore):
    """Create with `LoopStore.open_here(path, clock)` on the running loop."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop, clock: Clock) -> None:
        super().__init__(path, loop, clock)
        self._pending: list[_Job] = []
        self._write_conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None
        # A crashed store publishes nothing more: what it committed is on disk, unannounced.
        self.crashed = False
        self.disk_full = False
        # Crash right after the next commit: on disk, answered to nobody, published to nobody.
        self.crash_after_commit = False
        # What it committed but, crashed, never published (the checker of the next
        # incarnation reads these records: no listener was told of them).
        self.withheld = Changes()

    @classmethod
    async def open_here(cls, path: Path, clock: Clock) -> LoopStore:
        """The database named `path`, in memory: it lasts while a connection to it is open
        (this store's, or a `MemoryDatabase`'s across the simulated crashes)."""
        store = cls(path, asyncio.get_running_loop(), clock)
        # One connection for writes and reads: both run on this thread, and never while a
        # batch is open, so a read sees what a reader connection would (the last commit).
        store._write_conn = store._read_conn = store._connect()
        store._migrate_on(store._write_conn)
        return store

    def _connect(self) -> sqlite3.Connection:
        return _connect(self.path)

    def set_disk_full(self, full: bool) -> None:
        """A full disk: the database may not grow past its current pages (SQLITE_FULL)."""
        assert self._write_conn is not None
        self.disk_full = full
        if full:
            pages = int(self._write_conn.execute("PRAGMA page_count").fetchone()[0])
            self._write_conn.execute(f"PRAGMA max_page_count = {pages}")
        else:
            self._write_conn.execute("PRAGMA max_page_count = 1073741823")

    async def transact(self, fn: Callable[Concatenate[Tx, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise RuntimeError("store is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._pending.append(_Job(lambda on: fn(on, *args, **kwargs), future))
        if len(self._pending) == 1:
            self._loop.call_soon(self._commit_pending)
        return await future

    def _commit_pending(self) -> None:
        if self._closed or self._write_conn is None:
            return
        batch, self._pending = self._pending, []
        self._commit_batch(self._write_conn, batch)
        if self.crash_after_commit:
            self.crashed = True

    def _publish_and_settle(self, changes: Changes, outcomes: list[tuple[_Job, Any, BaseException | None]]) -> None:
        if self.crashed:
            self.withheld.merge(changes)
            return
        super()._publish_and_settle(changes, outcomes)

    async def read(self, fn: Callable[Concatenate[Reader, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise RuntimeError("store is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._loop.call_soon(self._answer, _Job(lambda on: fn(on, *args, **kwargs), future))
        return await future

    scan = read

    def _answer(self, job: _Job) -> None:
        if self._closed or self._read_conn is None:
            return
        try:
            with _read_transaction(self._read_conn):
                result = job.fn(SqliteReader(self._read_conn))
        except BaseException as error:
            _settle(job.future, None, error)
        else:
            _settle_all([(job, result, None)])

    def check(self, fn: Callable[[Reader], T]) -> T:
        """A read now, outside the loop's order: the invariant checker's view of the disk."""
        assert self._read_conn is not None
        with _read_transaction(self._read_conn):
            return fn(SqliteReader(self._read_conn))

    async def close(self) -> None:
        self._closed = True
        if self._write_conn is not None:
            self._write_conn.close()
        self._write_conn = self._read_conn = None
