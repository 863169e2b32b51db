"""The port between a node agent and the control plane (`ControlPlaneLink`).

A node agent talks to the control plane only through this protocol; the control plane's
side of it is engine/node_registry.py. Adapters: engine/local_link.py (in the same process,
on the same event loop: the embedded node and the simulator) and transport/node_client.py
(gRPC, kibo.node.v1, for a node agent on another host). Every adapter keeps the same rules:

- `work(cursor)` is the node's feed: what the control plane wants of its instances (each
  item names the instance and its step) and which storage it must release. Each batch
  carries a cursor; a feed resumed from a cursor continues after it, or starts again from a
  snapshot when the control plane no longer has what came after it (a restart, a long
  absence). Items are levels, not edges: an instance item is the instance's whole record,
  so a repeated one is harmless, and the agent starts each (instance, step) at most once.
- `report` is idempotent: a report answers one step of one instance, and the controller
  folds only the answer to the current step (a repeated report changes nothing).
  `report_batch` folds several in order in one transaction, all or none.
- `renew` keeps the node's lease; a node whose lease runs out has its workspaces UNKNOWN
  until it renews again. It carries the node's disk as it is now (free space, pressure,
  what is promised), which the scheduler places on.
- A link that cannot reach the control plane now raises `LinkDown`: the agent retries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..domain.model import Instance, Node
from ..domain.nodes import DiskStatus, NodeResources
from ..domain.reports import (
    Destroyed,
    DestroyFailed,
    GuestOomKill,
    GuestReset,
    GuestResponding,
    Launched,
    LaunchFailed,
    Progress,
    Report,
    Restarted,
    RestartFailed,
    StopFailed,
    Stopped,
    StorageReleased,
    VmmExited,
)
from ..runtime.base import LaunchSpec

# Every report a node may send, by the name it travels under (kibo.node.v1 Report.kind).
REPORT_KINDS: dict[str, type[Report]] = {
    kind.__name__: kind
    for kind in (
        Progress,
        Launched,
        LaunchFailed,
        Stopped,
        StopFailed,
        Destroyed,
        DestroyFailed,
        GuestReset,
        Restarted,
        RestartFailed,
        VmmExited,
        GuestResponding,
        GuestOomKill,
    )
}


class LinkDown(Exception):
    """The control plane cannot be reached now (or refused for a passing reason): retry."""


@dataclass(frozen=True)
class Declaration:
    """What a node tells the control plane when it joins."""

    node: Node
    labels: dict[str, str] = field(default_factory=dict)
    capabilities: tuple[str, ...] = ()
    # Where the node serves its guests to the control plane (the data plane's hop), and the
    # secret it takes there; empty: no data plane over the network (in process, the simulator).
    data_plane_address: str = ""
    data_plane_token: str = ""
    # What its capacity was made of (the host's, the ratios) and its disk now.
    resources: NodeResources = field(default_factory=NodeResources)
    disk: DiskStatus = field(default_factory=DiskStatus)


@dataclass(frozen=True)
class Joined:
    node_id: str
    # How long a renewal keeps the node alive; the agent renews every quarter of it.
    lease_seconds: float


@dataclass(frozen=True)
class InstanceWork:
    """The control plane's record of one of the node's instances (its step and desire)."""

    instance: Instance


@dataclass(frozen=True)
class StorageWork:
    """A deleted workspace's retained layer and volumes to delete from the node's pool."""

    workspace_id: str
    volume_ids: tuple[str, ...]


@dataclass(frozen=True)
class VolumeWork:
    """A deleted volume whose files the node's pool may hold."""

    volume_id: str


Work = InstanceWork | StorageWork | VolumeWork


@dataclass(frozen=True)
class Cursor:
    """Where a feed stands: `epoch` names the control plane incarnation that numbered it."""

    epoch: str
    seq: int


@dataclass(frozen=True)
class Batch:
    items: tuple[Work, ...]
    cursor: Cursor
    # A snapshot: everything the node owes work for now (the start of a feed, or a resume
    # the control plane could not continue).
    snapshot: bool = False


# The most reports one `report_batch` may hold.
MAX_BATCH_REPORTS = 64


class ControlPlaneLink(Protocol):
    async def join(self, declaration: Declaration) -> Joined: ...

    def work(self, cursor: Cursor | None) -> AsyncIterator[Batch]:
        """The feed, from after `cursor` (None: from a snapshot); ends with LinkDown."""
        ...

    async def launch_spec(self, instance_id: str, step: int) -> LaunchSpec: ...
    async def report(self, report: Report) -> None: ...
    async def report_batch(self, reports: Sequence[Report]) -> None: ...
    async def storage_released(self, report: StorageReleased) -> None: ...
    async def volume_released(self, volume_id: str) -> None: ...
    async def renew(self, disk: DiskStatus | None = None) -> None:
        """Keep the lease; `disk`: the node's disk now (None: nothing new to tell)."""
        ...
