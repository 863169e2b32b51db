"""Cleanup status (GetWorkspaceCleanup): which parts of the execution are released.

Rules: lifecycle.md "Cleanup status (read-only observation)"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, meta
from tests.server import ServerProcess

C = obs.CleanupComponent
EXECUTION = (
    obs.CLEANUP_COMPONENT_INSTANCE,
    obs.CLEANUP_COMPONENT_RESERVATION,
    obs.CLEANUP_COMPONENT_NETWORK,
    obs.CLEANUP_COMPONENT_VOLUME_ATTACHMENT,
)
STORAGE = (obs.CLEANUP_COMPONENT_RETAINED_LAYER, obs.CLEANUP_COMPONENT_VOLUME_DELETION)
RELEASED = obs.COMPONENT_STATUS_RELEASED
PRESENT = obs.COMPONENT_STATUS_PRESENT
PENDING = obs.COMPONENT_STATUS_PENDING
UNKNOWN = obs.COMPONENT_STATUS_UNKNOWN


@pytest.fixture(scope="module")
def slow_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """Our own server (we silence its node), with steps slow enough that the node can be made
    silent between a delete finishing and the storage pool's files being deleted."""
    return server_factory("--sim-backend", "firecracker", "--sim-step-ms", "200")


@pytest.fixture
async def slow_client(slow_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(slow_server.address) as connected:
        yield connected


def rows(cleanup: obs.WorkspaceCleanup) -> dict[int, obs.CleanupComponentStatus]:
    """Components by kind; each appears once and carries a status, a source and a time."""
    by_kind: dict[int, obs.CleanupComponentStatus] = {}
    for row in cleanup.components:
        assert row.component not in by_kind, f"{C.Name(row.component)} appears twice"
        assert row.status != obs.COMPONENT_STATUS_UNSPECIFIED, row
        assert row.source != obs.CLEANUP_SOURCE_UNSPECIFIED, row
        assert row.HasField("observe_time"), row
        by_kind[row.component] = row
    for kind in EXECUTION:
        assert kind in by_kind, f"{C.Name(kind)} missing from {cleanup}"
    return by_kind


def statuses(cleanup: obs.WorkspaceCleanup, kinds: tuple[int, ...]) -> set[int]:
    by_kind = rows(cleanup)
    return {by_kind[k].status for k in kinds}


async def wait_cleanup(
    client: Client, workspace_id: str, check: Callable[[obs.WorkspaceCleanup], bool], within: float = 10.0
) -> obs.WorkspaceCleanup:
    deadline = time.monotonic() + within
    while True:
        cleanup = await client.cleanup(workspace_id)
        if check(cleanup):
            return cleanup
        if time.monotonic() > deadline:
            raise TimeoutError(f"cleanup condition not met within {within}s; last seen:\n{cleanup}")
        await asyncio.sleep(0.02)


async def volume_state(client: Client, volume_id: str) -> int:
    return int((await client.vol.GetVolume(vol.GetVolumeRequest(volume_id=volume_id))).volume.state)


# -- running, stopped, failed --------------------------------------------------------------


async def test_running_then_stopped(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    running = await client.cleanup(wid)
    assert running.workspace_id == wid
    by_kind = rows(running)
    for kind in EXECUTION:
        assert by_kind[kind].status == PRESENT
        assert by_kind[kind].source == obs.CLEANUP_SOURCE_NODE_REPORT
    # The retained layer and the workspace's own volume exist (kept until delete).
    for kind in STORAGE:
        assert kind in by_kind and by_kind[kind].status != RELEASED

    await client.stop(wid)
    stopped = await client.cleanup(wid)
    by_kind = rows(stopped)
    for kind in EXECUTION:
        assert by_kind[kind].status == RELEASED, by_kind[kind]
    # Stop keeps the retained layer and the volumes.
    for kind in STORAGE:
        assert by_kind[kind].status != RELEASED
    assert stopped.state == obs.CLEANUP_STATE_COMPLETE
    assert stopped.completeness == obs.CLEANUP_COMPLETENESS_COMPLETE
    assert not stopped.HasField("release")
    await client.delete(wid)


async def test_stop_in_progress_is_processing(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_STALL)
    request = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=wid)
    await client.ws.StopWorkspace(request)
    processing = await client.cleanup(wid)
    assert processing.state == obs.CLEANUP_STATE_PROCESSING
    assert processing.HasField("release") and processing.release.HasField("pending_since")
    assert PRESENT in statuses(processing, EXECUTION)
    await client.inject(wid, sim.FAULT_UNSTALL)
    await client.settle(client.ws.StopWorkspace, request)
    done = await client.cleanup(wid)
    assert done.state == obs.CLEANUP_STATE_COMPLETE
    assert not done.HasField("release")
    await client.delete(wid)


@pytest.mark.parametrize(
    "fault", [sim.FAULT_VMM_CRASH, sim.FAULT_CREATE_FAIL_HOLDING], ids=["vmm-crash", "create-fail-holding"]
)
async def test_failed_holding_needs_attention(any_client: Client, fault: int) -> None:
    client = any_client
    if fault == sim.FAULT_CREATE_FAIL_HOLDING:
        await client.inject("", fault)
        wid = (await client.create()).workspace_id
    else:
        wid = (await client.create()).workspace_id
        await client.inject(wid, fault)
    await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    cleanup = await client.cleanup(wid)
    assert cleanup.state == obs.CLEANUP_STATE_NEEDS_ATTENTION
    assert cleanup.completeness == obs.CLEANUP_COMPLETENESS_COMPLETE
    assert cleanup.HasField("release")
    assert cleanup.release.HasField("pending_since")
    assert cleanup.release.HasField("last_confirmed_time")
    by_kind = rows(cleanup)
    assert by_kind[obs.CLEANUP_COMPONENT_INSTANCE].status == PRESENT
    assert by_kind[obs.CLEANUP_COMPONENT_RESERVATION].status == PRESENT
    # The read triggered nothing.
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_FAILED
    await client.stop(wid, force=True)
    after = await client.cleanup(wid)
    assert after.state == obs.CLEANUP_STATE_COMPLETE
    assert statuses(after, EXECUTION) == {RELEASED}
    assert not after.HasField("release")
    await client.delete(wid)


async def test_failed_not_holding_has_nothing_to_release(any_client: Client) -> None:
    client = any_client
    await client.inject("", sim.FAULT_CREATE_FAIL)
    wid = (await client.create()).workspace_id
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_FAILED
    cleanup = await client.cleanup(wid)
    assert statuses(cleanup, EXECUTION) == {RELEASED}
    assert cleanup.state == obs.CLEANUP_STATE_COMPLETE
    assert not cleanup.HasField("release")
    await client.delete(wid)


# -- after delete --------------------------------------------------------------------------


async def test_after_delete_storage_released(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    [own] = [b.volume_id for b in workspace.spec.volumes if b.mount_path == "/data"]
    await client.delete(wid)
    done = await wait_cleanup(client, wid, lambda c: c.state == obs.CLEANUP_STATE_COMPLETE)
    assert statuses(done, EXECUTION) == {RELEASED}
    assert statuses(done, STORAGE) == {RELEASED}
    assert not done.HasField("release")
    assert await volume_state(client, own) == vol.VOLUME_STATE_DELETED


async def delete_then_silence(client: Client, workspace: wp.Workspace) -> str:
    """Delete, then silence the node before the pool's files go: they stay PENDING.
    Returns the workspace's own volume ID."""
    [own] = [b.volume_id for b in workspace.spec.volumes if b.mount_path == "/data"]
    deleted = await client.delete(workspace.workspace_id)
    await client.inject(workspace.workspace_id, sim.FAULT_NODE_SILENT)
    assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
    return own


async def test_after_delete_pending_until_the_pool_has_a_node(slow_client: Client) -> None:
    client = slow_client
    workspace = await client.create()
    wid = workspace.workspace_id
    try:
        own = await delete_then_silence(client, workspace)
        pending = await client.cleanup(wid)
        by_kind = rows(pending)
        for kind in STORAGE:
            assert by_kind[kind].status == PENDING, by_kind[kind]
            assert by_kind[kind].source == obs.CLEANUP_SOURCE_CONTROL_PLANE
        assert statuses(pending, EXECUTION) == {RELEASED}
        assert pending.state == obs.CLEANUP_STATE_PROCESSING
        assert pending.HasField("release") and pending.release.HasField("pending_since")
        assert (await client.get(wid)).state == S.WORKSPACE_STATE_DELETED
        assert await volume_state(client, own) != vol.VOLUME_STATE_DELETED
    finally:
        await client.inject(wid, sim.FAULT_NODE_BACK)
    done = await wait_cleanup(client, wid, lambda c: c.state == obs.CLEANUP_STATE_COMPLETE)
    assert statuses(done, STORAGE) == {RELEASED}
    assert not done.HasField("release")
    assert await volume_state(client, own) == vol.VOLUME_STATE_DELETED


async def test_storage_pool_lost_releases_pending_storage(slow_client: Client) -> None:
    client = slow_client
    workspace = await client.create()
    wid = workspace.workspace_id
    try:
        own = await delete_then_silence(client, workspace)
        assert statuses(await client.cleanup(wid), STORAGE) == {PENDING}
        await client.inject(wid, sim.FAULT_STORAGE_POOL_LOST)
        # The node is still silent: the pool was declared lost, no readable data is left.
        lost = await wait_cleanup(client, wid, lambda c: statuses(c, STORAGE) == {RELEASED})
        assert lost.state == obs.CLEANUP_STATE_COMPLETE
        assert await volume_state(client, own) == vol.VOLUME_STATE_DELETED
    finally:
        await client.inject(wid, sim.FAULT_NODE_BACK)


async def test_node_silent_partial_and_nothing_unknown_released(slow_client: Client) -> None:
    client = slow_client
    running = await client.create()
    failed = await client.create()
    await client.inject(failed.workspace_id, sim.FAULT_VMM_CRASH)
    await client.wait_for(failed.workspace_id, S.WORKSPACE_STATE_FAILED)
    try:
        await client.inject(running.workspace_id, sim.FAULT_NODE_SILENT)
        for workspace in (running, failed):
            wid = workspace.workspace_id
            await client.wait_for(wid, S.WORKSPACE_STATE_UNKNOWN)
            cleanup = await client.cleanup(wid)
            assert cleanup.completeness == obs.CLEANUP_COMPLETENESS_PARTIAL
            assert cleanup.state != obs.CLEANUP_STATE_COMPLETE
            by_kind = rows(cleanup)
            for kind in EXECUTION:
                # Last reported held, now unconfirmable: never shown as released.
                assert by_kind[kind].status == UNKNOWN, by_kind[kind]
    finally:
        await client.inject(running.workspace_id, sim.FAULT_NODE_BACK)
    await client.wait_for(running.workspace_id, S.WORKSPACE_STATE_AVAILABLE)
    back = await client.cleanup(running.workspace_id)
    assert back.completeness == obs.CLEANUP_COMPLETENESS_COMPLETE
    assert statuses(back, EXECUTION) == {PRESENT}
    for workspace in (running, failed):
        await client.delete(workspace.workspace_id)
