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
