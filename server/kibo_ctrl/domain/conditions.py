"""The workspace's conditions (Kubernetes style), derived from its records at every save.

Each is (type, status, reason, message); `update` keeps a condition's last transition time
while its status stays the same, so an operator reads since when a workspace has been
unscheduled, unreachable or releasing. A type that no longer applies (no node: no
NodeReachable) drops out. Rules as data: one function per type, in CONDITIONS."""

from __future__ import annotations

from collections.abc import Callable

from .model import Condition, Instance, Phase, StopDurability, Workspace, WorkspaceState

Derived = tuple[bool, str, str] | None  # (status, reason, message); None: the type does not apply


def _scheduled(workspace: Workspace, instance: Instance | None) -> Derived:
    if instance is None or workspace.deleted:
        return None
    if instance.node_id:
        return True, "Scheduled", f"on {instance.node_id}"
    if instance.reason.startswith("unschedulable"):
        return False, "Unschedulable", instance.reason
    return False, "Pending", "waiting for the scheduler"


def _ready(workspace: Workspace, instance: Instance | None) -> Derived:
    if workspace.deleted:
        return None
    if workspace.state is WorkspaceState.AVAILABLE:
        if not workspace.guest.responding:
            return False, "GuestNotResponding", "the guest does not answer"
        return True, "Running", "the instance runs and its guest answered"
    reason = workspace.state.name.title()
    if workspace.failure is not None:
        return False, reason, f"{workspace.failure.stage or 'runtime'}: {workspace.failure.message}"
    if instance is not None and instance.phase in (Phase.PROVISIONING, Phase.LAUNCHING, Phase.STOPPING):
        return False, reason, f"instance {instance.phase.name.lower()}"
    return False, reason, ""


def _node_reachable(workspace: Workspace, instance: Instance | None) -> Derived:
    node = workspace.node_id or (instance.node_id if instance is not None else None)
    if not node or workspace.deleted:
        return None
    if workspace.node_silent:
        return False, "NodeSilent", f"{node} stopped reporting"
    return True, "NodeReporting", f"{node} reports"


DURABILITY = {
    StopDurability.CONFIRMED: ("SyncConfirmed", "the guest's writes were synced to disk"),
    StopDurability.UNCONFIRMED: ("SyncUnconfirmed", "a force stop or a failed sync: recent writes may be lost"),
    StopDurability.UNSPECIFIED: ("Stopping", "the stop has not finished"),
}


def _stopped(workspace: Workspace, instance: Instance | None) -> Derived:
    last = workspace.last_stop
    if last is None or workspace.state not in (WorkspaceState.STOPPING, WorkspaceState.STOPPED):
        return None
    reason, message = DURABILITY[last.durability]
    cause = last.cause.name.lower().replace("_", " ")
    return workspace.state is WorkspaceState.STOPPED, reason, f"{message} (cause: {cause}, command {last.command_id})"


# States in which an execution is wanted: its parts are in use, not being released.
RUNNING_STATES = frozenset({WorkspaceState.AVAILABLE, WorkspaceState.CREATING, WorkspaceState.STARTING})


def _releasing(workspace: Workspace, instance: Instance | None) -> Derived:
    if workspace.state in RUNNING_STATES and workspace.release_pending_since is None:
        return None
    if workspace.release_pending_since is not None:
        return True, "PartsHeld", "the node still holds parts of the last execution; it retries releasing them"
    storage = workspace.storage
    if storage.layer or storage.volume_ids:
        return True, "StoragePending", f"files wait for a node of pool {workspace.storage_pool}"
    if workspace.holds_execution:
        return True, "Releasing", "the node is releasing the execution's parts"
    return False, "Released", "nothing of an old execution is held"


CONDITIONS: tuple[tuple[str, Callable[[Workspace, Instance | None], Derived]], ...] = (
    ("Scheduled", _scheduled),
    ("Ready", _ready),
    ("NodeReachable", _node_reachable),
    ("Stopped", _stopped),
    ("Releasing", _releasing),
)


def update(workspace: Workspace, instance: Instance | None, now: float) -> list[Condition]:
    """The workspace's conditions now, keeping each one's transition time unless its status flipped."""
    old = {condition.type: condition for condition in workspace.conditions}
    conditions = []
    for kind, derive in CONDITIONS:
        derived = derive(workspace, instance)
        if derived is None:
            continue
        status, reason, message = derived
        before = old.get(kind)
        since = before.last_transition_time if before is not None and before.status == status else now
        conditions.append(Condition(kind, status, reason, message, since))
    return conditions
