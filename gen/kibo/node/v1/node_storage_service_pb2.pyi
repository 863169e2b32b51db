from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StorageFile(_message.Message):
    __slots__ = ("name", "size", "data_bytes", "digest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    data_bytes: int
    digest: bytes
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., data_bytes: _Optional[int] = ..., digest: _Optional[bytes] = ...) -> None: ...

class ListStorageRequest(_message.Message):
    __slots__ = ("workspace_id", "volume_ids")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUME_IDS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    volume_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, workspace_id: _Optional[str] = ..., volume_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListStorageResponse(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[StorageFile]
    def __init__(self, files: _Optional[_Iterable[_Union[StorageFile, _Mapping]]] = ...) -> None: ...

class ReadStorageRequest(_message.Message):
    __slots__ = ("workspace_id", "name", "offset")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    name: str
    offset: int
    def __init__(self, workspace_id: _Optional[str] = ..., name: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class StorageChunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReadStorageResponse(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: StorageChunk
    def __init__(self, chunk: _Optional[_Union[StorageChunk, _Mapping]] = ...) -> None: ...

class GetStorageReceivedRequest(_message.Message):
    __slots__ = ("workspace_id", "file")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    file: StorageFile
    def __init__(self, workspace_id: _Optional[str] = ..., file: _Optional[_Union[StorageFile, _Mapping]] = ...) -> None: ...

class GetStorageReceivedResponse(_message.Message):
    __slots__ = ("synced_offset",)
    SYNCED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    synced_offset: int
    def __init__(self, synced_offset: _Optional[int] = ...) -> None: ...

class WriteStorageRequest(_message.Message):
    __slots__ = ("workspace_id", "file", "chunks")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    file: StorageFile
    chunks: _containers.RepeatedCompositeFieldContainer[StorageChunk]
    def __init__(self, workspace_id: _Optional[str] = ..., file: _Optional[_Union[StorageFile, _Mapping]] = ..., chunks: _Optional[_Iterable[_Union[StorageChunk, _Mapping]]] = ...) -> None: ...

class WriteStorageResponse(_message.Message):
    __slots__ = ("synced_offset",)
    SYNCED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    synced_offset: int
    def __init__(self, synced_offset: _Optional[int] = ...) -> None: ...

class FinishStorageRequest(_message.Message):
    __slots__ = ("workspace_id", "files")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    files: _containers.RepeatedCompositeFieldContainer[StorageFile]
    def __init__(self, workspace_id: _Optional[str] = ..., files: _Optional[_Iterable[_Union[StorageFile, _Mapping]]] = ...) -> None: ...

class FinishStorageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DropStorageRequest(_message.Message):
    __slots__ = ("workspace_id", "volume_ids", "received_only")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUME_IDS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_ONLY_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    volume_ids: _containers.RepeatedScalarFieldContainer[str]
    received_only: bool
    def __init__(self, workspace_id: _Optional[str] = ..., volume_ids: _Optional[_Iterable[str]] = ..., received_only: _Optional[bool] = ...) -> None: ...

class DropStorageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
