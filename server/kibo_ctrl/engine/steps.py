"""Small steps every writer of workspace records takes the same way: derive the visible
state and record the transition, finish or cancel the active command, start the stops
the server owes, and the named state changes of a workspace (`fail`, `begin_release`, ...:
the service and the controller change a workspace's state through these, not by writing
its fields). Runs inside a store transaction."""

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
    Failure,
    Instance,
    LastStop,
    StaleCopy,
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
            tenant=workspace.tenant,
            node_id=event_node(workspace),
        )
    )


def event_node(workspace: Workspace) -> str:
    """The node an event of the workspace concerns: where it runs, else where its disks are."""
    return workspace.node_id or workspace.storage_node or ""


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
                tenant=workspace.tenant,
                node_id=event_node(workspace),
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
    command = tx.get_command(workspace.tenant, workspace.active_command) if workspace.active_command else None
    if command is not None and command.kind is CommandKind.MOVE and command.target_node:
        # What the move's target received so far goes (engine/moves.py deletes it).
        leave_stale_copy(workspace, command.target_node)
    finish_command(tx, workspace, error=CommandError(ErrorCode.CANCELLED, f"{why} by command {by_command_id}"))


def set_desired(instance: Instance, desired: Desired) -> None:
    instance.desired = desired
    instance.step += 1


# -- state changes of a workspace ------------------------------------------------------


def new_instance(tx: Tx, workspace: Workspace) -> Instance:
    """The workspace's next generation (create, start): a new instance, not yet on a node; the
    workspace starts over with no failure, no last stop, nothing pending release, a guest
    that answers and no resets counted."""
    workspace.generation += 1
    instance = Instance(
        id=f"{workspace.id}-g{workspace.generation}",
        workspace_id=workspace.id,
        generation=workspace.generation,
        vcpus=workspace.resources.vcpus,
        memory_mib=workspace.resources.memory_mib,
        create_time=tx.now,
    )
    workspace.instance_id = instance.id
    workspace.node_id = None
    workspace.last_stop = None
    clear_failure(workspace)
    end_release(workspace)
    workspace.guest.reset_times.clear()
    workspace.guest.reset_count = 0
    workspace.guest.last_reset_time = None
    workspace.guest.responding = True
    return instance


def fail(workspace: Workspace, stage: str, message: str) -> None:
    """A command failed at `stage`; what the execution holds is unchanged."""
    workspace.failure = Failure(stage=stage, message=message)


def fail_execution(workspace: Workspace, stage: str, message: str, now: float, *, holding: bool = True) -> None:
    """The execution failed; while it still holds parts of the node, their release is pending from now."""
    fail(workspace, stage, message)
    workspace.release_pending_since = now if holding else None


def clear_failure(workspace: Workspace) -> None:
    workspace.failure = None


def end_release(workspace: Workspace) -> None:
    """Nothing of the execution is left to release (stopped, started anew, deleted)."""
    workspace.release_pending_since = None


def revoke_credentials(workspace: Workspace) -> None:
    """Every data-plane credential issued so far stops working (they carry the revision), and
    every exposure ends (the proxies cut their connections when they see this commit)."""
    workspace.data_plane_revision += 1
    workspace.exposures = []


def begin_release(tx: Tx, workspace: Workspace) -> None:
    """The execution is being let go (stop, delete): credentials end now, and its release is
    pending since the first time this was asked (a second ask keeps the first time)."""
    revoke_credentials(workspace)
    if workspace.release_pending_since is None:
        workspace.release_pending_since = tx.now


def running(workspace: Workspace) -> None:
    """The instance launched: no failure, and the guest answers."""
    clear_failure(workspace)
    workspace.guest.responding = True


def stopped(workspace: Workspace, durability: StopDurability) -> None:
    """A stop finished: nothing is held or pending release, and the last stop has its durability."""
    clear_failure(workspace)
    end_release(workspace)
    workspace.guest.responding = True
    if workspace.last_stop is not None:
        workspace.last_stop.durability = durability


def set_guest_responding(tx: Tx, workspace: Workspace, responding: bool) -> None:
    """The guest answers (again), or stopped answering: recorded as an event."""
    if workspace.guest.responding == responding:
        return
    workspace.guest.responding = responding
    if not responding:
        event(tx, workspace, EventType.GUEST_NOT_RESPONDING, message="the guest does not answer")


def record_guest_reset(workspace: Workspace, now: float, window: float) -> int:
    """The guest reset itself: counted, and remembered within `window`; returns how many
    resets the window now holds."""
    guest = workspace.guest
    guest.reset_times = [t for t in guest.reset_times if now - t < window] + [now]
    guest.reset_count += 1
    guest.last_reset_time = now
    return len(guest.reset_times)


def restarting_guest(workspace: Workspace) -> None:
    """A new VMM starts for the reset guest: it does not answer until it runs (no event of
    its own: the reset's event says why)."""
    workspace.guest.responding = False


def set_node_silent(tx: Tx, workspace: Workspace, node_id: str | None, silent: bool) -> None:
    """The workspace's node stopped reporting (liveness), or reports again: recorded as an event."""
    workspace.node_silent = silent
    event(
        tx,
        workspace,
        EventType.NODE_SILENT if silent else EventType.NODE_BACK,
        message=f"node {node_id} {'stopped reporting' if silent else 'reports again'}",
    )


def observe_holds(workspace: Workspace, instance: Instance) -> None:
    """The workspace holds execution while its current instance holds any part of the node."""
    workspace.holds_execution = bool(instance.holds)


def storage_released(workspace: Workspace) -> None:
    """The retained layer and volumes of a deleted workspace are gone."""
    workspace.storage.layer = False
    workspace.storage.volume_ids = []


def owe_stop(workspace: Workspace, cause: StopCause) -> None:
    """The server owes a force stop (start_owed_stop starts it once allowed): credentials end
    now and the guest is taken as not answering."""
    workspace.owed_stop = cause
    revoke_credentials(workspace)
    workspace.guest.responding = False


def begin_delete(tx: Tx, workspace: Workspace) -> None:
    """A delete was accepted: for good (only a delete or labels follow), with no failure, no
    stop owed and no expiration left; the execution is being released."""
    workspace.deletion_started = True
    workspace.last_stop = None
    clear_failure(workspace)
    workspace.owed_stop = None
    begin_release(tx, workspace)
    workspace.expiration.expire_time = None


def begin_stop(
    tx: Tx, workspace: Workspace, instance: Instance | None, command_id: str, force: bool, cause: StopCause
) -> None:
    """Everything a stop does when accepted, whoever asked for it."""
    workspace.last_stop = LastStop(cause=cause, command_id=command_id)
    begin_release(tx, workspace)
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
    clear_failure(workspace)
    workspace.owed_stop = None
    workspace.holds_execution = False
    workspace.node_silent = False
    end_release(workspace)
    workspace.storage.layer = True
    workspace.storage.volume_ids = [b.volume_id for b in workspace.bindings if b.delete_with_workspace]
    workspace.storage.since = tx.now
    for binding in workspace.bindings:
        if not binding.delete_with_workspace:
            volume = tx.get_volume(binding.volume_id)
            if volume is not None:
                volume.workspace_id = None
                tx.put_volume(volume)


def leave_stale_copy(workspace: Workspace, node: str) -> None:
    """A copy of the workspace's disks (its layer, its bound volumes) on `node` is to go."""
    if node == workspace.storage_node:
        return  # never the copy it runs from
    volume_ids = [b.volume_id for b in workspace.bindings]
    for copy in workspace.stale_copies:
        if copy.node == node:
            copy.volume_ids = sorted({*copy.volume_ids, *volume_ids})
            return
    workspace.stale_copies.append(StaleCopy(node, volume_ids))
