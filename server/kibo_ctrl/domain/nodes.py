"""Nodes as the control plane records them: what a node declared when it joined, its lease,
and what an operator decided (cordon, drain). Records and rules only (the store keeps them,
engine/node_registry.py changes them).

The resource model (issue 26) is the same for every node, local or remote: what a node
offers is what its host has times an allocation ratio per resource (`allocatable`), chosen
for sandboxes (`AllocationRatios`). A node declares it at its join with what it was made
of (`NodeResources`), and reports its disk as it is now with each lease renewal
(`DiskStatus`): the scheduler places on those figures, and refuses up front what no node
could ever hold (`too_big`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import msgspec

from .errors import InvalidArgument
from .model import Node

# Node IDs are names an operator types (and a node token is bound to): like tenant names.
NODE_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
LABEL_KEY = re.compile(r"[a-z0-9]([a-z0-9./-]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"[A-Za-z0-9._-]{0,63}")
MAX_LABELS = 32
GIB = 1 << 30


@dataclass(frozen=True)
class AllocationRatios:
    """How many times what the host has a node offers, per resource (kibo-ctrl serve and
    kibo-ctrl node --cpu-allocation-ratio, --memory-allocation-ratio, --disk-allocation-ratio).

    OpenStack Nova's scheduler defaults are 16.0 vCPUs per core, 1.5 x the memory and 1.0 x
    the disk (cpu_allocation_ratio, ram_allocation_ratio, disk_allocation_ratio; since Stein
    the initial_* ones a new host starts with are 4.0, 1.0, 1.0). kibo's defaults are for
    sandboxes, which idle most of the time (0.73 MiB per idle workspace, measured): CPU 16 x,
    as Nova's classic default (each workspace's vCPUs are a cgroup quota, a ceiling, not
    cores held); memory 1.5 x, as Nova's (a workspace's memory is its guest's limit: one
    process over it is killed inside the guest, and only the host running out takes the
    host-memory-exhaustion path); disk 10 x the size of the data dir's filesystem for the
    declared capacities of layers and volumes, which are sparse images that use what the
    guest writes (a default workspace declares 20 GiB and writes a few MiB). What keeps the
    disk safe is not the ratio but real usage: below its reserve of real free space a node
    takes no new storage (DiskStatus.pressure)."""

    cpu: float = 16.0
    memory: float = 1.5
    disk: float = 10.0


def allocatable(host: int, ratio: float) -> int:
    """What a node offers of a resource its host has `host` of: floor(host x ratio)."""
    return max(0, math.floor(host * ratio))


def capacity(
    host: tuple[int, int], ratios: AllocationRatios, vcpus: int = 0, memory_mib: int = 0
) -> tuple[int, int, NodeResources]:
    """A node's vCPUs and memory (MiB) from its host's (`host`) times the ratios, unless given
    explicitly (non-zero `vcpus`, `memory_mib`: its ratio is then recorded as 0), and what
    they were made of (its disk's figures are the runtime's: `with_disk`)."""
    host_vcpus, host_memory_mib = host
    offered_vcpus = vcpus or max(1, allocatable(host_vcpus, ratios.cpu))
    offered_memory = memory_mib or max(1, allocatable(host_memory_mib, ratios.memory))
    resources = NodeResources(
        host_vcpus=host_vcpus,
        host_memory_mib=host_memory_mib,
        cpu_ratio=0.0 if vcpus else ratios.cpu,
        memory_ratio=0.0 if memory_mib else ratios.memory,
    )
    return offered_vcpus, offered_memory, resources


class NodeResources(msgspec.Struct, frozen=True):
    """What a node's capacity was made of, as it declared at its join: what its host has,
    the ratios applied (0: the capacity was given explicitly), and the declared capacity of
    layers and volumes it takes in all (`storage_gib`; 0: not bounded, e.g. the simulator)."""

    host_vcpus: int = 0
    host_memory_mib: int = 0
    host_disk_gib: int = 0
    cpu_ratio: float = 0.0
    memory_ratio: float = 0.0
    disk_ratio: float = 0.0
    storage_gib: int = 0

    def with_disk(self, disk_gib: int, ratio: float, storage_gib: int) -> NodeResources:
        """The same, with the disk's figures: its size, the ratio and what it offers."""
        return msgspec.structs.replace(self, host_disk_gib=disk_gib, disk_ratio=ratio, storage_gib=storage_gib)


class DiskStatus(msgspec.Struct, frozen=True):
    """A node's disk as it reported it last: real free space, the reserve it keeps, the
    declared capacities of the layers and volumes on it, and whether it is under pressure
    (real free space below the reserve: it takes no new storage). All 0: not known."""

    free_bytes: int = 0
    reserve_bytes: int = 0
    promised_bytes: int = 0
    pressure: bool = False

    def differs(self, other: DiskStatus) -> bool:
        """Whether the change matters enough to be stored: pressure, what is promised, or
        free space by a GiB or more (free space moves with every guest write)."""
        return (
            self.pressure != other.pressure
            or self.promised_bytes != other.promised_bytes
            or self.reserve_bytes != other.reserve_bytes
            or abs(self.free_bytes - other.free_bytes) >= GIB
        )


class NodeRecord(msgspec.Struct):
    id: str
    vcpus: int
    memory_mib: int
    storage_pool: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    # What the node's runtime can do (GetCapabilities): as it declared at its last join.
    capabilities: list[str] = msgspec.field(default_factory=list)
    join_time: float = 0.0
    # Wall time until which the node is taken to be alive (renewed by the agent).
    lease_expiry: float = 0.0
    lease_seconds: float = 0.0
    # Which control-plane incarnation (its node registry's epoch) stored this lease: the one
    # that sees the node's renewals. Another replica (the leader) takes the stored lease as
    # the truth until it sees renewals itself.
    renewed_by: str = ""
    # Its lease ran out and its workspaces were made UNKNOWN (cleared when it renews).
    silent: bool = False
    # No new placements (an operator's kibo node cordon); draining implies cordoned.
    cordoned: bool = False
    draining: bool = False
    # Declared lost by an operator (kibo node forget): silent and cordoned for good; its ID
    # may not join again (its data dir holds what the cluster gave up).
    forgotten: bool = False
    # Where the node serves its guests' data plane (NodeGuestService), and the secret it
    # takes there (made by the node for its last join); empty: no data plane (the simulator).
    data_plane_address: str = ""
    data_plane_token: str = ""
    # What its capacity was made of (at its last join), and its disk as last reported.
    resources: NodeResources = msgspec.field(default_factory=NodeResources)
    disk: DiskStatus = msgspec.field(default_factory=DiskStatus)

    def node(self) -> Node:
        return Node(self.id, self.vcpus, self.memory_mib, self.storage_pool)

    @property
    def ready(self) -> bool:
        """May take new instances: alive and not cordoned. Alive: not silent, which the node
        registry decides from the lease (with a grace after a control-plane start, so a
        node is not dropped for the time the control plane itself was down)."""
        return not self.silent and not self.cordoned


def storage_room(record: NodeRecord, need_gib: int) -> str:
    """Why the node cannot take `need_gib` of new storage now ("": it can): its disk is under
    its reserve, or the declared capacities would pass what it offers."""
    if need_gib <= 0:
        return ""
    if record.disk.pressure:
        return f"node {record.id}'s disk is under its reserve (no new storage there)"
    offered = record.resources.storage_gib
    if offered and record.disk.promised_bytes + need_gib * GIB > offered * GIB:
        return f"node {record.id} has no room left in the {offered} GiB of storage it offers"
    return ""


def too_big(records: list[NodeRecord], vcpus: int, memory_mib: int, storage_gib: int) -> str:
    """Why no node among `records` could ever hold a workspace of this size, even empty
    ("": one could, or there is no node to tell: one may join). Compared with what each
    node offers in all, not what is free now (that is a wait, UNSCHEDULABLE)."""
    if not records:
        return ""

    def fits(record: NodeRecord) -> bool:
        offered = record.resources.storage_gib
        return vcpus <= record.vcpus and memory_mib <= record.memory_mib and (not offered or storage_gib <= offered)

    if any(fits(record) for record in records):
        return ""
    short = []
    most = max(records, key=lambda r: r.vcpus)
    if vcpus > most.vcpus:
        short.append(f"{vcpus} vCPU (the most a node offers is {most.vcpus}, {most.id})")
    most = max(records, key=lambda r: r.memory_mib)
    if memory_mib > most.memory_mib:
        short.append(f"{memory_mib} MiB of memory (the most a node offers is {most.memory_mib} MiB, {most.id})")
    bounded = [r for r in records if r.resources.storage_gib]
    if bounded and len(bounded) == len(records):
        most = max(bounded, key=lambda r: r.resources.storage_gib)
        if storage_gib > most.resources.storage_gib:
            short.append(
                f"{storage_gib} GiB of storage (the most a node offers is {most.resources.storage_gib} GiB, {most.id})"
            )
    if not short:
        short.append(f"{vcpus} vCPU, {memory_mib} MiB and {storage_gib} GiB together")
    return "no node could ever hold this workspace: it asks for " + "; ".join(short)


def node_id(value: str, field: str = "node_id") -> str:
    if not NODE_ID.fullmatch(value):
        raise InvalidArgument("a node ID is 1 to 63 lowercase letters, digits and '-'", field=field)
    return value


def labels(values: dict[str, str], field: str = "labels") -> dict[str, str]:
    if len(values) > MAX_LABELS:
        raise InvalidArgument(f"at most {MAX_LABELS} labels", field=field)
    for key, value in values.items():
        if not LABEL_KEY.fullmatch(key):
            raise InvalidArgument(f"label key {key[:80]!r}: lowercase letters, digits, '.', '/', '-'", field=field)
        if not LABEL_VALUE.fullmatch(value):
            raise InvalidArgument(f"label {key}: the value is up to 63 letters, digits, '.', '_', '-'", field=field)
    return dict(values)
