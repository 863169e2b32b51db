import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkspaceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKSPACE_STATE_UNSPECIFIED: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_CREATING: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_AVAILABLE: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_STOPPING: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_STOPPED: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_STARTING: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_FAILED: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_UNKNOWN: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_DELETING: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_DELETED: _ClassVar[WorkspaceState]

class ExpirationAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPIRATION_ACTION_UNSPECIFIED: _ClassVar[ExpirationAction]
    EXPIRATION_ACTION_STOP: _ClassVar[ExpirationAction]
    EXPIRATION_ACTION_DELETE: _ClassVar[ExpirationAction]

class StopCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_CAUSE_UNSPECIFIED: _ClassVar[StopCause]
    STOP_CAUSE_REQUESTED: _ClassVar[StopCause]
    STOP_CAUSE_EXPIRED: _ClassVar[StopCause]
    STOP_CAUSE_GUEST_SHUTDOWN: _ClassVar[StopCause]
    STOP_CAUSE_HOST_MEMORY_EXHAUSTED: _ClassVar[StopCause]

class StopDurability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_DURABILITY_UNSPECIFIED: _ClassVar[StopDurability]
    STOP_DURABILITY_CONFIRMED: _ClassVar[StopDurability]
    STOP_DURABILITY_UNCONFIRMED: _ClassVar[StopDurability]

class NetworkEgress(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NETWORK_EGRESS_UNSPECIFIED: _ClassVar[NetworkEgress]
    NETWORK_EGRESS_ALLOW_ALL: _ClassVar[NetworkEgress]
    NETWORK_EGRESS_DENY_ALL: _ClassVar[NetworkEgress]
    NETWORK_EGRESS_ALLOW_LISTED: _ClassVar[NetworkEgress]

class ExposureAccess(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPOSURE_ACCESS_UNSPECIFIED: _ClassVar[ExposureAccess]
    EXPOSURE_ACCESS_TOKEN: _ClassVar[ExposureAccess]
    EXPOSURE_ACCESS_PUBLIC: _ClassVar[ExposureAccess]
WORKSPACE_STATE_UNSPECIFIED: WorkspaceState
WORKSPACE_STATE_CREATING: WorkspaceState
WORKSPACE_STATE_AVAILABLE: WorkspaceState
WORKSPACE_STATE_STOPPING: WorkspaceState
WORKSPACE_STATE_STOPPED: WorkspaceState
WORKSPACE_STATE_STARTING: WorkspaceState
WORKSPACE_STATE_FAILED: WorkspaceState
WORKSPACE_STATE_UNKNOWN: WorkspaceState
WORKSPACE_STATE_DELETING: WorkspaceState
WORKSPACE_STATE_DELETED: WorkspaceState
EXPIRATION_ACTION_UNSPECIFIED: ExpirationAction
EXPIRATION_ACTION_STOP: ExpirationAction
EXPIRATION_ACTION_DELETE: ExpirationAction
STOP_CAUSE_UNSPECIFIED: StopCause
STOP_CAUSE_REQUESTED: StopCause
STOP_CAUSE_EXPIRED: StopCause
STOP_CAUSE_GUEST_SHUTDOWN: StopCause
STOP_CAUSE_HOST_MEMORY_EXHAUSTED: StopCause
STOP_DURABILITY_UNSPECIFIED: StopDurability
STOP_DURABILITY_CONFIRMED: StopDurability
STOP_DURABILITY_UNCONFIRMED: StopDurability
NETWORK_EGRESS_UNSPECIFIED: NetworkEgress
NETWORK_EGRESS_ALLOW_ALL: NetworkEgress
NETWORK_EGRESS_DENY_ALL: NetworkEgress
NETWORK_EGRESS_ALLOW_LISTED: NetworkEgress
EXPOSURE_ACCESS_UNSPECIFIED: ExposureAccess
EXPOSURE_ACCESS_TOKEN: ExposureAccess
EXPOSURE_ACCESS_PUBLIC: ExposureAccess

class CommandMetadata(_message.Message):
    __slots__ = ("command_id",)
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    def __init__(self, command_id: _Optional[str] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("vcpus", "memory_mib", "writable_layer_gib")
    VCPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_LAYER_GIB_FIELD_NUMBER: _ClassVar[int]
    vcpus: int
    memory_mib: int
    writable_layer_gib: int
    def __init__(self, vcpus: _Optional[int] = ..., memory_mib: _Optional[int] = ..., writable_layer_gib: _Optional[int] = ...) -> None: ...

class VolumeBinding(_message.Message):
    __slots__ = ("volume_id", "mount_path", "delete_with_workspace", "storage_pool", "capacity_gib")
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    DELETE_WITH_WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_GIB_FIELD_NUMBER: _ClassVar[int]
    volume_id: str
    mount_path: str
    delete_with_workspace: bool
    storage_pool: str
    capacity_gib: int
    def __init__(self, volume_id: _Optional[str] = ..., mount_path: _Optional[str] = ..., delete_with_workspace: _Optional[bool] = ..., storage_pool: _Optional[str] = ..., capacity_gib: _Optional[int] = ...) -> None: ...

class NetworkPolicy(_message.Message):
    __slots__ = ("egress", "allowed_cidrs", "denied_cidrs", "allowed_domains", "denied_domains", "allowed_ports")
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_CIDRS_FIELD_NUMBER: _ClassVar[int]
    DENIED_CIDRS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    DENIED_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_PORTS_FIELD_NUMBER: _ClassVar[int]
    egress: NetworkEgress
    allowed_cidrs: _containers.RepeatedScalarFieldContainer[str]
    denied_cidrs: _containers.RepeatedScalarFieldContainer[str]
    allowed_domains: _containers.RepeatedScalarFieldContainer[str]
    denied_domains: _containers.RepeatedScalarFieldContainer[str]
    allowed_ports: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, egress: _Optional[_Union[NetworkEgress, str]] = ..., allowed_cidrs: _Optional[_Iterable[str]] = ..., denied_cidrs: _Optional[_Iterable[str]] = ..., allowed_domains: _Optional[_Iterable[str]] = ..., denied_domains: _Optional[_Iterable[str]] = ..., allowed_ports: _Optional[_Iterable[int]] = ...) -> None: ...

class WorkspaceSpec(_message.Message):
    __slots__ = ("resources", "labels", "annotations", "volumes", "network_policy", "data_volume_gib", "node_selector")
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
    class NodeSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    DATA_VOLUME_GIB_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    resources: Resources
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    volumes: _containers.RepeatedCompositeFieldContainer[VolumeBinding]
    network_policy: NetworkPolicy
    data_volume_gib: int
    node_selector: _containers.ScalarMap[str, str]
    def __init__(self, resources: _Optional[_Union[Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., volumes: _Optional[_Iterable[_Union[VolumeBinding, _Mapping]]] = ..., network_policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ..., data_volume_gib: _Optional[int] = ..., node_selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Expiration(_message.Message):
    __slots__ = ("revision", "expire_time", "action")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    expire_time: _timestamp_pb2.Timestamp
    action: ExpirationAction
    def __init__(self, revision: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[_Union[ExpirationAction, str]] = ...) -> None: ...

class LastStop(_message.Message):
    __slots__ = ("cause", "command_id", "durability")
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    DURABILITY_FIELD_NUMBER: _ClassVar[int]
    cause: StopCause
    command_id: str
    durability: StopDurability
    def __init__(self, cause: _Optional[_Union[StopCause, str]] = ..., command_id: _Optional[str] = ..., durability: _Optional[_Union[StopDurability, str]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("stage", "message")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    stage: str
    message: str
    def __init__(self, stage: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class GuestStatus(_message.Message):
    __slots__ = ("reset_count", "last_reset_time", "responding")
    RESET_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_RESET_TIME_FIELD_NUMBER: _ClassVar[int]
    RESPONDING_FIELD_NUMBER: _ClassVar[int]
    reset_count: int
    last_reset_time: _timestamp_pb2.Timestamp
    responding: bool
    def __init__(self, reset_count: _Optional[int] = ..., last_reset_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., responding: _Optional[bool] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("type", "status", "reason", "message", "last_transition_time")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_TRANSITION_TIME_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: bool
    reason: str
    message: str
    last_transition_time: _timestamp_pb2.Timestamp
    def __init__(self, type: _Optional[str] = ..., status: _Optional[bool] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., last_transition_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Exposure(_message.Message):
    __slots__ = ("exposure_id", "workspace_id", "port", "access", "url", "token", "create_time", "expire_time", "execution_generation", "command_id")
    EXPOSURE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    exposure_id: str
    workspace_id: str
    port: int
    access: ExposureAccess
    url: str
    token: str
    create_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    execution_generation: int
    command_id: str
    def __init__(self, exposure_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., port: _Optional[int] = ..., access: _Optional[_Union[ExposureAccess, str]] = ..., url: _Optional[str] = ..., token: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., execution_generation: _Optional[int] = ..., command_id: _Optional[str] = ...) -> None: ...

class DataPlane(_message.Message):
    __slots__ = ("credential_revision",)
    CREDENTIAL_REVISION_FIELD_NUMBER: _ClassVar[int]
    credential_revision: int
    def __init__(self, credential_revision: _Optional[int] = ...) -> None: ...

class Workspace(_message.Message):
    __slots__ = ("workspace_id", "state", "spec", "labels", "annotations", "expiration", "last_stop", "failure", "create_time", "update_time", "delete_time", "execution_generation", "node_id", "guest", "conditions", "data_plane", "etag", "deletion_started")
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
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    EXPIRATION_FIELD_NUMBER: _ClassVar[int]
    LAST_STOP_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DELETE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GUEST_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    DELETION_STARTED_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    state: WorkspaceState
    spec: WorkspaceSpec
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    expiration: Expiration
    last_stop: LastStop
    failure: Failure
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    delete_time: _timestamp_pb2.Timestamp
    execution_generation: int
    node_id: str
    guest: GuestStatus
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    data_plane: DataPlane
    etag: str
    deletion_started: bool
    def __init__(self, workspace_id: _Optional[str] = ..., state: _Optional[_Union[WorkspaceState, str]] = ..., spec: _Optional[_Union[WorkspaceSpec, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., expiration: _Optional[_Union[Expiration, _Mapping]] = ..., last_stop: _Optional[_Union[LastStop, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., execution_generation: _Optional[int] = ..., node_id: _Optional[str] = ..., guest: _Optional[_Union[GuestStatus, _Mapping]] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ..., etag: _Optional[str] = ..., deletion_started: _Optional[bool] = ...) -> None: ...
