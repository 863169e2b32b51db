"""Which parts of a workspace are on this machine, read from the OS (the cleanup status).

The process runtime's `MachineObserver` (runtime/base.py): a workspace's cleanup status
(GetWorkspaceCleanup) takes what the machine shows over what the store remembers. It only
reads (layer and volume directories, loop devices, state.json, /proc, cgroup directories,
guest network namespaces and veths),
so it stands apart from runtime.py, whose operations change the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ...domain.model import Component
from . import storage
from .cgroups import Cgroups
from .network import GuestNetworks
from .supervisor_handle import lock_held, parent_pid, read_json, running


class ObservedHost(Protocol):
    """What observing needs of the runtime (ProcessRuntime): its paths and its cgroups."""

    cgroups: Cgroups
    networks: GuestNetworks | None

    def instance_dir(self, instance_id: str) -> Path: ...

    def layer_dir(self, workspace_id: str) -> Path: ...

    def volume_dir(self, volume_id: str) -> Path: ...


def observe(
    host: ObservedHost, instance_id: str | None, workspace_id: str, volume_ids: tuple[str, ...] = ()
) -> dict[Component, bool] | None:
    """See ProcessRuntime.observe."""
    try:
        layer = host.layer_dir(workspace_id)
        # An image whose loop device is still attached holds its blocks even once unlinked.
        layer_mounted = bool(storage.attached(storage.images_in(layer)))
        seen: dict[Component, bool] = {Component.RETAINED_LAYER: layer.is_dir() or layer_mounted}
        if volume_ids:
            volumes = [host.volume_dir(v) for v in volume_ids]
            images = [image for v in volumes for image in storage.images_in(v)]
            seen[Component.VOLUME_DELETION] = any(v.is_dir() for v in volumes) or bool(storage.attached(images))
        if instance_id is None:
            return seen
        state = read_json(host.instance_dir(instance_id) / "state.json") or {}
    except ValueError:
        return None  # not an ID of this runtime
    supervisor = int(state.get("supervisor_pid") or 0)
    alive = running(supervisor, state.get("supervisor_start"))
    if alive and state.get("parked"):
        # The node supervisor outlives the instance: it holds it while it holds its lock.
        alive = lock_held(host.instance_dir(instance_id))
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
    if host.networks is not None:
        # The guest's slot (namespace, veth) outlives its processes until it is released.
        seen[Component.NETWORK] = guest_alive or host.networks.present(instance_id)
    if host.cgroups.parents:
        seen[Component.RESERVATION] = any((parent / instance_id).is_dir() for parent in host.cgroups.parents)
    return seen
