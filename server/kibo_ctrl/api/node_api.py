"""The node API (kibo.node.v1), transport-free: NodeService for node agents, and
NodeAdminService for operators. Both call engine/node_registry.py.

Who may act as which node: a node token acts as the node it was made for (its `tenant`
field holds the node ID), and only as it; with authentication off (`--insecure-no-auth`,
the local operator) a caller acts as the node it names. Any other token is refused. Every
request is checked before the registry is asked, and the registry checks what the node
names (its instances, the storage and volumes routed to it) inside the transaction, so a
refused call changes nothing; another node's object answers NOT_FOUND, as a missing one."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import TypeVar

import msgspec
from kibo.node.v1 import node_admin_service_pb2 as admin_pb2
from kibo.node.v1 import node_service_pb2 as node_pb2

from ..domain.access import LOCAL_OPERATOR, Caller, Role
from ..domain.errors import InvalidArgument, PermissionDenied, Unimplemented
from ..domain.model import Node
from ..domain.nodes import DiskStatus, NodeRecord, NodeResources, node_id
from ..domain.reports import Report, StorageReleased
from ..engine import lost_nodes, moves
from ..engine.node_link import REPORT_KINDS, Batch, Cursor, Declaration, InstanceWork, StorageWork, Work
from ..engine.node_registry import NodeRegistry
from ..store.base import Store
from . import render

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()
MAX_IDS = 1024


def node_of(caller: Caller, named: str, auth: bool = True) -> str:
    """The node this caller may act as, given the node the request names. `auth` False:
    authentication is off (--insecure-no-auth), and the caller acts as the node it names."""
    if caller.role is Role.NODE:
        if named and named != caller.tenant:
            raise PermissionDenied(
                f"this node token acts as node {caller.tenant}, not as {named[:80]!r}", field="node_id"
            )
        return caller.tenant
    if not auth and caller == LOCAL_OPERATOR:
        return node_id(named)
    raise PermissionDenied(
        "the node API takes a node token",
        hint="make one on the control plane's machine: kibo-ctrl token create --node NODE_ID",
    )


def decode(data: bytes, kind: type[T], field: str) -> T:
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise InvalidArgument(f"{field}: not a {kind.__name__} record: {error}", field=field) from None


def encode(value: object) -> bytes:
    return _ENCODER.encode(value)


def _ids(values: Sequence[str], field: str) -> tuple[str, ...]:
    if len(values) > MAX_IDS or any(not value or len(value) > 128 for value in values):
        raise InvalidArgument(f"{field}: up to {MAX_IDS} IDs of 1 to 128 characters", field=field)
    return tuple(values)


def render_batch(batch: Batch) -> node_pb2.WatchStepsResponse:
    return node_pb2.WatchStepsResponse(
        cursor=node_pb2.Cursor(epoch=batch.cursor.epoch, seq=batch.cursor.seq),
        snapshot=batch.snapshot,
        items=[_render_item(item) for item in batch.items],
    )


def _render_item(item: Work) -> node_pb2.WorkItem:
    if isinstance(item, InstanceWork):
        instance = item.instance
        return node_pb2.WorkItem(
            instance=node_pb2.InstanceStep(
                instance_id=instance.id, step=instance.step, done_step=instance.done_step, record=encode(instance)
            )
        )
    if isinstance(item, StorageWork):
        return node_pb2.WorkItem(
            storage=node_pb2.StorageRelease(workspace_id=item.workspace_id, volume_ids=item.volume_ids)
        )
    return node_pb2.WorkItem(volume=node_pb2.VolumeRelease(volume_id=item.volume_id))


def parse_report(request: node_pb2.ReportRequest) -> Report:
    kind = REPORT_KINDS.get(request.kind)
    if kind is None:
        raise InvalidArgument(f"kind: one of {', '.join(REPORT_KINDS)}", field="kind")
    report = decode(request.body, kind, "body")
    step = request.step or None
    if report.instance_id != request.instance_id or report.step != step:
        raise InvalidArgument("body: its instance and step differ from the request's", field="body")
    return report


# The largest figures a node may state for its host and disk (hostile input: bounded, so no
# arithmetic on them overflows the wire's int64 or turns into a float infinity).
MAX_HOST_FIGURE = 1 << 50
MAX_RATIO = 1_000_000.0


def _bounded(value: int, field: str) -> int:
    if not 0 <= value <= MAX_HOST_FIGURE:
        raise InvalidArgument(f"{field}: 0 to {MAX_HOST_FIGURE}", field=field)
    return int(value)


def _ratio(value: float, field: str) -> float:
    if not 0.0 <= value <= MAX_RATIO:  # also refuses NaN
        raise InvalidArgument(f"{field}: 0 to {MAX_RATIO:g}", field=field)
    return float(value)


def parse_resources(wire: node_pb2.NodeResources) -> NodeResources:
    return NodeResources(
        host_vcpus=_bounded(wire.host_vcpus, "resources.host_vcpus"),
        host_memory_mib=_bounded(wire.host_memory_mib, "resources.host_memory_mib"),
        host_disk_gib=_bounded(wire.host_disk_gib, "resources.host_disk_gib"),
        cpu_ratio=_ratio(wire.cpu_allocation_ratio, "resources.cpu_allocation_ratio"),
        memory_ratio=_ratio(wire.memory_allocation_ratio, "resources.memory_allocation_ratio"),
        disk_ratio=_ratio(wire.disk_allocation_ratio, "resources.disk_allocation_ratio"),
        storage_gib=_bounded(wire.storage_gib, "resources.storage_gib"),
    )


def render_resources(resources: NodeResources) -> node_pb2.NodeResources:
    return node_pb2.NodeResources(
        host_vcpus=resources.host_vcpus,
        host_memory_mib=resources.host_memory_mib,
        host_disk_gib=resources.host_disk_gib,
        cpu_allocation_ratio=resources.cpu_ratio,
        memory_allocation_ratio=resources.memory_ratio,
        disk_allocation_ratio=resources.disk_ratio,
        storage_gib=resources.storage_gib,
    )


def parse_disk(wire: node_pb2.DiskStatus) -> DiskStatus:
    return DiskStatus(
        free_bytes=_bounded(wire.free_bytes, "disk.free_bytes"),
        reserve_bytes=_bounded(wire.reserve_bytes, "disk.reserve_bytes"),
        promised_bytes=_bounded(wire.promised_bytes, "disk.promised_bytes"),
        pressure=wire.pressure,
    )


def render_disk(disk: DiskStatus) -> node_pb2.DiskStatus:
    return node_pb2.DiskStatus(
        free_bytes=disk.free_bytes,
        reserve_bytes=disk.reserve_bytes,
        promised_bytes=disk.promised_bytes,
        pressure=disk.pressure,
    )


def conditions(record: NodeRecord) -> list[str]:
    """The node's conditions that hold now (kibo node list)."""
    return ["DiskPressure"] if record.disk.pressure else []


def render_node(record: NodeRecord, instances: int, used: tuple[int, int]) -> admin_pb2.Node:
    if record.forgotten:
        state = admin_pb2.NODE_STATE_FORGOTTEN
    elif record.silent:
        state = admin_pb2.NODE_STATE_SILENT
    elif record.draining:
        state = admin_pb2.NODE_STATE_DRAINING if instances else admin_pb2.NODE_STATE_DRAINED
    elif record.cordoned:
        state = admin_pb2.NODE_STATE_CORDONED
    else:
        state = admin_pb2.NODE_STATE_READY
    return admin_pb2.Node(
        id=record.id,
        state=state,
        vcpus=record.vcpus,
        memory_mib=record.memory_mib,
        storage_pool=record.storage_pool,
        labels=record.labels,
        capabilities=record.capabilities,
        used_vcpus=used[0],
        used_memory_mib=used[1],
        instances=instances,
        cordoned=record.cordoned,
        silent=record.silent,
        lease_expire_time=record.lease_expiry,
        join_time=record.join_time,
        host_vcpus=record.resources.host_vcpus,
        host_memory_mib=record.resources.host_memory_mib,
        cpu_allocation_ratio=record.resources.cpu_ratio,
        memory_allocation_ratio=record.resources.memory_ratio,
        host_disk_gib=record.resources.host_disk_gib,
        disk_allocation_ratio=record.resources.disk_ratio,
        storage_gib=record.resources.storage_gib,
        storage_promised_bytes=record.disk.promised_bytes,
        disk_free_bytes=record.disk.free_bytes,
        disk_reserve_bytes=record.disk.reserve_bytes,
        conditions=conditions(record),
    )


class NodeApi:
    """kibo.node.v1.NodeService: what node agents call."""

    def __init__(self, registry: NodeRegistry, auth: bool) -> None:
        self._registry = registry
        self._auth = auth

    async def join(self, request: node_pb2.JoinRequest, caller: Caller) -> node_pb2.JoinResponse:
        node = node_of(caller, request.node_id, self._auth)
        if len(request.capabilities) > 64 or any(len(c) > 128 for c in request.capabilities):
            raise InvalidArgument("capabilities: up to 64, of up to 128 characters", field="capabilities")
        declaration = Declaration(
            Node(node, request.vcpus, request.memory_mib, request.storage_pool),
            dict(request.labels),
            tuple(request.capabilities),
            request.data_plane_address,
            request.data_plane_token,
            parse_resources(request.resources),
            parse_disk(request.disk),
        )
        joined = await self._registry.join(declaration)
        return node_pb2.JoinResponse(node_id=joined.node_id, lease_seconds=joined.lease_seconds)

    async def watch_steps(
        self, request: node_pb2.WatchStepsRequest, caller: Caller
    ) -> AsyncGenerator[node_pb2.WatchStepsResponse, None]:
        node = node_of(caller, request.node_id, self._auth)
        cursor = None
        if request.HasField("resume_after"):
            cursor = Cursor(request.resume_after.epoch, request.resume_after.seq)
        async for batch in self._registry.feed(node, cursor):
            yield render_batch(batch)

    async def get_launch_spec(
        self, request: node_pb2.GetLaunchSpecRequest, caller: Caller
    ) -> node_pb2.GetLaunchSpecResponse:
        node = node_of(caller, request.node_id, self._auth)
        spec = await self._registry.launch_spec(node, request.instance_id, request.step)
        return node_pb2.GetLaunchSpecResponse(spec=encode(spec))

    async def report(self, request: node_pb2.ReportRequest, caller: Caller) -> node_pb2.ReportResponse:
        node = node_of(caller, request.node_id, self._auth)
        await self._registry.report(node, parse_report(request))
        return node_pb2.ReportResponse()

    async def report_batch(self, request: node_pb2.ReportBatchRequest, caller: Caller) -> node_pb2.ReportBatchResponse:
        node = node_of(caller, request.node_id, self._auth)
        # Its size is the registry's to check (for every link); the nodes named are the wire's.
        for report in request.reports:
            if report.node_id not in ("", request.node_id):
                raise InvalidArgument("reports: each of this request's node or none", field="reports.node_id")
        await self._registry.report_batch(node, [parse_report(report) for report in request.reports])
        return node_pb2.ReportBatchResponse()

    async def report_storage_released(
        self, request: node_pb2.ReportStorageReleasedRequest, caller: Caller
    ) -> node_pb2.ReportStorageReleasedResponse:
        node = node_of(caller, request.node_id, self._auth)
        report = StorageReleased(request.workspace_id, volume_ids=_ids(request.volume_ids, "volume_ids"))
        await self._registry.storage_released(node, report)
        return node_pb2.ReportStorageReleasedResponse()

    async def report_volume_released(
        self, request: node_pb2.ReportVolumeReleasedRequest, caller: Caller
    ) -> node_pb2.ReportVolumeReleasedResponse:
        node = node_of(caller, request.node_id, self._auth)
        await self._registry.volume_released(node, request.volume_id)
        return node_pb2.ReportVolumeReleasedResponse()

    async def renew_lease(self, request: node_pb2.RenewLeaseRequest, caller: Caller) -> node_pb2.RenewLeaseResponse:
        node = node_of(caller, request.node_id, self._auth)
        await self._registry.renew(node, parse_disk(request.disk) if request.HasField("disk") else None)
        return node_pb2.RenewLeaseResponse(lease_seconds=self._registry.lease_seconds)


class NodeAdminApi:
    """kibo.node.v1.NodeAdminService: operators list, cordon and drain nodes."""

    def __init__(self, registry: NodeRegistry, store: Store | None = None) -> None:
        self._registry = registry
        self._store = store

    async def list_nodes(self, request: admin_pb2.ListNodesRequest, caller: Caller) -> admin_pb2.ListNodesResponse:
        caller.require_operator("managing the nodes")
        nodes = await self._registry.list_nodes()
        return admin_pb2.ListNodesResponse(nodes=[render_node(r, n, used) for r, n, used in nodes])

    async def cordon_node(self, request: admin_pb2.CordonNodeRequest, caller: Caller) -> admin_pb2.CordonNodeResponse:
        caller.require_operator("managing the nodes")
        return admin_pb2.CordonNodeResponse(node=await self._changed(request.node_id, cordoned=True))

    async def uncordon_node(
        self, request: admin_pb2.UncordonNodeRequest, caller: Caller
    ) -> admin_pb2.UncordonNodeResponse:
        caller.require_operator("managing the nodes")
        return admin_pb2.UncordonNodeResponse(node=await self._changed(request.node_id, cordoned=False))

    async def drain_node(self, request: admin_pb2.DrainNodeRequest, caller: Caller) -> admin_pb2.DrainNodeResponse:
        caller.require_operator("managing the nodes")
        node = await self._changed(request.node_id, cordoned=True, drain=True)
        if not request.move_stopped:
            return admin_pb2.DrainNodeResponse(node=node)
        if self._store is None:
            raise Unimplemented("this server cannot move disks")
        fingerprint = f"drain {request.node_id} move-stopped"
        moving, unmoved = await self._store.transact(moves.drain, request.node_id, fingerprint)
        return admin_pb2.DrainNodeResponse(node=node, moves=[render.command(c) for c in moving], unmoved=unmoved)

    async def forget_node(self, request: admin_pb2.ForgetNodeRequest, caller: Caller) -> admin_pb2.ForgetNodeResponse:
        caller.require_operator("managing the nodes")
        if self._store is None:
            raise Unimplemented("this server cannot forget nodes")
        done = await self._store.transact(lost_nodes.forget, node_id(request.node_id), request.abandon_disks)
        return admin_pb2.ForgetNodeResponse(
            node=render_node(done.node, 0, (0, 0)),
            released_workspace_ids=done.released,
            abandoned_workspace_ids=done.abandoned_workspaces,
            abandoned_volume_ids=done.abandoned_volumes,
        )

    async def _changed(self, node: str, cordoned: bool, drain: bool = False) -> admin_pb2.Node:
        await self._registry.cordon(node_id(node), cordoned, drain)
        for record, instances, used in await self._registry.list_nodes():
            if record.id == node:
                return render_node(record, instances, used)
        raise AssertionError("a node changed is listed")
