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

Files, under the data directory:
    layers/<workspace>/layer.img  the retained writable layer (kept across stop, deleted with
                                  the workspace): an ext4 image of `writable_layer_gib`, with
                                  upper/ (the guest's root) and work/ (for the overlay)
    volumes/<volume>/volume.img   a volume: an ext4 image of its capacity, bound at its mount
                                  path (/data); both loop-mounted at <dir>/mnt only inside the
                                  supervisor's mount namespace (storage.py)
    instances/<instance>/         spec.json (what the supervisor runs), state.json (the
                                  supervisor's and guest's PIDs), exit.json (why it exited),
                                  supervisor.log, lock (held by the live supervisor), run/
                                  (the guest's /run/kibo, a 1 MiB tmpfs: the ready file)
    runtime/bin/                  the guest agent and its reboot/poweroff helpers
Without images (`--sandbox none`, no mkfs.ext4 or loop devices, or a layer/volume made by
an older kibo: layers/<workspace>/upper/, volumes/<volume>/ with files) they are plain
directories, and their sizes are not enforced.

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
- the OOM killer kills in the guest's cgroup: the supervisor kills the whole guest and
  exits: VmmExited(HOST_OOM) on both (FAILED, then the server's force stop).
- the guest's init exits in any other way (a guest "kernel panic"): VmmExited(CRASH).
- the supervisor is killed from outside (no exit.json): VmmExited(CRASH); its guest dies
  with it (PR_SET_PDEATHSIG / --die-with-parent), the instance keeps its parts.

Restart safety: `adopt` takes the instances the store says this node has. A live
supervisor (its flock held) is re-attached and keeps running (same generation); a dead
one whose instance was running is reported as above (from its exit.json, or CRASH); an
instance whose step is still in flight is left to the node agent, whose re-driven
launch/restart attaches to a live supervisor instead of starting a second one; a live
supervisor of an instance the store no longer has active is an orphan and is killed.
(Run the control plane so that stopping it does not kill its process group or cgroup,
e.g. systemd KillMode=process, or the supervisors go with it and are reported CRASH.)

The data plane's hands: `guest_job` runs guest_exec.py, which joins the guest's cgroup
and namespaces and runs a command or reads/writes a file as the guest sees it; its output
comes through bounded queues (guest_jobs.py: back-pressure down to the guest's pipe).

Rootless (the control plane is not root): guests' user namespaces map only this user's
uid/gid (sandbox.rootless), nothing is chowned, limits are rlimits and layers and volumes
plain directories; a guest escape reaches this user, not root (SECURITY.md).

Not (yet) done here: the guest has loopback networking only, whatever the network
policy; the guest runs as uid 0 of its own user namespace (host uid `--guest-id-base`) without
capabilities; the cgroup v2 path is written but was not
exercised on the (cgroup v1) machine this was built on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any

from ...domain.model import Backend, Component, Instance, Phase, StopDurability, VolumeState
from ...domain.reports import ExitReason, Report, VmmExited
from ..base import DestroyError, Exit, GuestRefused, LaunchError, LaunchSpec, Output, RestartError, SyncError
from . import safepath, sandbox, seccomp, storage
from .cgroups import Cgroups
from .fork_client import ForkServer
from .guest_jobs import run_guest_exec
from .image_pool import ImagePool
from .job_doors import JobDoors
from .options import Layout, launch_marker
from .options import ProcessOptions as ProcessOptions  # app.py imports it from here
from .supervisor_handle import (
    Process,
    Supervised,
    exit_report,
    kill_supervisor,
    lock_held,
    parent_pid,
    read_json,
    running,
)

log = logging.getLogger(__name__)

SUPERVISOR = Path(__file__).with_name("supervisor.py")
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A force stop that the supervisor does not finish in this time is done from here.
FORCE_TIMEOUT_S = 5.0
# How long a graceful stop waits for the sync after the grace period before its outcome is unknown.
SYNC_TIMEOUT_S = 60.0


class ProcessRuntime:
    """The Runtime of the local node: see the module docstring."""

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
        self.cgroups = Cgroups(tag, options.limits)
        if self.cgroups.mode in ("rlimit", "none"):
            log.warning("no writable cgroup: memory is limited by rlimits only, CPU is not limited")
        if options.base_image is not None and not options.base_image.is_dir():
            raise ValueError(f"base image {options.base_image} is not a directory")
        self.bin_dir = self.data_dir / "runtime" / "bin"
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for name, text in sandbox.GUEST_SCRIPTS.items():
            path = self.bin_dir / name
            path.write_text(text)
            path.chmod(0o755)
        for sub in ("instances", "layers", "volumes"):
            (self.data_dir / sub).mkdir(exist_ok=True)
        self._supervised: dict[str, Supervised] = {}
        # Supervisors and guest jobs are forked from one warm interpreter (forkserver.py);
        # where it cannot be had, each is exec'd as before.
        self.forks = ForkServer()
        if self.isolation != "unavailable":
            self.forks.start()  # warming up meanwhile: the first launch does not wait for its imports
        # Guest jobs forked in their instance's cgroups (job_doors.py).
        self.doors = JobDoors(self.forks, options.job_door_idle_s)
        self.images = storage.usable(self.isolation)
        if not self.images:
            log.warning("writable layers and volumes are plain directories: their sizes are NOT enforced")
        # New layers and volumes taken formatted from a pool (image_pool.py), made between launches.
        self.pool: ImagePool | None = None
        if self.images and options.image_pool_depth > 0:
            self.pool = ImagePool(
                self.data_dir / "runtime" / "pool",
                self.data_dir,
                owner=sandbox.guest_id_map(self.host_ids)[0],
                variant="usr" if options.base_image is None else "base",
                make_seed=lambda upper: sandbox.seed_layer(
                    upper, host_usr=options.base_image is None, owner=self._guest_root()
                ),
                overcommit=options.storage_overcommit,
                depth=options.image_pool_depth,
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

    @staticmethod
    def _safe(identifier: str) -> str:
        if not _SAFE_ID.fullmatch(identifier):
            raise ValueError(f"{identifier!r} cannot name a directory")
        return identifier

    def instance_dir(self, instance_id: str) -> Path:
        return self.data_dir / "instances" / self._safe(instance_id)

    def layer_dir(self, workspace_id: str) -> Path:
        return self.data_dir / "layers" / self._safe(workspace_id)

    def volume_dir(self, volume_id: str) -> Path:
        return self.data_dir / "volumes" / self._safe(volume_id)

    def socket_name(self, instance_id: str) -> str:
        digest = hashlib.sha256(str(self.instance_dir(instance_id)).encode()).hexdigest()[:32]
        return f"kibo-supervisor/{digest}"

    @property
    def isolation_name(self) -> str:
        """bwrap, bwrap-rootless (a guest escape reaches this server's unprivileged user
        only), none or unavailable (every launch fails: see `unavailable`)."""
        return "bwrap-rootless" if self.rootless else self.isolation

    def capabilities(self) -> list[str]:
        caps = [
            "workspace.stop.force",
            f"runtime.process.{self.backend.value}",
            f"runtime.process.isolation.{self.isolation_name}",
            f"runtime.process.limits.{self.cgroups.mode}",
            f"runtime.process.storage.{'images' if self.images else 'unlimited'}",
        ]
        if self.isolation == "none":
            caps.append("runtime.process.unisolated")
        if self.backend is Backend.KIBOVM:
            caps.append("workspace.stop.guest_shutdown")
        return caps

    # -- adoption ---------------------------------------------------------------------

    def adopt(self, instances: list[Instance]) -> None:
        active = {i.id: i for i in instances}
        root = self.data_dir / "instances"
        for directory in sorted(root.iterdir()):
            if directory.name in active:
                continue
            # Nothing in the store needs this instance: an orphan, or leftovers of a released one.
            if lock_held(directory):
                log.warning("killing orphan supervisor of %s (the store has no active instance)", directory.name)
                kill_supervisor(directory)
            self._release_sync(directory)
            storage.remove_tree(directory, ignore_errors=True)
        for instance in instances:
            directory = self.instance_dir(instance.id)
            if lock_held(directory):
                log.info("re-attaching to the running supervisor of %s", instance.id)
                self._supervised[instance.id] = Supervised(self, instance.id, None)
                continue
            if instance.step != instance.done_step:
                continue  # the node agent re-drives this step (launch/restart attach or start anew)
            if instance.phase is Phase.RUNNING and Component.INSTANCE in instance.holds:
                info = read_json(directory / "exit.json")
                report = exit_report(instance.id, self.backend, info)
                log.warning("instance %s: its supervisor is gone (%s)", instance.id, info or "killed")
                self.events.put_nowait(report or VmmExited(instance.id, reason=ExitReason.CRASH))

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
            layout, created = await asyncio.to_thread(self._provision, spec)
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
        plan = sandbox.GuestPlan(
            root=layout.upper if self.options.base_image is None else self.instance_dir(instance.id) / "root",
            base=self.options.base_image,
            binds=tuple(layout.volumes),
            run_dir=self.instance_dir(instance.id) / "run",
            bin_dir=self.bin_dir,
            hostname=instance.workspace_id,
            command=self.options.guest_command,
            env={"KIBO_WORKSPACE_ID": instance.workspace_id, "KIBO_INSTANCE_ID": instance.id},
        )
        try:
            await asyncio.to_thread(self._write_spec, instance, layout, plan)
        except (OSError, ValueError) as error:
            await asyncio.to_thread(self._release_sync, self.instance_dir(instance.id))
            raise LaunchError(f"preparing the instance failed: {error}", volumes_created=created) from None
        mark("spec-written")
        supervised = self._spawn(instance.id)
        mark("supervisor-spawned")
        self._open_door(instance.id)
        await self._await_ready(supervised, created)
        mark("ready")
        return created

    def _open_door(self, instance_id: str) -> None:
        self.doors.open(instance_id, self.instance_dir(instance_id), bool(self.cgroups.parents))

    def _marker(self, instance_id: str) -> Callable[[str], None]:
        return launch_marker(self.options.timings, self.instance_dir(instance_id) / "launch-timings.json")

    def _provision(self, spec: LaunchSpec) -> tuple[Layout, tuple[str, ...]]:
        workspace_id = spec.instance.workspace_id
        layout = self._layer_layout(workspace_id, spec.resources.writable_layer_gib)
        created = []
        mounts = {b.volume_id: b.mount_path for b in spec.bindings}
        for volume in spec.volumes:
            path = self.volume_dir(volume.id)
            path.mkdir(parents=True, exist_ok=True)
            if volume.state is VolumeState.PENDING:
                created.append(volume.id)
            if volume.id in mounts:
                if self.images and not storage.legacy_volume(path):
                    layout.images.append(storage.entry(path, storage.VOLUME_IMAGE, volume.capacity_gib, None))
                    path = path / "mnt"
                    path.mkdir(exist_ok=True)
                layout.volumes.append((path, mounts[volume.id]))
        # The sparse files of new images, if the disk can hold them all (else NoSpace).
        take = self.pool.take if self.pool is not None else None
        storage.admit(self.data_dir, layout.images, self.options.storage_overcommit, take)
        self._seed(layout.images)
        return layout, tuple(created)

    def _guest_root(self) -> tuple[int, int] | None:
        """Who owns what the runtime creates in a guest's tree: the guest's root on the host
        (the supervisor shifts older trees into the range: see idmap.py)."""
        return self.host_ids.root if self.isolation == "bwrap" and not self.rootless else None

    def _layer_layout(self, workspace_id: str, capacity_gib: int) -> Layout:
        """The writable layer: an image (new layers), or a directory (layers from before images)."""
        layer = self.layer_dir(workspace_id)
        host_usr = self.options.base_image is None
        if not self.images or storage.legacy_layer(layer):
            layout = Layout(layer=layer, upper=layer / "upper", work=layer / "work")
            layout.upper.mkdir(parents=True, exist_ok=True)
            if not host_usr:
                layout.work.mkdir(exist_ok=True)
            sandbox.seed_layer(layout.upper, host_usr=host_usr, owner=self._guest_root())
            return layout
        mnt = layer / "mnt"
        layout = Layout(layer=layer, upper=mnt / "upper", work=mnt / "work")
        mnt.mkdir(parents=True, exist_ok=True)
        # A new layer: formatted ahead by the pool, or by the supervisor from a seed (_seed).
        seed = None if (layer / storage.LAYER_IMAGE).exists() else layer / "seed"
        layout.images.append(storage.entry(layer, storage.LAYER_IMAGE, capacity_gib, seed))
        return layout

    def _seed(self, images: list[dict[str, Any]]) -> None:
        """The skeleton a new layer image is formatted with by the supervisor (mkfs -d), for
        each one the pool did not have ready: made fresh here, so no guest ever had a hand in
        it; the layer's files are never touched from here again."""
        for image in images:
            if image["seed"] and not os.path.exists(image["image"]):
                seed = Path(image["seed"])
                shutil.rmtree(seed, ignore_errors=True)
                (seed / "upper").mkdir(parents=True)
                (seed / "work").mkdir()
                sandbox.seed_layer(seed / "upper", host_usr=self.options.base_image is None, owner=self._guest_root())

    def _write_spec(self, instance: Instance, layout: Layout, plan: sandbox.GuestPlan) -> None:
        directory = self.instance_dir(instance.id)
        if lock_held(directory):
            raise ValueError(f"a supervisor already runs {instance.id}")
        # Earlier generations of this workspace were reported stopped: their leftovers go.
        for old in (self.data_dir / "instances").glob(f"{self._safe(instance.workspace_id)}-g*"):
            if old.name != instance.id and not lock_held(old):
                self._release_sync(old)
                storage.remove_tree(old, ignore_errors=True)
        (directory / "run").mkdir(parents=True, exist_ok=True)
        if self._guest_root() is not None:
            # The guest's /run/kibo (its agent writes the ready file there).
            os.chown(directory / "run", *self.host_ids.root, follow_symlinks=False)
        for stale in ("exit.json", "state.json"):
            with contextlib.suppress(FileNotFoundError):
                (directory / stale).unlink()
        overlay = None
        if plan.base is not None:
            (directory / "root").mkdir(exist_ok=True)
            overlay = {
                "lower": str(plan.base),
                "upper": str(layout.upper),
                "work": str(layout.work),
                "merged": str(directory / "root"),
            }
        limits = self.cgroups.create(self._safe(instance.id), instance.vcpus, instance.memory_mib)
        command = sandbox.command(self.isolation, plan)
        id_map = sandbox.guest_id_map(self.host_ids)
        spec = {
            "instance_id": instance.id,
            "workspace_id": instance.workspace_id,
            "personality": self.backend.value,
            "socket": self.socket_name(instance.id),
            "argv": command.argv,
            "env": command.env,
            "cwd": command.cwd,
            "entry_depth": command.entry_depth,
            "cgroup_dirs": list(limits.dirs),
            "cgroup_procs": list(limits.procs),
            "oom_file": limits.oom_file,
            "rlimits": [list(r) for r in limits.rlimits],
            "run_dir": str(plan.run_dir),
            "isolation": self.isolation,
            "mounts": [[str(path), target] for path, target in layout.volumes],
            # The guest's user namespace: guest ids 0..count-1 are host ids base..base+count-1
            # (gids from host_gid_base; rootless: this user's uid and gid alone, count 1).
            "host_id_base": id_map[0],
            "host_id_count": id_map[1],
            "host_gid_base": id_map[2],
            "rootless": self.rootless,
            "seccomp_filter": str(self.seccomp_filter),
            "bin_dir": str(plan.bin_dir),
            # Staged by the supervisor where the guest's uid reaches them (the guest's trees).
            "stage_dir": str(self.stage_dir),
            "staged": [str(plan.root), str(plan.run_dir)] + [str(path) for path, _ in layout.volumes],
            # The environment of data-plane commands: the guest's (unisolated: with the KIBO_* paths).
            "guest_env": command.env
            if self.isolation == "none"
            else {"PATH": sandbox.GUEST_PATH, "HOME": "/root", "TERM": "dumb", **plan.env},
            "overlay": overlay,
            "storage": layout.images,
            "sync_paths": [str(layout.upper)] + [str(path) for path, _ in layout.volumes],
            "grace_s": self.options.grace_s,
            "force_sync_s": self.options.force_sync_s,
            "ready_timeout_s": self.options.ready_timeout_s,
            "reboot_code": sandbox.EXIT_REBOOT,
            "poweroff_code": sandbox.EXIT_POWEROFF,
            "timings": self.options.timings,
        }
        tmp = directory / "spec.json.tmp"
        tmp.write_text(json.dumps(spec, indent=1))
        os.replace(tmp, directory / "spec.json")

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
            await asyncio.to_thread(self._release_sync, supervised.dir)
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
            await asyncio.to_thread(self._recreate_cgroup, instance, spec)
            supervised = self._spawn(instance.id)
            self._open_door(instance.id)
            await self._await_ready(supervised, ())
        except (LaunchError, OSError) as error:
            # The new VMM did not start: the node agent reports RestartFailed (FAILED, parts kept).
            raise RestartError(f"the new VMM did not start: {error}") from None

    def _recreate_cgroup(self, instance: Instance, spec: dict[str, Any]) -> None:
        Cgroups.remove(tuple(spec.get("cgroup_dirs") or ()))
        limits = self.cgroups.create(self._safe(instance.id), instance.vcpus, instance.memory_mib)
        spec.update(cgroup_dirs=list(limits.dirs), cgroup_procs=list(limits.procs), oom_file=limits.oom_file)
        directory = self.instance_dir(instance.id)
        with contextlib.suppress(FileNotFoundError):
            (directory / "exit.json").unlink()
        tmp = directory / "spec.json.tmp"
        tmp.write_text(json.dumps(spec, indent=1))
        os.replace(tmp, directory / "spec.json")

    # -- stop and release ---------------------------------------------------------------

    def _attach(self, instance_id: str) -> Supervised | None:
        current = self._supervised.get(instance_id)
        if current is not None and not current.closed:
            return current
        if lock_held(self.instance_dir(instance_id)):
            current = Supervised(self, instance_id, None)
            self._supervised[instance_id] = current
            return current
        return None

    async def stop(self, instance: Instance, force: bool) -> StopDurability:
        directory = self.instance_dir(instance.id)
        self.doors.close(instance.id)
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
            await asyncio.to_thread(self._release_sync, directory)
            return StopDurability.UNCONFIRMED
        if not (info.get("reason") == "stopped" and info.get("synced")):
            # The VMM was already gone: what its guest handed the kernel can still be synced.
            spec = read_json(directory / "spec.json") or {}
            error = await asyncio.to_thread(storage.sync_instance, spec)
            if error:
                raise SyncError(f"the filesystem sync failed: {error}; the instance was not stopped")
        await asyncio.to_thread(self._release_sync, directory)
        return StopDurability.CONFIRMED

    async def _bounded_sync(self, spec: dict[str, Any], seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.to_thread(storage.sync_instance, spec, seconds)), seconds)

    def _release_sync(self, directory: Path) -> bool:
        """Release what a stopped instance holds on the machine: its cgroup (killing whatever
        still runs in it) and leftovers. Blocking. False if a cgroup could not be removed."""
        spec = read_json(directory / "spec.json") or {}
        released = True
        try:
            Cgroups.remove(tuple(spec.get("cgroup_dirs") or ()))
        except OSError as error:
            log.warning("%s: removing its cgroup failed: %s", directory.name, error)
            released = False
        for name in ("ready", "agent.pid"):
            with contextlib.suppress(OSError):
                (directory / "run" / name).unlink()
        # The images' filesystems go with the last process of the supervisor's namespaces:
        # wait for that, then what their unmount wrote into the image files is made durable.
        images = storage.image_files(spec.get("storage") or [])
        if storage.wait_detached(images, storage.DETACH_TIMEOUT_S):
            log.warning("%s: its layer or volume images are still mounted", directory.name)
        storage.fsync_files(images)
        return released

    async def destroy(self, instance: Instance) -> None:
        directory = self.instance_dir(instance.id)
        self.doors.close(instance.id)
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
        if not await asyncio.to_thread(self._release_sync, directory):
            raise DestroyError(f"releasing {instance.id} failed: its cgroup cannot be removed")
        await asyncio.to_thread(storage.remove_tree, directory, True)
        self._supervised.pop(instance.id, None)

    async def delete_storage(self, workspace_id: str, volume_ids: tuple[str, ...]) -> None:
        def remove() -> None:
            for old in (self.data_dir / "instances").glob(f"{self._safe(workspace_id)}-g*"):
                if not lock_held(old):
                    self._release_sync(old)
                    storage.remove_tree(old, ignore_errors=True)
            # Durably gone, or OSError (an image still mounted): the node agent tries again.
            storage.destroy(self.layer_dir(workspace_id))
            for volume_id in volume_ids:
                storage.destroy(self.volume_dir(volume_id))

        await asyncio.to_thread(remove)

    async def delete_volumes(self, volume_ids: tuple[str, ...]) -> None:
        def remove() -> None:
            for volume_id in volume_ids:
                storage.destroy(self.volume_dir(volume_id))

        await asyncio.to_thread(remove)

    # -- what the machine shows -----------------------------------------------------------

    def observe(
        self, instance_id: str | None, workspace_id: str, volume_ids: tuple[str, ...] = ()
    ) -> dict[Component, bool] | None:
        """Which parts of a workspace are on this machine right now, read from the OS (True:
        present). Blocking, cheap. A part that cannot be told here is left out: RESERVATION
        without cgroups, VOLUME_DELETION without volumes, the execution parts without an
        instance. `volume_ids`: the volumes deleted with the workspace."""
        try:
            layer = self.layer_dir(workspace_id)
            # An image whose loop device is still attached holds its blocks even once unlinked.
            layer_mounted = bool(storage.attached(storage.images_in(layer)))
            seen: dict[Component, bool] = {Component.RETAINED_LAYER: layer.is_dir() or layer_mounted}
            if volume_ids:
                volumes = [self.volume_dir(v) for v in volume_ids]
                images = [image for v in volumes for image in storage.images_in(v)]
                seen[Component.VOLUME_DELETION] = any(v.is_dir() for v in volumes) or bool(storage.attached(images))
            if instance_id is None:
                return seen
            state = read_json(self.instance_dir(instance_id) / "state.json") or {}
        except ValueError:
            return None  # not an ID of this runtime
        supervisor = int(state.get("supervisor_pid") or 0)
        alive = running(supervisor, state.get("supervisor_start"))
        guest = int(state.get("guest_pid") or 0)
        if guest > 0:
            guest_alive = running(guest, state.get("guest_start"))
        else:
            # Not ready yet: the sandbox (bwrap, the supervisor's child) holds the namespaces.
            sandbox_pid = int(state.get("sandbox_pid") or 0)
            guest_alive = alive and running(sandbox_pid, None) and parent_pid(sandbox_pid) == supervisor
        seen[Component.INSTANCE] = alive
        # The guest's mount and network namespaces and its volume bind mounts live as long as its processes.
        for part in (Component.LAYER_MOUNT, Component.NETWORK, Component.VOLUME_ATTACHMENT):
            seen[part] = guest_alive
        seen[Component.LAYER_MOUNT] = guest_alive or layer_mounted
        if self.cgroups.parents:
            seen[Component.RESERVATION] = any((parent / instance_id).is_dir() for parent in self.cgroups.parents)
        return seen

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
        directory = self.instance_dir(instance_id)
        forks = self.doors.get(instance_id, directory, bool(self.cgroups.parents))
        async with contextlib.aclosing(run_guest_exec(directory, job, stdin, seconds, stop, forks)) as items:
            async for item in items:
                yield item

    async def close(self) -> None:
        """At control-plane shutdown: drop the connections; the supervisors run on."""
        for supervised in self._supervised.values():
            supervised.quiet += 1
            supervised.task.cancel()
        for supervised in self._supervised.values():
            with contextlib.suppress(BaseException):
                await supervised.task
        self.doors.close_all()
        await asyncio.to_thread(self.forks.close)
        if self.pool is not None:
            await asyncio.to_thread(self.pool.close)
        self.cgroups.close()
