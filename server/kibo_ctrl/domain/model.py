"""The records the store keeps, and the enums they use.

Enum numbers equal the wire enums in proto/ (a unit test checks it), so rendering is a
cast; nothing here imports generated code, transports, stores or runtimes.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

import msgspec


class WorkspaceState(IntEnum):
    UNSPECIFIED = 0
    CREATING = 1
    AVAILABLE = 2
    STOPPING = 3
    STOPPED = 4
    STARTING = 5
    FAILED = 6
    UNKNOWN = 7
    DELETING = 8
    DELETED = 9


class CommandState(IntEnum):
    UNSPECIFIED = 0
    PENDING = 1
    RUNNING = 2
    SUCCEEDED = 3
    FAILED = 4


class CommandKind(IntEnum):
    UNSPECIFIED = 0
    CREATE = 1
    STOP = 2
    FORCE_STOP = 3
    START = 4
    DELETE = 5
    SET_EXPIRATION = 6
    CLEAR_EXPIRATION = 7
    SET_LABELS = 8
    RESIZE = 9
    SET_NETWORK_POLICY = 10
    BIND_VOLUME = 11
    UNBIND_VOLUME = 12
    REVOKE_DATA_PLANE_ACCESS = 13
    CREATE_VOLUME = 14
    DELETE_VOLUME = 15
    # An operator's: the workspace's disks to another node (engine/moves.py).
    MOVE = 16
    # A URL to a guest port, and its revocation (api/exposures.py).
    CREATE_EXPOSURE = 17
    DELETE_EXPOSURE = 18


class ExpirationAction(IntEnum):
    UNSPECIFIED = 0
    STOP = 1
    DELETE = 2


class StopCause(IntEnum):
    UNSPECIFIED = 0
    REQUESTED = 1
    EXPIRED = 2
    GUEST_SHUTDOWN = 3
    HOST_MEMORY_EXHAUSTED = 4


class StopDurability(IntEnum):
    UNSPECIFIED = 0
    CONFIRMED = 1
    UNCONFIRMED = 2


class NetworkEgress(IntEnum):
    UNSPECIFIED = 0
    ALLOW_ALL = 1
    DENY_ALL = 2
    ALLOW_LISTED = 3


class Phase(IntEnum):
    """The internal runtime status of an instance: richer than the visible state."""

    UNSPECIFIED = 0
    PENDING = 1
    SCHEDULED = 2
    PROVISIONING = 3
    LAUNCHING = 4
    RUNNING = 5
    RESTARTING = 6
    STOPPING = 7
    STOPPED = 8
    EXITED = 9
    FAILED = 10
    RELEASED = 11


class Desired(IntEnum):
    """What the control plane wants the node to do with an instance."""

    RUNNING = 1
    STOPPED = 2
    FORCE_STOPPED = 3
    DESTROYED = 4


class Component(IntEnum):
    UNSPECIFIED = 0
    INSTANCE = 1
    RESERVATION = 2
    NETWORK = 3
    VOLUME_ATTACHMENT = 4
    RETAINED_LAYER = 5
    VOLUME_DELETION = 6
    LAYER_MOUNT = 7


# The parts a running instance holds on its node; all released by a stop.
EXECUTION_PARTS = (
    Component.INSTANCE,
    Component.RESERVATION,
    Component.NETWORK,
    Component.VOLUME_ATTACHMENT,
    Component.LAYER_MOUNT,
)


class ComponentStatus(IntEnum):
    UNSPECIFIED = 0
    RELEASED = 1
    PRESENT = 2
    PENDING = 3
    ISOLATED = 4
    UNKNOWN = 5


class CleanupState(IntEnum):
    UNSPECIFIED = 0
    COMPLETE = 1
    PROCESSING = 2
    NEEDS_ATTENTION = 3
    UNKNOWN = 4


class CleanupCompleteness(IntEnum):
    UNSPECIFIED = 0
    COMPLETE = 1
    PARTIAL = 2
    UNKNOWN = 3


class CleanupSource(IntEnum):
    UNSPECIFIED = 0
    NODE_REPORT = 1
    CONTROL_PLANE = 2


class EventType(IntEnum):
    UNSPECIFIED = 0
    STATE_CHANGED = 1
    COMMAND_ACCEPTED = 2
    COMMAND_SUCCEEDED = 3
    COMMAND_FAILED = 4
    SCHEDULED = 5
    UNSCHEDULABLE = 6
    GUEST_RESET = 7
    GUEST_NOT_RESPONDING = 8
    NODE_SILENT = 9
    NODE_BACK = 10
    EXPIRED = 11
    SERVER_STOP = 12
    INSTANCE_PHASE = 13
    STORAGE_RELEASED = 14
    GUEST_OOM_KILL = 15


class VolumeState(IntEnum):
    UNSPECIFIED = 0
    PENDING = 1
    READY = 2
    DELETED = 3


class Backend(StrEnum):
    FIRECRACKER = "firecracker"
    KIBOVM = "kibovm"


# gRPC status codes a command can end with (google.rpc.Code numbers).
class ErrorCode(IntEnum):
    CANCELLED = 1
    # A step refused for a reason waiting will not fix (a move the target has no room for).
    FAILED_PRECONDITION = 9
    ABORTED = 10
    UNAVAILABLE = 14


class Resources(msgspec.Struct):
    vcpus: int
    memory_mib: int
    writable_layer_gib: int


class Binding(msgspec.Struct):
    volume_id: str
    mount_path: str
    delete_with_workspace: bool
    # The volume's capacity, copied from its record when bound (a volume's capacity never
    # changes), so a workspace renders its volumes' sizes without reading each volume.
    # 0 in workspaces stored before it was kept here.
    capacity_gib: int = 0


class NetworkPolicy(msgspec.Struct):
    """What a guest may reach, enforced by its node (runtime/process/network/). Precedence:
    what no policy opens (the node, the control plane, link-local, other guests) > denied >
    allowed > egress. Domain rules are domain/domains.py's (exact, or `*.` + a domain)."""

    egress: NetworkEgress = NetworkEgress.ALLOW_ALL
    allowed_cidrs: list[str] = msgspec.field(default_factory=list)
    denied_cidrs: list[str] = msgspec.field(default_factory=list)
    allowed_domains: list[str] = msgspec.field(default_factory=list)
    denied_domains: list[str] = msgspec.field(default_factory=list)
    # TCP/UDP destination ports the allowed CIDRs and domains are limited to; empty: any.
    allowed_ports: list[int] = msgspec.field(default_factory=list)


class Expiration(msgspec.Struct):
    revision: int = 1
    expire_time: float | None = None
    action: ExpirationAction = ExpirationAction.UNSPECIFIED


class LastStop(msgspec.Struct):
    cause: StopCause
    command_id: str
    durability: StopDurability = StopDurability.UNSPECIFIED


class Failure(msgspec.Struct):
    stage: str
    message: str


class Guest(msgspec.Struct):
    reset_times: list[float] = msgspec.field(default_factory=list)
    reset_count: int = 0
    last_reset_time: float | None = None
    responding: bool = True


class Condition(msgspec.Struct):
    """A named condition next to the state (Kubernetes style): `last_transition_time` is
    when `status` last flipped; reason and message follow the records at every save."""

    type: str
    status: bool
    reason: str
    message: str = ""
    last_transition_time: float = 0.0


class StoragePending(msgspec.Struct):
    """Files that go once the storage pool has a node available (after delete)."""

    layer: bool = False
    volume_ids: list[str] = msgspec.field(default_factory=list)
    since: float | None = None


class StaleCopy(msgspec.Struct):
    """A copy of a workspace's disks left on a node that no longer holds them (a moved
    workspace's source, a failed or cancelled move's target), kept in the store until the
    leader's mover has deleted it there (engine/moves.py): a node away, or a crash, at the
    end of a move delays the delete and never loses it."""

    node: str
    volume_ids: list[str] = msgspec.field(default_factory=list)


# Valid exposures one workspace may have at a time.
MAX_EXPOSURES = 32


class ExposureAccess(IntEnum):
    UNSPECIFIED = 0
    TOKEN = 1
    PUBLIC = 2


class Exposure(msgspec.Struct):
    """A URL to a guest port, valid while the workspace is AVAILABLE in the execution
    (`generation`) and data-plane revision it was made in: a stop, force stop, revoke,
    delete or new start ends it in the same commit, as it ends a data-plane credential."""

    id: str
    port: int
    access: ExposureAccess
    generation: int
    revision: int
    create_time: float
    command_id: str
    expire_time: float | None = None
    # sha256 of the token (access TOKEN); the token itself is shown once, at creation.
    token_sha256: str = ""


class Workspace(msgspec.Struct):
    id: str
    seq: int
    state: WorkspaceState
    resources: Resources
    bindings: list[Binding]
    create_time: float
    update_time: float
    storage_pool: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    network_policy: NetworkPolicy = msgspec.field(default_factory=NetworkPolicy)
    expiration: Expiration = msgspec.field(default_factory=Expiration)
    # Labels a node must have to run it (the scheduler's node selector; issue 13).
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)
    last_stop: LastStop | None = None
    failure: Failure | None = None
    delete_time: float | None = None
    generation: int = 0
    instance_id: str | None = None
    node_id: str | None = None
    guest: Guest = msgspec.field(default_factory=Guest)
    data_plane_revision: int = 1
    deletion_started: bool = False
    deleted: bool = False
    holds_execution: bool = False
    # The lifecycle command in progress (create, start, stop, force stop, delete).
    active_command: str | None = None
    active_kind: CommandKind | None = None
    active_cause: StopCause | None = None
    node_silent: bool = False
    # A stop the server owes (guest power-off on kibovm, host OOM), started when allowed.
    owed_stop: StopCause | None = None
    release_pending_since: float | None = None
    storage: StoragePending = msgspec.field(default_factory=StoragePending)
    version: int = 0
    tenant: str = "default"
    # The node whose disk holds its writable layer and own volume (a node's storage is its
    # own: no runtime shares disks between nodes). Set when its first instance is placed; a
    # later start is placed there only, and waits while that node is not ready, rather than
    # starting elsewhere with empty disks (issue 26). Cleared when the pool is declared lost.
    storage_node: str | None = None
    # Copies of its disks on other nodes, to delete (a move's leftovers: StaleCopy).
    stale_copies: list[StaleCopy] = msgspec.field(default_factory=list)
    # Derived at every save (domain/conditions.py); stored for their transition times.
    conditions: list[Condition] = msgspec.field(default_factory=list)
    # URLs to guest ports (at most MAX_EXPOSURES); only those of the current execution and
    # data-plane revision are valid (`valid_exposures`).
    exposures: list[Exposure] = msgspec.field(default_factory=list)

    def valid_exposures(self, now: float) -> list[Exposure]:
        """The exposures a request may use now: AVAILABLE, not being deleted, made in this
        execution and data-plane revision, not expired."""
        if self.state is not WorkspaceState.AVAILABLE or self.deletion_started or self.deleted:
            return []
        return [
            e
            for e in self.exposures
            if e.generation == self.generation
            and e.revision == self.data_plane_revision
            and (e.expire_time is None or e.expire_time > now)
        ]


class CommandError(msgspec.Struct):
    code: ErrorCode
    message: str


class Command(msgspec.Struct):
    id: str
    workspace_id: str
    kind: CommandKind
    fingerprint: str
    state: CommandState
    create_time: float
    update_time: float
    stop_cause: StopCause = StopCause.UNSPECIFIED
    durability: StopDurability = StopDurability.UNSPECIFIED
    error: CommandError | None = None
    volume_id: str = ""
    tenant: str = "default"
    # The W3C traceparent of the call that made it ("" untraced): the loops continue its trace.
    trace_parent: str = ""
    # A move (MOVE): where to, and how far (data bytes copied, in all; what it does now).
    target_node: str = ""
    done_bytes: int = 0
    total_bytes: int = 0
    detail: str = ""

    @property
    def key(self) -> str:
        return command_key(self.tenant, self.id)

    @property
    def terminal(self) -> bool:
        return self.state in (CommandState.SUCCEEDED, CommandState.FAILED)


# Phases in which a node holds (or is about to hold) an instance's sandbox.
ACTIVE_PHASES = frozenset(
    {Phase.SCHEDULED, Phase.PROVISIONING, Phase.LAUNCHING, Phase.RUNNING, Phase.RESTARTING, Phase.STOPPING}
)


class Instance(msgspec.Struct):
    id: str
    workspace_id: str
    generation: int
    vcpus: int
    memory_mib: int
    create_time: float
    desired: Desired = Desired.RUNNING
    # `step` counts changes of `desired`; the node is done with it when done_step == step.
    step: int = 1
    done_step: int = 0
    phase: Phase = Phase.PENDING
    node_id: str | None = None
    reason: str = ""
    restart_count: int = 0
    holds: list[Component] = msgspec.field(default_factory=list)
    observe_time: float | None = None
    # The policy its node enforces; `network_revision` counts live changes (SetWorkspaceNetworkPolicy
    # while AVAILABLE): a node applies a newer one without a restart (engine/node_agent.py).
    network_policy: NetworkPolicy | None = None
    network_revision: int = 0
    # The step a stall or failure fault was armed for, etc. live in the runtime, not here.

    @property
    def reserved(self) -> bool:
        return Component.RESERVATION in self.holds

    @property
    def holds_execution(self) -> bool:
        return bool(self.holds)

    @property
    def active(self) -> bool:
        """A node still has to act on the instance, or still holds parts of it (the store's
        node_instances): what a node falling silent leaves unconfirmed."""
        return self.step != self.done_step or bool(self.holds) or self.phase in ACTIVE_PHASES


class Volume(msgspec.Struct):
    id: str
    storage_pool: str
    capacity_gib: int
    state: VolumeState
    create_time: float
    workspace_id: str | None = None
    tenant: str = "default"
    # Deleted, and its files may still be on a node of its storage pool: that node destroys
    # them (storage_release_time: when they were gone).
    storage_pending: bool = False
    storage_release_time: float | None = None
    # The node whose disk holds its files, once a workspace using it was placed (as
    # Workspace.storage_node): a workspace it is bound to is placed there only.
    storage_node: str | None = None


def command_key(tenant: str, command_id: str) -> str:
    """Command IDs are unique per tenant: this names one across the deployment."""
    return f"{tenant}\x00{command_id}"


class Event(msgspec.Struct):
    workspace_id: str
    time: float
    type: EventType
    from_state: WorkspaceState = WorkspaceState.UNSPECIFIED
    to_state: WorkspaceState = WorkspaceState.UNSPECIFIED
    command_id: str = ""
    message: str = ""
    generation: int = 0
    seq: int = 0
    # Its workspace's tenant (whose events lists and watches show it), and the node it
    # concerns ("" if none). Events stored before these existed read theirs from the store's
    # columns (a migration filled the tenant in).
    tenant: str = ""
    node_id: str = ""


class Node(msgspec.Struct):
    id: str
    vcpus: int
    memory_mib: int
    storage_pool: str
