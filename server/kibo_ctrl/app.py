"""Wiring: the store, the hub, the engine's loops, the runtime and the servers, in one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace import TracerProvider

from . import routes, tokens
from .api import data_plane
from .api.auth import Authenticator
from .api.control_plane import Api
from .api.exposures import Exposures, ExposureSettings, Gone
from .api.fairness import WATCHES_PER_TENANT
from .api.node_api import NodeAdminApi, NodeApi
from .api.node_certs import NodeCertificates, certified_node
from .domain.access import DEFAULT_TENANT, Role, TokenRecord
from .domain.clock import SYSTEM_CLOCK, Clock
from .domain.errors import NotFound, PermissionDenied, StoreError, Unauthenticated, Unavailable
from .domain.model import Backend, Node, Workspace
from .domain.nodes import AllocationRatios, DiskStatus, NodeResources, capacity
from .domain.reports import StorageReleased
from .engine import cluster_ca, controller
from .engine.expiry import ExpiryLoop
from .engine.hub import Hub
from .engine.local_link import LocalLink
from .engine.moves import Mover, StorageLink
from .engine.node_agent import NodeAgent
from .engine.node_registry import NodePolicy, NodeRegistry
from .engine.scheduler import Scheduler
from .engine.service import Quotas, Service, Settings
from .runtime.base import Closable, GuestAccess, MachineObserver, Runtime
from .runtime.process import safepath
from .runtime.process.image_transfer import LocalDisks
from .runtime.process.options import SupervisorMode as SupervisorMode  # cli.py's --supervisor
from .runtime.process.options import host_capacity, options_from
from .runtime.process.runtime import ProcessRuntime
from .runtime.sim.api import SimulatorApi
from .runtime.sim.simulator import SimBoard, SimNode
from .store.base import Reader, Store
from .store.postgres import PostgresStore
from .store.postgres_leader import lead
from .store.sqlite import SqliteStore
from .telemetry import events
from .telemetry.endpoint import PATH as METRICS_PATH
from .telemetry.endpoint import MetricsAccess, serve_metrics
from .telemetry.metrics import Metrics
from .telemetry.runtime import MeteredRuntime
from .telemetry.tracing import Observers, Tracing
from .transport.connect import application
from .transport.exposure_proxy import ExposureProxy, ExposureRefused, ExposureTarget
from .transport.grpc import EXCLUSIVE_PORT, STREAMS_PER_CONNECTION, bind, service_handler
from .transport.http import SERVERS, HttpLimits, HttpServer, open_file_limit
from .transport.http_guard import BodyLimits, guard
from .transport.node_guest_client import GuestTls, NodeGuests
from .transport.node_storage_client import NodeStorageLinks
from .transport.rpc import NO_OBSERVER, RpcObserver
from .transport.tls import Tls

log = logging.getLogger("kibo")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# The Connect JSON of a 4 MiB message (bytes fields in base64) fits with room to spare.
MAX_HTTP_BODY_BYTES = 8 * 1024 * 1024
# gRPC port: a connection that has not finished its HTTP/2 (and TLS) handshake by then is
# closed, and one with no call for this long is sent GOAWAY (clients reconnect unseen).
GRPC_HANDSHAKE_TIMEOUT_MS = 20_000
GRPC_MAX_CONNECTION_IDLE_MS = 5 * 60 * 1000
# Per tenant, by default: far above what one client's work needs (a create settles in a few
# calls), low enough that one tenant's flood leaves the server to the others.
DEFAULT_RATE_LIMIT_RPS = 1000.0
# A simulated node's capacity unless given (--node-vcpus, --node-memory-mib): a big host, so
# that simulated workloads are bounded by what they test, not by the machine they run on.
SIM_NODE_VCPUS = 4096
SIM_NODE_MEMORY_MIB = 16 * 1024 * 1024
# The node port's default (--node-listen): NodeService over mutual TLS for `kibo-ctrl node`.
NODE_PORT = 50053
# The exposure listener's default port (Config.exposure_listen).
EXPOSURE_PORT = 8090


@dataclass(frozen=True)
class Config:
    data_dir: Path
    # --store: a postgresql:// URL (several replicas may share the database); empty: the
    # embedded SQLite under data_dir.
    store: str = ""
    listen: str = "127.0.0.1:50051"
    # Connect, gRPC-Web and JSON; empty to serve gRPC only.
    http_listen: str = "127.0.0.1:8080"
    http_server: str = "uvicorn"
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    http_body: BodyLimits = field(default_factory=lambda: BodyLimits(MAX_HTTP_BODY_BYTES, 30.0))
    # Open connections on the gRPC port; 0: a quarter of the open-file limit.
    grpc_max_connections: int = 0
    runtime: str = "process"
    sim_backend: Backend = Backend.FIRECRACKER
    sim_step_ms: float = 20.0
    sim_nodes: int = 1
    # What the embedded node offers; 0: the host's times the allocation ratios (process
    # runtime; the simulator's nodes: SIM_NODE_VCPUS and SIM_NODE_MEMORY_MIB each).
    node_vcpus: int = 0
    node_memory_mib: int = 0
    allocation: AllocationRatios = field(default_factory=AllocationRatios)
    settle_ms: float = 1000.0
    node_timeout_ms: float = 3000.0
    # What a joining node may claim, and the pools besides "local" that several nodes may
    # declare (engine/node_registry.py NodePolicy).
    node_max_vcpus: int = 4096
    node_max_memory_mib: int = 16 * 1024 * 1024
    shared_storage_pools: tuple[str, ...] = ()
    # Run the embedded node(s) in this process (False: `serve --no-local-node`, only nodes
    # that join over kibo.node.v1 run workspaces).
    local_node: bool = True
    # Start even when the local node's workspaces were run by another runtime (sim/process)
    # on this store: the new runtime then takes them as it finds them (`other_runtime`).
    allow_runtime_change: bool = False
    shutdown_grace_s: float = 5.0
    # Who may do what: bearer tokens (off only with --insecure-no-auth).
    auth: bool = True
    # Requests per second per tenant; None: DEFAULT_RATE_LIMIT_RPS with auth on, none without
    # (one local caller has no other tenant to be fair to); 0: no limit.
    rate_limit_rps: float | None = None
    # WatchWorkspace streams a tenant may hold open at once (api/fairness.py); 0: no cap.
    max_watches_per_tenant: int = WATCHES_PER_TENANT
    quotas: Quotas = field(default_factory=Quotas)
    tls: Tls | None = None
    # The node link (SECURITY.md): NodeService over mutual TLS on node_listen (HOST:PORT;
    # "": the host of `listen`, port NODE_PORT, or 0 when `listen`'s port is 0), its
    # bootstrap on the main port. insecure_node_link: plaintext on the main port (as is any
    # server without auth).
    node_listen: str = ""
    insecure_node_link: bool = False
    # Exposures (URLs to guest ports, api/exposures.py) on a listener of their own, never the
    # API's (a guest's pages must not share its origin): HOST:PORT; "": the host of
    # http_listen (else of listen), port EXPOSURE_PORT (0 when that port is 0), and a port
    # taken is a warning, not a failure; "off": no exposures served by this process.
    exposure_listen: str = ""
    # URLs are `{port}-{workspace}.{exposure_domain}`: "localhost" needs no DNS (*.localhost
    # is loopback to browsers and curl); a real domain needs a wildcard DNS record.
    exposure_domain: str = "localhost"
    # The process runtime (--runtime process): personality, isolation, limits, guest.
    backend: Backend = Backend.FIRECRACKER
    sandbox: str = "auto"
    limits: str = "auto"
    base_image: Path | None = None
    guest_command: tuple[str, ...] = ()
    stop_grace_ms: float = 10_000.0
    guest_id_base: int = 100_000  # host uids/gids base..base+65535 are the guests'
    supervisor: str = "auto"  # who holds ready guests: node (one process for all) or instance; auto
    # Guest networking (runtime/process/network/): the guests' CIDR ("": a free /20; "off":
    # loopback only), CIDRs no guest may reach whatever its policy, the guests' resolver's upstreams.
    guest_network: str = ""
    guest_deny: tuple[str, ...] = ()
    guest_dns: tuple[str, ...] = ()
    # GET /metrics on the HTTP listener: operator token (default), open, or off.
    metrics: MetricsAccess = MetricsAccess.OPERATOR
    # Traces: an OpenTelemetry TracerProvider (cli.py builds it from the OTEL_* variables); None: off.
    tracer_provider: TracerProvider | None = None

    @property
    def disk_allocation_ratio(self) -> float:
        """The process runtime's (ProcessSettings): its images' declared capacities may add
        up to this many times the data dir's filesystem."""
        return self.allocation.disk

    @property
    def node_mtls(self) -> bool:
        """Whether the node link is mutual TLS (the default with auth on)."""
        return self.auth and not self.insecure_node_link

    @property
    def exposure_address(self) -> str:
        """Where exposures are served (see exposure_listen); "" for none."""
        if self.exposure_listen == "off":
            return ""
        if self.exposure_listen:
            return self.exposure_listen
        host, _, port = (self.http_listen or self.listen).rpartition(":")
        return f"{host}:{0 if port == '0' else EXPOSURE_PORT}"

    @property
    def node_address(self) -> str:
        """Where NodeService is served over mutual TLS (see node_listen)."""
        if self.node_listen:
            return self.node_listen
        host, _, port = self.listen.rpartition(":")
        return f"{host}:{0 if port == '0' else NODE_PORT}"


class App:
    """One control plane process. `await App.start(config)`, then `await app.stop()`."""

    def __init__(self, config: Config, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        # Where the store and the loops read the time (the simulation hands in a virtual one).
        self.clock = clock
        self.port = 0
        self._tasks: list[asyncio.Task[None]] = []
        # Where this server told local clients its admin token is (removed when it stops).
        self._pointer: Path | None = None

    @classmethod
    async def start(cls, config: Config) -> App:
        app = cls(config)
        await app._start()
        return app

    async def _start(self) -> None:
        config = self.config
        if config.runtime not in ("sim", "process"):
            raise ValueError(f"unknown runtime {config.runtime!r}; this build has: sim, process")
        _check_writable(config.data_dir)
        _raise_open_file_limit()
        self.store = await open_store(config.store, config.data_dir, self.clock)
        if config.local_node and not config.allow_runtime_change:
            on_sqlite = isinstance(self.store, SqliteStore)
            where = f"the data dir {config.data_dir}" if on_sqlite else "the store"
            refusal = await self.store.read(other_runtime, self._local_node_ids(), config.runtime, where, on_sqlite)
            if refusal:
                await self.store.close()
                raise RuntimeError(refusal)
        self.hub = Hub()
        self.store.subscribe(self.hub.publish)
        self.metrics = Metrics()
        # --metrics off: no /metrics and no per-call counting (the RPC and commit paths are bare).
        self._counting = config.metrics is not MetricsAccess.OFF
        if self._counting:
            self.store.observe_commits(self.metrics.commit_observed)
            self.hub.listen(self.metrics.on_changes)
        # Traces (OTEL_* variables, cli.py; off by default): spans per RPC and per command step.
        self.tracing = Tracing(config.tracer_provider) if config.tracer_provider is not None else None
        if self.tracing is not None:
            self.hub.listen(self.tracing.on_changes)
        self.hub.listen(events.on_changes)
        storage_pool = "local"
        # With SQLite this process is the store's one writer: a new instance may be placed in
        # its command's transaction (on PostgreSQL the leader's scheduler places).
        single_writer = isinstance(self.store, SqliteStore)
        self.service = Service(
            Settings(storage_pool=storage_pool, quotas=config.quotas, place_at_command=single_writer)
        )
        self.authenticator = await self._authenticator()
        # The node link's CA (engine/cluster_ca.py): made by the first replica that starts.
        self.cluster_ca = await cluster_ca.ensure(self.store) if config.node_mtls else None
        # Nodes: the registry (leases, feeds) serves the local node agents and the remote
        # ones (kibo.node.v1) alike; the scheduler places on the nodes it records.
        # The embedded nodes' capacity is the operator's own (its flags, or the host's), not a claim.
        embedded = range(config.sim_nodes if config.runtime == "sim" else 1) if config.local_node else range(0)
        policy = NodePolicy(
            config.node_max_vcpus,
            config.node_max_memory_mib,
            frozenset({storage_pool, *config.shared_storage_pools}),
            embedded=frozenset(f"node-{i + 1}" for i in embedded),
        )
        self.registry = NodeRegistry(self.store, config.node_timeout_ms / 1000, self.clock, policy=policy)
        await self.registry.load()
        self.hub.listen(self.registry.on_changes)
        scheduler = Scheduler(self.store)
        self.registry.on_room(scheduler.room_on_nodes)
        self.runtimes: dict[str, Runtime] = {}
        self.sim_api: SimulatorApi | None = None
        self._closables: list[Closable] = []
        self._agents: list[NodeAgent] = []
        # The embedded nodes' disks, as the mover reaches them in this process.
        self._local_storage: dict[str, StorageLink] = {}
        guests: dict[str, GuestAccess] = {}
        observer: MachineObserver | None = None
        capabilities = ["workspace.stop.force"]
        if config.local_node:
            observer, capabilities = await self._local_nodes(storage_pool, guests)
        expiry = ExpiryLoop(self.store, self.service, self.clock)
        for listener in (scheduler.on_changes, expiry.on_changes):
            self.hub.listen(listener)
        self.api = Api(
            self.store,
            self.hub,
            self.service,
            capabilities,
            config.settle_ms / 1000,
            observer,
            MAX_MESSAGE_BYTES,
            config.max_watches_per_tenant,
        )
        # The data plane reaches the embedded node's guests in process, a remote node's through
        # the hop it declared at its join (kibo.node.v1.NodeGuestService on that node).
        self.guests = NodeGuests(guests, self.registry.data_plane_of, safepath.guest_file_path, self._guest_tls())
        # Disk moves between nodes (MoveWorkspace): run by the leader, over the same hops.
        self.storage_links = NodeStorageLinks(self.registry.data_plane_of, self._guest_tls())
        mover = Mover(self.store, lambda node_id: self._local_storage.get(node_id) or self.storage_links(node_id))
        self.hub.listen(mover.on_changes)
        self.data_plane = data_plane.DataPlane(self.store, self.guests, config.data_dir)
        # Revoke, stop and delete end the data-plane calls running under the old credential.
        self.hub.listen(self.data_plane.on_changes)
        # URLs to guest ports: answered through the data plane's hops; a commit that ends one
        # cuts its connections (api/exposures.py).
        self.exposures = Exposures(self.store, self.guests, self._exposure_settings())
        self.api.exposures = self.exposures
        self.hub.listen(self.exposures.on_changes)
        self.metrics.data_plane_sessions.set_function(lambda: self.data_plane.sessions.count)

        def loops() -> list[Coroutine[Any, Any, None]]:
            runs = (scheduler.run(), expiry.run(), self.registry.run(), mover.run(), *(a.run() for a in self._agents))
            return [self._supervise(run) for run in runs]

        if isinstance(self.store, PostgresStore):
            if config.local_node:
                log.warning(
                    "an in-process node on a shared store runs on the leader only, and after a failover the "
                    "next leader's node takes over its ID but not its sandboxes: with several replicas, serve "
                    "with --no-local-node and run `kibo-ctrl node` on each host (README: Running across machines)"
                )
            # Replicas may share the database: the loops that must run once run on the leader.
            self._tasks.append(asyncio.create_task(lead(self.store, loops, _stop_this_process)))
        else:
            self._tasks.extend(asyncio.create_task(coroutine) for coroutine in loops())
        await self._serve()

    def _exposure_settings(self) -> ExposureSettings:
        """How exposure URLs look; the listener's port is filled in once it is bound."""
        config = self.config
        _, _, port = config.exposure_address.rpartition(":")
        return ExposureSettings(
            domain=config.exposure_domain,
            scheme="https" if config.tls is not None else "http",
            listen_port=int(port) if port.isdigit() else 0,
        )

    def _guest_tls(self) -> GuestTls | None:
        """The control plane's side of the guest hop's mutual TLS: it presents the cluster CA's
        own certificate (the one peer a node's hop takes) and trusts the CA's node certificates."""
        ca = self.cluster_ca
        return None if ca is None else GuestTls(ca.cert_pem.encode(), ca.key_pem.encode())

    def _local_node_ids(self) -> list[str]:
        """node-1 (the simulator: node-1 to node-N): the embedded nodes' IDs."""
        return [f"node-{i + 1}" for i in range(self.config.sim_nodes if self.config.runtime == "sim" else 1)]

    async def _local_nodes(
        self, storage_pool: str, guests: dict[str, GuestAccess]
    ) -> tuple[MachineObserver | None, list[str]]:
        """The embedded node(s): their runtimes and agents, linked to the registry in process
        (the same agent and the same link protocol as a `kibo-ctrl node` on another host)."""
        config = self.config
        if config.runtime == "process":
            # The same resource model as every node (domain/nodes.py): the host's times the ratios.
            vcpus, memory_mib, resources = capacity(
                host_capacity(), config.allocation, config.node_vcpus, config.node_memory_mib
            )
        else:
            vcpus, memory_mib = config.node_vcpus or SIM_NODE_VCPUS, config.node_memory_mib or SIM_NODE_MEMORY_MIB
            resources = NodeResources()
        nodes = [
            Node(id=f"node-{i + 1}", vcpus=vcpus, memory_mib=memory_mib, storage_pool=pool)
            # The pool's files are deleted by its first node; the other simulated nodes have their own.
            for i in range(config.sim_nodes if config.runtime == "sim" else 1)
            for pool in [storage_pool if i == 0 else f"{storage_pool}-node-{i + 1}"]
        ]
        # The runtimes, and who gets which of their capabilities (runtime/base.py): only the
        # process runtime reaches guests, reads the machine and has connections to close.
        observer: MachineObserver | None = None
        disk: dict[str, Callable[[], DiskStatus]] = {}
        if config.runtime == "process":
            options = options_from(config, config.data_dir)
            process = await asyncio.to_thread(ProcessRuntime, nodes[0].id, options)
            self.runtimes[nodes[0].id] = guests[nodes[0].id] = process
            self._local_storage[nodes[0].id] = LocalDisks(nodes[0].id, process.data_dir)
            observer = process
            self._closables.append(process)
            disk_gib, storage_gib = process.disk_offered_gib()
            resources = resources.with_disk(disk_gib, config.allocation.disk, storage_gib)
            disk[nodes[0].id] = process.disk_status
        else:
            board = SimBoard()
            # In this process, their disks can move (each one's SimStorage).
            sim_nodes = {
                n.id: SimNode(n.id, config.sim_backend, config.sim_step_ms / 1000, board, movable=True) for n in nodes
            }
            self.runtimes.update(sim_nodes)
            self._local_storage.update({n: sim.storage for n, sim in sim_nodes.items()})
            self.sim_api = SimulatorApi(self._find_workspace, board, sim_nodes, self._pool_lost)
        # Each node agent drives its runtime through the timing wrapper (metrics, failure
        # logs, and with tracing a span per operation in its command's trace).
        metered = {
            n.id: MeteredRuntime(self.runtimes[n.id], n.id, self.metrics, self.tracing, self._trace_parent_of)
            for n in nodes
        }
        self.metrics.watch_nodes(
            nodes, lambda node_id: self.runtimes[node_id].reachable.is_set(), self.registry.report_age
        )
        self._agents = [
            NodeAgent(n, metered[n.id], LocalLink(self.registry, n.id), resources=resources, disk=disk.get(n.id))
            for n in nodes
        ]
        return observer, next(iter(self.runtimes.values())).capabilities()

    async def _authenticator(self) -> Authenticator:
        rate = self.config.rate_limit_rps
        if rate is None:
            rate = DEFAULT_RATE_LIMIT_RPS if self.config.auth else 0.0
        if not self.config.auth:
            log.warning(
                "AUTHENTICATION IS OFF (--insecure-no-auth): anyone who reaches this server is its admin. "
                "For local experiments only."
            )
            return Authenticator(None, rate)
        existing = await self.store.read(lambda r: r.list_tokens())
        path = self.config.data_dir / tokens.ADMIN_TOKEN_FILE
        if not existing:
            role = first_token_role(self.store)
            made = await tokens.create_first(self.store, DEFAULT_TENANT, role)
            if made is None:
                log.info("first start: another replica made the store's first token; this one makes none")
            else:
                record, token = made
                tokens.write_private(path, token)
                log.warning(
                    "first start: created %s token %s (tenant %s) in %s", role.value, record.id, DEFAULT_TENANT, path
                )
        self._pointer = tokens.point_clients_at(self.config.listen, path)

        async def lookup(digest: str) -> TokenRecord | None:
            return await self.store.read(lambda r: r.find_token(digest))

        return Authenticator(lookup, rate)

    async def _trace_parent_of(self, workspace_id: str) -> str:
        """The trace of the command a node acts for: the workspace's active command's."""

        def read(reader: Reader) -> str:
            workspace = reader.get_workspace(workspace_id)
            if workspace is None or workspace.active_command is None:
                return ""
            command = reader.get_command(workspace.tenant, workspace.active_command)
            return command.trace_parent if command is not None else ""

        return await self.store.read(read)

    async def _find_workspace(self, workspace_id: str) -> Workspace | None:
        return await self.store.read(lambda r: r.get_workspace(workspace_id))

    async def _pool_lost(self, pool: str) -> None:
        pending = await self.store.read(lambda r: r.storage_pending())
        for workspace in pending:
            if workspace.storage_pool == pool:
                report = StorageReleased(workspace.id, pool_lost=True)
                await self.store.transact(controller.apply_storage, report)

    async def _supervise(self, coroutine: object) -> None:
        try:
            await coroutine  # type: ignore[misc]
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("an engine loop died; the process can no longer make progress")
            raise

    async def _serve(self) -> None:
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Its default (1,000) cancels new calls when thousands arrive at once, e.g. every
            # watcher reconnecting after a restart.
            ("grpc.server.max_pending_requests", 20_000),
            # Its own share of descriptors, whatever the HTTP port's clients do (the HTTP
            # port's cap leaves these free); past it new connections are closed.
            ("grpc.max_allowed_incoming_connections", self._grpc_connection_cap()),
            ("grpc.server_handshake_timeout_ms", GRPC_HANDSHAKE_TIMEOUT_MS),
            ("grpc.max_connection_idle_ms", GRPC_MAX_CONNECTION_IDLE_MS),
            # HTTP/2 rapid reset and stream floods: see transport/grpc.py.
            STREAMS_PER_CONNECTION,
            EXCLUSIVE_PORT,
        ]
        self.server = grpc.aio.server(options=options)
        # The RPC tables (routes.py): each proto method bound to its handler.
        services = [
            routes.workspace_service(self.api),
            routes.observation_service(self.api),
            routes.volume_service(self.api),
            routes.data_plane_service(self.data_plane),
        ]
        # Fault injection drives simulated nodes only: a real runtime does not serve it at all
        # (UNIMPLEMENTED on both listeners, absent from reflection and health).
        if self.sim_api is not None:
            services.append(routes.simulator_service(self.sim_api))
        services.append(routes.node_admin_service(NodeAdminApi(self.registry, self.store)))
        grpc_observer = self._rpc_observer("grpc")
        # Node agents (kibo-ctrl node) on gRPC only, with the authenticator that takes node
        # tokens (every other service refuses them): over mutual TLS on the node port, and on
        # this port only the bootstrap (api/node_certs.py); --insecure-node-link: all here.
        node_api = NodeApi(self.registry, self.config.auth)
        self.node_port = await self._serve_nodes(options, node_api, grpc_observer)
        certificates = NodeCertificates(self.store, self.cluster_ca, self.node_port, self.config.auth)
        node_service = routes.node_service(node_api, certificates, "main" if self.config.node_mtls else "plaintext")
        self.server.add_generic_rpc_handlers(
            [service_handler(service, self.authenticator, grpc_observer) for service in services]
            + [service_handler(node_service, self.authenticator.for_nodes(), grpc_observer)]
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [service.full_name for service in (*services, node_service)]
        names += [health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.server)
        tls = self.config.tls
        try:
            self.port = bind(self.server, self.config.listen, None if tls is None else tls.grpc_credentials())
        except OSError:
            await self._stop_node_server()
            raise
        await self.server.start()
        self.http: HttpServer | None = None
        if self.config.http_listen:
            connect_observer = self._rpc_observer("connect")
            asgi = application(services, MAX_MESSAGE_BYTES, self.authenticator, connect_observer)
            asgi = serve_metrics(asgi, self.metrics, self.store, self.authenticator, self.config.metrics)
            # Health, and the methods a data-plane credential in the body authorizes, need no token.
            open_paths = frozenset(["/healthz"]).union(*(service.credential_paths for service in services))
            if self.config.metrics is MetricsAccess.OPEN:
                open_paths |= {METRICS_PATH}
            guarded = guard(asgi, self.authenticator, open_paths, self.config.http_body)
            http_server = SERVERS[self.config.http_server]
            try:
                # Binds the port (an OSError if it is taken), then serves.
                config = self.config
                self.http = http_server(
                    guarded, config.http_listen, config.shutdown_grace_s, config.tls, config.http_limits
                )
                await self.http.start()
            except OSError:
                await self.server.stop(None)
                await self._stop_node_server()
                raise
        await self._serve_exposures()
        # SERVING only once both listeners accept calls.
        for name in ["", *(service.full_name for service in services)]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def _serve_exposures(self) -> None:
        """The exposure listener (transport/exposure_proxy.py), a port of its own. Its default
        address is a convenience: taken, it is a warning; an address asked for must work."""
        self.exposure_proxy: ExposureProxy | None = None
        address = self.config.exposure_address
        if not address:
            return
        try:
            proxy = ExposureProxy(
                _ExposureRouter(self.exposures), address, self.config.tls, observer=self.metrics.exposure_observer()
            )
        except OSError as error:
            if self.config.exposure_listen:
                await self._stop_listeners()
                raise
            log.warning("exposures are not served: cannot listen on %s (%s); pass --exposure-listen", address, error)
            return
        await proxy.start()
        self.exposure_proxy = proxy
        self.api.add_capability("workspace.exposures")
        self.exposures.settings = replace(self.exposures.settings, listen_port=proxy.port)
        log.info("exposures served on %s (URLs like %s)", address, self.exposures.settings.url("ws-...", 8000))

    async def _stop_listeners(self) -> None:
        await self.server.stop(None)
        if self.http is not None:
            await self.http.stop()
        await self._stop_node_server()

    async def _serve_nodes(self, options: list[tuple[str, Any]], node_api: NodeApi, observer: RpcObserver) -> int:
        """The node port: NodeService to clients with a certificate of the cluster CA's, each
        held to the node its certificate names (api/node_certs.py certified_node); the port
        bound (0: none, the link is plaintext on the main port)."""
        ca = self.cluster_ca
        self.node_server: grpc.aio.Server | None = None
        if ca is None:
            return 0
        self.node_server = grpc.aio.server(options=options)
        certificates = NodeCertificates(self.store, ca, 0, self.config.auth)
        service = routes.node_service(node_api, certificates, "node")
        gate = self.authenticator.for_nodes(peer=certified_node)
        self.node_server.add_generic_rpc_handlers([service_handler(service, gate, observer)])
        credentials = grpc.ssl_server_credentials(
            [(ca.key_pem.encode(), ca.cert_pem.encode())],
            root_certificates=ca.cert_pem.encode(),
            require_client_auth=True,
        )
        port = bind(self.node_server, self.config.node_address, credentials)
        certificates.node_port = port
        await self.node_server.start()
        return port

    async def _stop_node_server(self) -> None:
        if self.node_server is not None:
            await self.node_server.stop(None)

    def _rpc_observer(self, transport: str) -> RpcObserver:
        observers: list[RpcObserver] = []
        if self._counting:
            observers.append(self.metrics.rpc_observer(transport))
        if self.tracing is not None:
            observers.append(self.tracing.rpc_observer(transport))
        if not observers:
            return NO_OBSERVER
        return observers[0] if len(observers) == 1 else Observers(*observers)

    def _grpc_connection_cap(self) -> int:
        if self.config.grpc_max_connections > 0:
            return self.config.grpc_max_connections
        return max(16, open_file_limit() // 4)

    async def stop(self) -> None:
        """Finish in-flight calls, stop the loops, close the store."""
        tokens.unpoint(self._pointer)  # local clients no longer find a token for this address
        await self.health.enter_graceful_shutdown()
        self.hub.close()
        # Ends the nodes' feeds (WatchSteps streams) at once, so the server's grace is not spent on them.
        self.registry.close()
        stopping = [self.server.stop(self.config.shutdown_grace_s)]
        if self.node_server is not None:
            stopping.append(self.node_server.stop(self.config.shutdown_grace_s))
        if self.http is not None:
            stopping.append(self.http.stop())
        proxy: ExposureProxy | None = getattr(self, "exposure_proxy", None)
        if proxy is not None:
            stopping.append(proxy.stop())
        await asyncio.gather(*stopping)
        for agent in self._agents:
            await agent.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for closable in self._closables:
            await closable.close()
        await self.guests.close()
        await self.storage_links.close()
        await self.store.close()
        if self.tracing is not None:
            self.tracing.shutdown()  # flushes the spans still batched


class _ExposureRouter:
    """The exposure listener's router (transport/exposure_proxy.py) over api/exposures.py:
    its domain errors as the HTTP statuses the listener answers."""

    def __init__(self, exposures: Exposures) -> None:
        self._exposures = exposures

    async def route(self, host: str, token: str | None) -> ExposureTarget:
        try:
            found = await self._exposures.route(host, token)
        except Gone as error:
            raise ExposureRefused(410, error.message) from None
        except NotFound as error:
            raise ExposureRefused(404, error.message) from None
        except Unauthenticated as error:
            raise ExposureRefused(401, error.message) from None
        except PermissionDenied as error:
            raise ExposureRefused(403, error.message) from None
        except (Unavailable, StoreError) as error:
            raise ExposureRefused(503, str(error)) from None
        return ExposureTarget(found.workspace_id, found.port, host, found.open, found.revoked)


def runtime_of(capabilities: list[str]) -> str:
    """The runtime a node declared at its last join: `sim` or `process`, from its capability
    `runtime.<runtime>.<personality>`; "" when it declared none."""
    return next((c.split(".")[1] for c in capabilities if c.startswith("runtime.") and c.count(".") == 2), "")


def other_runtime(reader: Reader, node_ids: list[str], runtime: str, where: str, whole_store: bool) -> str:
    """Why this server must not drive its embedded nodes with `runtime` (empty: it may): the
    store says a node of theirs last ran another runtime, and it still has workspaces there.
    That runtime's sandboxes are out of this one's reach: the process runtime finds no sandbox
    of a simulated instance (it would end FAILED), the simulator would take a real sandbox for
    its own and never stop it. `whole_store`: every workspace of this store is the embedded
    node's (SQLite); else (PostgreSQL) only its instances are counted."""
    for node_id in node_ids:
        record = reader.get_node(node_id)
        ran = runtime_of(record.capabilities) if record is not None else ""
        if ran in ("", runtime):
            continue
        running = len(reader.node_instances(node_id))
        kept = sum(n for _, _, n in reader.workspace_counts()) if whole_store else running
        if not (kept or running):
            continue
        return (
            f"{where} holds {kept} workspace{'s' if kept != 1 else ''} ({running} with an instance) that "
            f"{node_id} ran on the {ran} runtime; --runtime {runtime} cannot reach them (its workspaces "
            f"would come back FAILED, or its sandboxes run on unseen). Serve with --runtime {ran} (and stop "
            f"or delete them), or use another --data-dir; --allow-runtime-change starts anyway and lets "
            f"the {runtime} runtime take them as it finds them"
        )
    return ""


def first_token_role(store: Store) -> Role:
    """The role of the token a first start writes to DATA_DIR/admin.token (the file keeps its
    name: clients find it there). On the embedded SQLite store, `operator`: whoever can read
    that file (mode 0600, the server's user) can open DATA_DIR/kibo.db and mint an operator
    token with `kibo-ctrl token create` anyway, so the weaker token only hid the machine's own
    node and /metrics from its owner. On PostgreSQL, `admin` (a tenant admin) as before:
    minting there needs the database's credentials, which a reader of the file may not have."""
    return Role.OPERATOR if isinstance(store, SqliteStore) else Role.ADMIN


def _raise_open_file_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: the connection caps are shares of it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit is not a valid soft one for open files: take the kernel's usual ceiling.
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as error:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, error)
            return
        log.info("open-file limit raised from %d to %d", soft, target)


def _check_writable(data_dir: Path) -> None:
    """Refuse to serve from a data dir that cannot record commands (SQLite would open its
    database read-only and fail every command)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    probe = data_dir / ".write-probe"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise OSError(
            f"the data dir {data_dir} is not writable ({error.strerror}); the server must be able to record commands"
        ) from None


STORE_SCHEMES = ("postgresql://", "postgres://")


def _stop_this_process() -> None:
    """A deposed leader stops as on SIGTERM (its supervisor restarts it as a follower)."""
    os.kill(os.getpid(), signal.SIGTERM)


async def open_store(store: str, data_dir: Path, clock: Clock = SYSTEM_CLOCK) -> Store:
    """The store `--store` names: PostgreSQL for a postgresql:// URL, else the embedded SQLite."""
    if not store:
        return await SqliteStore.open(data_dir / "kibo.db", clock)
    if not store.startswith(STORE_SCHEMES):
        raise ValueError(f"--store takes a postgresql://USER@HOST:PORT/DB URL, not {store.split('://')[0]!r}")
    return await PostgresStore.open(store, clock)
