"""Small steps every writer of workspace records takes the same way: derive the visible
state and record the transition, finish or cancel the active command, start the stops
the server owes. Runs inside a store transaction."""

from __future__ import annotations

import uuid

from ..domain import conditions, status
from ..domain.model import (
    Command,
    CommandError,
    CommandKind,
    CommandState,
    Desired,
    ErrorCode,
    Event,
    EventType,
    Instance,
    LastStop,
    StopCause,
    StopDurability,
    Workspace,
    WorkspaceState,
)
from ..domain.rules import SERVER_STOP_PREFIXES, Facts
from ..store.base import Tx
from . import trace

LIFECYCLE_KINDS = frozenset(
    {CommandKind.CREATE, CommandKind.START, CommandKind.STOP, CommandKind.FORCE_STOP, CommandKind.DELETE}
)


def rule_facts(workspace: Workspace) -> Facts:
    return Facts(
        state=workspace.state,
        holds_execution=workspace.holds_execution,
        deletion_started=workspace.deletion_started,
        active=workspace.active_kind,
    )


def status_facts(workspace: Workspace, instance: Instance | None) -> status.StatusFacts:
    return status.StatusFacts(
        deleted=workspace.deleted,
        active=workspace.active_kind,
        active_cause=workspace.active_cause,
        node_silent=workspace.node_silent,
        failed=workspace.failure is not None,
        phase=instance.phase if instance is not None else None,
    )


def event(tx: Tx, workspace: Workspace, type_: EventType, *, command_id: str = "", message: str = "") -> None:
    tx.add_event(
        Event(
            workspace_id=workspace.id,
            time=tx.now,
            type=type_,
            from_state=workspace.state,
            to_state=workspace.state,
            command_id=command_id,
            message=message,
            generation=workspace.generation,
        )
    )


def save(tx: Tx, workspace: Workspace, instance: Instance | None, *, command_id: str = "", message: str = "") -> None:
    """Derive the visible state, record a transition event if it changed, and store.

    `instance` None means the caller changed no instance: the state is derived from the
    current instance as stored (not from "no instance", which would read as STOPPED)."""
    observed = instance if instance is not None else current_instance(tx, workspace)
    new = status.derive_state(status_facts(workspace, observed))
    if new is not workspace.state:
        tx.add_event(
            Event(
                workspace_id=workspace.id,
                time=tx.now,
                type=EventType.STATE_CHANGED,
                from_state=workspace.state,
                to_state=new,
                command_id=command_id or (workspace.active_command or ""),
                message=message,
                generation=workspace.generation,
            )
        )
        workspace.state = new
    if new is WorkspaceState.DELETED and workspace.delete_time is None:
        workspace.delete_time = tx.now
    workspace.conditions = conditions.update(workspace, observed, tx.now)
    tx.put_workspace(workspace)
    if instance is not None:
        tx.put_instance(instance)


def record_command(
    tx: Tx,
    tenant: str,
    command_id: str,
    kind: CommandKind,
    fingerprint: str,
    state: CommandState,
    *,
    workspace_id: str = "",
    volume_id: str = "",
    cause: StopCause = StopCause.UNSPECIFIED,
) -> Command:
    command = Command(
        id=command_id,
        workspace_id=workspace_id,
        volume_id=volume_id,
        tenant=tenant,
        kind=kind,
        fingerprint=fingerprint,
        state=state,
        create_time=tx.now,
        update_time=tx.now,
        stop_cause=cause,
        trace_parent=trace.current.get(),
    )
    tx.put_command(command)
    return command


def new_command(
    tx: Tx,
    workspace: Workspace,
    command_id: str,
    kind: CommandKind,
    fingerprint: str,
    *,
    cause: StopCause = StopCause.UNSPECIFIED,
) -> Command:
    """Record a lifecycle command as the workspace's active one."""
    command = record_command(
        tx,
        workspace.tenant,
        command_id,
        kind,
        fingerprint,
        CommandState.PENDING,
        workspace_id=workspace.id,
        cause=cause,
    )
    workspace.active_command = command_id
    workspace.active_kind = kind
    workspace.active_cause = cause if cause is not StopCause.UNSPECIFIED else None
    event(tx, workspace, EventType.COMMAND_ACCEPTED, command_id=command_id, message=kind.name)
    return command


def immediate_command(
    tx: Tx, workspace: Workspace, command_id: str, kind: CommandKind, fingerprint: str, message: str
) -> Command:
    """A command whose whole effect is this transaction: it is SUCCEEDED when recorded."""
    command = record_command(
        tx, workspace.tenant, command_id, kind, fingerprint, CommandState.SUCCEEDED, workspace_id=workspace.id
    )
    event(tx, workspace, EventType.COMMAND_SUCCEEDED, command_id=command_id, message=message)
    return command


def mark_running(tx: Tx, workspace: Workspace) -> None:
    if workspace.active_command is None:
        return
    command = tx.get_command(workspace.tenant, workspace.active_command)
    if command is not None and command.state is CommandState.PENDING:
        command.state = CommandState.RUNNING
        tx.put_command(command)


def finish_command(
    tx: Tx,
    workspace: Workspace,
    *,
    error: CommandError | None = None,
    durability: StopDurability = StopDurability.UNSPECIFIED,
) -> Command | None:
    """End the workspace's active command, successfully unless `error` is given."""
    if workspace.active_command is None:
        return None
    command = tx.get_command(workspace.tenant, workspace.active_command)
    workspace.active_command = None
    workspace.active_kind = None
    workspace.active_cause = None
    if command is None or command.terminal:
        return command
    command.state = CommandState.FAILED if error else CommandState.SUCCEEDED
    command.error = error
    command.durability = durability
    tx.put_command(command)
    event(
        tx,
        workspace,
        EventType.COMMAND_FAILED if error else EventType.COMMAND_SUCCEEDED,
        command_id=command.id,
        message=error.message if error else command.kind.name,
    )
    return command


def cancel_active(tx: Tx, workspace: Workspace, by_command_id: str, why: str) -> None:
    finish_command(tx, workspace, error=CommandError(ErrorCode.CANCELLED, f"{why} by command {by_command_id}"))


def set_desired(instance: Instance, desired: Desired) -> None:
    instance.desired = desired
    instance.step += 1


def begin_stop(
    tx: Tx, workspace: Workspace, instance: Instance | None, command_id: str, force: bool, cause: StopCause
) -> None:
    """Everything a stop does when accepted, whoever asked for it."""
    workspace.last_stop = LastStop(cause=cause, command_id=command_id)
    workspace.data_plane_revision += 1
    if workspace.release_pending_since is None:
        workspace.release_pending_since = tx.now
    if instance is not None:
        set_desired(instance, Desired.FORCE_STOPPED if force else Desired.STOPPED)


def start_owed_stop(tx: Tx, workspace: Workspace, instance: Instance | None) -> None:
    """Start a stop the server owes (guest power-off on kibovm, host OOM) once allowed.

    The server starts no stop while a delete has begun or another command is in progress;
    it re-evaluates at the next report or command completion."""
    cause = workspace.owed_stop
    if cause is None:
        return
    if instance is None or not instance.holds or workspace.deleted:
        workspace.owed_stop = None
        return
    if workspace.deletion_started or workspace.active_command is not None:
        return
    workspace.owed_stop = None
    command_id = f"{SERVER_STOP_PREFIXES[cause]}{uuid.uuid4()}"
    new_command(tx, workspace, command_id, CommandKind.FORCE_STOP, "server", cause=cause)
    begin_stop(tx, workspace, instance, command_id, force=True, cause=cause)
    event(tx, workspace, EventType.SERVER_STOP, command_id=command_id, message=f"force stop: {cause.name}")


def current_instance(tx: Tx, workspace: Workspace) -> Instance | None:
    return tx.get_instance(workspace.instance_id) if workspace.instance_id else None


def finish_delete(tx: Tx, workspace: Workspace) -> None:
    """The workspace's execution is released: it is DELETED; its files go asynchronously."""
    finish_command(tx, workspace)
    workspace.deleted = True
    # Whatever failed before (e.g. a host OOM during the delete) is gone with the execution.
    workspace.failure = None
    workspace.owed_stop = None
    workspace.holds_execution = False
    workspace.node_silent = False
    workspace.release_pending_since = None
    workspace.storage.layer = True
    workspace.storage.volume_ids = [b.volume_id for b in workspace.bindings if b.delete_with_workspace]
    workspace.storage.since = tx.now
    for binding in workspace.bindings:
        if not binding.delete_with_workspace:
            volume = tx.get_volume(binding.volume_id)
            if volume is not None:
                volume.workspace_id = None
                tx.put_volume(volume)
