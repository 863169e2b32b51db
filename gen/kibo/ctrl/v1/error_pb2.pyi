from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_CONFLICT: _ClassVar[ErrorReason]
    ERROR_REASON_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_ARGUMENT: _ClassVar[ErrorReason]
    ERROR_REASON_RESERVED_COMMAND_ID: _ClassVar[ErrorReason]
    ERROR_REASON_COMMAND_ID_REUSED: _ClassVar[ErrorReason]
    ERROR_REASON_REVISION_MISMATCH: _ClassVar[ErrorReason]
    ERROR_REASON_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_UNAUTHENTICATED: _ClassVar[ErrorReason]
    ERROR_REASON_PERMISSION_DENIED: _ClassVar[ErrorReason]
    ERROR_REASON_QUOTA_EXCEEDED: _ClassVar[ErrorReason]
    ERROR_REASON_RATE_LIMITED: _ClassVar[ErrorReason]
    ERROR_REASON_UNIMPLEMENTED: _ClassVar[ErrorReason]
    ERROR_REASON_GUEST_ERROR: _ClassVar[ErrorReason]
    ERROR_REASON_NO_CAPACITY: _ClassVar[ErrorReason]
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_CONFLICT: ErrorReason
ERROR_REASON_NOT_FOUND: ErrorReason
ERROR_REASON_INVALID_ARGUMENT: ErrorReason
ERROR_REASON_RESERVED_COMMAND_ID: ErrorReason
ERROR_REASON_COMMAND_ID_REUSED: ErrorReason
ERROR_REASON_REVISION_MISMATCH: ErrorReason
ERROR_REASON_UNAVAILABLE: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_PERMISSION_DENIED: ErrorReason
ERROR_REASON_QUOTA_EXCEEDED: ErrorReason
ERROR_REASON_RATE_LIMITED: ErrorReason
ERROR_REASON_UNIMPLEMENTED: ErrorReason
ERROR_REASON_GUEST_ERROR: ErrorReason
ERROR_REASON_NO_CAPACITY: ErrorReason

class ErrorDetail(_message.Message):
    __slots__ = ("reason", "field", "workspace_state", "hint")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_STATE_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    reason: ErrorReason
    field: str
    workspace_state: str
    hint: str
    def __init__(self, reason: _Optional[_Union[ErrorReason, str]] = ..., field: _Optional[str] = ..., workspace_state: _Optional[str] = ..., hint: _Optional[str] = ...) -> None: ...
