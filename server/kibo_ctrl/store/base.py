"""The store's ports: what the engine and the API may ask of a store.

`Store` runs a function in a read snapshot (`read`, `scan`) or in one write transaction
(`transact`); the function gets a `Reader` or a `Tx`. After each commit the store publishes
what it wrote (`Changes`) to its listeners (the hub). sqlite.py is the embedded adapter;
another database implements the same three protocols."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from ..domain.access import TokenRecord
from ..domain.certificates import ClusterCa, NodeIssuance
from ..domain.model import Command, Event, EventType, Instance, Volume, Workspace, WorkspaceState
from ..domain.nodes import NodeRecord

T = TypeVar("T")
P = ParamSpec("P")

CommitObserver = Callable[[float, int], None]


@dataclass
class Changes:
    """What one commit wrote, in order; published to the hub after the commit."""

    workspaces: dict[str, Workspace] = field(default_factory=dict)
    commands: dict[str, Command] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    volumes: dict[str, Volume] = field(default_factory=dict)
    # Every snapshot of each workspace, in commit order (a watcher gets one per change).
    workspace_history: list[Workspace] = field(default_factory=list)
    # Node records written (joins, stored leases, silence, cordons): how every replica's node
    # registry learns of the nodes that joined, renewed or were cordoned through another one.
    nodes: dict[str, NodeRecord] = field(default_factory=dict)

    def merge(self, other: Changes) -> None:
        self.workspaces.update(other.workspaces)
        self.commands.update(other.commands)
        self.instances.update(other.instances)
        self.events.extend(other.events)
        self.volumes.update(other.volumes)
        self.workspace_history.extend(other.workspace_history)
        self.nodes.update(other.nodes)

    def __bool__(self) -> bool:
        return bool(self.workspaces or self.commands or self.instances or self.events or self.volumes or self.nodes)


@dataclass(frozen=True)
class WorkspaceQuery:
    tenant: str
    after_seq: int = 0
    include_deleted: bool = False
    # (state, equal?) and (label key, value, equal?) conditions, all ANDed.
    states: tuple[tuple[WorkspaceState, bool], ...] = ()
    labels: tuple[tuple[str, str, bool], ...] = ()


@dataclass(frozen=True)
class EventQuery:
    """The events a fleet-wide list or watch wants (api/events.py), after `after_seq`.
    `tenant` None: every tenant's (an operator's). Every other field narrows ("" and empty:
    any); times are the events' own, `start_time` inclusive, `end_time` exclusive."""

    tenant: str | None
    after_seq: int = 0
    workspace_id: str = ""
    node_id: str = ""
    types: frozenset[EventType] = frozenset()
    start_time: float | None = None
    end_time: float | None = None

    def matches(self, event: Event) -> bool:
        """The stores' SQL condition (records.py, event_scan), on an event as published."""
        return (
            (self.tenant is None or event.tenant == self.tenant)
            and (not self.workspace_id or event.workspace_id == self.workspace_id)
            and (not self.node_id or event.node_id == self.node_id)
            and (not self.types or event.type in self.types)
            and (self.start_time is None or event.time >= self.start_time)
            and (self.end_time is None or event.time < self.end_time)
        )


@dataclass(frozen=True)
class EventSlice:
    """What one bounded scan of events found: the matching ones in sequence order, where the
    scan stopped (`last_seq`: the last row read, matching or not; 0 when it read none),
    `exhausted` (no row of the query's range lies beyond it), and `newest`: the newest event
    of any tenant in the same snapshot."""

    events: list[Event]
    last_seq: int
    exhausted: bool
    newest: int


class ListedWorkspace:
    """One row a scan matched, with its seq, ID and version read from the stored record
    without decoding the rest of it. A list answers most rows from the encodings it keeps by
    (ID, version) (api/control_plane.py); `record()` decodes the whole record when it must.
    (Here, reading the ID and version takes ~0.9 µs a row, the whole record ~3.8 µs.)"""

    __slots__ = ("_data", "_decode", "id", "seq", "version")

    def __init__(self, seq: int, id: str, version: int, data: bytes, decode: Callable[[bytes], Workspace]) -> None:
        self.seq = seq
        self.id = id
        self.version = version
        self._data = data
        self._decode = decode

    def record(self) -> Workspace:
        return self._decode(self._data)


@dataclass(frozen=True)
class WorkspaceSlice:
    """What one bounded scan found: the matching workspaces, in seq order, and where the scan
    stopped (`last_seq`; 0 when it scanned nothing). `exhausted`: no rows lie beyond it."""

    workspaces: list[ListedWorkspace]
    last_seq: int
    exhausted: bool


class Reader(Protocol):
    """Queries, inside one read snapshot."""

    def get_workspace(self, workspace_id: str) -> Workspace | None: ...
    def get_command(self, tenant: str, command_id: str) -> Command | None: ...
    def get_instance(self, instance_id: str) -> Instance | None: ...
    def get_volume(self, volume_id: str) -> Volume | None: ...
    def scan_workspaces(self, query: WorkspaceQuery, max_rows: int, want: int) -> WorkspaceSlice:
        """The tenant's next `max_rows` workspaces after `query.after_seq`, matched against the
        query, up to `want` matches: a read whose cost is bounded by `max_rows` whatever the
        filter."""
        ...

    def count_workspaces(self) -> int: ...
    def workspace_counts(self) -> list[tuple[str, WorkspaceState, int]]:
        """(tenant, state, how many) over the workspaces not deleted: one grouped count (metrics)."""
        ...

    def tenant_usage(self, tenant: str) -> tuple[int, int, int]:
        """Workspaces not deleted, and their vCPU and memory, for quotas."""
        ...

    def find_token(self, digest: str) -> TokenRecord | None: ...
    def list_tokens(self) -> list[TokenRecord]: ...
    def list_events(self, workspace_id: str, after_seq: int, limit: int) -> list[Event]: ...
    def scan_events(self, query: EventQuery, max_rows: int, want: int) -> EventSlice:
        """The next `max_rows` events of the query's range (its workspace's, else its tenant's,
        else all) after `query.after_seq`, matched against the query, up to `want` matches: a
        read whose cost is bounded by `max_rows` whatever the filter (as scan_workspaces)."""
        ...

    def list_instances(self, workspace_id: str) -> list[Instance]: ...
    def unscheduled_instances(self) -> list[Instance]: ...
    def unscheduled_besides(self, instance_id: str) -> bool:
        """Whether an instance other than this one waits to be placed."""
        ...

    def node_instances(self, node_id: str) -> list[Instance]:
        """Instances a node still has to act on or still holds parts of."""
        ...

    def node_usage(self, node_id: str) -> tuple[int, int]: ...
    def next_expirations(self, limit: int) -> list[Workspace]: ...
    def volumes_storage_pending(self) -> list[Volume]:
        """Deleted volumes whose files may still be on a node (a scan: read at node start only)."""
        ...

    def storage_pending(self) -> list[Workspace]: ...
    def stopped_workspaces(self) -> list[Workspace]:
        """Every STOPPED workspace, of every tenant: for the disk moves (engine/moves.py: at a
        leader's start, and an operator's drain). A scan of the STOPPED rows."""
        ...

    def integrity_check(self) -> str: ...

    # -- nodes (issue 13; the node registry's): one row per node, its record as JSON ---------
    def get_node(self, node_id: str) -> NodeRecord | None: ...
    def list_nodes(self) -> list[NodeRecord]:
        """Every node that ever joined, by ID."""
        ...

    # -- end of nodes ---------------------------------------------------------------------------

    # -- the node link's certificates (engine/cluster_ca.py) ------------------------------------
    def get_cluster_ca(self) -> ClusterCa | None: ...
    def get_node_issuance(self, token_id: str) -> NodeIssuance | None: ...
    def node_token_digests(self, node_id: str) -> list[tuple[TokenRecord, str]]:
        """The node's active node tokens and their stored digests: what a join's proof is
        checked against (the token itself never crosses the main port)."""
        ...


class Tx(Reader, Protocol):
    """One write transaction: the reads of a Reader, plus writes. `now` is the commit's
    time, the same for every record it writes."""

    now: float

    def next_workspace_seq(self) -> int: ...
    def put_workspace(self, workspace: Workspace) -> None: ...
    def put_command(self, command: Command) -> None: ...
    def put_instance(self, instance: Instance) -> None: ...
    def put_volume(self, volume: Volume) -> None: ...
    def add_token(self, record: TokenRecord, digest: str) -> None: ...
    def revoke_token(self, token_id: str) -> bool: ...
    def add_event(self, event: Event) -> None: ...

    # -- nodes (issue 13) -----------------------------------------------------------------------
    def put_node(self, node: NodeRecord) -> None: ...

    # -- end of nodes ---------------------------------------------------------------------------

    # -- the node link's certificates -----------------------------------------------------------
    def add_cluster_ca(self, ca: ClusterCa) -> bool:
        """Store the cluster CA unless the store has one: False then (nothing written)."""
        ...

    def add_node_issuance(self, issuance: NodeIssuance) -> None: ...


class Store(Protocol):
    """Each call runs `fn(tx_or_reader, *args, **kwargs)` on the store's side and answers
    its result: `await store.transact(controller.apply, report)` names the function that
    does the work, so a reader can go to it (no lambda in between)."""

    async def transact(self, fn: Callable[Concatenate[Tx, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn` in one write transaction, committed (on disk) before this returns."""
        ...

    async def read(self, fn: Callable[Concatenate[Reader, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn` in one read snapshot."""
        ...

    async def scan(self, fn: Callable[Concatenate[Reader, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """For reads that scan (lists): their own connection and thread, so a scan never
        delays the point reads (gets, commands, tokens) behind it."""
        ...

    def subscribe(self, listener: Callable[[Changes], None]) -> None: ...
    def observe_commits(self, observer: CommitObserver) -> None:
        """`observer(seconds, transactions)` after each commit: how long it took (on disk),
        and how many transactions it carried (group commit). Called off the event loop."""
        ...

    def published_mark(self) -> int | None: ...
    async def close(self) -> None: ...
