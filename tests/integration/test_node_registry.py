"""The node registry's feed and leases, in process on a real store: a cursor continues
where it stood; a cursor of another incarnation, or one the log no longer reaches, gets a
snapshot; a lease that runs out makes the node silent, and a renewal brings it back (which,
unlike the silence, tells the scheduler there may be room). A join is held to the operator's
policy (capacity, pools), and a volume's release is taken from the node that holds it only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kibo_ctrl.domain.errors import Conflict, InvalidArgument, NotFound
from kibo_ctrl.domain.model import Instance, Node, Volume, VolumeState
from kibo_ctrl.engine import node_registry
from kibo_ctrl.engine.node_link import Batch, Cursor, Declaration, InstanceWork, VolumeWork
from kibo_ctrl.engine.node_registry import NodePolicy, NodeRegistry
from kibo_ctrl.store.base import Changes
from kibo_ctrl.store.sqlite import SqliteStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(tmp_path / "kibo.db")
    yield opened
    await opened.close()


def instance(number: int, node_id: str = "node-1", step: int = 1) -> Instance:
    return Instance(f"ws-{number}-g1", f"ws-{number}", 1, 1, 128, 0.0, step=step, node_id=node_id)


async def next_batch(feed: AsyncIterator[Batch]) -> Batch:
    return await asyncio.wait_for(anext(feed), 5)


async def joined(store: SqliteStore, lease: float = 60.0) -> NodeRegistry:
    registry = NodeRegistry(store, lease)
    await registry.load()
    await registry.join(Declaration(Node("node-1", 8, 8192, "local")))
    return registry


async def test_a_feed_resumes_after_its_cursor_and_a_foreign_cursor_gets_a_snapshot(store: SqliteStore) -> None:
    registry = await joined(store)
    feed = registry.feed("node-1", None)
    first = await next_batch(feed)
    assert first.snapshot and first.items == ()
    registry.on_changes(Changes(instances={"a": instance(1)}))
    registry.on_changes(Changes(instances={"b": instance(2), "c": instance(3, node_id="node-2")}))
    second = await next_batch(feed)
    assert not second.snapshot
    assert [i.instance.id for i in second.items if isinstance(i, InstanceWork)] == ["ws-1-g1", "ws-2-g1"]
    await feed.aclose()

    # Resumed from the first batch's cursor: exactly what came after it, no snapshot.
    resumed = registry.feed("node-1", first.cursor)
    again = await next_batch(resumed)
    assert not again.snapshot and again.items == second.items
    await resumed.aclose()
    # Resumed from the last cursor: nothing is repeated; the next item comes when it is made.
    latest = registry.feed("node-1", second.cursor)
    registry.on_changes(Changes(instances={"d": instance(1, step=2)}))
    (item,) = (await next_batch(latest)).items
    assert isinstance(item, InstanceWork) and item.instance.step == 2
    await latest.aclose()

    # Another incarnation's cursor, or one from the future: a snapshot from the store.
    for cursor in (Cursor("another-epoch", 1), Cursor(registry.epoch, 10_000)):
        snapshot_feed = registry.feed("node-1", cursor)
        assert (await next_batch(snapshot_feed)).snapshot
        await snapshot_feed.aclose()


async def test_a_cursor_older_than_the_log_gets_a_snapshot(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_registry, "FEED_LOG", 4)
    registry = await joined(store)
    feed = registry.feed("node-1", None)
    start = (await next_batch(feed)).cursor
    await feed.aclose()
    for number in range(10):
        registry.on_changes(Changes(instances={str(number): instance(number)}))
    behind = registry.feed("node-1", start)
    assert (await next_batch(behind)).snapshot
    await behind.aclose()


async def test_calls_before_joining_and_bad_declarations_are_refused(store: SqliteStore) -> None:
    registry = NodeRegistry(store, 60.0)
    await registry.load()
    with pytest.raises(Conflict):
        await registry.renew("node-9")
    with pytest.raises(Conflict):
        await anext(registry.feed("node-9", None))
    for node, field in ((Node("Bad Id", 8, 8192, "local"), "node_id"), (Node("node-9", 0, 8192, "local"), "vcpus")):
        with pytest.raises(InvalidArgument) as refused:
            await registry.join(Declaration(node))
        assert refused.value.field == field
    assert await store.read(lambda r: r.list_nodes()) == []


async def test_a_lease_that_runs_out_makes_the_node_silent_and_a_renewal_brings_it_back(store: SqliteStore) -> None:
    registry = await joined(store, lease=0.2)
    store.subscribe(registry.on_changes)  # as the hub does in app.py
    room: list[None] = []
    registry.on_room(lambda: room.append(None))
    loop = asyncio.create_task(registry.run())
    try:

        async def silent() -> bool:
            record = await store.read(lambda r: r.get_node("node-1"))
            return record is not None and record.silent

        deadline = asyncio.get_running_loop().time() + 5
        while not await silent():
            assert asyncio.get_running_loop().time() < deadline, "the lease never ran out"
            await asyncio.sleep(0.02)
        # A node falling silent takes nothing new: the scheduler is not woken for it.
        assert not room
        await registry.renew("node-1")
        record = await store.read(lambda r: r.get_node("node-1"))
        assert record is not None and not record.silent and record.ready
        assert room  # back: it may take instances again
    finally:
        registry.close()
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_a_join_claiming_more_than_the_policy_allows_is_refused(store: SqliteStore) -> None:
    policy = NodePolicy(max_vcpus=64, max_memory_mib=65536, embedded=frozenset({"node-0"}))
    registry = NodeRegistry(store, 60.0, policy=policy)
    await registry.load()
    for node, field, limit in (
        (Node("node-1", 65, 8192, "local"), "vcpus", "at most 64"),
        (Node("node-1", 8, 65537, "local"), "memory_mib", "at most 65536 MiB"),
    ):
        with pytest.raises(InvalidArgument) as refused:
            await registry.join(Declaration(node))
        assert refused.value.field == field and limit in refused.value.message
    assert await store.read(lambda r: r.list_nodes()) == []
    await registry.join(Declaration(Node("node-1", 64, 65536, "local")))  # at the limit: taken
    # The control plane's embedded node offers what its operator configured: not a claim.
    await registry.join(Declaration(Node("node-0", 128, 131072, "local")))


async def test_a_pool_is_bound_to_its_node_unless_shared(store: SqliteStore) -> None:
    registry = NodeRegistry(store, 60.0, policy=NodePolicy(shared_pools=frozenset({"local", "nfs"})))
    await registry.load()
    await registry.join(Declaration(Node("node-1", 8, 8192, "ssd-1")))
    before = await store.read(lambda r: r.list_nodes())
    # Another node may not declare itself into node-1's pool; node-1 may not move to another.
    for node in (Node("node-2", 8, 8192, "ssd-1"), Node("node-1", 8, 8192, "local")):
        with pytest.raises(Conflict) as refused:
            await registry.join(Declaration(node))
        assert refused.value.field == "storage_pool"
    assert await store.read(lambda r: r.list_nodes()) == before
    # Shared pools take any number of nodes; a node rejoining with its own pool is fine.
    for name in ("node-2", "node-3"):
        await registry.join(Declaration(Node(name, 8, 8192, "local")))
        await registry.join(Declaration(Node(f"{name}-nfs", 8, 8192, "nfs")))
    await registry.join(Declaration(Node("node-1", 16, 8192, "ssd-1")))


async def test_a_node_releases_only_the_volumes_routed_to_it(store: SqliteStore) -> None:
    """n2 shares n1's pool; the volume's release is n1's (the pool's first node): n2's report
    answers as for a volume that does not exist and leaves the volume pending."""
    registry = NodeRegistry(store, 60.0)
    await registry.load()
    store.subscribe(registry.on_changes)
    for node in ("n1", "n2"):
        await registry.join(Declaration(Node(node, 8, 8192, "local")))
    pending = Volume("vol-00000000000000000001", "local", 1, VolumeState.DELETED, 0.0, storage_pending=True)
    await store.transact(lambda tx: tx.put_volume(pending))
    answers = []
    for volume_id in (pending.id, "vol-00000000000000000002"):
        with pytest.raises(NotFound) as refused:
            await registry.volume_released("n2", volume_id)
        answers.append((refused.value.message.replace(volume_id, "ID"), refused.value.field, refused.value.hint))
    assert answers[0] == answers[1]
    assert await store.read(lambda r: r.get_volume(pending.id)) == pending
    await registry.volume_released("n1", pending.id)
    released = await store.read(lambda r: r.get_volume(pending.id))
    assert released is not None and not released.storage_pending
    await registry.volume_released("n1", pending.id)  # a repeat: harmless


async def test_a_volume_on_a_nodes_disk_is_released_by_that_node_only(store: SqliteStore) -> None:
    """A deleted volume whose files are on n2 (its storage_node) goes to n2's feed, not to the
    pool's first node n1, and only n2's report releases it: routing and check agree."""
    registry = NodeRegistry(store, 60.0)
    await registry.load()
    store.subscribe(registry.on_changes)
    for node in ("n1", "n2"):
        await registry.join(Declaration(Node(node, 8, 8192, "local")))
    on_n2 = Volume(
        "vol-00000000000000000003", "local", 1, VolumeState.DELETED, 0.0, storage_pending=True, storage_node="n2"
    )
    feeds = {node: registry.feed(node, None) for node in ("n1", "n2")}
    for feed in feeds.values():
        assert (await next_batch(feed)).snapshot
    await store.transact(lambda tx: tx.put_volume(on_n2))
    # Live, from the commit: only n2's feed gets it (n1's gets nothing, so it has no batch).
    (item,) = (await next_batch(feeds["n2"])).items
    assert isinstance(item, VolumeWork) and item.volume_id == on_n2.id
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(feeds["n1"]), 0.2)
    for feed in feeds.values():
        await feed.aclose()
    # And in a snapshot (a node that reconnects).
    fed = {}
    for node in ("n1", "n2"):
        feed = registry.feed(node, None)
        fed[node] = [i.volume_id for i in (await next_batch(feed)).items if isinstance(i, VolumeWork)]
        await feed.aclose()
    assert fed == {"n1": [], "n2": [on_n2.id]}
    with pytest.raises(NotFound):
        await registry.volume_released("n1", on_n2.id)
    assert await store.read(lambda r: r.get_volume(on_n2.id)) == on_n2
    await registry.volume_released("n2", on_n2.id)
    released = await store.read(lambda r: r.get_volume(on_n2.id))
    assert released is not None and not released.storage_pending
