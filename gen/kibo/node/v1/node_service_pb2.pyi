from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IssueNodeCertificateRequest(_message.Message):
    __slots__ = ("node_id", "csr_pem", "join_proof")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    JOIN_PROOF_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    csr_pem: str
    join_proof: str
    def __init__(self, node_id: _Optional[str] = ..., csr_pem: _Optional[str] = ..., join_proof: _Optional[str] = ...) -> None: ...

class IssueNodeCertificateResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_certificate_pem", "node_port")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_PORT_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: str
    ca_certificate_pem: str
    node_port: int
    def __init__(self, certificate_pem: _Optional[str] = ..., ca_certificate_pem: _Optional[str] = ..., node_port: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("node_id", "vcpus", "memory_mib", "storage_pool", "labels", "capabilities", "data_plane_address", "data_plane_token", "resources", "disk")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VCPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    STORAGE_POOL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    vcpus: int
    memory_mib: int
    storage_pool: str
    labels: _containers.ScalarMap[str, str]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    data_plane_address: str
    data_plane_token: str
    resources: NodeResources
    disk: DiskStatus
    def __init__(self, node_id: _Optional[str] = ..., vcpus: _Optional[int] = ..., memory_mib: _Optional[int] = ..., storage_pool: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., capabilities: _Optional[_Iterable[str]] = ..., data_plane_address: _Optional[str] = ..., data_plane_token: _Optional[str] = ..., resources: _Optional[_Union[NodeResources, _Mapping]] = ..., disk: _Optional[_Union[DiskStatus, _Mapping]] = ...) -> None: ...

class NodeResources(_message.Message):
    __slots__ = ("host_vcpus", "host_memory_mib", "host_disk_gib", "cpu_allocation_ratio", "memory_allocation_ratio", "disk_allocation_ratio", "storage_gib")
    HOST_VCPUS_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    HOST_DISK_GIB_FIELD_NUMBER: _ClassVar[int]
    CPU_ALLOCATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ALLOCATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    DISK_ALLOCATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    STORAGE_GIB_FIELD_NUMBER: _ClassVar[int]
    host_vcpus: int
    host_memory_mib: int
    host_disk_gib: int
    cpu_allocation_ratio: float
    memory_allocation_ratio: float
    disk_allocation_ratio: float
    storage_gib: int
    def __init__(self, host_vcpus: _Optional[int] = ..., host_memory_mib: _Optional[int] = ..., host_disk_gib: _Optional[int] = ..., cpu_allocation_ratio: _Optional[float] = ..., memory_allocation_ratio: _Optional[float] = ..., disk_allocation_ratio: _Optional[float] = ..., storage_gib: _Optional[int] = ...) -> None: ...

class DiskStatus(_message.Message):
    __slots__ = ("free_bytes", "reserve_bytes", "promised_bytes", "pressure")
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROMISED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRESSURE_FIELD_NUMBER: _ClassVar[int]
    free_bytes: int
    reserve_bytes: int
    promised_bytes: int
    pressure: bool
    def __init__(self, free_bytes: _Optional[int] = ..., reserve_bytes: _Optional[int] = ..., promised_bytes: _Optional[int] = ..., pressure: _Optional[bool] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("node_id", "lease_seconds")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    lease_seconds: float
    def __init__(self, node_id: _Optional[str] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class Cursor(_message.Message):
    __slots__ = ("epoch", "seq")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    seq: int
    def __init__(self, epoch: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class WatchStepsRequest(_message.Message):
    __slots__ = ("node_id", "resume_after")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_AFTER_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    resume_after: Cursor
    def __init__(self, node_id: _Optional[str] = ..., resume_after: _Optional[_Union[Cursor, _Mapping]] = ...) -> None: ...

class InstanceStep(_message.Message):
    __slots__ = ("instance_id", "step", "done_step", "record")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DONE_STEP_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    step: int
    done_step: int
    record: bytes
    def __init__(self, instance_id: _Optional[str] = ..., step: _Optional[int] = ..., done_step: _Optional[int] = ..., record: _Optional[bytes] = ...) -> None: ...

class StorageRelease(_message.Message):
    __slots__ = ("workspace_id", "volume_ids")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUME_IDS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    volume_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, workspace_id: _Optional[str] = ..., volume_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class VolumeRelease(_message.Message):
    __slots__ = ("volume_id",)
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    volume_id: str
    def __init__(self, volume_id: _Optional[str] = ...) -> None: ...

class WorkItem(_message.Message):
    __slots__ = ("instance", "storage", "volume")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    instance: InstanceStep
    storage: StorageRelease
    volume: VolumeRelease
    def __init__(self, instance: _Optional[_Union[InstanceStep, _Mapping]] = ..., storage: _Optional[_Union[StorageRelease, _Mapping]] = ..., volume: _Optional[_Union[VolumeRelease, _Mapping]] = ...) -> None: ...

class WatchStepsResponse(_message.Message):
    __slots__ = ("cursor", "snapshot", "items")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    cursor: Cursor
    snapshot: bool
    items: _containers.RepeatedCompositeFieldContainer[WorkItem]
    def __init__(self, cursor: _Optional[_Union[Cursor, _Mapping]] = ..., snapshot: _Optional[bool] = ..., items: _Optional[_Iterable[_Union[WorkItem, _Mapping]]] = ...) -> None: ...

class GetLaunchSpecRequest(_message.Message):
    __slots__ = ("node_id", "instance_id", "step")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    instance_id: str
    step: int
    def __init__(self, node_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class GetLaunchSpecResponse(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: bytes
    def __init__(self, spec: _Optional[bytes] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("node_id", "instance_id", "step", "kind", "body")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    instance_id: str
    step: int
    kind: str
    body: bytes
    def __init__(self, node_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., step: _Optional[int] = ..., kind: _Optional[str] = ..., body: _Optional[bytes] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportBatchRequest(_message.Message):
    __slots__ = ("node_id", "reports")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reports: _containers.RepeatedCompositeFieldContainer[ReportRequest]
    def __init__(self, node_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[ReportRequest, _Mapping]]] = ...) -> None: ...

class ReportBatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportStorageReleasedRequest(_message.Message):
    __slots__ = ("node_id", "workspace_id", "volume_ids")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUME_IDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    workspace_id: str
    volume_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., volume_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportStorageReleasedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportVolumeReleasedRequest(_message.Message):
    __slots__ = ("node_id", "volume_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUME_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    volume_id: str
    def __init__(self, node_id: _Optional[str] = ..., volume_id: _Optional[str] = ...) -> None: ...

class ReportVolumeReleasedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("node_id", "disk")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    disk: DiskStatus
    def __init__(self, node_id: _Optional[str] = ..., disk: _Optional[_Union[DiskStatus, _Mapping]] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease_seconds",)
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_seconds: float
    def __init__(self, lease_seconds: _Optional[float] = ...) -> None: ...
