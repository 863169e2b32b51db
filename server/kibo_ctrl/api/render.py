"""Records -> wire messages."""

from __future__ import annotations

from typing import Generic, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import status_pb2
from kibo.ctrl.v1 import command_pb2, volume_service_pb2, workspace_pb2, workspace_service_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs_pb2

from ..domain.cleanup import Cleanup
from ..domain.model import Command, CommandKind, Event, Instance, Volume, Workspace
from ..domain.nodes import NodeRecord

M = TypeVar("M", bound=Message)


class Encoded(Generic[M]):
    """A response as its binary encoding, made once for many callers (a watched change goes
    to every stream of the workspace; a page is assembled from remembered encodings). The
    gRPC transport sends `data` as it is; the Connect transport asks for `message` (parsed
    from `data` when it was not given), which it encodes with the codec the caller chose."""

    __slots__ = ("_message", "_type", "data")

    def __init__(self, data: bytes, message_type: type[M], message: M | None = None) -> None:
        self.data = data
        self._type = message_type
        self._message = message

    @classmethod
    def of(cls, message: M) -> Encoded[M]:
        return cls(message.SerializeToString(), type(message), message)

    @property
    def message(self) -> M:
        if self._message is None:
            self._message = self._type.FromString(self.data)
        return self._message


def field_bytes(number: int, payload: bytes) -> bytes:
    """One length-delimited field (a sub-message or a string) in the protobuf wire format:
    its key, its length as a varint, its bytes. A message is the concatenation of its fields."""
    key = number << 3 | 2
    size = len(payload)
    if size < 0x80:  # a one-byte length: every token, most workspaces
        return bytes((key, size)) + payload
    if size < 0x4000:
        return bytes((key, size & 0x7F | 0x80, size >> 7)) + payload
    head = bytearray((key,))
    while size > 0x7F:
        head.append(size & 0x7F | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + payload


def timestamp(seconds: float | None) -> Timestamp | None:
    if seconds is None:
        return None
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def workspace(record: Workspace) -> workspace_pb2.Workspace:
    resources = workspace_pb2.Resources(
        vcpus=record.resources.vcpus,
        memory_mib=record.resources.memory_mib,
        writable_layer_gib=record.resources.writable_layer_gib,
    )
    rule = record.network_policy
    policy = workspace_pb2.NetworkPolicy(
        egress=int(rule.egress),
        allowed_cidrs=rule.allowed_cidrs,
        denied_cidrs=rule.denied_cidrs,
        allowed_domains=rule.allowed_domains,
        denied_domains=rule.denied_domains,
        allowed_ports=rule.allowed_ports,
    )
    bindings = [
        workspace_pb2.VolumeBinding(
            volume_id=b.volume_id,
            mount_path=b.mount_path,
            delete_with_workspace=b.delete_with_workspace,
            storage_pool=record.storage_pool,
            capacity_gib=b.capacity_gib,
        )
        for b in record.bindings
    ]
    message = workspace_pb2.Workspace(
        workspace_id=record.id,
        state=int(record.state),
        spec=workspace_pb2.WorkspaceSpec(
            resources=resources,
            labels=record.labels,
            annotations=record.annotations,
            volumes=bindings,
            network_policy=policy,
            node_selector=record.node_selector,
        ),
        labels=record.labels,
        annotations=record.annotations,
        expiration=workspace_pb2.Expiration(
            revision=record.expiration.revision,
            expire_time=timestamp(record.expiration.expire_time),
            action=int(record.expiration.action),
        ),
        create_time=timestamp(record.create_time),
        update_time=timestamp(record.update_time),
        delete_time=timestamp(record.delete_time),
        execution_generation=record.generation,
        node_id=record.node_id or "",
        guest=workspace_pb2.GuestStatus(
            reset_count=record.guest.reset_count,
            last_reset_time=timestamp(record.guest.last_reset_time),
            responding=record.guest.responding,
        ),
        data_plane=workspace_pb2.DataPlane(credential_revision=record.data_plane_revision),
        etag=f"{record.version}",
        deletion_started=record.deletion_started,
        conditions=[
            workspace_pb2.Condition(
                type=c.type,
                status=c.status,
                reason=c.reason,
                message=c.message,
                last_transition_time=timestamp(c.last_transition_time),
            )
            for c in record.conditions
        ],
    )
    if record.last_stop is not None:
        message.last_stop.CopyFrom(
            workspace_pb2.LastStop(
                cause=int(record.last_stop.cause),
                command_id=record.last_stop.command_id,
                durability=int(record.last_stop.durability),
            )
        )
    if record.failure is not None:
        message.failure.CopyFrom(workspace_pb2.Failure(stage=record.failure.stage, message=record.failure.message))
    return message


def command(record: Command) -> command_pb2.WorkspaceCommand:
    message = command_pb2.WorkspaceCommand(
        command_id=record.id,
        workspace_id=record.workspace_id,
        state=int(record.state),
        result=command_pb2.CommandResult(durability=int(record.durability)),
        kind=int(record.kind),
        create_time=timestamp(record.create_time),
        update_time=timestamp(record.update_time),
        stop_cause=int(record.stop_cause),
        volume_id=record.volume_id,
    )
    if record.error is not None:
        message.error.CopyFrom(status_pb2.Status(code=int(record.error.code), message=record.error.message))
    if record.kind is CommandKind.MOVE:
        message.progress.CopyFrom(
            command_pb2.CommandProgress(
                done_bytes=record.done_bytes, total_bytes=record.total_bytes, detail=record.detail
            )
        )
    return message


def event(record: Event) -> obs_pb2.WorkspaceEvent:
    return obs_pb2.WorkspaceEvent(
        sequence=record.seq,
        event_time=timestamp(record.time),
        type=int(record.type),
        from_state=int(record.from_state),
        to_state=int(record.to_state),
        command_id=record.command_id,
        message=record.message,
        execution_generation=record.generation,
        workspace_id=record.workspace_id,
        node_id=record.node_id,
    )


def instance(record: Instance) -> obs_pb2.Instance:
    return obs_pb2.Instance(
        instance_id=record.id,
        execution_generation=record.generation,
        node_id=record.node_id or "",
        phase=int(record.phase),
        reason=record.reason,
        restart_count=record.restart_count,
        holds_execution=record.holds_execution,
        observe_time=timestamp(record.observe_time),
        create_time=timestamp(record.create_time),
    )


def cleanup(workspace_id: str, record: Cleanup) -> obs_pb2.WorkspaceCleanup:
    message = obs_pb2.WorkspaceCleanup(
        workspace_id=workspace_id,
        state=int(record.state),
        completeness=int(record.completeness),
        components=[
            obs_pb2.CleanupComponentStatus(
                component=int(row.component),
                status=int(row.status),
                source=int(row.source),
                observe_time=timestamp(row.observe_time),
            )
            for row in record.components
        ],
    )
    if record.pending_since is not None:
        message.release.CopyFrom(
            obs_pb2.CleanupRelease(
                pending_since=timestamp(record.pending_since),
                last_confirmed_time=timestamp(record.last_confirmed_time),
            )
        )
    return message


def volume(record: Volume) -> volume_service_pb2.Volume:
    return volume_service_pb2.Volume(
        volume_id=record.id,
        storage_pool=record.storage_pool,
        capacity_gib=record.capacity_gib,
        state=int(record.state),
        workspace_id=record.workspace_id or "",
        create_time=timestamp(record.create_time),
    )


def largest_workspace(nodes: list[NodeRecord]) -> workspace_service_pb2.WorkspaceLimits:
    """The most of each resource some node offers in all (GetCapabilities): more is refused.
    Storage 0: some node does not bound it (the simulator)."""
    storage = [node.resources.storage_gib for node in nodes]
    return workspace_service_pb2.WorkspaceLimits(
        vcpus=max(node.vcpus for node in nodes),
        memory_mib=max(node.memory_mib for node in nodes),
        storage_gib=0 if not all(storage) else max(storage),
    )
