"""The simulated runtime: instances are records in memory, faults are injected.

One SimBoard holds the faults armed for the whole simulated cluster; each SimNode is the
runtime of one node agent. Sim workspaces survive a restart: a new SimNode adopts what
the store says its node holds. Each SimNode keeps its files on a SimDisk (disks.py), which
outlives it as a data directory does; `SimStorage` is that disk as the leader's mover asks
it (engine/moves.py StorageLink), in the same process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from ...domain.model import (
    EXECUTION_PARTS,
    Backend,
    Component,
    Instance,
    NetworkPolicy,
    Phase,
    StopDurability,
    VolumeState,
)
from ...domain.moves import MOVE_CAPABILITY, MoveRefused, NodeUnreachable, StoredFile
from ...domain.reports import ExitReason, GuestOomKill, GuestReset, GuestResponding, Report, VmmExited
from ..base import DestroyError, LaunchError, LaunchSpec, RestartError, SyncError
from .disks import SimDisk


class Fault(IntEnum):
    """Numbers equal kibo.sim.v1.Fault."""

    GUEST_REBOOT = 1
    GUEST_POWEROFF = 2
    VMM_CRASH = 3
    HOST_OOM = 4
    GUEST_HANG = 5
    SYNC_FAIL = 6
    STALL = 7
    UNSTALL = 8
    NODE_SILENT = 9
    NODE_BACK = 10
    CREATE_FAIL = 11
    CREATE_FAIL_HOLDING = 12
    DESTROY_FAIL = 13
    STORAGE_POOL_LOST = 14
    GUEST_OOM = 15


# The PIDs a simulated guest's OOM killer names (FAULT_GUEST_OOM) count up from here.
SIM_OOM_PID = 4000
# A block of a disk move costs this many of the node's steps (read on the source, written
# on the target): 0.1 virtual s at the simulation's 0.02 s step, slower on a slow node.
BLOCK_STEPS = 5

# Armed per workspace, consumed by the next operation they apply to.
ONE_SHOT = frozenset({Fault.SYNC_FAIL, Fault.STALL, Fault.CREATE_FAIL, Fault.CREATE_FAIL_HOLDING, Fault.DESTROY_FAIL})
# These may be armed for "the next workspace created" (empty workspace ID).
FOR_NEXT_CREATED = frozenset({Fault.STALL, Fault.CREATE_FAIL, Fault.CREATE_FAIL_HOLDING})
# These reach every workspace on the node (or its storage pool), whoever owns them: only an
# operator may inject them, never a tenant. (So does any fault for "the next workspace created".)
NODE_WIDE = frozenset({Fault.NODE_SILENT, Fault.NODE_BACK, Fault.STORAGE_POOL_LOST})


class SimError(Exception):
    """A fault that cannot apply now (e.g. no running instance to crash)."""


@dataclass
class SimVm:
    instance_id: str
    workspace_id: str
    alive: bool = True
    # False while the guest does not answer (hung; powered off under firecracker).
    responding: bool = True
    # The network policy its node enforces (at launch, then each live change).
    network: NetworkPolicy | None = None
    network_changes: int = 0


@dataclass
class SimBoard:
    """Faults armed across the simulated cluster."""

    armed: dict[str, set[Fault]] = field(default_factory=dict)
    next_created: set[Fault] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    unstall: dict[str, asyncio.Event] = field(default_factory=dict)

    def arm(self, workspace_id: str, fault: Fault) -> None:
        if not workspace_id:
            self.next_created.add(fault)
        else:
            self.armed.setdefault(workspace_id, set()).add(fault)

    def take(self, workspace_id: str, fault: Fault) -> bool:
        if workspace_id not in self.seen:
            # The first operation on a workspace inherits the faults armed for "next created".
            self.seen.add(workspace_id)
            if self.next_created:
                self.armed.setdefault(workspace_id, set()).update(self.next_created)
                self.next_created.clear()
        faults = self.armed.get(workspace_id)
        if faults and fault in faults:
            faults.discard(fault)
            return True
        return False


class SimNode:
    """The runtime of one simulated node."""

    def __init__(
        self,
        node_id: str,
        backend: Backend,
        step_s: float,
        board: SimBoard,
        disk: SimDisk | None = None,
        movable: bool = False,
    ) -> None:
        """`disk`: its files (a new, empty one by default; the simulation keeps each node's
        across restarts). `movable`: its disks can move (MOVE_CAPABILITY), which a node in the
        control plane's own process can (its mover reaches `storage`), a remote one not."""
        self.node_id = node_id
        self.backend = backend
        self.step_s = step_s
        self.board = board
        self.events: asyncio.Queue[Report] = asyncio.Queue()
        self.reachable = asyncio.Event()
        self.reachable.set()
        self.vms: dict[str, SimVm] = {}
        # Files on the node's storage pool: workspace layers and volumes.
        self.disk = disk if disk is not None else SimDisk()
        self.movable = movable
        self.storage = SimStorage(self)
        # Guests whose restart the node's own restart interrupted.
        self.interrupted: set[str] = set()
        # Processes its guests' OOM killers killed (FAULT_GUEST_OOM).
        self.oom_kills = 0

    def capabilities(self) -> list[str]:
        caps = ["workspace.stop.force", f"runtime.sim.{self.backend.value}"]
        if self.movable:
            caps.append(MOVE_CAPABILITY)
        if self.backend is Backend.KIBOVM:
            caps.append("workspace.stop.guest_shutdown")
        return caps

    def adopt(self, instances: list[Instance]) -> None:
        for instance in instances:
            if Component.INSTANCE in instance.holds:
                alive = instance.phase in (Phase.RUNNING, Phase.RESTARTING, Phase.STOPPING)
                self.vms[instance.id] = SimVm(instance.id, instance.workspace_id, alive=alive)
                if not self.disk.has(instance.workspace_id, "layer"):
                    self.disk.write_run(instance.workspace_id, "layer", instance.generation)
            if instance.phase is Phase.RESTARTING:
                self.interrupted.add(instance.id)

    async def _step(self, workspace_id: str) -> None:
        if self.board.take(workspace_id, Fault.STALL):
            event = self.board.unstall[workspace_id] = asyncio.Event()
            try:
                await event.wait()
            finally:
                # Also when a force stop or delete cancels the stalled step.
                if self.board.unstall.get(workspace_id) is event:
                    del self.board.unstall[workspace_id]
        await asyncio.sleep(self.step_s)

    async def launch(
        self, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
    ) -> tuple[str, ...]:
        instance = spec.instance
        workspace_id = instance.workspace_id
        await self._step(workspace_id)
        if self.board.take(workspace_id, Fault.CREATE_FAIL):
            raise LaunchError("simulated: the instance failed before it was built; it was destroyed")
        if self.board.take(workspace_id, Fault.CREATE_FAIL_HOLDING):
            raise LaunchError(
                "simulated: the instance failed before it was built, and destroying it failed too",
                holds=EXECUTION_PARTS,
            )
        created = tuple(v.id for v in spec.volumes if v.state is VolumeState.PENDING)
        # The images are made at a first launch here, and each run writes to them.
        for name in ["layer", *(f"volume/{v.id}" for v in spec.volumes)]:
            self.disk.write_run(workspace_id, name, instance.generation)
        await progress(Phase.LAUNCHING, created)
        await asyncio.sleep(self.step_s)
        self.vms[instance.id] = SimVm(instance.id, workspace_id, network=spec.network_policy)
        return created

    async def set_network_policy(self, instance_id: str, policy: NetworkPolicy) -> None:
        """A live policy change (runtime.base.NetworkControl): one step, on a VMM that runs."""
        await asyncio.sleep(self.step_s)
        vm = self.vms.get(instance_id)
        if vm is None or not vm.alive:
            raise SimError(f"simulated: {instance_id} has no running VMM to apply a network policy to")
        vm.network = policy
        vm.network_changes += 1

    async def restart(self, instance: Instance) -> None:
        await asyncio.sleep(self.step_s)
        if instance.id in self.interrupted:
            self.interrupted.discard(instance.id)
            raise RestartError("the node restarted while the guest was being restarted")
        if self.board.take(instance.workspace_id, Fault.CREATE_FAIL):
            raise RestartError("simulated: the new VMM for the reset guest failed to start")
        self.vms[instance.id] = SimVm(instance.id, instance.workspace_id)

    async def stop(self, instance: Instance, force: bool) -> StopDurability:
        await self._step(instance.workspace_id)
        if not force and self.board.take(instance.workspace_id, Fault.SYNC_FAIL):
            raise SyncError("simulated: the filesystem sync failed; the instance was not destroyed")
        vm = self.vms.get(instance.id)
        if not force and vm is not None and not (vm.alive and vm.responding):
            # Nobody in the guest can sync: a graceful stop cannot confirm the writes are on disk.
            why = "its VMM exited" if not vm.alive else "the guest does not answer"
            raise SyncError(f"the guest's writes could not be synced: {why}; the instance was not destroyed")
        self.vms.pop(instance.id, None)
        return StopDurability.UNCONFIRMED if force else StopDurability.CONFIRMED

    async def destroy(self, instance: Instance) -> None:
        await self._step(instance.workspace_id)
        if self.board.take(instance.workspace_id, Fault.DESTROY_FAIL):
            raise DestroyError("simulated: releasing the instance failed")
        self.vms.pop(instance.id, None)

    async def delete_storage(self, workspace_id: str, volume_ids: tuple[str, ...]) -> None:
        await asyncio.sleep(self.step_s)
        self.disk.delete(workspace_id, volume_ids)

    async def delete_volumes(self, volume_ids: tuple[str, ...]) -> None:
        await asyncio.sleep(self.step_s)
        self.disk.delete(None, volume_ids)

    def inject(self, workspace_id: str, instance_id: str | None, fault: Fault) -> None:
        """Apply a fault to a workspace whose current instance is on this node."""
        if fault is Fault.NODE_SILENT:
            self.reachable.clear()
            return
        if fault is Fault.NODE_BACK:
            self.reachable.set()
            return
        vm = self.vms.get(instance_id or "")
        if vm is None or not vm.alive:
            raise SimError(f"workspace {workspace_id} has no running VMM on {self.node_id}")
        if fault is Fault.GUEST_HANG or (fault is Fault.GUEST_POWEROFF and self.backend is Backend.FIRECRACKER):
            vm.responding = False
            self.events.put_nowait(GuestResponding(vm.instance_id, responding=False))
        elif fault is Fault.GUEST_REBOOT and self.backend is Backend.FIRECRACKER:
            vm.alive = False
            self.events.put_nowait(GuestReset(vm.instance_id))
        elif fault is Fault.GUEST_OOM:
            # The model of a process over the guest's memory: the guest's OOM killer kills it,
            # the VMM and the guest run on (as the process runtime does: supervisor.py).
            self.oom_kills += 1
            self.events.put_nowait(GuestOomKill(vm.instance_id, pid=SIM_OOM_PID + self.oom_kills, command="simulated"))
        else:
            reason = {
                Fault.GUEST_REBOOT: ExitReason.GUEST_RESET,
                Fault.GUEST_POWEROFF: ExitReason.GUEST_POWEROFF,
                Fault.VMM_CRASH: ExitReason.CRASH,
                Fault.HOST_OOM: ExitReason.HOST_OOM,
            }[fault]
            vm.alive = False
            # The simulator has VMMs (firecracker's, kibovm's); the generic words fit, save
            # that this one was an injected fault.
            detail = "the simulated VMM exited (an injected VMM_CRASH fault)" if fault is Fault.VMM_CRASH else ""
            self.events.put_nowait(VmmExited(vm.instance_id, reason=reason, detail=detail))


class SimStorage:
    """A simulated node's disk as the leader's mover asks it (engine/moves.py StorageLink),
    in the same process: the SimDisk's steps, each costing the node's virtual time, each
    failing with NodeUnreachable while the node is cut off (NODE_SILENT), and refusing the
    files of a workspace that has an instance on the node (only a STOPPED one's disks move)."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.node_id = node.node_id

    async def _cost(self, steps: float) -> None:
        """`steps` of the node's step time, a step at a time: a node made slow (or fast
        again: the simulation's calm at its end) takes its new pace at the next step, as a
        long copy on a real disk would (a whole write slept at a slow node's pace outlived
        the calm: seed 10014 found it)."""
        self._reachable()
        while steps > 0:
            await asyncio.sleep(self.node.step_s * min(steps, 1.0))
            steps -= 1.0
        self._reachable()

    def _reachable(self) -> None:
        if not self.node.reachable.is_set():
            raise NodeUnreachable(f"node {self.node_id} is cut off")

    def _idle(self, workspace_id: str) -> None:
        if any(vm.workspace_id == workspace_id for vm in self.node.vms.values()):
            raise MoveRefused(f"the disks of {workspace_id} are in use: only a STOPPED workspace's disks move")

    async def list_files(self, workspace_id: str, volume_ids: Sequence[str]) -> list[StoredFile]:
        await self._cost(1)
        files = self.node.disk.list_files(workspace_id, volume_ids)
        if files:
            self._idle(workspace_id)
        return files

    async def read(self, workspace_id: str, name: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
        await self._cost(1)
        self._idle(workspace_id)
        for block in self.node.disk.read(workspace_id, name, offset):
            await self._cost(BLOCK_STEPS)
            yield block

    async def received(self, workspace_id: str, file: StoredFile) -> int:
        await self._cost(1)
        return self.node.disk.received(workspace_id, file)

    async def write(self, workspace_id: str, file: StoredFile, blocks: Sequence[tuple[int, bytes]]) -> int:
        await self._cost(1 + BLOCK_STEPS * sum(1 for _, data in blocks if data))
        return self.node.disk.write(workspace_id, file, blocks)

    async def finish(self, workspace_id: str, files: Sequence[StoredFile]) -> None:
        await self._cost(1)
        self.node.disk.finish(workspace_id, files)

    async def drop(self, workspace_id: str, volume_ids: Sequence[str], received_only: bool) -> None:
        await self._cost(1)
        self.node.disk.drop(workspace_id, volume_ids, received_only)
