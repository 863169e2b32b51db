"""Recovering from FAILED, the force-stop table, stop durability and last_stop.

Rules: lifecycle.md "Recovering from FAILED", "Force stop", "Stop durability and cause"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, assert_conflict, error_of, meta
from tests.server import ServerProcess

SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED
FAILED_CMD = command_pb2.COMMAND_STATE_FAILED
IN_PROGRESS = (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
CANCELLED = grpc.StatusCode.CANCELLED.value[0]


def stop_request(workspace_id: str, force: bool = False) -> ws.StopWorkspaceRequest:
    mode = ws.STOP_MODE_FORCE if force else ws.STOP_MODE_GRACEFUL
    return ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, mode=mode)


def start_request(workspace_id: str) -> ws.StartWorkspaceRequest:
    return ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)


# -- the recovery procedure ----------------------------------------------------------------


@dataclass
class Recovery:
    force_stop_accepted: bool
    start_accepted: bool
    workspace: wp.Workspace


async def recover(client: Client, workspace_id: str) -> Recovery:
    """The documented procedure: (1) force stop; (2) start, also when (1) was rejected;
    (3) if both were rejected, read the workspace again."""
    force_accepted = start_accepted = True
    try:
        forced = await client.stop(workspace_id, force=True)
        assert forced.command.state == SUCCEEDED, forced.command
        assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
        assert forced.command.result.durability == wp.STOP_DURABILITY_UNCONFIRMED
    except grpc.aio.AioRpcError as error:
        assert error_of(error).reason == "CONFLICT"
        force_accepted = False
    try:
        started = await client.start(workspace_id)
        assert started.command.state == SUCCEEDED, started.command
        return Recovery(force_accepted, start_accepted, started.workspace)
    except grpc.aio.AioRpcError as error:
        assert error_of(error).reason == "CONFLICT"
        start_accepted = False
    return Recovery(force_accepted, start_accepted, await client.get(workspace_id))


async def _create_failed(client: Client) -> str:
    await client.inject("", sim.FAULT_CREATE_FAIL)
    return (await client.create()).workspace_id


async def _start_failed(client: Client) -> str:
    wid = (await client.create()).workspace_id
    await client.stop(wid)
    await client.inject(wid, sim.FAULT_CREATE_FAIL)
    await client.start(wid)
    return wid


async def _create_failed_holding(client: Client) -> str:
    await client.inject("", sim.FAULT_CREATE_FAIL_HOLDING)
    return (await client.create()).workspace_id


async def _start_failed_holding(client: Client) -> str:
    wid = (await client.create()).workspace_id
    await client.stop(wid)
    await client.inject(wid, sim.FAULT_CREATE_FAIL_HOLDING)
    await client.start(wid)
    return wid


async def _vmm_crashed(client: Client) -> str:
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_VMM_CRASH)
    return wid


async def _sync_failed(client: Client) -> str:
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_SYNC_FAIL)
    await client.stop(wid)
    return wid


@dataclass(frozen=True)
class Situation:
    name: str
    make: Callable[[Client], Awaitable[str]]
    stage: str | None  # None: any non-empty stage
    holds_execution: bool


SITUATIONS = [
    # create or start failed, the control plane destroyed the instance it had sent: start directly.
    Situation("create failed, instance destroyed", _create_failed, None, False),
    Situation("start failed, instance destroyed", _start_failed, None, False),
    # create or start failed and destroying the instance failed too: holds execution.
    Situation("create failed, destroy failed", _create_failed_holding, None, True),
    Situation("start failed, destroy failed", _start_failed_holding, None, True),
    # the VMM exited unexpectedly while running: holds, no failure.stage.
    Situation("VMM exited unexpectedly", _vmm_crashed, "", True),
    # a graceful stop whose sync failed: holds, whatever stage.
    Situation("graceful stop's sync failed", _sync_failed, None, True),
]


@pytest.mark.parametrize("situation", SITUATIONS, ids=lambda s: s.name)
async def test_failed_recovery_table(any_client: Client, situation: Situation) -> None:
    client = any_client
    wid = await situation.make(client)
    failed = await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    if situation.stage is None:
        assert failed.failure.stage != ""
    else:
        assert failed.failure.stage == situation.stage
    assert failed.failure.message
    generation = failed.execution_generation
    if situation.holds_execution:
        # Start is rejected until force stop; the workspace is unchanged by the rejection.
        await assert_conflict(client.ws.StartWorkspace(start_request(wid)))
    else:
        await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    unchanged = await client.get(wid)
    assert (unchanged.state, unchanged.etag) == (S.WORKSPACE_STATE_FAILED, failed.etag)
    outcome = await recover(client, wid)
    assert outcome.force_stop_accepted == situation.holds_execution
    assert outcome.start_accepted
    assert outcome.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert outcome.workspace.execution_generation == generation + 1
    assert not outcome.workspace.HasField("failure")
    await client.delete(wid)


async def test_recovery_after_host_oom_server_already_stopped_it(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_HOST_OOM)
    await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
    outcome = await recover(client, wid)
    assert not outcome.force_stop_accepted  # STOPPED: nothing to force-stop
    assert outcome.start_accepted
    assert outcome.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    await client.delete(wid)


async def test_recovery_kibovm_guest_reboot(kibovm_client: Client) -> None:
    client = kibovm_client
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_GUEST_REBOOT)
    failed = await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    assert failed.failure.stage == ""
    outcome = await recover(client, wid)
    assert (outcome.force_stop_accepted, outcome.start_accepted) == (True, True)
    assert outcome.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    await client.delete(wid)


async def test_recovery_both_rejected_read_again_delete_again(any_client: Client) -> None:
    """A delete was accepted but could not finish: force stop and start are both rejected;
    reading again shows the deletion begun, and deleting again completes it."""
    client = any_client
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_DESTROY_FAIL)
    first = await client.delete(wid)
    assert first.command.state == FAILED_CMD
    outcome = await recover(client, wid)
    assert (outcome.force_stop_accepted, outcome.start_accepted) == (False, False)
    assert outcome.workspace.state == S.WORKSPACE_STATE_FAILED
    assert outcome.workspace.deletion_started
    second = await client.delete(wid)
    assert second.command.state == SUCCEEDED
    assert second.workspace.state == S.WORKSPACE_STATE_DELETED


# -- the force-stop table ------------------------------------------------------------------


async def test_force_stop_supersedes_stalled_graceful_stop(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_STALL)
    graceful = stop_request(wid)
    stopping = await client.ws.StopWorkspace(graceful)
    assert stopping.workspace.state == S.WORKSPACE_STATE_STOPPING
    assert stopping.command.state in IN_PROGRESS
    # The force stop that supersedes the stalled step is not itself stalled: no UNSTALL here.
    forced = await client.stop(wid, force=True)
    assert forced.command.state == SUCCEEDED
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert forced.workspace.last_stop.command_id == forced.command.command_id
    assert forced.workspace.last_stop.durability == wp.STOP_DURABILITY_UNCONFIRMED
    cancelled = await client.command(graceful.metadata.command_id)
    assert cancelled.state == FAILED_CMD
    assert cancelled.error.code == CANCELLED
    # Resending the superseded stop returns its result, it does not stop again.
    resent = await client.ws.StopWorkspace(graceful)
    assert resent.command.state == FAILED_CMD and resent.command.error.code == CANCELLED
    await client.inject(wid, sim.FAULT_UNSTALL)
    await client.delete(wid)


async def test_force_stop_rejections(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    # A force stop in progress is not a graceful stop: a second force stop is rejected.
    await client.inject(wid, sim.FAULT_STALL)
    first = stop_request(wid, force=True)
    response = await client.ws.StopWorkspace(first)
    assert response.workspace.state == S.WORKSPACE_STATE_STOPPING
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    assert (await client.settle(client.ws.StopWorkspace, first)).workspace.state == S.WORKSPACE_STATE_STOPPED
    # STOPPED: rejected (and a graceful stop too).
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid)))
    # STARTING: rejected.
    await client.inject(wid, sim.FAULT_STALL)
    start = start_request(wid)
    assert (await client.ws.StartWorkspace(start)).workspace.state == S.WORKSPACE_STATE_STARTING
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    assert (await client.settle(client.ws.StartWorkspace, start)).workspace.state == S.WORKSPACE_STATE_AVAILABLE
    # DELETING (a delete was accepted): rejected.
    await client.inject(wid, sim.FAULT_STALL)
    delete = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=wid)
    assert (await client.ws.DeleteWorkspace(delete)).workspace.state == S.WORKSPACE_STATE_DELETING
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    await assert_conflict(client.ws.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    assert (await client.settle(client.ws.DeleteWorkspace, delete)).workspace.state == S.WORKSPACE_STATE_DELETED
    # DELETED: rejected.
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))


async def test_force_stop_rejected_while_creating(any_client: Client) -> None:
    client = any_client
    await client.inject("", sim.FAULT_STALL)
    create = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec())
    response = await client.ws.CreateWorkspace(create)
    wid = response.workspace.workspace_id
    assert response.workspace.state == S.WORKSPACE_STATE_CREATING
    await assert_conflict(client.ws.StopWorkspace(stop_request(wid, force=True)))
    # Delete cancels the creation in progress.
    deleted = await client.delete(wid)
    assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
    cancelled = await client.command(create.metadata.command_id)
    assert cancelled.state == FAILED_CMD and cancelled.error.code == CANCELLED
    await client.inject(wid, sim.FAULT_UNSTALL)


@pytest.fixture(scope="module")
def own_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory("--sim-backend", "firecracker")


async def test_force_stop_accepted_unknown_with_graceful_stop_processing(own_server: ServerProcess) -> None:
    async with Client.connect(own_server.address) as client:
        wid = (await client.create()).workspace_id
        await client.inject(wid, sim.FAULT_STALL)
        graceful = stop_request(wid)
        await client.ws.StopWorkspace(graceful)
        forced = stop_request(wid, force=True)
        try:
            await client.inject(wid, sim.FAULT_NODE_SILENT)
            await client.wait_for(wid, S.WORKSPACE_STATE_UNKNOWN)
            response = await client.ws.StopWorkspace(forced)
            assert response.command.state in IN_PROGRESS
            assert response.workspace.last_stop.command_id == forced.metadata.command_id
            cancelled = await client.command(graceful.metadata.command_id)
            assert cancelled.state == FAILED_CMD and cancelled.error.code == CANCELLED
        finally:
            await client.inject(wid, sim.FAULT_NODE_BACK)
        settled = await client.settle(client.ws.StopWorkspace, forced)
        assert settled.command.state == SUCCEEDED
        assert settled.workspace.state == S.WORKSPACE_STATE_STOPPED
        assert settled.command.result.durability == wp.STOP_DURABILITY_UNCONFIRMED
        await client.inject(wid, sim.FAULT_UNSTALL)
        await client.delete(wid)


# -- stop durability and last_stop ---------------------------------------------------------


async def test_graceful_stop_confirmed_last_stop_lifecycle(any_client: Client) -> None:
    client = any_client
    created = await client.create()
    wid = created.workspace_id
    assert not created.HasField("last_stop")
    await client.inject(wid, sim.FAULT_STALL)
    request = stop_request(wid)
    stopping = await client.ws.StopWorkspace(request)
    assert stopping.workspace.state == S.WORKSPACE_STATE_STOPPING
    last = stopping.workspace.last_stop
    assert (last.cause, last.command_id, last.durability) == (
        wp.STOP_CAUSE_REQUESTED,
        request.metadata.command_id,
        wp.STOP_DURABILITY_UNSPECIFIED,
    )
    assert stopping.command.result.durability == wp.STOP_DURABILITY_UNSPECIFIED
    # Stop invalidates every data-plane credential.
    assert stopping.workspace.data_plane.credential_revision > created.data_plane.credential_revision
    await client.inject(wid, sim.FAULT_UNSTALL)
    stopped = await client.settle(client.ws.StopWorkspace, request)
    assert stopped.command.state == SUCCEEDED
    assert stopped.command.result.durability == wp.STOP_DURABILITY_CONFIRMED
    assert stopped.command.stop_cause == wp.STOP_CAUSE_REQUESTED
    last = stopped.workspace.last_stop
    assert (last.cause, last.command_id, last.durability) == (
        wp.STOP_CAUSE_REQUESTED,
        request.metadata.command_id,
        wp.STOP_DURABILITY_CONFIRMED,
    )
    # Gone once a start is accepted (already while STARTING).
    await client.inject(wid, sim.FAULT_STALL)
    start = start_request(wid)
    starting = await client.ws.StartWorkspace(start)
    assert starting.workspace.state == S.WORKSPACE_STATE_STARTING
    assert not starting.workspace.HasField("last_stop")
    await client.inject(wid, sim.FAULT_UNSTALL)
    started = await client.settle(client.ws.StartWorkspace, start)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert not started.workspace.HasField("last_stop")
    await client.delete(wid)


async def test_force_stop_unconfirmed_last_stop_gone_after_delete(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    forced = await client.stop(wid, force=True)
    assert forced.command.state == SUCCEEDED
    assert forced.command.result.durability == wp.STOP_DURABILITY_UNCONFIRMED
    last = forced.workspace.last_stop
    assert (last.cause, last.command_id, last.durability) == (
        wp.STOP_CAUSE_REQUESTED,
        forced.command.command_id,
        wp.STOP_DURABILITY_UNCONFIRMED,
    )
    assert (await client.get(wid)).last_stop == last
    # Gone once a delete is accepted (already while DELETING).
    await client.inject(wid, sim.FAULT_STALL)
    delete = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=wid)
    deleting = await client.ws.DeleteWorkspace(delete)
    assert not deleting.workspace.HasField("last_stop")
    await client.inject(wid, sim.FAULT_UNSTALL)
    deleted = await client.settle(client.ws.DeleteWorkspace, delete)
    assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
    assert not deleted.workspace.HasField("last_stop")


async def test_stop_result_queryable_after_the_fact(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    stop = await client.stop(wid)
    deadline = time.monotonic() + 5
    command = await client.command(stop.command.command_id)
    while command.state in IN_PROGRESS and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        command = await client.command(stop.command.command_id)
    assert command.workspace_id == wid
    assert command.kind == command_pb2.COMMAND_KIND_STOP
    assert (command.state, command.result.durability) == (SUCCEEDED, wp.STOP_DURABILITY_CONFIRMED)
    await client.delete(wid)
