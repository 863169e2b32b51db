"""One incarnation of the control plane, wired as app.py wires it (without the servers):
the store, the hub, the service, the scheduler, the expiry loop, the node registry (leases),
the mover (disk moves, over each simulated node's in-process StorageLink), one node agent
(on an in-process link) and one simulated runtime per node. A crash drops it whole; the next
incarnation starts from what the store holds, as a restarted process does, and each node's
runtime from its disk (runtime/sim/disks.py), which the simulation keeps."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from ..domain.model import Backend, Node, Workspace
from ..domain.reports import StorageReleased
from ..engine import controller
from ..engine.expiry import ExpiryLoop
from ..engine.hub import Hub
from ..engine.local_link import LocalLink
from ..engine.moves import Mover, StorageLink
from ..engine.node_agent import NodeAgent
from ..engine.node_registry import NodeRegistry
from ..engine.scheduler import Scheduler
from ..engine.service import Quotas, Service, Settings
from ..runtime.sim.api import SimulatorApi
from ..runtime.sim.disks import SimDisk
from ..runtime.sim.simulator import SimBoard, SimNode
from .loop import LaggingClock, VirtualClock, VirtualTimeLoop, Warp, periodic_codes
from .store import LoopStore

STORAGE_POOL = "local"


@dataclass(frozen=True)
class Shape:
    """The simulated cluster."""

    nodes: int = 3
    node_vcpus: int = 8
    node_memory_mib: int = 16 * 1024
    step_s: float = 0.02
    node_timeout_s: float = 3.0
    backend: Backend = Backend.FIRECRACKER
    # Per tenant, workspaces not deleted (the engine's quota): the population stays bounded,
    # so a long run costs the same per step as a short one, and creates meet the quota.
    tenant_workspaces: int = 30


class ControlPlane:
    def __init__(
        self,
        store: LoopStore,
        shape: Shape,
        board: SimBoard,
        clock: VirtualClock,
        disks: dict[str, SimDisk] | None = None,
    ) -> None:
        self.store = store
        self.shape = shape
        self.board = board
        self.hub = Hub()
        store.subscribe(self.hub.publish)
        settings = Settings(
            storage_pool=STORAGE_POOL, quotas=Quotas(workspaces=shape.tenant_workspaces), place_at_command=True
        )
        self.service = Service(settings)
        self.nodes = [
            Node(f"node-{i + 1}", shape.node_vcpus, shape.node_memory_mib, storage_pool=STORAGE_POOL)
            for i in range(shape.nodes)
        ]
        disks = disks if disks is not None else {}
        # Each node's disk outlives this incarnation (a data directory): the caller keeps it.
        self.runtimes = {
            n.id: SimNode(n.id, shape.backend, shape.step_s, board, disks.setdefault(n.id, SimDisk()), movable=True)
            for n in self.nodes
        }
        self.sim_api = SimulatorApi(self._find_workspace, board, self.runtimes, self._pool_lost)
        # Its own clock, which a warp of the loop does not age (simulate/loop.py).
        self.registry = NodeRegistry(store, shape.node_timeout_s, LaggingClock(clock.loop))
        self.hub.listen(self.registry.on_changes)
        # As app.py: the pool's files are deleted by its first node; each agent on an
        # in-process link to the registry.
        self.agents = [
            NodeAgent(
                Node(n.id, n.vcpus, n.memory_mib, storage_pool=STORAGE_POOL if i == 0 else f"{STORAGE_POOL}-{n.id}"),
                self.runtimes[n.id],
                LocalLink(self.registry, n.id),
            )
            for i, n in enumerate(self.nodes)
        ]
        self.scheduler = Scheduler(store)
        self.registry.on_room(self.scheduler.room_on_nodes)
        self.expiry = ExpiryLoop(store, self.service, clock)
        # As app.py: the leader's mover, here over every node's in-process disk.
        self.mover = Mover(store, self._storage)
        for listener in (self.scheduler.on_changes, self.expiry.on_changes, self.mover.on_changes):
            self.hub.listen(listener)
        self.tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def boot(
        cls,
        path: Path,
        shape: Shape,
        board: SimBoard,
        clock: VirtualClock,
        warp: bool = True,
        disks: dict[str, SimDisk] | None = None,
    ) -> ControlPlane:
        store = await LoopStore.open_here(path, clock)
        plane = cls(store, shape, board, clock, disks)
        await plane.registry.load()
        loop = asyncio.get_running_loop()
        if isinstance(loop, VirtualTimeLoop):
            loop.enable_warp(plane.warp() if warp else None)
            # Every node's silence is decided again: a lease from this start, or the stored one.
            loop.unsettle()
        loops = [
            plane.scheduler.run(),
            plane.expiry.run(),
            plane.registry.run(),
            plane.mover.run(),
            *(a.run() for a in plane.agents),
        ]
        names = ["scheduler", "expiry", "registry", "mover", *(f"agent {a.node.id}" for a in plane.agents)]
        plane.tasks = [asyncio.create_task(loop, name=name) for loop, name in zip(loops, names, strict=True)]
        return plane

    def warp(self) -> Warp:
        """The loops that tick whatever happens (simulate/loop.py): the agents' lease renewals
        and the registry's expiry check, every quarter lease. The registry stores a lease
        per stretch of `persist_s` (NodeRegistry.stored_lease): a warp skips whole stretches,
        so the renewals that write fall at the same phase as without it."""
        lease = self.registry.lease_seconds
        period = lease / 4
        return Warp(
            periodic_codes([NodeAgent._renew_lease, NodeRegistry.run]),
            period_s=period,
            # A store write that failed is retried in the next stretch: a warp waits that long
            # after any other event (a full disk ending), so such a retry is never skipped.
            quiet_s=self.registry.persist_s + 1.5 * period,
            # A lease stored before a restart may hold a stretch longer than a lease.
            settle_s=lease + self.registry.persist_s + 2 * period,
            cycle_s=self.registry.persist_s,
        )

    def _storage(self, node_id: str) -> StorageLink | None:
        runtime = self.runtimes.get(node_id)
        return runtime.storage if runtime is not None else None

    def reachability(self) -> tuple[bool, ...]:
        return tuple(r.reachable.is_set() for r in self.runtimes.values())

    def dead_loops(self) -> list[str]:
        """Engine loops that ended (each runs forever): with the exception that ended them."""
        return [f"{t.get_name()}: {t.exception()!r}" for t in self.tasks if t.done() and not t.cancelled()]

    async def crash(self) -> None:
        """Stop at once: nothing more is published; the store's file stays as it is."""
        self.store.crashed = True
        # The loops first: a node agent's loop still running could start work after its stop.
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task
        for agent in self.agents:
            await agent.stop()
        await self.store.close()

    async def _find_workspace(self, workspace_id: str) -> Workspace | None:
        return await self.store.read(lambda r: r.get_workspace(workspace_id))

    async def _pool_lost(self, pool: str) -> None:
        # As app.py's: every workspace of the lost pool has its storage released.
        pending = await self.store.read(lambda r: r.storage_pending())
        for workspace in pending:
            if workspace.storage_pool == pool:
                await self.store.transact(controller.apply_storage, StorageReleased(workspace.id, pool_lost=True))
