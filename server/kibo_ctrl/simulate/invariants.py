"""What must hold after every step, read from the store as it is on disk.

Transitions are data: TRANSITIONS lists, for each visible state, the states the lifecycle
(spec/lifecycle.md, domain/rules.py) lets it become in one stored change."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ..domain.model import Command, Desired, Instance, Node, Workspace
from ..domain.model import WorkspaceState as S
from ..store.base import Reader, WorkspaceQuery

TENANTS = ("default", "other")

TRANSITIONS: Mapping[S, frozenset[S]] = {
    S.UNSPECIFIED: frozenset({S.CREATING}),
    # Created: running, failed, deleted while creating, node silent.
    S.CREATING: frozenset({S.AVAILABLE, S.FAILED, S.DELETING, S.DELETED, S.UNKNOWN}),
    S.AVAILABLE: frozenset({S.STOPPING, S.STOPPED, S.FAILED, S.UNKNOWN, S.DELETING, S.DELETED}),
    # A graceful stop whose sync failed leaves the instance running (AVAILABLE).
    S.STOPPING: frozenset({S.STOPPED, S.AVAILABLE, S.FAILED, S.UNKNOWN, S.DELETING, S.DELETED}),
    S.STOPPED: frozenset({S.STARTING, S.DELETING, S.DELETED}),
    S.STARTING: frozenset({S.AVAILABLE, S.FAILED, S.UNKNOWN, S.DELETING, S.DELETED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPING, S.STOPPED, S.UNKNOWN, S.DELETING, S.DELETED}),
    S.UNKNOWN: frozenset({S.CREATING, S.AVAILABLE, S.STOPPING, S.STOPPED, S.STARTING, S.FAILED, S.DELETING, S.DELETED}),
    S.DELETING: frozenset({S.DELETED, S.FAILED, S.UNKNOWN}),
    S.DELETED: frozenset(),
}


@dataclass
class Seen:
    """What the checker has read so far, to compare the next read against."""

    last_event_seq: dict[str, int] = field(default_factory=dict)
    last_state: dict[str, S] = field(default_factory=dict)
    version: dict[str, int] = field(default_factory=dict)
    # The states each workspace's events went through since the current watch began.
    event_states: dict[str, list[S]] = field(default_factory=dict)


def all_workspaces(reader: Reader) -> list[Workspace]:
    found: list[Workspace] = []
    for tenant in TENANTS:
        after = 0
        while True:
            page = reader.scan_workspaces(WorkspaceQuery(tenant, after, include_deleted=True), 500, 500)
            found.extend(listed.record() for listed in page.workspaces)
            if page.exhausted:
                break
            after = page.last_seq
    return found


def check_store(
    reader: Reader,
    nodes: list[Node],
    seen: Seen,
    acknowledged: Mapping[tuple[str, str], Command],
    only: Collection[str] | None,
) -> list[str]:
    """The invariants over the workspaces in `only` (all when None), every node's
    reservations, and the `acknowledged` commands."""
    broken: list[str] = []
    if only is None:
        workspaces = all_workspaces(reader)
    else:
        workspaces = [w for i in sorted(only) if (w := reader.get_workspace(i)) is not None]
    for workspace in workspaces:
        broken.extend(_events(reader, workspace, seen))
        if workspace.version < seen.version.get(workspace.id, 0):
            broken.append(f"{workspace.id}: version went back from {seen.version[workspace.id]} to {workspace.version}")
        seen.version[workspace.id] = workspace.version
        instances = reader.list_instances(workspace.id)
        broken.extend(_exposures(workspace, instances))
        holding = [i.id for i in instances if i.holds]
        if len(holding) > 1:
            broken.append(f"{workspace.id}: {len(holding)} instances hold parts at once: {holding}")
        if workspace.state is S.DELETED:
            # The delete finished with the current instance's release: no instance that has
            # no step left to take may hold a part of a node (a leak nothing would undo).
            for instance in instances:
                if instance.holds and instance.step == instance.done_step:
                    broken.append(
                        f"{workspace.id} is DELETED but instance {instance.id}, with no step left, holds "
                        f"{[h.name for h in instance.holds]} (phase {instance.phase.name})"
                    )
    for node in nodes:
        vcpus, memory = reader.node_usage(node.id)
        # A reserved instance is active (store/sqlite.py): the node's active ones are enough.
        reserved = [i for i in reader.node_instances(node.id) if i.reserved]
        want = (sum(i.vcpus for i in reserved), sum(i.memory_mib for i in reserved))
        if (vcpus, memory) != want:
            broken.append(f"{node.id}: node_usage {(vcpus, memory)} != reserved instances {want}")
        if want[0] > node.vcpus or want[1] > node.memory_mib:
            broken.append(f"{node.id}: reserved {want} exceeds capacity {(node.vcpus, node.memory_mib)}")
    for (tenant, command_id), command in acknowledged.items():
        stored = reader.get_command(tenant, command_id)
        if stored is None:
            broken.append(f"acknowledged command {tenant}/{command_id} is not in the store")
        elif (stored.workspace_id, stored.kind) != (command.workspace_id, command.kind):
            broken.append(f"acknowledged command {command_id} changed: {command} -> {stored}")
    return broken


def _exposures(workspace: Workspace, instances: list[Instance]) -> list[str]:
    """No exposure outlives its execution: one that a request could use (expiry aside) is of
    the workspace's running instance; a stopped or deleted workspace keeps none at all."""
    broken: list[str] = []
    current = next((i for i in instances if i.id == workspace.instance_id), None)
    for exposure in workspace.valid_exposures(0.0):
        if current is None or current.generation != exposure.generation or current.desired is not Desired.RUNNING:
            broken.append(
                f"{workspace.id}: exposure {exposure.id} of generation {exposure.generation} outlives its execution "
                f"(instance {getattr(current, 'id', None)}, desired {getattr(current, 'desired', None)})"
            )
    if workspace.state in (S.STOPPED, S.DELETED) and workspace.exposures:
        broken.append(f"{workspace.id} is {workspace.state.name} and keeps {len(workspace.exposures)} exposures")
    return broken


def check_watch(seen: Seen, watched: Mapping[str, list[S]], only: Collection[str]) -> list[str]:
    """What a watcher of the hub saw of each workspace is the sequence its events record
    (consecutive repeats folded), since the watch began. Call only when every commit is
    published (Store.published_mark)."""
    broken = []
    for workspace_id in sorted(only):
        states = seen.event_states.get(workspace_id, [])
        got = watched.get(workspace_id, [])
        if got != states:
            names = [s.name for s in got]
            want = [s.name for s in states]
            broken.append(f"{workspace_id}: a watcher saw {names}, the events record {want}")
    return broken


def fold(states: list[S], state: S) -> None:
    """Append `state` unless it repeats the last one (a create's first event is recorded
    before the workspace has a state: UNSPECIFIED, which no snapshot shows)."""
    if state is not S.UNSPECIFIED and (not states or states[-1] is not state):
        states.append(state)


def _events(reader: Reader, workspace: Workspace, seen: Seen) -> list[str]:
    broken = []
    after = seen.last_event_seq.get(workspace.id, 0)
    state = seen.last_state.get(workspace.id, S.UNSPECIFIED)
    for event in reader.list_events(workspace.id, after, 100_000):
        if event.from_state is not state:
            broken.append(
                f"{workspace.id}: event {event.seq} ({event.type.name}) starts from {event.from_state.name}, "
                f"the previous event ended in {state.name}: a change was not recorded"
            )
        elif event.to_state is not state and event.to_state not in TRANSITIONS[state]:
            broken.append(f"{workspace.id}: event {event.seq}: {state.name} -> {event.to_state.name} is not allowed")
        state = event.to_state
        after = event.seq
        fold(seen.event_states.setdefault(workspace.id, []), state)
    seen.last_event_seq[workspace.id] = after
    seen.last_state[workspace.id] = state
    if state is not workspace.state:
        broken.append(f"{workspace.id}: is {workspace.state.name} but its last event says {state.name}")
    return broken


def check_cleaned(reader: Reader, workspace: Workspace) -> list[str]:
    """A DELETED workspace whose cleanup completed holds nothing."""
    broken = []
    for instance in reader.list_instances(workspace.id):
        if instance.holds or instance.step != instance.done_step:
            broken.append(
                f"{workspace.id} is DELETED but instance {instance.id} holds {[h.name for h in instance.holds]} "
                f"(step {instance.step}, done {instance.done_step}, phase {instance.phase.name})"
            )
    if workspace.storage.layer or workspace.storage.volume_ids:
        broken.append(f"{workspace.id} is DELETED but its storage is not released: {workspace.storage}")
    return broken


def check_silent(reader: Reader, due: Collection[str]) -> list[str]:
    """Each node in `due` (cut off for longer than its lease and the registry's slack, with
    the store writable and the control plane up all that time) is recorded silent, and each
    workspace whose current instance it holds shows its node silent (UNKNOWN)."""
    broken = []
    for node_id in due:
        record = reader.get_node(node_id)
        if record is None:
            continue  # cut off before it ever joined: nothing is placed on it
        if not record.silent:
            broken.append(f"node {node_id} is cut off past its lease but not recorded silent")
            continue
        for instance in reader.node_instances(node_id):
            workspace = reader.get_workspace(instance.workspace_id)
            if workspace is not None and workspace.instance_id == instance.id and not workspace.node_silent:
                broken.append(f"{workspace.id} runs on silent node {node_id} but does not show it silent")
    return broken
