"""The shared store: PostgreSQL, one writer thread with group commit, as sqlite.py does.

`kibo-ctrl serve --store postgresql://USER@HOST:PORT/DB`. The semantics are SQLite's: the
writer takes every job waiting in its queue, runs each inside its own SAVEPOINT (a failing
job rolls back alone), commits them in one transaction, and only then resolves the callers
and publishes the change set. So an acknowledged command is committed, and under load many
commands share one commit.

Each write transaction first takes one transaction-scoped advisory lock (`WRITE_LOCK`): the
writers of every process on the database take turns, as SQLite's single writer does. So
what a transaction reads stays true until it commits (a command ID looked up and not found
is still free when it is inserted), sequences grow in commit order, and nothing needs
SERIALIZABLE's retries. The unique keys (command IDs per tenant, workspace seq) stay as the
guard: a job that breaks one anyway (a writer that did not take the lock) is run once more,
and then sees the row it collided with.

Several replicas may share the database: each commit's Changes also go into a change feed
(postgres_feed.py), from which every replica publishes every commit to its hub, in order.

Reads run in REPEATABLE READ snapshots on a connection of their own (batched like SQLite's
reads), scans on a third. A connection that fails is dropped and made anew for the next
batch; the batch it failed under is answered UNAVAILABLE (retry later), as is any other
condition that passes (disk full, read-only, shutting down); a query bug is INTERNAL."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec
import psycopg
from psycopg import errors as pg_errors

from ..domain.access import Role, TokenRecord
from ..domain.certificates import ClusterCa, NodeIssuance
from ..domain.clock import SYSTEM_CLOCK, Clock
from ..domain.errors import StoreError
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
from .postgres_conn import WRITE_LOCK, Connection, connect, describe, migrate, store_error
from .postgres_feed import Entry, Feed, newest
from .postgres_leader import FENCE, current, deposed
from .postgres_migrations import MIGRATIONS
from .records import (
    COMMAND,
    ENCODER,
    EVENT,
    INSTANCE,
    NODE,
    VOLUME,
    WORKSPACE,
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

# A job that fails with these is run once more (in the same transaction, from its savepoint).
_RERUN = (pg_errors.UniqueViolation, pg_errors.SerializationFailure, pg_errors.DeadlockDetected)


class PostgresReader:
    """Queries, on any connection (the Reader protocol of base.py)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def _one(self, sql: str, args: tuple[Any, ...]) -> bytes | None:
        row = self._conn.execute(sql, args).fetchone()
        return None if row is None else bytes(row[0])

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[bytes]:
        return [bytes(row[0]) for row in self._conn.execute(sql, args)]

    def get_workspace(self, workspace_id: str) -> Workspace | None:
        data = self._one("SELECT data FROM workspaces WHERE id = %s", (workspace_id,))
        return None if data is None else WORKSPACE.decode(data)

    def get_command(self, tenant: str, command_id: str) -> Command | None:
        data = self._one("SELECT data FROM commands WHERE tenant = %s AND id = %s", (tenant, command_id))
        return None if data is None else COMMAND.decode(data)

    def get_instance(self, instance_id: str) -> Instance | None:
        data = self._one("SELECT data FROM instances WHERE id = %s", (instance_id,))
        return None if data is None else INSTANCE.decode(data)

    def get_volume(self, volume_id: str) -> Volume | None:
        data = self._one("SELECT data FROM volumes WHERE id = %s", (volume_id,))
        return None if data is None else VOLUME.decode(data)

    def scan_workspaces(self, query: WorkspaceQuery, max_rows: int, want: int) -> WorkspaceSlice:
        """As SqliteReader.scan_workspaces: the tenant's next `max_rows` rows after
        `query.after_seq`, matched against the query, up to `want` matches."""
        where, args = _conditions(query)
        sql = (
            f"SELECT seq, CASE WHEN {where} THEN data END FROM "
            "(SELECT seq, state, deleted, data FROM workspaces WHERE tenant = %s AND seq > %s "
            "ORDER BY seq LIMIT %s) AS page ORDER BY seq"
        )
        rows = self._conn.execute(sql, [*args, query.tenant, query.after_seq, max_rows]).fetchall()
        matched: list[ListedWorkspace] = []
        for seq, data in rows:
            if data is not None:
                matched.append(listed_workspace(int(seq), bytes(data)))
                if len(matched) == want:
                    return WorkspaceSlice(matched, int(seq), False)
        return WorkspaceSlice(matched, int(rows[-1][0]) if rows else 0, len(rows) < max_rows)

    def count_workspaces(self) -> int:
        row = self._conn.execute("SELECT COUNT(*) FROM workspaces").fetchone()
        return 0 if row is None else int(row[0])

    def workspace_counts(self) -> list[tuple[str, WorkspaceState, int]]:
        rows = self._conn.execute(
            "SELECT tenant, state, COUNT(*) FROM workspaces WHERE NOT deleted GROUP BY tenant, state"
        )
        return [(str(tenant), WorkspaceState(int(state)), int(count)) for tenant, state, count in rows]

    def tenant_usage(self, tenant: str) -> tuple[int, int, int]:
        row = self._conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(vcpus), 0), COALESCE(SUM(memory_mib), 0) FROM workspaces "
            "WHERE tenant = %s AND NOT deleted",
            (tenant,),
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def find_token(self, digest: str) -> TokenRecord | None:
        row = self._conn.execute(
            "SELECT id, tenant, role, create_time, revoked FROM tokens WHERE hash = %s", (digest,)
        ).fetchone()
        return None if row is None else TokenRecord(row[0], row[1], Role(row[2]), float(row[3]), bool(row[4]))

    def list_tokens(self) -> list[TokenRecord]:
        rows = self._conn.execute("SELECT id, tenant, role, create_time, revoked FROM tokens ORDER BY create_time")
        return [TokenRecord(r[0], r[1], Role(r[2]), float(r[3]), bool(r[4])) for r in rows]

    def list_events(self, workspace_id: str, after_seq: int, limit: int) -> list[Event]:
        rows = self._conn.execute(
            "SELECT seq, data FROM events WHERE workspace_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            (workspace_id, after_seq, limit),
        )
        events = []
        for seq, data in rows:
            event = EVENT.decode(bytes(data))
            event.seq = int(seq)
            events.append(event)
        return events

    def scan_events(self, query: EventQuery, max_rows: int, want: int) -> EventSlice:
        sql, args = event_scan(query, max_rows, "%s")
        rows = self._conn.execute(sql, args).fetchall()
        row = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        return event_slice(rows, max_rows, want, 0 if row is None else int(row[0]))

    def list_instances(self, workspace_id: str) -> list[Instance]:
        rows = self._all("SELECT data FROM instances WHERE workspace_id = %s ORDER BY ord", (workspace_id,))
        return [INSTANCE.decode(data) for data in rows]

    def unscheduled_instances(self) -> list[Instance]:
        return [
            INSTANCE.decode(data) for data in self._all("SELECT data FROM instances WHERE unscheduled ORDER BY ord")
        ]

    def unscheduled_besides(self, instance_id: str) -> bool:
        sql = "SELECT 1 FROM instances WHERE unscheduled AND id != %s LIMIT 1"
        return self._conn.execute(sql, (instance_id,)).fetchone() is not None

    def node_instances(self, node_id: str) -> list[Instance]:
        rows = self._all("SELECT data FROM instances WHERE node_id = %s AND active ORDER BY ord", (node_id,))
        return [INSTANCE.decode(data) for data in rows]

    def node_usage(self, node_id: str) -> tuple[int, int]:
        # A sum over the node's reserved instances (a partial index holds only those).
        row = self._conn.execute(
            "SELECT COALESCE(SUM(vcpus), 0), COALESCE(SUM(memory_mib), 0) FROM instances "
            "WHERE node_id = %s AND reserved",
            (node_id,),
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def next_expirations(self, limit: int) -> list[Workspace]:
        rows = self._all(
            "SELECT data FROM workspaces WHERE expire_at IS NOT NULL ORDER BY expire_at LIMIT %s", (limit,)
        )
        return [WORKSPACE.decode(data) for data in rows]

    def volumes_storage_pending(self) -> list[Volume]:
        return [VOLUME.decode(data) for data in self._all("SELECT data FROM volumes WHERE storage_pending")]

    def storage_pending(self) -> list[Workspace]:
        rows = self._all("SELECT data FROM workspaces WHERE storage_pending ORDER BY seq")
        return [WORKSPACE.decode(data) for data in rows]

    def stopped_workspaces(self) -> list[Workspace]:
        rows = self._all(
            "SELECT data FROM workspaces WHERE NOT deleted AND state = %s ORDER BY seq", (int(WorkspaceState.STOPPED),)
        )
        return [WORKSPACE.decode(data) for data in rows]

    def integrity_check(self) -> str:
        """'ok' when the schema is the one this kibo builds (PostgreSQL checks its own pages)."""
        row = self._conn.execute("SELECT version FROM kibo_schema_version").fetchone()
        version = 0 if row is None else int(row[0])
        return "ok" if version == len(MIGRATIONS) else f"schema version {version}, expected {len(MIGRATIONS)}"

    # -- nodes (issue 13): the node registry's queries (migration 3) ----------------------------
    def get_node(self, node_id: str) -> NodeRecord | None:
        data = self._one("SELECT data FROM nodes WHERE id = %s", (node_id,))
        return None if data is None else NODE.decode(data)

    def list_nodes(self) -> list[NodeRecord]:
        return [NODE.decode(data) for data in self._all("SELECT data FROM nodes ORDER BY id")]

    # -- end of nodes ---------------------------------------------------------------------------

    # -- the node link's certificates (engine/cluster_ca.py) ------------------------------------
    def get_cluster_ca(self) -> ClusterCa | None:
        row = self._conn.execute("SELECT cert_pem, key_pem, create_time FROM cluster_ca WHERE id = 1").fetchone()
        return None if row is None else ClusterCa(str(row[0]), str(row[1]), float(row[2]))

    def get_node_issuance(self, token_id: str) -> NodeIssuance | None:
        row = self._conn.execute(
            "SELECT node_id, key_sha256, cert_pem, issue_time FROM node_issuances WHERE token_id = %s", (token_id,)
        ).fetchone()
        return None if row is None else NodeIssuance(token_id, str(row[0]), str(row[1]), str(row[2]), float(row[3]))

    def node_token_digests(self, node_id: str) -> list[tuple[TokenRecord, str]]:
        rows = self._conn.execute(
            "SELECT id, tenant, role, create_time, revoked, hash FROM tokens "
            "WHERE tenant = %s AND role = %s AND NOT revoked ORDER BY create_time",
            (node_id, Role.NODE.value),
        )
        return [(TokenRecord(r[0], r[1], Role(r[2]), float(r[3]), bool(r[4])), str(r[5])) for r in rows]


class PostgresTx(PostgresReader):
    """A transaction on the writer connection (the Tx protocol). Writes are collected into `changes`."""

    def __init__(self, conn: psycopg.Connection[Any], now: float) -> None:
        super().__init__(conn)
        self.now = now
        self.changes = Changes()

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """For the store's own bookkeeping in the same transaction (the leader lease)."""
        return self._conn

    def next_workspace_seq(self) -> int:
        # Under WRITE_LOCK: no other writer can take the same number before this commits.
        row = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM workspaces").fetchone()
        assert row is not None
        return int(row[0])

    def put_workspace(self, workspace: Workspace) -> None:
        workspace.version += 1
        workspace.update_time = self.now
        self._conn.execute(
            "INSERT INTO workspaces (id, seq, tenant, state, deleted, expire_at, storage_pending, vcpus, "
            "memory_mib, data) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "state = EXCLUDED.state, deleted = EXCLUDED.deleted, expire_at = EXCLUDED.expire_at, "
            "storage_pending = EXCLUDED.storage_pending, vcpus = EXCLUDED.vcpus, "
            "memory_mib = EXCLUDED.memory_mib, data = EXCLUDED.data",
            (
                workspace.id,
                workspace.seq,
                workspace.tenant,
                int(workspace.state),
                workspace.deleted,
                workspace.expiration.expire_time,
                workspace_storage_pending(workspace),
                workspace.resources.vcpus,
                workspace.resources.memory_mib,
                ENCODER.encode(workspace),
            ),
        )
        # A snapshot: callers keep mutating their record.
        snapshot = msgspec.structs.replace(workspace)
        self.changes.workspaces[workspace.id] = snapshot
        self.changes.workspace_history.append(snapshot)

    def put_command(self, command: Command) -> None:
        command.update_time = self.now
        self._conn.execute(
            "INSERT INTO commands (tenant, id, workspace_id, data) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (tenant, id) DO UPDATE SET data = EXCLUDED.data",
            (command.tenant, command.id, command.workspace_id, ENCODER.encode(command)),
        )
        self.changes.commands[command.key] = msgspec.structs.replace(command)

    def put_instance(self, instance: Instance) -> None:
        self._conn.execute(
            "INSERT INTO instances (id, workspace_id, node_id, unscheduled, reserved, vcpus, memory_mib, "
            "active, data) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "node_id = EXCLUDED.node_id, unscheduled = EXCLUDED.unscheduled, reserved = EXCLUDED.reserved, "
            "vcpus = EXCLUDED.vcpus, memory_mib = EXCLUDED.memory_mib, active = EXCLUDED.active, "
            "data = EXCLUDED.data",
            (
                instance.id,
                instance.workspace_id,
                instance.node_id,
                instance_unscheduled(instance),
                instance.reserved,
                instance.vcpus,
                instance.memory_mib,
                instance_active(instance),
                ENCODER.encode(instance),
            ),
        )
        self.changes.instances[instance.id] = msgspec.structs.replace(instance)

    def put_volume(self, volume: Volume) -> None:
        self._conn.execute(
            "INSERT INTO volumes (id, tenant, storage_pending, data) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET storage_pending = EXCLUDED.storage_pending, data = EXCLUDED.data",
            (volume.id, volume.tenant, volume.storage_pending, ENCODER.encode(volume)),
        )
        self.changes.volumes[volume.id] = msgspec.structs.replace(volume)

    def add_token(self, record: TokenRecord, digest: str) -> None:
        self._conn.execute(
            "INSERT INTO tokens (id, hash, tenant, role, create_time) VALUES (%s, %s, %s, %s, %s)",
            (record.id, digest, record.tenant, record.role.value, record.create_time),
        )

    def revoke_token(self, token_id: str) -> bool:
        cursor = self._conn.execute("UPDATE tokens SET revoked = TRUE WHERE id = %s AND NOT revoked", (token_id,))
        return cursor.rowcount > 0

    def add_event(self, event: Event) -> None:
        row = self._conn.execute(
            "INSERT INTO events (workspace_id, tenant, node_id, event_type, event_time, data) "
            "VALUES (%s, %s, %s, %s, %s, %s) RETURNING seq",
            (*event_columns(event), ENCODER.encode(event)),
        ).fetchone()
        assert row is not None
        event.seq = int(row[0])
        self.changes.events.append(event)

    # -- nodes (issue 13) -----------------------------------------------------------------------
    def put_node(self, node: NodeRecord) -> None:
        self._conn.execute(
            "INSERT INTO nodes (id, lease_expiry, data) VALUES (%s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET lease_expiry = EXCLUDED.lease_expiry, data = EXCLUDED.data",
            (node.id, node.lease_expiry, ENCODER.encode(node)),
        )
        self.changes.nodes[node.id] = msgspec.structs.replace(node)

    # -- end of nodes ---------------------------------------------------------------------------

    # -- the node link's certificates -----------------------------------------------------------
    def add_cluster_ca(self, ca: ClusterCa) -> bool:
        cursor = self._conn.execute(
            "INSERT INTO cluster_ca (id, cert_pem, key_pem, create_time) VALUES (1, %s, %s, %s) "
            "ON CONFLICT (id) DO NOTHING",
            (ca.cert_pem, ca.key_pem, ca.create_time),
        )
        return cursor.rowcount > 0

    def add_node_issuance(self, issuance: NodeIssuance) -> None:
        self._conn.execute(
            "INSERT INTO node_issuances (token_id, node_id, key_sha256, cert_pem, issue_time) "
            "VALUES (%s, %s, %s, %s, %s)",
            (issuance.token_id, issuance.node_id, issuance.key_sha256, issuance.cert_pem, issuance.issue_time),
        )


def _conditions(query: WorkspaceQuery) -> tuple[str, list[Any]]:
    """The query's filter as one SQL condition on a workspaces row, with its arguments."""
    where = ["TRUE"]
    args: list[Any] = []
    if not query.include_deleted:
        where.append("NOT deleted")
    for state, equal in query.states:
        where.append("state = %s" if equal else "state != %s")
        args.append(int(state))
    for key, value, equal in query.labels:
        # The same document SQLite stores; a missing label is "not equal" to any value.
        label = "(convert_from(data, 'UTF8')::jsonb -> 'labels' ->> %s)"
        where.append(f"{label} = %s" if equal else f"{label} IS DISTINCT FROM %s")
        args.extend((key, value))
    return " AND ".join(where), args


@dataclass
class _Job:
    fn: Callable[[Any], Any]  # given a Tx (writes) or a Reader (reads)
    future: asyncio.Future[Any]
    # The leader's fencing token, for a write of a leader-only loop (postgres_leader.py).
    fence: int | None = None


_STOP = object()
_Outcome = tuple[_Job, Any, BaseException | None]


class PostgresStore:
    """Store on one PostgreSQL database. Create with `await PostgresStore.open(dsn)`."""

    MAX_BATCH = 512

    def __init__(self, dsn: str, loop: asyncio.AbstractEventLoop, clock: Clock = SYSTEM_CLOCK) -> None:
        self.dsn = dsn
        self.where = describe(dsn)
        # Not the commits' time (the database's clock is, _commit_batch); kept for the Store API.
        self._clock = clock
        self._last_now = 0.0
        self._loop = loop
        self._listeners: list[Callable[[Changes], None]] = []
        self._commit_observers: list[CommitObserver] = []
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._read_queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._scan_queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._write_loop, name="kibo-store-write", daemon=True),
            threading.Thread(target=self._read_loop, args=(self._read_queue,), name="kibo-store-read", daemon=True),
            threading.Thread(target=self._read_loop, args=(self._scan_queue,), name="kibo-store-scan", daemon=True),
        ]
        self._closed = False
        # This replica's name in the change feed and the leader lease.
        self.replica = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._feed = Feed(self.replica, self._publish, 0)
        self._stop_listening = threading.Event()

    @classmethod
    async def open(cls, dsn: str, clock: Clock = SYSTEM_CLOCK) -> PostgresStore:
        store = cls(dsn, asyncio.get_running_loop(), clock)
        # Publishing starts at the newest commit: what came before is in the store to read.
        store._feed = Feed(store.replica, store._publish, await asyncio.to_thread(store._migrate))
        store._threads.append(
            threading.Thread(
                target=store._feed.listen,
                args=(dsn, store._loop, store._stop_listening, connect),
                name="kibo-store-feed",
                daemon=True,
            )
        )
        for thread in store._threads:
            thread.start()
        return store

    def _migrate(self) -> int:
        """Migrate; the newest commit in the change feed."""
        try:
            with connect(self.dsn) as conn:
                migrate(conn, self.where)
                return newest(conn)
        except psycopg.Error as error:
            failure = store_error(error)
            words = "" if failure.unavailable is None else f"{failure.unavailable.message} "
            raise StoreError(f"the store {self.where}: {words}({failure})", failure.unavailable) from error

    def subscribe(self, listener: Callable[[Changes], None]) -> None:
        self._listeners.append(listener)

    def observe_commits(self, observer: CommitObserver) -> None:
        self._commit_observers.append(observer)

    def published_mark(self) -> int | None:
        """Always None: another replica's commit is visible here before this replica
        publishes it, so what the listeners were told is never vouched to be what is stored
        (the API then reads records from the store, not from memory)."""
        return None

    def _publish(self, changes: Changes) -> None:
        for listener in self._listeners:
            listener(changes)

    def _submit(
        self, jobs: queue.SimpleQueue[_Job | object], fn: Callable[[Any], Any], fence: int | None = None
    ) -> asyncio.Future[Any]:
        if self._closed:
            raise RuntimeError("store is closed")
        future: asyncio.Future[Any] = self._loop.create_future()
        jobs.put(_Job(fn, future, fence))
        return future

    async def transact(self, fn: Callable[Concatenate[Tx, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        # Run in the caller's context (its trace, engine/trace.py) on the writer thread; a
        # leader-only loop's writes carry its fencing token.
        context = contextvars.copy_context()
        job = lambda on: context.run(fn, on, *args, **kwargs)  # noqa: E731
        result: T = await self._submit(self._queue, job, FENCE.get())
        return result

    async def locked(
        self, fn: Callable[Concatenate[psycopg.Connection[Any], P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`fn(connection, ...)` in the writer's next transaction, under the write lock: the
        leader lease (postgres_leader.py) changes hands only between whole batches."""
        result: T = await self._submit(self._queue, lambda tx: fn(tx.connection, *args, **kwargs))
        return result

    async def read(self, fn: Callable[Concatenate[Reader, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = await self._submit(self._read_queue, lambda on: fn(on, *args, **kwargs))
        return result

    async def scan(self, fn: Callable[Concatenate[Reader, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = await self._submit(self._scan_queue, lambda on: fn(on, *args, **kwargs))
        return result

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for jobs, thread in zip((self._queue, self._read_queue, self._scan_queue), self._threads, strict=False):
            jobs.put(_STOP)
            await asyncio.to_thread(thread.join)
        self._stop_listening.set()
        await asyncio.to_thread(self._threads[-1].join)

    def _read_loop(self, jobs: queue.SimpleQueue[_Job | object]) -> None:
        """Every read waiting runs in one REPEATABLE READ snapshot; one wake-up of the event
        loop answers them all (as SqliteStore._read_loop)."""
        connection = Connection(self.dsn)
        try:
            while True:
                batch, stop = _take(jobs, self.MAX_BATCH)
                if batch:
                    self._loop.call_soon_threadsafe(_settle_all, self._read_batch(connection, batch))
                if stop:
                    return
        finally:
            connection.drop()

    def _read_batch(self, connection: Connection, batch: list[_Job]) -> list[_Outcome]:
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        outcomes: list[_Outcome] = []
        try:
            conn = connection.begin(begin)
            for job in batch:
                try:
                    outcomes.append((job, job.fn(PostgresReader(conn)), None))
                except psycopg.Error as error:
                    # The snapshot is aborted: the rest of the batch reads in a new one.
                    outcomes.append((job, None, error))
                    conn.execute("ROLLBACK")
                    conn.execute(begin)
                except BaseException as error:
                    outcomes.append((job, None, error))
            conn.execute("COMMIT")
        except psycopg.Error as error:
            connection.drop()
            answered = {id(job) for job, _, _ in outcomes}
            outcomes += [(job, None, error) for job in batch if id(job) not in answered]
        return outcomes

    def _write_loop(self) -> None:
        connection = Connection(self.dsn)
        try:
            while True:
                batch, stop = _take(self._queue, self.MAX_BATCH)
                if batch:
                    self._commit_batch(connection, batch)
                if stop:
                    return
        finally:
            connection.drop()

    def _commit_batch(self, connection: Connection, batch: list[_Job]) -> None:
        started = time.perf_counter()
        took: float | None = None
        try:
            conn = connection.begin("BEGIN ISOLATION LEVEL READ COMMITTED")
            # The commit's time is the database's, read under the write lock: every replica
            # stamps with one clock (node leases compare across replicas), and commit times
            # never go back from one batch to the next, whichever replica writes.
            row = conn.execute(
                "SELECT pg_advisory_xact_lock(%s)::text, extract(epoch FROM clock_timestamp())::float8", (WRITE_LOCK,)
            ).fetchone()
            assert row is not None
            now = max(float(row[1]), self._last_now)
            self._last_now = now
            # Under the lock: no other replica can take the lease before this batch commits.
            leader = current(conn) if any(job.fence is not None for job in batch) else None
            outcomes, changes = _run_jobs(conn, batch, now, leader)
            entries = self._feed.record(conn, changes)
            conn.execute("COMMIT")
            took = time.perf_counter() - started
            self._feed.written(entries)
        except psycopg.Error as commit_error:
            # A failed COMMIT may or may not have committed: callers get UNAVAILABLE and retry
            # with the same command IDs, which answer idempotently either way.
            connection.drop()
            outcomes = [(job, None, commit_error) for job in batch]
            entries = []
        if took is not None:
            for observer in self._commit_observers:
                observer(took, len(batch))
        # One wake-up of the event loop per batch: publish first, so whoever learns of the
        # commit from an answer finds the hub (watchers, waiters, loops) already told.
        self._loop.call_soon_threadsafe(self._publish_and_settle, entries, outcomes)

    def _publish_and_settle(self, entries: list[Entry], outcomes: list[_Outcome]) -> None:
        try:
            self._feed.deliver(entries)
        finally:
            _settle_all(outcomes)


def _run_jobs(
    conn: psycopg.Connection[Any], batch: list[_Job], now: float, leader: int | None
) -> tuple[list[_Outcome], Changes]:
    """Each job in its own savepoint; a job that fails rolls back alone. A connection that
    breaks fails the whole batch (raised). A fenced job of a deposed leader is refused."""
    outcomes: list[_Outcome] = []
    changes = Changes()
    # Pipeline mode: a statement whose result nobody reads (the writes, the savepoints) goes
    # out without waiting for its answer; each job ends with a sync, so an error is raised
    # inside the job that caused it. (A round trip per statement halved the rate on a busy
    # machine, where every round trip waits for two processes to be scheduled.)
    with conn.pipeline() as pipeline:
        for job in batch:
            if job.fence is not None and job.fence != leader:
                outcomes.append((job, None, deposed(job.fence)))
                continue
            for attempt in (1, 2):
                tx = PostgresTx(conn, now)
                conn.execute("SAVEPOINT job")
                try:
                    result = job.fn(tx)
                    pipeline.sync()
                except BaseException as error:
                    # The job's statements still in flight, with their own errors: out of the way.
                    with contextlib.suppress(psycopg.Error):
                        pipeline.sync()
                    if conn.broken:
                        raise
                    conn.execute("ROLLBACK TO SAVEPOINT job")
                    conn.execute("RELEASE SAVEPOINT job")
                    pipeline.sync()
                    if attempt == 1 and isinstance(error, _RERUN):
                        continue
                    outcomes.append((job, None, error))
                else:
                    conn.execute("RELEASE SAVEPOINT job")
                    outcomes.append((job, result, None))
                    changes.merge(tx.changes)
                break
    return outcomes, changes


def _take(jobs: queue.SimpleQueue[_Job | object], limit: int) -> tuple[list[_Job], bool]:
    """Block for one job, then take every job waiting (up to `limit`); True once told to stop."""
    first = jobs.get()
    if first is _STOP:
        return [], True
    assert isinstance(first, _Job)
    batch = [first]
    while len(batch) < limit:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            break
        if job is _STOP:
            return batch, True
        assert isinstance(job, _Job)
        batch.append(job)
    return batch, False


def _settle_all(outcomes: list[_Outcome]) -> None:
    for job, result, error in outcomes:
        if job.future.done():
            continue
        if isinstance(error, psycopg.Error):
            job.future.set_exception(store_error(error))
        elif error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)
