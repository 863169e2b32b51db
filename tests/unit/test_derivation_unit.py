"""Unit tests of the status derivation: visible-state predicates and cleanup status.

The expected tables are written from /work/shared/spec/lifecycle.md ("How status is
derived", cleanup status), not copied from the modules under test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kibo_ctrl.domain import cleanup, status
from kibo_ctrl.domain.model import (
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
from kibo_ctrl.domain.model import CommandKind as Op
from kibo_ctrl.domain.model import WorkspaceState as S
from kibo_ctrl.domain.status import StatusFacts

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
