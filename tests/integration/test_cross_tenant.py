"""Another tenant, byte for byte (issue 35 item 3; SECURITY.md, "API and tenants": another
tenant's ID answers exactly like a missing one).

Every RPC of the tenant services is found from their descriptors: one without a row in CASES
or a reason in EXEMPT fails `test_every_tenant_rpc_is_tried`, so a new RPC cannot slip by.
Each row is called with tenant B's token twice, naming tenant A's object and naming an ID of
the same form and length that names nothing, over gRPC and over Connect, as raw bytes. The two
answers must be the same bytes once A's ID is written as the missing one: over gRPC the code,
the message and the initial and trailing metadata (the error details' bytes among them); over
Connect the HTTP status, every header but Date, and the body. After each call nothing has
changed: A's workspaces (their etags), A's volume, events and command, and B's workspaces.

The data plane's exec and file calls carry a credential, not an ID: B's own credential, its
payload rewritten to name A's workspace (or a missing one), is refused alike. Whether a valid
credential reaches its own workspace only needs real guests: the last test, on
`--runtime process`, replays the attack of issue 35 (B issues a credential on A's workspace,
which would let it exec as root there) and checks B's credential sees B's files only."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, answer_of, meta, missing_like
from tests.integration.test_auth import make_token
from tests.server import ServerProcess
from tests.system.test_data_plane_client import FLAGS as PROCESS_FLAGS
from tests.system.test_data_plane_client import _require_sandbox
from tests.system.test_process_runtime import SMALL, reap

Factory = Callable[..., ServerProcess]
TENANT_SERVICES: tuple[ModuleType, ...] = (ws, obs, vol, dp, sim)
NOT_FOUND = grpc.StatusCode.NOT_FOUND


@dataclass(frozen=True)
class World:
    """What tenant A owns (the targets), and what B needs to aim at them."""

    workspace: str  # A's, AVAILABLE
    volume: str  # A's, READY and unbound
    command: str  # the command ID that created A's workspace
    label: str  # the value of A's workspace's label "team"
    b_stopped: str  # B's STOPPED workspace (volumes are bound to a stopped one)
    b_credential: str  # B's data-plane credential, for its own AVAILABLE workspace

    def target(self, kind: str) -> str:
        return {"workspace": self.workspace, "volume": self.volume, "command": self.command, "label": self.label}[kind]


def forged(credential: str, workspace_id: str) -> str:
    """`credential` with its payload rewritten to name `workspace_id` (its signature kept)."""
    prefix, payload, signature = credential.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["w"] = workspace_id
    encoded = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{prefix}.{encoded}.{signature}"


@dataclass(frozen=True)
class Case:
    """One way to aim an RPC at A: `names` which of A's objects (World.target), `build` the
    request naming that ID; `code` the answer both calls get."""

    names: str
    build: Callable[[str, World], Message]
    code: grpc.StatusCode = NOT_FOUND


IN_AN_HOUR_S = 3600


def _expiration(i: str, w: World) -> Message:
    request = ws.SetWorkspaceExpirationRequest(metadata=meta(), workspace_id=i, action=wp.EXPIRATION_ACTION_STOP)
    request.expire_time.GetCurrentTime()
    request.expire_time.seconds += IN_AN_HOUR_S
    return request


CASES: dict[str, tuple[Case, ...]] = {
    "WorkspaceService/CreateWorkspace": (
        Case(
            "volume",
            lambda i, w: ws.CreateWorkspaceRequest(
                metadata=meta(), spec=wp.WorkspaceSpec(volumes=[wp.VolumeBinding(volume_id=i, mount_path="/mnt/v")])
            ),
        ),
    ),
    "WorkspaceService/GetWorkspace": (Case("workspace", lambda i, w: ws.GetWorkspaceRequest(workspace_id=i)),),
    # A list answers; it must hold nothing of A's, the same bytes as for a label nobody has.
    "WorkspaceService/ListWorkspaces": (
        Case(
            "label",
            lambda i, w: ws.ListWorkspacesRequest(include_deleted=True, filter=f'labels.team = "{i}"'),
            grpc.StatusCode.OK,
        ),
    ),
    "WorkspaceService/StopWorkspace": (
        Case("workspace", lambda i, w: ws.StopWorkspaceRequest(metadata=meta(), workspace_id=i)),
    ),
    "WorkspaceService/StartWorkspace": (
        Case("workspace", lambda i, w: ws.StartWorkspaceRequest(metadata=meta(), workspace_id=i)),
    ),
    "WorkspaceService/DeleteWorkspace": (
        Case("workspace", lambda i, w: ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=i)),
    ),
    "WorkspaceService/GetWorkspaceCommand": (
        Case("command", lambda i, w: ws.GetWorkspaceCommandRequest(command_id=i)),
    ),
    "WorkspaceService/WatchWorkspace": (Case("workspace", lambda i, w: ws.WatchWorkspaceRequest(workspace_id=i)),),
    "WorkspaceService/SetWorkspaceExpiration": (Case("workspace", _expiration),),
    "WorkspaceService/ClearWorkspaceExpiration": (
        Case("workspace", lambda i, w: ws.ClearWorkspaceExpirationRequest(metadata=meta(), workspace_id=i)),
    ),
    "WorkspaceService/SetWorkspaceLabels": (
        Case(
            "workspace", lambda i, w: ws.SetWorkspaceLabelsRequest(metadata=meta(), workspace_id=i, labels={"a": "b"})
        ),
    ),
    "WorkspaceService/ResizeWorkspace": (
        Case(
            "workspace",
            lambda i, w: ws.ResizeWorkspaceRequest(metadata=meta(), workspace_id=i, resources=wp.Resources(vcpus=2)),
        ),
    ),
    # An operator's command: B's admin token is refused before any lookup, alike for A's and none.
    "WorkspaceService/MoveWorkspace": (
        Case(
            "workspace",
            lambda i, w: ws.MoveWorkspaceRequest(metadata=meta(), workspace_id=i, target_node_id="node-1"),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
    ),
    "WorkspaceService/SetWorkspaceNetworkPolicy": (
        Case(
            "workspace",
            lambda i, w: ws.SetWorkspaceNetworkPolicyRequest(
                metadata=meta(), workspace_id=i, network_policy=wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_DENY_ALL)
            ),
        ),
    ),
    "WorkspaceService/BindWorkspaceVolume": (
        # A's workspace, and B's own stopped workspace with A's volume.
        Case(
            "workspace",
            lambda i, w: ws.BindWorkspaceVolumeRequest(
                metadata=meta(), workspace_id=i, binding=wp.VolumeBinding(volume_id=w.volume, mount_path="/mnt/v")
            ),
        ),
        Case(
            "volume",
            lambda i, w: ws.BindWorkspaceVolumeRequest(
                metadata=meta(), workspace_id=w.b_stopped, binding=wp.VolumeBinding(volume_id=i, mount_path="/mnt/v")
            ),
        ),
    ),
    "WorkspaceService/UnbindWorkspaceVolume": (
        Case(
            "workspace",
            lambda i, w: ws.UnbindWorkspaceVolumeRequest(metadata=meta(), workspace_id=i, volume_id=w.volume),
        ),
        Case(
            "volume",
            lambda i, w: ws.UnbindWorkspaceVolumeRequest(metadata=meta(), workspace_id=w.b_stopped, volume_id=i),
        ),
    ),
    "WorkspaceService/RevokeWorkspaceDataPlaneAccess": (
        Case("workspace", lambda i, w: ws.RevokeWorkspaceDataPlaneAccessRequest(metadata=meta(), workspace_id=i)),
    ),
    "WorkspaceService/CreateWorkspaceExposure": (
        Case(
            "workspace",
            lambda i, w: ws.CreateWorkspaceExposureRequest(metadata=meta(), workspace_id=i, port=8000),
        ),
    ),
    "WorkspaceService/ListWorkspaceExposures": (
        Case("workspace", lambda i, w: ws.ListWorkspaceExposuresRequest(workspace_id=i)),
    ),
    "WorkspaceService/DeleteWorkspaceExposure": (
        Case(
            "workspace",
            lambda i, w: ws.DeleteWorkspaceExposureRequest(
                metadata=meta(), workspace_id=i, exposure_id="ex-0123456789abcdef0123"
            ),
        ),
    ),
    "WorkspaceObservationService/GetWorkspaceCleanup": (
        Case("workspace", lambda i, w: obs.GetWorkspaceCleanupRequest(workspace_id=i)),
    ),
    "WorkspaceObservationService/ListWorkspaceEvents": (
        Case("workspace", lambda i, w: obs.ListWorkspaceEventsRequest(workspace_id=i)),
    ),
    "WorkspaceObservationService/ListEvents": (Case("workspace", lambda i, w: obs.ListEventsRequest(workspace_id=i)),),
    "WorkspaceObservationService/WatchEvents": (
        Case("workspace", lambda i, w: obs.WatchEventsRequest(workspace_id=i)),
    ),
    "WorkspaceObservationService/ListWorkspaceInstances": (
        Case("workspace", lambda i, w: obs.ListWorkspaceInstancesRequest(workspace_id=i)),
    ),
    "VolumeService/GetVolume": (Case("volume", lambda i, w: vol.GetVolumeRequest(volume_id=i)),),
    "VolumeService/DeleteVolume": (Case("volume", lambda i, w: vol.DeleteVolumeRequest(metadata=meta(), volume_id=i)),),
    "DataPlaneService/IssueDataPlaneCredential": (
        Case("workspace", lambda i, w: dp.IssueDataPlaneCredentialRequest(workspace_id=i)),
    ),
    # B's own credential, rewritten to name A's workspace: its signature no longer holds.
    "DataPlaneService/ExecWorkspaceCommand": (
        Case(
            "workspace",
            lambda i, w: dp.ExecWorkspaceCommandRequest(credential=forged(w.b_credential, i), argv=["id"]),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/ReadWorkspaceFile": (
        Case(
            "workspace",
            lambda i, w: dp.ReadWorkspaceFileRequest(credential=forged(w.b_credential, i), path="/data/x"),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/WriteWorkspaceFile": (
        Case(
            "workspace",
            lambda i, w: dp.WriteWorkspaceFileRequest(
                credential=forged(w.b_credential, i), path="/data/x", content=b"owned"
            ),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/StartWorkspaceProcess": (
        Case(
            "workspace",
            lambda i, w: dp.StartWorkspaceProcessRequest(credential=forged(w.b_credential, i), argv=["id"]),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/ConnectWorkspaceProcess": (
        Case(
            "workspace",
            lambda i, w: dp.ConnectWorkspaceProcessRequest(
                credential=forged(w.b_credential, i), process=dp.ProcessSelector(pid=1), replay=True
            ),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/ListWorkspaceProcesses": (
        Case(
            "workspace",
            lambda i, w: dp.ListWorkspaceProcessesRequest(credential=forged(w.b_credential, i)),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/SendWorkspaceProcessInput": (
        Case(
            "workspace",
            lambda i, w: dp.SendWorkspaceProcessInputRequest(
                credential=forged(w.b_credential, i), process=dp.ProcessSelector(tag="server"), data=b"owned\n"
            ),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/SignalWorkspaceProcess": (
        Case(
            "workspace",
            lambda i, w: dp.SignalWorkspaceProcessRequest(
                credential=forged(w.b_credential, i), process=dp.ProcessSelector(pid=1), signal=9
            ),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    "DataPlaneService/ResizeWorkspaceProcess": (
        Case(
            "workspace",
            lambda i, w: dp.ResizeWorkspaceProcessRequest(
                credential=forged(w.b_credential, i),
                process=dp.ProcessSelector(tag="tty"),
                size=dp.PtySize(rows=24, cols=80),
            ),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
    ),
    # Files anywhere in the guest: the forged credential is refused before any path is looked at.
    **{
        f"DataPlaneService/{rpc}": (Case("workspace", build, grpc.StatusCode.UNAUTHENTICATED),)
        for rpc, build in {
            "StatWorkspacePath": lambda i, w: dp.StatWorkspacePathRequest(
                credential=forged(w.b_credential, i), path="/etc/passwd"
            ),
            "ListWorkspaceDirectory": lambda i, w: dp.ListWorkspaceDirectoryRequest(
                credential=forged(w.b_credential, i), path="/", depth=2
            ),
            "MakeWorkspaceDirectory": lambda i, w: dp.MakeWorkspaceDirectoryRequest(
                credential=forged(w.b_credential, i), path="/root/owned", parents=True
            ),
            "MoveWorkspacePath": lambda i, w: dp.MoveWorkspacePathRequest(
                credential=forged(w.b_credential, i), source="/etc/hostname", destination="/root/owned"
            ),
            "RemoveWorkspacePath": lambda i, w: dp.RemoveWorkspacePathRequest(
                credential=forged(w.b_credential, i), path="/data", recursive=True
            ),
            "DownloadWorkspaceFile": lambda i, w: dp.DownloadWorkspaceFileRequest(
                credential=forged(w.b_credential, i), path="/etc", archive=True
            ),
            "StartWorkspaceUpload": lambda i, w: dp.StartWorkspaceUploadRequest(
                credential=forged(w.b_credential, i), path="/root/owned"
            ),
            "WriteWorkspaceUpload": lambda i, w: dp.WriteWorkspaceUploadRequest(
                credential=forged(w.b_credential, i), upload_id="kibo-upload-0123456789abcdef", data=b"x", finish=True
            ),
            "CancelWorkspaceUpload": lambda i, w: dp.CancelWorkspaceUploadRequest(
                credential=forged(w.b_credential, i), upload_id="kibo-upload-0123456789abcdef"
            ),
            "WatchWorkspaceDirectory": lambda i, w: dp.WatchWorkspaceDirectoryRequest(
                credential=forged(w.b_credential, i), path="/", recursive=True
            ),
        }.items()
    },
    "SimulatorService/InjectFault": (
        Case("workspace", lambda i, w: sim.InjectFaultRequest(workspace_id=i, fault=sim.FAULT_VMM_CRASH)),
    ),
}
EXEMPT: dict[str, str] = {
    "WorkspaceService/GetCapabilities": "names no object: what the server offers, the same for every tenant",
    "VolumeService/CreateVolume": "names no object: it makes a volume in the caller's own tenant",
}


def tenant_rpcs() -> dict[str, tuple[str, bool]]:
    """Every RPC of the tenant services: its name, and (its path, whether it streams)."""
    return {
        f"{service.name}/{method.name}": (f"/{service.full_name}/{method.name}", method.server_streaming)
        for module in TENANT_SERVICES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_every_tenant_rpc_is_tried() -> None:
    rpcs = set(tenant_rpcs())
    assert rpcs - set(CASES) - set(EXEMPT) == set(), "an RPC with no cross-tenant case (add one to CASES)"
    assert set(CASES) | set(EXEMPT) <= rpcs, "a case or exemption for an RPC that no longer exists"
    assert not set(CASES) & set(EXEMPT)


# -- the wire, as raw bytes ---------------------------------------------------------------------

Wire = tuple[Any, ...]


def swapped(value: Any, old: str, new: str) -> Any:
    """`value` (nested tuples of str, bytes and others) with `old` written as `new`."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, bytes):
        return value.replace(old.encode(), new.encode())
    if isinstance(value, tuple):
        return tuple(swapped(v, old, new) for v in value)
    return value


async def over_grpc(channel: grpc.aio.Channel, path: str, streams: bool, body: bytes, token: str) -> Wire:
    """Code, message, initial and trailing metadata and the (first) answer's bytes."""
    metadata = (("authorization", f"Bearer {token}"),)
    try:
        if streams:
            streaming: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path)
            stream = streaming(body, metadata=metadata, timeout=10)
            first = await stream.read()
            stream.cancel()
            return (grpc.StatusCode.OK, "", (), (), first)
        unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
        call = unary(body, metadata=metadata, timeout=10)
        answer = await call
        initial, trailing = await call.initial_metadata(), await call.trailing_metadata()
        return (grpc.StatusCode.OK, "", tuple(initial or ()), tuple(trailing or ()), answer)
    except grpc.aio.AioRpcError as error:
        initial, trailing = error.initial_metadata(), error.trailing_metadata()
        return (error.code(), error.details() or "", tuple(initial or ()), tuple(trailing or ()), b"")


def _connect_call(http_address: str, path: str, streams: bool, body: bytes, token: str) -> Wire:
    if streams:  # one enveloped message (flags 0, big-endian length)
        data, content_type = b"\x00" + len(body).to_bytes(4, "big") + body, "application/connect+proto"
    else:
        data, content_type = body, "application/proto"
    headers = {"content-type": content_type, "connect-protocol-version": "1", "authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"http://{http_address}{path}", data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            status, answer_headers, payload = reply.status, reply.getheaders(), reply.read()
    except urllib.error.HTTPError as error:
        status, answer_headers, payload = error.code, list(error.headers.items()), error.read()
    kept = tuple(sorted((k.lower(), v) for k, v in answer_headers if k.lower() != "date"))
    return (status, kept, payload)


async def over_connect(http_address: str, path: str, streams: bool, body: bytes, token: str) -> Wire:
    """HTTP status, headers but Date, and the body's bytes."""
    return await asyncio.to_thread(_connect_call, http_address, path, streams, body, token)


def code_of(wire: Wire, transport: str) -> grpc.StatusCode:
    if transport == "grpc":
        code: grpc.StatusCode = wire[0]
        return code
    status, _, payload = wire
    if status == 200 and payload[:1] == b"\x02":  # a stream that ended at once: its end message
        error = json.loads(payload[5:]).get("error")
    elif status != 200:
        error = json.loads(payload)
    else:
        return grpc.StatusCode.OK
    return grpc.StatusCode[error["code"].upper()] if error else grpc.StatusCode.OK


# -- the server and the two tenants ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tenants(server_factory: Factory) -> tuple[ServerProcess, str, str]:
    """A server with tokens on (the simulator runtime), and admin tokens of tenants A and B."""
    server = server_factory(auth=True)
    return server, make_token(server, "tenant-a"), make_token(server, "tenant-b")


async def _world(server: ServerProcess, a_token: str, b_token: str) -> World:
    label, command = f"lbl-{uuid.uuid4().hex[:20]}", f"cmd-{uuid.uuid4().hex[:20]}"
    async with Client.connect(server.address, a_token) as a:
        created = await a.ws.CreateWorkspace(
            ws.CreateWorkspaceRequest(metadata=meta(command), spec=wp.WorkspaceSpec(labels={"team": label}))
        )
        workspace = (await a.wait_steady(created.workspace.workspace_id)).workspace_id
        volume = (await a.create_volume()).volume_id
    async with Client.connect(server.address, b_token) as b:
        mine = await b.create()
        stopped = (await b.create()).workspace_id
        await b.stop(stopped)
        assert (await b.wait_steady(stopped)).state == S.WORKSPACE_STATE_STOPPED
        channel = b.channel
        assert channel is not None
        issued = await dp_grpc.DataPlaneServiceStub(channel).IssueDataPlaneCredential(  # type: ignore[no-untyped-call]
            dp.IssueDataPlaneCredentialRequest(workspace_id=mine.workspace_id)
        )
    return World(workspace, volume, command, label, stopped, issued.credential)


async def _state(server: ServerProcess, a_token: str, b_token: str, world: World) -> bytes:
    """Everything of A's the calls could touch, and B's workspaces, as bytes."""
    async with Client.connect(server.address, a_token) as a, Client.connect(server.address, b_token) as b:
        answers = [
            await a.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=1000, include_deleted=True)),
            await a.vol.GetVolume(vol.GetVolumeRequest(volume_id=world.volume)),
            await a.obs.ListWorkspaceEvents(
                obs.ListWorkspaceEventsRequest(workspace_id=world.workspace, page_size=1000)
            ),
            await a.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=world.command)),
            await b.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=1000, include_deleted=True)),
        ]
    assert all(not getattr(answer, "next_page_token", "") for answer in answers)
    return b"".join(answer.SerializeToString(deterministic=True) for answer in answers)


@pytest.fixture
async def channel(tenants: tuple[ServerProcess, str, str]) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(tenants[0].address) as opened:
        yield opened


def _cases() -> Iterator[tuple[str, int, Case]]:
    for rpc, cases in CASES.items():
        for number, case in enumerate(cases):
            yield rpc, number, case


@pytest.mark.parametrize("transport", ["grpc", "connect"])
async def test_another_tenants_ids_answer_exactly_like_missing_ones(
    tenants: tuple[ServerProcess, str, str], channel: grpc.aio.Channel, transport: str
) -> None:
    server, a_token, b_token = tenants
    world = await _world(server, a_token, b_token)
    paths = tenant_rpcs()
    before = await _state(server, a_token, b_token, world)
    for rpc, number, case in _cases():
        path, streams = paths[rpc]
        theirs = world.target(case.names)
        nobodys = missing_like(theirs)
        answers = []
        for named in (theirs, nobodys):
            body = case.build(named, world).SerializeToString()
            if transport == "grpc":
                answers.append(await over_grpc(channel, path, streams, body, b_token))
            else:
                answers.append(await over_connect(server.http_address, path, streams, body, b_token))
            # A refused call changed nothing, A's or B's.
            assert await _state(server, a_token, b_token, world) == before, f"{rpc} #{number} changed state"
        foreign, missing = answers
        assert code_of(foreign, transport) == case.code, (rpc, number, foreign)
        assert swapped(foreign, theirs, nobodys) == missing, f"{rpc} #{number}: another tenant's ID answers differently"


# -- the data plane on real guests -------------------------------------------------------------


@pytest.fixture(scope="module")
def process_tenants(server_factory: Factory) -> Iterator[tuple[ServerProcess, str, str]]:
    """A `--runtime process` server with tokens on, and admin tokens of tenants A and B; after
    it stops, no supervisor, guest or cgroup of its data dir is left."""
    _require_sandbox()
    server = server_factory(*PROCESS_FLAGS, auth=True)
    try:
        yield server, make_token(server, "tenant-a"), make_token(server, "tenant-b")
        server.stop()
    finally:
        reap(server.data_dir)


async def _exec(stub: Any, credential: str, *argv: str) -> tuple[int, bytes, bytes]:
    out, err, code = b"", b"", -1
    async for part in stub.ExecWorkspaceCommand(dp.ExecWorkspaceCommandRequest(credential=credential, argv=argv)):
        out, err = out + part.stdout, err + part.stderr
        if part.WhichOneof("output") == "exit_code":
            code = part.exit_code
    return code, out, err


async def test_a_credential_reaches_its_own_workspace_only(process_tenants: tuple[ServerProcess, str, str]) -> None:
    """Issue 35 item 3's attack: B's token asks for a credential on A's workspace (with it, B
    would exec as root there). Refused as for a workspace that does not exist; B's own valid
    credential, as issued or rewritten to name A's workspace, never reaches A's files."""
    server, a_token, b_token = process_tenants
    async with Client.connect(server.address, a_token) as a, Client.connect(server.address, b_token) as b:
        a_dp = dp_grpc.DataPlaneServiceStub(a.channel)  # type: ignore[no-untyped-call]
        b_dp = dp_grpc.DataPlaneServiceStub(b.channel)  # type: ignore[no-untyped-call]
        theirs = (await a.create(resources=SMALL)).workspace_id
        mine = (await b.create(resources=SMALL)).workspace_id
        try:
            assert (await a.get(theirs)).state == (await b.get(mine)).state == S.WORKSPACE_STATE_AVAILABLE
            a_credential = (
                await a_dp.IssueDataPlaneCredential(dp.IssueDataPlaneCredentialRequest(workspace_id=theirs))
            ).credential
            secret = dp.WriteWorkspaceFileRequest(credential=a_credential, path="/data/secret", content=b"A's secret")
            await a_dp.WriteWorkspaceFile(secret)

            missing = missing_like(theirs)
            foreign = await answer_of(
                b_dp.IssueDataPlaneCredential(dp.IssueDataPlaneCredentialRequest(workspace_id=theirs))
            )
            assert foreign.code == NOT_FOUND, foreign
            alike = await answer_of(
                b_dp.IssueDataPlaneCredential(dp.IssueDataPlaneCredentialRequest(workspace_id=missing))
            )
            assert foreign.naming(theirs, missing) == alike

            b_credential = (
                await b_dp.IssueDataPlaneCredential(dp.IssueDataPlaneCredentialRequest(workspace_id=mine))
            ).credential
            code, _, err = await _exec(b_dp, b_credential, "cat", "/data/secret")
            assert code != 0 and b"No such file" in err, (code, err)
            await b_dp.WriteWorkspaceFile(
                dp.WriteWorkspaceFileRequest(credential=b_credential, path="/data/secret", content=b"B's")
            )
            for credential in (forged(b_credential, theirs), forged(b_credential, missing)):
                read = dp.ReadWorkspaceFileRequest(credential=credential, path="/data/secret")
                assert (await answer_of(b_dp.ReadWorkspaceFile(read))).code == grpc.StatusCode.UNAUTHENTICATED
            read = dp.ReadWorkspaceFileRequest(credential=a_credential, path="/data/secret")
            assert (await a_dp.ReadWorkspaceFile(read)).content == b"A's secret"
            code, out, _ = await _exec(b_dp, b_credential, "cat", "/data/secret")
            assert (code, out) == (0, b"B's")
        finally:
            await a.delete(theirs)
            await b.delete(mine)
