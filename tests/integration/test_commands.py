"""Commands over gRPC: idempotency, command-ID reuse, lookup, settling and error precedence.

All against the shared firecracker server; each test makes its own workspaces."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import TERMINAL, Client, ErrorInfo, S, error_of, meta, new_id, rejected

C = command_pb2
SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED
RUNNING_STATES = (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)


def expect(error: ErrorInfo, code: grpc.StatusCode, reason: str) -> None:
    assert (error.code, error.reason) == (code, reason), error
    assert error.info.reason == reason, error.info


def run_label() -> str:
    return f"r{uuid.uuid4().hex[:16]}"


async def listed(client: Client, flt: str, include_deleted: bool = False) -> list[wp.Workspace]:
    found: list[wp.Workspace] = []
    token = ""
    while True:
        request = ws.ListWorkspacesRequest(
            page_size=1000, page_token=token, filter=flt, include_deleted=include_deleted
        )
        response = await client.ws.ListWorkspaces(request)
        found.extend(response.workspaces)
        token = response.next_page_token
        if not token:
            return found


async def accepted_count(client: Client, workspace_id: str, command_id: str) -> int:
    """How many times a command was accepted (executed) on the workspace, from its events."""
    events = await client.events(workspace_id)
    return sum(1 for e in events if e.type == obs.EVENT_TYPE_COMMAND_ACCEPTED and e.command_id == command_id)


def create_request(command_id: str, **labels: str) -> ws.CreateWorkspaceRequest:
    return ws.CreateWorkspaceRequest(
        metadata=wp.CommandMetadata(command_id=command_id), spec=wp.WorkspaceSpec(labels=labels)
    )


def stop_request(command_id: str, workspace_id: str, **fields: Any) -> ws.StopWorkspaceRequest:
    return ws.StopWorkspaceRequest(
        metadata=wp.CommandMetadata(command_id=command_id), workspace_id=workspace_id, **fields
    )


def in_an_hour() -> Timestamp:
    return Timestamp(seconds=int(time.time()) + 3600)


# -- idempotency ----------------------------------------------------------------------


async def test_resent_create_returns_the_same_workspace(client: Client) -> None:
    run = run_label()
    request = create_request(new_id(), run=run)
    first = await client.settle(client.ws.CreateWorkspace, request)
    second = await client.ws.CreateWorkspace(request)
    assert second.workspace.workspace_id == first.workspace.workspace_id
    assert second.command.command_id == first.command.command_id == request.metadata.command_id
    assert second.command.state == SUCCEEDED
    assert [w.workspace_id for w in await listed(client, f'labels.run = "{run}"')] == [first.workspace.workspace_id]
    assert await accepted_count(client, first.workspace.workspace_id, request.metadata.command_id) == 1


async def test_resent_stop_after_a_new_start_does_not_stop_again(client: Client) -> None:
    workspace = await client.create()
    workspace_id = workspace.workspace_id
    stop_id = new_id()
    stopped = await client.stop(workspace_id, command_id=stop_id)
    assert (stopped.command.state, stopped.workspace.state) == (SUCCEEDED, S.WORKSPACE_STATE_STOPPED)
    started = await client.start(workspace_id)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    before = await client.events(workspace_id)

    again = await client.ws.StopWorkspace(stop_request(stop_id, workspace_id, mode=ws.STOP_MODE_GRACEFUL))
    assert again.command.command_id == stop_id
    assert again.command.state == SUCCEEDED
    assert again.command.result.durability == wp.STOP_DURABILITY_CONFIRMED
    assert again.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert again.workspace.execution_generation == 2
    assert not again.workspace.HasField("last_stop")
    # Nothing was recorded by the resend: no new event at all.
    assert await client.events(workspace_id) == before
    assert await accepted_count(client, workspace_id, stop_id) == 1


async def test_sixteen_concurrent_duplicate_creates_make_one_workspace(client: Client) -> None:
    run = run_label()
    request = create_request(new_id(), run=run)
    answers = await asyncio.gather(*(client.ws.CreateWorkspace(request) for _ in range(16)))
    workspace_ids = {a.workspace.workspace_id for a in answers}
    assert len(workspace_ids) == 1
    assert {a.command.command_id for a in answers} == {request.metadata.command_id}
    (workspace_id,) = workspace_ids
    await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE)
    assert [w.workspace_id for w in await listed(client, f'labels.run = "{run}"')] == [workspace_id]
    assert await accepted_count(client, workspace_id, request.metadata.command_id) == 1
    instances = await client.obs.ListWorkspaceInstances(obs.ListWorkspaceInstancesRequest(workspace_id=workspace_id))
    assert len(instances.instances) == 1


async def test_sixteen_concurrent_duplicate_stops_execute_once(client: Client) -> None:
    workspace = await client.create()
    request = stop_request(new_id(), workspace.workspace_id)
    answers = await asyncio.gather(*(client.ws.StopWorkspace(request) for _ in range(16)))
    assert {a.command.command_id for a in answers} == {request.metadata.command_id}
    assert {a.command.workspace_id for a in answers} == {workspace.workspace_id}
    settled = await client.settle(client.ws.StopWorkspace, request)
    assert settled.command.state == SUCCEEDED
    assert settled.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert await accepted_count(client, workspace.workspace_id, request.metadata.command_id) == 1
    events = await client.events(workspace.workspace_id)
    assert sum(1 for e in events if e.to_state == S.WORKSPACE_STATE_STOPPING and e.from_state != e.to_state) == 1


async def test_concurrent_creates_with_one_id_but_different_requests_make_one_workspace(client: Client) -> None:
    run = run_label()
    command_id = new_id()
    requests = [create_request(command_id, run=run, n=str(i)) for i in range(16)]
    answers = await asyncio.gather(*(client.ws.CreateWorkspace(r) for r in requests), return_exceptions=True)
    ok = [a for a in answers if isinstance(a, ws.CreateWorkspaceResponse)]
    errors = [a for a in answers if not isinstance(a, ws.CreateWorkspaceResponse)]
    assert len(ok) == 1, answers
    for error in errors:
        assert isinstance(error, grpc.aio.AioRpcError), error
        expect(error_of(error), grpc.StatusCode.ALREADY_EXISTS, "COMMAND_ID_REUSED")
    assert [w.workspace_id for w in await listed(client, f'labels.run = "{run}"')] == [ok[0].workspace.workspace_id]


# -- command ID reuse ---------------------------------------------------------------------


async def test_reusing_a_command_id_for_another_request_is_already_exists(client: Client) -> None:
    workspace = await client.create()
    other = await client.create()
    workspace_id = workspace.workspace_id
    stop_id = new_id()
    await client.stop(workspace_id, command_id=stop_id)
    snapshot = await client.get(workspace_id)
    other_snapshot = await client.get(other.workspace_id)
    reuse = meta(stop_id)
    attempts: list[Awaitable[Any]] = [
        # another operation
        client.ws.StartWorkspace(ws.StartWorkspaceRequest(metadata=reuse, workspace_id=workspace_id)),
        client.ws.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=reuse, workspace_id=workspace_id)),
        client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=reuse)),
        client.ws.SetWorkspaceLabels(
            ws.SetWorkspaceLabelsRequest(metadata=reuse, workspace_id=workspace_id, labels={"a": "b"})
        ),
        client.vol.CreateVolume(vol.CreateVolumeRequest(metadata=reuse)),
        # another workspace
        client.ws.StopWorkspace(stop_request(stop_id, other.workspace_id, mode=ws.STOP_MODE_GRACEFUL)),
        # other parameters
        client.ws.StopWorkspace(stop_request(stop_id, workspace_id, mode=ws.STOP_MODE_FORCE)),
        client.ws.StopWorkspace(
            stop_request(stop_id, workspace_id, mode=ws.STOP_MODE_GRACEFUL, expected_expiration_revision=1)
        ),
    ]
    for attempt in attempts:
        expect(await rejected(attempt), grpc.StatusCode.ALREADY_EXISTS, "COMMAND_ID_REUSED")
    assert await client.get(workspace_id) == snapshot
    assert await client.get(other.workspace_id) == other_snapshot
    assert (await client.command(stop_id)).kind == command_pb2.COMMAND_KIND_STOP


async def test_reusing_a_create_id_with_another_spec_is_already_exists(client: Client) -> None:
    command_id = new_id()
    first = await client.settle(client.ws.CreateWorkspace, create_request(command_id, team="a"))
    for request in (
        create_request(command_id, team="b"),
        create_request(command_id),
        ws.CreateWorkspaceRequest(
            metadata=meta(command_id),
            spec=wp.WorkspaceSpec(labels={"team": "a"}, resources=wp.Resources(vcpus=3)),
        ),
    ):
        expect(await rejected(client.ws.CreateWorkspace(request)), grpc.StatusCode.ALREADY_EXISTS, "COMMAND_ID_REUSED")
    # The same request is still a resend.
    again = await client.ws.CreateWorkspace(create_request(command_id, team="a"))
    assert again.workspace.workspace_id == first.workspace.workspace_id


# -- GetWorkspaceCommand ------------------------------------------------------------------


async def test_get_workspace_command_finds_every_command(client: Client) -> None:
    create_id = new_id()
    created = await client.settle(client.ws.CreateWorkspace, create_request(create_id))
    workspace_id = created.workspace.workspace_id
    await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE)
    ids: dict[str, int] = {create_id: C.COMMAND_KIND_CREATE}

    labels_id = new_id()
    await client.ws.SetWorkspaceLabels(
        ws.SetWorkspaceLabelsRequest(metadata=meta(labels_id), workspace_id=workspace_id, labels={"x": "y"})
    )
    ids[labels_id] = C.COMMAND_KIND_SET_LABELS
    expire_id = new_id()
    await client.ws.SetWorkspaceExpiration(
        ws.SetWorkspaceExpirationRequest(
            metadata=meta(expire_id),
            workspace_id=workspace_id,
            expire_time=in_an_hour(),
            action=wp.EXPIRATION_ACTION_STOP,
        )
    )
    ids[expire_id] = C.COMMAND_KIND_SET_EXPIRATION
    clear_id = new_id()
    await client.ws.ClearWorkspaceExpiration(
        ws.ClearWorkspaceExpirationRequest(metadata=meta(clear_id), workspace_id=workspace_id)
    )
    ids[clear_id] = C.COMMAND_KIND_CLEAR_EXPIRATION
    for kind, call in (
        (C.COMMAND_KIND_STOP, client.stop(workspace_id, command_id=(stop_id := new_id()))),
        (C.COMMAND_KIND_START, client.start(workspace_id, command_id=(start_id := new_id()))),
        (C.COMMAND_KIND_FORCE_STOP, client.stop(workspace_id, force=True, command_id=(force_id := new_id()))),
        (C.COMMAND_KIND_DELETE, client.delete(workspace_id, command_id=(delete_id := new_id()))),
    ):
        response = await call
        assert response.command.state == SUCCEEDED, response
        ids[response.command.command_id] = kind
    assert {stop_id, start_id, force_id, delete_id} <= ids.keys()
    volume_id = new_id()
    await client.vol.CreateVolume(vol.CreateVolumeRequest(metadata=meta(volume_id)))

    for command_id, wanted in ids.items():
        command = await client.command(command_id)
        assert (command.command_id, command.workspace_id, command.kind) == (command_id, workspace_id, wanted)
        assert command.state == SUCCEEDED
    assert (await client.command(force_id)).result.durability == wp.STOP_DURABILITY_UNCONFIRMED
    assert (await client.command(stop_id)).result.durability == wp.STOP_DURABILITY_CONFIRMED
    assert (await client.command(volume_id)).state == SUCCEEDED

    for unknown in (new_id(), "guest-shutdown/nope", "host-memory/nope", "x"):
        error = await rejected(client.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=unknown)))
        expect(error, grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    for bad in ("", "a b", "x" * 129):
        error = await rejected(client.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=bad)))
        expect(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
        assert error.detail.field == "command_id"


async def test_get_workspace_command_finds_the_servers_own_stops(client: Client, kibovm_client: Client) -> None:
    workspace = await client.create()
    await client.inject(workspace.workspace_id, sim.FAULT_HOST_OOM)
    stopped = await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_STOPPED)
    assert stopped.last_stop.command_id.startswith("host-memory/")
    command = await client.command(stopped.last_stop.command_id)
    assert (command.workspace_id, command.state) == (workspace.workspace_id, SUCCEEDED)
    assert command.stop_cause == wp.STOP_CAUSE_HOST_MEMORY_EXHAUSTED

    other = await kibovm_client.create()
    await kibovm_client.inject(other.workspace_id, sim.FAULT_GUEST_POWEROFF)
    stopped = await kibovm_client.wait_for(other.workspace_id, S.WORKSPACE_STATE_STOPPED)
    assert stopped.last_stop.command_id.startswith("guest-shutdown/")
    command = await kibovm_client.command(stopped.last_stop.command_id)
    assert (command.workspace_id, command.state) == (other.workspace_id, SUCCEEDED)
    assert command.stop_cause == wp.STOP_CAUSE_GUEST_SHUTDOWN


async def test_configuration_commands_succeed_at_once_and_leave_the_state_alone(client: Client) -> None:
    """Labels, expiration and revoke are recorded SUCCEEDED and change no visible state."""
    available = await client.create()
    stopped = await client.create()
    await client.stop(stopped.workspace_id)
    failed = await client.create()
    await client.inject(failed.workspace_id, sim.FAULT_VMM_CRASH)
    await client.wait_for(failed.workspace_id, S.WORKSPACE_STATE_FAILED)
    calls: list[tuple[str, Any]] = [
        (available.workspace_id, client.ws.RevokeWorkspaceDataPlaneAccess),
        (available.workspace_id, client.ws.SetWorkspaceExpiration),
        (available.workspace_id, client.ws.ClearWorkspaceExpiration),
        (stopped.workspace_id, client.ws.ClearWorkspaceExpiration),
    ]
    for workspace_id in (available.workspace_id, stopped.workspace_id, failed.workspace_id):
        calls.append((workspace_id, client.ws.SetWorkspaceLabels))
    for workspace_id, method in calls:
        before = await client.get(workspace_id)
        request: Any
        if method is client.ws.SetWorkspaceLabels:
            request = ws.SetWorkspaceLabelsRequest(metadata=meta(), workspace_id=workspace_id, labels={"k": "v"})
        elif method is client.ws.SetWorkspaceExpiration:
            request = ws.SetWorkspaceExpirationRequest(
                metadata=meta(), workspace_id=workspace_id, expire_time=in_an_hour(), action=wp.EXPIRATION_ACTION_STOP
            )
        elif method is client.ws.ClearWorkspaceExpiration:
            request = ws.ClearWorkspaceExpirationRequest(metadata=meta(), workspace_id=workspace_id)
        else:
            request = ws.RevokeWorkspaceDataPlaneAccessRequest(metadata=meta(), workspace_id=workspace_id)
        response = await method(request)
        assert response.command.state == SUCCEEDED
        assert response.workspace.state == before.state, (type(request).__name__, response.workspace.state)
        assert (await client.get(workspace_id)).state == before.state
    events = await client.events(available.workspace_id)
    changes = [e.to_state for e in events if e.type == obs.EVENT_TYPE_STATE_CHANGED]
    assert changes == [S.WORKSPACE_STATE_CREATING, S.WORKSPACE_STATE_AVAILABLE]
    assert (await client.get(available.workspace_id)).data_plane.credential_revision > 0


# -- settling -----------------------------------------------------------------------------


async def test_a_stalled_stop_answers_running_and_resends_return_it_until_terminal(client: Client) -> None:
    workspace = await client.create()
    workspace_id = workspace.workspace_id
    await client.inject(workspace_id, sim.FAULT_STALL)
    request = stop_request(new_id(), workspace_id)
    first = await client.ws.StopWorkspace(request)
    # Answered (after the settle window) while still executing: a normal answer.
    assert first.command.state in RUNNING_STATES
    assert first.workspace.state == S.WORKSPACE_STATE_STOPPING
    for _ in range(2):
        again = await client.ws.StopWorkspace(request)
        assert again.command.command_id == request.metadata.command_id
        assert again.command.state in RUNNING_STATES
        assert again.command.create_time == first.command.create_time
    assert (await client.command(request.metadata.command_id)).state in RUNNING_STATES
    await client.inject(workspace_id, sim.FAULT_UNSTALL)
    settled = await client.settle(client.ws.StopWorkspace, request)
    assert settled.command.state == SUCCEEDED
    assert settled.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert await accepted_count(client, workspace_id, request.metadata.command_id) == 1
    final = await client.ws.StopWorkspace(request)
    assert (final.command.state, final.command.command_id) == (SUCCEEDED, request.metadata.command_id)


async def test_a_stalled_create_answers_pending_and_resends_return_the_same_workspace(client: Client) -> None:
    await client.inject("", sim.FAULT_STALL)
    request = create_request(new_id())
    first = await client.ws.CreateWorkspace(request)
    assert first.command.state in RUNNING_STATES
    assert first.workspace.state == S.WORKSPACE_STATE_CREATING
    again = await client.ws.CreateWorkspace(request)
    assert again.workspace.workspace_id == first.workspace.workspace_id
    assert again.command.state in RUNNING_STATES
    await client.inject(first.workspace.workspace_id, sim.FAULT_UNSTALL)
    settled = await client.settle(client.ws.CreateWorkspace, request)
    assert settled.command.state == SUCCEEDED
    assert settled.workspace.workspace_id == first.workspace.workspace_id
    assert settled.workspace.state == S.WORKSPACE_STATE_AVAILABLE


async def test_a_settled_answer_carries_the_terminal_state(client: Client) -> None:
    """With nothing stalled a stop finishes within the settle window: one call is enough."""
    workspace = await client.create()
    response = await client.ws.StopWorkspace(stop_request(new_id(), workspace.workspace_id))
    assert response.command.state in TERMINAL
    assert response.workspace.state == S.WORKSPACE_STATE_STOPPED


# -- error precedence ---------------------------------------------------------------------


async def test_error_precedence_first_row_wins(client: Client) -> None:
    workspace = await client.create()
    workspace_id = workspace.workspace_id
    stop_id = new_id()
    await client.stop(workspace_id, command_id=stop_id)  # STOPPED, revision 1
    unknown = "ws-00000000000000000000"
    invalid, reserved = grpc.StatusCode.INVALID_ARGUMENT, "guest-shutdown/x"
    cases: list[tuple[str, Awaitable[Any], grpc.StatusCode, str]] = [
        # row 1 (malformed) beats row 2 (reserved prefix)
        ("bad characters in a reserved ID", client.ws.StopWorkspace(stop_request("guest-shutdown/x y", unknown)),
         invalid, "INVALID_ARGUMENT"),
        ("bad field with a reserved ID (create)", client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(
            metadata=meta(reserved), spec=wp.WorkspaceSpec(resources=wp.Resources(vcpus=100_000)))),
         invalid, "INVALID_ARGUMENT"),
        ("bad field with a reserved ID (stop)", client.ws.StopWorkspace(
            stop_request(reserved, workspace_id, expected_expiration_revision=-1)), invalid, "INVALID_ARGUMENT"),
        ("bad mode with a reserved ID", client.ws.StopWorkspace(stop_request("host-memory/x", workspace_id, mode=9)),
         invalid, "INVALID_ARGUMENT"),
        ("bad field with a reserved ID (volume)", client.vol.CreateVolume(
            vol.CreateVolumeRequest(metadata=meta(reserved), capacity_gib=-1)), invalid, "INVALID_ARGUMENT"),
        # row 1 beats row 3 (unknown workspace)
        ("bad command ID, unknown workspace", client.ws.StopWorkspace(stop_request("", unknown)),
         invalid, "INVALID_ARGUMENT"),
        # row 2 beats row 3
        ("reserved ID, unknown workspace", client.ws.StopWorkspace(stop_request(reserved, unknown)),
         invalid, "RESERVED_COMMAND_ID"),
        ("reserved ID, unknown workspace (delete)", client.ws.DeleteWorkspace(
            ws.DeleteWorkspaceRequest(metadata=meta("host-memory/y"), workspace_id=unknown)),
         invalid, "RESERVED_COMMAND_ID"),
        # row 3 beats row 4 (reused ID)
        ("reused ID, unknown workspace", client.ws.StopWorkspace(stop_request(stop_id, unknown)),
         grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
        # row 4 beats row 5 (revision) and row 6 (state)
        ("reused ID, wrong revision", client.ws.StartWorkspace(ws.StartWorkspaceRequest(
            metadata=meta(stop_id), workspace_id=workspace_id, expected_expiration_revision=7)),
         grpc.StatusCode.ALREADY_EXISTS, "COMMAND_ID_REUSED"),
        ("reused ID, state conflict", client.ws.StopWorkspace(stop_request(stop_id, workspace_id, mode=2)),
         grpc.StatusCode.ALREADY_EXISTS, "COMMAND_ID_REUSED"),
        # row 5 beats row 6
        ("wrong revision, state conflict", client.ws.StopWorkspace(
            stop_request(new_id(), workspace_id, expected_expiration_revision=7)),
         grpc.StatusCode.ABORTED, "REVISION_MISMATCH"),
        ("row 6 alone", client.ws.StopWorkspace(stop_request(new_id(), workspace_id)),
         grpc.StatusCode.FAILED_PRECONDITION, "CONFLICT"),
    ]  # fmt: skip
    before = await client.get(workspace_id)
    for name, call, code, reason in cases:
        error = await rejected(call)
        assert (error.code, error.reason, error.info.reason) == (code, reason, reason), name
    assert await client.get(workspace_id) == before


async def test_a_resend_is_answered_before_any_state_or_revision_rule(client: Client) -> None:
    workspace = await client.create()
    workspace_id = workspace.workspace_id
    expire = ws.SetWorkspaceExpirationRequest(
        metadata=meta(),
        workspace_id=workspace_id,
        expected_expiration_revision=1,
        expire_time=in_an_hour(),
        action=wp.EXPIRATION_ACTION_STOP,
    )
    first = await client.ws.SetWorkspaceExpiration(expire)
    assert first.workspace.expiration.revision == 2
    # The revision no longer matches, but the resend returns the recorded command and changes nothing.
    again = await client.ws.SetWorkspaceExpiration(expire)
    assert again.command.command_id == expire.metadata.command_id
    assert again.command.state == SUCCEEDED
    assert again.workspace.expiration.revision == 2
    other = ws.SetWorkspaceExpirationRequest()
    other.CopyFrom(expire)
    other.metadata.command_id = new_id()
    expect(await rejected(client.ws.SetWorkspaceExpiration(other)), grpc.StatusCode.ABORTED, "REVISION_MISMATCH")

    stop = stop_request(new_id(), workspace_id, expected_expiration_revision=2)
    assert (await client.settle(client.ws.StopWorkspace, stop)).workspace.state == S.WORKSPACE_STATE_STOPPED
    # STOPPED rejects a graceful stop, but not a resend of the one that stopped it.
    assert (await client.ws.StopWorkspace(stop)).command.state == SUCCEEDED
    expect(
        await rejected(client.ws.StopWorkspace(stop_request(new_id(), workspace_id))),
        grpc.StatusCode.FAILED_PRECONDITION,
        "CONFLICT",
    )
    delete = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
    deleted = await client.settle(client.ws.DeleteWorkspace, delete)
    assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
    # DELETED allows nothing, yet resends of its commands are answered.
    assert (await client.ws.DeleteWorkspace(delete)).command.state == SUCCEEDED
    resent = await client.ws.StopWorkspace(stop)
    assert (resent.command.state, resent.workspace.state) == (SUCCEEDED, S.WORKSPACE_STATE_DELETED)
    assert (await client.ws.SetWorkspaceExpiration(expire)).command.state == SUCCEEDED
    expect(
        await rejected(
            client.ws.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id))
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "CONFLICT",
    )
