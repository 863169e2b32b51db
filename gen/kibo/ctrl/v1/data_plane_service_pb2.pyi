import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
