"""One log line per workspace event the store records (state changes, commands accepted,
succeeded or failed, scheduling, guest resets, silent nodes, ...), with the workspace,
command and node IDs as fields: a hub listener, so every writer's events are logged the
same way, once, after they are on disk."""

from __future__ import annotations

import logging

from ..domain.model import CommandState, EventType, WorkspaceState, command_key
from ..store.base import Changes

log = logging.getLogger("kibo.events")

# Events that say something went wrong are warnings; the rest is the lifecycle, info.
WARNINGS = frozenset(
    {EventType.COMMAND_FAILED, EventType.UNSCHEDULABLE, EventType.GUEST_NOT_RESPONDING, EventType.NODE_SILENT}
)


def on_changes(changes: Changes) -> None:
    """A hub listener (engine/hub.py)."""
    for event in changes.events:
        workspace = changes.workspaces.get(event.workspace_id)
        extra: dict[str, object] = {"workspace_id": event.workspace_id, "command_id": event.command_id}
        if workspace is not None:
            extra["node_id"] = workspace.node_id or ""
            extra["tenant"] = workspace.tenant
            if event.command_id:
                command = changes.commands.get(command_key(workspace.tenant, event.command_id))
                if command is not None:
                    extra["kind"] = command.kind.name.lower()
                    if command.state in (CommandState.SUCCEEDED, CommandState.FAILED):
                        extra["outcome"] = command.state.name.lower()
                        extra["seconds"] = round(max(0.0, command.update_time - command.create_time), 6)
        if event.type is EventType.STATE_CHANGED:
            extra["from_state"] = _state(event.from_state)
            extra["state"] = _state(event.to_state)
        level = logging.WARNING if event.type in WARNINGS else logging.INFO
        name = event.type.name.lower()
        log.log(level, "%s: %s", name, event.message or name.replace("_", " "), extra=extra)


def _state(state: WorkspaceState) -> str:
    return state.name.lower()
