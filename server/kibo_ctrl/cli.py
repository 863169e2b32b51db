"""`kibo-ctrl`: run the control plane."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
import shlex
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from kibo_cli.help import command_of

from . import log_limit, tokens
from .api.fairness import WATCHES_PER_TENANT
from .app import MAX_HTTP_BODY_BYTES, App, Config, SupervisorMode, open_store
from .domain.access import Role, tenant_name
from .domain.errors import KiboError, StoreError
from .domain.model import Backend
from .domain.nodes import AllocationRatios
from .domain.nodes import labels as check_labels
from .domain.nodes import node_id as check_node_id
from .engine.service import Quotas
from .node_host import NodeConfig, NodeHost
from .runtime.process.network.resolver import parse_upstream
from .store.base import Store
from .telemetry import logs, tracing
from .telemetry.endpoint import MetricsAccess
from .transport.http import HttpLimits
from .transport.http_guard import BodyLimits
from .transport.tls import Tls

T = TypeVar("T")

cli = typer.Typer(help="kibo control plane.", no_args_is_help=True, add_completion=False)


@cli.callback()
def _group() -> None:
    """kibo control plane: kibo-ctrl serve runs it."""


# The resource model's flags, on `serve` (its embedded node) and `node` alike (domain/nodes.py
# AllocationRatios: the defaults and why).
_RATIOS = AllocationRatios()
CpuRatio = Annotated[
    float,
    typer.Option(
        min=0.01,
        max=1000.0,
        help="vCPUs a node offers per core of its host (when its vCPUs are not given). "
        "OpenStack Nova's default is 16; sandboxes idle most of the time.",
    ),
]
MemoryRatio = Annotated[
    float,
    typer.Option(
        min=0.01,
        max=1000.0,
        help="Memory a node offers per MiB of its host's (when not given); Nova's default is 1.5. A workspace's "
        "memory is a limit: one process over it is killed in the guest.",
    ),
]
DiskRatio = Annotated[
    float,
    typer.Option(
        min=0.01,
        max=1000.0,
        help="Process runtime: the declared capacities of layers and volumes (sparse images) may add up to "
        "this many times the data dir's filesystem. Below its reserve of real free space a node takes no new "
        "storage, whatever the ratio; below 1 (say 0.9): the capacities fit on the disk with room for the store.",
    ),
]
StorageOvercommit = Annotated[
    float | None, typer.Option(min=0.01, hidden=True, help="Replaced by --disk-allocation-ratio.")
]


def _ratios(cpu: float, memory: float, disk: float, storage_overcommit: float | None) -> AllocationRatios:
    if storage_overcommit is not None:
        typer.echo("kibo-ctrl: --storage-overcommit is now --disk-allocation-ratio (taken as that)", err=True)
        disk = storage_overcommit
    return AllocationRatios(cpu=cpu, memory=memory, disk=disk)


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kibo"


GuestNetworkOpt = Annotated[
    str,
    typer.Option(
        help="Process runtime (as root): the guests' addresses, a CIDR (a /31 each), or 'off' for loopback-only "
        "guests. Default: a free /20 in 10.200.0.0/14 (no route of the host's, no other kibo runtime's).",
        show_default=False,
    ),
]
GuestDenyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--guest-deny",
        help="A CIDR no guest may reach, whatever its network policy (repeat); beside what none ever reaches: "
        "this host, 169.254.0.0/16, other guests (and, on a node agent, the control plane's addresses).",
        show_default=False,
    ),
]
GuestDnsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--guest-dns",
        help="Where the guests' resolver asks, ADDR[:PORT] (repeat). Default: the nameservers of this host's "
        "/etc/resolv.conf.",
        show_default=False,
    ),
]


def _guest_network_config(network: str, deny: list[str] | None, dns: list[str] | None) -> dict[str, Any]:
    """--guest-network, --guest-deny and --guest-dns, checked, as the configs' fields."""
    if network not in ("", "off"):
        try:
            ipaddress.IPv4Network(network, strict=False)
        except ValueError:
            why = f"{network!r} is not an IPv4 CIDR (or 'off')"
            raise typer.BadParameter(why, param_hint="--guest-network") from None
    for cidr in deny or ():
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise typer.BadParameter(f"{cidr!r} is not a CIDR", param_hint="--guest-deny") from None
    for upstream in dns or ():
        try:
            parse_upstream(upstream)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--guest-dns") from None
    return {"guest_network": network, "guest_deny": tuple(deny or ()), "guest_dns": tuple(dns or ())}


@cli.command()
def serve(
    listen: Annotated[str, typer.Option(envvar="KIBO_LISTEN", help="gRPC address, HOST:PORT.")] = "127.0.0.1:50051",
    http_listen: Annotated[
        str,
        typer.Option(
            envvar="KIBO_HTTP_LISTEN",
            help="Connect, gRPC-Web and plain HTTP JSON address, HOST:PORT; empty to disable.",
        ),
    ] = "127.0.0.1:8080",
    http_server: Annotated[
        str, typer.Option(help="uvicorn (HTTP/1.1, fastest here) or hypercorn (adds h2c and gRPC over h2c).")
    ] = "uvicorn",
    http_max_connections: Annotated[
        int,
        typer.Option(
            min=0, help="Open connections on the HTTP port; more are closed at once. 0: half the open-file limit."
        ),
    ] = 0,
    http_max_connections_per_client: Annotated[
        int, typer.Option(min=1, help="Open connections on the HTTP port from one client IP address.")
    ] = 256,
    http_header_timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds a client has to send a request's headers; then the connection is closed."),
    ] = 10.0,
    http_idle_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds an idle keep-alive HTTP connection is kept open.")
    ] = 5.0,
    http_max_body_bytes: Annotated[
        int,
        typer.Option(
            min=1024, help="Largest HTTP request body, bytes: refused from Content-Length, or cut off as it streams in."
        ),
    ] = MAX_HTTP_BODY_BYTES,
    http_body_timeout: Annotated[
        float, typer.Option(min=0.1, help="Longest pause, seconds, while an HTTP request body is being received.")
    ] = 30.0,
    grpc_max_connections: Annotated[
        int, typer.Option(min=0, help="Open connections on the gRPC port. 0: a quarter of the open-file limit.")
    ] = 0,
    data_dir: Annotated[
        Path | None,
        typer.Option(envvar="KIBO_DATA_DIR", help="Where the embedded store keeps its files.", show_default=False),
    ] = None,
    store: Annotated[
        str,
        typer.Option(
            envvar="KIBO_STORE",
            help="postgresql://USER@HOST:PORT/DB: keep state in PostgreSQL (several replicas may share it). "
            "Default: the embedded SQLite under --data-dir.",
            show_default=False,
        ),
    ] = "",
    runtime: Annotated[
        str,
        typer.Option(help="What runs workspaces: process (real sandboxes on this machine) or sim (simulated, faults)."),
    ] = "process",
    backend: Annotated[
        Backend, typer.Option(help="Backend personality of the process runtime (guest reboot/power-off handling).")
    ] = Backend.FIRECRACKER,
    sandbox: Annotated[
        str,
        typer.Option(
            help="Process runtime isolation: auto (bwrap, rootless when not root; where it cannot work the "
            "server starts and every launch fails naming the fix), bwrap (or refuse to start); none runs "
            "guests as plain host processes and is NOT a security boundary."
        ),
    ] = "auto",
    guest_network: GuestNetworkOpt = "",
    guest_deny: GuestDenyOpt = None,
    guest_dns: GuestDnsOpt = None,
    guest_id_base: Annotated[
        int,
        typer.Option(
            min=1,
            help="Process runtime: guests' uids/gids 0..65535 are these host ids onward (a subordinate "
            "range no host user has, like /etc/subuid).",
        ),
    ] = 100_000,
    limits: Annotated[
        str, typer.Option(help="Process runtime CPU/memory limits: auto, cgroup-v2, cgroup-v1, rlimit or none.")
    ] = "auto",
    base_image: Annotated[
        Path | None,
        typer.Option(help="Process runtime base image (a directory tree, overlaid); default: the host's /usr."),
    ] = None,
    guest_command: Annotated[
        str, typer.Option(help="Process runtime entry command (shell words); it must create /run/kibo/ready.")
    ] = "",
    stop_grace_ms: Annotated[
        float, typer.Option(min=0, help="Process runtime: how long a graceful stop waits after SIGTERM.")
    ] = 10_000.0,
    cpu_allocation_ratio: CpuRatio = _RATIOS.cpu,
    memory_allocation_ratio: MemoryRatio = _RATIOS.memory,
    disk_allocation_ratio: DiskRatio = _RATIOS.disk,
    storage_overcommit: StorageOvercommit = None,
    supervisor: Annotated[
        SupervisorMode,
        typer.Option(
            help="Process runtime: who holds a ready guest: one node supervisor for all (node: ~0.7 MiB per "
            "idle workspace), or its own supervisor process (instance: ~3.3 MiB); auto: node where it works "
            "(bwrap as root, with cgroups). See README.",
        ),
    ] = SupervisorMode.AUTO,
    sim_backend: Annotated[Backend, typer.Option(help="Backend personality of the simulator.")] = Backend.FIRECRACKER,
    sim_step_ms: Annotated[float, typer.Option(min=0, help="Simulated time each lifecycle step takes.")] = 20.0,
    sim_nodes: Annotated[int, typer.Option(min=1, max=64, help="How many simulated nodes.")] = 1,
    node_vcpus: Annotated[
        int,
        typer.Option(
            min=0,
            help="vCPUs the embedded node offers; 0: the host's cores x --cpu-allocation-ratio "
            "(each simulated node: 4096).",
        ),
    ] = 0,
    node_memory_mib: Annotated[
        int,
        typer.Option(
            min=0,
            help="Memory the embedded node offers, MiB; 0: the host's x --memory-allocation-ratio "
            "(each simulated node: 16 TiB).",
        ),
    ] = 0,
    settle_ms: Annotated[
        float, typer.Option(min=0, help="How long a command call waits for its command to finish.")
    ] = 1000.0,
    node_timeout_ms: Annotated[
        float, typer.Option(min=50, help="A node's lease: silence after which its workspaces are UNKNOWN.")
    ] = 3000.0,
    node_max_vcpus: Annotated[
        int, typer.Option(min=1, help="The most vCPUs a node may claim when it joins; a join claiming more is refused.")
    ] = 4096,
    node_max_memory_mib: Annotated[
        int, typer.Option(min=128, help="The most memory (MiB) a node may claim when it joins; more is refused.")
    ] = 16 * 1024 * 1024,
    shared_storage_pool: Annotated[
        list[str] | None,
        typer.Option(
            metavar="POOL",
            help="A storage pool several nodes may declare (repeat for more); besides the control plane's own "
            "(local), a pool belongs to the first node that joins with it.",
        ),
    ] = None,
    local_node: Annotated[
        bool,
        typer.Option(
            "--local-node/--no-local-node",
            help="Run a node in this process (the embedded default); --no-local-node: only nodes that join "
            "with kibo-ctrl node run workspaces.",
        ),
    ] = True,
    allow_runtime_change: Annotated[
        bool,
        typer.Option(
            "--allow-runtime-change",
            help="Start even if this data dir's workspaces ran on another --runtime: the new runtime takes "
            "them as it finds them (without it, such a start is refused, saying how many and which runtime).",
        ),
    ] = False,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            help="No tokens: anyone who reaches the server is admin. Local experiments only. Implies "
            "--insecure-node-link."
        ),
    ] = False,
    node_listen: Annotated[
        str,
        typer.Option(
            help="Where nodes (kibo-ctrl node) call the node API over mutual TLS, HOST:PORT: only clients with "
            "a node certificate of this cluster's CA (issued at join for a join token). Default: the host of "
            "--listen, port 50053 (port 0 when --listen's is 0).",
            show_default=False,
        ),
    ] = "",
    exposure_listen: Annotated[
        str,
        typer.Option(
            help="Where exposures (URLs to ports in workspaces: kibo workspace expose) are served, HOST:PORT, "
            "a listener of their own so a guest's pages never share the API's origin; 'off' for none. Default: "
            "the host of --http-listen, port 8090 (port 0 when --http-listen's is 0; a port in use is then a "
            "warning).",
            show_default=False,
        ),
    ] = "",
    exposure_domain: Annotated[
        str,
        typer.Option(
            help="Exposure URLs are http://{port}-{workspace}.{domain}:{port of --exposure-listen}/. 'localhost' "
            "works with no DNS (browsers and curl resolve *.localhost to loopback); a real domain needs a "
            "wildcard DNS record to this host.",
        ),
    ] = "localhost",
    insecure_node_link: Annotated[
        bool,
        typer.Option(
            help="Serve the node API in plaintext on the gRPC port, with node tokens only, and dial the nodes' "
            "guest hops in plaintext (the link before mutual TLS); nodes then need --insecure-node-link too."
        ),
    ] = False,
    rate_limit_rps: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Requests per second per tenant (burst: twice as many); 0: no limit. "
            "Default: 1000 with tokens, none with --insecure-no-auth.",
        ),
    ] = None,
    max_watches_per_tenant: Annotated[
        int,
        typer.Option(
            min=0,
            help="WatchWorkspace and WatchEvents streams a tenant may hold open at once, together; past it "
            "RESOURCE_EXHAUSTED. 0: no limit.",
        ),
    ] = WATCHES_PER_TENANT,
    quota_workspaces: Annotated[int, typer.Option(min=0, help="Workspaces per tenant; 0: no limit.")] = 0,
    quota_vcpus: Annotated[int, typer.Option(min=0, help="vCPUs per tenant; 0: no limit.")] = 0,
    quota_memory_mib: Annotated[int, typer.Option(min=0, help="Memory MiB per tenant; 0: no limit.")] = 0,
    tls_cert: Annotated[Path | None, typer.Option(help="PEM certificate: serve both listeners over TLS.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key for --tls-cert.")] = None,
    tls_client_ca: Annotated[
        Path | None, typer.Option(help="PEM CA: require client certificates it signed (mutual TLS).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: Annotated[
        str, typer.Option(help="text, or json: one JSON object a line with workspace, command and node IDs as fields.")
    ] = "text",
    metrics: Annotated[
        MetricsAccess,
        typer.Option(
            help="GET /metrics (Prometheus) on the HTTP listener: operator (needs an operator token), "
            "open (no token: only where the scraper alone reaches the port) or off (no /metrics, nothing counted)."
        ),
    ] = MetricsAccess.OPERATOR,
) -> None:
    """Run the control plane until SIGTERM or SIGINT.

    On first start it creates a token for tenant `default` in DATA_DIR/admin.token (mode
    0600; role operator on the embedded SQLite store, the machine owner's; admin on
    PostgreSQL); `kibo` finds it there. Make more with `kibo-ctrl token create`.

    The HTTP port may face the internet: a request without a valid token is refused from
    its headers (its body is never read), and the --http-* limits bound what any client
    can hold. Log lines are rate-limited (10 of a kind per 10 s)."""
    if log_format not in logs.FORMATS:
        raise typer.BadParameter("choose text or json", param_hint="--log-format")
    logs.configure(log_level, log_format)
    log_limit.install()
    config = Config(
        data_dir=data_dir or default_data_dir(),
        store=store,
        listen=listen,
        http_listen=http_listen,
        http_server=http_server,
        http_limits=HttpLimits(
            max_connections=http_max_connections,
            max_connections_per_client=http_max_connections_per_client,
            header_timeout_s=http_header_timeout,
            idle_timeout_s=http_idle_timeout,
        ),
        http_body=BodyLimits(max_bytes=http_max_body_bytes, stall_timeout_s=http_body_timeout),
        grpc_max_connections=grpc_max_connections,
        runtime=runtime,
        sim_backend=sim_backend,
        sim_step_ms=sim_step_ms,
        sim_nodes=sim_nodes,
        node_vcpus=node_vcpus,
        node_memory_mib=node_memory_mib,
        settle_ms=settle_ms,
        node_timeout_ms=node_timeout_ms,
        node_max_vcpus=node_max_vcpus,
        node_max_memory_mib=node_max_memory_mib,
        shared_storage_pools=tuple(shared_storage_pool or ()),
        local_node=local_node,
        allow_runtime_change=allow_runtime_change,
        backend=backend,
        sandbox=sandbox,
        limits=limits,
        base_image=base_image,
        guest_command=tuple(shlex.split(guest_command)),
        stop_grace_ms=stop_grace_ms,
        guest_id_base=guest_id_base,
        allocation=_ratios(cpu_allocation_ratio, memory_allocation_ratio, disk_allocation_ratio, storage_overcommit),
        supervisor=supervisor.value,
        **_guest_network_config(guest_network, guest_deny, guest_dns),
        auth=not insecure_no_auth,
        node_listen=node_listen,
        exposure_listen=exposure_listen,
        exposure_domain=_exposure_domain(exposure_domain),
        insecure_node_link=insecure_node_link or insecure_no_auth,
        rate_limit_rps=rate_limit_rps,
        max_watches_per_tenant=max_watches_per_tenant,
        quotas=Quotas(workspaces=quota_workspaces, vcpus=quota_vcpus, memory_mib=quota_memory_mib),
        tls=_tls(tls_cert, tls_key, tls_client_ca),
        metrics=metrics,
        tracer_provider=tracing.from_env(),
    )
    if http_server not in ("uvicorn", "hypercorn"):
        raise typer.BadParameter("choose uvicorn or hypercorn", param_hint="--http-server")
    try:
        asyncio.run(_serve(config))
    except (OSError, RuntimeError, ValueError, StoreError) as error:
        typer.echo(f"kibo-ctrl: {error}", err=True)
        raise typer.Exit(2) from None


def _exposure_domain(domain: str) -> str:
    """--exposure-domain as a lowercase DNS name (labels of letters, digits and hyphens)."""
    name = domain.strip().lower().rstrip(".")
    labels = name.split(".")
    if (
        not name
        or len(name) > 200
        or not all(
            label and len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii() for label in labels
        )
    ):
        raise typer.BadParameter(f"{domain!r} is not a DNS name", param_hint="--exposure-domain")
    return name


def _tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> Tls | None:
    if cert is None and key is None:
        if client_ca is not None:
            raise typer.BadParameter("needs --tls-cert and --tls-key", param_hint="--tls-client-ca")
        return None
    if cert is None or key is None:
        raise typer.BadParameter("give both --tls-cert and --tls-key", param_hint="--tls-cert/--tls-key")
    tls = Tls(cert=cert, key=key, client_ca=client_ca)
    try:
        tls.check()
    except (OSError, ssl.SSLError) as error:
        raise typer.BadParameter(str(error), param_hint="--tls-cert/--tls-key") from None
    return tls


token_cli = typer.Typer(help="Make, list and revoke API tokens (works while the server runs).", no_args_is_help=True)
cli.add_typer(token_cli, name="token")
DataDir = Annotated[
    Path | None, typer.Option(envvar="KIBO_DATA_DIR", help="The server's data dir (default: the per-user one).")
]


StoreUrl = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="KIBO_STORE",
        help="The server's postgresql:// store, if it has one (default: SQLite under --data-dir).",
        show_default=False,
    ),
]


def _with_store(data_dir: Path | None, work: Callable[[Store], Awaitable[T]], store_url: str = "") -> T:
    async def run() -> T:
        store = await open_store(store_url, data_dir or default_data_dir())
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except (RuntimeError, ValueError, StoreError) as error:
        typer.echo(f"kibo-ctrl: {error}", err=True)
        raise typer.Exit(2) from None


@token_cli.command("create")
def token_create(
    tenant: Annotated[str, typer.Option(help="The tenant (project) the token acts for.")] = "",
    role: Annotated[
        Role,
        typer.Option(
            help="admin: everything in the tenant; reader: read-only; operator: admin plus node-wide faults "
            "(--runtime sim) and the nodes (kibo node), for whoever runs the machine, never for a tenant."
        ),
    ] = Role.ADMIN,
    node: Annotated[
        str,
        typer.Option(
            help="Make a node's join token instead (kibo-ctrl node --token): it acts as this node ID only, "
            "on the node API only."
        ),
    ] = "",
    data_dir: DataDir = None,
    store: StoreUrl = "",
) -> None:
    """Print a new token. It is shown once: only its hash is stored."""
    if node:
        if tenant:
            raise typer.BadParameter("a node token has no tenant: give --node or --tenant", param_hint="--tenant")
        try:
            check_node_id(node, "node")
        except KiboError as error:
            raise typer.BadParameter(error.message, param_hint="--node") from None
        # A node token's tenant field holds its node ID (domain/access.py, Role.NODE); the join
        # token adds the cluster CA's pin (made now if the store has no CA yet).
        record, token = _with_store(data_dir, lambda on: tokens.create_join(on, node), store)
        typer.echo(token)
        typer.echo(f"created {record.id} for node {node} (a join token: it buys the node's certificate once)", err=True)
        return
    if not tenant:
        raise typer.BadParameter("give the tenant the token acts for (or --node)", param_hint="--tenant")
    if role is Role.NODE:
        raise typer.BadParameter("make a node token with --node NODE_ID", param_hint="--role")
    try:
        tenant_name(tenant)
    except KiboError as error:
        raise typer.BadParameter(error.message, param_hint="--tenant") from None
    record, token = _with_store(data_dir, lambda on: tokens.create(on, tenant, role), store)
    typer.echo(token)
    typer.echo(f"created {record.id} for tenant {record.tenant} ({record.role.value})", err=True)


@token_cli.command("list")
def token_list(data_dir: DataDir = None, store: StoreUrl = "") -> None:
    """List tokens (IDs, tenants, roles; never the tokens)."""
    records = _with_store(data_dir, lambda on: on.read(lambda r: r.list_tokens()), store)
    for record in records:
        state = "revoked" if record.revoked else "active"
        typer.echo(f"{record.id}\t{record.tenant}\t{record.role.value}\t{state}")


@token_cli.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's ID (tok-...).")],
    data_dir: DataDir = None,
    store: StoreUrl = "",
) -> None:
    """Revoke a token; the server refuses it within a few seconds."""
    if not _with_store(data_dir, lambda on: tokens.revoke(on, token_id), store):
        typer.echo(f"kibo-ctrl: no active token {token_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {token_id}")


# Young-generation collections every 10,000 net allocations instead of 700: under 64
# creating clients the collector took ~6% of the server's time (3,066 young and 25 full
# collections in 16 s); with this and the freeze below, ~1.5% (bench.lifecycle_ab: durable
# creates/s +11%, create -> AVAILABLE p99 unchanged).
GC_THRESHOLDS = (10_000, 10, 20)


def _tune_gc() -> None:
    """What start-up made (modules, caches, the loaded store) lives as long as the server:
    frozen, full collections no longer walk it (~40 -> ~20 ms each)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _runs_what(config: Config) -> str:
    """What runs this server's workspaces, for its start line: its own node's runtime, or
    (--no-local-node) none here: --runtime then names nothing this process runs."""
    if not config.local_node:
        return "no local node (workspaces run on the nodes that join: kibo-ctrl node)"
    personality = config.sim_backend if config.runtime == "sim" else config.backend
    return f"runtime {config.runtime}/{personality.value}"


async def _serve(config: Config) -> None:
    app = await App.start(config)
    _tune_gc()
    log = logging.getLogger("kibo")
    log.info(
        "serving gRPC on %s (port %d), HTTP on %s, data in %s, %s; %s",
        config.listen,
        app.port,
        config.http_listen or "-",
        config.data_dir,
        _runs_what(config),
        f"nodes over mutual TLS on port {app.node_port}" if app.node_port else "node link in plaintext",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("shutting down: finishing in-flight calls")
    await app.stop()
    log.info("stopped")


@cli.command()
def node(
    control_plane: Annotated[
        str,
        typer.Option(
            envvar="KIBO_CONTROL_PLANE",
            help="The control plane's gRPC address, HOST:PORT; several replicas: HOST:PORT,HOST:PORT,... "
            "(the node moves on to the next one when one cannot be reached).",
        ),
    ],
    data_dir: Annotated[
        Path, typer.Option(envvar="KIBO_DATA_DIR", help="Where this node keeps its sandboxes and storage.")
    ],
    runtime: Annotated[str, typer.Option(help="What runs workspaces here: process (sandboxes) or sim.")] = "process",
    node_id: Annotated[
        str, typer.Option("--node-id", help="This node's ID (a node token is made for it). Default: the host name.")
    ] = "",
    labels: Annotated[str, typer.Option(help="Node labels, k=v,k=v (listed by kibo node list).")] = "",
    token: Annotated[
        str,
        typer.Option(
            envvar="KIBO_NODE_TOKEN",
            help="The node's join token (kibo-ctrl token create --node ID: TOKEN.CA_SHA256); none against "
            "--insecure-no-auth. It buys the node's certificate once, kept in --data-dir.",
        ),
    ] = "",
    insecure_node_link: Annotated[
        bool,
        typer.Option(
            help="Talk to the control plane and serve the guest hop in plaintext (a control plane with "
            "--insecure-node-link or --insecure-no-auth); the token's pin, if any, is not checked."
        ),
    ] = False,
    vcpus: Annotated[
        int, typer.Option(min=0, help="vCPUs this node offers; 0: the host's cores x --cpu-allocation-ratio.")
    ] = 0,
    memory_mib: Annotated[
        int, typer.Option(min=0, help="Memory this node offers, MiB; 0: the host's x --memory-allocation-ratio.")
    ] = 0,
    cpu_allocation_ratio: CpuRatio = _RATIOS.cpu,
    memory_allocation_ratio: MemoryRatio = _RATIOS.memory,
    disk_allocation_ratio: DiskRatio = _RATIOS.disk,
    storage_pool: Annotated[str, typer.Option(help="The storage pool this node's disk belongs to.")] = "local",
    tls_ca: Annotated[
        Path | None, typer.Option(help="PEM CA of the control plane's certificate: connect over TLS.")
    ] = None,
    backend: Annotated[Backend, typer.Option(help="Backend personality of the process runtime.")] = Backend.FIRECRACKER,
    sandbox: Annotated[str, typer.Option(help="Process runtime isolation: auto, bwrap or none.")] = "auto",
    limits: Annotated[str, typer.Option(help="Process runtime CPU/memory limits (as kibo-ctrl serve).")] = "auto",
    base_image: Annotated[Path | None, typer.Option(help="Process runtime base image (a directory tree).")] = None,
    guest_command: Annotated[str, typer.Option(help="Process runtime entry command (shell words).")] = "",
    stop_grace_ms: Annotated[
        float, typer.Option(min=0, help="How long a graceful stop waits after SIGTERM.")
    ] = 10_000.0,
    guest_id_base: Annotated[
        int, typer.Option(min=1, help="Process runtime: the guests' host id range start.")
    ] = 100_000,
    guest_network: GuestNetworkOpt = "",
    guest_deny: GuestDenyOpt = None,
    guest_dns: GuestDnsOpt = None,
    storage_overcommit: StorageOvercommit = None,
    supervisor: Annotated[
        SupervisorMode, typer.Option(help="Process runtime: who holds ready guests (as kibo-ctrl serve).")
    ] = SupervisorMode.AUTO,
    data_plane_listen: Annotated[
        str,
        typer.Option(
            help="Process runtime: where this node serves its guests' data plane (exec, files) to the "
            "control plane, HOST:PORT; only the control plane's calls (with this join's secret) are taken. "
            "Default: this host's address on the route to the control plane, port 50052. A second node "
            "agent on one host needs a port of its own: a taken port fails the start."
        ),
    ] = "",
    data_plane_address: Annotated[
        str,
        typer.Option(
            help="The address the control plane dials for that, HOST:PORT. Default: this host's address "
            "on the route to the control plane, with the port of --data-plane-listen."
        ),
    ] = "",
    sim_backend: Annotated[Backend, typer.Option(help="Backend personality of the simulator.")] = Backend.FIRECRACKER,
    sim_step_ms: Annotated[float, typer.Option(min=0, help="Simulated time each lifecycle step takes.")] = 20.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: Annotated[str, typer.Option(help="text or json.")] = "text",
) -> None:
    """Run a node agent on this host until SIGTERM or SIGINT: it joins the control plane,
    holds a lease, runs the workspaces placed on it and reports back. Its sandboxes outlive
    it; started again with the same --data-dir, it adopts them."""
    if log_format not in logs.FORMATS:
        raise typer.BadParameter("choose text or json", param_hint="--log-format")
    logs.configure(log_level, log_format)
    log_limit.install()
    try:
        if node_id:
            check_node_id(node_id, "node-id")
        parsed_labels = _labels(labels)
    except KiboError as error:
        raise typer.BadParameter(error.message, param_hint="--node-id/--labels") from None
    config = NodeConfig(
        control_plane=control_plane,
        data_dir=data_dir,
        runtime=runtime,
        node_id=node_id,
        labels=parsed_labels,
        token=token,
        insecure_node_link=insecure_node_link,
        vcpus=vcpus,
        memory_mib=memory_mib,
        storage_pool=storage_pool,
        tls_ca=tls_ca,
        sim_backend=sim_backend,
        sim_step_ms=sim_step_ms,
        backend=backend,
        sandbox=sandbox,
        limits=limits,
        base_image=base_image,
        guest_command=tuple(shlex.split(guest_command)),
        stop_grace_ms=stop_grace_ms,
        guest_id_base=guest_id_base,
        allocation=_ratios(cpu_allocation_ratio, memory_allocation_ratio, disk_allocation_ratio, storage_overcommit),
        supervisor=supervisor.value,
        **_guest_network_config(guest_network, guest_deny, guest_dns),
        data_plane_listen=data_plane_listen,
        data_plane_address=data_plane_address,
    )
    try:
        asyncio.run(_run_node(config))
    except (OSError, RuntimeError, ValueError, KiboError) as error:
        typer.echo(f"kibo-ctrl node: {error}", err=True)
        raise typer.Exit(2) from None


def _labels(text: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, equals, value = part.partition("=")
        if not equals:
            raise KiboError(f"label {part[:80]!r}: write key=value")
        pairs[key.strip()] = value.strip()
    return check_labels(pairs)


async def _run_node(config: NodeConfig) -> None:
    host = await NodeHost.start(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    done = host.done
    assert done is not None
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, done}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if done.done() and not done.cancelled() and done.exception() is not None:
        await host.stop()
        raise RuntimeError(f"the node agent stopped: {done.exception()}")
    logging.getLogger("kibo.node").info("shutting down: the sandboxes keep running")
    await host.stop()


def main() -> None:
    # Plain help when piped (rich's boxes cut option names at 80 columns); shared with `kibo`.
    command_of(cli)(prog_name="kibo-ctrl")
