"""Wire requests -> domain command requests. Malformed input raises InvalidArgument naming the field."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from google.protobuf.message import Message
from kibo.ctrl.v1 import volume_service_pb2 as vol_pb2
from kibo.ctrl.v1 import workspace_pb2
from kibo.ctrl.v1 import workspace_service_pb2 as ws_pb2

from ..domain import nodes, validation
from ..domain.errors import InvalidArgument
from ..domain.model import Binding, CommandKind, ExpirationAction, ExposureAccess, Resources
from ..domain.validation import DEFAULT_RESOURCES
from ..engine.service import CommandRequest, CreateSpec, ExposureRequest

_MAX_TIME = 253402300799  # 9999-12-31, the largest valid Timestamp


def fingerprint(method: str, request: Message) -> str:
    digest = hashlib.sha256(method.encode())
    digest.update(request.SerializeToString(deterministic=True))
    return digest.hexdigest()


def workspace_id(value: str, field: str = "workspace_id") -> str:
    return validation.resource_id(value, field, "ws-")


def _timestamp(message: Any, field: str) -> float:
    seconds, nanos = int(message.seconds), int(message.nanos)
    if not 0 <= seconds <= _MAX_TIME or not 0 <= nanos < 1_000_000_000:
        raise InvalidArgument(f"{field} is not a valid timestamp", field=field)
    return float(seconds) + nanos / 1e9


def _expiration(
    request: Any, time_field: str, action_field: str, required: bool
) -> tuple[float | None, ExpirationAction]:
    if not request.HasField(time_field):
        if required:
            raise InvalidArgument(f"{time_field} is required", field=time_field)
        if getattr(request, action_field):
            raise InvalidArgument(f"{action_field} needs {time_field}", field=action_field)
        return None, ExpirationAction.UNSPECIFIED
    when = _timestamp(getattr(request, time_field), time_field)
    if when <= time.time():
        raise InvalidArgument(f"{time_field} must be in the future", field=time_field)
    action = getattr(request, action_field)
    if action not in (ExpirationAction.STOP, ExpirationAction.DELETE):
        raise InvalidArgument(
            f"{action_field} must be EXPIRATION_ACTION_STOP or EXPIRATION_ACTION_DELETE", field=action_field
        )
    return when, ExpirationAction(action)


def _bounded(values: Mapping[str, str], most: int, field: str) -> dict[str, str]:
    """A request's map as a dict, refused before it is copied when it has over `most` entries
    (copying 300,000 of them, which a 4 MiB message holds, took 0.1 s)."""
    if len(values) > most:
        raise InvalidArgument(f"at most {most} {field}", field=field)
    return dict(values)


def _binding(message: workspace_pb2.VolumeBinding, field: str) -> Binding:
    return Binding(
        volume_id=validation.resource_id(message.volume_id, f"{field}.volume_id", "vol-"),
        mount_path=validation.mount_path(message.mount_path, f"{field}.mount_path"),
        delete_with_workspace=message.delete_with_workspace,
    )


def _base(kind: CommandKind, method: str, request: Any, **fields: Any) -> CommandRequest:
    return CommandRequest(
        kind=kind,
        command_id=validation.command_id(request.metadata.command_id, reserved_ok=True),
        fingerprint=fingerprint(method, request),
        **fields,
    )


def create(request: ws_pb2.CreateWorkspaceRequest) -> CommandRequest:
    command_id = validation.command_id(request.metadata.command_id, reserved_ok=True)
    spec = request.spec
    resources = validation.resources(
        spec.resources.vcpus, spec.resources.memory_mib, spec.resources.writable_layer_gib, DEFAULT_RESOURCES
    )
    if not 0 <= spec.data_volume_gib <= validation.MAX_VOLUME_GIB:
        raise InvalidArgument("spec.data_volume_gib is out of range", field="spec.data_volume_gib")
    if len(spec.volumes) > validation.MAX_VOLUMES:
        raise InvalidArgument(f"at most {validation.MAX_VOLUMES} spec.volumes", field="spec.volumes")
    bindings = [_binding(b, f"spec.volumes[{i}]") for i, b in enumerate(spec.volumes)]
    if any(b.mount_path == "/data" for b in bindings):
        raise InvalidArgument("/data is the workspace's own volume", field="spec.volumes.mount_path")
    expire_time, expire_action = _expiration(request, "expire_time", "expiration_action", required=False)
    create_spec = CreateSpec(
        resources=resources,
        labels=validation.label_map(spec.labels, "spec.labels"),
        annotations=validation.annotation_map(spec.annotations),
        bindings=bindings,
        network_policy=validation.network_policy(spec.network_policy, "spec.network_policy"),
        data_volume_gib=spec.data_volume_gib or validation.DEFAULT_DATA_VOLUME_GIB,
        expire_time=expire_time,
        expire_action=expire_action,
        node_selector=nodes.labels(
            _bounded(spec.node_selector, nodes.MAX_LABELS, "spec.node_selector"), "spec.node_selector"
        ),
    )
    return CommandRequest(
        kind=CommandKind.CREATE,
        command_id=command_id,
        fingerprint=fingerprint("CreateWorkspace", request),
        create=create_spec,
    )


def stop(request: ws_pb2.StopWorkspaceRequest) -> CommandRequest:
    if request.mode not in (ws_pb2.STOP_MODE_UNSPECIFIED, ws_pb2.STOP_MODE_GRACEFUL, ws_pb2.STOP_MODE_FORCE):
        raise InvalidArgument(f"unknown stop mode {request.mode}", field="mode")
    kind = CommandKind.FORCE_STOP if request.mode == ws_pb2.STOP_MODE_FORCE else CommandKind.STOP
    if request.mode == ws_pb2.STOP_MODE_UNSPECIFIED:
        # UNSPECIFIED means graceful: both spellings are the same request for idempotency.
        canonical = ws_pb2.StopWorkspaceRequest()
        canonical.CopyFrom(request)
        canonical.mode = ws_pb2.STOP_MODE_GRACEFUL
        request = canonical
    return _lifecycle(kind, "StopWorkspace", request)


def _lifecycle(kind: CommandKind, method: str, request: Any) -> CommandRequest:
    command = _base(kind, method, request, workspace_id=workspace_id(request.workspace_id))
    return _with_revision(command, request.expected_expiration_revision)


def _with_revision(command: CommandRequest, revision: int) -> CommandRequest:
    if revision < 0:
        raise InvalidArgument("expected_expiration_revision cannot be negative", field="expected_expiration_revision")
    return replace(command, expected_revision=revision)


def start(request: ws_pb2.StartWorkspaceRequest) -> CommandRequest:
    return _lifecycle(CommandKind.START, "StartWorkspace", request)


def delete(request: ws_pb2.DeleteWorkspaceRequest) -> CommandRequest:
    return _lifecycle(CommandKind.DELETE, "DeleteWorkspace", request)


def move(request: ws_pb2.MoveWorkspaceRequest) -> CommandRequest:
    if not request.target_node_id:
        raise InvalidArgument("target_node_id: the node to move the workspace's disks to", field="target_node_id")
    return _base(
        CommandKind.MOVE,
        "MoveWorkspace",
        request,
        workspace_id=workspace_id(request.workspace_id),
        target_node=nodes.node_id(request.target_node_id, "target_node_id"),
    )


def set_expiration(request: ws_pb2.SetWorkspaceExpirationRequest) -> CommandRequest:
    when, action = _expiration(request, "expire_time", "action", required=True)
    command = _base(
        CommandKind.SET_EXPIRATION,
        "SetWorkspaceExpiration",
        request,
        workspace_id=workspace_id(request.workspace_id),
        expire_time=when,
        expire_action=action,
    )
    return _with_revision(command, request.expected_expiration_revision)


def clear_expiration(request: ws_pb2.ClearWorkspaceExpirationRequest) -> CommandRequest:
    return _lifecycle(CommandKind.CLEAR_EXPIRATION, "ClearWorkspaceExpiration", request)


def set_labels(request: ws_pb2.SetWorkspaceLabelsRequest) -> CommandRequest:
    return _base(
        CommandKind.SET_LABELS,
        "SetWorkspaceLabels",
        request,
        workspace_id=workspace_id(request.workspace_id),
        labels=validation.label_map(request.labels, "labels"),
        annotations=validation.annotation_map(request.annotations),
    )


def resize(request: ws_pb2.ResizeWorkspaceRequest) -> CommandRequest:
    wanted = request.resources
    if not (wanted.vcpus or wanted.memory_mib or wanted.writable_layer_gib):
        raise InvalidArgument("resources: set at least one of vcpus, memory_mib, writable_layer_gib", field="resources")
    # Validated against the limits here; 0 fields keep the current value (filled by the service).
    base = Resources(vcpus=0, memory_mib=0, writable_layer_gib=0)
    resources = validation.resources(wanted.vcpus, wanted.memory_mib, wanted.writable_layer_gib, base)
    return _base(
        CommandKind.RESIZE,
        "ResizeWorkspace",
        request,
        workspace_id=workspace_id(request.workspace_id),
        resources=resources,
    )


def set_network_policy(request: ws_pb2.SetWorkspaceNetworkPolicyRequest) -> CommandRequest:
    policy = request.network_policy
    return _base(
        CommandKind.SET_NETWORK_POLICY,
        "SetWorkspaceNetworkPolicy",
        request,
        workspace_id=workspace_id(request.workspace_id),
        network_policy=validation.network_policy(policy),
    )


# The longest an exposure may be asked to last (a year); 0: until revoked.
MAX_EXPOSURE_SECONDS = 366 * 24 * 3600


def create_exposure(request: ws_pb2.CreateWorkspaceExposureRequest) -> CommandRequest:
    """Its ID and token are made here, before the transaction: a resent command (the same
    command ID) answers the exposure its first try made, without a token (only the first
    answer carries it: the store keeps its digest)."""
    if not 1 <= request.port <= 65535:
        raise InvalidArgument(f"port {request.port} is not 1..65535", field="port")
    try:
        access = ExposureAccess(request.access) if request.access else ExposureAccess.TOKEN
    except ValueError:
        raise InvalidArgument(f"unknown access value {request.access}", field="access") from None
    if not 0 <= request.expire_in_seconds <= MAX_EXPOSURE_SECONDS:
        raise InvalidArgument(
            f"expire_in_seconds must be 0 (until revoked) to {MAX_EXPOSURE_SECONDS}", field="expire_in_seconds"
        )
    token = exposure_token() if access is ExposureAccess.TOKEN else ""
    return _base(
        CommandKind.CREATE_EXPOSURE,
        "CreateWorkspaceExposure",
        request,
        workspace_id=workspace_id(request.workspace_id),
        exposure=ExposureRequest(
            exposure_id=f"ex-{secrets.token_hex(10)}",
            port=request.port,
            access=access,
            expire_in_seconds=request.expire_in_seconds,
            token_sha256=hashlib.sha256(token.encode()).hexdigest() if token else "",
        ),
        exposure_token=token,
    )


def exposure_token() -> str:
    """An exposure's bearer token: 256 random bits."""
    return f"kex1_{secrets.token_urlsafe(32)}"


def delete_exposure(request: ws_pb2.DeleteWorkspaceExposureRequest) -> CommandRequest:
    return _base(
        CommandKind.DELETE_EXPOSURE,
        "DeleteWorkspaceExposure",
        request,
        workspace_id=workspace_id(request.workspace_id),
        exposure=ExposureRequest(exposure_id=validation.resource_id(request.exposure_id, "exposure_id", "ex-")),
    )


def bind_volume(request: ws_pb2.BindWorkspaceVolumeRequest) -> CommandRequest:
    binding = _binding(request.binding, "binding")
    return _base(
        CommandKind.BIND_VOLUME,
        "BindWorkspaceVolume",
        request,
        workspace_id=workspace_id(request.workspace_id),
        binding=binding,
    )


def unbind_volume(request: ws_pb2.UnbindWorkspaceVolumeRequest) -> CommandRequest:
    return _base(
        CommandKind.UNBIND_VOLUME,
        "UnbindWorkspaceVolume",
        request,
        workspace_id=workspace_id(request.workspace_id),
        volume_id=validation.resource_id(request.volume_id, "volume_id", "vol-"),
    )


def revoke(request: ws_pb2.RevokeWorkspaceDataPlaneAccessRequest) -> CommandRequest:
    return _base(
        CommandKind.REVOKE_DATA_PLANE_ACCESS,
        "RevokeWorkspaceDataPlaneAccess",
        request,
        workspace_id=workspace_id(request.workspace_id),
    )


def create_volume(request: vol_pb2.CreateVolumeRequest) -> CommandRequest:
    command_id = validation.command_id(request.metadata.command_id, reserved_ok=True)
    if not 0 <= request.capacity_gib <= validation.MAX_VOLUME_GIB:
        raise InvalidArgument("capacity_gib is out of range", field="capacity_gib")
    return CommandRequest(
        kind=CommandKind.CREATE_VOLUME,
        command_id=command_id,
        fingerprint=fingerprint("CreateVolume", request),
        capacity_gib=request.capacity_gib or validation.DEFAULT_DATA_VOLUME_GIB,
    )


def delete_volume(request: vol_pb2.DeleteVolumeRequest) -> CommandRequest:
    command_id = validation.command_id(request.metadata.command_id, reserved_ok=True)
    return CommandRequest(
        kind=CommandKind.DELETE_VOLUME,
        command_id=command_id,
        fingerprint=fingerprint("DeleteVolume", request),
        volume_id=validation.resource_id(request.volume_id, "volume_id", "vol-"),
    )
