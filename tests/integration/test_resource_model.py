"""The resource model through the API, on the simulator (issue 26): what no node could ever
hold is refused up front with RESOURCE_EXHAUSTED and the reason (create, start, resize),
nothing stored; GetCapabilities tells the largest workspace; kibo node list shows what a
node's capacity is made of; and the simulator's model of a process killed over the guest's
memory leaves the workspace AVAILABLE with an event and a metric."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, error_of, meta
from tests.integration.test_metrics import scrape, value
from tests.nodes import list_nodes
from tests.server import ServerProcess


@pytest.fixture(scope="module")
def small_node(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory("--node-vcpus", "8", "--node-memory-mib", "8192", "--metrics", "open")


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call  # type: ignore[misc]
    return error.value


async def test_what_no_node_could_ever_hold_is_refused_up_front(small_node: ServerProcess) -> None:
    async with Client.connect(small_node.address) as client:
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest())
        command_id = meta().command_id
        request = ws.CreateWorkspaceRequest(
            metadata=wp.CommandMetadata(command_id=command_id),
            spec=wp.WorkspaceSpec(resources=wp.Resources(vcpus=16, memory_mib=1024)),
        )
        error = await _refused(client.ws.CreateWorkspace(request))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_of(error)
        assert info.reason == "NO_CAPACITY" and info.detail.field == "spec.resources"
        assert "16 vCPU" in error.details() and "the most a node offers is 8, node-1" in error.details()
        # Nothing was recorded: no workspace, no command.
        assert len((await client.ws.ListWorkspaces(ws.ListWorkspacesRequest())).workspaces) == len(listed.workspaces)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await client.command(command_id)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        memory = wp.WorkspaceSpec(resources=wp.Resources(vcpus=1, memory_mib=9000))
        error = await _refused(client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta(), spec=memory)))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "9000 MiB of memory" in error.details()

        # A stopped workspace resized past every node: refused too, and its size unchanged.
        workspace = await client.create(resources=wp.Resources(vcpus=2, memory_mib=1024))
        await client.stop(workspace.workspace_id)
        await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_STOPPED)
        resize = ws.ResizeWorkspaceRequest(
            metadata=meta(), workspace_id=workspace.workspace_id, resources=wp.Resources(vcpus=12)
        )
        error = await _refused(client.ws.ResizeWorkspace(resize))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "12 vCPU" in error.details()
        assert (await client.get(workspace.workspace_id)).spec.resources.vcpus == 2
        # What fits the node in all but not now waits instead (UNSCHEDULABLE), as before.
        filler = await client.create(resources=wp.Resources(vcpus=7, memory_mib=1024))
        started = await client.ws.StartWorkspace(
            ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace.workspace_id)
        )
        assert started.workspace.state == S.WORKSPACE_STATE_STARTING
        await client.delete(filler.workspace_id)
        assert (await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_AVAILABLE)).node_id == "node-1"
        await client.delete(workspace.workspace_id)


async def test_capabilities_and_the_node_list_tell_the_capacity(small_node: ServerProcess) -> None:
    async with Client.connect(small_node.address) as client:
        largest = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).largest_workspace
    assert (largest.vcpus, largest.memory_mib, largest.storage_gib) == (8, 8192, 0)
    node = (await list_nodes(small_node.address))["node-1"]
    # Given explicitly (--node-vcpus, --node-memory-mib): no ratio; the simulator has no disk.
    assert (node.vcpus, node.memory_mib, node.cpu_allocation_ratio, node.memory_allocation_ratio) == (8, 8192, 0, 0)
    assert (node.storage_gib, list(node.conditions)) == (0, [])


async def test_a_simulated_guest_oom_kills_a_process_and_the_workspace_runs_on(small_node: ServerProcess) -> None:
    async with Client.connect(small_node.address) as client:
        workspace = await client.create(resources=wp.Resources(vcpus=1, memory_mib=256))
        before = await scrape(small_node)
        await client.inject(workspace.workspace_id, sim.FAULT_GUEST_OOM)
        for _ in range(200):
            kills = [e for e in await client.events(workspace.workspace_id) if e.type == obs.EVENT_TYPE_GUEST_OOM_KILL]
            if kills:
                break
            await asyncio.sleep(0.02)
        assert kills and kills[0].message.startswith("OOM: killed PID 40") and "(simulated)" in kills[0].message
        after = await client.get(workspace.workspace_id)
        assert after.state == S.WORKSPACE_STATE_AVAILABLE
        assert after.execution_generation == workspace.execution_generation
        moved = value(await scrape(small_node), "kibo_guest_oom_kills_total", node="node-1")
        assert moved - value(before, "kibo_guest_oom_kills_total", node="node-1") == 1
        await client.delete(workspace.workspace_id)
