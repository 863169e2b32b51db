"""Table-driven unit tests of the pure rule modules: rules, status, cleanup, validation.

The expected tables here are written from /work/shared/spec/lifecycle.md ("What each
state allows", its bullets, the force-stop table, "How status is derived") and the
contract's command-ID and filter rules, not copied from the modules under test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kibo_ctrl import cleanup, rules, status, validation
from kibo_ctrl.errors import Conflict, InvalidArgument, KiboError, Reason, ReservedCommandId
from kibo_ctrl.model import (
    EXECUTION_PARTS,
    Binding,
    CleanupCompleteness,
    CleanupSource,
    CleanupState,
    Component,
    ComponentStatus,
    Instance,
    Phase,
    Resources,
    StopCause,
    StoragePending,
    Workspace,
)
from kibo_ctrl.model import CommandKind as Op
from kibo_ctrl.model import WorkspaceState as S
from kibo_ctrl.rules import Facts, ForceStop
from kibo_ctrl.status import StatusFacts
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
        ),
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
        (False, True), (None, *LIFECYCLE), causes, (False, True), (False, True), phases, (False, True), (False, True)
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


# -- status.derive_state: predicates in priority order -------------------------------------


# Highest priority first: (visible state, facts that make its predicate true).
PRIORITY: tuple[tuple[str, S, dict[str, Any]], ...] = (
    ("deleted", S.DELETED, {"deleted": True}),
    ("deleting", S.DELETING, {"active": Op.DELETE}),
    ("node_silent", S.UNKNOWN, {"node_silent": True}),
    ("failed", S.FAILED, {"failed": True}),
    ("guest_shutdown_stop", S.AVAILABLE, {"active": Op.FORCE_STOP, "active_cause": StopCause.GUEST_SHUTDOWN}),
    ("stopping", S.STOPPING, {"active": Op.STOP, "active_cause": StopCause.REQUESTED}),
    ("force_stopping", S.STOPPING, {"active": Op.FORCE_STOP, "active_cause": StopCause.HOST_MEMORY_EXHAUSTED}),
    ("creating", S.CREATING, {"active": Op.CREATE}),
    ("starting", S.STARTING, {"active": Op.START}),
    ("running", S.AVAILABLE, {"phase": Phase.RUNNING}),
    ("restarting", S.AVAILABLE, {"phase": Phase.RESTARTING}),
    ("nothing_runs", S.STOPPED, {}),
)


@pytest.mark.parametrize(("name", "state", "fields"), PRIORITY, ids=[p[0] for p in PRIORITY])
def test_each_predicate_alone(name: str, state: S, fields: dict[str, Any]) -> None:
    assert status.derive_state(StatusFacts(**fields)) is state


def _priority_pairs() -> Iterator[tuple[str, S, dict[str, Any]]]:
    for (high, state, fields), (low, _, other) in itertools.combinations(PRIORITY, 2):
        if set(fields) & set(other):
            continue  # one field cannot hold two values (e.g. one active command)
        yield f"{high}>{low}", state, {**other, **fields}


PAIRS = tuple(_priority_pairs())


@pytest.mark.parametrize(("name", "state", "fields"), PAIRS, ids=[p[0] for p in PAIRS])
def test_higher_predicate_wins(name: str, state: S, fields: dict[str, Any]) -> None:
    assert status.derive_state(StatusFacts(**fields)) is state


def test_priority_pairs_cover_every_predicate() -> None:
    names = {n for pair in PAIRS for n in pair[0].split(">")}
    assert names == {p[0] for p in PRIORITY}


@pytest.mark.parametrize("phase", [None, *Phase], ids=lambda p: p.name if p else "none")
def test_phase_alone(phase: Phase | None) -> None:
    """Only a running (or restarting: guest reboot on firecracker) instance is AVAILABLE."""
    expected = S.AVAILABLE if phase in (Phase.RUNNING, Phase.RESTARTING) else S.STOPPED
    assert status.derive_state(StatusFacts(phase=phase)) is expected


def test_worst_of_many_conditions_wins() -> None:
    everything = StatusFacts(
        deleted=False, active=Op.STOP, node_silent=True, failed=True, phase=Phase.RUNNING
    )  # a stop in progress, failed, on a silent node, still running
    assert status.derive_state(everything) is S.UNKNOWN


# -- cleanup.derive ------------------------------------------------------------------------

NOW = 1_000_000.0


def _workspace(**fields: Any) -> Workspace:
    base: dict[str, Any] = {
        "id": "ws-1",
        "seq": 1,
        "state": S.AVAILABLE,
        "resources": Resources(2, 2048, 10),
        "bindings": [Binding("vol-own", "/data", True)],
        "create_time": NOW - 100,
        "update_time": NOW - 10,
        "storage_pool": "local",
    }
    base.update(fields)
    return Workspace(**base)


def _instance(
    holds: list[Component], observe: float | None = NOW - 5, node: str | None = "node-1", settled: bool = True
) -> Instance:
    """`settled`: the node has reported on the latest step (done_step == step)."""
    return Instance(
        step=1,
        done_step=1 if settled else 0,
        id="ws-1-g1",
        workspace_id="ws-1",
        generation=1,
        vcpus=2,
        memory_mib=2048,
        create_time=NOW - 100,
        node_id=node,
        holds=holds,
        observe_time=observe,
    )


HELD = list(EXECUTION_PARTS)
KEPT = {Component.RETAINED_LAYER: ComponentStatus.PRESENT, Component.VOLUME_DELETION: ComponentStatus.PRESENT}


def every(status_: ComponentStatus) -> dict[Component, ComponentStatus]:
    return dict.fromkeys(EXECUTION_PARTS, status_)


@dataclass(frozen=True)
class CleanupCase:
    name: str
    workspace: Workspace
    instance: Instance | None
    # None: only "not COMPLETE" is asserted (the spec fixes no more).
    state: CleanupState | None
    completeness: CleanupCompleteness
    parts: dict[Component, ComponentStatus]
    storage: dict[Component, ComponentStatus]
    # Whether the release times are present (only while release is unfinished).
    release: bool


CLEANUP_CASES: tuple[CleanupCase, ...] = (
    CleanupCase(
        "never_scheduled",
        _workspace(state=S.CREATING, active_kind=Op.CREATE),
        _instance([], observe=None, node=None),
        CleanupState.COMPLETE,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.RELEASED),
        KEPT,
        release=False,
    ),
    CleanupCase(
        "running",
        _workspace(state=S.AVAILABLE, holds_execution=True),
        _instance(HELD),
        CleanupState.COMPLETE,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.PRESENT),
        KEPT,
        release=False,
    ),
    CleanupCase(
        "stopping",
        _workspace(state=S.STOPPING, active_kind=Op.STOP, holds_execution=True, release_pending_since=NOW - 3),
        _instance(HELD),
        CleanupState.PROCESSING,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.PRESENT),
        KEPT,
        release=True,
    ),
    CleanupCase(
        "stopped",
        _workspace(state=S.STOPPED),
        _instance([]),
        CleanupState.COMPLETE,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.RELEASED),
        KEPT,
        release=False,
    ),
    CleanupCase(
        "failed_holding",
        _workspace(state=S.FAILED, holds_execution=True, release_pending_since=NOW - 3),
        _instance(HELD),
        CleanupState.NEEDS_ATTENTION,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.PRESENT),
        KEPT,
        release=True,
    ),
    CleanupCase(
        "node_silent_stopping",
        _workspace(
            state=S.UNKNOWN, node_silent=True, active_kind=Op.STOP, holds_execution=True, release_pending_since=NOW - 3
        ),
        _instance(HELD),
        CleanupState.PROCESSING,
        CleanupCompleteness.PARTIAL,
        every(ComponentStatus.UNKNOWN),
        KEPT,
        release=True,
    ),
    CleanupCase(
        "node_silent_running",
        _workspace(state=S.UNKNOWN, node_silent=True, holds_execution=True),
        _instance(HELD),
        None,
        CleanupCompleteness.PARTIAL,
        every(ComponentStatus.UNKNOWN),
        KEPT,
        release=False,
    ),
    CleanupCase(
        "node_silent_stopped",
        _workspace(state=S.UNKNOWN, node_silent=True),
        _instance([]),
        CleanupState.COMPLETE,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.RELEASED),
        KEPT,
        release=False,
    ),
    CleanupCase(
        "node_silent_never_reported",
        # A create in progress releases nothing: no release section.
        _workspace(state=S.UNKNOWN, node_silent=True, active_kind=Op.CREATE),
        _instance([Component.RESERVATION], observe=None, settled=False),
        CleanupState.UNKNOWN,
        CleanupCompleteness.UNKNOWN,
        every(ComponentStatus.UNKNOWN),
        KEPT,
        release=False,
    ),
    CleanupCase(
        # Mid-launch: the node reported the reservation, then went silent before the launch
        # finished; whatever the launch took is unknown, never released.
        "node_silent_launching",
        _workspace(state=S.UNKNOWN, node_silent=True, active_kind=Op.CREATE),
        _instance([Component.RESERVATION], settled=False),
        None,
        CleanupCompleteness.PARTIAL,
        every(ComponentStatus.UNKNOWN),
        KEPT,
        release=False,
    ),
    CleanupCase(
        "deleted_files_pending",
        _workspace(
            state=S.DELETED,
            deleted=True,
            deletion_started=True,
            storage=StoragePending(layer=True, volume_ids=["vol-own"], since=NOW - 2),
        ),
        _instance([]),
        CleanupState.PROCESSING,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.RELEASED),
        {Component.RETAINED_LAYER: ComponentStatus.PENDING, Component.VOLUME_DELETION: ComponentStatus.PENDING},
        release=True,
    ),
    CleanupCase(
        "deleted_files_gone",
        _workspace(state=S.DELETED, deleted=True, deletion_started=True),
        _instance([]),
        CleanupState.COMPLETE,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.RELEASED),
        {Component.RETAINED_LAYER: ComponentStatus.RELEASED, Component.VOLUME_DELETION: ComponentStatus.RELEASED},
        release=False,
    ),
    CleanupCase(
        "deleted_kept_volume_only",
        _workspace(
            state=S.DELETED,
            deleted=True,
            deletion_started=True,
            bindings=[Binding("vol-kept", "/data", False)],
            storage=StoragePending(layer=True, since=NOW - 2),
        ),
        _instance([]),
        CleanupState.PROCESSING,
        CleanupCompleteness.COMPLETE,
        every(ComponentStatus.RELEASED),
        # A kept volume is not deleted: no VOLUME_DELETION row.
        {Component.RETAINED_LAYER: ComponentStatus.PENDING},
        release=True,
    ),
)


@pytest.mark.parametrize("case", CLEANUP_CASES, ids=lambda c: c.name)
def test_cleanup_derive(case: CleanupCase) -> None:
    result = cleanup.derive(case.workspace, case.instance, NOW)
    if case.state is None:
        assert result.state is not CleanupState.COMPLETE
    else:
        assert result.state is case.state
    assert result.completeness is case.completeness
    rows = {row.component: row for row in result.components}
    assert len(rows) == len(result.components), "one row per component"
    assert {c: rows[c].status for c in EXECUTION_PARTS} == case.parts
    assert {c: r.status for c, r in rows.items() if c not in EXECUTION_PARTS} == case.storage
    from_node = case.instance is not None and case.instance.node_id is not None
    for part in EXECUTION_PARTS:
        assert rows[part].source is (CleanupSource.NODE_REPORT if from_node else CleanupSource.CONTROL_PLANE)
    for component, row in rows.items():
        if row.status is ComponentStatus.PENDING:
            assert row.source is CleanupSource.CONTROL_PLANE, component
    assert (result.pending_since is not None) is case.release
    if case.release:
        assert result.pending_since is not None and result.pending_since < NOW


# The situations a workspace on a silent node is in (UNKNOWN beats all but DELETING).
SILENT = (
    (S.UNKNOWN, None),
    (S.UNKNOWN, Op.CREATE),
    (S.UNKNOWN, Op.START),
    (S.UNKNOWN, Op.STOP),
    (S.UNKNOWN, Op.FORCE_STOP),
    (S.DELETING, Op.DELETE),
)


@pytest.mark.parametrize(("state", "active"), SILENT, ids=lambda v: v.name if v else "idle")
def test_unknown_parts_never_show_released(state: S, active: Op | None) -> None:
    workspace = _workspace(state=state, node_silent=True, holds_execution=True, active_kind=active)
    result = cleanup.derive(workspace, _instance(HELD), NOW)
    assert {r.component: r.status for r in result.components if r.component in EXECUTION_PARTS} == every(
        ComponentStatus.UNKNOWN
    )
    assert result.completeness is CleanupCompleteness.PARTIAL
    assert result.state is not CleanupState.COMPLETE


# -- validation: command IDs -------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "a",
        "example/6f1c2b3a",
        "6f1c2b3a-1d2e-4f50-8a9b-0c1d2e3f4a5b",
        "A-Z.a_z~0:9/-",
        "x" * 128,
        "guest-shutdown",  # the prefix is "guest-shutdown/"
        "x/guest-shutdown/1",
        "host-memory",
        "host-memory:1",
    ],
)
def test_valid_command_ids(value: str) -> None:
    assert validation.command_id(value) == value


@pytest.mark.parametrize(
    "value",
    ["", "x" * 129, "a b", "a\n", "é", "a+b", "a@b", "a*", "a,b", "a#b", "a\x00"],
    ids=lambda v: repr(v)[:20],
)
def test_invalid_command_ids(value: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.command_id(value)
    assert caught.value.reason is Reason.INVALID_ARGUMENT
    assert caught.value.field == "metadata.command_id"


@pytest.mark.parametrize("value", ["guest-shutdown/", "guest-shutdown/x", "host-memory/", "host-memory/123"])
def test_reserved_command_id_prefixes(value: str) -> None:
    with pytest.raises(ReservedCommandId) as caught:
        validation.command_id(value)
    assert caught.value.reason is Reason.RESERVED_COMMAND_ID
    code, _ = to_status(caught.value)
    assert code is grpc.StatusCode.INVALID_ARGUMENT


ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~:/-"


@given(st.text(alphabet=ALPHABET, min_size=1, max_size=128))
def test_any_id_from_the_alphabet_is_valid_unless_reserved(value: str) -> None:
    if value.startswith(("guest-shutdown/", "host-memory/")):
        with pytest.raises(ReservedCommandId):
            validation.command_id(value)
    else:
        assert validation.command_id(value) == value


@given(st.text(min_size=1, max_size=140).filter(lambda v: len(v) > 128 or any(c not in ALPHABET for c in v)))
def test_any_other_id_is_invalid(value: str) -> None:
    with pytest.raises(KiboError) as caught:
        validation.command_id(value)
    assert caught.value.reason is Reason.INVALID_ARGUMENT


# -- validation: the list filter (AIP-160 subset) --------------------------------------------


@pytest.mark.parametrize(
    ("text", "states", "labels"),
    [
        ("", (), ()),
        ("   ", (), ()),
        ("state = AVAILABLE", ((S.AVAILABLE, True),), ()),
        ("state=WORKSPACE_STATE_STOPPED", ((S.STOPPED, True),), ()),
        ("state != DELETED", ((S.DELETED, False),), ()),
        ('state = "FAILED"', ((S.FAILED, True),), ()),
        ('labels.team = "a b"', (), (("team", "a b", True),)),
        ("labels.team!=x", (), (("team", "x", False),)),
        ('labels."example.com/team" = x', (), (("example.com/team", "x", True),)),
        (
            "labels.team = x AND state = STOPPED AND state != DELETED",
            ((S.STOPPED, True), (S.DELETED, False)),
            (("team", "x", True),),
        ),
    ],
)
def test_filter_parses(text: str, states: tuple[Any, ...], labels: tuple[Any, ...]) -> None:
    parsed = validation.workspace_filter(text)
    assert parsed.states == states
    assert parsed.labels == labels


@pytest.mark.parametrize(
    "text",
    [
        "state = NOPE",
        "state = UNSPECIFIED",
        "state = WORKSPACE_STATE_UNSPECIFIED",
        "name = x",
        "state",
        "state =",
        "= AVAILABLE",
        "state = AVAILABLE OR state = STOPPED",
        "state ~ AVAILABLE",
        'labels.team = "unterminated',
        "state = AVAILABLE AND",
        "AND",
        "state = AVAILABLE and state = STOPPED",
        "NOT state = AVAILABLE",
        "state = AVAILABLE state = STOPPED",
    ],
)
def test_filter_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.workspace_filter(text)
    assert caught.value.field == "filter"
