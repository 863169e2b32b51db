"""The scheduler: binds each unscheduled instance to a node with room (filter, then score)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from ..domain.errors import StoreError
from ..domain.model import Component, EventType, Instance, Phase, Workspace
from ..domain.nodes import NodeRecord
from ..store.base import Changes, Reader, Store, Tx
from . import steps
from .hub import Wakeup
from .steps import event, save

log = logging.getLogger(__name__)

# After a failed pass: the first pause, and the longest (how late placement may resume once
# the store takes writes again).
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 8.0


@dataclass
class Backlog:
    """What a pass left waiting, for the next: the node selector of each waiting instance's
    workspace (a selector never changes: the next pass need not read the workspace of an
    instance that still waits for the same reason, under load most of a pass), their sizes,
    and the capacity of each node that was ready."""

    selectors: dict[str, dict[str, str]] = field(default_factory=dict)
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


def schedule_pending(tx: Tx, backlog: Backlog | None = None) -> int:
    """One pass over the unscheduled instances; returns how many are still waiting. Only
    nodes that are ready (alive, not cordoned), carry the workspace's node selector in their
    labels and have room take new instances. The pass leaves its `backlog` (Backlog)."""
    left = Backlog() if backlog is None else backlog
    known, sizes = left.selectors, set()
    pending = tx.unscheduled_instances()
    nodes = [record for record in tx.list_nodes() if record.ready] if pending else []
    usage = {node.id: tx.node_usage(node.id) for node in nodes}
    waiting: dict[str, dict[str, str]] = {}
    for instance in pending:
        workspace: Workspace | None = None
        selector = known.get(instance.workspace_id)
        if selector is None:
            workspace = _owner(tx, instance)
            if workspace is None:
                continue
            selector = workspace.node_selector
        selected = [node for node in nodes if selects(selector, node)]
        fits = [
            node
            for node in selected
            if usage[node.id][0] + instance.vcpus <= node.vcpus
            and usage[node.id][1] + instance.memory_mib <= node.memory_mib
        ]
        if not fits:
            reason = _unschedulable(instance.vcpus, instance.memory_mib, selector, bool(selected))
            if instance.reason != reason:
                workspace = _owner(tx, instance) if workspace is None else workspace
                if workspace is None:
                    continue
                instance.reason = reason
                event(tx, workspace, EventType.UNSCHEDULABLE, message=reason)
                save(tx, workspace, instance)
            waiting[instance.workspace_id] = selector
            sizes.add((instance.vcpus, instance.memory_mib))
            continue
        workspace = _owner(tx, instance) if workspace is None else workspace
        if workspace is None:
            continue

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
        steps.mark_running(tx, workspace)
        event(tx, workspace, EventType.SCHEDULED, message=f"scheduled on {node.id}")
        save(tx, workspace, instance)
    left.selectors, left.sizes = waiting, sizes
    left.capacity = {node.id: (node.vcpus, node.memory_mib) for node in nodes}
    return len(waiting)


def _owner(tx: Tx, instance: Instance) -> Workspace | None:
    """The instance's workspace, if the instance is still its current one."""
    workspace = tx.get_workspace(instance.workspace_id)
    return None if workspace is None or workspace.instance_id != instance.id else workspace


def selects(selector: dict[str, str], node: NodeRecord) -> bool:
    """Whether the node's labels include every key and value of the selector."""
    return all(node.labels.get(key) == value for key, value in selector.items())


def _unschedulable(vcpus: int, memory_mib: int, selector: dict[str, str], any_selected: bool) -> str:
    if selector and not any_selected:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return f"unschedulable: no ready node has the labels {wanted}"
    return f"unschedulable: no ready node has {vcpus} vCPU and {memory_mib} MiB free"


class Scheduler:
    """Runs a pass when there is new work, or when a node may take more (it joined, returned,
    grew or was uncordoned) while instances wait. A released reservation may make room too:
    then a read of the nodes' reservation sums comes first, and the pass only if a waiting
    size fits somewhere. Under load most releases free too little, and a pass reads every
    waiting instance, where the read is one row per node."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._wakeup = Wakeup()
        self._waiting = 0
        self._backlog = Backlog()
        # Since the current pass (or check) began, which its snapshot may not show: a pass is
        # due (new work, a node with more room), or a reservation may have been released.
        self._due = True
        self._released = False
        self._retry_s = RETRY_FIRST_S

    def room_on_nodes(self) -> None:
        """A node joined, returned, grew or was uncordoned: instances waiting may fit."""
        self._due = True
        if self._waiting:
            self._wakeup.set()

    def on_changes(self, changes: Changes) -> None:
        for instance in changes.instances.values():
            if instance.node_id is None:
                if instance.phase is Phase.PENDING:
                    self._due = True  # new work
                    self._wakeup.set()
            elif not instance.reserved:
                self._released = True
        if self._released and self._waiting:
            self._wakeup.set()

    async def run(self) -> None:
        self._wakeup.set()
        while True:
            await self._wakeup.wait()
            # A change published from here on may come after the snapshot read next: it sets
            # the flags again. One published before is in the snapshot.
            if not self._due:
                if not (self._released and self._waiting):
                    continue
                self._released = False
                try:
                    room = await self._store.read(self._backlog.room)
                except Exception as error:
                    await self._failed("reading the nodes' room", error)
                    continue
                if not room:
                    continue
            self._due = self._released = False
            try:
                self._waiting = await self._store.transact(schedule_pending, self._backlog)
            except Exception as error:
                await self._failed("a scheduling pass", error)
                continue
            self._retry_s = RETRY_FIRST_S
            if self._waiting and (self._due or self._released):
                self._wakeup.set()

    async def _failed(self, what: str, error: Exception) -> None:
        """Try the pass again after a pause that doubles while the store stays unavailable
        (a full disk may last minutes: a pass a second would each fail at its first write)."""
        if isinstance(error, StoreError) and error.unavailable is not None:
            log.warning("%s failed (%s); retrying in %g s", what, error.unavailable, self._retry_s)
        else:
            log.exception("%s failed; retrying in %g s", what, self._retry_s)
        self._due = True
        await asyncio.sleep(self._retry_s)
        self._retry_s = min(2 * self._retry_s, RETRY_MAX_S)
        self._wakeup.set()
