"""Placement: the scheduler filters nodes with room and scores them; an instance that fits
nowhere waits (CREATING/STARTING) with its reason in the events, not an error."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S, meta
from tests.nodes import admin
from tests.server import ServerProcess

PHASE = obs.InstancePhase


@pytest.fixture(scope="module")
def two_nodes(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """Two simulated nodes of 4 vCPU and 8 GiB each."""
    return server_factory("--sim-nodes", "2", "--node-vcpus", "4", "--node-memory-mib", "8192")


def spec(vcpus: int) -> wp.WorkspaceSpec:
    return wp.WorkspaceSpec(resources=wp.Resources(vcpus=vcpus, memory_mib=1024))


async def instances(client: Client, workspace_id: str) -> list[obs.Instance]:
    request = obs.ListWorkspaceInstancesRequest(workspace_id=workspace_id)
    return list((await client.obs.ListWorkspaceInstances(request)).instances)


async def test_spread_then_wait_for_room_then_place(two_nodes: ServerProcess) -> None:
    async with Client.connect(two_nodes.address) as client:
        first = await client.create(resources=wp.Resources(vcpus=3, memory_mib=1024))
        second = await client.create(resources=wp.Resources(vcpus=3, memory_mib=1024))
        # Scored by free share: the second goes to the emptier node.
        assert {first.node_id, second.node_id} == {"node-1", "node-2"}

        created = await client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta(), spec=spec(3)))
        waiting_id = created.workspace.workspace_id
        assert created.command.state in (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
        waiting = await client.get(waiting_id)
        assert waiting.state == S.WORKSPACE_STATE_CREATING
        assert waiting.node_id == ""
        [pending] = await instances(client, waiting_id)
        assert pending.phase == PHASE.INSTANCE_PHASE_PENDING
        assert "unschedulable" in pending.reason
        unschedulable = [e for e in await client.events(waiting_id) if e.type == obs.EVENT_TYPE_UNSCHEDULABLE]
        assert len(unschedulable) == 1 and "3 vCPU" in unschedulable[0].message

        # Room comes free when a workspace stops: the waiting one is placed and runs.
        await client.stop(first.workspace_id)
        placed = await client.wait_for(waiting_id, S.WORKSPACE_STATE_AVAILABLE)
        assert placed.node_id == first.node_id
        command = await client.command(created.command.command_id)
        assert command.state == command_pb2.COMMAND_STATE_SUCCEEDED

        # Starting the stopped one now waits in STARTING: its node is full again.
        started = await client.ws.StartWorkspace(
            ws.StartWorkspaceRequest(metadata=meta(), workspace_id=first.workspace_id)
        )
        assert started.workspace.state == S.WORKSPACE_STATE_STARTING
        # Deleting a workspace that waits for room cancels its start and finishes at once.
        deleted = await client.delete(first.workspace_id)
        assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
        cancelled = await client.command(started.command.command_id)
        assert cancelled.state == command_pb2.COMMAND_STATE_FAILED and cancelled.error.code == 1
        for workspace_id in (second.workspace_id, waiting_id):
            await client.delete(workspace_id)


async def test_instances_show_each_execution_with_its_internal_phase(client: Client) -> None:
    workspace = await client.create()
    await client.stop(workspace.workspace_id)
    await client.start(workspace.workspace_id)
    first, second = await instances(client, workspace.workspace_id)
    assert (first.execution_generation, second.execution_generation) == (1, 2)
    assert first.phase == PHASE.INSTANCE_PHASE_STOPPED and not first.holds_execution
    assert second.phase == PHASE.INSTANCE_PHASE_RUNNING and second.holds_execution
    assert second.node_id and second.observe_time.seconds > 0
    await client.delete(workspace.workspace_id)
    *_, last = await instances(client, workspace.workspace_id)
    assert last.phase == PHASE.INSTANCE_PHASE_RELEASED and not last.holds_execution


async def _unschedulable_reason(client: Client, workspace_id: str) -> str:
    pending = [i for i in await instances(client, workspace_id) if i.phase == PHASE.INSTANCE_PHASE_PENDING]
    assert len(pending) == 1, pending
    return str(pending[0].reason)


async def test_a_workspace_starts_only_on_the_node_that_holds_its_disks(two_nodes: ServerProcess) -> None:
    """A node's disks are its own: a stopped workspace whose node is cordoned waits, with the
    node named, rather than starting on the other (empty) node with empty disks (issue 26).
    A kept volume follows the same rule into the next workspace it is bound to."""
    small = wp.Resources(vcpus=1, memory_mib=512)
    async with Client.connect(two_nodes.address) as client:
        first = await client.create(resources=small)
        home = first.node_id
        await client.stop(first.workspace_id)
        await admin(two_nodes.address, "CordonNode", home)
        try:
            started = await client.ws.StartWorkspace(
                ws.StartWorkspaceRequest(metadata=meta(), workspace_id=first.workspace_id)
            )
            assert started.workspace.state == S.WORKSPACE_STATE_STARTING
            reason = await _unschedulable_reason(client, first.workspace_id)
            assert f"its disks are on node {home}, which is cordoned" in reason, reason
            events = [e for e in await client.events(first.workspace_id) if e.type == obs.EVENT_TYPE_UNSCHEDULABLE]
            assert events and home in events[-1].message
        finally:
            await admin(two_nodes.address, "UncordonNode", home)
        placed = await client.wait_for(first.workspace_id, S.WORKSPACE_STATE_AVAILABLE)
        assert placed.node_id == home

        # A kept volume: its files are on the node of the workspace it was first bound to.
        volume = await client.create_volume(1)
        binding = wp.VolumeBinding(volume_id=volume.volume_id, mount_path="/mnt/kept")
        user = await client.create(resources=small, volumes=[binding])
        volume_home = user.node_id
        await client.delete(user.workspace_id)
        assert (await client.wait_steady(user.workspace_id)).state == S.WORKSPACE_STATE_DELETED
        await admin(two_nodes.address, "CordonNode", volume_home)
        try:
            created = await client.ws.CreateWorkspace(
                ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=small, volumes=[binding]))
            )
            assert created.workspace.state == S.WORKSPACE_STATE_CREATING
            reason = await _unschedulable_reason(client, created.workspace.workspace_id)
            assert f"its disks are on node {volume_home}, which is cordoned" in reason, reason
        finally:
            await admin(two_nodes.address, "UncordonNode", volume_home)
        again = await client.wait_for(created.workspace.workspace_id, S.WORKSPACE_STATE_AVAILABLE)
        assert again.node_id == volume_home
        for workspace_id in (first.workspace_id, again.workspace_id):
            await client.delete(workspace_id)
