"""Expiration: revisions, the states that allow set and clear, and what happens at expiry.

Rules: lifecycle.md "What each state allows" (expiration), "Stop durability and cause";
api-contract.md `expected_expiration_revision` and SetWorkspaceExpiration/ClearWorkspaceExpiration."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, assert_conflict, meta, rejected

SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED
STOP = wp.EXPIRATION_ACTION_STOP
DELETE = wp.EXPIRATION_ACTION_DELETE


async def assert_mismatch(call: Awaitable[Any]) -> None:
    error = await rejected(call)
    assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "REVISION_MISMATCH")


def at(seconds_from_now: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int((time.time() + seconds_from_now) * 1e9))
    return stamp


def set_request(
    workspace_id: str, in_seconds: float, action: wp.ExpirationAction, expected: int = 0
) -> ws.SetWorkspaceExpirationRequest:
    return ws.SetWorkspaceExpirationRequest(
        metadata=meta(),
        workspace_id=workspace_id,
        expected_expiration_revision=expected,
        expire_time=at(in_seconds),
        action=action,
    )


def clear_request(workspace_id: str, expected: int = 0) -> ws.ClearWorkspaceExpirationRequest:
    return ws.ClearWorkspaceExpirationRequest(
        metadata=meta(), workspace_id=workspace_id, expected_expiration_revision=expected
    )


async def set_expiration(client: Client, request: ws.SetWorkspaceExpirationRequest) -> wp.Workspace:
    response = await client.ws.SetWorkspaceExpiration(request)
    assert response.command.state == SUCCEEDED
    workspace: wp.Workspace = response.workspace
    return workspace


async def clear_expiration(client: Client, request: ws.ClearWorkspaceExpirationRequest) -> wp.Workspace:
    response = await client.ws.ClearWorkspaceExpiration(request)
    assert response.command.state == SUCCEEDED
    workspace: wp.Workspace = response.workspace
    return workspace


# -- revisions -----------------------------------------------------------------------------


async def test_set_and_clear_bump_the_revision(any_client: Client) -> None:
    client = any_client
    created = await client.create()
    wid = created.workspace_id
    assert created.expiration.revision == 1
    assert not created.expiration.HasField("expire_time")
    assert created.expiration.action == wp.EXPIRATION_ACTION_UNSPECIFIED

    request = set_request(wid, 3600, STOP, expected=1)
    first = await set_expiration(client, request)
    assert first.expiration.revision >= 2
    assert first.expiration.expire_time == request.expire_time
    assert first.expiration.action == STOP

    # Setting again replaces the current one.
    replace = set_request(wid, 7200, DELETE, expected=first.expiration.revision)
    second = await set_expiration(client, replace)
    assert second.expiration.revision >= first.expiration.revision + 1
    assert (second.expiration.expire_time, second.expiration.action) == (replace.expire_time, DELETE)

    cleared = await clear_expiration(client, clear_request(wid, expected=second.expiration.revision))
    assert cleared.expiration.revision >= second.expiration.revision + 1
    assert not cleared.expiration.HasField("expire_time")

    # Clearing when none is set still bumps.
    again = await clear_expiration(client, clear_request(wid))
    assert again.expiration.revision >= cleared.expiration.revision + 1
    # A resend of the same set command returns it and does not bump again.
    resent = await client.ws.SetWorkspaceExpiration(request)
    assert resent.command.command_id == request.metadata.command_id
    assert (await client.get(wid)).expiration.revision == again.expiration.revision
    await client.delete(wid)


async def test_revision_mismatch_aborts_and_changes_nothing(any_client: Client) -> None:
    client = any_client
    created = await client.create()
    wid = created.workspace_id
    current = await set_expiration(client, set_request(wid, 3600, STOP))
    revision = current.expiration.revision
    stale = revision - 1
    await assert_mismatch(client.ws.SetWorkspaceExpiration(set_request(wid, 60, DELETE, expected=stale)))
    await assert_mismatch(client.ws.ClearWorkspaceExpiration(clear_request(wid, expected=revision + 5)))
    await assert_mismatch(
        client.ws.StopWorkspace(
            ws.StopWorkspaceRequest(metadata=meta(), workspace_id=wid, expected_expiration_revision=stale)
        )
    )
    await assert_mismatch(
        client.ws.DeleteWorkspace(
            ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=wid, expected_expiration_revision=stale)
        )
    )
    unchanged = await client.get(wid)
    assert unchanged.etag == current.etag
    assert unchanged.state == S.WORKSPACE_STATE_AVAILABLE
    assert unchanged.expiration == current.expiration
    # The matching revision is accepted.
    stop = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=wid, expected_expiration_revision=revision)
    stopped = await client.settle(client.ws.StopWorkspace, stop)
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
    # A mismatch is reported before a state conflict (STOPPED does not allow setting).
    await assert_mismatch(client.ws.SetWorkspaceExpiration(set_request(wid, 60, STOP, expected=stale)))
    start = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=wid, expected_expiration_revision=stale)
    await assert_mismatch(client.ws.StartWorkspace(start))
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_STOPPED
    await client.delete(wid)


# -- the states that allow set and clear ---------------------------------------------------


async def test_set_only_available_clear_available_and_stopped(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    set_ = await set_expiration(client, set_request(wid, 3600, DELETE))
    await client.stop(wid)
    stopped = await client.get(wid)
    # STOPPED: setting is rejected, the expiration is unchanged; clearing is allowed.
    await assert_conflict(client.ws.SetWorkspaceExpiration(set_request(wid, 60, STOP)))
    assert (await client.get(wid)).expiration == stopped.expiration
    assert stopped.expiration.expire_time == set_.expiration.expire_time
    cleared = await clear_expiration(client, clear_request(wid))
    assert not cleared.expiration.HasField("expire_time")
    assert cleared.expiration.revision > stopped.expiration.revision

    # STARTING and STOPPING: neither.
    await client.inject(wid, sim.FAULT_STALL)
    start = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=wid)
    assert (await client.ws.StartWorkspace(start)).workspace.state == S.WORKSPACE_STATE_STARTING
    await assert_conflict(client.ws.SetWorkspaceExpiration(set_request(wid, 60, STOP)))
    await assert_conflict(client.ws.ClearWorkspaceExpiration(clear_request(wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    await client.settle(client.ws.StartWorkspace, start)
    await client.inject(wid, sim.FAULT_STALL)
    stop = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=wid)
    assert (await client.ws.StopWorkspace(stop)).workspace.state == S.WORKSPACE_STATE_STOPPING
    await assert_conflict(client.ws.SetWorkspaceExpiration(set_request(wid, 60, STOP)))
    await assert_conflict(client.ws.ClearWorkspaceExpiration(clear_request(wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    await client.settle(client.ws.StopWorkspace, stop)

    # FAILED: neither.
    await client.start(wid)
    await client.inject(wid, sim.FAULT_VMM_CRASH)
    await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    await assert_conflict(client.ws.SetWorkspaceExpiration(set_request(wid, 60, STOP)))
    await assert_conflict(client.ws.ClearWorkspaceExpiration(clear_request(wid)))

    # DELETED: neither.
    await client.delete(wid)
    await assert_conflict(client.ws.SetWorkspaceExpiration(set_request(wid, 60, STOP)))
    await assert_conflict(client.ws.ClearWorkspaceExpiration(clear_request(wid)))


async def test_set_rejected_while_creating(any_client: Client) -> None:
    client = any_client
    await client.inject("", sim.FAULT_STALL)
    create = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec())
    wid = (await client.ws.CreateWorkspace(create)).workspace.workspace_id
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_CREATING
    await assert_conflict(client.ws.SetWorkspaceExpiration(set_request(wid, 60, STOP)))
    await assert_conflict(client.ws.ClearWorkspaceExpiration(clear_request(wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    await client.settle(client.ws.CreateWorkspace, create)
    await client.delete(wid)


# -- at expiry -----------------------------------------------------------------------------


async def test_expiry_stop(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    await set_expiration(client, set_request(wid, 1.0, STOP))
    stopped = await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED, within=15)
    assert stopped.last_stop.cause == wp.STOP_CAUSE_EXPIRED
    assert stopped.last_stop.durability == wp.STOP_DURABILITY_CONFIRMED
    command = await client.command(stopped.last_stop.command_id)
    assert command.workspace_id == wid
    assert command.stop_cause == wp.STOP_CAUSE_EXPIRED
    assert (command.state, command.result.durability) == (SUCCEEDED, wp.STOP_DURABILITY_CONFIRMED)
    events = await client.events(wid)
    assert any(e.type == obs.EVENT_TYPE_EXPIRED for e in events)
    # Stopped by expiry: a normal STOPPED workspace, it starts again.
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    await client.delete(wid)


async def test_expiry_delete(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    await set_expiration(client, set_request(wid, 1.0, DELETE))
    deleted = await client.wait_for(wid, S.WORKSPACE_STATE_DELETED, within=15)
    assert deleted.deletion_started
    assert any(e.type == obs.EVENT_TYPE_EXPIRED for e in await client.events(wid))


async def test_expiry_delete_applies_to_a_stopped_workspace(client: Client) -> None:
    wid = (await client.create()).workspace_id
    await set_expiration(client, set_request(wid, 1.0, DELETE))
    await client.stop(wid)
    await client.wait_for(wid, S.WORKSPACE_STATE_DELETED, within=15)


async def test_expiration_set_at_create_fires(client: Client) -> None:
    request = ws.CreateWorkspaceRequest(
        metadata=meta(), spec=wp.WorkspaceSpec(), expire_time=at(1.0), expiration_action=STOP
    )
    response = await client.settle(client.ws.CreateWorkspace, request)
    wid = response.workspace.workspace_id
    assert response.workspace.expiration.revision == 1
    assert response.workspace.expiration.action == STOP
    stopped = await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED, within=15)
    assert stopped.last_stop.cause == wp.STOP_CAUSE_EXPIRED
    await client.delete(wid)


async def test_cleared_expiration_does_not_fire(client: Client) -> None:
    wid = (await client.create()).workspace_id
    await set_expiration(client, set_request(wid, 0.8, DELETE))
    await clear_expiration(client, clear_request(wid))
    # A second workspace expiring later than the cleared time is our witness that expiry ran.
    witness = (await client.create()).workspace_id
    await set_expiration(client, set_request(witness, 1.2, STOP))
    await client.wait_for(witness, S.WORKSPACE_STATE_STOPPED, within=15)
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_AVAILABLE
    await client.delete(wid)
    await client.delete(witness)


async def test_expiry_stop_sync_failure_does_not_escalate(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    await client.inject(wid, sim.FAULT_SYNC_FAIL)
    await set_expiration(client, set_request(wid, 1.0, STOP))
    failed = await client.wait_for(wid, S.WORKSPACE_STATE_FAILED, within=15)
    assert failed.failure.stage != ""
    # Quiet: no force stop started by the server.
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=wid))
    try:
        await call.read()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call.read(), 0.5)
    finally:
        call.cancel()
    assert not any(e.type == obs.EVENT_TYPE_SERVER_STOP for e in await client.events(wid))
    forced = await client.stop(wid, force=True)
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert forced.command.result.durability == wp.STOP_DURABILITY_UNCONFIRMED
    await client.delete(wid)
