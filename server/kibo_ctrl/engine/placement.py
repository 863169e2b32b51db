"""Placement: binds each unscheduled instance to a node with room (filter, then score), in
the caller's transaction. The scheduler's loop (scheduler.py) runs it when there is work;
a create or start runs it at once when its instance is the only one waiting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..domain.model import Component, EventType, Instance, Phase, Volume, Workspace
from ..domain.nodes import NodeRecord, storage_room
from ..store.base import Reader, Tx
from . import steps
from .steps import event, save

__all__ = ["Backlog", "Wants", "place_if_first", "schedule_pending", "selects"]

# Nodes named in an UNSCHEDULABLE reason, with what each lacks.
MAX_NAMED = 4


class Wants(NamedTuple):
    """Where a workspace may run: the labels its node must carry, and the node its disks are
    on (None: not placed yet, any node of the selector). Neither changes while it waits."""

    selector: dict[str, str]
    pin: str | None
    # The storage its launch makes new on the node's disk, GiB: its writable layer and
    # volumes not made yet (the disk's room for it is the node's to have: DiskStatus).
    need_gib: int = 0


@dataclass
class Backlog:
    """What a pass left waiting, for the next: where each waiting instance's workspace may
    run (its selector and the node its disks are on: neither changes while it waits, so the
    next pass need not read the workspace of an instance that still waits for the same
    reason, under load most of a pass), their sizes, and the capacity of each node that was
    ready."""

    selectors: dict[str, Wants] = field(default_factory=dict)
    sizes: set[tuple[int, int]] = field(default_factory=set)
    capacity: dict[str, tuple[int, int]] = field(default_factory=dict)

    def room(self, reader: Reader) -> bool:
        """Whether a node that was ready now has room for some waiting size (a cheap read of
        the reservation sums; a selector may still rule the node out, which costs a pass)."""
        for node_id, (vcpus, memory_mib) in self.capacity.items():
            used_vcpus, used_memory = reader.node_usage(node_id)
            if any(v <= vcpus - used_vcpus and m <= memory_mib - used_memory for v, m in self.sizes):
                return True
        return False


def place_if_first(tx: Tx, workspace: Workspace) -> None:
    """Place the workspace's new instance in its command's own transaction, when no other
    instance waits before it (one transaction and a wake-up of the scheduler fewer on the
    path of every create and start; the scheduler places whatever this leaves waiting). Only
    for a store with one writer: another replica's scheduler would race this placement."""
    if workspace.instance_id and not tx.unscheduled_besides(workspace.instance_id):
        schedule_pending(tx, owners={workspace.id: workspace})


def schedule_pending(tx: Tx, backlog: Backlog | None = None, owners: dict[str, Workspace] | None = None) -> int:
    """One pass over the unscheduled instances; returns how many are still waiting. Only
    nodes that are ready (alive, not cordoned), carry the workspace's node selector in their
    labels and have room take new instances. The pass leaves its `backlog` (Backlog).
    `owners`: workspace records the caller holds (and goes on using), by ID."""
    left = Backlog() if backlog is None else backlog
    mine = owners or {}
    known, sizes = left.selectors, set()
    pending = tx.unscheduled_instances()
    members = {record.id: record for record in tx.list_nodes()} if pending else {}
    nodes = [record for record in members.values() if record.ready]
    usage = {node.id: tx.node_usage(node.id) for node in nodes}
    waiting: dict[str, Wants] = {}
    for instance in pending:
        workspace: Workspace | None = None
        volumes: list[Volume] = []
        wants = known.get(instance.workspace_id)
        conflict = ""
        if wants is None:
            workspace = _owner(tx, instance, mine)
            if workspace is None:
                continue
            volumes = _volumes(tx, workspace)
            pins = sorted({pin for pin in (workspace.storage_node, *(v.storage_node for v in volumes)) if pin})
            if len(pins) > 1:
                conflict = f"unschedulable: its disks are on several nodes ({', '.join(pins)})"
            wants = Wants(workspace.node_selector, pins[0] if pins else None, _new_storage(workspace, volumes))
        selector = wants.selector
        selected = [node for node in nodes if selects(selector, node) and wants.pin in (None, node.id)]
        short = {node.id: _shortfall(node, usage[node.id], instance, wants.need_gib) for node in selected}
        fits = [node for node in selected if not short[node.id]]
        if conflict or not fits:
            reason = conflict or _unschedulable(instance.vcpus, instance.memory_mib, wants, selected, members, short)
            if instance.reason != reason:
                workspace = _owner(tx, instance, mine) if workspace is None else workspace
                if workspace is None:
                    continue
                instance.reason = reason
                event(tx, workspace, EventType.UNSCHEDULABLE, message=reason)
                save(tx, workspace, instance)
            waiting[instance.workspace_id] = wants
            sizes.add((instance.vcpus, instance.memory_mib))
            continue
        if workspace is None:
            workspace = _owner(tx, instance, mine)
            if workspace is None:
                continue
            volumes = _volumes(tx, workspace)

        def free_share(node: NodeRecord) -> float:
            cpu, memory = usage[node.id]
            return min((node.vcpus - cpu) / node.vcpus, (node.memory_mib - memory) / node.memory_mib)

        # Score: the most free share left (spread); ties go to the first node by ID.
        node = max(fits, key=free_share)
        cpu, memory = usage[node.id]
        usage[node.id] = (cpu + instance.vcpus, memory + instance.memory_mib)
        instance.node_id = node.id
        instance.phase = Phase.SCHEDULED
        instance.holds = [Component.RESERVATION]
        instance.reason = ""
        workspace.node_id = node.id
        # Its disks are made on this node's disk at its first launch: it runs here from now on.
        workspace.storage_node = workspace.storage_node or node.id
        for volume in volumes:
            if volume.storage_node is None:
                volume.storage_node = node.id
                tx.put_volume(volume)
        steps.mark_running(tx, workspace)
        event(tx, workspace, EventType.SCHEDULED, message=f"scheduled on {node.id}")
        save(tx, workspace, instance)
    left.selectors, left.sizes = waiting, sizes
    left.capacity = {node.id: (node.vcpus, node.memory_mib) for node in nodes}
    return len(waiting)


def _owner(tx: Tx, instance: Instance, owners: dict[str, Workspace]) -> Workspace | None:
    """The instance's workspace, if the instance is still its current one."""
    workspace = owners.get(instance.workspace_id) or tx.get_workspace(instance.workspace_id)
    return None if workspace is None or workspace.instance_id != instance.id else workspace


def _new_storage(workspace: Workspace, volumes: list[Volume]) -> int:
    """GiB its launch makes new on a node's disk: the writable layer until its first
    placement, and each volume not placed yet."""
    layer = workspace.resources.writable_layer_gib if workspace.storage_node is None else 0
    return layer + sum(volume.capacity_gib for volume in volumes if volume.storage_node is None)


def _shortfall(node: NodeRecord, used: tuple[int, int], instance: Instance, need_gib: int) -> str:
    """What the node lacks for the instance now ("": nothing): vCPU, memory, or room on its
    disk (DiskStatus as it reported it: under its reserve, or its storage all promised)."""
    short = [
        what
        for what, lacking in (
            ("vCPU", used[0] + instance.vcpus > node.vcpus),
            ("memory", used[1] + instance.memory_mib > node.memory_mib),
        )
        if lacking
    ]
    disk = storage_room(node, need_gib)
    if short:
        return f"node {node.id} is short of {' and '.join(short)}" + (f"; {disk}" if disk else "")
    return disk


def _volumes(tx: Tx, workspace: Workspace) -> list[Volume]:
    """The records of the volumes bound to the workspace."""
    found = (tx.get_volume(binding.volume_id) for binding in workspace.bindings)
    return [volume for volume in found if volume is not None]


def selects(selector: dict[str, str], node: NodeRecord) -> bool:
    """Whether the node's labels include every key and value of the selector."""
    return all(node.labels.get(key) == value for key, value in selector.items())


def _unschedulable(
    vcpus: int,
    memory_mib: int,
    wants: Wants,
    selected: list[NodeRecord],
    members: dict[str, NodeRecord],
    short: dict[str, str],
) -> str:
    pin = wants.pin
    if pin is not None:
        held = f"its disks are on node {pin}"
        record = members.get(pin)
        if record is None:
            return f"unschedulable: {held}, which is no longer a member; it starts there if {pin} joins again"
        if not record.ready:
            why = "silent (its lease ran out)" if record.silent else "draining" if record.draining else "cordoned"
            return f"unschedulable: {held}, which is {why}; it starts there once {pin} is ready"
        if not selects(wants.selector, record):
            wanted = ",".join(f"{k}={v}" for k, v in sorted(wants.selector.items()))
            return f"unschedulable: {held}, which lacks the labels {wanted}"
        return f"unschedulable: {held}, which does not have room: {short.get(pin) or 'it is not ready'}"
    if wants.selector and not selected:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(wants.selector.items()))
        return f"unschedulable: no ready node has the labels {wanted}"
    storage = f" and {wants.need_gib} GiB of new storage" if wants.need_gib else ""
    reason = f"unschedulable: no ready node has {vcpus} vCPU, {memory_mib} MiB{storage} free"
    # Which resource each node lacks (a few named; the reason is stored, and told once).
    lacking = [short[node.id] for node in selected if short.get(node.id)]
    if lacking:
        more = f"; {len(lacking) - MAX_NAMED} more" if len(lacking) > MAX_NAMED else ""
        reason += ": " + "; ".join(lacking[:MAX_NAMED]) + more
    return reason
