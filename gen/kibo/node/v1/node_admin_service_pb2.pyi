from kibo.ctrl.v1 import command_pb2 as _command_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_READY: _ClassVar[NodeState]
    NODE_STATE_SILENT: _ClassVar[NodeState]
    NODE_STATE_CORDONED: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
    NODE_STATE_DRAINED: _ClassVar[NodeState]
    NODE_STATE_FORGOTTEN: _ClassVar[NodeState]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_READY: NodeState
NODE_STATE_SILENT: NodeState
NODE_STATE_CORDONED: NodeState
NODE_STATE_DRAINING: NodeState
NODE_STATE_DRAINED: NodeState
NODE_STATE_FORGOTTEN: NodeState

class Node(_message.Message):
    __slots__ = ("id", "state", "vcpus", "memory_mib", "storage_pool", "labels", "capabilities", "used_vcpus", "used_memory_mib", "instances", "cordoned", "silent", "lease_expire_time", "join_time", "host_vcpus", "host_memory_mib", "cpu_allocation_ratio", "memory_allocation_ratio", "host_disk_gib", "disk_allocation_ratio", "storage_gib", "storage_promised_bytes", "disk_free_bytes", "disk_reserve_bytes", "conditions")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VCPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    STORAGE_POOL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    USED_VCPUS_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    SILENT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    JOIN_TIME_FIELD_NUMBER: _ClassVar[int]
    HOST_VCPUS_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    CPU_ALLOCATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ALLOCATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    HOST_DISK_GIB_FIELD_NUMBER: _ClassVar[int]
    DISK_ALLOCATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    STORAGE_GIB_FIELD_NUMBER: _ClassVar[int]
    STORAGE_PROMISED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: NodeState
    vcpus: int
    memory_mib: int
    storage_pool: str
    labels: _containers.ScalarMap[str, str]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    used_vcpus: int
    used_memory_mib: int
    instances: int
    cordoned: bool
    silent: bool
    lease_expire_time: float
    join_time: float
    host_vcpus: int
    host_memory_mib: int
    cpu_allocation_ratio: float
    memory_allocation_ratio: float
    host_disk_gib: int
    disk_allocation_ratio: float
    storage_gib: int
    storage_promised_bytes: int
    disk_free_bytes: int
    disk_reserve_bytes: int
    conditions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., vcpus: _Optional[int] = ..., memory_mib: _Optional[int] = ..., storage_pool: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., capabilities: _Optional[_Iterable[str]] = ..., used_vcpus: _Optional[int] = ..., used_memory_mib: _Optional[int] = ..., instances: _Optional[int] = ..., cordoned: _Optional[bool] = ..., silent: _Optional[bool] = ..., lease_expire_time: _Optional[float] = ..., join_time: _Optional[float] = ..., host_vcpus: _Optional[int] = ..., host_memory_mib: _Optional[int] = ..., cpu_allocation_ratio: _Optional[float] = ..., memory_allocation_ratio: _Optional[float] = ..., host_disk_gib: _Optional[int] = ..., disk_allocation_ratio: _Optional[float] = ..., storage_gib: _Optional[int] = ..., storage_promised_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., disk_reserve_bytes: _Optional[int] = ..., conditions: _Optional[_Iterable[str]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class CordonNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class CordonNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class UncordonNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class UncordonNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "move_stopped")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MOVE_STOPPED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    move_stopped: bool
    def __init__(self, node_id: _Optional[str] = ..., move_stopped: _Optional[bool] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("node", "moves", "unmoved")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    UNMOVED_FIELD_NUMBER: _ClassVar[int]
    node: Node
    moves: _containers.RepeatedCompositeFieldContainer[_command_pb2.WorkspaceCommand]
    unmoved: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ..., moves: _Optional[_Iterable[_Union[_command_pb2.WorkspaceCommand, _Mapping]]] = ..., unmoved: _Optional[_Iterable[str]] = ...) -> None: ...

class ForgetNodeRequest(_message.Message):
    __slots__ = ("node_id", "abandon_disks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ABANDON_DISKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    abandon_disks: bool
    def __init__(self, node_id: _Optional[str] = ..., abandon_disks: _Optional[bool] = ...) -> None: ...

class ForgetNodeResponse(_message.Message):
    __slots__ = ("node", "released_workspace_ids", "abandoned_workspace_ids", "abandoned_volume_ids")
    NODE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_WORKSPACE_IDS_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_WORKSPACE_IDS_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_VOLUME_IDS_FIELD_NUMBER: _ClassVar[int]
    node: Node
    released_workspace_ids: _containers.RepeatedScalarFieldContainer[str]
    abandoned_workspace_ids: _containers.RepeatedScalarFieldContainer[str]
    abandoned_volume_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ..., released_workspace_ids: _Optional[_Iterable[str]] = ..., abandoned_workspace_ids: _Optional[_Iterable[str]] = ..., abandoned_volume_ids: _Optional[_Iterable[str]] = ...) -> None: ...
