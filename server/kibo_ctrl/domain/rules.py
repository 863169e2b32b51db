"""Which operation each workspace state allows: the lifecycle rules, as data.

Three tables, each read by the service (to accept or reject a command) and by the tests
(to check every state x operation pair): OPERATIONS, AFTER_DELETE and FORCE_STOP; and the
command-ID prefixes the server keeps for the stops it starts itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from .errors import Conflict
from .model import CommandKind as Op
from .model import StopCause
from .model import WorkspaceState as S

# Server-initiated stops use these command-ID prefixes; callers may not.
SERVER_STOP_PREFIXES: dict[StopCause, str] = {
    StopCause.GUEST_SHUTDOWN: "guest-shutdown/",
    StopCause.HOST_MEMORY_EXHAUSTED: "host-memory/",
}
# The moves an operator's drain starts (kibo node drain --move-stopped).
DRAIN_MOVE_PREFIX = "move/"
RESERVED_PREFIXES: tuple[str, ...] = (*SERVER_STOP_PREFIXES.values(), DRAIN_MOVE_PREFIX)


@dataclass(frozen=True)
class Facts:
    """What the rules look at. Derived from a workspace record (see rule_facts in engine/steps.py)."""

    state: S
    holds_execution: bool = False
    deletion_started: bool = False
    # The lifecycle command in progress, if any (create, start, stop, force stop, delete).
    active: Op | None = None


class Guard(Enum):
    ALWAYS = "always"
    # Only with no lifecycle command in progress (a server-initiated stop counts).
    IDLE = "idle"
    # FAILED: only while the workspace holds no execution and no command is in progress.
    NOT_HOLDING = "not holding execution"
    # Decided row by row by FORCE_STOP below.
    FORCE_STOP_TABLE = "force-stop table"


_AVAILABLE_OPS: Mapping[Op, Guard] = {
    Op.STOP: Guard.IDLE,
    Op.FORCE_STOP: Guard.FORCE_STOP_TABLE,
    Op.DELETE: Guard.ALWAYS,
    Op.SET_NETWORK_POLICY: Guard.ALWAYS,
    Op.SET_EXPIRATION: Guard.ALWAYS,
    Op.CLEAR_EXPIRATION: Guard.ALWAYS,
    Op.REVOKE_DATA_PLANE_ACCESS: Guard.ALWAYS,
    Op.SET_LABELS: Guard.ALWAYS,
    # URLs to guest ports: only to a running guest (a stop ends them all).
    Op.CREATE_EXPOSURE: Guard.ALWAYS,
    Op.DELETE_EXPOSURE: Guard.ALWAYS,
}

# state -> operation -> guard. An operation missing from a state's row is a CONFLICT.
OPERATIONS: Mapping[S, Mapping[Op, Guard]] = {
    S.CREATING: {Op.DELETE: Guard.ALWAYS, Op.SET_LABELS: Guard.ALWAYS},
    S.AVAILABLE: _AVAILABLE_OPS,
    S.STOPPING: {Op.DELETE: Guard.ALWAYS, Op.FORCE_STOP: Guard.FORCE_STOP_TABLE, Op.SET_LABELS: Guard.ALWAYS},
    S.STOPPED: {
        Op.START: Guard.IDLE,
        Op.DELETE: Guard.ALWAYS,
        Op.RESIZE: Guard.ALWAYS,
        # IDLE: not while a MOVE copies the disks (the volumes it moves are fixed at its start).
        Op.BIND_VOLUME: Guard.IDLE,
        Op.UNBIND_VOLUME: Guard.IDLE,
        Op.SET_NETWORK_POLICY: Guard.ALWAYS,
        Op.CLEAR_EXPIRATION: Guard.ALWAYS,
        Op.SET_LABELS: Guard.ALWAYS,
        Op.MOVE: Guard.IDLE,
    },
    S.STARTING: {Op.DELETE: Guard.ALWAYS, Op.SET_LABELS: Guard.ALWAYS},
    S.FAILED: {
        Op.START: Guard.NOT_HOLDING,
        Op.FORCE_STOP: Guard.FORCE_STOP_TABLE,
        Op.DELETE: Guard.ALWAYS,
        Op.SET_LABELS: Guard.ALWAYS,
    },
    S.UNKNOWN: {Op.DELETE: Guard.ALWAYS, Op.FORCE_STOP: Guard.FORCE_STOP_TABLE, Op.SET_LABELS: Guard.ALWAYS},
    # A delete in progress goes on; a second one is a CONFLICT: wait for it.
    S.DELETING: {Op.SET_LABELS: Guard.ALWAYS},
    S.DELETED: {},
}

# Once a delete was accepted, only these remain (delete again finishes an unfinished one).
AFTER_DELETE: frozenset[Op] = frozenset({Op.DELETE, Op.SET_LABELS})


class ForceStop(Enum):
    ACCEPT = "accepted"
    SUPERSEDE = "accepted; the graceful stop in progress ends FAILED with CANCELLED"
    REJECT = "rejected"


@dataclass(frozen=True)
class ForceStopRow:
    situation: str
    applies: Callable[[Facts], bool]
    decision: ForceStop
    hint: str = ""


# First matching row wins; no row matching is a rejection.
FORCE_STOP: tuple[ForceStopRow, ...] = (
    ForceStopRow(
        "a delete was ever accepted",
        lambda f: f.deletion_started,
        ForceStop.REJECT,
        "a delete was accepted: delete again to finish it",
    ),
    ForceStopRow("AVAILABLE", lambda f: f.state is S.AVAILABLE and f.active is None, ForceStop.ACCEPT),
    ForceStopRow(
        "STOPPING or UNKNOWN with a graceful stop still processing",
        lambda f: f.state in (S.STOPPING, S.UNKNOWN) and f.active is Op.STOP,
        ForceStop.SUPERSEDE,
    ),
    ForceStopRow(
        "FAILED, holding execution",
        lambda f: f.state is S.FAILED and f.holds_execution and f.active is None,
        ForceStop.ACCEPT,
    ),
    ForceStopRow(
        "FAILED, not holding execution",
        lambda f: f.state is S.FAILED and not f.holds_execution,
        ForceStop.REJECT,
        "the workspace holds no execution: start it directly",
    ),
)

# What to tell a caller whose operation a state rejects.
HINTS: Mapping[tuple[S, Op], str] = {
    (S.FAILED, Op.START): "the workspace still holds execution: force stop first, then start",
    (S.DELETING, Op.DELETE): "a delete is in progress: wait for it to finish",
    (S.STOPPED, Op.STOP): "the workspace is already stopped",
    (S.AVAILABLE, Op.START): "the workspace is already running",
    (S.FAILED, Op.STOP): "a graceful stop cannot stop a FAILED workspace: force stop it",
    # What only a STOPPED workspace takes: say so, as the start above says "already running".
    (S.AVAILABLE, Op.RESIZE): "stop it first: a resize applies to a STOPPED workspace (from its next start)",
    (S.AVAILABLE, Op.BIND_VOLUME): "stop it first: volumes are bound while the workspace is STOPPED",
    (S.AVAILABLE, Op.UNBIND_VOLUME): "stop it first: volumes are unbound while the workspace is STOPPED",
}
STATE_HINTS: Mapping[S, str] = {
    S.UNKNOWN: "wait for the system to confirm, or resend the original request with the same command ID",
    S.DELETING: "wait for the delete to finish",
    S.DELETED: "a deleted workspace can only be read",
    S.CREATING: "wait for the creation to finish, or delete to cancel it",
    S.STARTING: "wait for the start to finish",
    S.STOPPING: "wait for the stop to finish, or force stop if it is stuck",
}


def force_stop_decision(facts: Facts) -> ForceStopRow | None:
    return next((row for row in FORCE_STOP if row.applies(facts)), None)


def check(op: Op, facts: Facts) -> ForceStop:
    """Raise Conflict unless `op` is allowed; for FORCE_STOP say whether it supersedes."""
    name = op.name
    if facts.deletion_started and op not in AFTER_DELETE:
        raise Conflict(
            f"{name} is not allowed: a delete was accepted for this workspace",
            state=facts.state.name,
            hint="delete again to finish the delete",
        )
    guard = OPERATIONS[facts.state].get(op)
    if guard is None:
        raise Conflict(
            f"{name} is not allowed in state {facts.state.name}",
            state=facts.state.name,
            hint=HINTS.get((facts.state, op), STATE_HINTS.get(facts.state, "")),
        )
    if guard is Guard.FORCE_STOP_TABLE:
        row = force_stop_decision(facts)
        if row is None or row.decision is ForceStop.REJECT:
            raise Conflict(
                f"FORCE_STOP is not allowed: {row.situation if row else _situation(facts)}",
                state=facts.state.name,
                hint=row.hint if row else STATE_HINTS.get(facts.state, ""),
            )
        return row.decision
    if guard in (Guard.IDLE, Guard.NOT_HOLDING) and facts.active is not None:
        raise Conflict(
            f"{name} is not allowed while a {facts.active.name} command is in progress",
            state=facts.state.name,
            hint="wait for the command in progress to finish",
        )
    if guard is Guard.NOT_HOLDING and facts.holds_execution:
        raise Conflict(
            f"{name} is not allowed: the workspace still holds execution",
            state=facts.state.name,
            hint=HINTS.get((facts.state, op), ""),
        )
    return ForceStop.ACCEPT


def _situation(facts: Facts) -> str:
    busy = f" with a {facts.active.name} command in progress" if facts.active else ""
    return f"state {facts.state.name}{busy}"
