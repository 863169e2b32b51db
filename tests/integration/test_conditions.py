"""Workspace conditions (Scheduled, Ready, NodeReachable, Stopped, Releasing) with reasons
and transition times, and the instance phases PROVISIONING and STOPPING with their
EVENT_TYPE_INSTANCE_PHASE events, read off a real server (issue 15)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, meta
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]


def conditions(workspace: wp.Workspace) -> dict[str, wp.Condition]:
    return {condition.type: condition for condition in workspace.conditions}


def seconds(condition: wp.Condition) -> float:
    return condition.last_transition_time.ToNanoseconds() / 1e9


async def phase(client: Client, workspace_id: str) -> int:
    request = obs.ListWorkspaceInstancesRequest(workspace_id=workspace_id)
    instances = (await client.obs.ListWorkspaceInstances(request)).instances
    return instances[-1].phase


@pytest.fixture(scope="module")
def server(server_factory: Factory) -> ServerProcess:
    # Its own server: a test here makes its node silent.
    return server_factory("--node-vcpus", "8")


async def test_create_then_stop_fill_the_conditions_with_transition_times(server: ServerProcess) -> None:
    async with Client.connect(server.address) as client:
        created = await client.create()
        wid = created.workspace_id
        up = conditions(created)
        assert up["Scheduled"].status and up["Scheduled"].reason == "Scheduled" and "node-1" in up["Scheduled"].message
        assert up["Ready"].status and up["Ready"].reason == "Running"
        assert up["NodeReachable"].status and up["NodeReachable"].reason == "NodeReporting"
        assert "Stopped" not in up and "Releasing" not in up
        create_time = created.create_time.ToNanoseconds() / 1e9
        for condition in up.values():
            assert seconds(condition) >= create_time, condition
        await client.stop(wid)
        stopped = await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
        down = conditions(stopped)
        assert not down["Ready"].status and down["Ready"].reason == "Stopped"
        assert seconds(down["Ready"]) > seconds(up["Ready"])  # it flipped: a new transition time
        assert seconds(down["Scheduled"]) == seconds(up["Scheduled"])  # still true: the same time
        assert down["Stopped"].status and down["Stopped"].reason == "SyncConfirmed"
        assert stopped.last_stop.command_id in down["Stopped"].message
        assert not down["Releasing"].status and down["Releasing"].reason == "Released"
        types = [(e.type, e.message) for e in await client.events(wid)]
        phases = [message for kind, message in types if kind == obs.EVENT_TYPE_INSTANCE_PHASE]
        for name in ("provisioning", "launching", "stopping"):
            assert any(f": {name} on node-1" in message for message in phases), phases
        await client.delete(wid)


async def test_a_stalled_stop_reads_stopping_in_its_phase_and_conditions(server: ServerProcess) -> None:
    async with Client.connect(server.address) as client:
        wid = (await client.create()).workspace_id
        await client.inject(wid, sim.FAULT_STALL)
        request = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=wid, mode=ws.STOP_MODE_GRACEFUL)
        response = await client.ws.StopWorkspace(request)
        assert response.workspace.state == S.WORKSPACE_STATE_STOPPING
        for _ in range(250):
            if await phase(client, wid) == obs.INSTANCE_PHASE_STOPPING:
                break
            await asyncio.sleep(0.02)
        assert await phase(client, wid) == obs.INSTANCE_PHASE_STOPPING
        stuck = conditions(await client.get(wid))
        assert not stuck["Ready"].status and stuck["Ready"].reason == "Stopping"
        assert stuck["Ready"].message == "instance stopping"
        assert not stuck["Stopped"].status and stuck["Stopped"].reason == "Stopping"
        await client.inject(wid, sim.FAULT_UNSTALL)
        await client.settle(client.ws.StopWorkspace, request)
        assert conditions(await client.get(wid))["Stopped"].status
        await client.delete(wid)


async def test_a_stalled_create_reads_provisioning(server: ServerProcess) -> None:
    async with Client.connect(server.address) as client:
        await client.inject("", sim.FAULT_STALL)
        request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec())
        wid = (await client.ws.CreateWorkspace(request)).workspace.workspace_id
        for _ in range(250):
            if await phase(client, wid) == obs.INSTANCE_PHASE_PROVISIONING:
                break
            await asyncio.sleep(0.02)
        assert await phase(client, wid) == obs.INSTANCE_PHASE_PROVISIONING
        ready = conditions(await client.get(wid))["Ready"]
        assert not ready.status and ready.reason == "Creating" and ready.message == "instance provisioning"
        await client.inject(wid, sim.FAULT_UNSTALL)
        await client.settle(client.ws.CreateWorkspace, request)
        await client.delete(wid)


async def test_an_unschedulable_create_says_why_in_scheduled(server: ServerProcess) -> None:
    async with Client.connect(server.address) as client:
        # The node offers 8 vCPUs: 6 of them taken, a create of 4 fits the node, not now.
        taken = await client.create(resources=wp.Resources(vcpus=6))
        spec = wp.WorkspaceSpec(resources=wp.Resources(vcpus=4))
        request = ws.CreateWorkspaceRequest(metadata=meta(), spec=spec)
        wid = (await client.ws.CreateWorkspace(request)).workspace.workspace_id
        for _ in range(250):
            scheduled = conditions(await client.get(wid)).get("Scheduled")
            if scheduled is not None and scheduled.reason == "Unschedulable":
                break
            await asyncio.sleep(0.02)
        assert scheduled is not None and not scheduled.status and scheduled.reason == "Unschedulable"
        assert "4 vCPU" in scheduled.message and "short of vCPU" in scheduled.message
        await client.delete(wid)
        await client.delete(taken.workspace_id)


async def test_a_silent_node_reads_in_node_reachable(server: ServerProcess) -> None:
    async with Client.connect(server.address) as client:
        created = await client.create()
        wid = created.workspace_id
        try:
            await client.inject(wid, sim.FAULT_NODE_SILENT)
            unknown = await client.wait_for(wid, S.WORKSPACE_STATE_UNKNOWN)
            reachable = conditions(unknown)["NodeReachable"]
            assert not reachable.status and reachable.reason == "NodeSilent" and "node-1" in reachable.message
            assert seconds(reachable) > seconds(conditions(created)["NodeReachable"])
            assert conditions(unknown)["Ready"].reason == "Unknown"
        finally:
            await client.inject(wid, sim.FAULT_NODE_BACK)
        back = await client.wait_for(wid, S.WORKSPACE_STATE_AVAILABLE)
        assert conditions(back)["NodeReachable"].status
        await client.delete(wid)
