"""The client, written once: AsyncClient here (awaitable, over grpc.aio) and kibotos.Client,
the same methods blocking (over grpc), which `python -m kibotos._generate` writes into
client.py from this file with unasync. Edit this file, then regenerate; tests/unit/test_sdk_generated.py
fails when client.py is not what this file generates.

    with kibotos.Client("127.0.0.1:50051") as client:
        created = client.create_workspace()            # settled: the create is terminal
        workspace = client.wait_workspace(created.workspace, created.command.command_id)

    async with kibotos.AsyncClient("127.0.0.1:50051") as client:   # inside a running event loop
        created = await client.create_workspace()

The raw generated stubs are `client.workspaces`, `client.observation`, `client.volumes`,
`client.data_plane` and `client.simulator` (grpc errors from them are `grpc.RpcError`; `kibotos.from_rpc_error`
translates). The typed methods raise KiboError subclasses.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import Message
from kibo.ctrl.v1 import command_pb2, workspace_pb2
from kibo.ctrl.v1 import data_plane_service_pb2 as dp_pb2
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo.ctrl.v1 import observation_service_pb2 as obs_pb2
from kibo.ctrl.v1 import observation_service_pb2_grpc as obs_grpc
from kibo.ctrl.v1 import volume_service_pb2 as vol_pb2
from kibo.ctrl.v1 import volume_service_pb2_grpc as vol_grpc
from kibo.ctrl.v1 import workspace_service_pb2 as ws_pb2
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc
from kibo.node.v1 import node_admin_service_pb2 as nodes_pb2
from kibo.node.v1 import node_admin_service_pb2_grpc as nodes_grpc
from kibo.sim.v1 import simulator_pb2_grpc as sim_grpc

from . import build
from . import data_plane as dpl
from .aio_access import AsyncWorkspaceAccess
from .call_options import AsyncCall, OnAnswer, OnUpdate, SettleArg, raise_if_failed, settle_options, wait_options
from .connection import Connection
from .errors import from_rpc_error
from .settle import CommandResponse, SettleOptions, settle_async
from .wait import WaitOptions, WaitResult, wait_async

__all__ = ["AsyncClient", "SettleArg"]

R = TypeVar("R", bound=CommandResponse)
# How a stream ends when its server goes away (a stop cancels the calls it still serves).
_BROKEN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class AsyncClient:
    """A kibo client. `address` defaults to $KIBO_SERVER, else 127.0.0.1:50051."""

    def __init__(
        self,
        address: str | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        token: str | None = None,
        timeout: float | None = 30.0,
        settle_options: SettleOptions | None = None,
        connection: Connection | None = None,
    ) -> None:
        self.connection = connection or Connection.of(
            address,
            tls=tls,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            token=token,
            timeout=timeout,
        )
        self.settle_options = settle_options or SettleOptions()
        self._closed = False
        self.channel = self.connection.open_async_channel()
        self.workspaces = self.connection.stub(ws_grpc.WorkspaceServiceStub(self.channel))  # type: ignore[no-untyped-call]
        self.observation = self.connection.stub(obs_grpc.WorkspaceObservationServiceStub(self.channel))  # type: ignore[no-untyped-call]
        self.volumes = self.connection.stub(vol_grpc.VolumeServiceStub(self.channel))  # type: ignore[no-untyped-call]
        self.data_plane = self.connection.stub(dp_grpc.DataPlaneServiceStub(self.channel))  # type: ignore[no-untyped-call]
        self.simulator = self.connection.stub(sim_grpc.SimulatorServiceStub(self.channel))  # type: ignore[no-untyped-call]
        self.nodes = self.connection.stub(nodes_grpc.NodeAdminServiceStub(self.channel))  # type: ignore[no-untyped-call]

    @property
    def address(self) -> str:
        return self.connection.address

    async def close(self) -> None:
        self._closed = True  # a watch whose stream this cancels ends, not reconnects
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    # -- plumbing ----------------------------------------------------------------------

    async def _call(self, method: Any, request: Message) -> Any:
        try:
            return await method(request, timeout=self.connection.timeout, metadata=self.connection.metadata())
        except grpc.RpcError as error:
            raise self.connection.explain(from_rpc_error(error)) from None

    async def _command(
        self, method: Any, request: Message, kind: type[R], settle_arg: SettleArg, on_answer: OnAnswer | None
    ) -> R:
        async def once() -> R:
            return cast(R, await self._call(method, request))

        options = settle_options(settle_arg, self.settle_options)
        if options is None:
            response = await once()
            if on_answer is not None:
                on_answer(response)
            return raise_if_failed(response)
        return await settle_async(once, options, on_answer=on_answer)

    async def settle(
        self,
        call: AsyncCall[R],
        options: SettleOptions | None = None,
        *,
        on_answer: OnAnswer | None = None,
    ) -> R:
        """Settle `call` (kibotos.settle, or settle_async for AsyncClient) with this client's default options."""
        return await settle_async(call, options or self.settle_options, on_answer=on_answer)

    # -- reads -------------------------------------------------------------------------

    async def get_capabilities(self) -> list[str]:
        response: ws_pb2.GetCapabilitiesResponse = await self._call(
            self.workspaces.GetCapabilities, ws_pb2.GetCapabilitiesRequest()
        )
        return list(response.capabilities)

    async def get_workspace(self, workspace_id: str) -> workspace_pb2.Workspace:
        response: ws_pb2.GetWorkspaceResponse = await self._call(
            self.workspaces.GetWorkspace, ws_pb2.GetWorkspaceRequest(workspace_id=workspace_id)
        )
        return response.workspace

    async def list_workspaces(
        self, *, include_deleted: bool = False, filter: str = "", page_size: int = 0
    ) -> AsyncIterator[workspace_pb2.Workspace]:
        """Every matching workspace, page after page. `filter`: `state = AVAILABLE AND labels.team = "a"`."""
        token = ""
        while True:
            request = ws_pb2.ListWorkspacesRequest(
                page_size=page_size, page_token=token, include_deleted=include_deleted, filter=filter
            )
            response: ws_pb2.ListWorkspacesResponse = await self._call(self.workspaces.ListWorkspaces, request)
            for workspace in response.workspaces:
                yield workspace
            token = response.next_page_token
            if not token:
                return

    async def get_command(self, command_id: str) -> command_pb2.WorkspaceCommand:
        response: ws_pb2.GetWorkspaceCommandResponse = await self._call(
            self.workspaces.GetWorkspaceCommand, ws_pb2.GetWorkspaceCommandRequest(command_id=command_id)
        )
        return response.command

    async def watch_workspace(
        self,
        workspace_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - one gRPC call's deadline
    ) -> AsyncGenerator[workspace_pb2.Workspace, None]:
        """The current snapshot, then one per stored change; ends after DELETED."""
        call = self.workspaces.WatchWorkspace(
            ws_pb2.WatchWorkspaceRequest(workspace_id=workspace_id),
            timeout=timeout,
            metadata=self.connection.metadata(),
        )
        try:
            async for response in call:
                yield response.workspace
        except grpc.RpcError as error:
            raise self.connection.explain(from_rpc_error(error)) from None
        finally:
            call.cancel()

    async def get_workspace_cleanup(self, workspace_id: str) -> obs_pb2.WorkspaceCleanup:
        response: obs_pb2.GetWorkspaceCleanupResponse = await self._call(
            self.observation.GetWorkspaceCleanup, obs_pb2.GetWorkspaceCleanupRequest(workspace_id=workspace_id)
        )
        return response.cleanup

    async def list_workspace_events(
        self, workspace_id: str, *, page_size: int = 0
    ) -> AsyncIterator[obs_pb2.WorkspaceEvent]:
        token = ""
        while True:
            request = obs_pb2.ListWorkspaceEventsRequest(
                workspace_id=workspace_id, page_size=page_size, page_token=token
            )
            response: obs_pb2.ListWorkspaceEventsResponse = await self._call(
                self.observation.ListWorkspaceEvents, request
            )
            for event in response.events:
                yield event
            token = response.next_page_token
            if not token:
                return

    async def list_events(
        self,
        *,
        types: Sequence[int] = (),
        workspace_id: str = "",
        node_id: str = "",
        start_time: build.ExpireTime | None = None,
        end_time: build.ExpireTime | None = None,
        page_size: int = 0,
    ) -> AsyncIterator[obs_pb2.WorkspaceEvent]:
        """Every matching event of the workspaces this token sees (an operator's: every
        tenant's), oldest first, page after page. `types`: EventType values (none: all);
        `start_time` inclusive, `end_time` exclusive."""
        filters = build.event_filters(types, workspace_id, node_id, start_time, end_time)
        async for page in self._event_pages(filters, page_size):
            for event in page.events:
                yield event

    async def _event_pages(self, filters: dict[str, Any], page_size: int) -> AsyncIterator[obs_pb2.ListEventsResponse]:
        token = ""
        while True:
            request = obs_pb2.ListEventsRequest(page_size=page_size, page_token=token, **filters)
            response: obs_pb2.ListEventsResponse = await self._call(self.observation.ListEvents, request)
            yield response
            token = response.next_page_token
            if not token:
                return

    async def watch_events(
        self,
        *,
        types: Sequence[int] = (),
        workspace_id: str = "",
        node_id: str = "",
        start_time: build.ExpireTime | None = None,
        end_time: build.ExpireTime | None = None,
        after_sequence: int = 0,
        history: bool = False,
        reconnect: bool = True,
    ) -> AsyncGenerator[obs_pb2.WorkspaceEvent, None]:
        """Matching events as they are stored, never ending by itself: those after
        `after_sequence` (0: from now on), or with `history` first every stored one (as
        list_events) and then the new ones. A stream that breaks (UNAVAILABLE, or CANCELLED by
        the server: it restarts or stops, the network) is called again, once the channel is
        ready, after the last event it sent: none missed, none twice (up to 10 breaks in a row
        with nothing received; `reconnect=False`: the first one raises)."""
        filters = build.event_filters(types, workspace_id, node_id, start_time, end_time)
        resume = after_sequence
        if history:
            if after_sequence:
                raise ValueError("give after_sequence or history, not both")
            async for page in self._event_pages(filters, 1000):
                for event in page.events:
                    yield event
                resume = page.resume_after_sequence
        breaks = 0
        while True:
            call = self.observation.WatchEvents(
                obs_pb2.WatchEventsRequest(after_sequence=resume, **filters),
                metadata=self.connection.metadata(),
                wait_for_ready=breaks > 0,
            )
            try:
                async for response in call:
                    breaks = 0
                    resume = max(resume, response.resume_after_sequence)
                    if response.HasField("event"):
                        yield response.event
                return
            except grpc.RpcError as error:
                breaks += 1
                if not reconnect or self._closed or error.code() not in _BROKEN or breaks > 10:
                    raise self.connection.explain(from_rpc_error(error)) from None
            finally:
                call.cancel()

    async def list_workspace_instances(self, workspace_id: str) -> list[obs_pb2.Instance]:
        """The workspace's instances (one per execution: the current one and those still held)."""
        response: obs_pb2.ListWorkspaceInstancesResponse = await self._call(
            self.observation.ListWorkspaceInstances, obs_pb2.ListWorkspaceInstancesRequest(workspace_id=workspace_id)
        )
        return list(response.instances)

    async def get_volume(self, volume_id: str) -> vol_pb2.Volume:
        response: vol_pb2.GetVolumeResponse = await self._call(
            self.volumes.GetVolume, vol_pb2.GetVolumeRequest(volume_id=volume_id)
        )
        return response.volume

    # -- commands ----------------------------------------------------------------------
    # Each builds its request once (a new command ID unless given) and, by default, settles
    # it: resends the identical request until the command is terminal.

    async def create_workspace(
        self,
        spec: workspace_pb2.WorkspaceSpec | None = None,
        *,
        command_id: str | None = None,
        expire_time: build.ExpireTime | None = None,
        expiration_action: int = 0,
        settle: SettleArg = True,
        on_answer: OnAnswer | None = None,
    ) -> ws_pb2.CreateWorkspaceResponse:
        request = build.create(spec, command_id, expire_time, expiration_action)
        return await self._command(
            self.workspaces.CreateWorkspace, request, ws_pb2.CreateWorkspaceResponse, settle, on_answer
        )

    async def stop_workspace(
        self,
        workspace_id: str,
        *,
        force: bool = False,
        command_id: str | None = None,
        expected_expiration_revision: int = 0,
        settle: SettleArg = True,
        on_answer: OnAnswer | None = None,
    ) -> ws_pb2.StopWorkspaceResponse:
        request = build.stop(workspace_id, force, command_id, expected_expiration_revision)
        return await self._command(
            self.workspaces.StopWorkspace, request, ws_pb2.StopWorkspaceResponse, settle, on_answer
        )

    async def start_workspace(
        self,
        workspace_id: str,
        *,
        command_id: str | None = None,
        expected_expiration_revision: int = 0,
        settle: SettleArg = True,
        on_answer: OnAnswer | None = None,
    ) -> ws_pb2.StartWorkspaceResponse:
        request = build.start(workspace_id, command_id, expected_expiration_revision)
        return await self._command(
            self.workspaces.StartWorkspace, request, ws_pb2.StartWorkspaceResponse, settle, on_answer
        )

    async def delete_workspace(
        self,
        workspace_id: str,
        *,
        command_id: str | None = None,
        expected_expiration_revision: int = 0,
        settle: SettleArg = True,
        on_answer: OnAnswer | None = None,
    ) -> ws_pb2.DeleteWorkspaceResponse:
        request = build.delete(workspace_id, command_id, expected_expiration_revision)
        return await self._command(
            self.workspaces.DeleteWorkspace, request, ws_pb2.DeleteWorkspaceResponse, settle, on_answer
        )

    async def set_workspace_labels(
        self,
        workspace_id: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        *,
        command_id: str | None = None,
        settle: SettleArg = True,
    ) -> ws_pb2.SetWorkspaceLabelsResponse:
        """Replaces both maps."""
        request = build.labels(workspace_id, labels, annotations, command_id)
        return await self._command(
            self.workspaces.SetWorkspaceLabels, request, ws_pb2.SetWorkspaceLabelsResponse, settle, None
        )

    async def resize_workspace(
        self,
        workspace_id: str,
        *,
        vcpus: int = 0,
        memory_mib: int = 0,
        writable_layer_gib: int = 0,
        command_id: str | None = None,
        settle: SettleArg = True,
    ) -> ws_pb2.ResizeWorkspaceResponse:
        """Requires STOPPED. Values left 0 keep their current value."""
        request = build.resize(workspace_id, vcpus, memory_mib, writable_layer_gib, command_id)
        return await self._command(
            self.workspaces.ResizeWorkspace, request, ws_pb2.ResizeWorkspaceResponse, settle, None
        )

    async def move_workspace(
        self, workspace_id: str, target_node_id: str, *, command_id: str | None = None
    ) -> ws_pb2.MoveWorkspaceResponse:
        """An operator's: move a STOPPED workspace's disks (layer and volumes) to another node.
        Answered at once with the RUNNING command; follow it with get_command (its `progress`)
        until SUCCEEDED (the workspace starts only there from now) or FAILED (it stays where it was)."""
        request = build.move(workspace_id, target_node_id, command_id)
        return await self._command(self.workspaces.MoveWorkspace, request, ws_pb2.MoveWorkspaceResponse, False, None)

    async def set_workspace_expiration(
        self,
        workspace_id: str,
        expire_time: build.ExpireTime,
        action: int = workspace_pb2.EXPIRATION_ACTION_STOP,
        *,
        expected_expiration_revision: int = 0,
        command_id: str | None = None,
        settle: SettleArg = True,
    ) -> ws_pb2.SetWorkspaceExpirationResponse:
        request = build.set_expiration(workspace_id, expire_time, action, expected_expiration_revision, command_id)
        return await self._command(
            self.workspaces.SetWorkspaceExpiration, request, ws_pb2.SetWorkspaceExpirationResponse, settle, None
        )

    async def clear_workspace_expiration(
        self,
        workspace_id: str,
        *,
        expected_expiration_revision: int = 0,
        command_id: str | None = None,
        settle: SettleArg = True,
    ) -> ws_pb2.ClearWorkspaceExpirationResponse:
        request = build.clear_expiration(workspace_id, expected_expiration_revision, command_id)
        return await self._command(
            self.workspaces.ClearWorkspaceExpiration, request, ws_pb2.ClearWorkspaceExpirationResponse, settle, None
        )

    async def bind_workspace_volume(
        self,
        workspace_id: str,
        volume_id: str,
        mount_path: str,
        *,
        delete_with_workspace: bool = False,
        command_id: str | None = None,
        settle: SettleArg = True,
    ) -> ws_pb2.BindWorkspaceVolumeResponse:
        """Bind an existing volume at `mount_path` (requires STOPPED). Binding a volume the
        workspace already has replaces that binding: this is also how to rebind (a new mount
        path, or whether the volume is deleted with the workspace)."""
        request = build.bind_volume(workspace_id, volume_id, mount_path, delete_with_workspace, command_id)
        return await self._command(
            self.workspaces.BindWorkspaceVolume, request, ws_pb2.BindWorkspaceVolumeResponse, settle, None
        )

    async def unbind_workspace_volume(
        self, workspace_id: str, volume_id: str, *, command_id: str | None = None, settle: SettleArg = True
    ) -> ws_pb2.UnbindWorkspaceVolumeResponse:
        """Remove a volume's binding (requires STOPPED); the volume and its data stay."""
        request = build.unbind_volume(workspace_id, volume_id, command_id)
        return await self._command(
            self.workspaces.UnbindWorkspaceVolume, request, ws_pb2.UnbindWorkspaceVolumeResponse, settle, None
        )

    async def set_workspace_network_policy(
        self,
        workspace_id: str,
        egress: int,
        allowed_cidrs: Sequence[str] = (),
        *,
        denied_cidrs: Sequence[str] = (),
        allowed_domains: Sequence[str] = (),
        denied_domains: Sequence[str] = (),
        allowed_ports: Sequence[int] = (),
        command_id: str | None = None,
        settle: SettleArg = True,
    ) -> ws_pb2.SetWorkspaceNetworkPolicyResponse:
        """Replace the egress policy (workspace_pb2.NETWORK_EGRESS_*). With ALLOW_LISTED:
        `allowed_cidrs`, `allowed_domains` (exact "api.github.com", or "*.pypi.org" for any
        name under pypi.org) and `allowed_ports` (what the allowed CIDRs and domains are
        limited to; empty: any port). With ALLOW_ALL or ALLOW_LISTED: `denied_cidrs` and
        `denied_domains`. Deny beats allow. While AVAILABLE it applies at once (connections the
        new policy no longer allows are cut); on a STOPPED workspace at the next start."""
        request = build.network_policy(
            workspace_id,
            egress,
            allowed_cidrs,
            command_id,
            denied_cidrs=denied_cidrs,
            allowed_domains=allowed_domains,
            denied_domains=denied_domains,
            allowed_ports=allowed_ports,
        )
        return await self._command(
            self.workspaces.SetWorkspaceNetworkPolicy, request, ws_pb2.SetWorkspaceNetworkPolicyResponse, settle, None
        )

    async def create_workspace_exposure(
        self,
        workspace_id: str,
        port: int,
        *,
        public: bool = False,
        expire_in_seconds: int = 0,
        command_id: str | None = None,
        settle: SettleArg = True,
    ) -> ws_pb2.CreateWorkspaceExposureResponse:
        """A URL to TCP `port` (1..65535) in the guest (requires AVAILABLE; one exposure per
        port), valid until deleted, `expire_in_seconds` (0: no expiry) or the workspace's stop.
        Unless `public`, requests need `exposure.token`: the X-Kibo-Exposure-Token header, or
        once `?kibo_token=` (sets a cookie for the URL's host). The token is stored hashed and
        is in the answer of the send that made the exposure only: this method keeps it from
        that answer while settling; sending the same `command_id` again answers without it."""
        request = build.create_exposure(workspace_id, port, public, expire_in_seconds, command_id)
        tokens: dict[str, str] = {}

        def keep_token(answer: CommandResponse) -> None:
            exposure = cast(ws_pb2.CreateWorkspaceExposureResponse, answer).exposure
            if exposure.token:
                tokens[exposure.exposure_id] = exposure.token

        response = await self._command(
            self.workspaces.CreateWorkspaceExposure,
            request,
            ws_pb2.CreateWorkspaceExposureResponse,
            settle,
            keep_token,
        )
        if not response.exposure.token and response.exposure.exposure_id in tokens:
            response.exposure.token = tokens[response.exposure.exposure_id]
        return response

    async def list_workspace_exposures(self, workspace_id: str) -> list[workspace_pb2.Exposure]:
        """The workspace's exposures valid now (none after a stop), without their tokens."""
        response: ws_pb2.ListWorkspaceExposuresResponse = await self._call(
            self.workspaces.ListWorkspaceExposures, ws_pb2.ListWorkspaceExposuresRequest(workspace_id=workspace_id)
        )
        return list(response.exposures)

    async def delete_workspace_exposure(
        self, workspace_id: str, exposure_id: str, *, command_id: str | None = None, settle: SettleArg = True
    ) -> ws_pb2.DeleteWorkspaceExposureResponse:
        """Revoke one exposure (requires AVAILABLE); its open connections are cut."""
        request = build.delete_exposure(workspace_id, exposure_id, command_id)
        return await self._command(
            self.workspaces.DeleteWorkspaceExposure, request, ws_pb2.DeleteWorkspaceExposureResponse, settle, None
        )

    async def revoke_workspace_data_plane_access(
        self, workspace_id: str, *, command_id: str | None = None, settle: SettleArg = True
    ) -> ws_pb2.RevokeWorkspaceDataPlaneAccessResponse:
        """Invalidate every data-plane credential issued for the workspace (requires AVAILABLE)."""
        request = build.revoke_data_plane_access(workspace_id, command_id)
        return await self._command(
            self.workspaces.RevokeWorkspaceDataPlaneAccess,
            request,
            ws_pb2.RevokeWorkspaceDataPlaneAccessResponse,
            settle,
            None,
        )

    async def create_volume(self, capacity_gib: int = 0, *, command_id: str | None = None) -> vol_pb2.Volume:
        response: vol_pb2.CreateVolumeResponse = await self._call(
            self.volumes.CreateVolume, build.create_volume(capacity_gib, command_id)
        )
        return response.volume

    async def delete_volume(self, volume_id: str, *, command_id: str | None = None) -> vol_pb2.Volume:
        """Only an unbound volume can be deleted."""
        response: vol_pb2.DeleteVolumeResponse = await self._call(
            self.volumes.DeleteVolume, build.delete_volume(volume_id, command_id)
        )
        return response.volume

    async def inject_fault(self, workspace_id: str, fault: int) -> None:
        """kibo.sim.v1.SimulatorService/InjectFault (only servers with `--runtime sim` have it).
        An empty `workspace_id`, node silence and a lost storage pool reach every workspace on
        the node: they need an operator token (`kibo-ctrl token create --role operator`)."""
        await self._call(self.simulator.InjectFault, build.fault(workspace_id, fault))

    # -- nodes (kibo.node.v1.NodeAdminService: an operator token) ---------------------------

    async def list_nodes(self) -> list[nodes_pb2.Node]:
        """The cluster's nodes: state (READY, SILENT, CORDONED, DRAINING, DRAINED), capacity
        and use, labels, storage pool, lease."""
        response: nodes_pb2.ListNodesResponse = await self._call(self.nodes.ListNodes, nodes_pb2.ListNodesRequest())
        return list(response.nodes)

    async def cordon_node(self, node_id: str) -> nodes_pb2.Node:
        """No new workspaces are placed on the node; what runs there keeps running."""
        response: nodes_pb2.CordonNodeResponse = await self._call(
            self.nodes.CordonNode, nodes_pb2.CordonNodeRequest(node_id=node_id)
        )
        return response.node

    async def uncordon_node(self, node_id: str) -> nodes_pb2.Node:
        """Place workspaces on the node again (also ends a drain)."""
        response: nodes_pb2.UncordonNodeResponse = await self._call(
            self.nodes.UncordonNode, nodes_pb2.UncordonNodeRequest(node_id=node_id)
        )
        return response.node

    async def drain_node(self, node_id: str) -> nodes_pb2.Node:
        """Cordon the node; it shows DRAINING until its last instance is gone (its workspaces
        leave as they are stopped or deleted, and start again on another node)."""
        response: nodes_pb2.DrainNodeResponse = await self._call(
            self.nodes.DrainNode, nodes_pb2.DrainNodeRequest(node_id=node_id)
        )
        return response.node

    async def forget_node(self, node_id: str, *, abandon_disks: bool = False) -> nodes_pb2.ForgetNodeResponse:
        """Declare a SILENT node lost for good: what ran there is released (its workspaces
        FAILED, to start elsewhere), and it may never join again under its ID. Refused while
        workspaces keep disks there, unless `abandon_disks` (they start elsewhere with empty ones)."""
        response: nodes_pb2.ForgetNodeResponse = await self._call(
            self.nodes.ForgetNode, nodes_pb2.ForgetNodeRequest(node_id=node_id, abandon_disks=abandon_disks)
        )
        return response

    async def drain_node_moving_stopped(self, node_id: str) -> nodes_pb2.DrainNodeResponse:
        """Drain the node, and move the disks of its STOPPED workspaces to other nodes (a
        MoveWorkspace command each: `moves`, to follow with get_command; `unmoved`: those it
        could not move, and why)."""
        response: nodes_pb2.DrainNodeResponse = await self._call(
            self.nodes.DrainNode, nodes_pb2.DrainNodeRequest(node_id=node_id, move_stopped=True)
        )
        return response

    # -- data plane (see kibotos.data_plane) ------------------------------------------------

    def workspace_access(
        self, workspace_id: str, *, credential: str = "", retry_unavailable: float = dpl.DEFAULT_RETRY_UNAVAILABLE
    ) -> AsyncWorkspaceAccess:
        """The processes and files of a running workspace (`.processes`, `.files`: see
        kibotos.aio_access), with a data-plane credential issued at its first call (or the one
        given), and issued anew once if a call is refused after the workspace was started again."""
        return AsyncWorkspaceAccess(self, workspace_id, credential=credential, retry_unavailable=retry_unavailable)

    async def issue_data_plane_credential(
        self, workspace_id: str, *, retry_unavailable: float = dpl.DEFAULT_RETRY_UNAVAILABLE
    ) -> dp_pb2.IssueDataPlaneCredentialResponse:
        """A credential for the data-plane calls on this workspace, which must be AVAILABLE
        (ConflictError otherwise). Valid until the next stop, force stop, revoke, delete or
        start. UNAVAILABLE is retried for `retry_unavailable` seconds (0: not at all)."""
        request = dp_pb2.IssueDataPlaneCredentialRequest(workspace_id=workspace_id)

        async def once() -> dp_pb2.IssueDataPlaneCredentialResponse:
            return cast(
                dp_pb2.IssueDataPlaneCredentialResponse,
                await self._call(self.data_plane.IssueDataPlaneCredential, request),
            )

        return await dpl.retrying_async(once, retry_unavailable)

    async def exec_workspace_command_stream(
        self,
        credential: str,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
        working_dir: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - the command's own limit, enforced by the server
    ) -> AsyncGenerator[dpl.ExecEvent, None]:
        """Run `argv` (no shell) in the workspace; yield its output as it comes
        (ExecOutput), then how it ended (ExecExit, the last event).

        `stdin` is given to the command, then closed; `env` is added to the guest's
        environment; `working_dir` defaults to /. `timeout` (seconds, rounded up): the
        server kills the command then and the exit code is 124; without it nothing bounds
        the call. Closing the generator early cancels the call, which kills the command.

        Never retried: an UnavailableError (or any transport error) may come after the
        command started, so it may have run, or still run. Resend only what is safe to
        run twice."""
        request = dpl.exec_request(credential, argv, stdin, env, working_dir, timeout)
        call = self.data_plane.ExecWorkspaceCommand(
            request,
            timeout=dpl.exec_deadline(timeout, self.connection.timeout),
            metadata=self.connection.metadata(),
        )
        try:
            async for response in call:
                event = dpl.event_of(response)
                yield event
                if isinstance(event, dpl.ExecExit):
                    return
        except grpc.RpcError as error:
            raise self.connection.explain(from_rpc_error(error)) from None
        finally:
            call.cancel()
        raise dpl.no_exit_code()

    async def exec_workspace_command(
        self,
        credential: str,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
        working_dir: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - the command's own limit, enforced by the server
    ) -> dpl.ExecResult:
        """Run `argv` in the workspace and return its exit code, stdout and stderr (see
        exec_workspace_command_stream). A non-zero exit code is a result, not an error.
        Never retried: a failed call may have run the command."""
        collector = dpl.Collector()
        async with contextlib.aclosing(
            self.exec_workspace_command_stream(
                credential, argv, stdin=stdin, env=env, working_dir=working_dir, timeout=timeout
            )
        ) as events:
            async for event in events:
                collector.add(event)
        return collector.result()

    async def read_workspace_file(
        self, credential: str, path: str, *, retry_unavailable: float = dpl.DEFAULT_RETRY_UNAVAILABLE
    ) -> bytes:
        """The content of a file under a volume mount (an absolute guest path such as
        /data/notes.txt; InvalidArgumentError outside the mounts, NotFoundError when
        missing). Up to 3 MiB. UNAVAILABLE is retried for `retry_unavailable` seconds."""
        request = dp_pb2.ReadWorkspaceFileRequest(credential=credential, path=path)

        async def once() -> bytes:
            response = cast(
                dp_pb2.ReadWorkspaceFileResponse, await self._call(self.data_plane.ReadWorkspaceFile, request)
            )
            return response.content

        return await dpl.retrying_async(once, retry_unavailable)

    async def write_workspace_file(
        self,
        credential: str,
        path: str,
        content: bytes,
        *,
        mode: int = 0,
        retry_unavailable: float = dpl.DEFAULT_RETRY_UNAVAILABLE,
    ) -> int:
        """Create or replace (atomically) a file under a volume mount; return its size.
        `mode`: its permission bits (0: 0o644). Up to 3 MiB (ValueError beyond).

        UNAVAILABLE is retried for `retry_unavailable` seconds: a write replaces the whole
        file, so repeating it leaves the same file (pass 0 if another writer may change the
        file in between)."""
        dpl.check_file_size(content)
        request = dp_pb2.WriteWorkspaceFileRequest(credential=credential, path=path, content=content, mode=mode)

        async def once() -> int:
            response = cast(
                dp_pb2.WriteWorkspaceFileResponse, await self._call(self.data_plane.WriteWorkspaceFile, request)
            )
            return int(response.size)

        return await dpl.retrying_async(once, retry_unavailable)

    # -- waits -------------------------------------------------------------------------

    async def wait(
        self,
        workspace_id: str,
        command_id: str | None = None,
        *,
        deleted: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the whole wait's deadline
        options: WaitOptions | None = None,
        on_update: OnUpdate | None = None,
    ) -> WaitResult:
        return await wait_async(
            self,
            workspace_id,
            command_id,
            deleted=deleted,
            options=wait_options(options, timeout),
            on_update=on_update,
        )

    async def wait_workspace(
        self,
        workspace: workspace_pb2.Workspace | str,
        command_id: str | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the whole wait's deadline
        options: WaitOptions | None = None,
        on_update: OnUpdate | None = None,
    ) -> workspace_pb2.Workspace:
        """Follow the workspace until `command_id` is terminal and the workspace steady;
        return it, or raise CommandFailedError (or WaitTimeoutError; nothing is cancelled)."""
        workspace_id = workspace if isinstance(workspace, str) else workspace.workspace_id
        result = await self.wait(workspace_id, command_id, timeout=timeout, options=options, on_update=on_update)
        return result.workspace

    async def wait_workspace_deleted(
        self,
        workspace_id: str,
        command_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the whole wait's deadline
        options: WaitOptions | None = None,
        on_update: OnUpdate | None = None,
    ) -> workspace_pb2.Workspace:
        """Wait until the delete `command_id` is terminal and the workspace DELETED."""
        result = await self.wait(
            workspace_id, command_id, deleted=True, timeout=timeout, options=options, on_update=on_update
        )
        return result.workspace
