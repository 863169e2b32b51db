"""The process runtime: workspaces as isolated process trees on this machine.

An instance is one supervisor process (`supervisor.py`, the "VMM") that runs the guest's
process tree in its own user, PID, mount, UTS, IPC and network namespaces (bubblewrap;
only with an explicit `--sandbox none`, said loudly, no isolation: see `sandbox.py`), as
an unprivileged host uid range (`idmap.py`) without capabilities and under a seccomp
filter (`seccomp.py`), in a cgroup with the
workspace's CPU and memory limits (`cgroups.py`). The supervisor is started in its own
session, so a kill -9 of the control plane leaves it running, and `adopt` re-attaches.
Supervisors and data-plane jobs are forked from one warm interpreter (`forkserver.py`)
rather than exec'd, new layers and volumes come formatted from a pool (`image_pool.py`),
and the guest's first process joins its cgroup while the images are mounted
(`guest_start.py`): where a launch's time went, `bench/process_runtime.py --breakdown`.

What a launch prepares on disk (the files under the data directory, the spec each
supervisor runs) and the release of a stopped instance: `provision.py`.

Readiness: `launch` returns once the guest answers: the guest agent (the default entry)
writes /run/kibo/ready when it runs; a custom `--guest-command` must do the same. The
supervisor is woken by that file's creation (inotify on the run directory), not a poll.

Stop: graceful = SIGTERM to the guest's entry process, wait the grace period (then
SIGKILL), syncfs the layer and every volume; CONFIRMED only if every sync succeeded, else
SyncError and the supervisor stays (idle) holding the instance. Force = one short sync
(bounded), SIGKILL, release; UNCONFIRMED. A supervisor that does not answer a force stop
is killed from here.

How guest exits map to reports (per personality):

- the guest exits with 100 (a reboot request; `/run/kibo/bin/reboot` in the guest):
  firecracker: GuestReset, then `restart` starts a new supervisor for the same instance
  (same layer, volumes, generation); kibovm: VmmExited(GUEST_RESET) (FAILED, holding).
- the guest exits with 101 (a power-off request; `/run/kibo/bin/poweroff`): firecracker:
  GuestResponding(False), the supervisor stays running and idle (force stop, then start);
  kibovm: VmmExited(GUEST_POWEROFF) (the server's force stop follows).
- a process goes over the workspace's memory (its cgroup's limit: the guest's memory): the
  kernel kills that process, as a guest kernel's OOM killer would (exit 137 to its exec);
  the guest runs on: GuestOomKill (an event "OOM: killed PID (command)", a metric). The
  guest's processes rank 500 (oom_score_adj), its init and the sandbox's processes 0: the
  OOM killer's last choice in the guest (supervisor_os.GUEST_OOM_SCORE_ADJ).
- the OOM killer kills in the guest for lack of the host's memory (or of a limit above the
  guest's; told apart by the kernel's log of the kill: supervisor.py `check_oom`): the
  supervisor kills the whole guest and exits: VmmExited(HOST_OOM) on both (FAILED, then the
  server's force stop).
- the guest's init exits in any other way (a guest "kernel panic"): VmmExited(CRASH).
- the supervisor is killed from outside (no exit.json): VmmExited(CRASH); its guest dies
  with it (PR_SET_PDEATHSIG / --die-with-parent), the instance keeps its parts. A guest
  held by the node supervisor is not tied to it: a killed node supervisor is replaced and
  re-adopts its guests (node_supervision.py); a guest that ended meanwhile is a CRASH.

Restart safety: `adopt` re-attaches to the supervisors that outlived the control plane,
reports the dead and kills the orphans (`adoption.py`).

`--supervisor node` (`ProcessOptions.supervisor`): a supervisor hands its ready guest to the
node supervisor and exits (supervisor_handover.py, node_supervisor.py; started and kept
connected by node_supervision.py). The instance's lock, socket and protocol are the same,
so everything here works on it unchanged, except that killing "its supervisor" kills its
guest (`kill_supervisor`): the node supervisor holds others.

The data plane's hands: `guest_job` runs guest_exec.py, which joins the guest's cgroup
and namespaces and runs a command or reads/writes a file as the guest sees it; its output
comes through bounded queues (guest_jobs.py: back-pressure down to the guest's pipe).
`open_guest_port` connects to a port on the guest's loopback from inside its network
namespace (guest_ports.py): an exposure's last hop. Processes started in a guest (background,
PTY, input, signals; uploads) are kept in a table per instance (guest_access/processes.py),
killed at the instance's stop, destroy and release.

Rootless (the control plane is not root): guests' user namespaces map only this user's
uid/gid (sandbox.rootless), nothing is chowned, limits are rlimits and layers and volumes
plain directories; a guest escape reaches this user, not root (SECURITY.md).

Guest networking (as root with bubblewrap; rootless and `--sandbox none`: loopback only, said
once at start): each guest is put in a network namespace of its own slot with a veth, NAT and
its policy in nftables, and a resolver for its domain rules (network/: `GuestNetworks`);
`set_network_policy` changes a running guest's policy at once. `--guest-network off`: none.

Not (yet) done here: the guest runs as uid 0 of its own user namespace (host uid `--guest-id-base`) without
capabilities; the cgroup v2 path is written but was not
exercised on the (cgroup v1) machine this was built on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any

from ...domain.model import Backend, Component, Instance, NetworkPolicy, Phase, StopDurability
from ...domain.moves import MOVE_CAPABILITY
from ...domain.nodes import DiskStatus
from ...domain.reports import Report
from ..base import (
    DestroyError,
    Exit,
    GuestRefused,
    GuestStream,
    LaunchError,
    LaunchSpec,
    Output,
    RestartError,
    SyncError,
)
from . import adoption, network, observation, provision, safepath, sandbox, seccomp, storage
from .cgroups import Cgroups
from .disk_guard import DiskGuard
from .fork_client import Door, ForkServer
from .guest_access import ports as guest_ports
from .guest_access.jobs import run_guest_exec
from .guest_access.processes import ProcessTable, TableProcesses
from .image_pool import ImagePool
from .job_doors import JobDoors
from .node_supervision import NodeSupervision
from .options import ProcessOptions as ProcessOptions  # app.py imports it from here
from .options import SupervisorMode, launch_marker
from .provision import release_sync, safe
from .supervisor_handle import Process, Supervised, kill_supervisor, lock_held, read_json

log = logging.getLogger(__name__)

SUPERVISOR = Path(__file__).with_name("supervisor.py")
# A force stop that the supervisor does not finish in this time is done from here.
FORCE_TIMEOUT_S = 5.0
# How long a graceful stop waits for the sync after the grace period before its outcome is unknown.
SYNC_TIMEOUT_S = 60.0


class ProcessRuntime(TableProcesses):
    """The Runtime of the local node: see the module docstring. Its GuestProcesses are its
    table's (guest_access/processes.py)."""

    def __init__(self, node_id: str, options: ProcessOptions) -> None:
        self.node_id = node_id
        self.options = options
        self.backend = options.backend
        self.events: asyncio.Queue[Report] = asyncio.Queue()
        self.reachable = asyncio.Event()
        self.reachable.set()
        self.data_dir = options.data_dir.resolve()
        self.host_ids = options.guest_ids
        (self.data_dir / "runtime").mkdir(parents=True, exist_ok=True)
        self.seccomp_filter = self.data_dir / "runtime" / "seccomp.bpf"
        if options.sandbox != "none":
            seccomp.write_filter(self.seccomp_filter)
        # Why no guest can launch ("": they can): `--sandbox auto` on a machine where bwrap
        # does not work starts anyway (the README's first command must), says so loudly, and
        # fails each launch with the reason and its fix; an explicit `--sandbox bwrap` refuses.
        self.unavailable = ""
        try:
            self.isolation = sandbox.detect(options.sandbox, self.host_ids, self.seccomp_filter)
        except sandbox.SandboxUnavailable as error:
            if options.sandbox != "auto":
                raise
            self.isolation, self.unavailable = "unavailable", str(error)
            log.error("NO WORKSPACE CAN START ON THIS NODE: %s", error)
        # Rootless (not root): guests' root is this user, nothing is chowned (see sandbox.rootless).
        self.rootless = self.isolation == "bwrap" and sandbox.rootless()
        self.stage_dir = sandbox.stage_dir(self.data_dir)
        if self.isolation == "bwrap":
            sandbox.make_stage_dir(self.stage_dir)
        if self.rootless:
            log.warning("%s", sandbox.rootless_warning())
        if self.isolation == "none":
            log.warning(
                "!!! NO ISOLATION (--sandbox none): THIS IS NOT A SECURITY BOUNDARY. Guests run as plain "
                "host processes with the control plane's privileges (root) and see the host's files: "
                "run only code you would run on this host yourself."
            )
        tag = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:10]
        self.cgroups = Cgroups(tag, options.limits, options.pids_budget)
        if self.cgroups.mode in ("rlimit", "none"):
            log.warning("no writable cgroup: memory is limited by rlimits only, CPU is not limited")
        if options.base_image is not None and not options.base_image.is_dir():
            raise ValueError(f"base image {options.base_image} is not a directory")
        self.bin_dir = provision.lay_out(self.data_dir)
        self._supervised: dict[str, Supervised] = {}
        # Supervisors and guest jobs are forked from one warm interpreter (forkserver.py);
        # where it cannot be had, each is exec'd as before.
        self.forks = ForkServer()
        if self.isolation != "unavailable":
            self.forks.start()  # warming up meanwhile: the first launch does not wait for its imports
        # Guest jobs forked in their instance's cgroups (job_doors.py).
        self.doors = JobDoors(self.forks, options.job_door_idle_s)
        # Processes started in guests (the data plane's), by instance; dropped at its end.
        self.processes = ProcessTable(lambda i: (self.instance_dir(i), self._job_site(i)), self.guest_ready)
        self.images = storage.usable(self.isolation)
        if not self.images:
            log.warning("writable layers and volumes are plain directories: their sizes are NOT enforced")
        # Under the disk reserve, no guest takes another block of the host's (disk_guard.py).
        self.disk_guard: DiskGuard | None = None
        if self.images:
            self.disk_guard = DiskGuard(self.data_dir)
            self.disk_guard.start()
        # New layers and volumes taken formatted from a pool (image_pool.py), made between launches.
        self.pool: ImagePool | None = None
        if self.images and options.image_pool_depth > 0:
            self.pool = ImagePool(
                self.data_dir / "runtime" / "pool",
                self.data_dir,
                owner=sandbox.guest_id_map(self.host_ids)[0],
                variant="usr" if options.base_image is None else "base",
                make_seed=lambda upper: sandbox.seed_layer(
                    upper, host_usr=options.base_image is None, owner=provision.guest_root(self)
                ),
                disk_ratio=options.disk_allocation_ratio,
                depth=options.image_pool_depth,
            )
        # Ready guests held by the node supervisor instead of a supervisor each (--supervisor node).
        self.node_supervision: NodeSupervision | None = None
        mode = SupervisorMode(options.supervisor)
        if mode is not SupervisorMode.INSTANCE:
            if self.isolation == "bwrap" and not self.rootless and self.cgroups.parents:
                self.node_supervision = NodeSupervision(self.data_dir)
                self.node_supervision.name_for_launch()  # started now: launches do not wait for it
            elif mode is SupervisorMode.NODE:
                log.warning("--supervisor node needs bwrap as root with cgroups: each instance keeps its supervisor")
        # Guests' networks (network/): as root with bubblewrap only.
        self.networks: network.GuestNetworks | None = None
        if options.guest_network == "off":
            log.info("guest network off (--guest-network off): guests have loopback only")
        elif self.isolation != "bwrap" or self.rootless:
            log.warning("no guest network (%s): guests have loopback only", self.isolation_name)
        else:
            self.networks = network.GuestNetworks(
                self.data_dir,
                network.NetworkOptions(options.guest_network, options.guest_deny, options.guest_dns),
                lambda instance_id: lock_held(self.instance_dir(instance_id)),
            )
        log.info(
            "process runtime: isolation %s (guest ids: host %d+%d), limits %s, base image %s, personality %s",
            self.isolation_name,
            *sandbox.guest_id_map(self.host_ids)[:2],
            self.cgroups.mode,
            options.base_image or "host /usr (read-only)",
            self.backend.value,
        )

    # -- paths ------------------------------------------------------------------------

    def instance_dir(self, instance_id: str) -> Path:
        return self.data_dir / "instances" / safe(instance_id)

    def layer_dir(self, workspace_id: str) -> Path:
        return self.data_dir / "layers" / safe(workspace_id)

    def volume_dir(self, volume_id: str) -> Path:
        return self.data_dir / "volumes" / safe(volume_id)

    def socket_name(self, instance_id: str) -> str:
        digest = hashlib.sha256(str(self.instance_dir(instance_id)).encode()).hexdigest()[:32]
        return f"kibo-supervisor/{digest}"

    def node_supervisor_name(self) -> str:
        """Where new supervisors hand their ready guests ("": they keep them)."""
        return self.node_supervision.name_for_launch() if self.node_supervision is not None else ""

    @property
    def isolation_name(self) -> str:
        """bwrap, bwrap-rootless (a guest escape reaches this server's unprivileged user
        only), none or unavailable (every launch fails: see `unavailable`)."""
        return "bwrap-rootless" if self.rootless else self.isolation

    def pids_limit_hits(self) -> int:
        """runtime/base.py `GuestLimitCounters`: forks refused in this node's guests by a
        PIDs limit (cgroups.py; 0 without cgroups)."""
        return self.cgroups.pids_limit_hits()

    def disk_status(self) -> DiskStatus:
        """The node's disk now (blocking, cheap): real free space, the reserve, the declared
        capacities of its images, pressure (storage.py). The node agent tells it with each
        lease renewal, so the scheduler places on it."""
        free, reserve, promised, pressure = storage.disk_status(self.data_dir)
        # DiskPressure holds while the guests' images are clamped too (until the lift's margin).
        pressure = pressure or (self.disk_guard is not None and self.disk_guard.engaged)
        return DiskStatus(free_bytes=free, reserve_bytes=reserve, promised_bytes=promised, pressure=pressure)

    def storage_clamped(self) -> int:
        """runtime/base.py `GuestLimitCounters`: this node's guest images held at no new blocks
        now, under its disk reserve (disk_guard.py; 0 without images)."""
        return self.disk_guard.clamped() if self.disk_guard is not None else 0

    def disk_offered_gib(self) -> tuple[int, int]:
        """(the data dir's filesystem, GiB; the declared capacity its images may add up to, GiB)."""
        disk = storage.disk_bytes(self.data_dir)
        return disk >> 30, storage.offered_bytes(self.data_dir, self.options.disk_allocation_ratio) >> 30

    def capabilities(self) -> list[str]:
        caps = [
            "workspace.stop.force",
            f"runtime.process.{self.backend.value}",
            f"runtime.process.isolation.{self.isolation_name}",
            f"runtime.process.limits.{self.cgroups.mode}",
            f"runtime.process.storage.{'images' if self.images else 'unlimited'}",
        ]
        if self.images:
            # Its layers and volumes are image files (image_transfer.py): they can move.
            caps.append(MOVE_CAPABILITY)
        if self.isolation == "none":
            caps.append("runtime.process.unisolated")
        if self.backend is Backend.KIBOVM:
            caps.append("workspace.stop.guest_shutdown")
        if self.networks is not None:
            caps.append("network.egress")
        return caps

    # -- adoption ---------------------------------------------------------------------

    def adopt(self, instances: list[Instance]) -> None:
        adoption.adopt(self, self._supervised, instances)
        if self.networks is not None:
            # Slots found on the machine: owners that run, or that the store has here, keep them.
            self.networks.adopt(frozenset(i.id for i in instances))

    def _attach(self, instance_id: str) -> Supervised | None:
        """The live supervisor of the instance, if one runs (see adoption.attach)."""
        return adoption.attach(self, self._supervised, instance_id)

    # -- launch -------------------------------------------------------------------------

    async def launch(
        self, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
    ) -> tuple[str, ...]:
        if self.pool is None:
            return await self._launch(spec, progress)
        self.pool.launching(True)
        try:
            return await self._launch(spec, progress)
        finally:
            self.pool.launching(False)
            self.pool.refill_soon()  # after the launch: its mkfs runs do not slow this one

    async def _launch(
        self, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
    ) -> tuple[str, ...]:
        instance = spec.instance
        mark = self._marker(instance.id)
        if self.unavailable:
            raise LaunchError(f"this node cannot run workspaces: {self.unavailable}")
        try:
            layout, created = await asyncio.to_thread(provision.provision_storage, self, spec)
        except storage.NoSpace as error:
            # Not a failure of the workspace: the node has no room for it now (placed again).
            raise LaunchError(f"node {self.node_id}: {error}", no_room="disk") from None
        except (OSError, ValueError) as error:
            raise LaunchError(f"provisioning the layer and volumes failed: {error}") from None
        mark("provisioned")
        await progress(Phase.LAUNCHING, created)
        mark("progress-reported")
        current = self._attach(instance.id)
        if current is not None:
            # A launch re-driven after a control-plane restart: the supervisor runs already.
            await self._await_ready(current, created)
            return created
        try:
            slot = await self._attach_network(spec)
            plan = provision.guest_plan(self, instance, layout, *slot)
            await asyncio.to_thread(provision.write_spec, self, instance, layout, plan)
        except (OSError, ValueError, RuntimeError) as error:
            await self._release(instance.id)
            raise LaunchError(f"preparing the instance failed: {error}", volumes_created=created) from None
        mark("spec-written")
        supervised = self._spawn(instance.id)
        mark("supervisor-spawned")
        self._open_door(instance.id)
        await self._await_ready(supervised, created)
        mark("ready")
        return created

    async def _attach_network(self, spec: LaunchSpec) -> tuple[str, str]:
        """The guest's network slot with its policy applied: (netns path, gateway); none: ("", "")."""
        if self.networks is None:
            return "", ""
        slot = await asyncio.to_thread(self.networks.attach, spec.instance.id, spec.network_policy)
        return slot.path, str(slot.gateway)

    async def _release(self, instance_id: str) -> bool:
        """What a stopped instance holds: its cgroup and leftovers (provision.release_sync),
        then its network slot. False if a cgroup could not be removed."""
        self.processes.forget(instance_id)
        released = await asyncio.to_thread(release_sync, self.instance_dir(instance_id))
        if self.networks is not None:
            await asyncio.to_thread(self.networks.release, instance_id)
        return released

    async def set_network_policy(self, instance_id: str, policy: NetworkPolicy) -> None:
        """runtime/base.py `NetworkControl`: the running guest's policy now, one nftables
        transaction; connections it forbids are cut (network/rules.py)."""
        if self.networks is None:
            return  # loopback only (rootless, --sandbox none, --guest-network off): nothing to open or close
        try:
            await asyncio.to_thread(self.networks.set_policy, instance_id, policy)
        except KeyError:
            raise GuestRefused("unavailable", "the guest is not running") from None

    def _open_door(self, instance_id: str) -> None:
        self.doors.open(instance_id, self.instance_dir(instance_id), bool(self.cgroups.parents))

    def _marker(self, instance_id: str) -> Callable[[str], None]:
        return launch_marker(self.options.timings, self.instance_dir(instance_id) / "launch-timings.json")

    def _spawn(self, instance_id: str) -> Supervised:
        directory = self.instance_dir(instance_id)
        process: Process
        with open(directory / "supervisor.log", "ab") as output, open(os.devnull, "rb") as null:
            try:
                fds = [null.fileno(), output.fileno(), output.fileno()]
                userns = sandbox.guest_id_map(self.host_ids) if self.isolation == "bwrap" else None
                process = self.forks.spawn("supervisor", [str(directory)], fds, userns)
            except OSError as error:
                log.warning("the fork server failed (%s): starting the supervisor of %s anew", error, instance_id)
                process = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(SUPERVISOR), str(directory)],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    start_new_session=True,
                )
        supervised = Supervised(self, instance_id, process)
        self._supervised[instance_id] = supervised
        return supervised

    async def _await_ready(self, supervised: Supervised, created: tuple[str, ...]) -> None:
        supervised.quiet += 1
        try:
            timeout = self.options.ready_timeout_s + 10
            ready = await supervised.wait(lambda: supervised.state == "ready" or supervised.closed, timeout)
            if ready and not supervised.closed and supervised.state == "ready":
                return
            if not supervised.closed:
                kill_supervisor(supervised.dir)
                await supervised.wait(lambda: supervised.closed, FORCE_TIMEOUT_S)
            info = supervised.exit_info or {}
            why = info.get("error") or f"the supervisor exited ({info.get('reason') or 'killed'})"
            tail = await asyncio.to_thread(self._log_tail, supervised.dir)
            await self._release(supervised.instance_id)
            raise LaunchError(f"the guest did not become ready: {why}{tail}", volumes_created=created)
        finally:
            supervised.quiet -= 1

    @staticmethod
    def _log_tail(directory: Path) -> str:
        try:
            lines = (directory / "supervisor.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        interesting = [line for line in lines[-12:] if "supervisor" not in line[:30]]
        return (": " + " | ".join(interesting[-4:])) if interesting else ""

    async def restart(self, instance: Instance) -> None:
        """firecracker guest reset: a new supervisor for the same instance, same files."""
        current = self._attach(instance.id)
        if current is not None:
            # Re-driven after a control-plane restart: the new supervisor runs already.
            await self._await_ready(current, ())
            return
        directory = self.instance_dir(instance.id)
        spec = read_json(directory / "spec.json")
        if spec is None:
            raise RestartError(f"cannot restart {instance.id}: its spec is gone")
        try:
            self.doors.close(instance.id)  # in the old cgroups, which go
            await asyncio.to_thread(provision.renew_cgroups, self, instance, spec)
            supervised = self._spawn(instance.id)
            self._open_door(instance.id)
            await self._await_ready(supervised, ())
        except (LaunchError, OSError) as error:
            # The new VMM did not start: the node agent reports RestartFailed (FAILED, parts kept).
            raise RestartError(f"the new VMM did not start: {error}") from None

    # -- stop and release ---------------------------------------------------------------

    async def stop(self, instance: Instance, force: bool) -> StopDurability:
        directory = self.instance_dir(instance.id)
        self.doors.close(instance.id)
        self.processes.forget(instance.id)  # the data plane's: ended with the execution
        supervised = self._attach(instance.id)
        if supervised is not None:
            supervised.quiet += 1
            try:
                timeout = FORCE_TIMEOUT_S if force else self.options.grace_s + SYNC_TIMEOUT_S
                reply = await supervised.stop(force, timeout)
                if reply is not None and not reply.get("ok"):
                    raise SyncError(f"the filesystem sync failed: {reply.get('error')}; the instance was not stopped")
                if reply is None and not supervised.closed:
                    if not force:
                        raise SyncError("the stop's outcome is unknown: the sync did not finish in time")
                    log.warning("instance %s: the supervisor did not finish a force stop: killing it", instance.id)
                    kill_supervisor(directory)
                await supervised.wait(lambda: supervised.closed, FORCE_TIMEOUT_S)
            finally:
                supervised.quiet -= 1
            info = supervised.exit_info or {}
        else:
            info = read_json(directory / "exit.json") or {}
        if force:
            spec = read_json(directory / "spec.json") or {}
            if info.get("reason") != "stopped":
                await self._bounded_sync(spec, self.options.force_sync_s)
            await self._release(instance.id)
            return StopDurability.UNCONFIRMED
        if not (info.get("reason") == "stopped" and info.get("synced")):
            # The VMM was already gone: what its guest handed the kernel can still be synced.
            spec = read_json(directory / "spec.json") or {}
            error = await asyncio.to_thread(storage.sync_instance, spec)
            if error:
                raise SyncError(f"the filesystem sync failed: {error}; the instance was not stopped")
        await self._release(instance.id)
        return StopDurability.CONFIRMED

    async def _bounded_sync(self, spec: dict[str, Any], seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.to_thread(storage.sync_instance, spec, seconds)), seconds)

    async def destroy(self, instance: Instance) -> None:
        directory = self.instance_dir(instance.id)
        self.doors.close(instance.id)
        self.processes.forget(instance.id)
        supervised = self._attach(instance.id)
        if supervised is not None:
            supervised.quiet += 1
            try:
                await supervised.stop(True, FORCE_TIMEOUT_S)
                if not supervised.closed:
                    kill_supervisor(directory)
                    await supervised.wait(lambda: supervised.closed, FORCE_TIMEOUT_S)
            finally:
                supervised.quiet -= 1
            if not supervised.closed:
                raise DestroyError(f"the supervisor of {instance.id} does not exit")
        if not await self._release(instance.id):
            raise DestroyError(f"releasing {instance.id} failed: its cgroup cannot be removed")
        await asyncio.to_thread(storage.remove_tree, directory, True)
        self._supervised.pop(instance.id, None)

    async def delete_storage(self, workspace_id: str, volume_ids: tuple[str, ...]) -> None:
        await asyncio.to_thread(provision.delete_storage, self, workspace_id, volume_ids)

    async def delete_volumes(self, volume_ids: tuple[str, ...]) -> None:
        await asyncio.to_thread(provision.delete_volumes, self, volume_ids)

    # -- what the machine shows -----------------------------------------------------------

    def observe(
        self, instance_id: str | None, workspace_id: str, volume_ids: tuple[str, ...] = ()
    ) -> dict[Component, bool] | None:
        """Which parts of a workspace are on this machine right now, read from the OS (True:
        present). Blocking, cheap. A part that cannot be told here is left out: RESERVATION
        without cgroups, VOLUME_DELETION without volumes, the execution parts without an
        instance. `volume_ids`: the volumes deleted with the workspace."""
        return observation.observe(self, instance_id, workspace_id, volume_ids)

    # -- the data plane's hands ---------------------------------------------------------

    def guest_ready(self, instance_id: str) -> bool:
        """Whether the instance's guest runs and has answered (not restarting, not halted)."""
        supervised = self._supervised.get(instance_id)
        return supervised is not None and not supervised.closed and supervised.state == "ready"

    def check_file_path(self, path: str, mounts: list[str]) -> None:
        """The data plane's file-path rule (safepath.guest_file_path), which guest_exec.py
        applies again in the guest: one rule, in the file both import."""
        safepath.guest_file_path(path, mounts)

    async def guest_job(
        self,
        instance_id: str,
        job: dict[str, Any],
        stdin: bytes = b"",
        seconds: float = 0.0,
        stop: asyncio.Event | None = None,
    ) -> AsyncGenerator[Output | Exit, None]:
        """Run a job in the guest (see guest_exec.py and guest_jobs.py): its output, then how
        it ended; bounded memory; killed when `stop` is set (then JobStopped)."""
        if not self.guest_ready(instance_id):
            raise GuestRefused("unavailable", "the guest is not running or is restarting: retry")
        forks = self._job_site(instance_id)
        directory = self.instance_dir(instance_id)
        async with contextlib.aclosing(run_guest_exec(directory, job, stdin, seconds, stop, forks)) as items:
            async for item in items:
                yield item

    def _job_site(self, instance_id: str) -> ForkServer | Door:
        """Where the instance's next guest job or process is forked: its door (job_doors.py)."""
        return self.doors.get(instance_id, self.instance_dir(instance_id), bool(self.cgroups.parents))

    async def open_guest_port(self, instance_id: str, port: int) -> GuestStream:
        """A TCP connection to `port` on the guest's loopback, made in its network namespace
        (guest_ports.py): an exposure's last hop."""
        guest_ports.check_port(port)
        if not self.guest_ready(instance_id):
            raise GuestRefused("unavailable", "the guest is not running or is restarting: retry")
        return await guest_ports.open_guest_port(self.instance_dir(instance_id), port)

    async def close(self) -> None:
        """At control-plane shutdown: drop the connections; the supervisors run on."""
        for supervised in self._supervised.values():
            supervised.quiet += 1
            supervised.task.cancel()
        for supervised in self._supervised.values():
            with contextlib.suppress(BaseException):
                await supervised.task
        self.processes.close()
        self.doors.close_all()
        if self.node_supervision is not None:
            self.node_supervision.close()
        await asyncio.to_thread(self.forks.close)
        if self.pool is not None:
            await asyncio.to_thread(self.pool.close)
        if self.disk_guard is not None:
            await asyncio.to_thread(self.disk_guard.close)
        if self.networks is not None:
            await asyncio.to_thread(self.networks.close)
        self.cgroups.close()
