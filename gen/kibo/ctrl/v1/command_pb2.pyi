import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from kibo.ctrl.v1 import workspace_pb2 as _workspace_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CommandState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_STATE_UNSPECIFIED: _ClassVar[CommandState]
    COMMAND_STATE_PENDING: _ClassVar[CommandState]
    COMMAND_STATE_RUNNING: _ClassVar[CommandState]
    COMMAND_STATE_SUCCEEDED: _ClassVar[CommandState]
    COMMAND_STATE_FAILED: _ClassVar[CommandState]

class CommandKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_KIND_UNSPECIFIED: _ClassVar[CommandKind]
    COMMAND_KIND_CREATE: _ClassVar[CommandKind]
    COMMAND_KIND_STOP: _ClassVar[CommandKind]
    COMMAND_KIND_FORCE_STOP: _ClassVar[CommandKind]
    COMMAND_KIND_START: _ClassVar[CommandKind]
    COMMAND_KIND_DELETE: _ClassVar[CommandKind]
    COMMAND_KIND_SET_EXPIRATION: _ClassVar[CommandKind]
    COMMAND_KIND_CLEAR_EXPIRATION: _ClassVar[CommandKind]
    COMMAND_KIND_SET_LABELS: _ClassVar[CommandKind]
    COMMAND_KIND_RESIZE: _ClassVar[CommandKind]
    COMMAND_KIND_SET_NETWORK_POLICY: _ClassVar[CommandKind]
    COMMAND_KIND_BIND_VOLUME: _ClassVar[CommandKind]
    COMMAND_KIND_UNBIND_VOLUME: _ClassVar[CommandKind]
    COMMAND_KIND_REVOKE_DATA_PLANE_ACCESS: _ClassVar[CommandKind]
    COMMAND_KIND_CREATE_VOLUME: _ClassVar[CommandKind]
    COMMAND_KIND_DELETE_VOLUME: _ClassVar[CommandKind]
    COMMAND_KIND_MOVE: _ClassVar[CommandKind]
    COMMAND_KIND_CREATE_EXPOSURE: _ClassVar[CommandKind]
    COMMAND_KIND_DELETE_EXPOSURE: _ClassVar[CommandKind]
COMMAND_STATE_UNSPECIFIED: CommandState
COMMAND_STATE_PENDING: CommandState
COMMAND_STATE_RUNNING: CommandState
COMMAND_STATE_SUCCEEDED: CommandState
COMMAND_STATE_FAILED: CommandState
COMMAND_KIND_UNSPECIFIED: CommandKind
COMMAND_KIND_CREATE: CommandKind
COMMAND_KIND_STOP: CommandKind
COMMAND_KIND_FORCE_STOP: CommandKind
COMMAND_KIND_START: CommandKind
COMMAND_KIND_DELETE: CommandKind
COMMAND_KIND_SET_EXPIRATION: CommandKind
COMMAND_KIND_CLEAR_EXPIRATION: CommandKind
COMMAND_KIND_SET_LABELS: CommandKind
COMMAND_KIND_RESIZE: CommandKind
COMMAND_KIND_SET_NETWORK_POLICY: CommandKind
COMMAND_KIND_BIND_VOLUME: CommandKind
COMMAND_KIND_UNBIND_VOLUME: CommandKind
COMMAND_KIND_REVOKE_DATA_PLANE_ACCESS: CommandKind
COMMAND_KIND_CREATE_VOLUME: CommandKind
COMMAND_KIND_DELETE_VOLUME: CommandKind
COMMAND_KIND_MOVE: CommandKind
COMMAND_KIND_CREATE_EXPOSURE: CommandKind
COMMAND_KIND_DELETE_EXPOSURE: CommandKind

class CommandResult(_message.Message):
    __slots__ = ("durability",)
    DURABILITY_FIELD_NUMBER: _ClassVar[int]
    durability: _workspace_pb2.StopDurability
    def __init__(self, durability: _Optional[_Union[_workspace_pb2.StopDurability, str]] = ...) -> None: ...

class WorkspaceCommand(_message.Message):
    __slots__ = ("command_id", "workspace_id", "state", "result", "error", "kind", "create_time", "update_time", "stop_cause", "volume_id", "progress")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    STOP_CAUSE_FIELD_NUMBER: _ClassVar[int]
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    workspace_id: str
    state: CommandState
    result: CommandResult
    error: _status_pb2.Status
    kind: CommandKind
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    stop_cause: _workspace_pb2.StopCause
    volume_id: str
    progress: CommandProgress
    def __init__(self, command_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., state: _Optional[_Union[CommandState, str]] = ..., result: _Optional[_Union[CommandResult, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., kind: _Optional[_Union[CommandKind, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stop_cause: _Optional[_Union[_workspace_pb2.StopCause, str]] = ..., volume_id: _Optional[str] = ..., progress: _Optional[_Union[CommandProgress, _Mapping]] = ...) -> None: ...

class CommandProgress(_message.Message):
    __slots__ = ("done_bytes", "total_bytes", "detail")
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    done_bytes: int
    total_bytes: int
    detail: str
    def __init__(self, done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...
