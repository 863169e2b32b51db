"""The node registry with several replicas on one PostgreSQL database: a node may join on
one replica and renew or read its feed through another. The leader (the only replica that
expires leases) must take a lease stored by another replica as the truth, learn of nodes
that joined elsewhere, and still make a node that stopped renewing everywhere silent."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest
from kibo_ctrl.domain.model import Instance, Node
from kibo_ctrl.engine.node_link import Batch, Declaration, InstanceWork
from kibo_ctrl.engine.node_registry import NodeRegistry
from kibo_ctrl.store.base import Tx
from kibo_ctrl.store.postgres import PostgresStore

from tests.postgres import Databases

LEASE_S = 1.0


async def _until(done: Callable[[], object], within: float) -> bool:
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        if await done() if asyncio.iscoroutinefunction(done) else done():
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.fixture
async def replicas(postgres_databases: Databases) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    url = postgres_databases.create()
    one, two = await PostgresStore.open(url), await PostgresStore.open(url)
    yield one, two
    await one.close()
    await two.close()


async def _registry(store: PostgresStore) -> NodeRegistry:
    registry = NodeRegistry(store, LEASE_S)
    store.subscribe(registry.on_changes)
    await registry.load()
    return registry


async def test_a_node_renewing_through_another_replica_stays_alive_and_silent_only_when_it_stops(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    leader_store, follower_store = replicas
    leader, follower = await _registry(leader_store), await _registry(follower_store)
    await leader.join(Declaration(Node("node-1", 4, 4096, "local")))
    # A node that joined through the leader is known on the follower (the change feed).
    assert await _until(lambda: follower.data_plane_of("node-1") is None and "node-1" in follower._pools, 10)

    async def silent() -> bool:
        record = await leader_store.read(lambda r: r.get_node("node-1"))
        return record is not None and record.silent

    expiry = asyncio.create_task(leader.run())
    stop_renewing = asyncio.Event()

    async def renew_through_follower() -> None:
        while not stop_renewing.is_set():
            await follower.renew("node-1")
            await asyncio.sleep(LEASE_S / 4)

    renewing = asyncio.create_task(renew_through_follower())
    try:
        # Four leases of renewals that only the follower sees: the leader keeps the node alive.
        for _ in range(int(4 * LEASE_S / 0.1)):
            assert not await silent(), "the leader expired a node whose renewals reached another replica"
            await asyncio.sleep(0.1)
        # The node stops renewing anywhere: the leader makes it silent once the stored lease ends.
        stop_renewing.set()
        await renewing
        assert await _until(silent, 6 * LEASE_S)
        # It comes back through the follower: no longer silent, and the leader does not expire it again.
        await follower.renew("node-1")
        assert not await silent()
        await asyncio.sleep(2 * LEASE_S)
        await follower.renew("node-1")
        assert not await silent()
    finally:
        stop_renewing.set()
        renewing.cancel()
        expiry.cancel()
        for task in (renewing, expiry):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        leader.close()
        follower.close()


async def test_a_node_joined_elsewhere_is_expired_by_the_leader_and_fed_by_any_replica(
    replicas: tuple[PostgresStore, PostgresStore],
) -> None:
    leader_store, follower_store = replicas
    leader, follower = await _registry(leader_store), await _registry(follower_store)
    await follower.join(Declaration(Node("node-2", 4, 4096, "pool-2")))
    feed: AsyncIterator[Batch] = follower.feed("node-2", None)
    assert (await asyncio.wait_for(anext(feed), 10)).snapshot
    # Work committed through the leader reaches the node's feed on the follower.
    instance = Instance("ws-1-g1", "ws-1", 1, 1, 128, 0.0, step=1, node_id="node-2")

    def put(tx: Tx) -> None:
        tx.put_instance(instance)

    await leader_store.transact(put)
    batch = await asyncio.wait_for(anext(feed), 10)
    assert [i.instance.id for i in batch.items if isinstance(i, InstanceWork)] == ["ws-1-g1"]
    await feed.aclose()
    # The leader learnt of the node (it never joined there) and expires it when nobody renews.
    expiry = asyncio.create_task(leader.run())
    try:

        async def silent() -> bool:
            record = await leader_store.read(lambda r: r.get_node("node-2"))
            return record is not None and record.silent

        assert await _until(silent, 6 * LEASE_S), "the leader never expired a node that joined elsewhere"
    finally:
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        leader.close()
        follower.close()


class _Skewed:
    """A replica's wall clock, `skew` seconds off (its host has no NTP); intervals are true."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def now(self) -> float:
        return time.time() + self.skew

    def monotonic(self) -> float:
        return time.monotonic()


@pytest.mark.parametrize("skew", [-30.0, 30.0])
async def test_leases_hold_against_the_database_clock_whatever_the_replicas_clocks_say(
    replicas: tuple[PostgresStore, PostgresStore], skew: float
) -> None:
    """A follower whose clock is 30 s off (either way) stores the leases of the node it sees:
    the leader keeps the node alive while it renews there, and makes it silent within a few
    leases once it stops (not 30 s late, nor at once)."""
    leader_store, follower_store = replicas
    leader = await _registry(leader_store)
    follower = NodeRegistry(follower_store, LEASE_S, _Skewed(skew))
    follower_store.subscribe(follower.on_changes)
    await follower.load()
    await follower.join(Declaration(Node("node-1", 4, 4096, "local")))
    assert await _until(lambda: "node-1" in leader._pools, 10)

    async def silent() -> bool:
        record = await leader_store.read(lambda r: r.get_node("node-1"))
        return record is not None and record.silent

    expiry = asyncio.create_task(leader.run())
    stop_renewing = asyncio.Event()

    async def renew() -> None:
        while not stop_renewing.is_set():
            await follower.renew("node-1")
            await asyncio.sleep(LEASE_S / 4)

    renewing = asyncio.create_task(renew())
    try:
        for _ in range(int(4 * LEASE_S / 0.1)):
            assert not await silent(), f"a follower {skew:+} s off had the leader expire a node it renews"
            await asyncio.sleep(0.1)
        stop_renewing.set()
        await renewing
        stopped = time.monotonic()
        assert await _until(silent, 8 * LEASE_S), f"a follower {skew:+} s off kept a stopped node alive"
        assert time.monotonic() - stopped < 8 * LEASE_S
    finally:
        stop_renewing.set()
        expiry.cancel()
        leader.close()
        follower.close()
        with contextlib.suppress(BaseException):
            await expiry
        with contextlib.suppress(BaseException):
            await renewing
