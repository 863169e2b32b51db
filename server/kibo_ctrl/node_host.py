"""Wiring for `kibo-ctrl node`: a node agent in its own process, on a host of its own.
The runtime (process or sim) on this host, the agent (engine/node_agent.py, the same code
the embedded node runs), and its link to the control plane over gRPC (kibo.node.v1)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from . import routes
from .api.node_certs import control_plane_peer
from .api.node_guest_api import NodeGuestApi, guest_authenticator
from .api.node_storage_api import NodeStorageApi
from .domain.errors import KiboError
from .domain.model import Backend, Node
from .domain.nodes import AllocationRatios, DiskStatus, capacity
from .engine.node_agent import NodeAgent
from .engine.node_link import LinkDown
from .engine.pki import split_join_token
from .runtime.base import Closable, GuestAccess, Runtime
from .runtime.process.image_transfer import NodeDisks
from .runtime.process.options import host_capacity, options_from
from .runtime.process.runtime import ProcessRuntime
from .runtime.sim.simulator import SimBoard, SimNode
from .transport.grpc import EXCLUSIVE_PORT, bind, service_handler
from .transport.node_client import CALL_TIMEOUT_S, GrpcLink, targets
from .transport.node_identity import RENEW_CHECK_S, NodeIdentity

MAX_MESSAGE_BYTES = 4 * 1024 * 1024

log = logging.getLogger("kibo.node")


@dataclass(frozen=True)
class NodeConfig:
    control_plane: str
    data_dir: Path
    runtime: str = "process"
    node_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    # The join token (TOKEN.CA_SHA256: kibo-ctrl token create --node); empty against
    # --insecure-no-auth.
    token: str = ""
    # Plaintext node link (a control plane with --insecure-node-link); also without a token.
    insecure_node_link: bool = False
    vcpus: int = 0
    memory_mib: int = 0
    storage_pool: str = "local"
    # TLS to the control plane: its CA (the server's certificate is checked against it).
    tls_ca: Path | None = None
    sim_backend: Backend = Backend.FIRECRACKER
    sim_step_ms: float = 20.0
    backend: Backend = Backend.FIRECRACKER
    sandbox: str = "auto"
    limits: str = "auto"
    base_image: Path | None = None
    guest_command: tuple[str, ...] = ()
    stop_grace_ms: float = 10_000.0
    guest_id_base: int = 100_000
    # What vcpus and memory_mib (when 0) are made of, and the disk's ratio (domain/nodes.py).
    allocation: AllocationRatios = field(default_factory=AllocationRatios)
    supervisor: str = "auto"
    # Guest networking (runtime/process/network/): the guests' CIDR ("": a free /20; "off":
    # loopback only), CIDRs no guest may reach whatever its policy, the guests' resolver's upstreams.
    guest_network: str = ""
    guest_deny: tuple[str, ...] = ()
    guest_dns: tuple[str, ...] = ()
    # Where this node serves its guests to the control plane (process runtime): the data
    # plane's last hop. Default: this host's address on the route to the control plane (the
    # loopback address when the control plane is on this host), port 50052; never every
    # interface unless asked. `data_plane_address` is what the control plane dials (default:
    # that address, with the port bound).
    data_plane_listen: str = ""
    data_plane_address: str = ""

    @property
    def disk_allocation_ratio(self) -> float:
        return self.allocation.disk


# The guest hop's default port (--data-plane-listen): one node agent per host takes it.
DATA_PLANE_PORT = 50052


def default_node_id() -> str:
    """This host's name as a node ID (lowercase letters, digits and '-')."""
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().split(".")[0].lower()).strip("-")
    return name[:63].strip("-") or "node"


class NodeHost:
    """One node agent process. `await NodeHost.start(config)`, then `await host.stop()`."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self._closables: list[Closable] = []
        self._task: asyncio.Task[None] | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._server: grpc.aio.Server | None = None
        self.identity: NodeIdentity | None = None
        self._token = ""

    @classmethod
    async def start(cls, config: NodeConfig) -> NodeHost:
        host = cls(config)
        await host._start()
        return host

    async def _start(self) -> None:
        config = self.config
        if config.runtime not in ("sim", "process"):
            raise ValueError(f"unknown runtime {config.runtime!r}; this build has: sim, process")
        config.data_dir.mkdir(parents=True, exist_ok=True)
        node_id = config.node_id or default_node_id()
        self.identity = await self._identity(node_id)
        # The same resource model as every node (domain/nodes.py): the host's times the ratios.
        vcpus, memory_mib, resources = capacity(host_capacity(), config.allocation, config.vcpus, config.memory_mib)
        node = Node(node_id, vcpus, memory_mib, config.storage_pool)
        runtime: Runtime
        data_plane = ("", "")
        disk: Callable[[], DiskStatus] | None = None
        if config.runtime == "process":
            options = options_from(config, config.data_dir)
            # No guest here may reach the control plane, whatever its policy (SECURITY.md).
            control_plane = await asyncio.to_thread(control_plane_cidrs, config.control_plane)
            options = replace(options, guest_deny=(*options.guest_deny, *control_plane))
            process = await asyncio.to_thread(ProcessRuntime, node_id, options)
            self._closables.append(process)
            runtime = process
            data_plane = await self._serve_guests(process)
            disk_gib, storage_gib = process.disk_offered_gib()
            resources = resources.with_disk(disk_gib, config.allocation.disk, storage_gib)
            disk = process.disk_status
        else:
            runtime = SimNode(node_id, config.sim_backend, config.sim_step_ms / 1000, SimBoard())
        identity = self.identity
        dial = None if identity is None else identity.dial
        self.link = GrpcLink(config.control_plane, node_id, self._token, self._main_port_credentials(), dial)
        self.agent = NodeAgent(node, runtime, self.link, config.labels, data_plane, resources, disk)
        self._task = asyncio.create_task(self.agent.run(), name=f"node agent {node_id}")
        if identity is not None:
            self._renewal = asyncio.create_task(self._renew(identity), name="node certificate renewal")
        log.info(
            "node %s: %d vCPU (%d cores x %g), %d MiB (%d MiB x %g), %d GiB of storage, pool %s, runtime %s; "
            "control plane %s",
            node_id,
            node.vcpus,
            resources.host_vcpus,
            resources.cpu_ratio,
            node.memory_mib,
            resources.host_memory_mib,
            resources.memory_ratio,
            resources.storage_gib,
            node.storage_pool,
            config.runtime,
            config.control_plane,
        )

    def _main_port_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS to the control plane's main port, if its operator put TLS there (--tls-ca)."""
        if self.config.tls_ca is None:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.config.tls_ca.read_bytes())

    async def _identity(self, node_id: str) -> NodeIdentity | None:
        """The node's certificate for the mutual-TLS link, from its data dir or got now with its
        join token (transport/node_identity.py); None: a plaintext link (--insecure-node-link,
        or no token: a control plane with --insecure-no-auth)."""
        config = self.config
        try:
            self._token, pin = split_join_token(config.token)
        except ValueError as error:
            raise ValueError(f"--token: {error}") from None
        if config.insecure_node_link or not config.token:
            log.warning("the node link is plaintext (%s)", "--insecure-node-link" if config.token else "no token")
            return None
        if not pin:
            raise ValueError(
                "--token: this token has no CA pin (TOKEN.SHA256): make a join token on the control plane's "
                "machine with kibo-ctrl token create --node ID, or link in plaintext with --insecure-node-link"
            )
        identity = NodeIdentity(config.data_dir, node_id, self._token, pin, self._main_port_credentials())
        await identity.join(targets(config.control_plane))
        return identity

    async def _renew(self, identity: NodeIdentity) -> None:
        """Renews the node's certificate when a third of its lifetime is left (over the link);
        the link's next calls dial with it, the guest hop takes it at its next handshake."""
        while True:
            await asyncio.sleep(RENEW_CHECK_S)
            if not identity.renewal_due():
                continue
            try:
                await identity.renew(await self.link.channel())
            except (grpc.aio.AioRpcError, LinkDown, KiboError) as error:
                log.warning("node link: the certificate's renewal failed (retried in an hour): %s", error)
                continue
            old = self.link.redial()
            await asyncio.sleep(CALL_TIMEOUT_S)  # calls under way on the old channels end first
            for channel in old:
                await channel.close()

    async def _serve_guests(self, guests: GuestAccess) -> tuple[str, str]:
        """Serve NodeGuestService for the control plane; the (address, secret) to declare."""
        secret = secrets.token_urlsafe(32)
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), EXCLUSIVE_PORT]
        self._server = grpc.aio.server(options=options)
        service = routes.node_guest_service(NodeGuestApi(guests))
        peer = None if self.identity is None else control_plane_peer
        gate = guest_authenticator(secret, peer)
        # The disks of its stopped workspaces, for moves (the same port, the same credentials).
        disks = routes.node_storage_service(NodeStorageApi(NodeDisks(self.config.data_dir.resolve())))
        self._server.add_generic_rpc_handlers([service_handler(service, gate), service_handler(disks, gate)])
        listen = self.config.data_plane_listen or _join(_route_host(self.config), DATA_PLANE_PORT)
        credentials = None if self.identity is None else self.identity.server_credentials()
        try:
            port = bind(self._server, listen, credentials)
        except OSError as error:
            raise OSError(
                f"{error} (--data-plane-listen: another node agent on this host needs a port of its own)"
            ) from None
        await self._server.start()
        address = self.config.data_plane_address or _join(_advertised_host(self.config, listen), port)
        log.info("serving the data plane's hop to this node's guests on %s (as %s)", listen, address)
        return address, secret

    @property
    def done(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self) -> None:
        """Stop the agent; the sandboxes keep running (a restarted agent adopts them)."""
        if self._renewal is not None:
            self._renewal.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self.agent.stop()
        if self._server is not None:
            await self._server.stop(2.0)
        await self.link.close()
        for closable in self._closables:
            await closable.close()


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _advertised_host(config: NodeConfig, listen: str) -> str:
    """The host part the control plane dials: the listen host, unless it is a wildcard; then
    this host's address on the route to the control plane."""
    host = listen.rpartition(":")[0].strip("[]")
    if host not in ("", "0.0.0.0", "::"):
        return host
    return _route_host(config)


def control_plane_cidrs(control_plane: str) -> tuple[str, ...]:
    """The IPv4 addresses the replicas of --control-plane resolve to, as /32s (a name that does
    not resolve now adds nothing: the node's join fails on it anyway)."""
    found: list[str] = []
    for target in targets(control_plane):
        host = target.rpartition(":")[0].strip("[]") or target
        try:
            infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        found += [f"{info[4][0]}/32" for info in infos if f"{info[4][0]}/32" not in found]
    return tuple(found)


def _route_host(config: NodeConfig) -> str:
    """This host's address on the route to the control plane (no packet is sent)."""
    target = targets(config.control_plane)[0].rpartition(":")[0].strip("[]") or "127.0.0.1"
    with socket.socket(socket.AF_INET6 if ":" in target else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((target, 9))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])
