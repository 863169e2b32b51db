"""Request builders shared by the sync and asyncio clients: plain values -> wire requests.

Each command request is built once, so settling resends the identical bytes."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import volume_service_pb2 as vol_pb2
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws_pb2
from kibo.sim.v1 import simulator_pb2 as sim_pb2

from .command_id import check_command_id, new_command_id

__all__ = ["ExpireTime", "metadata", "timestamp"]

# An expiration time: an aware datetime, a Timestamp, or seconds since the epoch.
ExpireTime = datetime.datetime | Timestamp | float | int


def metadata(command_id: str | None, prefix: str = "kibotos") -> wp.CommandMetadata:
    return wp.CommandMetadata(command_id=check_command_id(command_id) if command_id else new_command_id(prefix))


def timestamp(value: ExpireTime) -> Timestamp:
    if isinstance(value, Timestamp):
        return value
    stamp = Timestamp()
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError("use an aware datetime (with tzinfo) for times")
        stamp.FromDatetime(value.astimezone(datetime.UTC))
    else:
        stamp.FromNanoseconds(int(value * 1_000_000_000))
    return stamp


def event_filters(
    types: Sequence[int],
    workspace_id: str,
    node_id: str,
    start_time: ExpireTime | None,
    end_time: ExpireTime | None,
) -> dict[str, Any]:
    """The filters ListEventsRequest and WatchEventsRequest share, as their keyword arguments."""
    filters: dict[str, Any] = {"types": list(types), "workspace_id": workspace_id, "node_id": node_id}
    if start_time is not None:
        filters["start_time"] = timestamp(start_time)
    if end_time is not None:
        filters["end_time"] = timestamp(end_time)
    return filters


def create(
    spec: wp.WorkspaceSpec | None,
    command_id: str | None,
    expire_time: ExpireTime | None,
    expiration_action: int,
) -> ws_pb2.CreateWorkspaceRequest:
    request = ws_pb2.CreateWorkspaceRequest(metadata=metadata(command_id), spec=spec or wp.WorkspaceSpec())
    if expire_time is not None:
        request.expire_time.CopyFrom(timestamp(expire_time))
        request.expiration_action = expiration_action or wp.EXPIRATION_ACTION_STOP  # type: ignore[assignment]
    return request


def stop(workspace_id: str, force: bool, command_id: str | None, revision: int) -> ws_pb2.StopWorkspaceRequest:
    return ws_pb2.StopWorkspaceRequest(
        metadata=metadata(command_id),
        workspace_id=workspace_id,
        expected_expiration_revision=revision,
        mode=ws_pb2.STOP_MODE_FORCE if force else ws_pb2.STOP_MODE_GRACEFUL,
    )


def start(workspace_id: str, command_id: str | None, revision: int) -> ws_pb2.StartWorkspaceRequest:
    return ws_pb2.StartWorkspaceRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, expected_expiration_revision=revision
    )


def delete(workspace_id: str, command_id: str | None, revision: int) -> ws_pb2.DeleteWorkspaceRequest:
    return ws_pb2.DeleteWorkspaceRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, expected_expiration_revision=revision
    )


def labels(
    workspace_id: str, labels: Mapping[str, str], annotations: Mapping[str, str], command_id: str | None
) -> ws_pb2.SetWorkspaceLabelsRequest:
    return ws_pb2.SetWorkspaceLabelsRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, labels=dict(labels), annotations=dict(annotations)
    )


def resize(
    workspace_id: str, vcpus: int, memory_mib: int, writable_layer_gib: int, command_id: str | None
) -> ws_pb2.ResizeWorkspaceRequest:
    return ws_pb2.ResizeWorkspaceRequest(
        metadata=metadata(command_id),
        workspace_id=workspace_id,
        resources=wp.Resources(vcpus=vcpus, memory_mib=memory_mib, writable_layer_gib=writable_layer_gib),
    )


def move(workspace_id: str, target_node_id: str, command_id: str | None) -> ws_pb2.MoveWorkspaceRequest:
    return ws_pb2.MoveWorkspaceRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, target_node_id=target_node_id
    )


def set_expiration(
    workspace_id: str, expire_time: ExpireTime, action: int, revision: int, command_id: str | None
) -> ws_pb2.SetWorkspaceExpirationRequest:
    return ws_pb2.SetWorkspaceExpirationRequest(
        metadata=metadata(command_id),
        workspace_id=workspace_id,
        expected_expiration_revision=revision,
        expire_time=timestamp(expire_time),
        action=action,  # type: ignore[arg-type]
    )


def clear_expiration(
    workspace_id: str, revision: int, command_id: str | None
) -> ws_pb2.ClearWorkspaceExpirationRequest:
    return ws_pb2.ClearWorkspaceExpirationRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, expected_expiration_revision=revision
    )


def create_volume(capacity_gib: int, command_id: str | None) -> vol_pb2.CreateVolumeRequest:
    return vol_pb2.CreateVolumeRequest(metadata=metadata(command_id), capacity_gib=capacity_gib)


def delete_volume(volume_id: str, command_id: str | None) -> vol_pb2.DeleteVolumeRequest:
    return vol_pb2.DeleteVolumeRequest(metadata=metadata(command_id), volume_id=volume_id)


def fault(workspace_id: str, fault: int) -> sim_pb2.InjectFaultRequest:
    return sim_pb2.InjectFaultRequest(workspace_id=workspace_id, fault=fault)  # type: ignore[arg-type]


def bind_volume(
    workspace_id: str, volume_id: str, mount_path: str, delete_with_workspace: bool, command_id: str | None
) -> ws_pb2.BindWorkspaceVolumeRequest:
    binding = wp.VolumeBinding(volume_id=volume_id, mount_path=mount_path, delete_with_workspace=delete_with_workspace)
    return ws_pb2.BindWorkspaceVolumeRequest(metadata=metadata(command_id), workspace_id=workspace_id, binding=binding)


def unbind_volume(workspace_id: str, volume_id: str, command_id: str | None) -> ws_pb2.UnbindWorkspaceVolumeRequest:
    return ws_pb2.UnbindWorkspaceVolumeRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, volume_id=volume_id
    )


def network_policy(
    workspace_id: str,
    egress: int,
    allowed_cidrs: Sequence[str],
    command_id: str | None,
    *,
    denied_cidrs: Sequence[str] = (),
    allowed_domains: Sequence[str] = (),
    denied_domains: Sequence[str] = (),
    allowed_ports: Sequence[int] = (),
) -> ws_pb2.SetWorkspaceNetworkPolicyRequest:
    policy = wp.NetworkPolicy(
        egress=egress,  # type: ignore[arg-type]
        allowed_cidrs=list(allowed_cidrs),
        denied_cidrs=list(denied_cidrs),
        allowed_domains=list(allowed_domains),
        denied_domains=list(denied_domains),
        allowed_ports=list(allowed_ports),
    )
    return ws_pb2.SetWorkspaceNetworkPolicyRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, network_policy=policy
    )


def create_exposure(
    workspace_id: str, port: int, public: bool, expire_in_seconds: int, command_id: str | None
) -> ws_pb2.CreateWorkspaceExposureRequest:
    return ws_pb2.CreateWorkspaceExposureRequest(
        metadata=metadata(command_id),
        workspace_id=workspace_id,
        port=port,
        access=wp.EXPOSURE_ACCESS_PUBLIC if public else wp.EXPOSURE_ACCESS_TOKEN,
        expire_in_seconds=expire_in_seconds,
    )


def delete_exposure(
    workspace_id: str, exposure_id: str, command_id: str | None
) -> ws_pb2.DeleteWorkspaceExposureRequest:
    return ws_pb2.DeleteWorkspaceExposureRequest(
        metadata=metadata(command_id), workspace_id=workspace_id, exposure_id=exposure_id
    )


def revoke_data_plane_access(workspace_id: str, command_id: str | None) -> ws_pb2.RevokeWorkspaceDataPlaneAccessRequest:
    return ws_pb2.RevokeWorkspaceDataPlaneAccessRequest(metadata=metadata(command_id), workspace_id=workspace_id)
