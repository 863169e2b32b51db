"""The controller: folds node reports into instances, workspaces and commands.

A report is applied in one transaction together with everything it implies: the
instance's new phase, the workspace's derived state and its event, the command it
completes, and any stop the server now owes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..domain.model import (
    EXECUTION_PARTS,
    CommandError,
    CommandKind,
    Desired,
    ErrorCode,
    EventType,
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
    GuestOomKill,
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

# Phases in which no VMM runs: a STOPPING progress does not apply to them.
_NOT_RUNNING = frozenset({Phase.EXITED, Phase.STOPPED, Phase.FAILED, Phase.RELEASED})
# Progress in these phases announces a step the node begins; it says nothing of the parts
# the instance holds, so it is no observation of them (cleanup status stays UNKNOWN for an
# instance on a silent node that never reported more).
_ANNOUNCED = frozenset({Phase.PROVISIONING, Phase.STOPPING})

# The guest-reset rule: more than MAX_RESETS within RESET_WINDOW seconds -> FAILED.
MAX_RESETS = 3
RESET_WINDOW = 600.0

# A runtime's own words for what ended (VmmExited.detail) replace CRASH's, up to this long.
MAX_DETAIL = 300
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
    if not (isinstance(report, Progress) and report.phase in _ANNOUNCED):
        instance.observe_time = tx.now
    current = workspace.instance_id == instance.id
    # A transition this report causes by finishing a command is recorded with that command.
    finishing = workspace.active_command or ""
    recorded_silent = current and workspace.node_silent and _recorded_silent(tx, instance.node_id)
    if current and workspace.node_silent and not recorded_silent:
        # A report from the node proves it answers, even before liveness notices; without
        # this, an instance that stops or is released here is no longer among the node's
        # active instances, and the workspace would stay UNKNOWN after the node is back.
        steps.set_node_silent(tx, workspace, instance.node_id, False)
    FOLDS[type(report)](tx, workspace, instance, report, current)
    if recorded_silent and not instance.active:
        # Recorded silent, the node is back only once its lease is renewed (and then every
        # workspace still on it leaves UNKNOWN together); but this instance now has nothing
        # on the node, so that return would not find it, and its state is confirmed.
        steps.set_node_silent(tx, workspace, instance.node_id, False)
    if current:
        steps.observe_holds(workspace, instance)
        steps.start_owed_stop(tx, workspace, instance)
        save(tx, workspace, instance, command_id=finishing)
    else:
        tx.put_instance(instance)


def _recorded_silent(tx: Tx, node_id: str | None) -> bool:
    """Whether the node's record says it is silent. The record decides, not a report: a
    report that slipped through (sent in a moment of reachability, or queued while the node
    was silent) must not end a workspace's UNKNOWN while its node's lease is still lapsed,
    or the workspace would run on a node recorded silent and show AVAILABLE (simulation
    seed 10074)."""
    record = tx.get_node(node_id) if node_id else None
    return record is not None and record.silent


# Each fold: what one report type means for its instance and (when `current`, the report is
# about the workspace's current instance) its workspace and active command. `apply` looks the
# report's type up in FOLDS below.


def _progress(tx: Tx, workspace: Workspace, instance: Instance, report: Progress, current: bool) -> None:
    # A late progress report (reports take different paths) does not undo a VMM's exit, and
    # nothing runs to stop in the other not-running phases.
    applies = instance.phase is not Phase.EXITED and not (
        report.phase is Phase.STOPPING and instance.phase in _NOT_RUNNING
    )
    if applies and instance.phase is not report.phase:
        message = f"instance {instance.id}: {report.phase.name.lower()} on {instance.node_id}"
        if report.phase is Phase.PROVISIONING and instance.phase is Phase.LAUNCHING:
            # The node agent restarted in the middle of this launch and drives it again (in-flight
            # work resumes): the same instance and step, not a second launch.
            message += " again (its node agent restarted during the launch)"
        event(tx, workspace, EventType.INSTANCE_PHASE, message=message)
        instance.phase = report.phase
    _volumes_created(tx, report.volumes_created)
    if current:
        steps.mark_running(tx, workspace)


def _stop_failed(tx: Tx, workspace: Workspace, instance: Instance, report: StopFailed, current: bool) -> None:
    instance.done_step = instance.step
    if instance.phase is not Phase.EXITED:  # a VMM that exited stays exited
        instance.phase = Phase.RUNNING
    if current and workspace.active_kind in (CommandKind.STOP, CommandKind.FORCE_STOP):
        steps.fail(workspace, "STOP", report.message)
        finish_command(tx, workspace, error=CommandError(ErrorCode.ABORTED, report.message))


def _destroyed(tx: Tx, workspace: Workspace, instance: Instance, report: Destroyed, current: bool) -> None:
    instance.done_step = instance.step
    instance.phase = Phase.RELEASED
    instance.holds = []
    if current and workspace.active_kind is CommandKind.DELETE:
        steps.finish_delete(tx, workspace)


def _destroy_failed(tx: Tx, workspace: Workspace, instance: Instance, report: DestroyFailed, current: bool) -> None:
    instance.done_step = instance.step
    if current and workspace.active_kind is CommandKind.DELETE:
        steps.fail(workspace, "DELETE", report.message)
        finish_command(tx, workspace, error=CommandError(ErrorCode.UNAVAILABLE, report.message))


def _restarted(tx: Tx, workspace: Workspace, instance: Instance, report: Restarted, current: bool) -> None:
    instance.done_step = instance.step
    instance.phase = Phase.RUNNING
    if current:
        steps.set_guest_responding(tx, workspace, True)


def _restart_failed(tx: Tx, workspace: Workspace, instance: Instance, report: RestartFailed, current: bool) -> None:
    instance.done_step = instance.step
    instance.phase = Phase.EXITED
    instance.reason = report.message
    if current:
        steps.fail_execution(workspace, "", f"guest reset: {report.message}", tx.now)


def _guest_responding(tx: Tx, workspace: Workspace, instance: Instance, report: GuestResponding, current: bool) -> None:
    if current:
        steps.set_guest_responding(tx, workspace, report.responding)


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
        steps.running(workspace)
        finish_command(tx, workspace)


def _launch_failed(tx: Tx, workspace: Workspace, instance: Instance, report: LaunchFailed, current: bool) -> None:
    placing = current and workspace.active_kind in (CommandKind.CREATE, CommandKind.START)
    if report.no_room and not report.holds and not report.volumes_created and placing:
        _place_again(tx, workspace, instance, report)
        return
    instance.done_step = instance.step
    instance.phase = Phase.FAILED
    instance.holds = list(report.holds)
    instance.reason = report.message
    _volumes_created(tx, report.volumes_created)
    if current and workspace.active_kind in (CommandKind.CREATE, CommandKind.START):
        stage = workspace.active_kind.name
        steps.fail_execution(workspace, stage, report.message, tx.now, holding=bool(report.holds))
        finish_command(tx, workspace, error=CommandError(ErrorCode.UNAVAILABLE, report.message))


def _place_again(tx: Tx, workspace: Workspace, instance: Instance, report: LaunchFailed) -> None:
    """The node had no room for the instance after all (its admission, which sees the disk
    as it is now, refused what the scheduler placed on its last report) and holds nothing of
    it: the instance goes back to the scheduler, which places it where there is room or keeps
    it waiting UNSCHEDULABLE with the reason, as any other; the command goes on. A new step,
    so that the node it lands on (the same one, later) acts on it afresh."""
    node = instance.node_id
    instance.node_id = None
    instance.phase = Phase.PENDING
    instance.holds = []
    instance.reason = f"unschedulable: {report.message}"
    instance.step += 1
    workspace.node_id = None
    # What was pinned to the node at this placement and never made there may go elsewhere:
    # a first launch's layer, and volumes not made yet (a node's disks are its own).
    if workspace.generation == 1 and workspace.storage_node == node:
        workspace.storage_node = None
    for binding in workspace.bindings:
        volume = tx.get_volume(binding.volume_id)
        if volume is not None and volume.state is VolumeState.PENDING and volume.storage_node == node:
            volume.storage_node = None
            tx.put_volume(volume)
    event(tx, workspace, EventType.UNSCHEDULABLE, message=f"{report.no_room} on {node}: {report.message}")


def _guest_oom_kill(tx: Tx, workspace: Workspace, instance: Instance, report: GuestOomKill, current: bool) -> None:
    """A process in the guest went over the workspace's memory and was killed there, as a
    guest kernel's OOM killer would; the guest runs on. Recorded as an event."""
    if not current:
        return
    who = f"PID {report.pid} ({report.command or 'unknown'})" if report.pid else "a process"
    more = f" and {report.count - 1} more" if report.count > 1 else ""
    limit = f"the workspace's memory ({instance.memory_mib} MiB)"
    event(tx, workspace, EventType.GUEST_OOM_KILL, message=f"OOM: killed {who}{more}: it went over {limit}")


def _stopped(tx: Tx, workspace: Workspace, instance: Instance, report: Stopped, current: bool) -> None:
    instance.done_step = instance.step
    instance.phase = Phase.STOPPED
    instance.holds = []
    if not current or workspace.active_kind not in (CommandKind.STOP, CommandKind.FORCE_STOP):
        return
    durability = report.durability
    if workspace.active_kind is CommandKind.FORCE_STOP:
        durability = StopDurability.UNCONFIRMED
    steps.stopped(workspace, durability)
    finish_command(tx, workspace, durability=durability)


def _guest_reset(tx: Tx, workspace: Workspace, instance: Instance, report: GuestReset, current: bool) -> None:
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
    resets = steps.record_guest_reset(workspace, now, RESET_WINDOW)
    instance.restart_count += 1
    if resets > MAX_RESETS:
        instance.phase = Phase.EXITED
        instance.reason = f"{resets} resets within 10 minutes"
        steps.fail_execution(workspace, "", f"{resets} resets within 10 minutes: the guest is not restarted again", now)
        event(tx, workspace, EventType.GUEST_RESET, message=f"reset {resets} within 10 minutes: not restarted")
        return
    steps.restarting_guest(workspace)
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
        if report.reason is ExitReason.CRASH and report.detail:
            message = report.detail[:MAX_DETAIL]  # what ended, as the runtime names it
        steps.fail_execution(workspace, "", message, tx.now)
    owed = _OWED_STOPS.get(report.reason)
    if owed is not None:
        steps.owe_stop(workspace, owed)


# report type -> its fold, read like domain/rules.py: every Report type has exactly one
# (tests/unit/test_report_folds.py checks it).
FOLDS: Mapping[type[Report], Callable[[Tx, Workspace, Instance, Any, bool], None]] = {
    Progress: _progress,
    Launched: _launched,
    LaunchFailed: _launch_failed,
    Stopped: _stopped,
    StopFailed: _stop_failed,
    Destroyed: _destroyed,
    DestroyFailed: _destroy_failed,
    GuestReset: _guest_reset,
    Restarted: _restarted,
    RestartFailed: _restart_failed,
    VmmExited: _vmm_exited,
    GuestResponding: _guest_responding,
    GuestOomKill: _guest_oom_kill,
}


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
    steps.storage_released(workspace)
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
        steps.set_node_silent(tx, workspace, node_id, silent)
        save(tx, workspace, instance)
