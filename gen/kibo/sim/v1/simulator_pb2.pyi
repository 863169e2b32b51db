from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Fault(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_UNSPECIFIED: _ClassVar[Fault]
    FAULT_GUEST_REBOOT: _ClassVar[Fault]
    FAULT_GUEST_POWEROFF: _ClassVar[Fault]
    FAULT_VMM_CRASH: _ClassVar[Fault]
    FAULT_HOST_OOM: _ClassVar[Fault]
    FAULT_GUEST_HANG: _ClassVar[Fault]
    FAULT_SYNC_FAIL: _ClassVar[Fault]
    FAULT_STALL: _ClassVar[Fault]
    FAULT_UNSTALL: _ClassVar[Fault]
    FAULT_NODE_SILENT: _ClassVar[Fault]
    FAULT_NODE_BACK: _ClassVar[Fault]
    FAULT_CREATE_FAIL: _ClassVar[Fault]
    FAULT_CREATE_FAIL_HOLDING: _ClassVar[Fault]
    FAULT_DESTROY_FAIL: _ClassVar[Fault]
    FAULT_STORAGE_POOL_LOST: _ClassVar[Fault]
    FAULT_GUEST_OOM: _ClassVar[Fault]
FAULT_UNSPECIFIED: Fault
FAULT_GUEST_REBOOT: Fault
FAULT_GUEST_POWEROFF: Fault
FAULT_VMM_CRASH: Fault
FAULT_HOST_OOM: Fault
FAULT_GUEST_HANG: Fault
FAULT_SYNC_FAIL: Fault
FAULT_STALL: Fault
FAULT_UNSTALL: Fault
FAULT_NODE_SILENT: Fault
FAULT_NODE_BACK: Fault
FAULT_CREATE_FAIL: Fault
FAULT_CREATE_FAIL_HOLDING: Fault
FAULT_DESTROY_FAIL: Fault
FAULT_STORAGE_POOL_LOST: Fault
FAULT_GUEST_OOM: Fault

class InjectFaultRequest(_message.Message):
    __slots__ = ("workspace_id", "fault")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    fault: Fault
    def __init__(self, workspace_id: _Optional[str] = ..., fault: _Optional[_Union[Fault, str]] = ...) -> None: ...

class InjectFaultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
