"""Every simulator fault on both backend personalities, and the stops the server starts by itself.

Rules: lifecycle.md "Stops and restarts the server does by itself", "Recovering from FAILED",
and the contract's "Fault injection" section."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, assert_conflict, meta
from tests.server import ServerProcess

SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED
FAILED_CMD = command_pb2.COMMAND_STATE_FAILED
UNCONFIRMED = wp.STOP_DURABILITY_UNCONFIRMED
CONFIRMED = wp.STOP_DURABILITY_CONFIRMED
VOLUME_READY = vol.VOLUME_STATE_READY


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["firecracker", "kibovm"])
def own_server(request: pytest.FixtureRequest, server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A server of our own: node silence affects every workspace of the node."""
    return server_factory("--sim-backend", request.param)


@pytest.fixture
async def own_client(own_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(own_server.address) as connected:
        yield connected


def start_request(workspace_id: str) -> ws.StartWorkspaceRequest:
    return ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)


def stop_request(workspace_id: str, force: bool = False) -> ws.StopWorkspaceRequest:
    mode = ws.STOP_MODE_FORCE if force else ws.STOP_MODE_GRACEFUL
    return ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, mode=mode)


async def wait_until(
    client: Client, workspace_id: str, check: Callable[[wp.Workspace], bool], within: float = 10.0
) -> wp.Workspace:
    deadline = time.monotonic() + within
    while True:
        workspace = await client.get(workspace_id)
        if check(workspace):
            return workspace
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {within}s; last seen:\n{workspace}")
        await asyncio.sleep(0.02)


async def assert_quiet(client: Client, workspace_id: str, seconds: float = 0.5) -> None:
    """No stored change of the workspace for `seconds`: the server starts nothing by itself."""
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
    try:
        first = await call.read()
        assert isinstance(first, ws.WatchWorkspaceResponse)
        try:
            change = await asyncio.wait_for(call.read(), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"the workspace changed by itself:\n{change}")
    finally:
        call.cancel()


def vol_request(volume_id: str) -> vol.GetVolumeRequest:
    return vol.GetVolumeRequest(volume_id=volume_id)


async def inject_and_wait_folded(client: Client, workspace_id: str, fault: int) -> wp.Workspace:
    """Inject a fault the node reports on its own, and wait until the report changed the workspace."""
    before = (await client.get(workspace_id)).etag
    await client.inject(workspace_id, fault)
    return await wait_until(client, workspace_id, lambda w: w.etag != before)


def state_changes(events: list[obs.WorkspaceEvent]) -> list[tuple[int, int]]:
    return [(e.from_state, e.to_state) for e in events if e.type == obs.EVENT_TYPE_STATE_CHANGED]


async def force_stop_to_stopped(client: Client, workspace_id: str) -> ws.StopWorkspaceResponse:
    response: ws.StopWorkspaceResponse = await client.stop(workspace_id, force=True)
    assert response.command.state == SUCCEEDED, response.command
    assert response.command.result.durability == UNCONFIRMED
    assert response.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert response.workspace.last_stop.durability == UNCONFIRMED
    return response


async def assert_failed_holding(client: Client, workspace_id: str, stage: str) -> wp.Workspace:
    """FAILED and still holding execution: start is rejected, force stop reaches STOPPED, start works."""
    failed = await client.wait_for(workspace_id, S.WORKSPACE_STATE_FAILED)
    assert failed.HasField("failure")
    assert failed.failure.stage == stage
    assert failed.failure.message
    await assert_conflict(client.ws.StartWorkspace(start_request(workspace_id)))
    assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_FAILED
    await force_stop_to_stopped(client, workspace_id)
    started = await client.start(workspace_id)
    assert started.command.state == SUCCEEDED
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert not started.workspace.HasField("failure")
    return failed


# -- guest reboot --------------------------------------------------------------------------


def restarted(resets: int) -> Callable[[wp.Workspace], bool]:
    """The guest reset `resets` times and its new VMM answers again."""
    return lambda w: w.guest.reset_count == resets and w.guest.responding


async def test_guest_reboot_firecracker_restarts_the_same_instance(client: Client) -> None:
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_GUEST_REBOOT)
    after = await wait_until(client, wid, lambda w: w.guest.reset_count == 1 and w.guest.responding)
    assert after.state == S.WORKSPACE_STATE_AVAILABLE
    assert after.execution_generation == workspace.execution_generation
    assert after.data_plane.credential_revision == workspace.data_plane.credential_revision
    assert after.HasField("guest") and after.guest.HasField("last_reset_time")
    assert after.guest.last_reset_time.ToDatetime() >= workspace.create_time.ToDatetime()
    assert not after.HasField("failure")
    assert not after.HasField("last_stop")
    events = await client.events(wid)
    assert any(e.type == obs.EVENT_TYPE_GUEST_RESET for e in events)
    # The workspace never left AVAILABLE.
    assert (S.WORKSPACE_STATE_AVAILABLE, S.WORKSPACE_STATE_FAILED) not in state_changes(events)
    await client.delete(wid)


async def test_guest_reboot_firecracker_more_than_three_resets_fails(client: Client) -> None:
    workspace = await client.create()
    wid = workspace.workspace_id
    for count in (1, 2, 3):
        await client.inject(wid, sim.FAULT_GUEST_REBOOT)
        seen = await wait_until(client, wid, restarted(count))
        assert seen.state == S.WORKSPACE_STATE_AVAILABLE
        assert seen.execution_generation == workspace.execution_generation
    await client.inject(wid, sim.FAULT_GUEST_REBOOT)
    failed = await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    assert failed.guest.reset_count == 4
    assert "4 resets within 10 minutes" in failed.failure.message
    assert failed.failure.stage == ""
    assert failed.execution_generation == workspace.execution_generation
    # Still holding execution: start is rejected until a force stop.
    await assert_conflict(client.ws.StartWorkspace(start_request(wid)))
    await force_stop_to_stopped(client, wid)
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert started.workspace.execution_generation == workspace.execution_generation + 1
    await client.delete(wid)


async def test_guest_reboot_kibovm_fails_holding_execution(kibovm_client: Client) -> None:
    client = kibovm_client
    workspace = await client.create()
    await client.inject(workspace.workspace_id, sim.FAULT_GUEST_REBOOT)
    failed = await assert_failed_holding(client, workspace.workspace_id, stage="")
    assert failed.execution_generation == workspace.execution_generation
    await client.delete(workspace.workspace_id)


# -- guest power-off -----------------------------------------------------------------------


async def test_guest_poweroff_kibovm_server_force_stops(kibovm_client: Client) -> None:
    client = kibovm_client
    capabilities = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
    assert "workspace.stop.guest_shutdown" in capabilities
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_GUEST_POWEROFF)
    stopped = await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
    assert stopped.last_stop.cause == wp.STOP_CAUSE_GUEST_SHUTDOWN
    assert stopped.last_stop.command_id.startswith("guest-shutdown/")
    assert stopped.last_stop.durability == UNCONFIRMED
    assert stopped.data_plane.credential_revision > workspace.data_plane.credential_revision
    command = await client.command(stopped.last_stop.command_id)
    assert command.workspace_id == wid
    assert command.state == SUCCEEDED
    assert command.result.durability == UNCONFIRMED
    assert command.stop_cause == wp.STOP_CAUSE_GUEST_SHUTDOWN
    # Until the stop completed the workspace was still AVAILABLE: no FAILED, no STOPPING.
    changes = state_changes(await client.events(wid))
    assert changes[-1] == (S.WORKSPACE_STATE_AVAILABLE, S.WORKSPACE_STATE_STOPPED)
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert not started.workspace.HasField("last_stop")
    await client.delete(wid)


async def test_guest_poweroff_firecracker_stays_available_guest_silent(client: Client) -> None:
    capabilities = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
    assert "workspace.stop.force" in capabilities
    assert "workspace.stop.guest_shutdown" not in capabilities
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_GUEST_POWEROFF)
    silent = await wait_until(client, wid, lambda w: not w.guest.responding)
    assert silent.state == S.WORKSPACE_STATE_AVAILABLE
    assert not silent.HasField("last_stop")
    assert not silent.HasField("failure")
    await assert_quiet(client, wid)
    # The way out: force stop, then start.
    await force_stop_to_stopped(client, wid)
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert started.workspace.guest.responding
    await client.delete(wid)


# -- VMM crash, host OOM, guest hang -------------------------------------------------------


async def test_vmm_crash_fails_holding_execution(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    await client.inject(workspace.workspace_id, sim.FAULT_VMM_CRASH)
    await assert_failed_holding(client, workspace.workspace_id, stage="")
    await client.delete(workspace.workspace_id)


async def test_host_oom_briefly_failed_then_server_force_stop(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=wid))
    snapshots: list[wp.Workspace] = []
    try:
        first = await call.read()
        assert isinstance(first, ws.WatchWorkspaceResponse)
        await client.inject(wid, sim.FAULT_HOST_OOM)
        while True:
            message = await asyncio.wait_for(call.read(), 10)
            assert isinstance(message, ws.WatchWorkspaceResponse)
            snapshots.append(message.workspace)
            if message.workspace.state == S.WORKSPACE_STATE_STOPPED:
                break
    finally:
        call.cancel()
    failed = [s for s in snapshots if s.state == S.WORKSPACE_STATE_FAILED]
    assert failed, "the workspace was never FAILED"
    assert "memory" in failed[0].failure.message.lower()
    assert failed[0].failure.stage == ""
    stopped = snapshots[-1]
    assert stopped.last_stop.cause == wp.STOP_CAUSE_HOST_MEMORY_EXHAUSTED
    assert stopped.last_stop.command_id.startswith("host-memory/")
    assert stopped.last_stop.durability == UNCONFIRMED
    assert stopped.data_plane.credential_revision > workspace.data_plane.credential_revision
    assert not stopped.HasField("failure")
    command = await client.command(stopped.last_stop.command_id)
    assert (command.state, command.result.durability) == (SUCCEEDED, UNCONFIRMED)
    assert command.stop_cause == wp.STOP_CAUSE_HOST_MEMORY_EXHAUSTED
    # The events feed records the brief FAILED and the server's stop.
    events = await client.events(wid)
    changes = state_changes(events)
    assert (S.WORKSPACE_STATE_AVAILABLE, S.WORKSPACE_STATE_FAILED) in changes
    assert changes[-1] == (S.WORKSPACE_STATE_FAILED, S.WORKSPACE_STATE_STOPPED)
    server_stops = [e for e in events if e.type == obs.EVENT_TYPE_SERVER_STOP]
    assert [e.command_id for e in server_stops] == [stopped.last_stop.command_id]
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    await client.delete(wid)


async def test_guest_hang_stays_available(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_GUEST_HANG)
    hung = await wait_until(client, wid, lambda w: not w.guest.responding)
    assert hung.state == S.WORKSPACE_STATE_AVAILABLE
    assert not hung.HasField("failure")
    assert hung.execution_generation == workspace.execution_generation
    assert any(e.type == obs.EVENT_TYPE_GUEST_NOT_RESPONDING for e in await client.events(wid))
    await assert_quiet(client, wid)
    # Force stop is the way out of a hung guest (AVAILABLE: accepted).
    await force_stop_to_stopped(client, wid)
    await client.delete(wid)


# -- sync failure: a graceful stop never escalates -----------------------------------------


async def test_sync_fail_stop_fails_and_server_never_escalates(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_SYNC_FAIL)
    stop = await client.stop(wid)
    assert stop.command.state == FAILED_CMD
    assert stop.command.error.code != 0
    failed = await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    assert failed.failure.stage != ""
    assert failed.failure.message
    # The stop's result stays queryable.
    command = await client.command(stop.command.command_id)
    assert command.state == FAILED_CMD
    # The server does not force-stop by itself.
    await assert_quiet(client, wid)
    events = await client.events(wid)
    assert not any(e.type == obs.EVENT_TYPE_SERVER_STOP for e in events)
    assert {e.command_id for e in events if e.command_id} <= {workspace_command_id(events), stop.command.command_id}
    # Still holding execution: start rejected, force stop accepted and reaches STOPPED.
    await assert_conflict(client.ws.StartWorkspace(start_request(wid)))
    forced = await force_stop_to_stopped(client, wid)
    assert forced.workspace.last_stop.command_id == forced.command.command_id
    assert not forced.workspace.HasField("failure")
    await client.delete(wid)


def workspace_command_id(events: list[obs.WorkspaceEvent]) -> str:
    """The create command's ID: the first event's command."""
    return events[0].command_id


# -- stall ---------------------------------------------------------------------------------


async def test_stall_holds_a_stop_until_unstall(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_STALL)
    request = stop_request(wid)
    response = await client.ws.StopWorkspace(request)
    assert response.command.state in (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
    assert response.workspace.state == S.WORKSPACE_STATE_STOPPING
    # A resend of the same command is an answer, not a second stop.
    again = await client.ws.StopWorkspace(request)
    assert again.command.command_id == response.command.command_id
    assert again.workspace.state == S.WORKSPACE_STATE_STOPPING
    await client.inject(wid, sim.FAULT_UNSTALL)
    settled = await client.settle(client.ws.StopWorkspace, request)
    assert settled.command.state == SUCCEEDED
    assert settled.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert settled.command.result.durability == CONFIRMED
    await client.delete(wid)


async def test_stall_for_next_created_holds_the_create(any_client: Client) -> None:
    client = any_client
    await client.inject("", sim.FAULT_STALL)
    request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec())
    response = await client.ws.CreateWorkspace(request)
    wid = response.workspace.workspace_id
    assert response.command.state in (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_CREATING
    await client.inject(wid, sim.FAULT_UNSTALL)
    settled = await client.settle(client.ws.CreateWorkspace, request)
    assert settled.command.state == SUCCEEDED
    assert settled.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    await client.delete(wid)


# -- create failures -----------------------------------------------------------------------


async def test_create_fail_not_holding_start_keeps_the_volume(any_client: Client) -> None:
    client = any_client
    await client.inject("", sim.FAULT_CREATE_FAIL)
    failed = await client.create()
    wid = failed.workspace_id
    assert failed.state == S.WORKSPACE_STATE_FAILED
    assert failed.failure.stage != ""
    [own] = [b for b in failed.spec.volumes if b.mount_path == "/data"]
    # Not holding execution: force stop is rejected, start is the way.
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    started = await client.start(wid)
    assert started.command.state == SUCCEEDED
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert not started.workspace.HasField("failure")
    [after] = [b for b in started.workspace.spec.volumes if b.mount_path == "/data"]
    assert after.volume_id == own.volume_id
    assert (after.storage_pool, after.capacity_gib) == (own.storage_pool, own.capacity_gib)
    volume = await client.vol.GetVolume(vol_request(own.volume_id))
    assert volume.volume.state == VOLUME_READY
    assert volume.volume.workspace_id == wid
    await client.delete(wid)


async def test_start_fail_not_holding_then_start_again(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.stop(wid)
    await client.inject(wid, sim.FAULT_CREATE_FAIL)
    failed = await client.start(wid)
    assert failed.command.state == FAILED_CMD
    assert failed.workspace.state == S.WORKSPACE_STATE_FAILED
    assert failed.workspace.failure.stage != ""
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    await client.delete(wid)


async def test_create_fail_holding_needs_force_stop(any_client: Client) -> None:
    client = any_client
    await client.inject("", sim.FAULT_CREATE_FAIL_HOLDING)
    failed = await client.create()
    assert failed.state == S.WORKSPACE_STATE_FAILED
    assert failed.failure.stage != ""
    await assert_failed_holding(client, failed.workspace_id, stage=failed.failure.stage)
    await client.delete(failed.workspace_id)


# -- destroy failure -----------------------------------------------------------------------


async def test_destroy_fail_then_delete_again_finishes(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_DESTROY_FAIL)
    first = await client.delete(wid)
    assert first.command.state == FAILED_CMD
    left = await client.wait_steady(wid)
    assert left.state == S.WORKSPACE_STATE_FAILED
    assert left.deletion_started
    # A delete was accepted: no start, no force stop, no configuration change.
    await assert_conflict(client.ws.StartWorkspace(start_request(wid)))
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    await assert_conflict(
        client.ws.SetWorkspaceNetworkPolicy(
            ws.SetWorkspaceNetworkPolicyRequest(
                metadata=meta(),
                workspace_id=wid,
                network_policy=wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_DENY_ALL),
            )
        )
    )
    second = await client.delete(wid)
    assert second.command.state == SUCCEEDED
    assert second.workspace.state == S.WORKSPACE_STATE_DELETED


# -- node silence (own servers) ------------------------------------------------------------


async def test_node_silent_unknown_then_back_to_previous_state(own_client: Client) -> None:
    client = own_client
    available = await client.create()
    failed = await client.create()
    await client.inject(failed.workspace_id, sim.FAULT_VMM_CRASH)
    await client.wait_for(failed.workspace_id, S.WORKSPACE_STATE_FAILED)
    try:
        await client.inject(available.workspace_id, sim.FAULT_NODE_SILENT)
        for workspace in (available, failed):
            unknown = await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_UNKNOWN)
            assert unknown.execution_generation == workspace.execution_generation
        wid = available.workspace_id
        # UNKNOWN: wait or delete; no start, no stop, no force stop without a graceful stop in progress.
        await assert_conflict(client.ws.StartWorkspace(start_request(wid)))
        await assert_conflict(client.ws.StopWorkspace(stop_request(wid)))
        await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
        labels = ws.SetWorkspaceLabelsRequest(metadata=meta(), workspace_id=wid, labels={"seen": "unknown"})
        assert (await client.ws.SetWorkspaceLabels(labels)).workspace.labels["seen"] == "unknown"
    finally:
        await client.inject(available.workspace_id, sim.FAULT_NODE_BACK)
    back = await client.wait_for(available.workspace_id, S.WORKSPACE_STATE_AVAILABLE)
    assert back.execution_generation == available.execution_generation
    assert (await client.wait_for(failed.workspace_id, S.WORKSPACE_STATE_FAILED)).failure.stage == ""
    events = await client.events(available.workspace_id)
    types = [e.type for e in events]
    assert obs.EVENT_TYPE_NODE_SILENT in types and obs.EVENT_TYPE_NODE_BACK in types
    changes = state_changes(events)
    assert (S.WORKSPACE_STATE_AVAILABLE, S.WORKSPACE_STATE_UNKNOWN) in changes
    assert changes[-1] == (S.WORKSPACE_STATE_UNKNOWN, S.WORKSPACE_STATE_AVAILABLE)
    for workspace in (available, failed):
        await client.delete(workspace.workspace_id)


async def test_node_silent_delete_finishes_when_back(own_client: Client) -> None:
    client = own_client
    workspace = await client.create()
    wid = workspace.workspace_id
    try:
        await client.inject(wid, sim.FAULT_NODE_SILENT)
        await client.wait_for(wid, S.WORKSPACE_STATE_UNKNOWN)
        request = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=wid)
        response = await client.ws.DeleteWorkspace(request)
        assert response.command.state in (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
        assert response.workspace.deletion_started
        assert response.workspace.state != S.WORKSPACE_STATE_DELETED
    finally:
        await client.inject(wid, sim.FAULT_NODE_BACK)
    settled = await client.settle(client.ws.DeleteWorkspace, request)
    assert settled.command.state == SUCCEEDED
    assert settled.workspace.state == S.WORKSPACE_STATE_DELETED


# -- the server starts no stop while a delete has begun or another command is in progress ----


async def server_stop_waits_for_stalled_stop(client: Client, fault: int, prefix: str, cause: int) -> None:
    """A fault that makes the server owe a stop arrives during a caller's stalled graceful stop:
    no server stop starts while it is in progress; once it ends, the server re-evaluates."""
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_STALL)
    request = stop_request(wid)
    response = await client.ws.StopWorkspace(request)
    assert response.workspace.state == S.WORKSPACE_STATE_STOPPING
    await inject_and_wait_folded(client, wid, fault)
    await assert_quiet(client, wid)
    events = await client.events(wid)
    assert not any(e.type == obs.EVENT_TYPE_SERVER_STOP for e in events)
    assert not any(e.command_id.startswith(prefix) for e in events)
    assert (await client.get(wid)).last_stop.command_id == request.metadata.command_id
    await client.inject(wid, sim.FAULT_UNSTALL)
    caller = (await client.settle(client.ws.StopWorkspace, request)).command
    assert caller.state in (SUCCEEDED, FAILED_CMD)
    # The VMM exited under the stop: nothing could be synced, the stop is never CONFIRMED.
    assert caller.result.durability != CONFIRMED, caller
    # The server re-evaluates once the caller's stop ended: STOPPED without any further request.
    final = await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
    assert final.last_stop.durability == UNCONFIRMED
    if final.last_stop.command_id != caller.command_id:
        assert final.last_stop.command_id.startswith(prefix)
        assert final.last_stop.cause == cause
    for event in await client.events(wid):
        if event.command_id.startswith(prefix):
            server_stop = await client.command(event.command_id)
            assert server_stop.create_time.ToNanoseconds() >= caller.update_time.ToNanoseconds()
    await client.delete(wid)


async def test_host_oom_during_stalled_graceful_stop_waits_for_it(any_client: Client) -> None:
    await server_stop_waits_for_stalled_stop(
        any_client, sim.FAULT_HOST_OOM, "host-memory/", wp.STOP_CAUSE_HOST_MEMORY_EXHAUSTED
    )


async def test_guest_poweroff_kibovm_during_stalled_stop_waits_for_it(kibovm_client: Client) -> None:
    await server_stop_waits_for_stalled_stop(
        kibovm_client, sim.FAULT_GUEST_POWEROFF, "guest-shutdown/", wp.STOP_CAUSE_GUEST_SHUTDOWN
    )


async def test_graceful_stop_of_a_crashed_vmm_is_never_confirmed(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_STALL)
    request = stop_request(wid)
    await client.ws.StopWorkspace(request)
    await inject_and_wait_folded(client, wid, sim.FAULT_VMM_CRASH)
    await client.inject(wid, sim.FAULT_UNSTALL)
    caller = (await client.settle(client.ws.StopWorkspace, request)).command
    assert caller.state in (SUCCEEDED, FAILED_CMD)
    assert caller.result.durability != CONFIRMED, caller
    if caller.state == FAILED_CMD:
        # The stop did not force-destroy: the caller force-stops.
        assert (await client.get(wid)).state == S.WORKSPACE_STATE_FAILED
        await force_stop_to_stopped(client, wid)
    assert (await client.get(wid)).last_stop.durability == UNCONFIRMED
    await client.delete(wid)


@pytest.mark.parametrize(
    ("personality", "fault"),
    [
        ("firecracker", sim.FAULT_GUEST_HANG),
        ("kibovm", sim.FAULT_GUEST_HANG),
        ("firecracker", sim.FAULT_GUEST_POWEROFF),
    ],
    ids=["firecracker-hang", "kibovm-hang", "firecracker-poweroff"],
)
async def test_graceful_stop_of_a_silent_guest_is_never_confirmed(
    request: pytest.FixtureRequest, personality: str, fault: int
) -> None:
    server: ServerProcess = request.getfixturevalue(personality)
    async with Client.connect(server.address) as client:
        wid = (await client.create()).workspace_id
        await client.inject(wid, fault)
        await wait_until(client, wid, lambda w: not w.guest.responding)
        stop = await client.stop(wid)
        # Nobody in the guest answers: its writes cannot be confirmed on disk.
        assert stop.command.result.durability != CONFIRMED, stop.command
        if stop.command.state == FAILED_CMD:
            failed = await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
            assert failed.failure.stage != ""
            await force_stop_to_stopped(client, wid)
        else:
            assert stop.command.state == SUCCEEDED
        assert (await client.get(wid)).state == S.WORKSPACE_STATE_STOPPED
        await client.delete(wid)


async def test_host_oom_after_delete_began_starts_no_server_stop(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    await client.inject(wid, sim.FAULT_STALL)
    request = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=wid)
    response = await client.ws.DeleteWorkspace(request)
    assert response.workspace.state == S.WORKSPACE_STATE_DELETING
    await inject_and_wait_folded(client, wid, sim.FAULT_HOST_OOM)
    await assert_quiet(client, wid)
    events = await client.events(wid)
    assert not any(e.command_id.startswith("host-memory/") for e in events)
    current = await client.get(wid)
    assert current.state == S.WORKSPACE_STATE_DELETING
    assert not current.HasField("last_stop")
    await client.inject(wid, sim.FAULT_UNSTALL)
    settled = await client.settle(client.ws.DeleteWorkspace, request)
    assert settled.command.state == SUCCEEDED
    assert settled.workspace.state == S.WORKSPACE_STATE_DELETED
    assert not any(e.command_id.startswith("host-memory/") for e in await client.events(wid))
