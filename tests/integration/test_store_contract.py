"""The store protocols (store/base.py), checked the same way on both adapters: the embedded
SQLite and PostgreSQL (a throwaway server, tests/postgres.py). What a caller may rely on:
an answer only after COMMIT, a failing job rolled back alone, one workspace per command ID
even when two store instances race on one database, bounded scans, migrations."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.app import open_store
from kibo_ctrl.domain.access import Role, TokenRecord
from kibo_ctrl.domain.errors import StoreError, Unavailable
from kibo_ctrl.domain.model import WorkspaceState
from kibo_ctrl.domain.nodes import NodeRecord
from kibo_ctrl.store import migrations as sqlite_migrations
from kibo_ctrl.store import postgres_migrations
from kibo_ctrl.store.base import Changes, Store, Tx, WorkspaceQuery
from kibo_ctrl.store.postgres import PostgresStore
from kibo_ctrl.store.postgres_leader import FENCE, acquire, lead, renew
from kibo_ctrl.transport.errors import status_of

from tests.postgres import Databases, LocalPostgres
from tests.server import free_port
from tests.unit.engine_harness import Engine

STORES = ("sqlite", "postgresql")


class Place:
    """Where one test's database lives; `open()` gives another store instance on it."""

    def __init__(self, kind: str, tmp_path: Path, databases: Callable[[], Databases]) -> None:
        self.kind = kind
        self.data_dir = tmp_path / "data"
        self.url = databases().create() if kind == "postgresql" else ""
        self.opened: list[Store] = []

    async def open(self) -> Store:
        store = await open_store(self.url, self.data_dir)
        self.opened.append(store)
        return store

    def raw_count(self, table: str) -> int:
        """Rows committed, read on a connection of its own (not the store's)."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.data_dir / "kibo.db") as conn:
                return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        with psycopg.connect(self.url) as conn:
            row = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
            assert row is not None
            return int(row[0])

    def set_schema_version(self, version: int) -> None:
        if self.kind == "sqlite":
            with sqlite3.connect(self.data_dir / "kibo.db") as conn:
                conn.execute(f"PRAGMA user_version = {version}")
        else:
            with psycopg.connect(self.url) as conn:
                conn.execute("UPDATE kibo_schema_version SET version = %s", (version,))


@pytest.fixture(params=STORES)
async def place(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Place]:
    result = Place(request.param, tmp_path, lambda: request.getfixturevalue("postgres_databases"))
    yield result
    for store in result.opened:
        await store.close()


def _create_message(command_id: str, labels: dict[str, str] | None = None) -> ws.CreateWorkspaceRequest:
    message = ws.CreateWorkspaceRequest()
    message.metadata.command_id = command_id
    message.spec.labels.update(labels or {})
    return message


def _token(hash_suffix: str) -> tuple[TokenRecord, str]:
    return TokenRecord(f"tok-{uuid.uuid4().hex[:12]}", "default", Role.READER, 1.0, False), f"hash-{hash_suffix}"


def _add_token(tx: Tx, record: TokenRecord, digest: str) -> str:
    tx.add_token(record, digest)
    return record.id


async def _until(done: Callable[[], bool], within: float = 10.0) -> None:
    """Poll `done` until it holds or `within` seconds passed (the asserts after it then tell)."""
    deadline = asyncio.get_running_loop().time() + within
    for _ in itertools.count():
        if done() or asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.05)


async def _held_writer(store: Store) -> tuple[threading.Event, Awaitable[Any]]:
    """A first transaction that holds the writer until released, so the jobs queued behind it
    run as one batch (group commit)."""
    release = threading.Event()
    started = threading.Event()

    def hold(tx: Tx) -> None:
        started.set()
        release.wait(10)

    holding = asyncio.ensure_future(store.transact(hold))
    await asyncio.to_thread(started.wait, 10)
    return release, holding


async def test_an_answer_comes_only_after_commit_and_after_the_listeners(place: Place) -> None:
    """A caller told "done" finds its write on any other connection, and the hub already told."""
    store = await place.open()
    seen: list[Changes] = []
    store.subscribe(seen.append)
    release, holding = await _held_writer(store)
    record, digest = _token("commit")
    pending = asyncio.ensure_future(store.transact(_add_token, record, digest))
    await asyncio.sleep(0.2)
    # Written nowhere yet, and not answered: the writer is still inside the batch before it.
    assert not pending.done() and place.raw_count("tokens") == 0
    release.set()
    await holding
    engine = Engine(store)  # type: ignore[arg-type]
    _, command = await engine.create(f"c-{uuid.uuid4().hex}")
    assert await pending == record.id
    assert place.raw_count("tokens") == 1 and place.raw_count("commands") == 1
    assert any(command.key in changes.commands for changes in seen)


async def test_a_failing_job_rolls_back_alone_in_its_batch(place: Place) -> None:
    """Three jobs in one commit: the one that raises (a domain error after a write, or a
    database error: a duplicate token hash) leaves nothing; its neighbours commit."""
    store = await place.open()
    batches: list[int] = []
    store.observe_commits(lambda seconds, jobs: batches.append(jobs))
    first, dup = _token("first"), _token("first")
    await store.transact(_add_token, *first)

    def write_then_fail(tx: Tx) -> None:
        tx.add_token(*_token("rolled-back"))
        raise ValueError("the job's own error")

    release, holding = await _held_writer(store)
    good_a = asyncio.ensure_future(store.transact(_add_token, *_token("a")))
    failing = asyncio.ensure_future(store.transact(write_then_fail))
    duplicate = asyncio.ensure_future(store.transact(_add_token, *dup))
    good_b = asyncio.ensure_future(store.transact(_add_token, *_token("b")))
    await asyncio.sleep(0.1)
    release.set()
    await holding
    results = await asyncio.gather(good_a, failing, duplicate, good_b, return_exceptions=True)
    assert isinstance(results[0], str) and isinstance(results[3], str)
    assert isinstance(results[1], ValueError)
    # A unique key broken twice (the job is run once more) is a bug, not a passing condition.
    assert isinstance(results[2], StoreError) and results[2].unavailable is None
    assert status_of(results[2])[0] is grpc.StatusCode.INTERNAL
    assert max(batches) >= 4, batches
    digests = {r.id for r in await store.read(lambda r: r.list_tokens())}
    assert digests == {first[0].id, results[0], results[3]}
    assert place.raw_count("tokens") == 3


async def test_a_failing_job_alone_in_its_commit_leaves_nothing_and_the_writer_goes_on(place: Place) -> None:
    """A batch of one (SQLite runs it without a savepoint): its write is rolled back with it,
    it is answered with its own error, no commit is counted, and the next job commits."""
    store = await place.open()
    batches: list[int] = []
    store.observe_commits(lambda seconds, jobs: batches.append(jobs))

    def write_then_fail(tx: Tx) -> None:
        tx.add_token(*_token("rolled-back"))
        raise ValueError("the job's own error")

    with pytest.raises(ValueError, match="own error"):
        await store.transact(write_then_fail)
    assert place.raw_count("tokens") == 0
    record, digest = _token("after")
    assert await store.transact(_add_token, record, digest) == record.id
    assert place.raw_count("tokens") == 1
    assert batches and all(jobs == 1 for jobs in batches)


async def test_one_command_id_raced_from_two_stores_makes_one_workspace(place: Place) -> None:
    """Two store instances on one database (two replicas) get the same CreateWorkspace at
    once, many times: one workspace per command ID, and both answer it."""
    one, two = Engine(await place.open()), Engine(await place.open())  # type: ignore[arg-type]
    ids = [f"race-{uuid.uuid4().hex}" for _ in range(20)]
    answers = await asyncio.gather(*(e.create(i) for i in ids for e in (one, two)))
    for index in range(0, len(answers), 2):
        (first, first_command), (second, second_command) = answers[index], answers[index + 1]
        assert first.id == second.id and first_command.id == second_command.id
    assert place.raw_count("workspaces") == len(ids) and place.raw_count("commands") == len(ids)
    seqs = [w.seq for w, _ in answers]
    assert len(set(seqs)) == len(ids)


async def test_one_delete_raced_from_two_stores_runs_once(place: Place) -> None:
    """The same DeleteWorkspace reaches two replicas at once: it runs once (the events of one
    delete, not two), and both answer the same command."""
    one, two = Engine(await place.open()), Engine(await place.open())  # type: ignore[arg-type]
    made = [(await one.create(f"d-{uuid.uuid4().hex}"))[0].id for _ in range(9)]

    def delete(engine: Engine, workspace_id: str, command_id: str) -> Awaitable[Any]:
        message = ws.DeleteWorkspaceRequest(workspace_id=workspace_id)
        message.metadata.command_id = command_id
        return engine.command("DeleteWorkspace", message)

    reference, raced = made[0], made[1:]
    await delete(one, reference, f"del-{uuid.uuid4().hex}")
    once = len(await one.store.read(lambda r: r.list_events(reference, 0, 1000)))
    for workspace_id in raced:
        command_id = f"del-{uuid.uuid4().hex}"
        (_, first), (_, second) = await asyncio.gather(
            delete(one, workspace_id, command_id), delete(two, workspace_id, command_id)
        )
        assert first.id == second.id == command_id
    for workspace_id in raced:
        events = await two.store.read(lambda r, w=workspace_id: r.list_events(w, 0, 1000))
        assert len(events) == once, events


async def test_scans_are_bounded_and_filtered(place: Place) -> None:
    store = await place.open()
    engine = Engine(store)  # type: ignore[arg-type]
    made = [await engine.create(f"scan-{i}-{uuid.uuid4().hex}") for i in range(9)]
    for index, (workspace, _) in enumerate(made):
        labels = {"parity": "even" if index % 2 == 0 else "odd"} if index < 8 else {}

        def label(tx: Tx, workspace_id: str = workspace.id, labels: dict[str, str] = labels) -> None:
            record = tx.get_workspace(workspace_id)
            assert record is not None
            record.labels = labels
            tx.put_workspace(record)

        await store.transact(label)
    other = Engine(store)  # type: ignore[arg-type]
    await other.command("CreateWorkspace", _create_message(f"other-{uuid.uuid4().hex}"), tenant="other")
    seqs = [w.seq for w, _ in made]

    def scan(query: WorkspaceQuery, max_rows: int, want: int) -> Any:
        return store.scan(lambda r: r.scan_workspaces(query, max_rows, want))

    everything = await scan(WorkspaceQuery("default"), 100, 100)
    assert [w.seq for w in everything.workspaces] == seqs and everything.exhausted
    # A row's ID and version, read without decoding its record, are the record's.
    records = [w.record() for w in everything.workspaces]
    assert [(w.id, w.version) for w in everything.workspaces] == [(r.id, r.version) for r in records]
    assert all(r.version > 0 for r in records)
    # max_rows bounds the rows read whatever matches: 4 rows, 2 of them even.
    even = (("parity", "even", True),)
    page = await scan(WorkspaceQuery("default", labels=even), 4, 100)
    assert [w.seq for w in page.workspaces] == seqs[0:4:2] and page.last_seq == seqs[3] and not page.exhausted
    # want stops at the match: the next page starts right after it.
    page = await scan(WorkspaceQuery("default", labels=even), 100, 1)
    assert [w.seq for w in page.workspaces] == [seqs[0]] and page.last_seq == seqs[0] and not page.exhausted
    rest = await scan(WorkspaceQuery("default", after_seq=page.last_seq, labels=even), 100, 100)
    assert [w.seq for w in rest.workspaces] == seqs[2:8:2] and rest.exhausted
    # A missing label is "not equal" to any value.
    not_even = await scan(WorkspaceQuery("default", labels=(("parity", "even", False),)), 100, 100)
    assert [w.seq for w in not_even.workspaces] == [*seqs[1:8:2], seqs[8]]
    state = made[0][0].state
    assert (await scan(WorkspaceQuery("default", states=((state, False),)), 100, 100)).workspaces == []
    assert len((await scan(WorkspaceQuery("default", states=((state, True),)), 100, 100)).workspaces) == 9
    empty = await scan(WorkspaceQuery("default", after_seq=seqs[-1]), 100, 100)
    assert empty.workspaces == [] and empty.last_seq == 0 and empty.exhausted
    assert [w.record().tenant for w in (await scan(WorkspaceQuery("other"), 100, 100)).workspaces] == ["other"]
    counts = dict(((t, s), n) for t, s, n in await store.read(lambda r: r.workspace_counts()))
    assert counts[("default", state)] == 9 and sum(counts.values()) == 10
    assert state in WorkspaceState


async def test_migrations_build_the_schema_and_a_newer_database_is_refused(place: Place) -> None:
    store = await place.open()
    assert await store.read(lambda r: r.integrity_check()) == "ok"
    await store.close()
    place.opened.clear()
    # Opening again migrates nothing and keeps what is there.
    again = await place.open()
    record, digest = _token("kept")
    await again.transact(_add_token, record, digest)
    await again.close()
    place.opened.clear()
    newest = len(sqlite_migrations.MIGRATIONS if place.kind == "sqlite" else postgres_migrations.MIGRATIONS)
    place.set_schema_version(newest + 1)
    with pytest.raises(RuntimeError, match=f"schema version {newest + 1}, newer than this kibo"):
        await place.open()


async def test_an_unreachable_postgresql_is_unavailable_with_the_reason() -> None:
    """Nothing listens at the address: refused at start with words an operator can act on."""
    url = f"postgresql://kibo@127.0.0.1:{free_port()}/kibo"
    with pytest.raises(StoreError) as caught:
        await PostgresStore.open(url)
    error = caught.value
    assert error.unavailable is not None
    assert "cannot be reached" in error.unavailable.message and "127.0.0.1" in str(error)
    code, details = status_of(error)
    assert code is grpc.StatusCode.UNAVAILABLE and "retry later" in details.message


async def test_a_postgresql_that_goes_away_is_unavailable_then_the_store_recovers() -> None:
    """The server stops under a running store: its calls answer UNAVAILABLE (not INTERNAL),
    and once the server is back the same store works again, with nothing lost."""
    server = LocalPostgres.start()
    store: Store | None = None
    try:
        store = await PostgresStore.open(server.dsn)
        kept, kept_digest = _token("before")
        await store.transact(_add_token, kept, kept_digest)
        await asyncio.to_thread(server.halt)
        for call in (
            store.transact(_add_token, *_token("during")),
            store.read(lambda r: r.list_tokens()),
            store.scan(lambda r: r.count_workspaces()),
        ):
            with pytest.raises(StoreError) as caught:
                await call
            code, details = status_of(caught.value)
            assert code is grpc.StatusCode.UNAVAILABLE, details.message
            assert "PostgreSQL cannot be reached or the connection was lost" in details.message
        await asyncio.to_thread(server.resume)
        after, after_digest = _token("after")
        await store.transact(_add_token, after, after_digest)
        ids = {r.id for r in await store.read(lambda r: r.list_tokens())}
        assert ids == {kept.id, after.id}
    finally:
        if store is not None:
            await store.close()
        await asyncio.to_thread(server.stop)


async def test_every_replica_publishes_every_commit_in_order(postgres_databases: Databases) -> None:
    """Three store instances on one database (three replicas) write at once: each publishes
    every workspace change, its own and the others', in commit order, none missing, none twice."""
    url = postgres_databases.create()
    stores = [await PostgresStore.open(url) for _ in range(3)]
    try:
        published: list[list[tuple[str, int]]] = [[] for _ in stores]
        for store, seen in zip(stores, published, strict=True):
            store.subscribe(lambda c, seen=seen: seen.extend((w.id, w.version) for w in c.workspace_history))
        engines = [Engine(store) for store in stores]  # type: ignore[arg-type]
        made = await asyncio.gather(*(e.create(f"feed-{uuid.uuid4().hex}") for e in engines for _ in range(15)))
        ids = [w.id for w, _ in made]

        def relabel(tx: Tx, workspace_id: str) -> None:
            record = tx.get_workspace(workspace_id)
            assert record is not None
            record.labels = {"round": str(record.version)}
            tx.put_workspace(record)

        await asyncio.gather(*(stores[i % 3].transact(relabel, w) for i, w in enumerate(ids) for _ in range(2)))
        changes = 45 * 3  # a create and two relabels of each workspace
        await _until(lambda: all(len(s) >= changes for s in published))
        # Every replica saw the same changes in the same order: the commit order.
        assert published[0] == published[1] == published[2]
        assert len(published[0]) == len(set(published[0])) == changes
        for workspace_id in ids:
            versions = [v for w, v in published[0] if w == workspace_id]
            assert versions == sorted(versions) and len(versions) == 3
    finally:
        for store in stores:
            await store.close()


async def _fenced_transact(store: Store, token: int, fn: Callable[..., Any], *args: Any) -> Any:
    """A write of a leader-only loop: its task carries the leader's fencing token."""

    async def run() -> Any:
        FENCE.set(token)
        return await store.transact(fn, *args)

    return await asyncio.create_task(run())


async def test_a_deposed_leaders_late_writes_are_refused(postgres_databases: Databases) -> None:
    """Replica A leads, is cut off long enough for its lease to run out, and B takes over: A's
    leader-only writes are refused from then on (its commands from clients are not)."""
    url = postgres_databases.create()
    a, b = await PostgresStore.open(url), await PostgresStore.open(url)
    try:
        token_a = await a.locked(acquire, a.replica, 30.0)
        assert token_a is not None
        assert isinstance(await _fenced_transact(a, token_a, _add_token, *_token("a-leads")), str)
        assert await b.locked(acquire, b.replica, 30.0) is None  # a live lease is not taken
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE kibo_leader SET expires_at = now() - interval '1 second'")
        token_b = await b.locked(acquire, b.replica, 30.0)
        assert token_b == token_a + 1
        late, late_digest = _token("a-late")
        with pytest.raises(Unavailable, match="no longer the leader"):
            await _fenced_transact(a, token_a, _add_token, late, late_digest)
        assert isinstance(await _fenced_transact(b, token_b, _add_token, *_token("b-leads")), str)
        assert isinstance(await a.transact(_add_token, *_token("a-client")), str)
        ids = {r.id for r in await b.read(lambda r: r.list_tokens())}
        assert late.id not in ids and len(ids) == 3
        assert not await a.locked(renew, a.replica, token_a, 30.0)
    finally:
        await a.close()
        await b.close()


async def test_a_leader_whose_lease_is_taken_stops_its_loops(postgres_databases: Databases) -> None:
    url = postgres_databases.create()
    store = await PostgresStore.open(url)
    deposed = asyncio.Event()
    writes: list[str] = []

    async def loop() -> None:
        while True:
            writes.append(await store.transact(_add_token, *_token(uuid.uuid4().hex)))
            await asyncio.sleep(0.05)

    leading = asyncio.create_task(lead(store, lambda: [loop()], deposed.set, lease_s=0.4))
    try:
        await _until(lambda: len(writes) >= 3)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE kibo_leader SET holder = 'another replica', token = token + 1")
        await asyncio.wait_for(deposed.wait(), 5)
        await leading
        stopped_at = len(writes)
        await asyncio.sleep(0.3)
        assert len(writes) == stopped_at  # its loop no longer runs
    finally:
        leading.cancel()
        await store.close()


async def test_a_replica_that_only_reads_publishes_the_others_commits(postgres_databases: Databases) -> None:
    """Its writer never runs, so only the feed's listener (LISTEN/NOTIFY, then a read by
    sequence) tells it: it still publishes every commit of the other, in order, within a poll."""
    url = postgres_databases.create()
    writer, reader = await PostgresStore.open(url), await PostgresStore.open(url)
    try:
        heard: list[str] = []
        reader.subscribe(lambda changes: heard.extend(e.command_id for e in changes.events))
        engine = Engine(writer)  # type: ignore[arg-type]
        ids = [f"quiet-{uuid.uuid4().hex}" for _ in range(10)]
        for command_id in ids:
            await engine.create(command_id)
        await _until(lambda: set(ids) <= set(heard), within=5)
        # Each create's events (several per command), in commit order.
        assert list(dict.fromkeys(c for c in heard if c.startswith("quiet-"))) == ids
    finally:
        await writer.close()
        await reader.close()


async def test_a_job_that_raises_after_a_failed_write_rolls_back_alone(place: Place) -> None:
    """A database error the job never looked at (a duplicate key), then its own exception:
    the job fails with its own error and its neighbours commit."""
    store = await place.open()
    taken = _token("taken")
    await store.transact(_add_token, *taken)

    def collide_then_raise(tx: Tx) -> None:
        with contextlib.suppress(StoreError, sqlite3.Error, psycopg.Error):
            tx.add_token(*_token("taken"))
        raise LookupError("the job's own error")

    release, holding = await _held_writer(store)
    before = asyncio.ensure_future(store.transact(_add_token, *_token("before")))
    failing = asyncio.ensure_future(store.transact(collide_then_raise))
    after = asyncio.ensure_future(store.transact(_add_token, *_token("after")))
    await asyncio.sleep(0.1)
    release.set()
    await holding
    results = await asyncio.gather(before, failing, after, return_exceptions=True)
    assert isinstance(results[0], str) and isinstance(results[1], LookupError) and isinstance(results[2], str)
    assert place.raw_count("tokens") == 3


async def test_nodes_are_stored_updated_and_listed_by_id(place: Place) -> None:
    """The node registry's table (SQLite's migration 4, PostgreSQL's 3): a put inserts or
    replaces the whole record, reads on another store instance see it, listed by ID."""
    one = await place.open()
    beta = NodeRecord("node-b", 4, 4096, "local", labels={"zone": "b"}, lease_expiry=10.0)
    alpha = NodeRecord("node-a", 2, 2048, "local-a", capabilities=["workspace.stop.force"], lease_expiry=5.0)
    await one.transact(lambda tx: (tx.put_node(beta), tx.put_node(alpha)))
    beta.cordoned, beta.draining, beta.silent, beta.lease_expiry = True, True, True, 20.0
    await one.transact(lambda tx: tx.put_node(beta))
    two = await place.open()
    assert await two.read(lambda r: r.get_node("node-b")) == beta
    assert await two.read(lambda r: r.get_node("node-c")) is None
    assert await two.read(lambda r: r.list_nodes()) == [alpha, beta]
    assert place.raw_count("nodes") == 2


async def test_unscheduled_besides_sees_only_other_waiting_instances(place: Place) -> None:
    """What a create asks before placing its own instance at once (engine/placement.py)."""
    engine = Engine(await place.open())  # type: ignore[arg-type]
    first, _ = await engine.create(f"first-{uuid.uuid4().hex}")
    assert first.instance_id is not None
    assert not await engine.store.read(lambda r: r.unscheduled_besides(first.instance_id or ""))
    second, _ = await engine.create(f"second-{uuid.uuid4().hex}")
    assert await engine.store.read(lambda r: r.unscheduled_besides(second.instance_id or ""))
    assert await engine.store.read(lambda r: r.unscheduled_besides(first.instance_id or ""))
