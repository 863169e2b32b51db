"""What must hold of disk moves (MoveWorkspace, engine/moves.py) in the simulation, checked
against each simulated node's disk (runtime/sim/disks.py), which the mover reaches in process:

- a move that copies records, at its start, the files its source holds (a STOPPED workspace's
  files do not change while it moves); when it SUCCEEDS, the workspace and its volumes are on
  the target in that same commit, and the target holds exactly those files, digest for digest;
- a move that FAILS (or a delete cancels) leaves the workspace on its source with every one
  of those files as it was;
- an instance runs only on its workspace's storage node;
- once every fault has ended and the system settled, no node but a workspace's storage node
  holds a file of it, nor a partial copy of one (a move's leftovers are deleted)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..domain.model import CommandKind, CommandState, Workspace, WorkspaceState
from ..domain.moves import StoredFile
from ..runtime.sim.disks import SimDisk
from ..runtime.sim.simulator import SimNode
from ..store.base import Changes, Reader
from . import invariants


@dataclass(frozen=True)
class Copying:
    """A move that copies: from where to where, and what the source held at its start."""

    workspace_id: str
    source: str
    target: str
    volume_ids: tuple[str, ...]
    files: dict[str, StoredFile]


def _volumes(workspace: Workspace) -> tuple[str, ...]:
    return tuple(b.volume_id for b in workspace.bindings)


@dataclass
class MoveWatch:
    """Fed every commit's changes (published, or withheld by a crash and read at the restart),
    right after the commit: before any node acts on it."""

    disks: Mapping[str, SimDisk]
    copying: dict[str, Copying] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    broken: list[str] = field(default_factory=list)
    # Moves that ended, by outcome (the run's summary).
    succeeded: int = 0
    copied: int = 0
    failed: int = 0

    def observe(self, changes: Changes) -> None:
        for key, command in changes.commands.items():
            if command.kind is not CommandKind.MOVE or key in self.ended:
                continue
            workspace = changes.workspaces.get(command.workspace_id)
            if command.state is CommandState.RUNNING:
                if key not in self.copying and workspace is not None and workspace.storage_node:
                    source = workspace.storage_node
                    disk = self.disks.get(source)
                    volumes = _volumes(workspace)
                    files = disk.holds(workspace.id, volumes) if disk is not None else {}
                    self.copying[key] = Copying(workspace.id, source, command.target_node, volumes, files)
            elif command.terminal:
                self.ended.add(key)
                self._ended(command.id, command.state, command.target_node, workspace, self.copying.pop(key, None))

    def _ended(
        self, command_id: str, state: CommandState, target: str, workspace: Workspace | None, copy: Copying | None
    ) -> None:
        where = workspace.storage_node if workspace is not None else None
        if state is CommandState.SUCCEEDED:
            self.succeeded += 1
            if workspace is None:
                self.broken.append(f"move {command_id} succeeded without its workspace's switch in the same commit")
            elif where != target:
                self.broken.append(f"move {command_id} succeeded but {workspace.id} is on {where}, not on {target}")
            if copy is None:
                return
            self.copied += 1
            disk = self.disks.get(target)
            held = disk.holds(copy.workspace_id, copy.volume_ids) if disk is not None else {}
            if held != copy.files:
                self.broken.append(
                    f"move {command_id} of {copy.workspace_id} succeeded but {target} holds {_names(held)}, "
                    f"not the {_names(copy.files)} {copy.source} held"
                )
            return
        self.failed += 1
        if copy is None:
            return
        if workspace is not None and where != copy.source:
            self.broken.append(f"move {command_id} failed but {copy.workspace_id} is on {where}, not {copy.source}")
        disk = self.disks.get(copy.source)
        held = disk.holds(copy.workspace_id, copy.volume_ids) if disk is not None else {}
        if held != copy.files:
            self.broken.append(
                f"move {command_id} of {copy.workspace_id} failed and {copy.source} holds {_names(held)}, "
                f"not the {_names(copy.files)} it held before"
            )


def _names(files: Mapping[str, StoredFile]) -> str:
    return "[" + ", ".join(f"{n}:{f.digest.hex()[:8]}" for n, f in sorted(files.items())) + "]"


def check_running(reader: Reader, runtimes: Mapping[str, SimNode]) -> list[str]:
    """Every running guest runs on its workspace's storage node."""
    broken = []
    for node_id, runtime in runtimes.items():
        for vm in runtime.vms.values():
            if not vm.alive:
                continue
            workspace = reader.get_workspace(vm.workspace_id)
            if workspace is not None and workspace.storage_node and workspace.storage_node != node_id:
                broken.append(f"{workspace.id} runs on {node_id} but its disks are on {workspace.storage_node}")
    return broken


def check_leftovers(reader: Reader, disks: Mapping[str, SimDisk]) -> list[str]:
    """Settled, with no fault left: a live workspace's files are on its storage node only."""
    broken = []
    for workspace in invariants.all_workspaces(reader):
        if workspace.deleted or workspace.state in (WorkspaceState.DELETING, WorkspaceState.DELETED):
            continue
        if not workspace.storage_node or workspace.active_kind is CommandKind.MOVE:
            continue
        volumes = _volumes(workspace)
        for node_id, disk in sorted(disks.items()):
            if node_id == workspace.storage_node:
                continue
            held = disk.holds(workspace.id, volumes)
            partial = disk.partial_of(workspace.id, volumes)
            if held or partial:
                broken.append(
                    f"{node_id} still holds {sorted(held)} and partial copies {partial} of {workspace.id}, "
                    f"whose disks are on {workspace.storage_node}"
                )
    return broken
