"""The command registry: every command kibo takes, declared once.

An entry names the command's RPC, its request and response types, the parser that turns
the wire request into a domain `CommandRequest` (api/parse.py), the engine handler that
executes it (engine/service.py) and the command kinds it records (domain/model.py).
routes.py serves WORKSPACE_COMMANDS and VOLUME_COMMANDS through `Api.workspace_command` and
`Api.volume_command`, and `Service.execute` runs the handler an entry names: a reader goes
from an RPC name here to its parser and its handler with "go to definition".
tests/unit/test_command_registry.py checks that every command RPC in proto/ (a request with
`metadata.command_id`) has exactly one entry, and every command kind exactly one entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from ..domain.model import CommandKind
from ..engine.service import CommandRequest, Service, VolumeCommandHandler, WorkspaceCommandHandler
from . import parse

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


def respond(response: type[Resp], **fields: Message) -> Resp:
    """A response message with these fields. (The protobuf stubs' `Message` takes no keywords;
    every generated response type does.)"""
    make: Callable[..., Resp] = response
    return make(**fields)


@dataclass(frozen=True)
class WorkspaceCommand(Generic[Req, Resp]):
    """A command on a workspace: answered with the workspace and the command (after the settle wait)."""

    rpc: str  # the proto method name, also the permission the caller needs
    request: type[Req]
    response: type[Resp]
    parse: Callable[[Req], CommandRequest]
    handle: WorkspaceCommandHandler
    # The kinds its requests parse to (one, but for StopWorkspace's two modes).
    kinds: tuple[CommandKind, ...]
    # Needs an operator token (it reaches the nodes: MoveWorkspace), not only an admin one.
    operator: bool = False
    # Answered after the settle wait (the command is terminal, or --settle-ms passed); a
    # long copy (MoveWorkspace) is answered at once, RUNNING, with its progress.
    settles: bool = True


@dataclass(frozen=True)
class VolumeCommand(Generic[Req, Resp]):
    """A command on a standalone volume: it takes effect in its transaction, answered with the volume."""

    rpc: str
    request: type[Req]
    response: type[Resp]
    parse: Callable[[Req], CommandRequest]
    handle: VolumeCommandHandler
    kinds: tuple[CommandKind, ...]


WORKSPACE_COMMANDS: tuple[WorkspaceCommand[Any, Any], ...] = (
    WorkspaceCommand(
        "CreateWorkspace",
        ws.CreateWorkspaceRequest,
        ws.CreateWorkspaceResponse,
        parse.create,
        Service.create_workspace,
        (CommandKind.CREATE,),
    ),
    WorkspaceCommand(
        "StopWorkspace",
        ws.StopWorkspaceRequest,
        ws.StopWorkspaceResponse,
        parse.stop,
        Service.stop_workspace,
        (CommandKind.STOP, CommandKind.FORCE_STOP),
    ),
    WorkspaceCommand(
        "StartWorkspace",
        ws.StartWorkspaceRequest,
        ws.StartWorkspaceResponse,
        parse.start,
        Service.start_workspace,
        (CommandKind.START,),
    ),
    WorkspaceCommand(
        "DeleteWorkspace",
        ws.DeleteWorkspaceRequest,
        ws.DeleteWorkspaceResponse,
        parse.delete,
        Service.delete_workspace,
        (CommandKind.DELETE,),
    ),
    WorkspaceCommand(
        "SetWorkspaceExpiration",
        ws.SetWorkspaceExpirationRequest,
        ws.SetWorkspaceExpirationResponse,
        parse.set_expiration,
        Service.set_workspace_expiration,
        (CommandKind.SET_EXPIRATION,),
    ),
    WorkspaceCommand(
        "ClearWorkspaceExpiration",
        ws.ClearWorkspaceExpirationRequest,
        ws.ClearWorkspaceExpirationResponse,
        parse.clear_expiration,
        Service.clear_workspace_expiration,
        (CommandKind.CLEAR_EXPIRATION,),
    ),
    WorkspaceCommand(
        "SetWorkspaceLabels",
        ws.SetWorkspaceLabelsRequest,
        ws.SetWorkspaceLabelsResponse,
        parse.set_labels,
        Service.set_workspace_labels,
        (CommandKind.SET_LABELS,),
    ),
    WorkspaceCommand(
        "MoveWorkspace",
        ws.MoveWorkspaceRequest,
        ws.MoveWorkspaceResponse,
        parse.move,
        Service.move_workspace,
        (CommandKind.MOVE,),
        operator=True,
        settles=False,
    ),
    WorkspaceCommand(
        "ResizeWorkspace",
        ws.ResizeWorkspaceRequest,
        ws.ResizeWorkspaceResponse,
        parse.resize,
        Service.resize_workspace,
        (CommandKind.RESIZE,),
    ),
    WorkspaceCommand(
        "SetWorkspaceNetworkPolicy",
        ws.SetWorkspaceNetworkPolicyRequest,
        ws.SetWorkspaceNetworkPolicyResponse,
        parse.set_network_policy,
        Service.set_workspace_network_policy,
        (CommandKind.SET_NETWORK_POLICY,),
    ),
    WorkspaceCommand(
        "BindWorkspaceVolume",
        ws.BindWorkspaceVolumeRequest,
        ws.BindWorkspaceVolumeResponse,
        parse.bind_volume,
        Service.bind_workspace_volume,
        (CommandKind.BIND_VOLUME,),
    ),
    WorkspaceCommand(
        "UnbindWorkspaceVolume",
        ws.UnbindWorkspaceVolumeRequest,
        ws.UnbindWorkspaceVolumeResponse,
        parse.unbind_volume,
        Service.unbind_workspace_volume,
        (CommandKind.UNBIND_VOLUME,),
    ),
    WorkspaceCommand(
        "CreateWorkspaceExposure",
        ws.CreateWorkspaceExposureRequest,
        ws.CreateWorkspaceExposureResponse,
        parse.create_exposure,
        Service.create_workspace_exposure,
        (CommandKind.CREATE_EXPOSURE,),
    ),
    WorkspaceCommand(
        "DeleteWorkspaceExposure",
        ws.DeleteWorkspaceExposureRequest,
        ws.DeleteWorkspaceExposureResponse,
        parse.delete_exposure,
        Service.delete_workspace_exposure,
        (CommandKind.DELETE_EXPOSURE,),
    ),
    WorkspaceCommand(
        "RevokeWorkspaceDataPlaneAccess",
        ws.RevokeWorkspaceDataPlaneAccessRequest,
        ws.RevokeWorkspaceDataPlaneAccessResponse,
        parse.revoke,
        Service.revoke_workspace_data_plane_access,
        (CommandKind.REVOKE_DATA_PLANE_ACCESS,),
    ),
)

VOLUME_COMMANDS: tuple[VolumeCommand[Any, Any], ...] = (
    VolumeCommand(
        "CreateVolume",
        vol.CreateVolumeRequest,
        vol.CreateVolumeResponse,
        parse.create_volume,
        Service.create_volume,
        (CommandKind.CREATE_VOLUME,),
    ),
    VolumeCommand(
        "DeleteVolume",
        vol.DeleteVolumeRequest,
        vol.DeleteVolumeResponse,
        parse.delete_volume,
        Service.delete_volume,
        (CommandKind.DELETE_VOLUME,),
    ),
)
