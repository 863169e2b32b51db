import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from kibo.ctrl.v1 import command_pb2 as _command_pb2
from kibo.ctrl.v1 import workspace_pb2 as _workspace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StopMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_MODE_UNSPECIFIED: _ClassVar[StopMode]
    STOP_MODE_GRACEFUL: _ClassVar[StopMode]
    STOP_MODE_FORCE: _ClassVar[StopMode]
STOP_MODE_UNSPECIFIED: StopMode
STOP_MODE_GRACEFUL: StopMode
STOP_MODE_FORCE: StopMode

class CreateWorkspaceRequest(_message.Message):
    __slots__ = ("metadata", "spec", "expire_time", "expiration_action")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRATION_ACTION_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    spec: _workspace_pb2.WorkspaceSpec
    expire_time: _timestamp_pb2.Timestamp
    expiration_action: _workspace_pb2.ExpirationAction
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., spec: _Optional[_Union[_workspace_pb2.WorkspaceSpec, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expiration_action: _Optional[_Union[_workspace_pb2.ExpirationAction, str]] = ...) -> None: ...

class CreateWorkspaceResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class GetWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class GetWorkspaceResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ...) -> None: ...

class ListWorkspacesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "include_deleted", "filter")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    include_deleted: bool
    filter: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_deleted: _Optional[bool] = ..., filter: _Optional[str] = ...) -> None: ...

class ListWorkspacesResponse(_message.Message):
    __slots__ = ("workspaces", "next_page_token")
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workspaces: _containers.RepeatedCompositeFieldContainer[_workspace_pb2.Workspace]
    next_page_token: str
    def __init__(self, workspaces: _Optional[_Iterable[_Union[_workspace_pb2.Workspace, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StopWorkspaceRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "expected_expiration_revision", "mode")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EXPIRATION_REVISION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    expected_expiration_revision: int
    mode: StopMode
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., expected_expiration_revision: _Optional[int] = ..., mode: _Optional[_Union[StopMode, str]] = ...) -> None: ...

class StopWorkspaceResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class StartWorkspaceRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "expected_expiration_revision")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EXPIRATION_REVISION_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    expected_expiration_revision: int
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., expected_expiration_revision: _Optional[int] = ...) -> None: ...

class StartWorkspaceResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class DeleteWorkspaceRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "expected_expiration_revision")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EXPIRATION_REVISION_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    expected_expiration_revision: int
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., expected_expiration_revision: _Optional[int] = ...) -> None: ...

class DeleteWorkspaceResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class GetWorkspaceCommandRequest(_message.Message):
    __slots__ = ("command_id",)
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    def __init__(self, command_id: _Optional[str] = ...) -> None: ...

class GetWorkspaceCommandResponse(_message.Message):
    __slots__ = ("command",)
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    command: _command_pb2.WorkspaceCommand
    def __init__(self, command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class WatchWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class WatchWorkspaceResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ...) -> None: ...

class GetCapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCapabilitiesResponse(_message.Message):
    __slots__ = ("capabilities", "largest_workspace")
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    LARGEST_WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    largest_workspace: WorkspaceLimits
    def __init__(self, capabilities: _Optional[_Iterable[str]] = ..., largest_workspace: _Optional[_Union[WorkspaceLimits, _Mapping]] = ...) -> None: ...

class WorkspaceLimits(_message.Message):
    __slots__ = ("vcpus", "memory_mib", "storage_gib")
    VCPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    STORAGE_GIB_FIELD_NUMBER: _ClassVar[int]
    vcpus: int
    memory_mib: int
    storage_gib: int
    def __init__(self, vcpus: _Optional[int] = ..., memory_mib: _Optional[int] = ..., storage_gib: _Optional[int] = ...) -> None: ...

class SetWorkspaceExpirationRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "expected_expiration_revision", "expire_time", "action")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EXPIRATION_REVISION_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    expected_expiration_revision: int
    expire_time: _timestamp_pb2.Timestamp
    action: _workspace_pb2.ExpirationAction
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., expected_expiration_revision: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[_Union[_workspace_pb2.ExpirationAction, str]] = ...) -> None: ...

class SetWorkspaceExpirationResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class ClearWorkspaceExpirationRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "expected_expiration_revision")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EXPIRATION_REVISION_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    expected_expiration_revision: int
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., expected_expiration_revision: _Optional[int] = ...) -> None: ...

class ClearWorkspaceExpirationResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class SetWorkspaceLabelsRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "labels", "annotations")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SetWorkspaceLabelsResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class ResizeWorkspaceRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "resources")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    resources: _workspace_pb2.Resources
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., resources: _Optional[_Union[_workspace_pb2.Resources, _Mapping]] = ...) -> None: ...

class ResizeWorkspaceResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class MoveWorkspaceRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "target_node_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    target_node_id: str
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., target_node_id: _Optional[str] = ...) -> None: ...

class MoveWorkspaceResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class SetWorkspaceNetworkPolicyRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "network_policy")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    network_policy: _workspace_pb2.NetworkPolicy
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., network_policy: _Optional[_Union[_workspace_pb2.NetworkPolicy, _Mapping]] = ...) -> None: ...

class SetWorkspaceNetworkPolicyResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class BindWorkspaceVolumeRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "binding")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    binding: _workspace_pb2.VolumeBinding
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., binding: _Optional[_Union[_workspace_pb2.VolumeBinding, _Mapping]] = ...) -> None: ...

class BindWorkspaceVolumeResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class UnbindWorkspaceVolumeRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "volume_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    volume_id: str
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., volume_id: _Optional[str] = ...) -> None: ...

class UnbindWorkspaceVolumeResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class RevokeWorkspaceDataPlaneAccessRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ...) -> None: ...

class RevokeWorkspaceDataPlaneAccessResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...

class CreateWorkspaceExposureRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "port", "access", "expire_in_seconds")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    port: int
    access: _workspace_pb2.ExposureAccess
    expire_in_seconds: int
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., port: _Optional[int] = ..., access: _Optional[_Union[_workspace_pb2.ExposureAccess, str]] = ..., expire_in_seconds: _Optional[int] = ...) -> None: ...

class CreateWorkspaceExposureResponse(_message.Message):
    __slots__ = ("workspace", "command", "exposure")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    EXPOSURE_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    exposure: _workspace_pb2.Exposure
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ..., exposure: _Optional[_Union[_workspace_pb2.Exposure, _Mapping]] = ...) -> None: ...

class ListWorkspaceExposuresRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class ListWorkspaceExposuresResponse(_message.Message):
    __slots__ = ("exposures",)
    EXPOSURES_FIELD_NUMBER: _ClassVar[int]
    exposures: _containers.RepeatedCompositeFieldContainer[_workspace_pb2.Exposure]
    def __init__(self, exposures: _Optional[_Iterable[_Union[_workspace_pb2.Exposure, _Mapping]]] = ...) -> None: ...

class DeleteWorkspaceExposureRequest(_message.Message):
    __slots__ = ("metadata", "workspace_id", "exposure_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPOSURE_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    workspace_id: str
    exposure_id: str
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., workspace_id: _Optional[str] = ..., exposure_id: _Optional[str] = ...) -> None: ...

class DeleteWorkspaceExposureResponse(_message.Message):
    __slots__ = ("workspace", "command")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_pb2.Workspace
    command: _command_pb2.WorkspaceCommand
    def __init__(self, workspace: _Optional[_Union[_workspace_pb2.Workspace, _Mapping]] = ..., command: _Optional[_Union[_command_pb2.WorkspaceCommand, _Mapping]] = ...) -> None: ...
