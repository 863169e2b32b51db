"""A thin test client over the generated stubs: what any gRPC client would do."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from kibo.ctrl.v1 import (
    command_pb2,
    error_pb2,
)
from kibo.ctrl.v1 import (
    observation_service_pb2 as obs,
)
from kibo.ctrl.v1 import (
    observation_service_pb2_grpc as obs_grpc,
)
from kibo.ctrl.v1 import (
    volume_service_pb2 as vol,
)
from kibo.ctrl.v1 import (
    volume_service_pb2_grpc as vol_grpc,
)
from kibo.ctrl.v1 import (
    workspace_pb2 as wp,
)
from kibo.ctrl.v1 import (
    workspace_service_pb2 as ws,
)
from kibo.ctrl.v1 import (
    workspace_service_pb2_grpc as ws_grpc,
)
from kibo.sim.v1 import simulator_pb2 as sim
from kibo.sim.v1 import simulator_pb2_grpc as sim_grpc

S = wp.WorkspaceState
TERMINAL = (command_pb2.COMMAND_STATE_SUCCEEDED, command_pb2.COMMAND_STATE_FAILED)
SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED
# The state a workspace settles in when a command of this kind SUCCEEDED and none came after it.
SETTLES_IN = {
    "create": S.WORKSPACE_STATE_AVAILABLE,
    "start": S.WORKSPACE_STATE_AVAILABLE,
    "stop": S.WORKSPACE_STATE_STOPPED,
    "force-stop": S.WORKSPACE_STATE_STOPPED,
    "delete": S.WORKSPACE_STATE_DELETED,
}


def implied_states(commands: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Each workspace's state as its last command implies: `commands` are (kind, workspace
    ID) in the order they were acknowledged (one client at a time per workspace), each of
    which SUCCEEDED."""
    return {workspace_id: SETTLES_IN[kind] for kind, workspace_id in commands}


def new_id(prefix: str = "test") -> str:
    return f"{prefix}/{uuid.uuid4()}"


def meta(command_id: str | None = None) -> wp.CommandMetadata:
    return wp.CommandMetadata(command_id=command_id or new_id())


def state_name(state: int) -> str:
    return wp.WorkspaceState.Name(state).removeprefix("WORKSPACE_STATE_")


@dataclass(frozen=True)
class ErrorInfo:
    code: grpc.StatusCode
    reason: str  # ErrorReason name without prefix, e.g. "CONFLICT"
    detail: error_pb2.ErrorDetail
    info: error_details_pb2.ErrorInfo


def error_of(error: grpc.aio.AioRpcError) -> ErrorInfo:
    """Decode the status details a rejection carries (ErrorDetail + ErrorInfo)."""
    detail, info = error_pb2.ErrorDetail(), error_details_pb2.ErrorInfo()
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for packed in status.details:
                if packed.Is(error_pb2.ErrorDetail.DESCRIPTOR):
                    packed.Unpack(detail)
                elif packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    packed.Unpack(info)
    reason = error_pb2.ErrorReason.Name(detail.reason).removeprefix("ERROR_REASON_")
    return ErrorInfo(error.code(), reason, detail, info)


class _Bearer:
    """Adds the Authorization header to a call's metadata."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._metadata)
        return details._replace(metadata=metadata)


# grpc.aio files an interceptor under one kind only: one class per kind.
class _BearerUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _BearerStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class Client:
    """Stubs for every service, over gRPC (`connect`) or Connect (`connect_http`)."""

    def __init__(self, channel: grpc.aio.Channel | None, stubs: tuple[Any, Any, Any, Any] | None = None) -> None:
        self.channel = channel
        self.transport = "grpc" if stubs is None else "connect"
        if stubs is None:
            assert channel is not None
            stubs = (
                ws_grpc.WorkspaceServiceStub(channel),
                obs_grpc.WorkspaceObservationServiceStub(channel),
                vol_grpc.VolumeServiceStub(channel),
                sim_grpc.SimulatorServiceStub(channel),
            )
        self.ws, self.obs, self.vol, self.sim = stubs

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, address: str, token: str | None = None, root_certificates: bytes | None = None
    ) -> AsyncIterator[Client]:
        """A gRPC client; with `token`, every call carries `authorization: Bearer TOKEN`."""
        interceptors: list[Any] = [_BearerUnary(token), _BearerStream(token)] if token else []
        if root_certificates is None:
            channel = grpc.aio.insecure_channel(address, interceptors=interceptors)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            channel = grpc.aio.secure_channel(address, credentials, interceptors=interceptors)
        async with channel:
            yield cls(channel)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_http(cls, http_address: str, token: str | None = None) -> AsyncIterator[Client]:
        """The same API over the Connect protocol on the HTTP listener."""
        from tests.connect_client import ConnectStub, connect_clients

        clients, transport = connect_clients(http_address)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            ws_, obs_, vol_, sim_ = (ConnectStub(c, headers) for c in clients)
            yield cls(None, (ws_, obs_, vol_, sim_))
        finally:
            for client in clients:
                await client.close()
            await transport.aclose()

    # -- commands, settled: resend the same request until the command is terminal ---------

    async def settle(self, method: Any, request: Any, within: float = 10.0) -> Any:
        deadline = time.monotonic() + within
        while True:
            response = await method(request)
            if response.command.state in TERMINAL or time.monotonic() > deadline:
                return response
            await asyncio.sleep(0.02)

    async def create(self, **spec: Any) -> wp.Workspace:
        """Create and wait until the create command is terminal."""
        response = await self.settle(
            self.ws.CreateWorkspace, ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(**spec))
        )
        return await self.wait_steady(response.workspace.workspace_id)

    async def stop(self, workspace_id: str, force: bool = False, command_id: str | None = None) -> Any:
        mode = ws.STOP_MODE_FORCE if force else ws.STOP_MODE_GRACEFUL
        request = ws.StopWorkspaceRequest(metadata=meta(command_id), workspace_id=workspace_id, mode=mode)
        return await self.settle(self.ws.StopWorkspace, request)

    async def start(self, workspace_id: str, command_id: str | None = None) -> Any:
        request = ws.StartWorkspaceRequest(metadata=meta(command_id), workspace_id=workspace_id)
        return await self.settle(self.ws.StartWorkspace, request)

    async def delete(self, workspace_id: str, command_id: str | None = None) -> Any:
        request = ws.DeleteWorkspaceRequest(metadata=meta(command_id), workspace_id=workspace_id)
        return await self.settle(self.ws.DeleteWorkspace, request)

    async def inject(self, workspace_id: str, fault: int) -> None:
        await self.sim.InjectFault(sim.InjectFaultRequest(workspace_id=workspace_id, fault=fault))

    # -- reads -----------------------------------------------------------------------------

    async def get(self, workspace_id: str) -> wp.Workspace:
        return (await self.ws.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=workspace_id))).workspace

    async def command(self, command_id: str) -> command_pb2.WorkspaceCommand:
        request = ws.GetWorkspaceCommandRequest(command_id=command_id)
        return (await self.ws.GetWorkspaceCommand(request)).command

    async def events(self, workspace_id: str) -> list[obs.WorkspaceEvent]:
        events, token = [], ""
        while True:
            request = obs.ListWorkspaceEventsRequest(workspace_id=workspace_id, page_size=1000, page_token=token)
            response = await self.obs.ListWorkspaceEvents(request)
            events.extend(response.events)
            token = response.next_page_token
            if not token:
                return events

    async def cleanup(self, workspace_id: str) -> obs.WorkspaceCleanup:
        request = obs.GetWorkspaceCleanupRequest(workspace_id=workspace_id)
        return (await self.obs.GetWorkspaceCleanup(request)).cleanup

    async def wait_for(self, workspace_id: str, *states: int, within: float = 10.0) -> wp.Workspace:
        """Poll until the workspace is in one of `states`."""
        deadline = time.monotonic() + within
        while True:
            workspace = await self.get(workspace_id)
            if workspace.state in states:
                return workspace
            if time.monotonic() > deadline:
                wanted = ", ".join(state_name(s) for s in states)
                raise TimeoutError(f"{workspace_id} is {state_name(workspace.state)}, wanted {wanted}")
            await asyncio.sleep(0.02)

    async def wait_steady(self, workspace_id: str, within: float = 10.0) -> wp.Workspace:
        return await self.wait_for(
            workspace_id,
            S.WORKSPACE_STATE_AVAILABLE,
            S.WORKSPACE_STATE_STOPPED,
            S.WORKSPACE_STATE_FAILED,
            S.WORKSPACE_STATE_DELETED,
            within=within,
        )

    async def create_volume(self, capacity_gib: int = 1) -> vol.Volume:
        request = vol.CreateVolumeRequest(metadata=meta(), capacity_gib=capacity_gib)
        return (await self.vol.CreateVolume(request)).volume


async def rejected(call: Awaitable[Any]) -> ErrorInfo:
    """Await a call that must fail; its decoded error."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error_of(error)
    raise AssertionError("the call was accepted")


@dataclass(frozen=True)
class Answer:
    """A refused call as the wire carried it: its code, its message and its trailing metadata
    (the error details' bytes among them), for comparing two answers byte for byte."""

    code: grpc.StatusCode
    message: str
    trailing: tuple[tuple[str, str | bytes], ...]

    def naming(self, old: str, new: str) -> Answer:
        """This answer with `old` (an ID) written as `new`; IDs of one length keep every
        length prefix in the details' bytes, so the bytes compare exactly."""
        assert len(old) == len(new), (old, new)

        def swap(value: str | bytes) -> str | bytes:
            return value.replace(old.encode(), new.encode()) if isinstance(value, bytes) else value.replace(old, new)

        return Answer(self.code, self.message.replace(old, new), tuple((k, swap(v)) for k, v in self.trailing))


def missing_like(existing: str) -> str:
    """An ID of the same form and length as `existing` (its 20 hex digits redrawn) that names
    nothing: what a caller who guessed would send."""
    digits = existing.rsplit("-", 1)[0] if existing.count("-") > 1 else existing
    start = digits.index("-") + 1
    fresh = uuid.uuid4().hex[: len(digits) - start]
    return existing[:start] + fresh + existing[len(digits) :]


async def answer_of(call: Awaitable[Any]) -> Answer:
    """Await a call that must be refused: the answer it got."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return Answer(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))
    raise AssertionError("the call was accepted")


async def assert_conflict(call: Awaitable[Any]) -> None:
    error = await rejected(call)
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "CONFLICT")
