"""The command registry: every command kibo takes, declared once.

An entry names the command's RPC, its request and response types, the parser that turns
the wire request into a domain `CommandRequest` (api/parse.py) and the engine handler that
executes it (engine/service.py). routes.py serves WORKSPACE_COMMANDS and VOLUME_COMMANDS
through `Api.workspace_command` and `Api.volume_command`, and `Service.execute` runs the
handler an entry names: a reader goes from an RPC name here to its parser and its handler
with "go to definition". tests/unit/test_command_registry.py checks that every command RPC
in proto/ (a request with `metadata.command_id`) has exactly one entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from ..engine.service import CommandRequest, Service, VolumeCommandHandler, WorkspaceCommandHandler
from . import parse

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


@dataclass(frozen=True)
class WorkspaceCommand(Generic[Req, Resp]):
    """A command on a workspace: answered with the workspace and the command (after the settle wait)."""

    rpc: str  # the proto method name, also the permission the caller needs
    request: type[Req]
    response: type[Resp]
    parse: Callable[[Req], CommandRequest]
    handle: WorkspaceCommandHandler


@dataclass(frozen=True)
class VolumeCommand(Generic[Req, Resp]):
    """A command on a standalone volume: it takes effect in its transaction, answered with the volume."""

    rpc: str
    request: type[Req]
    response: type[Resp]
    parse: Callable[[Req], CommandRequest]
    handle: VolumeCommandHandler


WORKSPACE_COMMANDS: tuple[WorkspaceCommand[Any, Any], ...] = (
    WorkspaceCommand(
        "CreateWorkspace",
        ws.CreateWorkspaceRequest,
        ws.CreateWorkspaceResponse,
        parse.create,
        Service.create_workspace,
    ),
    WorkspaceCommand(
        "StopWorkspace",
        ws.StopWorkspaceRequest,
        ws.StopWorkspaceResponse,
        parse.stop,
        Service.stop_workspace,
    ),
    WorkspaceCommand(
        "StartWorkspace",
        ws.StartWorkspaceRequest,
        ws.StartWorkspaceResponse,
        parse.start,
        Service.start_workspace,
    ),
    WorkspaceCommand(
        "DeleteWorkspace",
        ws.DeleteWorkspaceRequest,
        ws.DeleteWorkspaceResponse,
        parse.delete,
        Service.delete_workspace,
    ),
    WorkspaceCommand(
        "SetWorkspaceExpiration",
        ws.SetWorkspaceExpirationRequest,
        ws.SetWorkspaceExpirationResponse,
        parse.set_expiration,
        Service.set_workspace_expiration,
    ),
    WorkspaceCommand(
        "ClearWorkspaceExpiration",
        ws.ClearWorkspaceExpirationRequest,
        ws.ClearWorkspaceExpirationResponse,
        parse.clear_expiration,
        Service.clear_workspace_expiration,
    ),
    WorkspaceCommand(
        "SetWorkspaceLabels",
        ws.SetWorkspaceLabelsRequest,
        ws.SetWorkspaceLabelsResponse,
        parse.set_labels,
        Service.set_workspace_labels,
    ),
    WorkspaceCommand(
        "ResizeWorkspace",
        ws.ResizeWorkspaceRequest,
        ws.ResizeWorkspaceResponse,
        parse.resize,
        Service.resize_workspace,
    ),
    WorkspaceCommand(
        "SetWorkspaceNetworkPolicy",
        ws.SetWorkspaceNetworkPolicyRequest,
        ws.SetWorkspaceNetworkPolicyResponse,
        parse.set_network_policy,
        Service.set_workspace_network_policy,
    ),
    WorkspaceCommand(
        "BindWorkspaceVolume",
        ws.BindWorkspaceVolumeRequest,
        ws.BindWorkspaceVolumeResponse,
        parse.bind_volume,
        Service.bind_workspace_volume,
    ),
    WorkspaceCommand(
        "UnbindWorkspaceVolume",
        ws.UnbindWorkspaceVolumeRequest,
        ws.UnbindWorkspaceVolumeResponse,
        parse.unbind_volume,
        Service.unbind_workspace_volume,
    ),
    WorkspaceCommand(
        "RevokeWorkspaceDataPlaneAccess",
        ws.RevokeWorkspaceDataPlaneAccessRequest,
        ws.RevokeWorkspaceDataPlaneAccessResponse,
        parse.revoke,
        Service.revoke_workspace_data_plane_access,
    ),
)

VOLUME_COMMANDS: tuple[VolumeCommand[Any, Any], ...] = (
    VolumeCommand(
        "CreateVolume", vol.CreateVolumeRequest, vol.CreateVolumeResponse, parse.create_volume, Service.create_volume
    ),
    VolumeCommand(
        "DeleteVolume", vol.DeleteVolumeRequest, vol.DeleteVolumeResponse, parse.delete_volume, Service.delete_volume
    ),
)
