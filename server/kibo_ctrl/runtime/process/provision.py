"""The process runtime's files on this machine: what a launch prepares, and what goes after.

For runtime.py, which calls what blocks here from a worker thread: the data directory's
tree (`lay_out`, at start); an instance's writable layer and volumes (`provision_storage`,
`layer_layout`, `seed_layers`), its guest's sandbox (`guest_plan`) and the spec its
supervisor runs (`write_spec`; a firecracker guest reset gives the same spec new cgroups:
`renew_cgroups`); then what a stopped instance still holds (`release_sync`) and a deleted
workspace's storage (`delete_storage`, `delete_volumes`). Apart from runtime.py so that
the runtime's operations read in one sitting, and what it writes to disk in one place.

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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

from ...domain.model import Backend, Instance, VolumeState
from ..base import LaunchSpec
from . import sandbox, storage
from .cgroups import Cgroups
from .idmap import IdRange
from .image_pool import ImagePool
from .options import Layout, ProcessOptions
from .supervisor_handle import lock_held, read_json

log = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ProvisionHost(Protocol):
    """What provisioning needs of the runtime that launches (ProcessRuntime): its settings,
    what it found on this machine, and its paths."""

    options: ProcessOptions
    backend: Backend
    data_dir: Path
    host_ids: IdRange
    isolation: str
    rootless: bool
    images: bool
    pool: ImagePool | None
    cgroups: Cgroups
    seccomp_filter: Path
    stage_dir: Path
    bin_dir: Path

    def instance_dir(self, instance_id: str) -> Path: ...

    def layer_dir(self, workspace_id: str) -> Path: ...

    def volume_dir(self, volume_id: str) -> Path: ...

    def socket_name(self, instance_id: str) -> str: ...

    def node_supervisor_name(self) -> str: ...


def lay_out(data_dir: Path) -> Path:
    """The data directory's tree (the files above), with the guest agent and its helpers
    written into runtime/bin/ at every start; that bin directory."""
    bin_dir = data_dir / "runtime" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in sandbox.GUEST_SCRIPTS.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    for sub in ("instances", "layers", "volumes"):
        (data_dir / sub).mkdir(exist_ok=True)
    return bin_dir


def safe(identifier: str) -> str:
    """`identifier`, if it can name a directory under the data directory (else ValueError)."""
    if not _SAFE_ID.fullmatch(identifier):
        raise ValueError(f"{identifier!r} cannot name a directory")
    return identifier


def guest_root(host: ProvisionHost) -> tuple[int, int] | None:
    """Who owns what the runtime creates in a guest's tree: the guest's root on the host
    (the supervisor shifts older trees into the range: see idmap.py)."""
    return host.host_ids.root if host.isolation == "bwrap" and not host.rootless else None


def provision_storage(host: ProvisionHost, spec: LaunchSpec) -> tuple[Layout, tuple[str, ...]]:
    """The instance's writable layer and volumes (made where new), and the IDs of its volumes
    still PENDING (this launch creates them)."""
    workspace_id = spec.instance.workspace_id
    layout = layer_layout(host, workspace_id, spec.resources.writable_layer_gib)
    created = []
    mounts = {b.volume_id: b.mount_path for b in spec.bindings}
    for volume in spec.volumes:
        path = host.volume_dir(volume.id)
        path.mkdir(parents=True, exist_ok=True)
        if volume.state is VolumeState.PENDING:
            created.append(volume.id)
        if volume.id in mounts:
            if host.images and not storage.legacy_volume(path):
                layout.images.append(storage.entry(path, storage.VOLUME_IMAGE, volume.capacity_gib, None))
                path = path / "mnt"
                path.mkdir(exist_ok=True)
            layout.volumes.append((path, mounts[volume.id]))
    # The sparse files of new images, if the node may take new storage now (else NoSpace).
    take = host.pool.take if host.pool is not None else None
    try:
        storage.admit(host.data_dir, layout.images, host.options.disk_allocation_ratio, take)
    except storage.NoSpace:
        _unmake_empty(layout)
        raise
    seed_layers(host, layout.images)
    return layout, tuple(created)


def _unmake_empty(layout: Layout) -> None:
    """After a refused admission: the directories this launch made and left empty go (the
    instance is placed again, maybe on another node: nothing of it stays here)."""
    for image in layout.images:
        directory = Path(image["image"]).parent
        for empty in (directory / "mnt", directory):
            with contextlib.suppress(OSError):
                empty.rmdir()


def layer_layout(host: ProvisionHost, workspace_id: str, capacity_gib: int) -> Layout:
    """The writable layer: an image (new layers), or a directory (layers from before images)."""
    layer = host.layer_dir(workspace_id)
    host_usr = host.options.base_image is None
    if not host.images or storage.legacy_layer(layer):
        layout = Layout(layer=layer, upper=layer / "upper", work=layer / "work")
        layout.upper.mkdir(parents=True, exist_ok=True)
        if not host_usr:
            layout.work.mkdir(exist_ok=True)
        sandbox.seed_layer(layout.upper, host_usr=host_usr, owner=guest_root(host))
        return layout
    mnt = layer / "mnt"
    layout = Layout(layer=layer, upper=mnt / "upper", work=mnt / "work")
    mnt.mkdir(parents=True, exist_ok=True)
    # A new layer: formatted ahead by the pool, or by the supervisor from a seed (seed_layers).
    seed = None if (layer / storage.LAYER_IMAGE).exists() else layer / "seed"
    layout.images.append(storage.entry(layer, storage.LAYER_IMAGE, capacity_gib, seed))
    return layout


def seed_layers(host: ProvisionHost, images: list[dict[str, Any]]) -> None:
    """The skeleton a new layer image is formatted with by the supervisor (mkfs -d), for
    each one the pool did not have ready: made fresh here, so no guest ever had a hand in
    it; the layer's files are never touched from here again."""
    for image in images:
        if image["seed"] and not os.path.exists(image["image"]):
            seed = Path(image["seed"])
            shutil.rmtree(seed, ignore_errors=True)
            (seed / "upper").mkdir(parents=True)
            (seed / "work").mkdir()
            sandbox.seed_layer(seed / "upper", host_usr=host.options.base_image is None, owner=guest_root(host))


def guest_plan(
    host: ProvisionHost, instance: Instance, layout: Layout, netns: str = "", gateway: str = ""
) -> sandbox.GuestPlan:
    """What the guest's sandbox is made of, in host paths (sandbox.command builds on it).
    `netns`, `gateway`: the guest's network slot (runtime/process/network/; "": none)."""
    return sandbox.GuestPlan(
        root=layout.upper if host.options.base_image is None else host.instance_dir(instance.id) / "root",
        base=host.options.base_image,
        binds=tuple(layout.volumes),
        run_dir=host.instance_dir(instance.id) / "run",
        bin_dir=host.bin_dir,
        hostname=instance.workspace_id,
        command=host.options.guest_command,
        env={"KIBO_WORKSPACE_ID": instance.workspace_id, "KIBO_INSTANCE_ID": instance.id},
        netns=netns,
        resolv_conf=f"nameserver {gateway}\noptions timeout:2 attempts:2\n" if gateway else "",
    )


def write_spec(host: ProvisionHost, instance: Instance, layout: Layout, plan: sandbox.GuestPlan) -> None:
    """The instance's directory, its cgroups and spec.json: all its supervisor needs to start."""
    directory = host.instance_dir(instance.id)
    if lock_held(directory):
        raise ValueError(f"a supervisor already runs {instance.id}")
    # Earlier generations of this workspace were reported stopped: their leftovers go.
    _remove_generations(host, instance.workspace_id, keep=instance.id)
    (directory / "run").mkdir(parents=True, exist_ok=True)
    if guest_root(host) is not None:
        # The guest's /run/kibo (its agent writes the ready file there).
        os.chown(directory / "run", *host.host_ids.root, follow_symlinks=False)
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
    limits = host.cgroups.create(safe(instance.id), instance.vcpus, instance.memory_mib)
    command = sandbox.command(host.isolation, plan)
    id_map = sandbox.guest_id_map(host.host_ids)
    spec = {
        "instance_id": instance.id,
        "workspace_id": instance.workspace_id,
        "personality": host.backend.value,
        "socket": host.socket_name(instance.id),
        "argv": command.argv,
        "env": command.env,
        "cwd": command.cwd,
        "entry_depth": command.entry_depth,
        "cgroup_dirs": list(limits.dirs),
        "cgroup_procs": list(limits.procs),
        "oom_file": limits.oom_file,
        "rlimits": [list(r) for r in limits.rlimits],
        "run_dir": str(plan.run_dir),
        "isolation": host.isolation,
        "mounts": [[str(path), target] for path, target in layout.volumes],
        # The guest's user namespace: guest ids 0..count-1 are host ids base..base+count-1
        # (gids from host_gid_base; rootless: this user's uid and gid alone, count 1).
        "host_id_base": id_map[0],
        "host_id_count": id_map[1],
        "host_gid_base": id_map[2],
        "rootless": host.rootless,
        "seccomp_filter": str(host.seccomp_filter),
        "bin_dir": str(plan.bin_dir),
        # Staged by the supervisor where the guest's uid reaches them (the guest's trees).
        "stage_dir": str(host.stage_dir),
        "staged": [str(plan.root), str(plan.run_dir)] + [str(path) for path, _ in layout.volumes],
        # The environment of data-plane commands: the guest's (unisolated: with the KIBO_* paths).
        "guest_env": command.env
        if host.isolation == "none"
        else {"PATH": sandbox.GUEST_PATH, "HOME": "/root", "TERM": "dumb", **plan.env},
        "overlay": overlay,
        "storage": layout.images,
        "sync_paths": [str(layout.upper)] + [str(path) for path, _ in layout.volumes],
        "grace_s": host.options.grace_s,
        "force_sync_s": host.options.force_sync_s,
        "ready_timeout_s": host.options.ready_timeout_s,
        "reboot_code": sandbox.EXIT_REBOOT,
        "poweroff_code": sandbox.EXIT_POWEROFF,
        "timings": host.options.timings,
        # The entry is kibo's own agent (no --guest-command): the OOM killer's last choice in its
        # guest, with the sandbox's processes (supervisor_guest.py).
        "oom_protect_entry": not host.options.guest_command,
        # Where the supervisor hands its ready guest ("": it keeps it): supervisor_handover.py.
        "node_supervisor": host.node_supervisor_name(),
        # The guest's network namespace, entered before its user namespace ("": bwrap makes one).
        "netns": plan.netns,
        "resolv_conf": plan.resolv_conf,
    }
    _save_spec(directory, spec)


def renew_cgroups(host: ProvisionHost, instance: Instance, spec: dict[str, Any]) -> None:
    """For a new supervisor of the same instance (a firecracker guest reset): fresh cgroups
    in place of the old ones (which go, with whatever still runs in them), the same spec."""
    Cgroups.remove(tuple(spec.get("cgroup_dirs") or ()))
    limits = host.cgroups.create(safe(instance.id), instance.vcpus, instance.memory_mib)
    spec.update(cgroup_dirs=list(limits.dirs), cgroup_procs=list(limits.procs), oom_file=limits.oom_file)
    spec["node_supervisor"] = host.node_supervisor_name()
    directory = host.instance_dir(instance.id)
    with contextlib.suppress(FileNotFoundError):
        (directory / "exit.json").unlink()
    _save_spec(directory, spec)


def _save_spec(directory: Path, spec: dict[str, Any]) -> None:
    # Whole or not at all: a supervisor (or a restarted control plane) never reads half a spec.
    tmp = directory / "spec.json.tmp"
    tmp.write_text(json.dumps(spec, indent=1))
    os.replace(tmp, directory / "spec.json")


def release_sync(directory: Path) -> bool:
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


def _remove_generations(host: ProvisionHost, workspace_id: str, keep: str = "") -> None:
    """Release and remove the directories of the workspace's instances (its generations,
    <workspace>-g<n>) but `keep` and any a live supervisor holds."""
    for old in (host.data_dir / "instances").glob(f"{safe(workspace_id)}-g*"):
        if old.name != keep and not lock_held(old):
            release_sync(old)
            storage.remove_tree(old, ignore_errors=True)


def delete_storage(host: ProvisionHost, workspace_id: str, volume_ids: tuple[str, ...]) -> None:
    """A deleted workspace's retained layer, its volumes `volume_ids` and what its stopped
    instances left. Blocking."""
    _remove_generations(host, workspace_id)
    # Durably gone, or OSError (an image still mounted): the node agent tries again.
    storage.destroy(host.layer_dir(workspace_id))
    delete_volumes(host, volume_ids)


def delete_volumes(host: ProvisionHost, volume_ids: tuple[str, ...]) -> None:
    """Deleted volumes' data, for good. Blocking."""
    for volume_id in volume_ids:
        storage.destroy(host.volume_dir(volume_id))
