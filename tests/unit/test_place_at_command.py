"""A create or start places its own instance in its command's transaction when nothing waits
before it (engine/placement.py place_if_first), and leaves it to the scheduler otherwise, so
an instance never overtakes one that waits."""

from __future__ import annotations

from pathlib import Path

from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.domain.model import Phase, WorkspaceState
from kibo_ctrl.domain.nodes import NodeRecord
from kibo_ctrl.engine.service import Service, Settings
from kibo_ctrl.store.base import Changes
from kibo_ctrl.store.sqlite import SqliteStore

from tests.unit.engine_harness import Engine


async def _engine(tmp_path: Path, vcpus: int) -> tuple[Engine, list[Changes]]:
    store = await SqliteStore.open(tmp_path / "kibo.db")
    engine = Engine(store)
    engine.service = Service(Settings(place_at_command=True))
    await store.transact(lambda tx: tx.put_node(NodeRecord("node-1", vcpus, 8192, "local")))
    commits: list[Changes] = []
    store.subscribe(commits.append)
    return engine, commits


def _create(number: int, vcpus: int) -> ws.CreateWorkspaceRequest:
    message = ws.CreateWorkspaceRequest(spec=wp.WorkspaceSpec(resources=wp.Resources(vcpus=vcpus, memory_mib=512)))
    message.metadata.command_id = f"create-{number}"
    return message


async def test_a_create_with_room_is_placed_in_its_own_transaction(tmp_path: Path) -> None:
    engine, commits = await _engine(tmp_path, vcpus=4)
    try:
        workspace, _ = await engine.command("CreateWorkspace", _create(1, 2))
        # The answer carries the placed record; one commit holds the command and the placement.
        assert workspace.node_id == "node-1"
        stored = await engine.workspace(workspace.id)
        assert (stored.node_id, stored.version, stored.state) == ("node-1", workspace.version, WorkspaceState.CREATING)
        (commit,) = commits
        (instance,) = commit.instances.values()
        assert (instance.node_id, instance.phase, instance.reserved) == ("node-1", Phase.SCHEDULED, True)
        assert [snapshot.node_id for snapshot in commit.workspace_history] == [None, "node-1"]
    finally:
        await engine.store.close()


async def test_a_create_behind_a_waiting_instance_waits_for_the_scheduler(tmp_path: Path) -> None:
    engine, _ = await _engine(tmp_path, vcpus=4)
    try:
        first, _ = await engine.command("CreateWorkspace", _create(0, 3))
        assert first.node_id == "node-1"
        big, _ = await engine.command("CreateWorkspace", _create(1, 2))  # fits the node, not now: waits
        assert big.node_id is None
        small, _ = await engine.command("CreateWorkspace", _create(2, 1))
        # It would fit, but the first one waits before it: the scheduler's pass decides.
        assert small.node_id is None
        assert (await engine.workspace(small.id)).node_id is None
    finally:
        await engine.store.close()


async def test_without_the_setting_nothing_is_placed_at_command_time(tmp_path: Path) -> None:
    engine, _ = await _engine(tmp_path, vcpus=4)
    engine.service = Service(Settings())
    try:
        workspace, _ = await engine.command("CreateWorkspace", _create(1, 1))
        assert workspace.node_id is None
    finally:
        await engine.store.close()
