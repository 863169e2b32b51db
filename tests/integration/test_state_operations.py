"""Every workspace state x every operation, end to end over gRPC against the real server.

The expected table is lifecycle.md's "What each state allows", its bullets and the
force-stop table. Each (situation, operation) pair is its own test: a rejection must be
FAILED_PRECONDITION with ErrorDetail.reason CONFLICT (and ErrorInfo reason "CONFLICT"),
record no command and leave the workspace unchanged (same GetWorkspace, same etag); an
accepted operation must take effect. Situations are reached with the simulator's faults.

Rejections share one workspace per situation (a rejection changes nothing, and each test
checks that); an accepted operation always gets a fresh workspace. UNKNOWN needs a silent
node, which silences every workspace on it, so those cases run on a server of their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, error_of, meta, new_id, state_name
from tests.server import ServerProcess

PENDING, RUNNING = command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING
SUCCEEDED, FAILED = command_pb2.COMMAND_STATE_SUCCEEDED, command_pb2.COMMAND_STATE_FAILED
CANCELLED = 1  # google.rpc.Code.CANCELLED: a superseded or cancelled command
SUITE_LABELS = {"suite": "state-operations"}

OPS = (
    "stop",
    "force_stop",
    "start",
    "delete",
    "set_expiration",
    "clear_expiration",
    "set_labels",
    "resize",
    "set_network_policy",
    "bind_volume",
    "unbind_volume",
    "revoke",
)
LABELS = frozenset({"set_labels"})  # every state except DELETED

# situation -> (visible state, operations the spec allows)
TABLE: dict[str, tuple[int, frozenset[str]]] = {
    "CREATING": (S.WORKSPACE_STATE_CREATING, LABELS | {"delete"}),
    "AVAILABLE": (
        S.WORKSPACE_STATE_AVAILABLE,
        LABELS | {"stop", "force_stop", "delete", "set_network_policy", "set_expiration", "clear_expiration", "revoke"},
    ),
    "STOPPING": (S.WORKSPACE_STATE_STOPPING, LABELS | {"delete", "force_stop"}),
    "STOPPED": (
        S.WORKSPACE_STATE_STOPPED,
        LABELS
        | {"start", "delete", "resize", "bind_volume", "unbind_volume", "set_network_policy", "clear_expiration"},
    ),
    "STARTING": (S.WORKSPACE_STATE_STARTING, LABELS | {"delete"}),
    "FAILED_not_holding": (S.WORKSPACE_STATE_FAILED, LABELS | {"start", "delete"}),
    "FAILED_holding_create": (S.WORKSPACE_STATE_FAILED, LABELS | {"force_stop", "delete"}),
    "FAILED_holding_crash": (S.WORKSPACE_STATE_FAILED, LABELS | {"force_stop", "delete"}),
    "FAILED_holding_sync": (S.WORKSPACE_STATE_FAILED, LABELS | {"force_stop", "delete"}),
    "FAILED_delete_failed": (S.WORKSPACE_STATE_FAILED, LABELS | {"delete"}),
    "UNKNOWN": (S.WORKSPACE_STATE_UNKNOWN, LABELS | {"delete"}),
    "UNKNOWN_graceful_stop": (S.WORKSPACE_STATE_UNKNOWN, LABELS | {"delete", "force_stop"}),
    "DELETING": (S.WORKSPACE_STATE_DELETING, LABELS),
    "DELETED": (S.WORKSPACE_STATE_DELETED, frozenset()),
}
ON_OWN_SERVER = frozenset({"UNKNOWN", "UNKNOWN_graceful_stop"})


def _pairs() -> list[tuple[str, str]]:
    """Per situation: the rejections first (sharing a workspace), then the accepted ones."""
    pairs = []
    for situation, (_, allowed) in TABLE.items():
        pairs += [(situation, op) for op in OPS if op not in allowed]
        pairs += [(situation, op) for op in OPS if op in allowed]
    return pairs


PAIRS = _pairs()


# -- the workspaces under test ---------------------------------------------------------------


@dataclass
class Subject:
    client: Client
    workspace_id: str
    situation: str
    # The command left in progress (stalled) or that made the situation, and its request.
    command_id: str = ""
    resend: Callable[[], Any] | None = None
    stalled: bool = False


@dataclass
class Lab:
    main: Client
    own: Client
    # A workspace on the own server's only node: shows whether that node is silent.
    sentinel: str = ""
    silent: bool = False
    shared: dict[str, Subject] = field(default_factory=dict)
    made: list[Subject] = field(default_factory=list)

    async def silence(self) -> None:
        if not self.silent:
            await self.own.inject(self.sentinel, sim.FAULT_NODE_SILENT)
            await self.own.wait_for(self.sentinel, S.WORKSPACE_STATE_UNKNOWN)
            self.silent = True

    async def back(self) -> None:
        if self.silent:
            await self.own.inject(self.sentinel, sim.FAULT_NODE_BACK)
            # Only liveness takes the idle sentinel out of UNKNOWN: the node is back.
            await self.own.wait_for(self.sentinel, S.WORKSPACE_STATE_AVAILABLE)
            self.silent = False


@pytest.fixture(scope="module")
async def lab(firecracker: ServerProcess, server_factory: Callable[..., ServerProcess]) -> AsyncIterator[Lab]:
    own_server = server_factory("--sim-nodes", "1")
    async with Client.connect(firecracker.address) as main, Client.connect(own_server.address) as own:
        result = Lab(main, own)
        result.sentinel = (await own.create(labels=SUITE_LABELS)).workspace_id
        yield result
        # Leave the shared server usable: nothing stalled, no node silent, nothing left.
        await result.back()
        subjects = list(result.shared.values()) + result.made
        for subject in subjects:
            if subject.stalled:
                await subject.client.inject(subject.workspace_id, sim.FAULT_UNSTALL)
        await asyncio.gather(*(_discard(s.client, s.workspace_id) for s in subjects))


async def _discard(client: Client, workspace_id: str) -> None:
    try:
        await client.ws.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id))
    except grpc.aio.AioRpcError as error:
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION  # already DELETING or DELETED


def _spec() -> wp.WorkspaceSpec:
    return wp.WorkspaceSpec(labels=SUITE_LABELS)


def _stop(workspace_id: str, force: bool = False) -> ws.StopWorkspaceRequest:
    mode = ws.STOP_MODE_FORCE if force else ws.STOP_MODE_GRACEFUL
    return ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, mode=mode)


async def _in_progress(client: Client, method: Any, request: Any) -> None:
    """Send a command whose step is stalled: it is answered still in progress."""
    response = await method(request)
    assert response.command.state in (PENDING, RUNNING), response.command


async def make(lab: Lab, situation: str) -> Subject:
    """A fresh workspace in `situation`."""
    c = lab.own if situation in ON_OWN_SERVER else lab.main
    if c is lab.own:
        await lab.back()  # a create needs its node to report
    subject = Subject(c, "", situation)
    lab.made.append(subject)
    if situation == "CREATING":
        await c.inject("", sim.FAULT_STALL)  # applies to the next workspace created
        create = ws.CreateWorkspaceRequest(metadata=meta(), spec=_spec())
        subject.stalled, subject.command_id = True, create.metadata.command_id
        response = await c.ws.CreateWorkspace(create)
        assert response.command.state in (PENDING, RUNNING)
        subject.workspace_id = response.workspace.workspace_id
    elif situation in ("FAILED_not_holding", "FAILED_holding_create"):
        fault = sim.FAULT_CREATE_FAIL if situation == "FAILED_not_holding" else sim.FAULT_CREATE_FAIL_HOLDING
        await c.inject("", fault)
        subject.workspace_id = (await c.create(labels=SUITE_LABELS)).workspace_id
    else:
        subject.workspace_id = (await c.create(labels=SUITE_LABELS)).workspace_id
    workspace_id = subject.workspace_id

    if situation in ("STOPPING", "UNKNOWN_graceful_stop"):
        await c.inject(workspace_id, sim.FAULT_STALL)
        subject.stalled = True
        stop = _stop(workspace_id)
        subject.command_id, subject.resend = stop.metadata.command_id, lambda: c.ws.StopWorkspace(stop)
        await _in_progress(c, c.ws.StopWorkspace, stop)
    elif situation in ("STOPPED", "STARTING"):
        stop = _stop(workspace_id)
        stopped = await c.settle(c.ws.StopWorkspace, stop)
        assert stopped.command.state == SUCCEEDED
        subject.command_id, subject.resend = stop.metadata.command_id, lambda: c.ws.StopWorkspace(stop)
        if situation == "STARTING":
            await c.inject(workspace_id, sim.FAULT_STALL)
            subject.stalled = True
            start = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
            subject.command_id = start.metadata.command_id
            await _in_progress(c, c.ws.StartWorkspace, start)
    elif situation == "FAILED_holding_crash":
        await c.inject(workspace_id, sim.FAULT_VMM_CRASH)
    elif situation == "FAILED_holding_sync":
        await c.inject(workspace_id, sim.FAULT_SYNC_FAIL)
        stop = _stop(workspace_id)
        assert (await c.settle(c.ws.StopWorkspace, stop)).command.state == FAILED
    elif situation == "FAILED_delete_failed":
        await c.inject(workspace_id, sim.FAULT_DESTROY_FAIL)
        assert (await c.delete(workspace_id)).command.state == FAILED
    elif situation == "DELETING":
        await c.inject(workspace_id, sim.FAULT_STALL)
        subject.stalled = True
        delete = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
        subject.command_id = delete.metadata.command_id
        await _in_progress(c, c.ws.DeleteWorkspace, delete)
    elif situation == "DELETED":
        assert (await c.delete(workspace_id)).command.state == SUCCEEDED
        await _files_released(c, workspace_id)

    if situation in ON_OWN_SERVER:
        await lab.silence()
    workspace = await c.wait_for(workspace_id, TABLE[situation][0])
    await _check_situation(subject, workspace)
    return subject


async def _files_released(c: Client, workspace_id: str, within: float = 10.0) -> None:
    """After delete the files go asynchronously (a stored change): wait until they are gone."""
    deadline = time.monotonic() + within
    while (await c.cleanup(workspace_id)).state != obs.CLEANUP_STATE_COMPLETE:
        assert time.monotonic() < deadline, f"{workspace_id}: files still pending"
        await asyncio.sleep(0.02)


async def _check_situation(subject: Subject, workspace: wp.Workspace) -> None:
    """The situation is the one meant: what made it is visible on the workspace."""
    situation = subject.situation
    if situation.startswith("FAILED"):
        stage = {
            "FAILED_not_holding": "CREATE",
            "FAILED_holding_create": "CREATE",
            "FAILED_holding_crash": "",  # an unexpected VMM exit has no stage
            "FAILED_holding_sync": "STOP",
            "FAILED_delete_failed": "DELETE",
        }[situation]
        assert workspace.failure.stage == stage, workspace.failure
        assert workspace.deletion_started is (situation == "FAILED_delete_failed")
        request = obs.ListWorkspaceInstancesRequest(workspace_id=workspace.workspace_id)
        instances = (await subject.client.obs.ListWorkspaceInstances(request)).instances
        current = max(instances, key=lambda i: i.execution_generation)
        if situation != "FAILED_delete_failed":
            assert current.holds_execution is situation.startswith("FAILED_holding"), current
    if subject.command_id and situation not in ("STOPPED", "FAILED_holding_sync"):
        command = await subject.client.command(subject.command_id)
        assert command.state in (PENDING, RUNNING), command


async def subject_for(lab: Lab, situation: str, op: str) -> Subject:
    """The shared workspace for rejections; a fresh one for an accepted operation."""
    if op in TABLE[situation][1]:
        return await make(lab, situation)
    subject = lab.shared.get(situation)
    if subject is None:
        subject = lab.shared[situation] = await make(lab, situation)
    elif situation in ON_OWN_SERVER:
        await lab.silence()
        await subject.client.wait_for(subject.workspace_id, S.WORKSPACE_STATE_UNKNOWN)
    return subject


# -- the operations --------------------------------------------------------------------------


async def build(c: Client, op: str, workspace: wp.Workspace, command_id: str) -> tuple[Any, Any]:
    """The RPC and a valid request for `op` (valid, so only the state can reject it)."""
    workspace_id, m = workspace.workspace_id, wp.CommandMetadata(command_id=command_id)
    if op in ("stop", "force_stop"):
        mode = ws.STOP_MODE_FORCE if op == "force_stop" else ws.STOP_MODE_GRACEFUL
        return c.ws.StopWorkspace, ws.StopWorkspaceRequest(metadata=m, workspace_id=workspace_id, mode=mode)
    if op == "start":
        return c.ws.StartWorkspace, ws.StartWorkspaceRequest(metadata=m, workspace_id=workspace_id)
    if op == "delete":
        return c.ws.DeleteWorkspace, ws.DeleteWorkspaceRequest(metadata=m, workspace_id=workspace_id)
    if op == "set_expiration":
        return c.ws.SetWorkspaceExpiration, ws.SetWorkspaceExpirationRequest(
            metadata=m,
            workspace_id=workspace_id,
            expire_time=Timestamp(seconds=int(time.time()) + 3600),
            action=wp.EXPIRATION_ACTION_STOP,
        )
    if op == "clear_expiration":
        return c.ws.ClearWorkspaceExpiration, ws.ClearWorkspaceExpirationRequest(metadata=m, workspace_id=workspace_id)
    if op == "set_labels":
        return c.ws.SetWorkspaceLabels, ws.SetWorkspaceLabelsRequest(
            metadata=m, workspace_id=workspace_id, labels={**SUITE_LABELS, "rule": "x"}, annotations={"note": "y"}
        )
    if op == "resize":
        resources = wp.Resources(vcpus=3, writable_layer_gib=20)
        return c.ws.ResizeWorkspace, ws.ResizeWorkspaceRequest(
            metadata=m, workspace_id=workspace_id, resources=resources
        )
    if op == "set_network_policy":
        policy = wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_DENY_ALL)
        return c.ws.SetWorkspaceNetworkPolicy, ws.SetWorkspaceNetworkPolicyRequest(
            metadata=m, workspace_id=workspace_id, network_policy=policy
        )
    if op == "bind_volume":
        volume = await c.create_volume()
        binding = wp.VolumeBinding(volume_id=volume.volume_id, mount_path="/mnt/extra")
        return c.ws.BindWorkspaceVolume, ws.BindWorkspaceVolumeRequest(
            metadata=m, workspace_id=workspace_id, binding=binding
        )
    if op == "unbind_volume":
        volume_id = workspace.spec.volumes[0].volume_id  # its own volume at /data
        return c.ws.UnbindWorkspaceVolume, ws.UnbindWorkspaceVolumeRequest(
            metadata=m, workspace_id=workspace_id, volume_id=volume_id
        )
    assert op == "revoke"
    return c.ws.RevokeWorkspaceDataPlaneAccess, ws.RevokeWorkspaceDataPlaneAccessRequest(
        metadata=m, workspace_id=workspace_id
    )


# -- the test --------------------------------------------------------------------------------


@pytest.mark.parametrize(("situation", "op"), PAIRS, ids=[f"{s}-{op}" for s, op in PAIRS])
async def test_state_operation(lab: Lab, situation: str, op: str) -> None:
    subject = await subject_for(lab, situation, op)
    c = subject.client
    before = await c.get(subject.workspace_id)
    assert before.state == TABLE[situation][0], state_name(before.state)
    command_id = new_id("state-ops")
    method, request = await build(c, op, before, command_id)
    if op in TABLE[situation][1]:
        try:
            await accepted(lab, subject, op, before, method, request)
        finally:
            if subject.stalled:
                await c.inject(subject.workspace_id, sim.FAULT_UNSTALL)
        return

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(request)
    error = error_of(caught.value)
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION, caught.value
    assert error.reason == "CONFLICT"
    assert error.info.reason == "CONFLICT"
    assert error.detail.workspace_state == state_name(before.state)
    after = await c.get(subject.workspace_id)
    assert after.etag == before.etag
    assert after == before
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await c.command(command_id)  # a rejected command is not recorded
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND

    if (situation, op) == ("STOPPED", "stop") or (situation, op) == ("UNKNOWN_graceful_stop", "stop"):
        # Resending the stop that is in progress or done (same command ID, same request)
        # returns its status instead of a CONFLICT, and changes nothing.
        assert subject.resend is not None
        resent = (await subject.resend()).command
        assert resent.command_id == subject.command_id
        if situation == "STOPPED":
            assert resent.state == SUCCEEDED
            assert resent.result.durability == wp.STOP_DURABILITY_CONFIRMED
        else:
            assert resent.state in (PENDING, RUNNING)
        assert (await c.get(subject.workspace_id)).etag == before.etag


async def accepted(lab: Lab, subject: Subject, op: str, before: wp.Workspace, method: Any, request: Any) -> None:
    c, workspace_id, situation = subject.client, subject.workspace_id, subject.situation
    command_id = request.metadata.command_id
    command = (await method(request)).command
    assert command.command_id == command_id
    assert command.workspace_id == workspace_id
    assert command.state in (PENDING, RUNNING, SUCCEEDED), command
    after = await c.get(workspace_id)
    assert after.etag != before.etag

    if op in ("stop", "force_stop", "start", "delete"):
        if op == "force_stop" and subject.command_id:
            # The stuck graceful stop is superseded: it ends FAILED with CANCELLED.
            superseded = await c.command(subject.command_id)
            assert superseded.state == FAILED
            assert superseded.error.code == CANCELLED
        if op == "delete" and subject.command_id and situation != "STOPPED":
            # The command in progress (create, start, stop) is cancelled by the delete.
            cancelled = await c.command(subject.command_id)
            assert cancelled.state == FAILED, cancelled
            assert cancelled.error.code == CANCELLED
        if situation in ON_OWN_SERVER:
            await lab.back()  # the node reports what it did
        done = (await c.settle(method, request)).command  # resend until terminal
        assert done.state == SUCCEEDED, done
        final = await c.get(workspace_id)
        if op == "start":
            assert final.state == S.WORKSPACE_STATE_AVAILABLE
            assert final.execution_generation == before.execution_generation + 1
        elif op == "delete":
            assert final.state == S.WORKSPACE_STATE_DELETED
        else:
            assert final.state == S.WORKSPACE_STATE_STOPPED
            durability = wp.STOP_DURABILITY_UNCONFIRMED if op == "force_stop" else wp.STOP_DURABILITY_CONFIRMED
            assert done.result.durability == durability
            assert final.last_stop.command_id == command_id
            assert final.last_stop.durability == durability
        return

    # Configuration: immediate, the state does not change, the effect is visible.
    assert command.state == SUCCEEDED, command
    assert after.state == before.state
    if op == "set_labels":
        assert dict(after.labels) == {**SUITE_LABELS, "rule": "x"}
        assert dict(after.annotations) == {"note": "y"}
    elif op == "set_expiration":
        assert after.expiration.revision > before.expiration.revision
        assert after.expiration.HasField("expire_time")
        assert after.expiration.action == wp.EXPIRATION_ACTION_STOP
    elif op == "clear_expiration":
        assert after.expiration.revision > before.expiration.revision
        assert not after.expiration.HasField("expire_time")
    elif op == "resize":
        assert after.spec.resources.vcpus == 3
        assert after.spec.resources.writable_layer_gib == 20
        assert after.spec.resources.memory_mib == before.spec.resources.memory_mib
    elif op == "set_network_policy":
        assert after.spec.network_policy.egress == wp.NETWORK_EGRESS_DENY_ALL
    elif op == "bind_volume":
        assert [v.mount_path for v in after.spec.volumes] == ["/data", "/mnt/extra"]
    elif op == "unbind_volume":
        assert [v.mount_path for v in after.spec.volumes] == []
    else:
        assert op == "revoke"
        assert after.data_plane.credential_revision > before.data_plane.credential_revision
    if situation in ON_OWN_SERVER:
        await lab.back()


# -- what the table cannot show in one call ----------------------------------------------------


async def test_second_delete_is_rejected_and_the_first_goes_on(lab: Lab) -> None:
    subject = await make(lab, "DELETING")
    c, workspace_id = subject.client, subject.workspace_id
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.delete(workspace_id)
    assert error_of(caught.value).reason == "CONFLICT"
    await c.inject(workspace_id, sim.FAULT_UNSTALL)
    subject.stalled = False
    first = await c.settle(c.ws.GetWorkspaceCommand, ws.GetWorkspaceCommandRequest(command_id=subject.command_id))
    assert first.command.state == SUCCEEDED
    assert (await c.wait_for(workspace_id, S.WORKSPACE_STATE_DELETED)).deletion_started


def test_the_table_covers_every_state_and_operation() -> None:
    shown = {state for state, _ in TABLE.values()}
    assert shown == {s for s in wp.WorkspaceState.values() if s != S.WORKSPACE_STATE_UNSPECIFIED}
    assert len(PAIRS) == len(TABLE) * len(OPS) == len(set(PAIRS))
