"""Bad input over every RPC: undecodable bytes, generated messages, bad command IDs, the
error table's details, oversized messages. Nothing may answer INTERNAL or UNKNOWN, crash
the server, or change stored state when rejected.

Runs on its own server, through the synchronous grpc API (hypothesis drives sync tests)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from kibo.ctrl.v1 import data_plane_service_pb2 as data_plane
from kibo.ctrl.v1 import error_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import observation_service_pb2_grpc as obs_grpc
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import volume_service_pb2_grpc as vol_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc
from kibo.sim.v1 import simulator_pb2 as sim
from kibo.sim.v1 import simulator_pb2_grpc as sim_grpc

from tests.client import S, new_id
from tests.server import ServerProcess
from tests.strategies import UNKNOWN_VOL, UNKNOWN_WS, generated, is_map, message_type

SERVICES: list[ServiceDescriptor] = [
    ws.DESCRIPTOR.services_by_name["WorkspaceService"],
    obs.DESCRIPTOR.services_by_name["WorkspaceObservationService"],
    vol.DESCRIPTOR.services_by_name["VolumeService"],
    sim.DESCRIPTOR.services_by_name["SimulatorService"],
    data_plane.DESCRIPTOR.services_by_name["DataPlaneService"],
]
METHODS: list[MethodDescriptor] = [m for s in SERVICES for m in s.methods]
METHOD_IDS = [m.full_name.rsplit(".", 2)[-2] + "." + m.name for m in METHODS]
COMMAND_METHODS = [m for m in METHODS if "metadata" in m.input_type.fields_by_name]

TRANSITIONAL = (
    S.WORKSPACE_STATE_CREATING,
    S.WORKSPACE_STATE_STARTING,
    S.WORKSPACE_STATE_STOPPING,
    S.WORKSPACE_STATE_DELETING,
    S.WORKSPACE_STATE_UNKNOWN,
)
# The only (code, reason) pairs a rejection may carry: the contract's error table.
ERROR_TABLE: dict[grpc.StatusCode, set[str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: {"INVALID_ARGUMENT", "RESERVED_COMMAND_ID"},
    grpc.StatusCode.NOT_FOUND: {"NOT_FOUND"},
    grpc.StatusCode.ALREADY_EXISTS: {"COMMAND_ID_REUSED"},
    grpc.StatusCode.ABORTED: {"REVISION_MISMATCH"},
    grpc.StatusCode.FAILED_PRECONDITION: {"CONFLICT"},
    # The data plane: a request's credential that is not valid; no data plane on the simulator.
    grpc.StatusCode.UNAUTHENTICATED: {"UNAUTHENTICATED"},
    grpc.StatusCode.UNIMPLEMENTED: {"UNIMPLEMENTED"},
}


def meta() -> wp.CommandMetadata:
    return wp.CommandMetadata(command_id=new_id())


def path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


# -- errors -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejection:
    code: grpc.StatusCode
    reason: str  # ErrorDetail.reason without the ERROR_REASON_ prefix; "" when absent
    detail: error_pb2.ErrorDetail
    info: error_details_pb2.ErrorInfo
    status: status_pb2.Status | None
    message: str


def rejection(error: grpc.RpcError) -> Rejection:
    assert isinstance(error, grpc.Call)
    detail, info, status = error_pb2.ErrorDetail(), error_details_pb2.ErrorInfo(), None
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            assert isinstance(value, bytes)
            status = status_pb2.Status.FromString(value)
            for packed in status.details:
                if packed.Is(error_pb2.ErrorDetail.DESCRIPTOR):
                    packed.Unpack(detail)
                elif packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    packed.Unpack(info)
    reason = error_pb2.ErrorReason.Name(detail.reason).removeprefix("ERROR_REASON_") if detail.reason else ""
    return Rejection(error.code(), reason, detail, info, status, error.details() or "")


def check_rejection(found: Rejection) -> None:
    """A rejection by the API: a code of the error table, with ErrorDetail and ErrorInfo."""
    assert found.code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), found
    assert found.code in ERROR_TABLE, found
    assert found.reason in ERROR_TABLE[found.code], found
    assert found.info.reason == found.reason, found
    assert found.info.domain, found
    assert found.status is not None and found.status.code == found.code.value[0], found
    assert found.message, found


def call_unary(channel: grpc.Channel, method: MethodDescriptor, body: bytes, timeout: float = 10) -> bytes | Rejection:
    """Send raw bytes; the answer's raw bytes, or the rejection."""
    try:
        if method.server_streaming:
            streaming: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path(method))
            stream = streaming(body, timeout=timeout)
            try:
                first = next(stream, b"")
            finally:
                stream.cancel()
            assert isinstance(first, bytes)
            return first
        unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path(method))
        answer = unary(body, timeout=timeout)
        assert isinstance(answer, bytes)
        return answer
    except grpc.RpcError as error:
        return rejection(error)


# -- the server -------------------------------------------------------------------------------


@dataclass
class Target:
    server: ServerProcess
    channel: grpc.Channel
    # The generated stubs are untyped.
    ws: Any
    obs: Any
    vol: Any
    sim: Any
    workspace_ids: list[str]
    volume_ids: list[str]
    released: set[str]

    def healthy(self) -> None:
        assert self.server.process is not None and self.server.process.poll() is None, self.server.log()
        reply = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    def get(self, workspace_id: str) -> wp.Workspace:
        workspace: wp.Workspace = self.ws.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=workspace_id)).workspace
        return workspace

    def wait_for(self, workspace_id: str, *states: int, within: float = 10) -> wp.Workspace:
        deadline = time.monotonic() + within
        while (workspace := self.get(workspace_id)).state not in states:
            assert time.monotonic() < deadline, f"{workspace_id} is {workspace.state}, wanted {states}"
            time.sleep(0.02)
        return workspace

    def create(self, wait: bool = True) -> str:
        request = ws.CreateWorkspaceRequest(metadata=wp.CommandMetadata(command_id=new_id()))
        workspace_id: str = self.ws.CreateWorkspace(request).workspace.workspace_id
        if wait:
            self.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE)
        return workspace_id

    def snapshot(self) -> bytes:
        """Everything ListWorkspaces shows, deleted workspaces included (etags change with any change)."""
        request = ws.ListWorkspacesRequest(page_size=1000, include_deleted=True)
        response = self.ws.ListWorkspaces(request)
        assert not response.next_page_token
        data: bytes = response.SerializeToString(deterministic=True)
        return data

    def lookup(self, command_id: str) -> bytes | str:
        try:
            command = self.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=command_id)).command
        except grpc.RpcError as error:
            assert isinstance(error, grpc.Call)
            return str(error.code())
        data: bytes = command.SerializeToString(deterministic=True)
        return data

    def replenish(self) -> None:
        """Keep real workspaces in several states (and an unbound volume) for generated
        requests to act on, so they reach past "not found"."""
        states = {self.get(i).state for i in self.workspace_ids}
        if S.WORKSPACE_STATE_AVAILABLE not in states:
            self.workspace_ids.append(self.create())
        if S.WORKSPACE_STATE_STOPPED not in states:
            workspace_id = self.create()
            self.ws.StopWorkspace(ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id))
            self.wait_for(workspace_id, S.WORKSPACE_STATE_STOPPED)
            self.workspace_ids.append(workspace_id)
        if S.WORKSPACE_STATE_FAILED not in states:
            workspace_id = self.create()
            self.sim.InjectFault(sim.InjectFaultRequest(workspace_id=workspace_id, fault=sim.FAULT_VMM_CRASH))
            self.wait_for(workspace_id, S.WORKSPACE_STATE_FAILED)
            self.workspace_ids.append(workspace_id)
        if S.WORKSPACE_STATE_DELETED not in states:
            workspace_id = self.create()
            self.ws.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id))
            self.wait_for(workspace_id, S.WORKSPACE_STATE_DELETED)
            self.workspace_ids.append(workspace_id)
        volumes = [self.vol.GetVolume(vol.GetVolumeRequest(volume_id=i)).volume for i in self.volume_ids]
        if not any(v.state == vol.VOLUME_STATE_READY and not v.workspace_id for v in volumes):
            volume = self.vol.CreateVolume(vol.CreateVolumeRequest(metadata=meta())).volume
            self.volume_ids.append(volume.volume_id)
        self.quiesce()

    def quiesce(self, within: float = 15) -> None:
        """Wait until no workspace is transitional and every deleted one's files are released
        (unstalling anything a generated fault stalled)."""
        deadline = time.monotonic() + within
        while True:
            workspaces = self.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=1000, include_deleted=True))
            busy = [w.workspace_id for w in workspaces.workspaces if w.state in TRANSITIONAL]
            for workspace in workspaces.workspaces:
                if workspace.state == S.WORKSPACE_STATE_DELETED and workspace.workspace_id not in self.released:
                    cleanup = self.obs.GetWorkspaceCleanup(
                        obs.GetWorkspaceCleanupRequest(workspace_id=workspace.workspace_id)
                    ).cleanup
                    if cleanup.state == obs.CLEANUP_STATE_COMPLETE:
                        self.released.add(workspace.workspace_id)
                    else:
                        busy.append(workspace.workspace_id)
            if not busy:
                return
            assert time.monotonic() < deadline, f"not quiet: {busy}"
            for workspace_id in busy:
                self.sim.InjectFault(sim.InjectFaultRequest(workspace_id=workspace_id, fault=sim.FAULT_UNSTALL))
            time.sleep(0.02)


@pytest.fixture(scope="module")
def target(server_factory: Callable[..., ServerProcess]) -> Iterator[Target]:
    server = server_factory()
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        found = Target(
            server,
            channel,
            ws_grpc.WorkspaceServiceStub(channel),  # type: ignore[no-untyped-call]
            obs_grpc.WorkspaceObservationServiceStub(channel),  # type: ignore[no-untyped-call]
            vol_grpc.VolumeServiceStub(channel),  # type: ignore[no-untyped-call]
            sim_grpc.SimulatorServiceStub(channel),  # type: ignore[no-untyped-call]
            [],
            [],
            set(),
        )
        found.replenish()
        found.quiesce()
        yield found
        found.healthy()


def test_every_service_is_covered() -> None:
    assert all(s.methods for s in SERVICES)
    assert {"CreateWorkspace", "InjectFault", "CreateVolume", "GetWorkspaceCleanup"} <= {m.name for m in METHODS}


# -- (a) undecodable bytes -----------------------------------------------------------------------

# Bytes no protobuf message can be decoded from.
UNDECODABLE: list[bytes] = [
    b"\x0f",  # wire type 7 does not exist
    b"\x0e\x00",  # wire type 6 does not exist
    b"\x08",  # a varint with no value
    b"\x08\xff\xff",  # a truncated varint
    b"\x08" + b"\xff" * 10 + b"\x01",  # a varint of 11 bytes
    b"\x0a\x05ab",  # a length running past the end
    b"\x0a" + b"\xff" * 9 + b"\x7f",  # a huge length
    b"\x0c",  # an end-group with no start
    b"\x0b\x08\x01",  # a group that never ends
    b"\x15\x01\x02",  # a truncated fixed32
]


def invalid_utf8(descriptor: Descriptor) -> bytes | None:
    """A string field holding bytes that are not UTF-8 (proto3 strings must be)."""
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            return bytes([field.number << 3 | 2, 2]) + b"\xc3\x28"
        if field.type == FieldDescriptor.TYPE_MESSAGE and not is_map(field):
            inner = invalid_utf8(message_type(field))
            if inner is not None:
                return bytes([field.number << 3 | 2, len(inner)]) + inner
    return None


@pytest.mark.parametrize("method", METHODS, ids=METHOD_IDS)
def test_undecodable_bytes_are_invalid_argument(target: Target, method: MethodDescriptor) -> None:
    before = target.snapshot()
    bodies = list(UNDECODABLE)
    if (utf8 := invalid_utf8(method.input_type)) is not None:
        bodies.append(utf8)
    for body in bodies:
        answer = call_unary(target.channel, method, body)
        assert isinstance(answer, Rejection), body
        assert (answer.code, answer.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"), (body, answer)
        check_rejection(answer)
    # Random bytes: whatever they decode to, never INTERNAL or UNKNOWN.
    rng = random.Random(f"{method.full_name}-20261107")
    for _ in range(40):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 48)))
        answer = call_unary(target.channel, method, body)
        if isinstance(answer, Rejection):
            check_rejection(answer)
    target.quiesce()
    if method not in COMMAND_METHODS:
        assert target.snapshot() == before
    target.healthy()


# -- (b) generated messages (strategies in tests/strategies.py) ---------------------------


# Not ids= METHOD_IDS: hypothesis needs the fixture and the parameter; the strategy is built per method.
@pytest.mark.parametrize("method", METHODS, ids=METHOD_IDS)
def test_generated_messages_never_fail_internally_and_rejections_change_nothing(
    target: Target, method: MethodDescriptor
) -> None:
    command_field = "metadata" in method.input_type.fields_by_name
    target.replenish()

    @settings(
        max_examples=50,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(request=generated(method, target))
    def check(request: Message) -> None:
        body = request.SerializeToString()
        command_id = request.metadata.command_id if command_field else ""  # type: ignore[attr-defined]
        before = target.snapshot()
        recorded = target.lookup(command_id) if command_id else b""
        answer = call_unary(target.channel, method, body)
        if isinstance(answer, Rejection):
            check_rejection(answer)
            assert target.snapshot() == before, "a rejected request changed stored state"
            if command_id:
                assert target.lookup(command_id) == recorded, "a rejected request recorded its command"
            return
        if command_field or method.name == "InjectFault":
            if method.name == "InjectFault":
                # A fault armed for "the next workspace created" is used up at once.
                target.create(wait=False)
            target.quiesce()

    check()
    target.healthy()


# -- (c) command IDs ------------------------------------------------------------------------------

IN_AN_HOUR = Timestamp(seconds=int(time.time()) + 3600)
# A well-formed request of every command RPC except for its command ID (unknown workspace or volume).
WELL_FORMED: dict[str, Callable[[wp.CommandMetadata], Message]] = {
    "CreateWorkspace": lambda m: ws.CreateWorkspaceRequest(metadata=m),
    "StopWorkspace": lambda m: ws.StopWorkspaceRequest(metadata=m, workspace_id=UNKNOWN_WS),
    "StartWorkspace": lambda m: ws.StartWorkspaceRequest(metadata=m, workspace_id=UNKNOWN_WS),
    "DeleteWorkspace": lambda m: ws.DeleteWorkspaceRequest(metadata=m, workspace_id=UNKNOWN_WS),
    "SetWorkspaceExpiration": lambda m: ws.SetWorkspaceExpirationRequest(
        metadata=m, workspace_id=UNKNOWN_WS, expire_time=IN_AN_HOUR, action=wp.EXPIRATION_ACTION_STOP
    ),
    "ClearWorkspaceExpiration": lambda m: ws.ClearWorkspaceExpirationRequest(metadata=m, workspace_id=UNKNOWN_WS),
    "SetWorkspaceLabels": lambda m: ws.SetWorkspaceLabelsRequest(
        metadata=m, workspace_id=UNKNOWN_WS, labels={"a": "b"}
    ),
    "ResizeWorkspace": lambda m: ws.ResizeWorkspaceRequest(
        metadata=m, workspace_id=UNKNOWN_WS, resources=wp.Resources(vcpus=2)
    ),
    "SetWorkspaceNetworkPolicy": lambda m: ws.SetWorkspaceNetworkPolicyRequest(
        metadata=m, workspace_id=UNKNOWN_WS, network_policy=wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_DENY_ALL)
    ),
    "MoveWorkspace": lambda m: ws.MoveWorkspaceRequest(metadata=m, workspace_id=UNKNOWN_WS, target_node_id="node-1"),
    "BindWorkspaceVolume": lambda m: ws.BindWorkspaceVolumeRequest(
        metadata=m, workspace_id=UNKNOWN_WS, binding=wp.VolumeBinding(volume_id=UNKNOWN_VOL, mount_path="/mnt/v")
    ),
    "UnbindWorkspaceVolume": lambda m: ws.UnbindWorkspaceVolumeRequest(
        metadata=m, workspace_id=UNKNOWN_WS, volume_id=UNKNOWN_VOL
    ),
    "RevokeWorkspaceDataPlaneAccess": lambda m: ws.RevokeWorkspaceDataPlaneAccessRequest(
        metadata=m, workspace_id=UNKNOWN_WS
    ),
    "CreateWorkspaceExposure": lambda m: ws.CreateWorkspaceExposureRequest(
        metadata=m, workspace_id=UNKNOWN_WS, port=8000
    ),
    "DeleteWorkspaceExposure": lambda m: ws.DeleteWorkspaceExposureRequest(
        metadata=m, workspace_id=UNKNOWN_WS, exposure_id="ex-0123456789abcdef0123"
    ),
    "CreateVolume": lambda m: vol.CreateVolumeRequest(metadata=m),
    "DeleteVolume": lambda m: vol.DeleteVolumeRequest(metadata=m, volume_id=UNKNOWN_VOL),
}
BAD_IDS = ["", "a" * 129, "a b", "tab\there", "é", "x!", "x#y", "x?y", "a,b", "a@b", "(x)", "ws\n", "💥", "a\x00b"]
RESERVED_IDS = ["guest-shutdown/x", "host-memory/x", "guest-shutdown/", "host-memory/" + "a" * 100]
GOOD_IDS = ["a", "A-Z.a_z~0:9/-", "x" * 128, "example/6f1c2e9a-1d2b-4c5e-8f00-123456789abc"]


def test_every_command_rpc_has_a_well_formed_request() -> None:
    assert set(WELL_FORMED) == {m.name for m in COMMAND_METHODS}


@pytest.mark.parametrize("method", COMMAND_METHODS, ids=[m.name for m in COMMAND_METHODS])
def test_command_ids_are_checked(target: Target, method: MethodDescriptor) -> None:
    build = WELL_FORMED[method.name]
    before = target.snapshot()
    for command_id in BAD_IDS:
        request = build(wp.CommandMetadata(command_id=command_id))
        answer = call_unary(target.channel, method, request.SerializeToString())
        assert isinstance(answer, Rejection), command_id
        assert (answer.code, answer.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"), command_id
        assert answer.detail.field == "metadata.command_id", answer
        check_rejection(answer)
    for command_id in RESERVED_IDS:
        request = build(wp.CommandMetadata(command_id=command_id))
        answer = call_unary(target.channel, method, request.SerializeToString())
        assert isinstance(answer, Rejection), command_id
        assert (answer.code, answer.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "RESERVED_COMMAND_ID"), answer
        assert answer.detail.field == "metadata.command_id", answer
        check_rejection(answer)
    assert target.snapshot() == before
    for command_id in GOOD_IDS:
        unique = f"{command_id}{new_id()}"[-128:]  # unique: a used ID would be a reuse
        answer = call_unary(target.channel, method, build(wp.CommandMetadata(command_id=unique)).SerializeToString())
        if method.name in ("CreateWorkspace", "CreateVolume"):
            assert isinstance(answer, bytes), answer  # accepted
        else:
            assert isinstance(answer, Rejection) and answer.code == grpc.StatusCode.NOT_FOUND, answer
    target.quiesce()
    target.healthy()


def test_get_workspace_command_accepts_the_servers_own_prefixes(target: Target) -> None:
    for command_id in RESERVED_IDS:
        with pytest.raises(grpc.RpcError) as excinfo:
            target.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=command_id))
        found = rejection(excinfo.value)
        assert (found.code, found.reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


# -- (d) every row of the error table carries its details ---------------------------------------------


def test_every_error_row_carries_error_detail_and_error_info(target: Target) -> None:
    workspace_id = target.create()
    stop_id = new_id()
    stop = ws.StopWorkspaceRequest(metadata=wp.CommandMetadata(command_id=stop_id), workspace_id=workspace_id)
    target.ws.StopWorkspace(stop)
    target.wait_for(workspace_id, S.WORKSPACE_STATE_STOPPED)
    rows: list[tuple[Callable[[], Any], grpc.StatusCode, str]] = [
        (
            lambda: target.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=1001)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda: target.ws.StopWorkspace(
                ws.StopWorkspaceRequest(
                    metadata=wp.CommandMetadata(command_id="host-memory/1"), workspace_id=workspace_id
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "RESERVED_COMMAND_ID",
        ),
        (
            lambda: target.ws.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=UNKNOWN_WS)),
            grpc.StatusCode.NOT_FOUND,
            "NOT_FOUND",
        ),
        (
            lambda: target.ws.StartWorkspace(
                ws.StartWorkspaceRequest(metadata=wp.CommandMetadata(command_id=stop_id), workspace_id=workspace_id)
            ),
            grpc.StatusCode.ALREADY_EXISTS,
            "COMMAND_ID_REUSED",
        ),
        (
            lambda: target.ws.StartWorkspace(
                ws.StartWorkspaceRequest(
                    metadata=wp.CommandMetadata(command_id=new_id()),
                    workspace_id=workspace_id,
                    expected_expiration_revision=2,
                )
            ),
            grpc.StatusCode.ABORTED,
            "REVISION_MISMATCH",
        ),
        (
            lambda: target.ws.StopWorkspace(
                ws.StopWorkspaceRequest(
                    metadata=wp.CommandMetadata(command_id=new_id()), workspace_id=workspace_id, mode=ws.STOP_MODE_FORCE
                )
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "CONFLICT",
        ),
    ]
    before = target.snapshot()
    for call, code, reason in rows:
        with pytest.raises(grpc.RpcError) as excinfo:
            call()
        found = rejection(excinfo.value)
        assert (found.code, found.reason, found.info.reason) == (code, reason, reason), found
        assert error_pb2.ErrorReason.Value(f"ERROR_REASON_{reason}") == found.detail.reason
        check_rejection(found)
    assert target.snapshot() == before
    target.healthy()


# -- (e) oversized messages --------------------------------------------------------------------------


def test_an_oversized_message_is_rejected_by_the_transport(target: Target) -> None:
    before = target.snapshot()
    huge = ws.CreateWorkspaceRequest(
        metadata=wp.CommandMetadata(command_id=new_id()),
        spec=wp.WorkspaceSpec(annotations={"big": "x" * (5 * 1024 * 1024)}),
    )
    with pytest.raises(grpc.RpcError) as excinfo:
        target.ws.CreateWorkspace(huge, timeout=30)
    assert rejection(excinfo.value).code == grpc.StatusCode.RESOURCE_EXHAUSTED
    answer = call_unary(target.channel, METHODS[0], b"\x00" * (4 * 1024 * 1024 + 1), timeout=30)
    assert isinstance(answer, Rejection) and answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert target.snapshot() == before
    target.healthy()
    # Still serving normally.
    assert "workspace.stop.force" in target.ws.GetCapabilities(ws.GetCapabilitiesRequest()).capabilities
    target.create()
    target.healthy()
