"""When the scheduler runs a pass (engine/scheduler.py), in process on a real SQLite store: a
pass reads every waiting instance, so a released reservation too small for any of them runs
none (a read of the nodes' sums decides), while one with room places the waiting instance;
a node falling silent wakes nothing, its return does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.domain.model import Instance
from kibo_ctrl.domain.nodes import NodeRecord
from kibo_ctrl.domain.reports import Launched, Stopped
from kibo_ctrl.engine import controller, scheduler
from kibo_ctrl.engine.node_registry import NodeRegistry
from kibo_ctrl.engine.scheduler import Scheduler
from kibo_ctrl.store.base import Tx

from tests.unit.engine_harness import Engine, engine

__all__ = ["engine"]


@pytest.fixture
async def placing(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[int]]:
    """A scheduler on the engine's store with one node of 4 vCPU; yields its pass count."""
    passes: list[int] = []
    real = scheduler.schedule_pending

    def counted(tx: Tx, backlog: scheduler.Backlog | None = None) -> int:
        passes.append(1)
        return real(tx, backlog)

    monkeypatch.setattr(scheduler, "schedule_pending", counted)
    await engine.store.transact(lambda tx: tx.put_node(NodeRecord("node-1", 4, 8192, "local")))
    registry = NodeRegistry(engine.store, 60.0)
    await registry.load()
    placer = Scheduler(engine.store)
    registry.on_room(placer.room_on_nodes)
    engine.store.subscribe(registry.on_changes)
    engine.store.subscribe(placer.on_changes)
    task = asyncio.create_task(placer.run())
    try:
        yield passes
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _create(engine: Engine, number: int, vcpus: int) -> str:
    message = ws.CreateWorkspaceRequest(spec=wp.WorkspaceSpec(resources=wp.Resources(vcpus=vcpus, memory_mib=512)))
    message.metadata.command_id = f"create-{number}"
    workspace, _ = await engine.command("CreateWorkspace", message)
    return workspace.instance_id or ""


async def _instance(engine: Engine, instance_id: str) -> Instance:
    found = await engine.store.read(lambda r: r.get_instance(instance_id))
    assert found is not None
    return found


async def _until(check: Callable[[], Any]) -> None:
    for _ in range(500):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def _settled(passes: list[int]) -> int:
    """The pass count once the scheduler has had every chance to run."""
    for _ in range(20):
        await asyncio.sleep(0.01)
    return len(passes)


async def _stop(engine: Engine, instance_id: str, number: int) -> None:
    instance = await _instance(engine, instance_id)
    message = ws.StopWorkspaceRequest(workspace_id=instance.workspace_id, mode=ws.STOP_MODE_FORCE)
    message.metadata.command_id = f"stop-{number}"
    await engine.command("StopWorkspace", message)
    await engine.store.transact(controller.apply, Stopped(instance_id=instance_id, step=instance.step + 1))


async def test_a_release_too_small_runs_no_pass_and_one_with_room_places(engine: Engine, placing: list[int]) -> None:
    small, big = await _create(engine, 1, 1), await _create(engine, 2, 3)
    for instance_id in (small, big):
        await _until(lambda i=instance_id: _placed(engine, i))
        await engine.store.transact(controller.apply, Launched(instance_id=instance_id))
    waiting = await _create(engine, 3, 3)
    before = await _settled(placing)
    assert (await _instance(engine, waiting)).node_id is None  # the node is full

    await _stop(engine, small, 1)  # 1 vCPU back: the waiting 3 do not fit
    assert not (await _instance(engine, small)).reserved
    assert await _settled(placing) == before
    assert (await _instance(engine, waiting)).node_id is None

    await _stop(engine, big, 2)  # now they do
    await _until(lambda: _placed(engine, waiting))


async def _placed(engine: Engine, instance_id: str) -> bool:
    return (await _instance(engine, instance_id)).node_id is not None


async def test_a_node_falling_silent_wakes_no_pass_and_its_return_does(engine: Engine, placing: list[int]) -> None:
    await _create(engine, 1, 4)
    waiting = await _create(engine, 2, 4)
    before = await _settled(placing)

    def silent(flag: bool) -> Callable[[Tx], None]:
        def change(tx: Tx) -> None:
            record = tx.get_node("node-1")
            assert record is not None
            record.silent = flag
            tx.put_node(record)

        return change

    await engine.store.transact(silent(True))
    assert await _settled(placing) == before
    await engine.store.transact(silent(False))
    assert await _settled(placing) == before + 1
    assert (await _instance(engine, waiting)).node_id is None  # still no room: it waits
