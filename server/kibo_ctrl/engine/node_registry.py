"""The control plane's side of the node link: who has joined, their leases, and each
node's feed of work. Every transport of the link (engine/local_link.py in process,
api/node_api.py over gRPC) calls this, so they keep the same rules.

The feed is built from the hub's commits (level records, not edges) and numbered per node;
a recent stretch is kept so a node that reconnects continues after its cursor, and a node
whose cursor is too old or from another incarnation gets a snapshot read from the store.
Every call names the node it acts as (a node token is bound to one), and every report is
checked, in the transaction that folds it, against what that node owns: its instances, and
the storage and volumes whose release is routed to it. Anything else (another node's object
or an ID that does not exist) answers the same NOT_FOUND, and a refused call changes nothing.

What a node may claim at its join is the operator's policy (`NodePolicy`): at most
`max_vcpus` and `max_memory_mib` (a claim over them is refused, not clamped: a node that
declares more than it may is misconfigured or lying, and either way its operator should hear
it); and its storage pool is bound to it. A node keeps the pool of its first join (its
retained files are there), and a pool other than the shared ones (the control plane's own,
where every workspace and volume is made, and those the operator names) belongs to the first
node that declared it: another node cannot declare itself into a pool to be handed its
storage work.

Several replicas on one database (PostgreSQL) each have a registry; a node may join, renew
and report through any of them. Each registry learns the others' node records from the
commits its hub sees (`Changes.nodes`, through the store's change feed): pools, data-plane
hops, silence, and the stored lease of a node renewed elsewhere. Only the leader's `run()`
expires leases: a lease stored by another replica (`renewed_by`) counts until its stored
expiry, one stored here until the renewals seen here stop. A replica that sees a node's
renewals after a gap (the node came from another replica) stores the lease at once, so the
stored record always names the replica that sees the node now.

Stored leases are in the store's time (`Tx.now`: on PostgreSQL the database's clock, so
replicas on hosts whose clocks disagree compare the same figures); each registry turns them
into its own clock's with the offset it measures in its own transactions. A replica whose
clock is off by a minute neither expires a node another replica renews nor keeps a stopped
one alive for that minute."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..domain.clock import SYSTEM_CLOCK, Clock
from ..domain.errors import Conflict, InvalidArgument, NotFound, PermissionDenied, StoreError
from ..domain.model import Instance, Node, Workspace
from ..domain.nodes import DiskStatus, NodeRecord, labels, node_id
from ..domain.reports import Report, StorageReleased
from ..runtime.base import LaunchSpec
from ..store.base import Changes, Reader, Store, Tx
from . import controller
from .node_link import (
    MAX_BATCH_REPORTS,
    Batch,
    Cursor,
    Declaration,
    InstanceWork,
    Joined,
    StorageWork,
    VolumeWork,
    Work,
)

log = logging.getLogger(__name__)

# Items kept per node for a resume; a node further behind than this gets a snapshot.
FEED_LOG = 4096
# How often a live node's stored lease (nodes.lease_expiry) is written, in leases: the
# registry decides expiry from the renewals it sees (in memory), and the store keeps a
# lease that outlasts the next write, for a restart and for whoever else reads the store.
PERSIST_EVERY_LEASES = 1.0
# A node renews every quarter lease; a pause longer than this fraction of one (it renewed
# through another replica meanwhile, or reconnected) makes the next renewal here store the lease.
RENEWAL_GAP_LEASES = 0.5


class _Feed:
    def __init__(self) -> None:
        self.seq = 0
        self.log: deque[tuple[int, Work]] = deque(maxlen=FEED_LOG)
        self.wake = asyncio.Event()

    def append(self, item: Work) -> None:
        self.seq += 1
        self.log.append((self.seq, item))
        wake, self.wake = self.wake, asyncio.Event()
        wake.set()

    def continues(self, seq: int) -> bool:
        """Whether everything after `seq` is still here."""
        oldest = self.log[0][0] if self.log else self.seq + 1
        return oldest - 1 <= seq <= self.seq

    def after(self, seq: int) -> list[tuple[int, Work]]:
        return [entry for entry in self.log if entry[0] > seq]


@dataclass(frozen=True)
class NodePolicy:
    """What the operator lets a joining node claim (kibo-ctrl serve --node-max-vcpus,
    --node-max-memory-mib, --shared-storage-pool). The limits are the simulator's node's own
    defaults; the control plane's pool ("local") is shared by the nodes that declare it. The
    `embedded` nodes (in the control plane's process) offer what the operator configured for
    them: that is not a claim, and no limit applies to it."""

    max_vcpus: int = 4096
    max_memory_mib: int = 16 * 1024 * 1024
    shared_pools: frozenset[str] = field(default_factory=lambda: frozenset({"local"}))
    embedded: frozenset[str] = frozenset()

    def check_capacity(self, node: Node) -> None:
        """Refuse a claim over the limits (before any transaction: nothing is stored)."""
        if node.id in self.embedded:
            return
        if node.vcpus > self.max_vcpus:
            raise InvalidArgument(
                f"node {node.id} claims {node.vcpus} vCPUs; a node may claim at most {self.max_vcpus}",
                field="vcpus",
                hint="declare fewer (kibo-ctrl node --vcpus), or the operator raises kibo-ctrl serve --node-max-vcpus",
            )
        if node.memory_mib > self.max_memory_mib:
            raise InvalidArgument(
                f"node {node.id} claims {node.memory_mib} MiB of memory; a node may claim at most "
                f"{self.max_memory_mib} MiB",
                field="memory_mib",
                hint="declare less (kibo-ctrl node --memory-mib), or the operator raises kibo-ctrl serve "
                "--node-max-memory-mib",
            )


def storage_owed(workspace: Workspace) -> bool:
    """A workspace whose retained layer or volumes some node must still delete."""
    return bool(workspace.storage.layer or workspace.storage.volume_ids)


class NodeRegistry:
    def __init__(
        self,
        store: Store,
        lease_seconds: float,
        clock: Clock = SYSTEM_CLOCK,
        persist_every_leases: float = PERSIST_EVERY_LEASES,
        policy: NodePolicy | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self.policy = policy or NodePolicy()
        self.lease_seconds = lease_seconds
        self.persist_s = persist_every_leases * lease_seconds
        # Names this incarnation's feed numbers: a cursor from another one means a snapshot.
        self.epoch = uuid.uuid4().hex[:16]
        # By node: when its lease runs out (wall time, from the renewals seen here), whether
        # it is recorded silent, and the lease expiry last stored. A node known from the
        # store gets a lease from this start (the time to reconnect after a restart).
        self._deadlines: dict[str, float] = {}
        self._silent: dict[str, bool] = {}
        self._stored: dict[str, float] = {}
        # The store's time minus this registry's clock, from its last transaction (0 where
        # they are one clock: SQLite, the simulation).
        self._offset = 0.0
        self._feeds: dict[str, _Feed] = {}
        self._pools: dict[str, str] = {}
        self._renewed: dict[str, float] = {}
        # node ID -> (address, secret) of its data-plane hop, as it declared at its last join.
        self._data_planes: dict[str, tuple[str, str]] = {}
        self._listeners: list[Callable[[], None]] = []
        # Where a store write failed (a full disk), the stretch it failed in: retried in the
        # next one, not at every pass. By node for leases; for the expiry check.
        self._lease_unstored: dict[str, int] = {}
        self._expiry_unstored: int | None = None
        # By node: what of its last record seen in a commit matters for placement.
        self._placements: dict[str, Placement] = {}
        # By node: its disk as stored (a renewal that tells a different one stores it).
        self._disks: dict[str, DiskStatus] = {}
        self._closed = asyncio.Event()

    async def load(self) -> None:
        """Learn the storage pools of the nodes that joined before (storage work is routed
        by pool from the first commit on, whoever has reconnected yet)."""
        await self._store.transact(self._measure)
        now = self._clock.now()
        for node in await self._store.read(lambda r: r.list_nodes()):
            # The stored lease, or one lease from this start (the time to reconnect).
            self._deadlines[node.id] = max(now + self.lease_seconds, node.lease_expiry - self._offset)
            self._stored[node.id] = node.lease_expiry
            self._placements[node.id] = _placement(node)
            self._learn(node)

    def _measure(self, tx: Tx) -> None:
        """Learn how far the store's time is from this registry's clock (called in each of
        its transactions; the commit's time and this read are a batch apart at most)."""
        self._offset = tx.now - self._clock.now()

    def _learn(self, node: NodeRecord) -> None:
        """What any replica may rely on from a stored node record."""
        self._silent[node.id] = node.silent
        self._pools[node.id] = node.storage_pool
        self._disks[node.id] = node.disk
        self._feeds.setdefault(node.id, _Feed())
        if node.data_plane_address:
            self._data_planes[node.id] = (node.data_plane_address, node.data_plane_token)
        else:
            self._data_planes.pop(node.id, None)

    def on_room(self, listener: Callable[[], None]) -> None:
        """Called, after the commit, when a node may take more than before: it joined or
        returned, was uncordoned, grew or changed its labels (the scheduler). A node falling
        silent or cordoned takes nothing new: that calls no one."""
        self._listeners.append(listener)

    def close(self) -> None:
        """End every feed (shutdown)."""
        self._closed.set()
        for feed in self._feeds.values():
            feed.wake.set()

    def data_plane_of(self, node_id: str) -> tuple[str, str] | None:
        """Where the node serves its guests to the control plane, and the secret it takes."""
        return self._data_planes.get(node_id)

    def report_age(self, node_id: str) -> float | None:
        last = self._renewed.get(node_id)
        return None if last is None else self._clock.monotonic() - last

    # -- joining and leases -------------------------------------------------------------------

    async def join(self, declaration: Declaration) -> Joined:
        node = declaration.node
        node_id(node.id)
        labels(declaration.labels)
        if node.vcpus <= 0 or node.memory_mib <= 0:
            raise InvalidArgument("a node declares at least 1 vCPU and 1 MiB of memory", field="vcpus")
        self.policy.check_capacity(node)
        if not node.storage_pool or len(node.storage_pool) > 63:
            raise InvalidArgument("a node declares a storage pool (1 to 63 characters)", field="storage_pool")
        if len(declaration.data_plane_address) > 255 or (
            bool(declaration.data_plane_address) and not 16 <= len(declaration.data_plane_token) <= 256
        ):
            raise InvalidArgument(
                "a data-plane address (up to 255 characters) comes with a secret of 16 to 256 characters",
                field="data_plane_token",
            )
        now = self._clock.now()
        returned = await self._store.transact(self._join, declaration, now)
        self._renewed_now(node.id, now)
        self._pools[node.id] = node.storage_pool
        self._feeds.setdefault(node.id, _Feed())
        self._renewed[node.id] = self._clock.monotonic()
        if declaration.data_plane_address:
            self._data_planes[node.id] = (declaration.data_plane_address, declaration.data_plane_token)
        else:
            self._data_planes.pop(node.id, None)
        log.info("node %s joined (%d vCPU, %d MiB, pool %s)", node.id, node.vcpus, node.memory_mib, node.storage_pool)
        if returned:
            log.info("node %s is back: its workspaces are no longer UNKNOWN", node.id)
        return Joined(node.id, self.lease_seconds)

    def _join(self, tx: Tx, declaration: Declaration, now: float) -> bool:
        node = declaration.node
        _not_forgotten(tx.get_node(node.id))
        self._check_pool(tx, node)
        record = tx.get_node(node.id) or NodeRecord(node.id, node.vcpus, node.memory_mib, node.storage_pool)
        record.vcpus, record.memory_mib, record.storage_pool = node.vcpus, node.memory_mib, node.storage_pool
        record.labels = dict(declaration.labels)
        record.resources, record.disk = declaration.resources, declaration.disk
        record.capabilities = sorted(declaration.capabilities)
        record.data_plane_address = declaration.data_plane_address
        record.data_plane_token = declaration.data_plane_token
        record.join_time = tx.now
        return self._renew_record(tx, record)

    def _check_pool(self, tx: Tx, node: Node) -> None:
        """A node keeps the pool of its first join; a new node may declare a shared pool or one
        no node holds. (Nodes that shared a pool before this rule keep it: only a node new to
        a pool is refused.)"""
        known = tx.get_node(node.id)
        if known is not None:
            if known.storage_pool != node.storage_pool:
                raise Conflict(
                    f"node {node.id} serves storage pool {known.storage_pool}, not {node.storage_pool[:63]}: "
                    "its retained files are there",
                    field="storage_pool",
                    hint=f"join with --storage-pool {known.storage_pool}, or as a new node ID",
                )
            return
        pool = node.storage_pool
        if pool not in self.policy.shared_pools and any(n.storage_pool == pool for n in tx.list_nodes()):
            raise Conflict(
                f"storage pool {pool} belongs to another node",
                field="storage_pool",
                hint=f"declare a pool of this node's own (--storage-pool), or the operator shares it "
                f"(kibo-ctrl serve --shared-storage-pool {pool})",
            )

    def stretch(self, now: float) -> int:
        """Which stretch of `persist_s` (counted from time 0) `now` is in."""
        return math.floor(now / self.persist_s)

    def stored_lease(self, now: float) -> float:
        """The lease stored for a renewal at `now`: the end of the current stretch of
        `persist_every_leases` (stretches counted from time 0), plus one lease. At least one
        lease from now and outlasting the next write, which is the first renewal of the next
        stretch; every renewal within a stretch stores the same value, so which of them
        writes it makes no difference (the simulator's warp relies on it, simulate/loop.py)."""
        return (self.stretch(now) + 1) * self.persist_s + self.lease_seconds

    def _renew_record(self, tx: Tx, record: NodeRecord) -> bool:
        """Store a lease that outlasts the next write; a silent node is back (its workspaces
        leave UNKNOWN). Stored lease times are the store's (`tx.now`), whoever compares them."""
        self._measure(tx)
        record.lease_expiry = self.stored_lease(tx.now)
        record.lease_seconds = self.lease_seconds
        record.renewed_by = self.epoch
        returned = record.silent
        if returned:
            record.silent = False
            controller.set_node_silent(tx, record.id, False)
        tx.put_node(record)
        return returned

    def _renewed_now(self, node: str, now: float) -> None:
        self._deadlines[node] = now + self.lease_seconds
        self._silent[node] = False
        self._stored[node] = self.stored_lease(now)
        self._renewed[node] = self._clock.monotonic()

    async def renew(self, node: str, disk: DiskStatus | None = None) -> None:
        """Keep the node's lease; `disk`, its disk now, is stored when it differs enough from
        the stored one to matter to the scheduler (DiskStatus.differs)."""
        if node not in self._deadlines and await self._store.read(lambda r: r.get_node(node)) is None:
            raise Conflict(f"node {node} has not joined: call Join first", field="node_id")
        now = self._clock.now()
        self._deadlines[node] = now + self.lease_seconds
        previous = self._renewed.get(node)
        self._renewed[node] = monotonic = self._clock.monotonic()
        continued = previous is not None and monotonic - previous <= RENEWAL_GAP_LEASES * self.lease_seconds
        silent = self._silent.get(node, True)
        new_disk = disk is not None and disk.differs(self._disks.get(node, DiskStatus()))
        if continued and not silent and not new_disk and self._stored.get(node) == self.stored_lease(now):
            return  # this stretch's lease is stored already: nothing to write
        if continued and not silent and not new_disk and self._lease_unstored.get(node) == self.stretch(now):
            return  # storing it failed in this stretch (a full disk): the next stretch tries again
        try:
            returned = await self._store.transact(self._renew, node, now, disk if new_disk else None)
        except StoreError as error:
            if silent:
                raise  # the node is back only once that is stored: the agent retries
            # The renewal counts (in memory); only its stored copy waits. Said once per outage.
            if node not in self._lease_unstored:
                log.warning("node %s: storing its lease failed (%s); retrying once a lease", node, error)
            self._lease_unstored[node] = self.stretch(now)
            return
        if self._lease_unstored.pop(node, None) is not None:
            log.info("node %s: its lease is stored again", node)
        self._renewed_now(node, now)
        if returned:
            log.info("node %s is back: its workspaces are no longer UNKNOWN", node)

    def _renew(self, tx: Tx, node: str, now: float, disk: DiskStatus | None = None) -> bool:
        record = tx.get_node(node)
        if record is None:
            raise Conflict(f"node {node} has not joined: call Join first", field="node_id")
        _not_forgotten(record)
        if disk is not None:
            if disk.pressure != record.disk.pressure:
                state = "under its disk reserve: no new storage there" if disk.pressure else "above its reserve again"
                log.warning("node %s is %s (%d MiB free)", node, state, disk.free_bytes >> 20)
            record.disk = disk
        return self._renew_record(tx, record)

    async def run(self) -> None:
        """Mark the nodes whose lease ran out silent (their workspaces UNKNOWN)."""
        while not self._closed.is_set():
            await asyncio.sleep(self.lease_seconds / 4)
            now = self._clock.now()
            lapsed = sorted(n for n, d in self._deadlines.items() if d < now and not self._silent.get(n))
            if not lapsed or self._expiry_unstored == self.stretch(now):
                continue
            try:
                expired, held = await self._store.transact(self._expire, lapsed, now)
            except StoreError as error:
                # E.g. a full disk: the lapsed nodes stay not silent here, so a later pass
                # tries again, once a lease (not at every pass); said once per outage.
                if self._expiry_unstored is None:
                    log.warning("recording expired node leases failed (%s); retrying once a lease", error)
                self._expiry_unstored = self.stretch(now)
                continue
            if self._expiry_unstored is not None:
                log.info("expired node leases are recorded again")
                self._expiry_unstored = None
            for node, expiry in held.items():
                # Renewed through another replica: its stored lease holds until then.
                self._deadlines[node] = max(self._deadlines.get(node, 0.0), expiry)
            for node in expired:
                # A renewal that arrived meanwhile wins: it is recorded back at its next write.
                self._silent[node] = True
                log.warning("node %s: its lease ran out; its workspaces are UNKNOWN", node)

    def _expire(self, tx: Tx, nodes: list[str], now: float) -> tuple[list[str], dict[str, float]]:
        """Make silent the nodes whose lease ran out; and the stored leases (by node) of those
        another replica renewed, which still hold."""
        self._measure(tx)
        expired = []
        held: dict[str, float] = {}
        for node in nodes:
            record = tx.get_node(node)
            if record is None or record.silent:
                continue
            if record.renewed_by != self.epoch and record.lease_expiry >= tx.now:
                held[node] = record.lease_expiry - self._offset
                continue
            record.silent = True
            tx.put_node(record)
            controller.set_node_silent(tx, record.id, True)
            expired.append(record.id)
        return expired, held

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    # -- operators ----------------------------------------------------------------------------

    async def list_nodes(self) -> list[tuple[NodeRecord, int, tuple[int, int]]]:
        """Every node, with how many instances it still holds or owes work for, and the
        vCPUs and memory its instances reserve."""

        def read(reader: Reader) -> list[tuple[NodeRecord, int, tuple[int, int]]]:
            return [(n, len(reader.node_instances(n.id)), reader.node_usage(n.id)) for n in reader.list_nodes()]

        return await self._store.read(read)

    async def cordon(self, node: str, cordoned: bool, drain: bool = False) -> NodeRecord:
        """Cordon (no new placements), uncordon (also ends a drain), or drain (cordon, and
        shown DRAINING until its last instance is gone)."""

        def change(tx: Tx) -> NodeRecord:
            record = tx.get_node(node)
            if record is None:
                raise NotFound(f"no node {node}", field="node_id")
            record.cordoned = cordoned or drain
            record.draining = drain
            tx.put_node(record)
            return record

        return await self._store.transact(change)

    # -- the feed -----------------------------------------------------------------------------

    def on_changes(self, changes: Changes) -> None:
        """Hub listener: learn the nodes recorded (here or through another replica), and route
        each commit's records to the feeds of the nodes they concern."""
        room = False
        for record in changes.nodes.values():
            # A renewal that only moved the stored lease, a rejoin that changed nothing and a
            # node falling silent give no room: the scheduler is not woken for them.
            placement = _placement(record)
            room = room or _more_room(self._placements.get(record.id), placement)
            self._placements[record.id] = placement
            self._learn(record)
            if record.renewed_by != self.epoch:
                # Renewed through another replica (or another incarnation): its stored lease.
                self._deadlines[record.id] = max(
                    self._deadlines.get(record.id, 0.0), record.lease_expiry - self._offset
                )
        if room:
            self._changed()
        for instance in changes.instances.values():
            feed = self._feeds.get(instance.node_id or "")
            if feed is not None:
                feed.append(InstanceWork(instance))
        for workspace in changes.workspaces.values():
            if storage_owed(workspace):
                owner = self._storage_owner(workspace.storage_pool, _files_on(workspace))
                if owner is not None:
                    item = StorageWork(workspace.id, tuple(workspace.storage.volume_ids))
                    self._feeds[owner].append(item)
        for volume in changes.volumes.values():
            if volume.storage_pending:
                owner = self._storage_owner(volume.storage_pool, volume.storage_node)
                if owner is not None:
                    self._feeds[owner].append(VolumeWork(volume.id))

    def _storage_owner(self, pool: str, files_on: str | None) -> str | None:
        """The node that deletes files of `pool` (`_holder`), from the nodes seen here: where
        the work is routed. The reports are checked against the same rule in the store."""
        return _holder(pool, files_on, {n: p for n, p in self._pools.items() if n in self._feeds})

    def _feed(self, node: str) -> _Feed:
        feed = self._feeds.get(node)
        if feed is None:
            raise Conflict(f"node {node} has not joined: call Join first", field="node_id")
        return feed

    async def feed(self, node: str, cursor: Cursor | None) -> AsyncIterator[Batch]:
        feed = self._feed(node)
        if self._closed.is_set():
            return
        if cursor is not None and cursor.epoch == self.epoch and feed.continues(cursor.seq):
            at = cursor.seq
        else:
            # Mark first, then read: a commit published after the mark is in the log as well
            # as (maybe) in the snapshot, which is harmless (levels); none falls in between.
            at = feed.seq
            items = await self._store.read(self._snapshot, node)
            yield Batch(tuple(items), Cursor(self.epoch, at), snapshot=True)
        while not self._closed.is_set():
            wake = feed.wake
            if not feed.continues(at):
                # Fell further behind than the log reaches (a very slow reader): start over.
                at = feed.seq
                items = await self._store.read(self._snapshot, node)
                yield Batch(tuple(items), Cursor(self.epoch, at), snapshot=True)
                continue
            entries = feed.after(at)
            if entries:
                at = entries[-1][0]
                yield Batch(tuple(item for _, item in entries), Cursor(self.epoch, at))
                continue
            await wake.wait()

    def _snapshot(self, reader: Reader, node: str) -> list[Work]:
        items: list[Work] = [InstanceWork(i) for i in reader.node_instances(node)]
        for workspace in reader.storage_pending():
            if storage_owed(workspace) and self._storage_owner(workspace.storage_pool, _files_on(workspace)) == node:
                items.append(StorageWork(workspace.id, tuple(workspace.storage.volume_ids)))
        for volume in reader.volumes_storage_pending():
            if self._storage_owner(volume.storage_pool, volume.storage_node) == node:
                items.append(VolumeWork(volume.id))
        return items

    # -- what a node asks and tells -----------------------------------------------------------

    async def launch_spec(self, node: str, instance_id: str, step: int) -> LaunchSpec:
        def read(reader: Reader) -> LaunchSpec:
            instance = _own_instance(reader, node, instance_id)
            if step != instance.step:
                raise Conflict(f"step {step} of {instance_id} was superseded by step {instance.step}", field="step")
            workspace = reader.get_workspace(instance.workspace_id)
            if workspace is None:
                raise NotFound(f"instance {instance_id} has no workspace any more", field="instance_id")
            volumes = tuple(v for b in workspace.bindings if (v := reader.get_volume(b.volume_id)) is not None)
            return LaunchSpec(
                instance=instance,
                resources=workspace.resources,
                bindings=tuple(workspace.bindings),
                volumes=volumes,
                network_policy=workspace.network_policy,
            )

        self._feed(node)
        return await self._store.read(read)

    async def report(self, node: str, report: Report) -> None:
        self._feed(node)
        await self._store.transact(_apply_report, node, report)

    async def report_batch(self, node: str, reports: Sequence[Report]) -> None:
        """Reports folded in order in one transaction: all or none (one refused, none is)."""
        if not reports or len(reports) > MAX_BATCH_REPORTS:
            raise InvalidArgument(f"a batch holds 1 to {MAX_BATCH_REPORTS} reports", field="reports")
        self._feed(node)

        def apply(tx: Tx) -> None:
            for report in reports:
                _apply_report(tx, node, report)

        await self._store.transact(apply)

    async def storage_released(self, node: str, report: StorageReleased) -> None:
        self._feed(node)
        if report.pool_lost:
            raise InvalidArgument(
                "a node reports deleted files; only an operator declares a pool lost", field="pool_lost"
            )

        def apply(tx: Tx) -> None:
            workspace = tx.get_workspace(report.workspace_id)
            # Another node's (or no) workspace: one answer, so a node learns nothing of others'.
            if workspace is None or _storage_holder(tx, workspace.storage_pool, _files_on(workspace)) != node:
                raise NotFound(f"node {node} holds no storage of workspace {report.workspace_id}", field="workspace_id")
            if not storage_owed(workspace):
                return  # released already: a repeated report
            controller.apply_storage(tx, report)

        await self._store.transact(apply)

    async def volume_released(self, node: str, volume_id: str) -> None:
        self._feed(node)

        def apply(tx: Tx) -> None:
            volume = tx.get_volume(volume_id)
            # Another node's (or no) volume: one answer, so a node learns nothing of others'.
            if volume is None or _storage_holder(tx, volume.storage_pool, volume.storage_node) != node:
                raise NotFound(f"node {node} holds no volume {volume_id}", field="volume_id")
            if not volume.storage_pending:
                return  # released already: a repeated report
            controller.apply_volume_released(tx, volume_id)

        await self._store.transact(apply)


Placement = tuple[bool, int, int, dict[str, str], int, bool, int]


def _placement(record: NodeRecord) -> Placement:
    """What of a node record the scheduler looks at (not its stored lease, nor when it joined):
    readiness, capacity, labels, and its disk (the storage it offers, pressure, promised)."""
    disk = record.disk
    return (
        record.ready,
        record.vcpus,
        record.memory_mib,
        record.labels,
        record.resources.storage_gib,
        disk.pressure,
        disk.promised_bytes,
    )


def _more_room(before: Placement | None, after: Placement) -> bool:
    """Whether the node may take an instance it could not take before."""
    ready, vcpus, memory_mib, labels, storage_gib, pressure, promised = after
    if before is None or not before[0]:
        return ready
    disk = storage_gib > before[4] or (before[5] and not pressure) or promised < before[6]
    return ready and (vcpus > before[1] or memory_mib > before[2] or labels != before[3] or disk)


def _own_instance(reader: Reader, node: str, instance_id: str) -> Instance:
    """The node's own instance. Another node's and one that does not exist get the same
    NOT_FOUND (records are never deleted, so the node's own always exists): a node learns
    nothing of what other nodes run."""
    instance = reader.get_instance(instance_id)
    if instance is None or instance.node_id != node:
        raise NotFound(f"node {node} has no instance {instance_id}", field="instance_id")
    return instance


def _holder(pool: str, files_on: str | None, pools: Mapping[str, str]) -> str | None:
    """The one node that deletes files of `pool`, given each node's pool: the node they are on
    (`files_on`: the node whose disk holds them, or that the workspace ran on) when it serves
    that pool, else the pool's first node by ID (files never written anywhere)."""
    if files_on is not None and pools.get(files_on) == pool:
        return files_on
    return min((n for n, p in pools.items() if p == pool), default=None)


def _files_on(workspace: Workspace) -> str | None:
    return workspace.storage_node or workspace.node_id


def _storage_holder(reader: Reader, pool: str, files_on: str | None) -> str | None:
    """`_holder`, read in the caller's transaction: what a node's release report is checked
    against (the feed routes the work by the same rule, from the commits it sees)."""
    return _holder(pool, files_on, {n.id: n.storage_pool for n in reader.list_nodes()})


def _apply_report(tx: Tx, node: str, report: Report) -> None:
    instance = _own_instance(tx, node, report.instance_id)
    if report.step is not None and report.step > instance.step:
        raise InvalidArgument(
            f"step {report.step} of {report.instance_id} was never asked (its step is {instance.step})", field="step"
        )
    controller.apply(tx, report)


def _not_forgotten(record: NodeRecord | None) -> None:
    """A node an operator declared lost (engine/lost_nodes.py) never comes back under its ID."""
    if record is not None and record.forgotten:
        raise PermissionDenied(
            f"node {record.id} was forgotten by an operator (declared lost): it may not join again",
            hint="wipe its data dir (what it holds was given up) and join it as a new node, with a new node ID",
        )
