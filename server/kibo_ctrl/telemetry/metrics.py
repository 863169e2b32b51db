"""Every metric kibo exports, in one private registry per process (so two servers in one
test process do not share counters), named by Prometheus conventions: units in the name
(`_seconds`, `_bytes`), counters end in `_total`.

Label sets are bounded by construction: service and method come from the RPC tables, code
from the gRPC codes, kind/state/outcome from domain enums, node from the nodes app.py
builds, operation and reason from fixed tuples here. `tenant` is bounded because a tenant
exists only once an operator mints a token for it on the server's machine (`kibo-ctrl
token create --tenant`); no API call creates one. No workspace, command or instance ID is
ever a label: those are in the log lines (logs.py)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from ..domain.model import Command, CommandState, EventType, Node, WorkspaceState
from ..store.base import Changes, Reader

# Control-plane latencies: a settled create is tens of ms, a stop waits up to the grace.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Group commit: how many transactions shared one fsync (the store's MAX_BATCH is 512).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MIB = 1024 * 1024
# Terminal commands already counted: a command republished in the same terminal state
# (a later write of its record) is not counted twice. Bounded memory.
SEEN_TERMINAL = 65_536


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        ProcessCollector(registry=registry)
        self.rpc_handled = Counter(
            "kibo_rpc_handled_total",
            "RPCs finished, by transport, service, method and gRPC code.",
            ("transport", "service", "method", "code"),
            registry=registry,
        )
        self.rpc_duration = Histogram(
            "kibo_rpc_duration_seconds",
            "Time from an RPC's start to its end (a stream: until it closed).",
            ("transport", "service", "method"),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rpc_streams_open = Gauge(
            "kibo_rpc_streams_open",
            "Server streams (watches, execs) open now.",
            ("transport", "service", "method"),
            registry=registry,
        )
        self.commands_finished = Counter(
            "kibo_commands_finished_total",
            "Commands that reached a terminal state, by kind and outcome.",
            ("kind", "outcome"),
            registry=registry,
        )
        self.command_duration = Histogram(
            "kibo_command_duration_seconds",
            "Time from a command's acceptance to its terminal state.",
            ("kind", "outcome"),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.workspaces = Gauge(
            "kibo_workspaces",
            "Workspaces not deleted, by tenant and visible state (read from the store at scrape).",
            ("tenant", "state"),
            registry=registry,
        )
        self.node_capacity_vcpus = Gauge(
            "kibo_node_capacity_vcpus", "vCPUs a node offers.", ("node",), registry=registry
        )
        self.node_capacity_memory = Gauge(
            "kibo_node_capacity_memory_bytes", "Memory a node offers.", ("node",), registry=registry
        )
        self.node_reserved_vcpus = Gauge(
            "kibo_node_reserved_vcpus",
            "vCPUs reserved on a node by the instances placed there.",
            ("node",),
            registry=registry,
        )
        self.node_reserved_memory = Gauge(
            "kibo_node_reserved_memory_bytes",
            "Memory reserved on a node by its instances.",
            ("node",),
            registry=registry,
        )
        self.node_reachable = Gauge(
            "kibo_node_reachable",
            "1 while the node's runtime can report, 0 while it is silent.",
            ("node",),
            registry=registry,
        )
        self.node_report_age = Gauge(
            "kibo_node_last_report_age_seconds",
            "Seconds since the node last reported (its lease's age; NaN before its first report).",
            ("node",),
            registry=registry,
        )
        self.commit_duration = Histogram(
            "kibo_store_commit_duration_seconds",
            "Time of one store commit (all of a group commit's transactions and its fsync).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.commit_transactions = Histogram(
            "kibo_store_commit_transactions",
            "Transactions carried by one commit (group commit batch size).",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.watch_streams = Gauge(
            "kibo_watch_streams_open",
            "WatchWorkspace and WatchEvents streams open now (both transports).",
            registry=registry,
        )
        self.runtime_duration = Histogram(
            "kibo_runtime_operation_duration_seconds",
            "Time of one runtime operation on a node (launch, stop, destroy, ...), failed or not.",
            ("node", "operation"),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.runtime_failures = Counter(
            "kibo_runtime_operation_failures_total",
            "Runtime operations that failed, by node, operation and reason (the error's kind).",
            ("node", "operation", "reason"),
            registry=registry,
        )
        self.runtime_stops = Counter(
            "kibo_runtime_stops_total",
            "Stops by durability: confirmed (the guest's writes were synced) or unconfirmed.",
            ("node", "durability"),
            registry=registry,
        )
        self.data_plane_sessions = Gauge(
            "kibo_data_plane_sessions",
            "Data-plane calls (exec, file reads and writes) running now.",
            registry=registry,
        )
        self.guest_limit_hits = GuestLimitHits()
        registry.register(self.guest_limit_hits)
        self.guest_storage_clamped = GuestStorageClamped()
        registry.register(self.guest_storage_clamped)
        # The resource model (issue 26): each node's disk as it reported it, and processes
        # killed in guests over their memory (the guest runs on).
        self.node_disk_pressure = Gauge(
            "kibo_node_disk_pressure",
            "1 while a node's real free disk space is under its reserve (it takes no new storage), else 0.",
            ("node",),
            registry=registry,
        )
        self.node_disk_free = Gauge(
            "kibo_node_disk_free_bytes",
            "Real free space of a node's disk (of its data dir's filesystem), as last reported.",
            ("node",),
            registry=registry,
        )
        self.node_storage_promised = Gauge(
            "kibo_node_storage_promised_bytes",
            "Declared capacities of the layers and volumes on a node's disk (sparse: a limit, not usage).",
            ("node",),
            registry=registry,
        )
        self.guest_oom_kills = Counter(
            "kibo_guest_oom_kills_total",
            "Processes killed in a guest because it went over the workspace's memory (the workspace runs on).",
            ("node",),
            registry=registry,
        )
        # The exposure listener (transport/exposure_proxy.py): no workspace or host as a label.
        self.exposure_requests = Counter(
            "kibo_exposure_requests_total",
            "Exposure connections' first requests, by the answer's status class (1xx..5xx; other: HTTP/2 "
            "or not HTTP; none: no answer).",
            ("code_class",),
            registry=registry,
        )
        self.exposure_bytes = Counter(
            "kibo_exposure_bytes_total",
            "Bytes spliced through exposures, by direction (to_guest, from_guest).",
            ("direction",),
            registry=registry,
        )
        self.exposure_errors = Counter(
            "kibo_exposure_errors_total",
            "Exposure connections refused or cut, by kind (refused, port_closed, unavailable, header_timeout, "
            "head_too_large, bad_request, bad_token, revoked, ...).",
            ("kind",),
            registry=registry,
        )
        self.exposure_connections = Gauge(
            "kibo_exposure_connections_open",
            "Connections open on the exposure listener now.",
            registry=registry,
        )
        self._seen: OrderedDict[str, CommandState] = OrderedDict()
        self._nodes: list[Node] = []

    # -- the ports' adapters -----------------------------------------------------------------

    def rpc_observer(self, transport: str) -> RpcMetrics:
        return RpcMetrics(self, transport)

    def exposure_observer(self) -> ExposureMetrics:
        return ExposureMetrics(self)

    def commit_observed(self, seconds: float, transactions: int) -> None:
        """store/base.py `observe_commits`: called on the store's writer thread (thread-safe)."""
        self.commit_duration.observe(seconds)
        self.commit_transactions.observe(transactions)

    def on_changes(self, changes: Changes) -> None:
        """A hub listener: count each command once, when it is first published terminal; each
        guest OOM kill (its event); and each node's disk, as stored."""
        for node in changes.nodes.values():
            self.node_disk_pressure.labels(node.id).set(1.0 if node.disk.pressure else 0.0)
            self.node_disk_free.labels(node.id).set(node.disk.free_bytes)
            self.node_storage_promised.labels(node.id).set(node.disk.promised_bytes)
        for recorded in changes.events:
            if recorded.type is EventType.GUEST_OOM_KILL:
                owner = changes.workspaces.get(recorded.workspace_id)
                self.guest_oom_kills.labels((owner.node_id if owner else None) or "").inc()
        for command in changes.commands.values():
            if command.terminal and self._first_terminal(command):
                labels = (command.kind.name.lower(), outcome_of(command))
                self.commands_finished.labels(*labels).inc()
                self.command_duration.labels(*labels).observe(max(0.0, command.update_time - command.create_time))

    def _first_terminal(self, command: Command) -> bool:
        if command.key in self._seen:
            return False
        self._seen[command.key] = command.state
        if len(self._seen) > SEEN_TERMINAL:
            self._seen.popitem(last=False)
        return True

    # -- read at scrape ------------------------------------------------------------------------

    def watch_nodes(
        self, nodes: list[Node], reachable: Callable[[str], bool], report_age: Callable[[str], float | None]
    ) -> None:
        self._nodes = list(nodes)
        for node in nodes:
            self.node_report_age.labels(node.id).set_function(_age(report_age, node.id))
            self.node_capacity_vcpus.labels(node.id).set(node.vcpus)
            self.node_capacity_memory.labels(node.id).set(node.memory_mib * MIB)
            self.node_reachable.labels(node.id).set_function(_reachable(reachable, node.id))

    def snapshot(self, reader: Reader) -> tuple[list[tuple[str, WorkspaceState, int]], dict[str, tuple[int, int]]]:
        """What a scrape reads from the store, in one read snapshot."""
        return reader.workspace_counts(), {node.id: reader.node_usage(node.id) for node in self._nodes}

    def render(self, counts: list[tuple[str, WorkspaceState, int]], usage: dict[str, tuple[int, int]]) -> bytes:
        """The text exposition, with the store-read gauges set from `snapshot`'s answer."""
        # Cleared first: a tenant or state with no workspace left drops out of the scrape.
        self.workspaces.clear()
        for tenant, state, count in counts:
            self.workspaces.labels(tenant, state.name.lower()).set(count)
        for node_id, (vcpus, memory_mib) in usage.items():
            self.node_reserved_vcpus.labels(node_id).set(vcpus)
            self.node_reserved_memory.labels(node_id).set(memory_mib * MIB)
        return generate_latest(self.registry)


class GuestLimitHits(Collector):
    """kibo_guest_pids_limit_hits_total{node}: forks refused in a node's guests because a
    PIDs limit (a guest's own, or the node's budget) was reached, read from the node's
    runtime at scrape (runtime/base.py `GuestLimitCounters`; telemetry/runtime.py wires it).
    By node only: which workspace it was is the guest's business and its own pids.events."""

    def __init__(self) -> None:
        self.readers: dict[str, Callable[[], int]] = {}

    def watch(self, node_id: str, pids_limit_hits: Callable[[], int]) -> None:
        self.readers[node_id] = pids_limit_hits

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "kibo_guest_pids_limit_hits",
            "Forks refused in a node's guests because a PIDs limit (the guest's or the node's) was reached.",
            labels=("node",),
        )
        for node_id, read in self.readers.items():
            try:
                family.add_metric((node_id,), read())
            except (OSError, ValueError):
                continue  # a cgroup file that could not be read: no sample this scrape, not a failed scrape
        yield family


class GuestStorageClamped(Collector):
    """kibo_guest_storage_clamped{node}: a node's guest layers and volumes that may take no new
    block now, because its disk is under its reserve (runtime/process/disk_guard.py), read
    from the node's runtime at scrape like GuestLimitHits."""

    def __init__(self) -> None:
        self.readers: dict[str, Callable[[], int]] = {}

    def watch(self, node_id: str, storage_clamped: Callable[[], int]) -> None:
        self.readers[node_id] = storage_clamped

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "kibo_guest_storage_clamped",
            "Guest layers and volumes held at no new blocks (ENOSPC in the guest): the node disk is under its reserve.",
            labels=("node",),
        )
        for node_id, read in self.readers.items():
            family.add_metric((node_id,), read())
        yield family


def _age(report_age: Callable[[str], float | None], node_id: str) -> Callable[[], float]:
    def age() -> float:
        seconds = report_age(node_id)
        return math.nan if seconds is None else seconds

    return age


def _reachable(reachable: Callable[[str], bool], node_id: str) -> Callable[[], float]:
    return lambda: 1.0 if reachable(node_id) else 0.0


def outcome_of(command: Command) -> str:
    return "succeeded" if command.state is CommandState.SUCCEEDED else "failed"


class RpcMetrics:
    """transport/rpc.py `RpcObserver` for one transport ("grpc" or "connect")."""

    WATCHES = frozenset(
        {
            ("kibo.ctrl.v1.WorkspaceService", "WatchWorkspace"),
            ("kibo.ctrl.v1.WorkspaceObservationService", "WatchEvents"),
        }
    )

    def __init__(self, metrics: Metrics, transport: str) -> None:
        self._metrics = metrics
        self._transport = transport
        # The labelled children, by (service, method[, code]): a bounded set (the RPC tables'
        # names, the status codes), and .labels() costs more than the increment it serves.
        self._handled: dict[tuple[str, str, str], Counter] = {}
        self._duration: dict[tuple[str, str], Histogram] = {}

    def started(self, service: str, method: str, stream: bool) -> None:
        if stream:
            self._metrics.rpc_streams_open.labels(self._transport, service, method).inc()
            if (service, method) in self.WATCHES:
                self._metrics.watch_streams.inc()

    def finished(self, service: str, method: str, stream: bool, code: str, seconds: float) -> None:
        metrics = self._metrics
        handled = self._handled.get((service, method, code))
        if handled is None:
            handled = self._handled[service, method, code] = metrics.rpc_handled.labels(
                self._transport, service, method, code
            )
        handled.inc()
        duration = self._duration.get((service, method))
        if duration is None:
            duration = self._duration[service, method] = metrics.rpc_duration.labels(self._transport, service, method)
        duration.observe(seconds)
        if stream:
            metrics.rpc_streams_open.labels(self._transport, service, method).dec()
            if (service, method) in self.WATCHES:
                metrics.watch_streams.dec()


class ExposureMetrics:
    """transport/exposure_proxy.py `ExposureObserver`: labels are the proxy's fixed words."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        # The children by label: a bounded set, and .labels() costs more than an increment
        # (bytes are counted per 64 KiB chunk).
        self._bytes = {d: metrics.exposure_bytes.labels(d) for d in ("to_guest", "from_guest")}

    def connection_opened(self) -> None:
        self._metrics.exposure_connections.inc()

    def connection_closed(self) -> None:
        self._metrics.exposure_connections.dec()

    def answered(self, code_class: str) -> None:
        self._metrics.exposure_requests.labels(code_class).inc()

    def error(self, kind: str) -> None:
        self._metrics.exposure_errors.labels(kind).inc()

    def transferred(self, direction: str, count: int) -> None:
        counter = self._bytes.get(direction)
        if counter is not None:
            counter.inc(count)
