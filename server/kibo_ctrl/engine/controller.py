"""The controller: folds node reports into instances, workspaces and commands.

A report is applied in one transaction together with everything it implies: the
instance's new phase, the workspace's derived state and its event, the command it
completes, and any stop the server now owes."""

from __future__ import annotations

from ..domain.model import (
    EXECUTION_PARTS,
    CommandError,
    CommandKind,
    Desired,
    ErrorCode,
    EventType,
    Failure,
    Instance,
    Phase,
    StopCause,
    StopDurability,
    VolumeState,
    Workspace,
)
from ..domain.reports import (
    Destroyed,
    DestroyFailed,
    ExitReason,
    GuestReset,
    GuestResponding,
    Launched,
    LaunchFailed,
    Progress,
    Report,
    Restarted,
    RestartFailed,
    StopFailed,
    Stopped,
    StorageReleased,
    VmmExited,
)
from ..store.base import Tx
from . import steps
from .steps import event, finish_command, save

# The guest-reset rule: more than MAX_RESETS within RESET_WINDOW seconds -> FAILED.
MAX_RESETS = 3
RESET_WINDOW = 600.0

_EXIT_FAILURES: dict[ExitReason, str] = {
    ExitReason.CRASH: "the VMM exited unexpectedly (killed, or the guest kernel panicked)",
    ExitReason.HOST_OOM: "host memory ran out: the host kernel killed the VMM; the server is force-stopping it",
    ExitReason.GUEST_RESET: "the guest reset itself; kibovm exits the VMM as for an internal fault",
}
_OWED_STOPS: dict[ExitReason, StopCause] = {
    ExitReason.HOST_OOM: StopCause.HOST_MEMORY_EXHAUSTED,
    ExitReason.GUEST_POWEROFF: StopCause.GUEST_SHUTDOWN,
}


def apply(tx: Tx, report: Report) -> None:
    instance = tx.get_instance(report.instance_id)
    if instance is None:
        return
    if report.step is not None and report.step != instance.step:
        return  # answers a step that was superseded; the node acts on the new one
    workspace = tx.get_workspace(instance.workspace_id)
    if workspace is None:
        return
    instance.observe_time = tx.now
    current = workspace.instance_id == instance.id
    # A transition this report causes by finishing a command is recorded with that command.
    finishing = workspace.active_command or ""
    if current and workspace.node_silent:
        # A report from the node proves it answers, even before liveness notices; without
        # this, an instance that stops or is released here is no longer among the node's
        # active instances, and the workspace would stay UNKNOWN after the node is back.
        workspace.node_silent = False
        event(tx, workspace, EventType.NODE_BACK, message=f"node {instance.node_id} reports again")
    if isinstance(report, Progress):
        # A late progress report (reports take different paths) does not undo a VMM's exit.
        if instance.phase is not Phase.EXITED:
            instance.phase = report.phase
        _volumes_created(tx, report.volumes_created)
        if current:
            steps.mark_running(tx, workspace)
    elif isinstance(report, Launched):
        _launched(tx, workspace, instance, report, current)
    elif isinstance(report, LaunchFailed):
        _launch_failed(tx, workspace, instance, report, current)
    elif isinstance(report, Stopped):
        _stopped(tx, workspace, instance, report, current)
    elif isinstance(report, StopFailed):
        instance.done_step = instance.step
        if instance.phase is not Phase.EXITED:  # a VMM that exited stays exited
            instance.phase = Phase.RUNNING
        if current and workspace.active_kind in (CommandKind.STOP, CommandKind.FORCE_STOP):
            workspace.failure = Failure(stage="STOP", message=report.message)
            finish_command(tx, workspace, error=CommandError(ErrorCode.ABORTED, report.message))
    elif isinstance(report, Destroyed):
        instance.done_step = instance.step
        instance.phase = Phase.RELEASED
        instance.holds = []
        if current and workspace.active_kind is CommandKind.DELETE:
            steps.finish_delete(tx, workspace)
    elif isinstance(report, DestroyFailed):
        instance.done_step = instance.step
        if current and workspace.active_kind is CommandKind.DELETE:
            workspace.failure = Failure(stage="DELETE", message=report.message)
            finish_command(tx, workspace, error=CommandError(ErrorCode.UNAVAILABLE, report.message))
    elif isinstance(report, GuestReset):
        _guest_reset(tx, workspace, instance, current)
    elif isinstance(report, Restarted):
        instance.done_step = instance.step
        instance.phase = Phase.RUNNING
        if current:
            workspace.guest.responding = True
    elif isinstance(report, RestartFailed):
        instance.done_step = instance.step
        instance.phase = Phase.EXITED
        instance.reason = report.message
        if current:
            workspace.failure = Failure(stage="", message=f"guest reset: {report.message}")
            workspace.release_pending_since = tx.now
    elif isinstance(report, VmmExited):
        _vmm_exited(tx, workspace, instance, report, current)
    elif isinstance(report, GuestResponding) and current and workspace.guest.responding != report.responding:
        workspace.guest.responding = report.responding
        if not report.responding:
            event(tx, workspace, EventType.GUEST_NOT_RESPONDING, message="the guest does not answer")
    if current:
        workspace.holds_execution = bool(instance.holds)
        steps.start_owed_stop(tx, workspace, instance)
        save(tx, workspace, instance, command_id=finishing)
    else:
        tx.put_instance(instance)


def _volumes_created(tx: Tx, volume_ids: tuple[str, ...]) -> None:
    for volume_id in volume_ids:
        volume = tx.get_volume(volume_id)
        if volume is not None and volume.state is VolumeState.PENDING:
            volume.state = VolumeState.READY
            tx.put_volume(volume)


def _launched(tx: Tx, workspace: Workspace, instance: Instance, report: Launched, current: bool) -> None:
    instance.done_step = instance.step
    if instance.phase is Phase.EXITED:
        # The VMM's exit was reported first (the two reports take different paths, each with
        # its own retries): the instance launched, then exited. It stays exited and held;
        # marking it RUNNING would show a dead guest AVAILABLE.
        _volumes_created(tx, report.volumes_created)
        if current and workspace.active_kind in (CommandKind.CREATE, CommandKind.START):
            message = f"the VMM exited right after launch ({instance.reason})"
            finish_command(tx, workspace, error=CommandError(ErrorCode.UNAVAILABLE, message))
        return
    instance.phase = Phase.RUNNING
    instance.holds = list(EXECUTION_PARTS)
    instance.reason = ""
    _volumes_created(tx, report.volumes_created)
    if current and workspace.active_kind in (CommandKind.CREATE, CommandKind.START):
        workspace.failure = None
        workspace.guest.responding = True
        finish_command(tx, workspace)


def _launch_failed(tx: Tx, workspace: Workspace, instance: Instance, report: LaunchFailed, current: bool) -> None:
    instance.done_step = instance.step
    instance.phase = Phase.FAILED
    instance.holds = list(report.holds)
    instance.reason = report.message
    _volumes_created(tx, report.volumes_created)
    if current and workspace.active_kind in (CommandKind.CREATE, CommandKind.START):
        stage = workspace.active_kind.name
        workspace.failure = Failure(stage=stage, message=report.message)
        workspace.release_pending_since = tx.now if report.holds else None
        finish_command(tx, workspace, error=CommandError(ErrorCode.UNAVAILABLE, report.message))


def _stopped(tx: Tx, workspace: Workspace, instance: Instance, report: Stopped, current: bool) -> None:
    instance.done_step = instance.step
    instance.phase = Phase.STOPPED
    instance.holds = []
    if not current or workspace.active_kind not in (CommandKind.STOP, CommandKind.FORCE_STOP):
        return
    durability = report.durability
    if workspace.active_kind is CommandKind.FORCE_STOP:
        durability = StopDurability.UNCONFIRMED
    workspace.failure = None
    workspace.release_pending_since = None
    workspace.guest.responding = True
    if workspace.last_stop is not None:
        workspace.last_stop.durability = durability
    finish_command(tx, workspace, durability=durability)


def _guest_reset(tx: Tx, workspace: Workspace, instance: Instance, current: bool) -> None:
    if not current:
        return
    if instance.desired is not Desired.RUNNING:
        # A stop or delete is under way: its step goes on. Restarting would supersede it, and
        # the workspace would wait in STOPPING or DELETING for that command forever.
        event(tx, workspace, EventType.GUEST_RESET, message="reset during a stop or delete: not restarted")
        return
    if instance.done_step != instance.step and workspace.active_kind in (CommandKind.CREATE, CommandKind.START):
        # The guest reset before the node's Launched report was stored: it ran, so the launch
        # succeeded. Record that first: the restart below supersedes the launch's step, whose
        # report is then dropped, and the command would stay RUNNING forever.
        _launched(tx, workspace, instance, Launched(instance.id, instance.step, ()), current)
    now = tx.now
    guest = workspace.guest
    guest.reset_times = [t for t in guest.reset_times if now - t < RESET_WINDOW] + [now]
    guest.reset_count += 1
    guest.last_reset_time = now
    instance.restart_count += 1
    resets = len(guest.reset_times)
    if resets > MAX_RESETS:
        instance.phase = Phase.EXITED
        instance.reason = f"{resets} resets within 10 minutes"
        workspace.failure = Failure(
            stage="", message=f"{resets} resets within 10 minutes: the guest is not restarted again"
        )
        workspace.release_pending_since = now
        event(tx, workspace, EventType.GUEST_RESET, message=f"reset {resets} within 10 minutes: not restarted")
        return
    guest.responding = False
    instance.phase = Phase.RESTARTING
    instance.reason = "guest reset: starting a new VMM for the same instance"
    steps.set_desired(instance, Desired.RUNNING)
    event(tx, workspace, EventType.GUEST_RESET, message=f"reset {resets}: a new VMM for the same instance")


def _vmm_exited(tx: Tx, workspace: Workspace, instance: Instance, report: VmmExited, current: bool) -> None:
    if instance.phase in (Phase.STOPPED, Phase.RELEASED):
        # A late report (queued while the node was silent): the instance was stopped or
        # destroyed since, and holds nothing; marking it held again would leak it.
        return
    instance.phase = Phase.EXITED
    instance.reason = report.reason.value
    # The node keeps the instance: volume, network and writable layer stay held.
    instance.holds = list(EXECUTION_PARTS)
    if not current or workspace.deleted:
        return
    message = _EXIT_FAILURES.get(report.reason)
    if message is not None:
        workspace.failure = Failure(stage="", message=message)
        workspace.release_pending_since = tx.now
    owed = _OWED_STOPS.get(report.reason)
    if owed is not None:
        workspace.owed_stop = owed
        workspace.data_plane_revision += 1
        workspace.guest.responding = False


def apply_storage(tx: Tx, report: StorageReleased) -> None:
    workspace = tx.get_workspace(report.workspace_id)
    if workspace is None or not (workspace.storage.layer or workspace.storage.volume_ids):
        return
    for volume_id in workspace.storage.volume_ids:
        volume = tx.get_volume(volume_id)
        if volume is not None:
            volume.state = VolumeState.DELETED
            volume.workspace_id = None
            volume.storage_pending = False
            volume.storage_release_time = tx.now
            tx.put_volume(volume)
    workspace.storage.layer = False
    workspace.storage.volume_ids = []
    why = "the storage pool was declared lost: no readable data is left" if report.pool_lost else "files deleted"
    event(tx, workspace, EventType.STORAGE_RELEASED, message=f"retained layer and volumes released: {why}")
    save(tx, workspace, None)


def apply_volume_released(tx: Tx, volume_id: str) -> None:
    """A deleted volume's files are destroyed on the node of its storage pool."""
    volume = tx.get_volume(volume_id)
    if volume is None or not volume.storage_pending:
        return
    volume.storage_pending = False
    volume.storage_release_time = tx.now
    tx.put_volume(volume)


def set_node_silent(tx: Tx, node_id: str, silent: bool) -> None:
    for instance in tx.node_instances(node_id):
        workspace = tx.get_workspace(instance.workspace_id)
        if workspace is None or workspace.instance_id != instance.id or workspace.node_silent == silent:
            continue
        workspace.node_silent = silent
        event(
            tx,
            workspace,
            EventType.NODE_SILENT if silent else EventType.NODE_BACK,
            message=f"node {node_id} {'stopped reporting' if silent else 'reports again'}",
        )
        save(tx, workspace, instance)
