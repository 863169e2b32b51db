"""An operator's `kibo node forget NODE`: a SILENT node declared lost for good.

What ran there is gone with its host: each instance it held is folded as the node would
have reported it (engine/controller.py's folds): a launch not done yet is placed again
elsewhere, a stop in progress ends (UNCONFIRMED), a running instance's VMM is gone (the
workspace FAILED, to start directly), and every one is then released, which also ends a
delete. The disks kept there (writable layers, volumes) are lost with it: the node is not
forgotten while any workspace keeps disks there, unless the operator abandons them, and
then those workspaces and volumes are free to start elsewhere with empty ones (an event says
so on each). The node's record stays, marked forgotten: it may never join again under its
ID, so nothing it still holds comes back into the cluster. Never done by the system itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..domain.errors import Conflict, NotFound
from ..domain.model import CommandKind, EventType, Phase, StopDurability, Volume, Workspace
from ..domain.nodes import NodeRecord
from ..domain.reports import Destroyed, LaunchFailed, Stopped, VmmExited
from ..store.base import Tx
from . import controller
from .steps import event, save

_NOT_LAUNCHED = frozenset({Phase.PENDING, Phase.SCHEDULED, Phase.PROVISIONING, Phase.LAUNCHING})


@dataclass
class Forgotten:
    node: NodeRecord
    released: list[str] = field(default_factory=list)
    abandoned_workspaces: list[str] = field(default_factory=list)
    abandoned_volumes: list[str] = field(default_factory=list)


def _disks_on(tx: Tx, node_id: str, owners: set[str]) -> tuple[list[Workspace], list[Volume]]:
    """The workspaces (of the node's instances, and the STOPPED ones) and their volumes whose
    disks are on the node."""
    found: dict[str, Workspace] = {}
    for workspace_id in owners:
        workspace = tx.get_workspace(workspace_id)
        if workspace is not None and not workspace.deleted and workspace.storage_node == node_id:
            found[workspace.id] = workspace
    for workspace in tx.stopped_workspaces():
        if workspace.storage_node == node_id:
            found[workspace.id] = workspace
    volumes: dict[str, Volume] = {}
    for workspace in found.values():
        for binding in workspace.bindings:
            volume = tx.get_volume(binding.volume_id)
            if volume is not None and volume.storage_node == node_id:
                volumes[volume.id] = volume
    return list(found.values()), list(volumes.values())


def forget(tx: Tx, node_id: str, abandon_disks: bool) -> Forgotten:
    record = tx.get_node(node_id)
    if record is None:
        raise NotFound(f"no node {node_id}", field="node_id")
    if record.forgotten:
        return Forgotten(record)
    if not record.silent:
        raise Conflict(
            f"node {node_id} is alive (its lease holds): forget is for a node that is gone",
            field="node_id",
            hint=f"to empty a live node: kibo node drain {node_id} --move-stopped",
        )
    instances = tx.node_instances(node_id)
    workspaces, volumes = _disks_on(tx, node_id, {i.workspace_id for i in instances})
    if (workspaces or volumes) and not abandon_disks:
        raise Conflict(
            f"{len(workspaces)} workspaces and {len(volumes)} volumes keep their disks on node {node_id}: "
            "forgetting it loses that data",
            field="abandon_disks",
            hint=f"if the node is gone for good: kibo node forget {node_id} --abandon-disks "
            "(those workspaces start elsewhere with empty disks)",
        )
    done = Forgotten(record)
    message = f"node {node_id} was forgotten by an operator: its host, and what ran there, are lost"
    for instance in instances:
        workspace = tx.get_workspace(instance.workspace_id)
        current = workspace is not None and workspace.instance_id == instance.id
        kind = workspace.active_kind if workspace is not None and current else None
        if kind in (CommandKind.CREATE, CommandKind.START) and instance.phase in _NOT_LAUNCHED:
            # Never ran there: placed again, as a node with no room would have it.
            controller.apply(tx, LaunchFailed(instance.id, message=message, no_room="node lost"))
            done.released.append(instance.workspace_id)
            continue
        if kind in (CommandKind.STOP, CommandKind.FORCE_STOP):
            controller.apply(tx, Stopped(instance.id, durability=StopDurability.UNCONFIRMED))
        elif instance.phase not in (Phase.STOPPED, Phase.RELEASED, Phase.FAILED, Phase.EXITED):
            controller.apply(tx, VmmExited(instance.id, detail=message))
        controller.apply(tx, Destroyed(instance.id))
        done.released.append(instance.workspace_id)
    for workspace in workspaces:
        fresh = tx.get_workspace(workspace.id)
        if fresh is None or fresh.storage_node != node_id:
            continue
        fresh.storage_node = None
        event(tx, fresh, EventType.STORAGE_RELEASED, message=f"its disks were on node {node_id}, forgotten: lost")
        save(tx, fresh, None)
        done.abandoned_workspaces.append(fresh.id)
    for volume in volumes:
        volume.storage_node = None
        tx.put_volume(volume)
        done.abandoned_volumes.append(volume.id)
    # Copies moves left there, still to delete, go with the node (no one can delete them now).
    for workspace in tx.storage_pending():
        stale = [c for c in workspace.stale_copies if c.node == node_id]
        if stale:
            workspace.stale_copies = [c for c in workspace.stale_copies if c.node != node_id]
            save(tx, workspace, None)
    record = tx.get_node(node_id) or record
    record.forgotten = record.silent = record.cordoned = True
    record.draining = False
    record.data_plane_address = record.data_plane_token = ""
    tx.put_node(record)
    done.node = record
    return done
