"""Table-driven unit tests of the lifecycle rules: the operation table and the force-stop table.

The expected tables here are written from /work/shared/spec/lifecycle.md ("What each
state allows", its bullets, the force-stop table, "How status is derived") and the
contract's command-ID and filter rules, not copied from the modules under test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from kibo_ctrl.domain import rules, status
from kibo_ctrl.domain.errors import Conflict, Reason
from kibo_ctrl.domain.model import CommandKind as Op
from kibo_ctrl.domain.model import (
    Phase,
    StopCause,
)
from kibo_ctrl.domain.model import WorkspaceState as S
from kibo_ctrl.domain.rules import Facts, ForceStop
from kibo_ctrl.domain.status import StatusFacts
from kibo_ctrl.transport.errors import to_status

# The twelve operations on an existing workspace (the spec's table, its bullets, the API).
OPERATIONS: tuple[Op, ...] = (
    Op.STOP,
    Op.FORCE_STOP,
    Op.START,
    Op.DELETE,
    Op.SET_EXPIRATION,
    Op.CLEAR_EXPIRATION,
    Op.SET_LABELS,
    Op.RESIZE,
    Op.SET_NETWORK_POLICY,
    Op.BIND_VOLUME,
    Op.UNBIND_VOLUME,
    Op.REVOKE_DATA_PLANE_ACCESS,
    # Beyond the spec's table: an operator's move of a STOPPED workspace's disks (issue 26).
    Op.MOVE,
    # Exposures (issue 28; the spec's data plane): URLs to a running guest's ports.
    Op.CREATE_EXPOSURE,
    Op.DELETE_EXPOSURE,
)
STATES: tuple[S, ...] = tuple(s for s in S if s is not S.UNSPECIFIED)
LIFECYCLE: tuple[Op, ...] = (Op.CREATE, Op.START, Op.STOP, Op.FORCE_STOP, Op.DELETE)

# "Labels and annotations can be changed in every state except DELETED."
LABELS = frozenset({Op.SET_LABELS})


def allow(*ops: Op) -> frozenset[Op]:
    return frozenset(ops) | LABELS


@dataclass(frozen=True)
class Situation:
    """A workspace situation the system reaches, and what the spec says it allows."""

    name: str
    facts: Facts
    allowed: frozenset[Op]
    # The force-stop table's decision when force stop is allowed.
    force_stop: ForceStop | None = None


# The spec's table, row by row, in the situations that reach each row.
SITUATIONS: tuple[Situation, ...] = (
    # CREATING: delete (cancels the creation in progress).
    Situation("CREATING", Facts(S.CREATING, active=Op.CREATE), allow(Op.DELETE)),
    # AVAILABLE: stop, force stop, delete, change network policy, set expiration (which may
    # replace or remove it: clear too, the contract says AVAILABLE and STOPPED), revoke.
    Situation(
        "AVAILABLE",
        Facts(S.AVAILABLE, holds_execution=True),
        allow(
            Op.STOP,
            Op.FORCE_STOP,
            Op.DELETE,
            Op.SET_NETWORK_POLICY,
            Op.SET_EXPIRATION,
            Op.CLEAR_EXPIRATION,
            Op.REVOKE_DATA_PLANE_ACCESS,
            Op.CREATE_EXPOSURE,
            Op.DELETE_EXPOSURE,
        ),
        ForceStop.ACCEPT,
    ),
    # kibovm guest power-off: AVAILABLE while the server's force stop runs. Force stop
    # accepts AVAILABLE only "with no other command in progress"; no second stop either.
    Situation(
        "AVAILABLE_server_stop_in_progress",
        Facts(S.AVAILABLE, holds_execution=True, active=Op.FORCE_STOP),
        allow(
            Op.DELETE,
            Op.SET_NETWORK_POLICY,
            Op.SET_EXPIRATION,
            Op.CLEAR_EXPIRATION,
            Op.REVOKE_DATA_PLANE_ACCESS,
            Op.CREATE_EXPOSURE,
            Op.DELETE_EXPOSURE,
        ),
    ),
    # STOPPING: delete; force stop when the graceful stop is stuck (supersedes it).
    Situation(
        "STOPPING_graceful",
        Facts(S.STOPPING, holds_execution=True, active=Op.STOP),
        allow(Op.DELETE, Op.FORCE_STOP),
        ForceStop.SUPERSEDE,
    ),
    Situation("STOPPING_forced", Facts(S.STOPPING, holds_execution=True, active=Op.FORCE_STOP), allow(Op.DELETE)),
    # STOPPED: start, delete, resize (CPU, memory, writable layer), rebind volumes, network
    # policy (effective at next start), clear expiration. Graceful stop is a CONFLICT.
    Situation(
        "STOPPED",
        Facts(S.STOPPED),
        allow(
            Op.START,
            Op.DELETE,
            Op.RESIZE,
            Op.BIND_VOLUME,
            Op.UNBIND_VOLUME,
            Op.SET_NETWORK_POLICY,
            Op.CLEAR_EXPIRATION,
            Op.MOVE,
        ),
    ),
    # STOPPED while an operator's move copies its disks (beyond the spec's table): no start,
    # no rebinding, no second move until it ends; a delete cancels it.
    Situation(
        "STOPPED_moving",
        Facts(S.STOPPED, active=Op.MOVE),
        allow(Op.DELETE, Op.RESIZE, Op.SET_NETWORK_POLICY, Op.CLEAR_EXPIRATION),
    ),
    # STARTING: delete.
    Situation("STARTING", Facts(S.STARTING, active=Op.START), allow(Op.DELETE)),
    # FAILED: recovery. Not holding: start directly; holding: force stop first.
    Situation("FAILED_not_holding", Facts(S.FAILED), allow(Op.START, Op.DELETE)),
    Situation(
        "FAILED_holding",
        Facts(S.FAILED, holds_execution=True),
        allow(Op.FORCE_STOP, Op.DELETE),
        ForceStop.ACCEPT,
    ),
    # A delete was accepted and could not finish: only deleting again (and labels).
    Situation(
        "FAILED_delete_begun_holding",
        Facts(S.FAILED, holds_execution=True, deletion_started=True),
        allow(Op.DELETE),
    ),
    Situation("FAILED_delete_begun_not_holding", Facts(S.FAILED, deletion_started=True), allow(Op.DELETE)),
    # UNKNOWN: delete; force stop while a graceful stop is still processed; otherwise wait.
    Situation("UNKNOWN", Facts(S.UNKNOWN, holds_execution=True), allow(Op.DELETE)),
    Situation(
        "UNKNOWN_graceful_stop",
        Facts(S.UNKNOWN, holds_execution=True, active=Op.STOP),
        allow(Op.DELETE, Op.FORCE_STOP),
        ForceStop.SUPERSEDE,
    ),
    Situation("UNKNOWN_force_stop", Facts(S.UNKNOWN, holds_execution=True, active=Op.FORCE_STOP), allow(Op.DELETE)),
    Situation("UNKNOWN_creating", Facts(S.UNKNOWN, active=Op.CREATE), allow(Op.DELETE)),
    Situation("UNKNOWN_starting", Facts(S.UNKNOWN, active=Op.START), allow(Op.DELETE)),
    Situation("UNKNOWN_delete_begun", Facts(S.UNKNOWN, holds_execution=True, deletion_started=True), allow(Op.DELETE)),
    # DELETING: wait (a second delete is a CONFLICT); labels still change.
    Situation(
        "DELETING",
        Facts(S.DELETING, holds_execution=True, deletion_started=True, active=Op.DELETE),
        allow(),
    ),
    # DELETED: query only.
    Situation("DELETED", Facts(S.DELETED, deletion_started=True), frozenset()),
)


def _outcome(op: Op, facts: Facts) -> ForceStop | Conflict:
    try:
        return rules.check(op, facts)
    except Conflict as conflict:
        return conflict


@pytest.mark.parametrize(
    ("situation", "op"),
    list(itertools.product(SITUATIONS, OPERATIONS)),
    ids=[f"{s.name}-{op.name}" for s, op in itertools.product(SITUATIONS, OPERATIONS)],
)
def test_state_operation_table(situation: Situation, op: Op) -> None:
    outcome = _outcome(op, situation.facts)
    if op in situation.allowed:
        assert not isinstance(outcome, Conflict), f"{op.name} in {situation.name} rejected: {outcome}"
        expected = situation.force_stop if op is Op.FORCE_STOP else ForceStop.ACCEPT
        assert outcome is expected
    else:
        assert isinstance(outcome, Conflict), f"{op.name} in {situation.name} was allowed"
        assert outcome.reason is Reason.CONFLICT
        assert outcome.state == situation.facts.state.name
        assert outcome.message


def test_situations_cover_every_state() -> None:
    assert {s.facts.state for s in SITUATIONS} == set(STATES)
    assert all(s.force_stop is not None for s in SITUATIONS if Op.FORCE_STOP in s.allowed)


# -- the same rules over every consistent combination of facts -------------------------------


def reachable_facts() -> Iterator[Facts]:
    """Every combination of facts the visible-state derivation can produce.

    The visible state is derived from these facts (status.derive_state), so a STOPPED
    workspace has no lifecycle command in progress, DELETING means a delete is active, etc.
    A delete, once accepted, cancels the command in progress and admits no new one."""
    seen: set[Facts] = set()
    phases: tuple[Phase | None, ...] = (None, Phase.RUNNING, Phase.STOPPED)
    causes: tuple[StopCause | None, ...] = (None, StopCause.REQUESTED, StopCause.GUEST_SHUTDOWN)
    for deleted, active, cause, silent, failed, phase, holds, begun in itertools.product(
        (False, True),
        (None, *LIFECYCLE, Op.MOVE),
        causes,
        (False, True),
        (False, True),
        phases,
        (False, True),
        (False, True),
    ):
        if cause is not None and active not in (Op.STOP, Op.FORCE_STOP):
            continue
        if deleted and (not begun or active is not None or holds or silent):
            continue
        if active is Op.DELETE and not begun:
            continue
        if begun and active not in (None, Op.DELETE):
            continue
        state = status.derive_state(
            StatusFacts(
                deleted=deleted, active=active, active_cause=cause, node_silent=silent, failed=failed, phase=phase
            )
        )
        facts = Facts(state=state, holds_execution=holds, deletion_started=begun, active=active)
        if facts not in seen:
            seen.add(facts)
            yield facts


def spec_force_stop(facts: Facts) -> ForceStop:
    """The force-stop table. It lists what force stop accepts "with no other command in
    progress"; a graceful stop in progress is the one it supersedes."""
    if facts.deletion_started:
        return ForceStop.REJECT  # a delete was ever accepted: delete again to finish
    if facts.active is None:
        if facts.state is S.AVAILABLE:
            return ForceStop.ACCEPT
        if facts.state is S.FAILED and facts.holds_execution:
            return ForceStop.ACCEPT  # whatever stage the failure happened in
        return ForceStop.REJECT  # FAILED not holding: start it directly; anything else
    if facts.active is Op.STOP and facts.state in (S.STOPPING, S.UNKNOWN):
        return ForceStop.SUPERSEDE
    return ForceStop.REJECT


def spec_allows(op: Op, facts: Facts) -> bool:
    state = facts.state
    if state is S.DELETED:
        return False  # query only
    if op is Op.SET_LABELS:
        return True  # every state except DELETED
    if op is Op.DELETE:
        return state is not S.DELETING  # every state except DELETING and DELETED
    if facts.deletion_started:
        return False  # no start, no force stop, no configuration change after a delete
    if op is Op.FORCE_STOP:
        return spec_force_stop(facts) is not ForceStop.REJECT
    if op is Op.STOP:
        # AVAILABLE only; not while the server's own stop of it is in progress.
        return state is S.AVAILABLE and facts.active is None
    if op in (Op.MOVE, Op.BIND_VOLUME, Op.UNBIND_VOLUME) and facts.active is not None:
        # A move copies the disks of the volumes bound at its start: nothing rebinds meanwhile.
        return False
    if op is Op.START:
        # Two lifecycle commands never run at once: a start waits for the one in progress.
        startable = state is S.STOPPED or (state is S.FAILED and not facts.holds_execution)
        return startable and facts.active is None
    where: dict[Op, frozenset[S]] = {
        Op.SET_EXPIRATION: frozenset({S.AVAILABLE}),
        Op.CLEAR_EXPIRATION: frozenset({S.AVAILABLE, S.STOPPED}),
        Op.SET_NETWORK_POLICY: frozenset({S.AVAILABLE, S.STOPPED}),
        Op.REVOKE_DATA_PLANE_ACCESS: frozenset({S.AVAILABLE}),
        Op.RESIZE: frozenset({S.STOPPED}),
        Op.BIND_VOLUME: frozenset({S.STOPPED}),
        Op.UNBIND_VOLUME: frozenset({S.STOPPED}),
        Op.MOVE: frozenset({S.STOPPED}),
        # "Exposures are revoked by a stop": made and ended only while the guest runs.
        Op.CREATE_EXPOSURE: frozenset({S.AVAILABLE}),
        Op.DELETE_EXPOSURE: frozenset({S.AVAILABLE}),
    }
    return state in where[op]


REACHABLE = tuple(reachable_facts())


def test_reachable_facts_reach_every_state() -> None:
    assert {f.state for f in REACHABLE} == set(STATES)
    assert {s.facts for s in SITUATIONS} <= set(REACHABLE)


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_operation_over_every_reachable_situation(op: Op) -> None:
    wrong = []
    for facts in REACHABLE:
        outcome = _outcome(op, facts)
        allowed = not isinstance(outcome, Conflict)
        if allowed != spec_allows(op, facts):
            wrong.append(f"{facts}: {'allowed' if allowed else 'rejected'}")
        elif op is Op.FORCE_STOP and allowed:
            assert outcome is spec_force_stop(facts), facts
    assert not wrong, f"{op.name} disagrees with the spec in:\n" + "\n".join(wrong)


def test_rule_tables_are_data_over_known_states_and_operations() -> None:
    assert set(rules.OPERATIONS) >= set(STATES)
    for state, row in rules.OPERATIONS.items():
        assert set(row) <= set(OPERATIONS), state
    assert rules.OPERATIONS[S.DELETED] == {}
    assert set(rules.AFTER_DELETE) == {Op.DELETE, Op.SET_LABELS}


# -- the force-stop table, row by row --------------------------------------------------------


@dataclass(frozen=True)
class ForceStopCase:
    row: str
    facts: Facts
    decision: ForceStop
    hint: str = ""


FORCE_STOP_ROWS: tuple[ForceStopCase, ...] = (
    ForceStopCase("AVAILABLE", Facts(S.AVAILABLE, holds_execution=True), ForceStop.ACCEPT),
    ForceStopCase("STOPPING graceful", Facts(S.STOPPING, True, active=Op.STOP), ForceStop.SUPERSEDE),
    ForceStopCase("UNKNOWN graceful", Facts(S.UNKNOWN, True, active=Op.STOP), ForceStop.SUPERSEDE),
    ForceStopCase("FAILED holding", Facts(S.FAILED, holds_execution=True), ForceStop.ACCEPT),
    ForceStopCase("FAILED not holding", Facts(S.FAILED), ForceStop.REJECT, "start"),
    ForceStopCase("delete FAILED holding", Facts(S.FAILED, True, True), ForceStop.REJECT, "delete again"),
    ForceStopCase("delete FAILED", Facts(S.FAILED, False, True), ForceStop.REJECT, "delete again"),
    ForceStopCase("delete UNKNOWN", Facts(S.UNKNOWN, True, True), ForceStop.REJECT, "delete again"),
    ForceStopCase("delete DELETING", Facts(S.DELETING, True, True, Op.DELETE), ForceStop.REJECT),
    ForceStopCase("delete DELETED", Facts(S.DELETED, False, True), ForceStop.REJECT),
    # Not in the table: rejected.
    ForceStopCase("STOPPING forced", Facts(S.STOPPING, True, active=Op.FORCE_STOP), ForceStop.REJECT),
    ForceStopCase("UNKNOWN idle", Facts(S.UNKNOWN, holds_execution=True), ForceStop.REJECT),
    ForceStopCase("STOPPED", Facts(S.STOPPED), ForceStop.REJECT),
    ForceStopCase("CREATING", Facts(S.CREATING, active=Op.CREATE), ForceStop.REJECT),
    ForceStopCase("STARTING", Facts(S.STARTING, active=Op.START), ForceStop.REJECT),
    ForceStopCase("AVAILABLE busy", Facts(S.AVAILABLE, True, active=Op.FORCE_STOP), ForceStop.REJECT),
)


@pytest.mark.parametrize("case", FORCE_STOP_ROWS, ids=lambda c: c.row.replace(" ", "_"))
def test_force_stop_table(case: ForceStopCase) -> None:
    outcome = _outcome(Op.FORCE_STOP, case.facts)
    if case.decision is ForceStop.REJECT:
        assert isinstance(outcome, Conflict), case
        assert outcome.reason is Reason.CONFLICT
        assert case.hint in outcome.hint
    else:
        assert outcome is case.decision
    row = rules.force_stop_decision(case.facts)
    assert (row.decision if row else ForceStop.REJECT) is case.decision


# -- the guards: what a rejection tells the caller ---------------------------------------------


@pytest.mark.parametrize(
    ("op", "facts", "hint"),
    [
        # NOT_HOLDING: FAILED still holding execution -> force stop first.
        (Op.START, Facts(S.FAILED, holds_execution=True), "force stop"),
        # IDLE: the server's stop is in progress.
        (Op.STOP, Facts(S.AVAILABLE, True, active=Op.FORCE_STOP), "in progress"),
        # AFTER_DELETE: a delete was accepted.
        (Op.START, Facts(S.FAILED, deletion_started=True), "delete again"),
        (Op.RESIZE, Facts(S.FAILED, deletion_started=True), "delete again"),
        # DELETING: wait for the delete in progress.
        (Op.DELETE, Facts(S.DELETING, True, True, Op.DELETE), "wait"),
        (Op.STOP, Facts(S.STOPPED), "already stopped"),
        (Op.SET_LABELS, Facts(S.DELETED, deletion_started=True), "read"),
    ],
    ids=["not-holding", "idle", "after-delete-start", "after-delete-config", "deleting", "stopped", "deleted"],
)
def test_rejection_hints(op: Op, facts: Facts, hint: str) -> None:
    outcome = _outcome(op, facts)
    assert isinstance(outcome, Conflict)
    assert hint in outcome.hint, outcome.hint


def test_conflict_maps_to_failed_precondition_with_both_details() -> None:
    code, wire = to_status(Conflict("no", state="STOPPED", hint="start it"))
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert wire.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    kinds = [d.type_url.rsplit("/", 1)[-1] for d in wire.details]
    assert kinds == ["kibo.ctrl.v1.ErrorDetail", "google.rpc.ErrorInfo"]
