"""How domain records are stored, shared by every store adapter: each record is one msgspec
JSON document, plus the columns derived from it that queries filter on. Both stores write the
same bytes, so a record means the same thing whichever database holds it."""

from __future__ import annotations

import msgspec

from ..domain.model import Command, Event, Instance, Phase, Volume, Workspace
from ..domain.nodes import NodeRecord
from .base import ListedWorkspace

ENCODER = msgspec.json.Encoder()
WORKSPACE = msgspec.json.Decoder(Workspace)
COMMAND = msgspec.json.Decoder(Command)
INSTANCE = msgspec.json.Decoder(Instance)
EVENT = msgspec.json.Decoder(Event)
VOLUME = msgspec.json.Decoder(Volume)
NODE = msgspec.json.Decoder(NodeRecord)


class WorkspaceKey(msgspec.Struct):
    """The part of a stored workspace a list reads first (msgspec skips the rest unparsed)."""

    id: str
    version: int = 0


WORKSPACE_KEY = msgspec.json.Decoder(WorkspaceKey)


def listed_workspace(seq: int, data: bytes) -> ListedWorkspace:
    key = WORKSPACE_KEY.decode(data)
    return ListedWorkspace(seq, key.id, key.version, data, WORKSPACE.decode)


def instance_active(instance: Instance) -> bool:
    """A node still has to act on the instance, or still holds parts of it (node_instances)."""
    return instance.active


def instance_unscheduled(instance: Instance) -> bool:
    """Waiting for the scheduler to place it."""
    return instance.node_id is None and instance.phase is Phase.PENDING


def workspace_storage_pending(workspace: Workspace) -> bool:
    """The workspace's files (a layer or volumes) may still be on a node."""
    return bool(workspace.storage.layer or workspace.storage.volume_ids)
