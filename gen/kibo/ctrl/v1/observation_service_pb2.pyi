import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from kibo.ctrl.v1 import workspace_pb2 as _workspace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CleanupState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLEANUP_STATE_UNSPECIFIED: _ClassVar[CleanupState]
    CLEANUP_STATE_COMPLETE: _ClassVar[CleanupState]
    CLEANUP_STATE_PROCESSING: _ClassVar[CleanupState]
    CLEANUP_STATE_NEEDS_ATTENTION: _ClassVar[CleanupState]
    CLEANUP_STATE_UNKNOWN: _ClassVar[CleanupState]

class CleanupCompleteness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLEANUP_COMPLETENESS_UNSPECIFIED: _ClassVar[CleanupCompleteness]
    CLEANUP_COMPLETENESS_COMPLETE: _ClassVar[CleanupCompleteness]
    CLEANUP_COMPLETENESS_PARTIAL: _ClassVar[CleanupCompleteness]
    CLEANUP_COMPLETENESS_UNKNOWN: _ClassVar[CleanupCompleteness]

class ComponentStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPONENT_STATUS_UNSPECIFIED: _ClassVar[ComponentStatus]
    COMPONENT_STATUS_RELEASED: _ClassVar[ComponentStatus]
    COMPONENT_STATUS_PRESENT: _ClassVar[ComponentStatus]
    COMPONENT_STATUS_PENDING: _ClassVar[ComponentStatus]
    COMPONENT_STATUS_ISOLATED: _ClassVar[ComponentStatus]
    COMPONENT_STATUS_UNKNOWN: _ClassVar[ComponentStatus]

class CleanupComponent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLEANUP_COMPONENT_UNSPECIFIED: _ClassVar[CleanupComponent]
    CLEANUP_COMPONENT_INSTANCE: _ClassVar[CleanupComponent]
    CLEANUP_COMPONENT_RESERVATION: _ClassVar[CleanupComponent]
    CLEANUP_COMPONENT_NETWORK: _ClassVar[CleanupComponent]
    CLEANUP_COMPONENT_VOLUME_ATTACHMENT: _ClassVar[CleanupComponent]
    CLEANUP_COMPONENT_RETAINED_LAYER: _ClassVar[CleanupComponent]
    CLEANUP_COMPONENT_VOLUME_DELETION: _ClassVar[CleanupComponent]
    CLEANUP_COMPONENT_LAYER_MOUNT: _ClassVar[CleanupComponent]

class CleanupSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLEANUP_SOURCE_UNSPECIFIED: _ClassVar[CleanupSource]
    CLEANUP_SOURCE_NODE_REPORT: _ClassVar[CleanupSource]
    CLEANUP_SOURCE_CONTROL_PLANE: _ClassVar[CleanupSource]

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_STATE_CHANGED: _ClassVar[EventType]
    EVENT_TYPE_COMMAND_ACCEPTED: _ClassVar[EventType]
    EVENT_TYPE_COMMAND_SUCCEEDED: _ClassVar[EventType]
    EVENT_TYPE_COMMAND_FAILED: _ClassVar[EventType]
    EVENT_TYPE_SCHEDULED: _ClassVar[EventType]
    EVENT_TYPE_UNSCHEDULABLE: _ClassVar[EventType]
    EVENT_TYPE_GUEST_RESET: _ClassVar[EventType]
    EVENT_TYPE_GUEST_NOT_RESPONDING: _ClassVar[EventType]
    EVENT_TYPE_NODE_SILENT: _ClassVar[EventType]
    EVENT_TYPE_NODE_BACK: _ClassVar[EventType]
    EVENT_TYPE_EXPIRED: _ClassVar[EventType]
    EVENT_TYPE_SERVER_STOP: _ClassVar[EventType]
    EVENT_TYPE_INSTANCE_PHASE: _ClassVar[EventType]
    EVENT_TYPE_STORAGE_RELEASED: _ClassVar[EventType]
    EVENT_TYPE_GUEST_OOM_KILL: _ClassVar[EventType]

class InstancePhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_PHASE_UNSPECIFIED: _ClassVar[InstancePhase]
    INSTANCE_PHASE_PENDING: _ClassVar[InstancePhase]
    INSTANCE_PHASE_SCHEDULED: _ClassVar[InstancePhase]
    INSTANCE_PHASE_PROVISIONING: _ClassVar[InstancePhase]
    INSTANCE_PHASE_LAUNCHING: _ClassVar[InstancePhase]
    INSTANCE_PHASE_RUNNING: _ClassVar[InstancePhase]
    INSTANCE_PHASE_RESTARTING: _ClassVar[InstancePhase]
    INSTANCE_PHASE_STOPPING: _ClassVar[InstancePhase]
    INSTANCE_PHASE_STOPPED: _ClassVar[InstancePhase]
    INSTANCE_PHASE_EXITED: _ClassVar[InstancePhase]
    INSTANCE_PHASE_FAILED: _ClassVar[InstancePhase]
    INSTANCE_PHASE_RELEASED: _ClassVar[InstancePhase]
CLEANUP_STATE_UNSPECIFIED: CleanupState
CLEANUP_STATE_COMPLETE: CleanupState
CLEANUP_STATE_PROCESSING: CleanupState
CLEANUP_STATE_NEEDS_ATTENTION: CleanupState
CLEANUP_STATE_UNKNOWN: CleanupState
CLEANUP_COMPLETENESS_UNSPECIFIED: CleanupCompleteness
CLEANUP_COMPLETENESS_COMPLETE: CleanupCompleteness
CLEANUP_COMPLETENESS_PARTIAL: CleanupCompleteness
CLEANUP_COMPLETENESS_UNKNOWN: CleanupCompleteness
COMPONENT_STATUS_UNSPECIFIED: ComponentStatus
COMPONENT_STATUS_RELEASED: ComponentStatus
COMPONENT_STATUS_PRESENT: ComponentStatus
COMPONENT_STATUS_PENDING: ComponentStatus
COMPONENT_STATUS_ISOLATED: ComponentStatus
COMPONENT_STATUS_UNKNOWN: ComponentStatus
CLEANUP_COMPONENT_UNSPECIFIED: CleanupComponent
CLEANUP_COMPONENT_INSTANCE: CleanupComponent
CLEANUP_COMPONENT_RESERVATION: CleanupComponent
CLEANUP_COMPONENT_NETWORK: CleanupComponent
CLEANUP_COMPONENT_VOLUME_ATTACHMENT: CleanupComponent
CLEANUP_COMPONENT_RETAINED_LAYER: CleanupComponent
CLEANUP_COMPONENT_VOLUME_DELETION: CleanupComponent
CLEANUP_COMPONENT_LAYER_MOUNT: CleanupComponent
CLEANUP_SOURCE_UNSPECIFIED: CleanupSource
CLEANUP_SOURCE_NODE_REPORT: CleanupSource
CLEANUP_SOURCE_CONTROL_PLANE: CleanupSource
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_STATE_CHANGED: EventType
EVENT_TYPE_COMMAND_ACCEPTED: EventType
EVENT_TYPE_COMMAND_SUCCEEDED: EventType
EVENT_TYPE_COMMAND_FAILED: EventType
EVENT_TYPE_SCHEDULED: EventType
EVENT_TYPE_UNSCHEDULABLE: EventType
EVENT_TYPE_GUEST_RESET: EventType
EVENT_TYPE_GUEST_NOT_RESPONDING: EventType
EVENT_TYPE_NODE_SILENT: EventType
EVENT_TYPE_NODE_BACK: EventType
EVENT_TYPE_EXPIRED: EventType
EVENT_TYPE_SERVER_STOP: EventType
EVENT_TYPE_INSTANCE_PHASE: EventType
EVENT_TYPE_STORAGE_RELEASED: EventType
EVENT_TYPE_GUEST_OOM_KILL: EventType
INSTANCE_PHASE_UNSPECIFIED: InstancePhase
INSTANCE_PHASE_PENDING: InstancePhase
INSTANCE_PHASE_SCHEDULED: InstancePhase
INSTANCE_PHASE_PROVISIONING: InstancePhase
INSTANCE_PHASE_LAUNCHING: InstancePhase
INSTANCE_PHASE_RUNNING: InstancePhase
INSTANCE_PHASE_RESTARTING: InstancePhase
INSTANCE_PHASE_STOPPING: InstancePhase
INSTANCE_PHASE_STOPPED: InstancePhase
INSTANCE_PHASE_EXITED: InstancePhase
INSTANCE_PHASE_FAILED: InstancePhase
INSTANCE_PHASE_RELEASED: InstancePhase

class CleanupComponentStatus(_message.Message):
    __slots__ = ("component", "status", "source", "observe_time")
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_TIME_FIELD_NUMBER: _ClassVar[int]
    component: CleanupComponent
    status: ComponentStatus
    source: CleanupSource
    observe_time: _timestamp_pb2.Timestamp
    def __init__(self, component: _Optional[_Union[CleanupComponent, str]] = ..., status: _Optional[_Union[ComponentStatus, str]] = ..., source: _Optional[_Union[CleanupSource, str]] = ..., observe_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CleanupRelease(_message.Message):
    __slots__ = ("pending_since", "last_confirmed_time")
    PENDING_SINCE_FIELD_NUMBER: _ClassVar[int]
    LAST_CONFIRMED_TIME_FIELD_NUMBER: _ClassVar[int]
    pending_since: _timestamp_pb2.Timestamp
    last_confirmed_time: _timestamp_pb2.Timestamp
    def __init__(self, pending_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_confirmed_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkspaceCleanup(_message.Message):
    __slots__ = ("workspace_id", "state", "completeness", "components", "release")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COMPLETENESS_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    state: CleanupState
    completeness: CleanupCompleteness
    components: _containers.RepeatedCompositeFieldContainer[CleanupComponentStatus]
    release: CleanupRelease
    def __init__(self, workspace_id: _Optional[str] = ..., state: _Optional[_Union[CleanupState, str]] = ..., completeness: _Optional[_Union[CleanupCompleteness, str]] = ..., components: _Optional[_Iterable[_Union[CleanupComponentStatus, _Mapping]]] = ..., release: _Optional[_Union[CleanupRelease, _Mapping]] = ...) -> None: ...

class GetWorkspaceCleanupRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class GetWorkspaceCleanupResponse(_message.Message):
    __slots__ = ("cleanup",)
    CLEANUP_FIELD_NUMBER: _ClassVar[int]
    cleanup: WorkspaceCleanup
    def __init__(self, cleanup: _Optional[_Union[WorkspaceCleanup, _Mapping]] = ...) -> None: ...

class WorkspaceEvent(_message.Message):
    __slots__ = ("sequence", "event_time", "type", "from_state", "to_state", "command_id", "message", "execution_generation", "workspace_id", "node_id")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    event_time: _timestamp_pb2.Timestamp
    type: EventType
    from_state: _workspace_pb2.WorkspaceState
    to_state: _workspace_pb2.WorkspaceState
    command_id: str
    message: str
    execution_generation: int
    workspace_id: str
    node_id: str
    def __init__(self, sequence: _Optional[int] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., type: _Optional[_Union[EventType, str]] = ..., from_state: _Optional[_Union[_workspace_pb2.WorkspaceState, str]] = ..., to_state: _Optional[_Union[_workspace_pb2.WorkspaceState, str]] = ..., command_id: _Optional[str] = ..., message: _Optional[str] = ..., execution_generation: _Optional[int] = ..., workspace_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class ListWorkspaceEventsRequest(_message.Message):
    __slots__ = ("workspace_id", "page_size", "page_token")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    page_size: int
    page_token: str
    def __init__(self, workspace_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkspaceEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WorkspaceEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[WorkspaceEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("types", "workspace_id", "node_id", "start_time", "end_time", "page_size", "page_token")
    TYPES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[EventType]
    workspace_id: str
    node_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, types: _Optional[_Iterable[_Union[EventType, str]]] = ..., workspace_id: _Optional[str] = ..., node_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token", "resume_after_sequence")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESUME_AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WorkspaceEvent]
    next_page_token: str
    resume_after_sequence: int
    def __init__(self, events: _Optional[_Iterable[_Union[WorkspaceEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., resume_after_sequence: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("types", "workspace_id", "node_id", "start_time", "end_time", "after_sequence")
    TYPES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[EventType]
    workspace_id: str
    node_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    after_sequence: int
    def __init__(self, types: _Optional[_Iterable[_Union[EventType, str]]] = ..., workspace_id: _Optional[str] = ..., node_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("event", "resume_after_sequence")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RESUME_AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    event: WorkspaceEvent
    resume_after_sequence: int
    def __init__(self, event: _Optional[_Union[WorkspaceEvent, _Mapping]] = ..., resume_after_sequence: _Optional[int] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("instance_id", "execution_generation", "node_id", "phase", "reason", "restart_count", "holds_execution", "observe_time", "create_time")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    HOLDS_EXECUTION_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    execution_generation: int
    node_id: str
    phase: InstancePhase
    reason: str
    restart_count: int
    holds_execution: bool
    observe_time: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, instance_id: _Optional[str] = ..., execution_generation: _Optional[int] = ..., node_id: _Optional[str] = ..., phase: _Optional[_Union[InstancePhase, str]] = ..., reason: _Optional[str] = ..., restart_count: _Optional[int] = ..., holds_execution: _Optional[bool] = ..., observe_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListWorkspaceInstancesRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class ListWorkspaceInstancesResponse(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ...) -> None: ...
