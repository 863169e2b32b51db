"""The scheduler: binds each unscheduled instance to a node with room (filter, then score)."""

from __future__ import annotations

import asyncio
import logging

from ..domain.model import Component, EventType, Phase
from ..domain.nodes import NodeRecord
from ..store.base import Changes, Store, Tx
from . import steps
from .hub import Wakeup
from .steps import event, save

log = logging.getLogger(__name__)


def schedule_pending(tx: Tx) -> int:
    """One pass over the unscheduled instances; returns how many are still waiting. Only
    nodes that are ready (alive, not cordoned), carry the workspace's node selector in their
    labels and have room take new instances."""
    pending = tx.unscheduled_instances()
    if not pending:
        return 0
    nodes = [record for record in tx.list_nodes() if record.ready]
    usage = {node.id: tx.node_usage(node.id) for node in nodes}
    waiting = 0
    for instance in pending:
        workspace = tx.get_workspace(instance.workspace_id)
        if workspace is None or workspace.instance_id != instance.id:
            continue
        selected = [node for node in nodes if selects(workspace.node_selector, node)]
        fits = [
            node
            for node in selected
            if usage[node.id][0] + instance.vcpus <= node.vcpus
            and usage[node.id][1] + instance.memory_mib <= node.memory_mib
        ]
        if not fits:
            waiting += 1
            reason = _unschedulable(instance.vcpus, instance.memory_mib, workspace.node_selector, bool(selected))
            if instance.reason != reason:
                instance.reason = reason
                event(tx, workspace, EventType.UNSCHEDULABLE, message=reason)
                save(tx, workspace, instance)
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
    return waiting


def selects(selector: dict[str, str], node: NodeRecord) -> bool:
    """Whether the node's labels include every key and value of the selector."""
    return all(node.labels.get(key) == value for key, value in selector.items())


def _unschedulable(vcpus: int, memory_mib: int, selector: dict[str, str], any_selected: bool) -> str:
    if selector and not any_selected:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return f"unschedulable: no ready node has the labels {wanted}"
    return f"unschedulable: no ready node has {vcpus} vCPU and {memory_mib} MiB free"


class Scheduler:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._wakeup = Wakeup()
        self._waiting = 0

    def nodes_changed(self) -> None:
        """A node joined, returned, fell silent or was cordoned: instances waiting may fit."""
        if self._waiting:
            self._wakeup.set()

    def on_changes(self, changes: Changes) -> None:
        for instance in changes.instances.values():
            # New work, or (when some wait for room) any change that may free capacity.
            if self._waiting or (instance.node_id is None and instance.phase is Phase.PENDING):
                self._wakeup.set()
                return

    async def run(self) -> None:
        self._wakeup.set()
        while True:
            await self._wakeup.wait()
            try:
                self._waiting = await self._store.transact(schedule_pending)
            except Exception:
                log.exception("scheduling pass failed; retrying")
                await asyncio.sleep(1)
                self._wakeup.set()
