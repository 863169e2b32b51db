"""The command registry (api/commands.py): one entry per command RPC of the protos, each
naming its proto types, its parser and its handler; and commands run through their entry
in process, on a real SQLite store."""

from __future__ import annotations

import dataclasses
import re

import pytest
from google.protobuf.descriptor import MethodDescriptor
from kibo.ctrl.v1 import data_plane_service_pb2, observation_service_pb2, volume_service_pb2, workspace_pb2
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2
from kibo_ctrl.api import commands
from kibo_ctrl.api.control_plane import Api
from kibo_ctrl.domain.access import Caller, Role
from kibo_ctrl.domain.errors import CommandIdReused, Conflict, NotFound, PermissionDenied
from kibo_ctrl.domain.model import CommandKind, CommandState, VolumeState
from kibo_ctrl.engine.service import CommandRequest, Service

from tests.unit.engine_harness import COMMANDS, VOLUME_COMMANDS, Engine, engine

__all__ = ["engine"]

PROTO_MODULES = (ws, volume_service_pb2, observation_service_pb2, data_plane_service_pb2, simulator_pb2)
ENTRIES = (*commands.WORKSPACE_COMMANDS, *commands.VOLUME_COMMANDS)


def _command_methods() -> dict[str, MethodDescriptor]:
    """Every RPC of every proto service whose request carries CommandMetadata: the commands."""
    metadata = workspace_pb2.CommandMetadata.DESCRIPTOR
    found: dict[str, MethodDescriptor] = {}
    for module in PROTO_MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if any(field.message_type is metadata for field in method.input_type.fields):
                    found[method.name] = method
    return found


def test_every_command_rpc_in_the_protos_has_exactly_one_entry() -> None:
    methods = _command_methods()
    names = [entry.rpc for entry in ENTRIES]
    assert len(methods) >= 14  # the 12 workspace commands and the 2 volume commands at least
    assert sorted(names) == sorted(methods), "an entry per command RPC, and no other"
    assert len(set(names)) == len(names), "a command RPC with two entries"


def test_every_command_kind_has_exactly_one_entry() -> None:
    kinds = [kind for entry in ENTRIES for kind in entry.kinds]
    assert sorted(kinds) == sorted(k for k in CommandKind if k is not CommandKind.UNSPECIFIED)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.rpc)
def test_an_entry_names_its_proto_types(entry: commands.WorkspaceCommand[object, object]) -> None:
    method = _command_methods()[entry.rpc]
    assert entry.request.DESCRIPTOR is method.input_type
    assert entry.response.DESCRIPTOR is method.output_type


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.rpc)
def test_a_handler_is_named_after_its_rpc(entry: commands.WorkspaceCommand[object, object]) -> None:
    # So "go to definition" on an RPC name and a search for its handler find the same code.
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", entry.rpc).lower()
    assert entry.handle.__name__ == snake
    assert getattr(Service, snake) is entry.handle


def test_commands_on_a_workspace_take_the_common_checks_first() -> None:
    # Every handler of a command on an existing workspace is wrapped by on_workspace
    # (lookup, idempotency, revision); create is the one that makes its workspace.
    unchecked = [e.rpc for e in commands.WORKSPACE_COMMANDS if not hasattr(e.handle, "__wrapped__")]
    assert unchecked == ["CreateWorkspace"]


def _labels(workspace_id: str, command_id: str, **labels: str) -> ws.SetWorkspaceLabelsRequest:
    message = ws.SetWorkspaceLabelsRequest(workspace_id=workspace_id, labels=labels)
    message.metadata.command_id = command_id
    return message


async def test_a_command_runs_through_its_entry(engine: Engine) -> None:
    workspace, created = await engine.create()
    assert created.kind is CommandKind.CREATE and created.state is CommandState.PENDING
    assert workspace.instance_id == f"{workspace.id}-g1"
    _, command = await engine.command("SetWorkspaceLabels", _labels(workspace.id, "labels-1", team="a"))
    assert command.kind is CommandKind.SET_LABELS and command.state is CommandState.SUCCEEDED
    assert (await engine.workspace(workspace.id)).labels == {"team": "a"}


async def test_a_resend_answers_with_its_command_and_a_reuse_is_refused(engine: Engine) -> None:
    workspace, _ = await engine.create()
    _, first = await engine.command("SetWorkspaceLabels", _labels(workspace.id, "labels-1", team="a"))
    _, again = await engine.command("SetWorkspaceLabels", _labels(workspace.id, "labels-1", team="a"))
    assert (again.id, again.create_time) == (first.id, first.create_time)
    with pytest.raises(CommandIdReused):
        await engine.command("SetWorkspaceLabels", _labels(workspace.id, "labels-1", team="b"))
    _, resent = await engine.create()  # the create's own ID, same request: the same workspace
    assert resent.workspace_id == workspace.id


async def test_another_tenants_workspace_is_not_found(engine: Engine) -> None:
    workspace, _ = await engine.create()
    with pytest.raises(NotFound):
        await engine.command("SetWorkspaceLabels", _labels(workspace.id, "labels-1", team="a"), tenant="other")


async def test_the_state_table_decides(engine: Engine) -> None:
    workspace, _ = await engine.create()
    start = ws.StartWorkspaceRequest(workspace_id=workspace.id)
    start.metadata.command_id = "start-1"
    with pytest.raises(Conflict):  # CREATING allows no start (domain/rules.py)
        await engine.command("StartWorkspace", start)


def test_stop_modes_are_two_commands_of_one_rpc() -> None:
    entry = COMMANDS["StopWorkspace"]
    graceful = ws.StopWorkspaceRequest(workspace_id="ws-1", mode=ws.STOP_MODE_GRACEFUL)
    graceful.metadata.command_id = "stop-1"
    force = ws.StopWorkspaceRequest(workspace_id="ws-1", mode=ws.STOP_MODE_FORCE)
    force.metadata.command_id = "stop-1"
    assert entry.parse(graceful).kind is CommandKind.STOP
    assert entry.parse(force).kind is CommandKind.FORCE_STOP


async def test_volume_commands_run_through_their_entries(engine: Engine) -> None:
    create = volume_service_pb2.CreateVolumeRequest(capacity_gib=2)
    create.metadata.command_id = "vol-create-1"
    entry = VOLUME_COMMANDS["CreateVolume"]
    request: CommandRequest = entry.parse(create)
    volume = await engine.store.transact(engine.service.execute, entry.handle, request)
    assert (volume.capacity_gib, volume.state) == (2, VolumeState.READY)
    delete = volume_service_pb2.DeleteVolumeRequest(volume_id=volume.id)
    delete.metadata.command_id = "vol-delete-1"
    entry = VOLUME_COMMANDS["DeleteVolume"]
    deleted = await engine.store.transact(engine.service.execute, entry.handle, entry.parse(delete))
    assert deleted.state is VolumeState.DELETED and deleted.storage_pending


def _labels_request() -> ws.SetWorkspaceLabelsRequest:
    return _labels("ws-0123456789abcdef0123", "labels-1", team="a")


def test_the_api_parses_with_the_entrys_parser_for_the_callers_tenant() -> None:
    entry = COMMANDS["SetWorkspaceLabels"]
    request = Api._parse(Caller(tenant="t1", role=Role.ADMIN), entry, _labels_request())
    assert (request.kind, request.tenant, request.labels) == (CommandKind.SET_LABELS, "t1", {"team": "a"})


def test_a_parser_that_drifted_from_its_entry_is_caught() -> None:
    drifted = dataclasses.replace(COMMANDS["SetWorkspaceLabels"], kinds=(CommandKind.RESIZE,))
    with pytest.raises(AssertionError, match="SetWorkspaceLabels"):
        Api._parse(Caller(tenant="t1", role=Role.ADMIN), drifted, _labels_request())


def test_a_read_only_caller_is_refused_before_parsing() -> None:
    broken = ws.SetWorkspaceLabelsRequest(workspace_id="not an id")
    with pytest.raises(PermissionDenied, match="SetWorkspaceLabels"):
        Api._parse(Caller(tenant="t1", role=Role.READER), COMMANDS["SetWorkspaceLabels"], broken)
