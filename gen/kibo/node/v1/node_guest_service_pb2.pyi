from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunGuestJobRequest(_message.Message):
    __slots__ = ("instance_id", "job", "stdin", "timeout_seconds")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    job: bytes
    stdin: bytes
    timeout_seconds: float
    def __init__(self, instance_id: _Optional[str] = ..., job: _Optional[bytes] = ..., stdin: _Optional[bytes] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class GuestOutput(_message.Message):
    __slots__ = ("stream", "data")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    stream: str
    data: bytes
    def __init__(self, stream: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class GuestExit(_message.Message):
    __slots__ = ("code",)
    CODE_FIELD_NUMBER: _ClassVar[int]
    code: int
    def __init__(self, code: _Optional[int] = ...) -> None: ...

class GuestRefusal(_message.Message):
    __slots__ = ("status", "message", "errno")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    status: str
    message: str
    errno: str
    def __init__(self, status: _Optional[str] = ..., message: _Optional[str] = ..., errno: _Optional[str] = ...) -> None: ...

class RunGuestJobResponse(_message.Message):
    __slots__ = ("output", "exit", "refused")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    output: GuestOutput
    exit: GuestExit
    refused: GuestRefusal
    def __init__(self, output: _Optional[_Union[GuestOutput, _Mapping]] = ..., exit: _Optional[_Union[GuestExit, _Mapping]] = ..., refused: _Optional[_Union[GuestRefusal, _Mapping]] = ...) -> None: ...

class GuestPortOpen(_message.Message):
    __slots__ = ("instance_id", "port")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    port: int
    def __init__(self, instance_id: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class GuestPortOpened(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GuestPortEof(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenGuestPortRequest(_message.Message):
    __slots__ = ("open", "data", "eof")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    open: GuestPortOpen
    data: bytes
    eof: GuestPortEof
    def __init__(self, open: _Optional[_Union[GuestPortOpen, _Mapping]] = ..., data: _Optional[bytes] = ..., eof: _Optional[_Union[GuestPortEof, _Mapping]] = ...) -> None: ...

class OpenGuestPortResponse(_message.Message):
    __slots__ = ("opened", "data", "eof", "refused")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    opened: GuestPortOpened
    data: bytes
    eof: GuestPortEof
    refused: GuestRefusal
    def __init__(self, opened: _Optional[_Union[GuestPortOpened, _Mapping]] = ..., data: _Optional[bytes] = ..., eof: _Optional[_Union[GuestPortEof, _Mapping]] = ..., refused: _Optional[_Union[GuestRefusal, _Mapping]] = ...) -> None: ...

class CallGuestProcessesRequest(_message.Message):
    __slots__ = ("instance_id", "operation", "arguments", "data")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    operation: str
    arguments: bytes
    data: bytes
    def __init__(self, instance_id: _Optional[str] = ..., operation: _Optional[str] = ..., arguments: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class CallGuestProcessesResponse(_message.Message):
    __slots__ = ("result", "refused")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    result: bytes
    refused: GuestRefusal
    def __init__(self, result: _Optional[bytes] = ..., refused: _Optional[_Union[GuestRefusal, _Mapping]] = ...) -> None: ...

class FollowGuestProcessRequest(_message.Message):
    __slots__ = ("instance_id", "selector", "replay")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    selector: bytes
    replay: bool
    def __init__(self, instance_id: _Optional[str] = ..., selector: _Optional[bytes] = ..., replay: _Optional[bool] = ...) -> None: ...

class FollowGuestProcessResponse(_message.Message):
    __slots__ = ("output", "exit", "refused", "dropped", "replayed")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    output: GuestOutput
    exit: GuestExit
    refused: GuestRefusal
    dropped: int
    replayed: bool
    def __init__(self, output: _Optional[_Union[GuestOutput, _Mapping]] = ..., exit: _Optional[_Union[GuestExit, _Mapping]] = ..., refused: _Optional[_Union[GuestRefusal, _Mapping]] = ..., dropped: _Optional[int] = ..., replayed: _Optional[bool] = ...) -> None: ...
