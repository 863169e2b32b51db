"""Cleanup status: which parts of a workspace's execution are released. Read-only.

Unknown parts are never shown as released: while the node is silent, a part it last
reported as held is UNKNOWN. Where the runtime can look at the machine itself (the process
runtime), `with_observation` puts what it sees now over what the store remembers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .model import (
    EXECUTION_PARTS,
    CleanupCompleteness,
    CleanupSource,
    CleanupState,
    CommandKind,
    Component,
    ComponentStatus,
    Instance,
    Workspace,
    WorkspaceState,
)


@dataclass(frozen=True)
class ComponentRow:
    component: Component
    status: ComponentStatus
    source: CleanupSource
    observe_time: float | None


@dataclass(frozen=True)
class Cleanup:
    state: CleanupState
    completeness: CleanupCompleteness
    components: tuple[ComponentRow, ...]
    # Present only while release is unfinished.
    pending_since: float | None
    last_confirmed_time: float | None


_RELEASING = frozenset({CommandKind.STOP, CommandKind.FORCE_STOP, CommandKind.DELETE})


def derive(workspace: Workspace, instance: Instance | None, now: float) -> Cleanup:
    rows: list[ComponentRow] = []
    observed = instance.observe_time if instance is not None else None
    never_reported = instance is not None and instance.node_id is not None and observed is None
    # A step the node has not reported on may have taken or released any part.
    in_flight = instance is not None and instance.step != instance.done_step
    for part in EXECUTION_PARTS:
        if instance is None or instance.node_id is None:
            rows.append(
                ComponentRow(part, ComponentStatus.RELEASED, CleanupSource.CONTROL_PLANE, workspace.update_time)
            )
        elif workspace.node_silent and (part in instance.holds or never_reported or in_flight):
            # A silent node may hold any part it did not report released: unknown, never released.
            rows.append(ComponentRow(part, ComponentStatus.UNKNOWN, CleanupSource.NODE_REPORT, observed))
        elif part in instance.holds:
            rows.append(ComponentRow(part, ComponentStatus.PRESENT, CleanupSource.NODE_REPORT, observed))
        else:
            rows.append(ComponentRow(part, ComponentStatus.RELEASED, CleanupSource.NODE_REPORT, observed))
    rows.extend(_storage_rows(workspace))
    return _summarize(
        workspace,
        rows,
        never_heard=never_reported and workspace.node_silent,
        confirmed=observed,
        since=observed or workspace.update_time,
    )


def with_observation(
    workspace: Workspace, derived: Cleanup, observed: Mapping[Component, bool] | None, now: float
) -> Cleanup:
    """`derived` corrected by what the machine shows now (True: present, False: gone). Parts
    not observed keep their derived status; the overall state follows the same rules."""
    if not observed:
        return derived
    rows = [
        ComponentRow(
            r.component,
            ComponentStatus.PRESENT if observed[r.component] else ComponentStatus.RELEASED,
            CleanupSource.NODE_REPORT,
            now,
        )
        if r.component in observed
        else r
        for r in derived.components
    ]
    return _summarize(
        workspace,
        rows,
        never_heard=derived.completeness is CleanupCompleteness.UNKNOWN,
        confirmed=now,
        since=derived.pending_since or now,
    )


def _summarize(
    workspace: Workspace, rows: list[ComponentRow], *, never_heard: bool, confirmed: float | None, since: float
) -> Cleanup:
    """The overall state and completeness of the rows. `never_heard`: nothing was ever heard
    of the node's parts; `confirmed`: when they were last seen; `since`: the fallback start
    of an unfinished release."""
    unknown = [r for r in rows if r.status is ComponentStatus.UNKNOWN]
    if never_heard and unknown:
        completeness = CleanupCompleteness.UNKNOWN
    elif unknown:
        completeness = CleanupCompleteness.PARTIAL
    else:
        completeness = CleanupCompleteness.COMPLETE

    # Held parts are expected while the execution is meant to run.
    expected_running = not (
        workspace.failure is not None
        or workspace.state in (WorkspaceState.FAILED, WorkspaceState.STOPPED)
        or workspace.owed_stop is not None
        or workspace.deletion_started
        or workspace.active_kind in _RELEASING
    )
    to_release = [
        r
        for r in rows
        if r.status is not ComponentStatus.RELEASED
        and (not expected_running or r.component in (Component.RETAINED_LAYER, Component.VOLUME_DELETION))
        and not (r.component in (Component.RETAINED_LAYER, Component.VOLUME_DELETION) and not workspace.deleted)
    ]
    releasing = workspace.active_kind in _RELEASING or workspace.owed_stop is not None or workspace.deleted
    if completeness is CleanupCompleteness.UNKNOWN:
        state = CleanupState.UNKNOWN
    elif to_release and releasing:
        state = CleanupState.PROCESSING
    elif unknown:
        # Nothing unknown may be reported as complete.
        state = CleanupState.UNKNOWN
    elif not to_release:
        state = CleanupState.COMPLETE
    else:
        state = CleanupState.NEEDS_ATTENTION
    unfinished = bool(to_release)
    pending_since = workspace.release_pending_since or workspace.storage.since or since
    return Cleanup(
        state=state,
        completeness=completeness,
        components=tuple(rows),
        pending_since=pending_since if unfinished else None,
        last_confirmed_time=confirmed if unfinished else None,
    )


def _storage_rows(workspace: Workspace) -> list[ComponentRow]:
    """The retained layer and the volumes that go with the workspace: kept until delete."""
    rows = []
    going = [b.volume_id for b in workspace.bindings if b.delete_with_workspace]
    for component, still_pending in (
        (Component.RETAINED_LAYER, workspace.storage.layer),
        (Component.VOLUME_DELETION, bool(workspace.storage.volume_ids)),
    ):
        if component is Component.VOLUME_DELETION and not going:
            continue
        if not workspace.deleted:
            rows.append(
                ComponentRow(component, ComponentStatus.PRESENT, CleanupSource.CONTROL_PLANE, workspace.update_time)
            )
        elif still_pending:
            rows.append(
                ComponentRow(component, ComponentStatus.PENDING, CleanupSource.CONTROL_PLANE, workspace.update_time)
            )
        else:
            rows.append(
                ComponentRow(component, ComponentStatus.RELEASED, CleanupSource.NODE_REPORT, workspace.update_time)
            )
    return rows
