"""The process runtime's options, a launch's storage layout, and the launch-step timer."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ...domain.model import Backend
from . import image_pool, job_doors
from .idmap import IdRange


class SupervisorMode(StrEnum):
    """Who holds a ready guest (`ProcessOptions.supervisor`, `--supervisor`)."""

    AUTO = "auto"  # node where it works (bwrap as root, with cgroups), else instance
    INSTANCE = "instance"  # its own supervisor process (supervisor.py)
    NODE = "node"  # the node supervisor its supervisor hands it to (node_supervisor.py)


@dataclass(frozen=True)
class ProcessOptions:
    data_dir: Path
    backend: Backend = Backend.FIRECRACKER
    sandbox: str = "auto"  # auto (bwrap; launches fail naming the fix where it cannot work), bwrap, none
    limits: str = "auto"  # auto, cgroup-v2, cgroup-v1, rlimit, none
    base_image: Path | None = None  # a directory tree; None: the host's /usr read-only
    guest_command: tuple[str, ...] = ()  # empty: the guest agent
    grace_s: float = 10.0
    force_sync_s: float = 1.0
    ready_timeout_s: float = 30.0
    # New images' declared capacities may add up to this many times the data dir's
    # filesystem (--disk-allocation-ratio; storage.py); below its reserve of real free
    # space the node makes none.
    disk_allocation_ratio: float = 10.0
    guest_ids: IdRange = field(default_factory=IdRange)  # the host ids guests' ids map to
    # Formatted images kept ready per recently used size of new layers and volumes (0: none).
    # (KIBO_IMAGE_POOL_DEPTH: the benchmark's way to compare with and without the pool.)
    image_pool_depth: int = field(
        default_factory=lambda: int(os.environ.get("KIBO_IMAGE_POOL_DEPTH") or image_pool.DEPTH)
    )
    # A guest's job door (job_doors.py) is closed after this many seconds without a job: an
    # idle workspace does not keep its ~2 MiB. (KIBO_JOB_DOOR_IDLE_S: the benchmark's, to
    # measure idle workspaces without waiting a minute; 0: no doors.)
    job_door_idle_s: float = field(
        default_factory=lambda: float(os.environ.get("KIBO_JOB_DOOR_IDLE_S") or job_doors.IDLE_S)
    )
    # Record when each step of a launch ended, in the instance directory (launch-timings.json
    # from here, timings.json from the supervisor): the benchmark's breakdown
    # (bench/process_runtime.py --breakdown sets KIBO_PROCESS_TIMINGS=1). Off: no cost.
    timings: bool = field(default_factory=lambda: os.environ.get("KIBO_PROCESS_TIMINGS") == "1")
    # Who holds a ready guest: its own supervisor process ("instance"), or the node supervisor
    # it hands the guest to ("node": supervisor_handover.py, node_supervisor.py); "auto": node
    # where it works.
    supervisor: str = "auto"
    # The tasks (processes and threads) all guests of this node may hold together: the
    # `pids.max` of the runtime's parent cgroup, which each guest's share is cut from
    # (cgroups.py). 0: the kernel's task limit less a reserve (cgroups.node_pids_budget).
    # (KIBO_NODE_PIDS_MAX: the operator's override, and the tests' way to a small node.)
    pids_budget: int = field(default_factory=lambda: int(os.environ.get("KIBO_NODE_PIDS_MAX") or 0))
    # Guest networking (runtime/process/network/; bwrap as root only): `--guest-network CIDR`
    # (the guests' address pool; "": the first free /20 of 10.200.0.0/14; "off": no guest
    # network, loopback only as before), `--guest-deny CIDR` (repeatable: blocked under every
    # policy), `--guest-dns ADDR[:PORT]` (repeatable: the resolver's upstreams; none: the
    # host's /etc/resolv.conf).
    guest_network: str = ""
    guest_deny: tuple[str, ...] = ()
    guest_dns: tuple[str, ...] = ()


def host_capacity() -> tuple[int, int]:
    """This host's vCPUs (the cores this process may run on) and memory (MiB): what a node's
    capacity is made of (times its allocation ratios: domain/nodes.py)."""
    vcpus = len(os.sched_getaffinity(0))
    memory_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    return vcpus, int(memory_mib)


class ProcessSettings(Protocol):
    """What a server's or a node agent's configuration says of its process runtime (the
    fields `kibo-ctrl serve` and `kibo-ctrl node` share: app.Config, node_host.NodeConfig)."""

    @property
    def backend(self) -> Backend: ...
    @property
    def sandbox(self) -> str: ...
    @property
    def limits(self) -> str: ...
    @property
    def base_image(self) -> Path | None: ...
    @property
    def guest_command(self) -> tuple[str, ...]: ...
    @property
    def stop_grace_ms(self) -> float: ...
    @property
    def guest_id_base(self) -> int: ...
    @property
    def disk_allocation_ratio(self) -> float: ...
    @property
    def supervisor(self) -> str: ...
    @property
    def guest_network(self) -> str: ...
    @property
    def guest_deny(self) -> tuple[str, ...]: ...
    @property
    def guest_dns(self) -> tuple[str, ...]: ...


def options_from(settings: ProcessSettings, data_dir: Path) -> ProcessOptions:
    """The runtime's options from either command's configuration."""
    return ProcessOptions(
        data_dir=data_dir,
        backend=settings.backend,
        sandbox=settings.sandbox,
        limits=settings.limits,
        base_image=settings.base_image,
        guest_command=settings.guest_command,
        grace_s=settings.stop_grace_ms / 1000,
        guest_ids=IdRange(base=settings.guest_id_base),
        disk_allocation_ratio=settings.disk_allocation_ratio,
        supervisor=settings.supervisor,
        guest_network=settings.guest_network,
        guest_deny=settings.guest_deny,
        guest_dns=settings.guest_dns,
    )


@dataclass
class Layout:
    layer: Path
    upper: Path
    work: Path
    volumes: list[tuple[Path, str]] = field(default_factory=list)
    # The size-capped images the supervisor formats and mounts (storage.py); empty: plain dirs.
    images: list[dict[str, Any]] = field(default_factory=list)


def launch_marker(enabled: bool, path: Path) -> Callable[[str], None]:
    """A function that records the end of a launch step (only if `enabled`): the last one,
    "ready", writes them all to `path` (launch-timings.json)."""
    if not enabled:
        return lambda step: None
    marks = [("launch", time.time())]

    def mark(step: str) -> None:
        marks.append((step, time.time()))
        if step == "ready":
            with contextlib.suppress(OSError):
                path.write_text(json.dumps({"marks": marks}))

    return mark
