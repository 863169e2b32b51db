import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from kibo.ctrl.v1 import workspace_pb2 as _workspace_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VolumeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VOLUME_STATE_UNSPECIFIED: _ClassVar[VolumeState]
    VOLUME_STATE_PENDING: _ClassVar[VolumeState]
    VOLUME_STATE_READY: _ClassVar[VolumeState]
    VOLUME_STATE_DELETED: _ClassVar[VolumeState]
VOLUME_STATE_UNSPECIFIED: VolumeState
VOLUME_STATE_PENDING: VolumeState
VOLUME_STATE_READY: VolumeState
VOLUME_STATE_DELETED: VolumeState

class Volume(_message.Message):
    __slots__ = ("volume_id", "storage_pool", "capacity_gib", "state", "workspace_id", "create_time")
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    STORAGE_POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_GIB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    volume_id: str
    storage_pool: str
    capacity_gib: int
    state: VolumeState
    workspace_id: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, volume_id: _Optional[str] = ..., storage_pool: _Optional[str] = ..., capacity_gib: _Optional[int] = ..., state: _Optional[_Union[VolumeState, str]] = ..., workspace_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateVolumeRequest(_message.Message):
    __slots__ = ("metadata", "capacity_gib")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_GIB_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    capacity_gib: int
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., capacity_gib: _Optional[int] = ...) -> None: ...

class CreateVolumeResponse(_message.Message):
    __slots__ = ("volume",)
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    volume: Volume
    def __init__(self, volume: _Optional[_Union[Volume, _Mapping]] = ...) -> None: ...

class GetVolumeRequest(_message.Message):
    __slots__ = ("volume_id",)
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    volume_id: str
    def __init__(self, volume_id: _Optional[str] = ...) -> None: ...

class GetVolumeResponse(_message.Message):
    __slots__ = ("volume",)
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    volume: Volume
    def __init__(self, volume: _Optional[_Union[Volume, _Mapping]] = ...) -> None: ...

class DeleteVolumeRequest(_message.Message):
    __slots__ = ("metadata", "volume_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _workspace_pb2.CommandMetadata
    volume_id: str
    def __init__(self, metadata: _Optional[_Union[_workspace_pb2.CommandMetadata, _Mapping]] = ..., volume_id: _Optional[str] = ...) -> None: ...

class DeleteVolumeResponse(_message.Message):
    __slots__ = ("volume",)
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    volume: Volume
    def __init__(self, volume: _Optional[_Union[Volume, _Mapping]] = ...) -> None: ...
