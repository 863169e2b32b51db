"""How the visible workspace state is derived: predicates in priority order.

The workload seed's shape: the node reports a rich internal status per instance; the
visible state is the first predicate that matches, so a worse condition always wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .model import CommandKind, Phase, StopCause
from .model import WorkspaceState as S


@dataclass(frozen=True)
class StatusFacts:
    deleted: bool = False
    # The lifecycle command in progress, and for stops their cause.
    active: CommandKind | None = None
    active_cause: StopCause | None = None
    # The workspace's instance is on a node that stopped reporting.
    node_silent: bool = False
    failed: bool = False
    # The current instance's internal phase, if there is one.
    phase: Phase | None = None


def _stopping(f: StatusFacts) -> bool:
    return f.active in (CommandKind.STOP, CommandKind.FORCE_STOP)


# Highest priority first. Each row: the visible state, and when it applies.
PREDICATES: tuple[tuple[S, str, Callable[[StatusFacts], bool]], ...] = (
    (S.DELETED, "the delete finished", lambda f: f.deleted),
    (S.DELETING, "a delete is in progress", lambda f: f.active is CommandKind.DELETE),
    (S.UNKNOWN, "the node stopped reporting", lambda f: f.node_silent),
    (S.FAILED, "an operation failed or the VMM exited", lambda f: f.failed),
    # kibovm guest power-off: AVAILABLE (data plane closed) until the server's stop completes.
    (
        S.AVAILABLE,
        "a guest-shutdown stop is in progress",
        lambda f: _stopping(f) and f.active_cause is StopCause.GUEST_SHUTDOWN,
    ),
    (S.STOPPING, "a stop is in progress", _stopping),
    (S.CREATING, "a create is in progress", lambda f: f.active is CommandKind.CREATE),
    (S.STARTING, "a start is in progress", lambda f: f.active is CommandKind.START),
    (S.AVAILABLE, "the instance runs", lambda f: f.phase in (Phase.RUNNING, Phase.RESTARTING)),
    (S.STOPPED, "nothing runs", lambda f: True),
)


def derive_state(facts: StatusFacts) -> S:
    return next(state for state, _, applies in PREDICATES if applies(facts))


# A command that has reached a terminal state for each visible state (used by settle).
STEADY_STATES: frozenset[S] = frozenset({S.AVAILABLE, S.STOPPED, S.FAILED, S.DELETED})
