import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE_TYPE_FILE: _ClassVar[FileType]
    FILE_TYPE_DIRECTORY: _ClassVar[FileType]
    FILE_TYPE_SYMLINK: _ClassVar[FileType]
    FILE_TYPE_OTHER: _ClassVar[FileType]

class FileEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_EVENT_TYPE_UNSPECIFIED: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_CREATE: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_WRITE: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_REMOVE: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_RENAME: _ClassVar[FileEventType]
    FILE_EVENT_TYPE_CHMOD: _ClassVar[FileEventType]
FILE_TYPE_UNSPECIFIED: FileType
FILE_TYPE_FILE: FileType
FILE_TYPE_DIRECTORY: FileType
FILE_TYPE_SYMLINK: FileType
FILE_TYPE_OTHER: FileType
FILE_EVENT_TYPE_UNSPECIFIED: FileEventType
FILE_EVENT_TYPE_CREATE: FileEventType
FILE_EVENT_TYPE_WRITE: FileEventType
FILE_EVENT_TYPE_REMOVE: FileEventType
FILE_EVENT_TYPE_RENAME: FileEventType
FILE_EVENT_TYPE_CHMOD: FileEventType

class IssueDataPlaneCredentialRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class IssueDataPlaneCredentialResponse(_message.Message):
    __slots__ = ("credential", "execution_generation", "credential_revision", "issue_time")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_REVISION_FIELD_NUMBER: _ClassVar[int]
    ISSUE_TIME_FIELD_NUMBER: _ClassVar[int]
    credential: str
    execution_generation: int
    credential_revision: int
    issue_time: _timestamp_pb2.Timestamp
    def __init__(self, credential: _Optional[str] = ..., execution_generation: _Optional[int] = ..., credential_revision: _Optional[int] = ..., issue_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ExecWorkspaceCommandRequest(_message.Message):
    __slots__ = ("credential", "argv", "stdin", "env", "working_dir", "timeout_seconds")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    credential: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    stdin: bytes
    env: _containers.ScalarMap[str, str]
    working_dir: str
    timeout_seconds: int
    def __init__(self, credential: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., stdin: _Optional[bytes] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class ExecWorkspaceCommandResponse(_message.Message):
    __slots__ = ("stdout", "stderr", "exit_code")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    exit_code: int
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., exit_code: _Optional[int] = ...) -> None: ...

class ReadWorkspaceFileRequest(_message.Message):
    __slots__ = ("credential", "path")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ReadWorkspaceFileResponse(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    def __init__(self, content: _Optional[bytes] = ...) -> None: ...

class WriteWorkspaceFileRequest(_message.Message):
    __slots__ = ("credential", "path", "content", "mode")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    content: bytes
    mode: int
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ..., content: _Optional[bytes] = ..., mode: _Optional[int] = ...) -> None: ...

class WriteWorkspaceFileResponse(_message.Message):
    __slots__ = ("size",)
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...

class ProcessSelector(_message.Message):
    __slots__ = ("pid", "tag")
    PID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    pid: int
    tag: str
    def __init__(self, pid: _Optional[int] = ..., tag: _Optional[str] = ...) -> None: ...

class PtySize(_message.Message):
    __slots__ = ("rows", "cols")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class StartWorkspaceProcessRequest(_message.Message):
    __slots__ = ("credential", "argv", "shell", "env", "working_dir", "user", "pty", "tag", "background", "stdin", "close_stdin")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    CLOSE_STDIN_FIELD_NUMBER: _ClassVar[int]
    credential: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    shell: str
    env: _containers.ScalarMap[str, str]
    working_dir: str
    user: str
    pty: PtySize
    tag: str
    background: bool
    stdin: bytes
    close_stdin: bool
    def __init__(self, credential: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., shell: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., user: _Optional[str] = ..., pty: _Optional[_Union[PtySize, _Mapping]] = ..., tag: _Optional[str] = ..., background: _Optional[bool] = ..., stdin: _Optional[bytes] = ..., close_stdin: _Optional[bool] = ...) -> None: ...

class ProcessStarted(_message.Message):
    __slots__ = ("pid", "tag")
    PID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    pid: int
    tag: str
    def __init__(self, pid: _Optional[int] = ..., tag: _Optional[str] = ...) -> None: ...

class StartWorkspaceProcessResponse(_message.Message):
    __slots__ = ("started", "stdout", "stderr", "pty", "dropped_bytes", "exit_code")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    started: ProcessStarted
    stdout: bytes
    stderr: bytes
    pty: bytes
    dropped_bytes: int
    exit_code: int
    def __init__(self, started: _Optional[_Union[ProcessStarted, _Mapping]] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., pty: _Optional[bytes] = ..., dropped_bytes: _Optional[int] = ..., exit_code: _Optional[int] = ...) -> None: ...

class ConnectWorkspaceProcessResponse(_message.Message):
    __slots__ = ("stdout", "stderr", "pty", "dropped_bytes", "exit_code", "replayed")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    pty: bytes
    dropped_bytes: int
    exit_code: int
    replayed: bool
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., pty: _Optional[bytes] = ..., dropped_bytes: _Optional[int] = ..., exit_code: _Optional[int] = ..., replayed: _Optional[bool] = ...) -> None: ...

class ConnectWorkspaceProcessRequest(_message.Message):
    __slots__ = ("credential", "process", "replay")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    credential: str
    process: ProcessSelector
    replay: bool
    def __init__(self, credential: _Optional[str] = ..., process: _Optional[_Union[ProcessSelector, _Mapping]] = ..., replay: _Optional[bool] = ...) -> None: ...

class WorkspaceProcess(_message.Message):
    __slots__ = ("pid", "tag", "argv", "pty", "running", "exit_code", "start_time", "working_dir", "user")
    PID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    pid: int
    tag: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    pty: bool
    running: bool
    exit_code: int
    start_time: _timestamp_pb2.Timestamp
    working_dir: str
    user: str
    def __init__(self, pid: _Optional[int] = ..., tag: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., pty: _Optional[bool] = ..., running: _Optional[bool] = ..., exit_code: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., working_dir: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class ListWorkspaceProcessesRequest(_message.Message):
    __slots__ = ("credential",)
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    credential: str
    def __init__(self, credential: _Optional[str] = ...) -> None: ...

class ListWorkspaceProcessesResponse(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[WorkspaceProcess]
    def __init__(self, processes: _Optional[_Iterable[_Union[WorkspaceProcess, _Mapping]]] = ...) -> None: ...

class SendWorkspaceProcessInputRequest(_message.Message):
    __slots__ = ("credential", "process", "data", "close_stdin")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CLOSE_STDIN_FIELD_NUMBER: _ClassVar[int]
    credential: str
    process: ProcessSelector
    data: bytes
    close_stdin: bool
    def __init__(self, credential: _Optional[str] = ..., process: _Optional[_Union[ProcessSelector, _Mapping]] = ..., data: _Optional[bytes] = ..., close_stdin: _Optional[bool] = ...) -> None: ...

class SendWorkspaceProcessInputResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SignalWorkspaceProcessRequest(_message.Message):
    __slots__ = ("credential", "process", "signal")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    credential: str
    process: ProcessSelector
    signal: int
    def __init__(self, credential: _Optional[str] = ..., process: _Optional[_Union[ProcessSelector, _Mapping]] = ..., signal: _Optional[int] = ...) -> None: ...

class SignalWorkspaceProcessResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResizeWorkspaceProcessRequest(_message.Message):
    __slots__ = ("credential", "process", "size")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    credential: str
    process: ProcessSelector
    size: PtySize
    def __init__(self, credential: _Optional[str] = ..., process: _Optional[_Union[ProcessSelector, _Mapping]] = ..., size: _Optional[_Union[PtySize, _Mapping]] = ...) -> None: ...

class ResizeWorkspaceProcessResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("path", "name", "type", "size", "mode", "uid", "gid", "owner", "group", "modify_time", "symlink_target")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MODIFY_TIME_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    path: str
    name: str
    type: FileType
    size: int
    mode: int
    uid: int
    gid: int
    owner: str
    group: str
    modify_time: _timestamp_pb2.Timestamp
    symlink_target: str
    def __init__(self, path: _Optional[str] = ..., name: _Optional[str] = ..., type: _Optional[_Union[FileType, str]] = ..., size: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., owner: _Optional[str] = ..., group: _Optional[str] = ..., modify_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., symlink_target: _Optional[str] = ...) -> None: ...

class StatWorkspacePathRequest(_message.Message):
    __slots__ = ("credential", "path")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class StatWorkspacePathResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ...) -> None: ...

class ListWorkspaceDirectoryRequest(_message.Message):
    __slots__ = ("credential", "path", "depth")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    depth: int
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ..., depth: _Optional[int] = ...) -> None: ...

class ListWorkspaceDirectoryResponse(_message.Message):
    __slots__ = ("entries", "truncated")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    truncated: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class MakeWorkspaceDirectoryRequest(_message.Message):
    __slots__ = ("credential", "path", "parents", "mode")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    parents: bool
    mode: int
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ..., parents: _Optional[bool] = ..., mode: _Optional[int] = ...) -> None: ...

class MakeWorkspaceDirectoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MoveWorkspacePathRequest(_message.Message):
    __slots__ = ("credential", "source", "destination")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    credential: str
    source: str
    destination: str
    def __init__(self, credential: _Optional[str] = ..., source: _Optional[str] = ..., destination: _Optional[str] = ...) -> None: ...

class MoveWorkspacePathResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemoveWorkspacePathRequest(_message.Message):
    __slots__ = ("credential", "path", "recursive")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    recursive: bool
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class RemoveWorkspacePathResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DownloadWorkspaceFileRequest(_message.Message):
    __slots__ = ("credential", "path", "offset", "archive")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    offset: int
    archive: bool
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., archive: _Optional[bool] = ...) -> None: ...

class DownloadWorkspaceFileResponse(_message.Message):
    __slots__ = ("info", "data")
    INFO_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    data: bytes
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class StartWorkspaceUploadRequest(_message.Message):
    __slots__ = ("credential", "path", "mode", "archive", "parents")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    mode: int
    archive: bool
    parents: bool
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., archive: _Optional[bool] = ..., parents: _Optional[bool] = ...) -> None: ...

class StartWorkspaceUploadResponse(_message.Message):
    __slots__ = ("upload_id",)
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    def __init__(self, upload_id: _Optional[str] = ...) -> None: ...

class WriteWorkspaceUploadRequest(_message.Message):
    __slots__ = ("credential", "upload_id", "offset", "data", "finish")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    credential: str
    upload_id: str
    offset: int
    data: bytes
    finish: bool
    def __init__(self, credential: _Optional[str] = ..., upload_id: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., finish: _Optional[bool] = ...) -> None: ...

class WriteWorkspaceUploadResponse(_message.Message):
    __slots__ = ("size", "finished")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    size: int
    finished: bool
    def __init__(self, size: _Optional[int] = ..., finished: _Optional[bool] = ...) -> None: ...

class CancelWorkspaceUploadRequest(_message.Message):
    __slots__ = ("credential", "upload_id")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    credential: str
    upload_id: str
    def __init__(self, credential: _Optional[str] = ..., upload_id: _Optional[str] = ...) -> None: ...

class CancelWorkspaceUploadResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchWorkspaceDirectoryRequest(_message.Message):
    __slots__ = ("credential", "path", "recursive")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    credential: str
    path: str
    recursive: bool
    def __init__(self, credential: _Optional[str] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class FileEvent(_message.Message):
    __slots__ = ("type", "path", "new_path", "is_directory")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NEW_PATH_FIELD_NUMBER: _ClassVar[int]
    IS_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    type: FileEventType
    path: str
    new_path: str
    is_directory: bool
    def __init__(self, type: _Optional[_Union[FileEventType, str]] = ..., path: _Optional[str] = ..., new_path: _Optional[str] = ..., is_directory: _Optional[bool] = ...) -> None: ...

class WatchWorkspaceDirectoryResponse(_message.Message):
    __slots__ = ("ready", "change", "overflow")
    READY_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    change: FileEvent
    overflow: bool
    def __init__(self, ready: _Optional[bool] = ..., change: _Optional[_Union[FileEvent, _Mapping]] = ..., overflow: _Optional[bool] = ...) -> None: ...
