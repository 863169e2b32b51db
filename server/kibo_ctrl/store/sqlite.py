"""The embedded store: SQLite in WAL mode, one writer thread with group commit.

Every mutation is a function run inside a transaction on the writer thread. The writer
takes every job waiting in its queue, runs each inside its own SAVEPOINT (a failing job
rolls back alone), commits them with one fsync, and only then resolves the callers and
publishes the change set. So an acknowledged command is always on disk, and under load
many commands share one fsync.

The rest of the code sees only the protocols of base.py (a PostgreSQL store can implement
them); the schema is migrations.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec

from ..domain.access import Role, TokenRecord
from ..domain.certificates import ClusterCa, NodeIssuance
from ..domain.clock import SYSTEM_CLOCK, Clock
from ..domain.errors import StoreError, Unavailable
from ..domain.model import Command, Event, Instance, Volume, Workspace, WorkspaceState
from ..domain.nodes import NodeRecord
from .base import (
    Changes,
    CommitObserver,
    EventQuery,
    EventSlice,
    ListedWorkspace,
    Reader,
    Tx,
    WorkspaceQuery,
    WorkspaceSlice,
)
from .migrations import MIGRATIONS
from .records import COMMAND as _COMMAND
from .records import ENCODER as _ENCODER
from .records import EVENT as _EVENT
from .records import INSTANCE as _INSTANCE
from .records import NODE as _NODE
from .records import VOLUME as _VOLUME
from .records import WORKSPACE as _WORKSPACE
from .records import (
    event_columns,
    event_scan,
    event_slice,
    instance_active,
    instance_unscheduled,
    listed_workspace,
    workspace_storage_pending,
)

T = TypeVar("T")
P = ParamSpec("P")


# SQLite conditions that pass (space returns, a lock is released, the disk is remounted):
# UNAVAILABLE, so clients retry. Every other SQLite error is a bug in a query: INTERNAL.
STORE_UNAVAILABLE: dict[str, str] = {
    "SQLITE_FULL": "its disk is full",
    "SQLITE_READONLY": "it cannot write (read-only)",
    "SQLITE_IOERR": "its disk reports I/O errors",
    "SQLITE_CANTOPEN": "its files cannot be opened",
    "SQLITE_BUSY": "it is locked by another process",
    "SQLITE_LOCKED": "it is locked",
    "SQLITE_PROTOCOL": "it is locked",
}


def store_error(error: sqlite3.Error) -> StoreError:
    """The StoreError callers see in place of an SQLite error (the driver stays in here)."""
    name = getattr(error, "sqlite_errorname", "") or ""
    # Extended codes (SQLITE_IOERR_WRITE, SQLITE_READONLY_DBMOVED) share their primary's words.
    words = next((text for prefix, text in STORE_UNAVAILABLE.items() if name.startswith(prefix)), None)
    unavailable = None if words is None else Unavailable(f"the store is unavailable: {words}; retry later")
    failure = StoreError(f"{name or type(error).__name__}: {error}", unavailable)
    failure.__cause__ = error
    return failure


class SqliteReader:
    """Queries, on any connection (the Reader protocol of base.py)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _one(self, sql: str, args: tuple[Any, ...]) -> bytes | None:
        row = self._conn.execute(sql, args).fetchone()
        return None if row is None else bytes(row[0])

    def get_workspace(self, workspace_id: str) -> Workspace | None:
        data = self._one("SELECT data FROM workspaces WHERE id = ?", (workspace_id,))
        return None if data is None else _WORKSPACE.decode(data)

    def get_command(self, tenant: str, command_id: str) -> Command | None:
        data = self._one("SELECT data FROM commands WHERE tenant = ? AND id = ?", (tenant, command_id))
        return None if data is None else _COMMAND.decode(data)

    def get_instance(self, instance_id: str) -> Instance | None:
        data = self._one("SELECT data FROM instances WHERE id = ?", (instance_id,))
        return None if data is None else _INSTANCE.decode(data)

    def get_volume(self, volume_id: str) -> Volume | None:
        data = self._one("SELECT data FROM volumes WHERE id = ?", (volume_id,))
        return None if data is None else _VOLUME.decode(data)

    def scan_workspaces(self, query: WorkspaceQuery, max_rows: int, want: int) -> WorkspaceSlice:
        """The tenant's next `max_rows` workspaces after `query.after_seq`, matched against the
        query, up to `want` matches: a read whose cost is bounded by `max_rows` whatever the
        filter, so a list can run as many short reads (others' reads and the writer's
        checkpoints go between them)."""
        where, args = _conditions(query)
        sql = (
            f"SELECT seq, CASE WHEN {where} THEN data END FROM "
            "(SELECT seq, state, deleted, data FROM workspaces WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?)"
        )
        rows = self._conn.execute(sql, [*args, query.tenant, query.after_seq, max_rows]).fetchall()
        matched: list[ListedWorkspace] = []
        for seq, data in rows:
            if data is not None:
                matched.append(listed_workspace(int(seq), bytes(data)))
                if len(matched) == want:
                    # The rest of the slice is left for the next page: stop where the page ends.
                    return WorkspaceSlice(matched, int(seq), False)
        return WorkspaceSlice(matched, int(rows[-1][0]) if rows else 0, len(rows) < max_rows)

    def count_workspaces(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM workspaces").fetchone()[0])

    def workspace_counts(self) -> list[tuple[str, WorkspaceState, int]]:
        rows = self._conn.execute(
            "SELECT tenant, state, COUNT(*) FROM workspaces WHERE deleted = 0 GROUP BY tenant, state"
        )
        return [(str(tenant), WorkspaceState(int(state)), int(count)) for tenant, state, count in rows]

    def tenant_usage(self, tenant: str) -> tuple[int, int, int]:
        """Workspaces not deleted, and their vCPU and memory, for quotas."""
        row = self._conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(vcpus), 0), COALESCE(SUM(memory_mib), 0) FROM workspaces "
            "WHERE tenant = ? AND deleted = 0",
            (tenant,),
        ).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def find_token(self, digest: str) -> TokenRecord | None:
        row = self._conn.execute(
            "SELECT id, tenant, role, create_time, revoked FROM tokens WHERE hash = ?", (digest,)
        ).fetchone()
        return None if row is None else TokenRecord(row[0], row[1], Role(row[2]), float(row[3]), bool(row[4]))

    def list_tokens(self) -> list[TokenRecord]:
        rows = self._conn.execute("SELECT id, tenant, role, create_time, revoked FROM tokens ORDER BY create_time")
        return [TokenRecord(r[0], r[1], Role(r[2]), float(r[3]), bool(r[4])) for r in rows]

    def list_events(self, workspace_id: str, after_seq: int, limit: int) -> list[Event]:
        rows = self._conn.execute(
            "SELECT seq, data FROM events WHERE workspace_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (workspace_id, after_seq, limit),
        )
        events = []
        for seq, data in rows:
            event = _EVENT.decode(bytes(data))
            event.seq = int(seq)
            events.append(event)
        return events

    def scan_events(self, query: EventQuery, max_rows: int, want: int) -> EventSlice:
        sql, args = event_scan(query, max_rows, "?")
        rows = self._conn.execute(sql, args).fetchall()
        newest = int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])
        return event_slice(rows, max_rows, want, newest)

    def list_instances(self, workspace_id: str) -> list[Instance]:
        rows = self._conn.execute("SELECT data FROM instances WHERE workspace_id = ? ORDER BY rowid", (workspace_id,))
        return [_INSTANCE.decode(bytes(row[0])) for row in rows]

    def unscheduled_instances(self) -> list[Instance]:
        rows = self._conn.execute("SELECT data FROM instances WHERE unscheduled = 1 ORDER BY rowid")
        return [_INSTANCE.decode(bytes(row[0])) for row in rows]

    def unscheduled_besides(self, instance_id: str) -> bool:
        sql = "SELECT 1 FROM instances WHERE unscheduled = 1 AND id != ? LIMIT 1"
        return self._conn.execute(sql, (instance_id,)).fetchone() is not None

    def node_instances(self, node_id: str) -> list[Instance]:
        """Instances a node still has to act on or still holds parts of."""
        rows = self._conn.execute(
            "SELECT data FROM instances WHERE node_id = ? AND active = 1 ORDER BY rowid", (node_id,)
        )
        return [_INSTANCE.decode(bytes(row[0])) for row in rows]

    def node_usage(self, node_id: str) -> tuple[int, int]:
        # The sums over the node's reserved instances, kept by triggers (migration 3).
        row = self._conn.execute("SELECT vcpus, memory_mib FROM node_usage WHERE node_id = ?", (node_id,)).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def next_expirations(self, limit: int) -> list[Workspace]:
        rows = self._conn.execute(
            "SELECT data FROM workspaces WHERE expire_at IS NOT NULL ORDER BY expire_at LIMIT ?", (limit,)
        )
        return [_WORKSPACE.decode(bytes(row[0])) for row in rows]

    def volumes_storage_pending(self) -> list[Volume]:
        """Deleted volumes whose files may still be on a node (a scan: read at node start only)."""
        rows = self._conn.execute("SELECT data FROM volumes WHERE json_extract(data, '$.storage_pending') = 1")
        return [_VOLUME.decode(bytes(row[0])) for row in rows]

    def storage_pending(self) -> list[Workspace]:
        rows = self._conn.execute("SELECT data FROM workspaces WHERE storage_pending = 1 ORDER BY seq")
        return [_WORKSPACE.decode(bytes(row[0])) for row in rows]

    def stopped_workspaces(self) -> list[Workspace]:
        rows = self._conn.execute(
            "SELECT data FROM workspaces WHERE deleted = 0 AND state = ? ORDER BY seq", (int(WorkspaceState.STOPPED),)
        )
        return [_WORKSPACE.decode(bytes(row[0])) for row in rows]

    def integrity_check(self) -> str:
        return str(self._conn.execute("PRAGMA integrity_check").fetchone()[0])

    # -- nodes (issue 13): the node registry's queries (migration 4) ----------------------------
    def get_node(self, node_id: str) -> NodeRecord | None:
        data = self._one("SELECT data FROM nodes WHERE id = ?", (node_id,))
        return None if data is None else _NODE.decode(data)

    def list_nodes(self) -> list[NodeRecord]:
        return [_NODE.decode(bytes(row[0])) for row in self._conn.execute("SELECT data FROM nodes ORDER BY id")]

    # -- end of nodes ---------------------------------------------------------------------------

    # -- the node link's certificates (engine/cluster_ca.py) ------------------------------------
    def get_cluster_ca(self) -> ClusterCa | None:
        row = self._conn.execute("SELECT cert_pem, key_pem, create_time FROM cluster_ca WHERE id = 1").fetchone()
        return None if row is None else ClusterCa(str(row[0]), str(row[1]), float(row[2]))

    def get_node_issuance(self, token_id: str) -> NodeIssuance | None:
        row = self._conn.execute(
            "SELECT node_id, key_sha256, cert_pem, issue_time FROM node_issuances WHERE token_id = ?", (token_id,)
        ).fetchone()
        return None if row is None else NodeIssuance(token_id, str(row[0]), str(row[1]), str(row[2]), float(row[3]))

    def node_token_digests(self, node_id: str) -> list[tuple[TokenRecord, str]]:
        rows = self._conn.execute(
            "SELECT id, tenant, role, create_time, revoked, hash FROM tokens "
            "WHERE tenant = ? AND role = ? AND revoked = 0 ORDER BY create_time",
            (node_id, Role.NODE.value),
        )
        return [(TokenRecord(r[0], r[1], Role(r[2]), float(r[3]), bool(r[4])), str(r[5])) for r in rows]


class SqliteTx(SqliteReader):
    """A transaction on the writer connection (the Tx protocol). Writes are collected into `changes`."""

    def __init__(self, conn: sqlite3.Connection, now: float) -> None:
        super().__init__(conn)
        self.now = now
        self.changes = Changes()

    def next_workspace_seq(self) -> int:
        return int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM workspaces").fetchone()[0])

    def put_workspace(self, workspace: Workspace) -> None:
        workspace.version += 1
        workspace.update_time = self.now
        self._conn.execute(
            "INSERT INTO workspaces (id, seq, state, deleted, expire_at, storage_pending, data, tenant, vcpus, "
            "memory_mib) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET state = excluded.state, "
            "deleted = excluded.deleted, expire_at = excluded.expire_at, "
            "storage_pending = excluded.storage_pending, data = excluded.data, vcpus = excluded.vcpus, "
            "memory_mib = excluded.memory_mib",
            (
                workspace.id,
                workspace.seq,
                int(workspace.state),
                int(workspace.deleted),
                workspace.expiration.expire_time,
                int(workspace_storage_pending(workspace)),
                _ENCODER.encode(workspace),
                workspace.tenant,
                workspace.resources.vcpus,
                workspace.resources.memory_mib,
            ),
        )
        # A snapshot: callers keep mutating their record.
        snapshot = msgspec.structs.replace(workspace)
        self.changes.workspaces[workspace.id] = snapshot
        self.changes.workspace_history.append(snapshot)

    def put_command(self, command: Command) -> None:
        command.update_time = self.now
        self._conn.execute(
            "INSERT INTO commands (tenant, id, workspace_id, data) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(tenant, id) DO UPDATE SET data = excluded.data",
            (command.tenant, command.id, command.workspace_id, _ENCODER.encode(command)),
        )
        self.changes.commands[command.key] = msgspec.structs.replace(command)

    def put_instance(self, instance: Instance) -> None:
        active = instance_active(instance)
        unscheduled = instance_unscheduled(instance)
        self._conn.execute(
            "INSERT INTO instances (id, workspace_id, node_id, unscheduled, reserved, vcpus, memory_mib, "
            "active, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "node_id = excluded.node_id, unscheduled = excluded.unscheduled, reserved = excluded.reserved, "
            "vcpus = excluded.vcpus, memory_mib = excluded.memory_mib, active = excluded.active, "
            "data = excluded.data",
            (
                instance.id,
                instance.workspace_id,
                instance.node_id,
                int(unscheduled),
                int(instance.reserved),
                instance.vcpus,
                instance.memory_mib,
                int(active),
                _ENCODER.encode(instance),
            ),
        )
        self.changes.instances[instance.id] = msgspec.structs.replace(instance)

    def put_volume(self, volume: Volume) -> None:
        self._conn.execute(
            "INSERT INTO volumes (id, data, tenant) VALUES (?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET data = excluded.data",
            (volume.id, _ENCODER.encode(volume), volume.tenant),
        )
        self.changes.volumes[volume.id] = msgspec.structs.replace(volume)

    def add_token(self, record: TokenRecord, digest: str) -> None:
        self._conn.execute(
            "INSERT INTO tokens (id, hash, tenant, role, create_time, revoked) VALUES (?, ?, ?, ?, ?, 0)",
            (record.id, digest, record.tenant, record.role.value, record.create_time),
        )

    def revoke_token(self, token_id: str) -> bool:
        cursor = self._conn.execute("UPDATE tokens SET revoked = 1 WHERE id = ? AND revoked = 0", (token_id,))
        return cursor.rowcount > 0

    def add_event(self, event: Event) -> None:
        cursor = self._conn.execute(
            "INSERT INTO events (workspace_id, tenant, node_id, event_type, event_time, data) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (*event_columns(event), _ENCODER.encode(event)),
        )
        event.seq = int(cursor.lastrowid or 0)
        self.changes.events.append(event)

    # -- nodes (issue 13) -----------------------------------------------------------------------
    def put_node(self, node: NodeRecord) -> None:
        self._conn.execute(
            "INSERT INTO nodes (id, lease_expiry, data) VALUES (?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET lease_expiry = excluded.lease_expiry, data = excluded.data",
            (node.id, node.lease_expiry, _ENCODER.encode(node)),
        )
        self.changes.nodes[node.id] = msgspec.structs.replace(node)

    # -- end of nodes ---------------------------------------------------------------------------

    # -- the node link's certificates -----------------------------------------------------------
    def add_cluster_ca(self, ca: ClusterCa) -> bool:
        cursor = self._conn.execute(
            "INSERT INTO cluster_ca (id, cert_pem, key_pem, create_time) VALUES (1, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            (ca.cert_pem, ca.key_pem, ca.create_time),
        )
        return cursor.rowcount > 0

    def add_node_issuance(self, issuance: NodeIssuance) -> None:
        self._conn.execute(
            "INSERT INTO node_issuances (token_id, node_id, key_sha256, cert_pem, issue_time) VALUES (?, ?, ?, ?, ?)",
            (issuance.token_id, issuance.node_id, issuance.key_sha256, issuance.cert_pem, issuance.issue_time),
        )


def _conditions(query: WorkspaceQuery) -> tuple[str, list[Any]]:
    """The query's filter as one SQL condition on a workspaces row, with its arguments."""
    where = ["1"]
    args: list[Any] = []
    if not query.include_deleted:
        where.append("deleted = 0")
    for state, equal in query.states:
        where.append("state = ?" if equal else "state != ?")
        args.append(int(state))
    for key, value, equal in query.labels:
        # A missing label is "not equal" to any value.
        if equal:
            where.append("json_extract(data, ?) = ?")
        else:
            where.append("json_extract(data, ?) IS NOT ?")
        args.extend((f'$.labels."{key}"', value))
    return " AND ".join(where), args


@dataclass
class _Job:
    fn: Callable[[Any], Any]  # given a Tx (writes) or a Reader (reads)
    future: asyncio.Future[Any]


_STOP = object()


class SqliteStore:
    """Store on one SQLite file. Create with `await SqliteStore.open(path)`."""

    MAX_BATCH = 512

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self._clock = clock
        self._loop = loop
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._listeners: list[Callable[[Changes], None]] = []
        self._commit_observers: list[CommitObserver] = []
        self._read_queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._reader = threading.Thread(
            target=self._read_loop, args=(self._read_queue,), name="kibo-store-read", daemon=True
        )
        self._scan_queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._scanner = threading.Thread(
            target=self._read_loop, args=(self._scan_queue,), name="kibo-store-scan", daemon=True
        )
        self._writer = threading.Thread(target=self._write_loop, name="kibo-store-write", daemon=True)
        self._closed = False
        # Commit batches begun (by the writer thread) and published (on the event loop).
        self._batches_begun = 0
        self._batches_published = 0

    @classmethod
    async def open(cls, path: Path, clock: Clock = SYSTEM_CLOCK) -> SqliteStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        store = cls(path, asyncio.get_running_loop(), clock)
        try:
            await asyncio.to_thread(store._migrate)
        except sqlite3.Error as error:
            raise store_error(error) from error
        store._writer.start()
        store._reader.start()
        store._scanner.start()
        return store

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before it is acknowledged.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _migrate(self) -> None:
        conn = self._connect()
        try:
            self._migrate_on(conn)
        finally:
            conn.close()

    def _migrate_on(self, conn: sqlite3.Connection) -> None:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > len(MIGRATIONS):
            raise RuntimeError(f"{self.path} has schema version {version}, newer than this kibo ({len(MIGRATIONS)})")
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            conn.executescript(f"BEGIN IMMEDIATE; {script}; PRAGMA user_version = {number}; COMMIT;")

    def subscribe(self, listener: Callable[[Changes], None]) -> None:
        self._listeners.append(listener)

    def observe_commits(self, observer: CommitObserver) -> None:
        self._commit_observers.append(observer)

    def published_mark(self) -> int | None:
        """On the event loop: a number that changes with every commit, or None while a commit
        may be visible to readers but not yet published to the listeners. While it stays the
        same number, what the listeners were told is exactly what is stored."""
        published = self._batches_published
        return published if self._batches_begun == published else None

    async def transact(self, fn: Callable[Concatenate[Tx, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise RuntimeError("store is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        # Run in the caller's context (its trace, engine/trace.py) on the writer thread.
        context = contextvars.copy_context()
        self._queue.put(_Job(lambda on: context.run(fn, on, *args, **kwargs), future))
        return await future

    async def read(self, fn: Callable[Concatenate[Reader, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise RuntimeError("store is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._read_queue.put(_Job(lambda on: fn(on, *args, **kwargs), future))
        return await future

    async def scan(self, fn: Callable[Concatenate[Reader, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise RuntimeError("store is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._scan_queue.put(_Job(lambda on: fn(on, *args, **kwargs), future))
        return await future

    def _read_loop(self, jobs: queue.SimpleQueue[_Job | object]) -> None:
        """Reads are batched like writes: every read waiting runs in one read transaction (a
        snapshot taken after each of them was asked for), and one wake-up of the event loop
        answers them all. (A thread pool cost a thread hop and a loop wake-up per read.)"""
        conn = self._connect()
        try:
            while True:
                batch, stop = _take(jobs, self.MAX_BATCH)
                outcomes: list[tuple[_Job, Any, BaseException | None]] = []
                try:
                    with _read_transaction(conn):
                        reader = SqliteReader(conn)
                        for job in batch:
                            try:
                                outcomes.append((job, job.fn(reader), None))
                            except BaseException as error:
                                outcomes.append((job, None, error))
                except sqlite3.Error as error:
                    outcomes = [(job, None, error) for job in batch]
                if outcomes:
                    self._loop.call_soon_threadsafe(_settle_all, outcomes)
                if stop:
                    return
        finally:
            conn.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        await asyncio.to_thread(self._writer.join)
        self._read_queue.put(_STOP)
        await asyncio.to_thread(self._reader.join)
        self._scan_queue.put(_STOP)
        await asyncio.to_thread(self._scanner.join)

    def _write_loop(self) -> None:
        conn = self._connect()
        try:
            while True:
                batch, stop = _take(self._queue, self.MAX_BATCH)
                if batch:
                    self._commit_batch(conn, batch)
                if stop:
                    return
        finally:
            conn.close()

    def _commit_batch(self, conn: sqlite3.Connection, batch: list[_Job]) -> None:
        outcomes: list[tuple[_Job, Any, BaseException | None]] = []
        changes = Changes()
        now = self._clock.now()
        # Before anything can commit; _publish_and_settle counts the batch published.
        self._batches_begun += 1
        started = time.perf_counter()
        # A batch of one needs no savepoint: its failure rolls the whole transaction back.
        # (At low load most batches are of one; two statements fewer each.)
        alone = len(batch) == 1
        try:
            conn.execute("BEGIN IMMEDIATE")
            for job in batch:
                tx = SqliteTx(conn, now)
                if not alone:
                    conn.execute("SAVEPOINT job")
                try:
                    result = job.fn(tx)
                except BaseException as error:
                    if alone:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                    elif isinstance(error, sqlite3.Error) and not conn.in_transaction:
                        # SQLite rolled the whole transaction back (it may on SQLITE_FULL): the
                        # savepoint is gone, and the batch fails with this job's own error.
                        raise
                    else:
                        conn.execute("ROLLBACK TO job")
                        conn.execute("RELEASE job")
                    outcomes.append((job, None, error))
                else:
                    if not alone:
                        conn.execute("RELEASE job")
                    outcomes.append((job, result, None))
                    changes.merge(tx.changes)
            took: float | None = None
            if not alone or outcomes[0][2] is None:
                # (Raises if the job's own error rolled SQLite back and the job went on.)
                conn.execute("COMMIT")
                took = time.perf_counter() - started
        except sqlite3.Error as commit_error:
            if conn.in_transaction:
                # SQLite may have rolled back already (disk full); the writer must survive either way.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            outcomes = [(job, None, commit_error) for job in batch]
            changes = Changes()
            took = None
        if took is not None:
            for observer in self._commit_observers:
                observer(took, len(batch))
        # One wake-up of the event loop per batch: publish first, so whoever learns of the
        # commit from an answer finds the hub (watchers, waiters, loops) already told.
        self._loop.call_soon_threadsafe(self._publish_and_settle, changes, outcomes)

    def _publish_and_settle(self, changes: Changes, outcomes: list[tuple[_Job, Any, BaseException | None]]) -> None:
        try:
            if changes:
                self._publish(changes)
        finally:
            self._batches_published += 1
            _settle_all(outcomes)

    def _publish(self, changes: Changes) -> None:
        for listener in self._listeners:
            listener(changes)


def _take(jobs: queue.SimpleQueue[_Job | object], limit: int) -> tuple[list[_Job], bool]:
    """Block for one job, then take every job waiting (up to `limit`); True once told to stop."""
    first = jobs.get()
    if first is _STOP:
        return [], True
    batch: list[_Job] = [first]  # type: ignore[list-item]
    while len(batch) < limit:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            break
        if job is _STOP:
            return batch, True
        batch.append(job)  # type: ignore[arg-type]
    return batch, False


def _settle_all(outcomes: list[tuple[_Job, Any, BaseException | None]]) -> None:
    for job, result, error in outcomes:
        _settle(job.future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if isinstance(error, sqlite3.Error):
        future.set_exception(store_error(error))
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@contextlib.contextmanager
def _read_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    # One snapshot for the whole read function.
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")
