"""A node agent's feed (kibo.node.v1 WatchSteps) resumed after dropped connections: no
step lost, none applied twice. The agent runs in this process on the real gRPC link to a
`serve --no-local-node` control plane; its link drops the stream after every batch, and its
runtime counts what it is asked to do."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.domain.model import Backend, Instance, Node, Phase, StopDurability
from kibo_ctrl.engine.node_agent import NodeAgent
from kibo_ctrl.engine.node_link import Batch, Cursor, LinkDown
from kibo_ctrl.runtime.base import LaunchSpec
from kibo_ctrl.runtime.sim.simulator import SimBoard, SimNode
from kibo_ctrl.transport.node_client import GrpcLink

from tests.client import Client, S
from tests.server import ServerProcess
from tests.system.test_durability import eventually

Factory = Callable[..., ServerProcess]


class CountingSim(SimNode):
    """The simulator, counting each (operation, instance, step) it is asked to do."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id, Backend.FIRECRACKER, 0.005, SimBoard())
        self.calls: Counter[tuple[str, str, int]] = Counter()

    async def launch(
        self, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
    ) -> tuple[str, ...]:
        self.calls["launch", spec.instance.id, spec.instance.step] += 1
        return await super().launch(spec, progress)

    async def stop(self, instance: Instance, force: bool) -> StopDurability:
        self.calls["stop", instance.id, instance.step] += 1
        return await super().stop(instance, force)

    async def destroy(self, instance: Instance) -> None:
        self.calls["destroy", instance.id, instance.step] += 1
        await super().destroy(instance)


class DroppingLink(GrpcLink):
    """Drops the feed's stream (the call is cancelled, as a broken connection ends it) after
    each batch, so every batch after the first comes over a resumed stream."""

    def __init__(self, target: str, node_id: str) -> None:
        super().__init__(target, node_id)
        self.opened: list[Cursor | None] = []
        self.snapshots = 0

    async def work(self, cursor: Cursor | None) -> AsyncIterator[Batch]:
        self.opened.append(cursor)
        stream = super().work(cursor)
        try:
            batch = await anext(stream)
        finally:
            await stream.aclose()
        self.snapshots += batch.snapshot
        yield batch
        raise LinkDown("dropped by the test")


@pytest.fixture
async def agent(server_factory: Factory) -> AsyncIterator[tuple[ServerProcess, NodeAgent, DroppingLink, CountingSim]]:
    server = server_factory("--no-local-node", "--node-timeout-ms", "60000")
    runtime = CountingSim("node-r")
    link = DroppingLink(server.address, "node-r")
    node_agent = NodeAgent(Node("node-r", 64, 65536, "local"), runtime, link)
    task = asyncio.create_task(node_agent.run())
    try:
        await asyncio.wait_for(node_agent.ready.wait(), 20)
        yield server, node_agent, link, runtime
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await node_agent.stop()
        await link.close()


async def test_a_resumed_feed_loses_no_step_and_applies_none_twice(
    agent: tuple[ServerProcess, NodeAgent, DroppingLink, CountingSim],
) -> None:
    server, _, link, runtime = agent
    async with Client.connect(server.address) as client:
        created = [await client.create() for _ in range(4)]
        assert {w.state for w in created} == {S.WORKSPACE_STATE_AVAILABLE}
        for workspace in created:
            await client.stop(workspace.workspace_id)
            assert (await client.wait_steady(workspace.workspace_id)).state == S.WORKSPACE_STATE_STOPPED
            await client.start(workspace.workspace_id)
            assert (await client.wait_steady(workspace.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        for workspace in created:
            await client.delete(workspace.workspace_id)
            assert (await client.wait_steady(workspace.workspace_id)).state == S.WORKSPACE_STATE_DELETED

        async def released() -> Any:
            return sum(1 for op, _, _ in runtime.calls if op == "destroy") >= 4

        await eventually(released, what=f"every instance destroyed: {runtime.calls}")
    # Every step the control plane asked for was done, each exactly once, though the stream
    # was dropped after every batch: 4 workspaces x 2 instances (create, start), each
    # launched once; the first ones stopped once (a stop releases them), the second ones
    # destroyed once by the delete.
    assert set(runtime.calls.values()) == {1}, runtime.calls
    ops = Counter(op for op, _, _ in runtime.calls)
    assert ops == {"launch": 8, "stop": 4, "destroy": 4}, ops
    # The stream really was resumed, from cursors of this control plane, without a snapshot.
    assert len(link.opened) > 10
    assert link.opened[0] is None
    assert all(cursor is not None for cursor in link.opened[1:])
    assert link.snapshots == 1


class HaltingSim(SimNode):
    """The simulator, halting every launch once LAUNCHING is reported (as a node agent
    killed there would leave it)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id, Backend.FIRECRACKER, 0.005, SimBoard())
        self.launching = asyncio.Event()

    async def launch(
        self, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
    ) -> tuple[str, ...]:
        async def halted(phase: Phase, volumes: tuple[str, ...]) -> None:
            await progress(phase, volumes)
            if phase is Phase.LAUNCHING:
                self.launching.set()
                await asyncio.Event().wait()

        return await super().launch(spec, halted)


async def test_a_launch_driven_again_after_its_node_agent_restarts_says_so_and_is_one_launch(
    server_factory: Factory,
) -> None:
    """The cluster test's kill -9 of a node agent caught between LAUNCHING and Launched: the
    restarted agent drives the same step again, from PROVISIONING. Its event says that this is
    the same launch resumed, not a second one (a failover launching an instance twice)."""
    server = server_factory("--no-local-node", "--node-timeout-ms", "60000")
    node = Node("node-k", 64, 65536, "local")
    halting = HaltingSim("node-k")
    links = [GrpcLink(server.address, "node-k") for _ in range(2)]
    first = NodeAgent(node, halting, links[0])
    second = NodeAgent(node, SimNode("node-k", Backend.FIRECRACKER, 0.005, SimBoard()), links[1])
    tasks = [asyncio.create_task(first.run())]
    try:
        await asyncio.wait_for(first.ready.wait(), 20)
        async with Client.connect(server.address) as client:
            created = asyncio.create_task(client.create())
            await asyncio.wait_for(halting.launching.wait(), 20)

            async def launching() -> bool:
                listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=10))
                events = [await client.events(w.workspace_id) for w in listed.workspaces]
                return any(": launching on node-k" in e.message for found in events for e in found)

            await eventually(launching, what="LAUNCHING recorded")
            tasks[0].cancel()  # the agent dies here, its launch unfinished
            await first.stop()
            tasks.append(asyncio.create_task(second.run()))
            workspace = await asyncio.wait_for(created, 30)
            assert workspace.state == S.WORKSPACE_STATE_AVAILABLE
            events = await client.events(workspace.workspace_id)
            phases = [e.message for e in events if ": provisioning on" in e.message]
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for agent, link in zip((first, second), links, strict=True):
            await agent.stop()
            await link.close()
    instance = f"{workspace.workspace_id}-g1"
    assert phases == [
        f"instance {instance}: provisioning on node-k",
        f"instance {instance}: provisioning on node-k again (its node agent restarted during the launch)",
    ], phases
