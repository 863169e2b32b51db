"""Finding the supervisors again after a control-plane restart: re-attach, report, or kill.

A supervisor runs in its own session and outlives the control plane that started it
(runtime.py), so a restarted control plane finds supervisors it has no handle on: known
by their instance directory's lock, which only a live supervisor holds. Apart from
runtime.py because these are the rules for what a restart left behind, read together.

Restart safety: `adopt` takes the instances the store says this node has. A live
supervisor (its flock held) is re-attached and keeps running (same generation); a dead
one whose instance was running is reported as runtime.py says (from its exit.json, or
CRASH); an instance whose step is still in flight is left to the node agent, whose
re-driven launch/restart attaches (`attach`) to a live supervisor instead of starting a
second one; a live supervisor of an instance the store no longer has active is an orphan
and is killed. (Run the control plane so that stopping it does not kill its process group
or cgroup, e.g. systemd KillMode=process, or the supervisors go with it and are reported
CRASH.)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from ...domain.model import Component, Instance, Phase
from ...domain.reports import ExitReason, VmmExited
from . import storage
from .provision import release_sync
from .supervisor_handle import Supervised, SupervisorHost, exit_report, kill_supervisor, lock_held, read_json

log = logging.getLogger(__name__)

NO_SANDBOX = (
    "no sandbox of this instance is on this node: its directory is missing (it ran on another "
    "runtime with this data dir, or the directory was removed)"
)


class AdoptionHost(SupervisorHost, Protocol):
    """What adoption needs of the runtime (ProcessRuntime): a supervisor handle's host, and
    where the instance directories are."""

    data_dir: Path


def adopt(host: AdoptionHost, supervised: dict[str, Supervised], instances: list[Instance]) -> None:
    """After a restart: take over `instances` (the store's, for this node) into `supervised`,
    report those whose supervisor died meanwhile, and clear away every other instance."""
    active = {i.id: i for i in instances}
    root = host.data_dir / "instances"
    for directory in sorted(root.iterdir()):
        if directory.name in active:
            continue
        # Nothing in the store needs this instance: an orphan, or leftovers of a released one.
        if lock_held(directory):
            log.warning("killing orphan supervisor of %s (the store has no active instance)", directory.name)
            kill_supervisor(directory)
        release_sync(directory)
        storage.remove_tree(directory, ignore_errors=True)
    for instance in instances:
        directory = host.instance_dir(instance.id)
        if lock_held(directory):
            log.info("re-attaching to the running supervisor of %s", instance.id)
            supervised[instance.id] = Supervised(host, instance.id, None)
            continue
        if instance.step != instance.done_step:
            continue  # the node agent re-drives this step (launch/restart attach or start anew)
        if instance.phase is Phase.RUNNING and Component.INSTANCE in instance.holds:
            if not directory.is_dir():
                # Never a sandbox here: made by another runtime on this data dir (kibo-ctrl serve
                # refuses that without --allow-runtime-change), or its directory was removed.
                log.warning("instance %s: no sandbox of it on this node", instance.id)
                host.events.put_nowait(VmmExited(instance.id, reason=ExitReason.CRASH, detail=NO_SANDBOX))
                continue
            info = read_json(directory / "exit.json")
            report = exit_report(instance.id, host.backend, info)
            log.warning("instance %s: its supervisor is gone (%s)", instance.id, info or "killed")
            host.events.put_nowait(report or VmmExited(instance.id, reason=ExitReason.CRASH))


def attach(host: AdoptionHost, supervised: dict[str, Supervised], instance_id: str) -> Supervised | None:
    """The handle on the live supervisor of `instance_id`: the one in `supervised`, or one
    started before a control-plane restart (re-attached now); None if none runs."""
    current = supervised.get(instance_id)
    if current is not None and not current.closed:
        return current
    if lock_held(host.instance_dir(instance_id)):
        current = Supervised(host, instance_id, None)
        supervised[instance_id] = current
        return current
    return None
