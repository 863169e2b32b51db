"""The node agent: sees work for its node in the store, drives the runtime, reports back.

One task per instance at a time; when the control plane changes what it wants of an
instance (a new `step`), the task for the old step is cancelled and a new one starts.
Reports wait while the node is unreachable (a silent node reports nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from ..domain.clock import SYSTEM_CLOCK, Clock
from ..domain.errors import StoreError
from ..domain.model import Desired, Instance, Node, Phase, StopDurability, Volume, Workspace
from ..domain.reports import (
    Destroyed,
    DestroyFailed,
    Launched,
    LaunchFailed,
    Progress,
    Report,
    Restarted,
    RestartFailed,
    StopFailed,
    Stopped,
    StorageReleased,
)
from ..runtime.base import DestroyError, LaunchError, LaunchSpec, RestartError, Runtime, SyncError
from ..store.base import Changes, Reader, Store
from . import controller
from .hub import Wakeup

log = logging.getLogger(__name__)


@dataclass
class _Task:
    step: int
    task: asyncio.Task[None]


class NodeAgent:
    def __init__(self, node: Node, runtime: Runtime, store: Store, liveness: Liveness) -> None:
        self.node = node
        self.runtime = runtime
        self._store = store
        self._liveness = liveness
        self._wakeup = Wakeup()
        self._tasks: dict[str, _Task] = {}
        self._storage: dict[str, asyncio.Task[None]] = {}
        self._pending: dict[str, Instance] = {}
        self._storage_pending: set[str] = set()
        # Deleted volumes whose files this node's storage pool may hold.
        self._volumes: dict[str, asyncio.Task[None]] = {}
        self._volumes_pending: set[str] = set()

    def on_changes(self, changes: Changes) -> None:
        woke = False
        for instance in changes.instances.values():
            if instance.node_id == self.node.id:
                self._pending[instance.id] = instance
                woke = True
        for workspace in changes.workspaces.values():
            if workspace.storage_pool == self.node.storage_pool and (
                workspace.storage.layer or workspace.storage.volume_ids
            ):
                self._storage_pending.add(workspace.id)
                woke = True
        for volume in changes.volumes.values():
            if volume.storage_pending and volume.storage_pool == self.node.storage_pool:
                self._volumes_pending.add(volume.id)
                woke = True
        if woke:
            self._wakeup.set()

    async def run(self) -> None:
        instances = await self._store.read(lambda r: r.node_instances(self.node.id))
        self.runtime.adopt(instances)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._pump_events())
            group.create_task(self._heartbeat())
            await self._resync()
            while True:
                await self._wakeup.wait()
                if not self.runtime.reachable.is_set():
                    await self.runtime.reachable.wait()
                    await self._resync()
                    continue
                pending, self._pending = self._pending, {}
                for instance in pending.values():
                    self._consider(instance)
                storage, self._storage_pending = self._storage_pending, set()
                for workspace_id in storage:
                    self._consider_storage(workspace_id)
                volumes, self._volumes_pending = self._volumes_pending, set()
                for volume_id in volumes:
                    self._consider_volume(volume_id)

    async def stop(self) -> None:
        tasks = [t.task for t in self._tasks.values()] + list(self._storage.values()) + list(self._volumes.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _resync(self) -> None:
        """Re-read everything this node owes work for (at start, and when reachable again)."""

        def load(reader: Reader) -> tuple[list[Instance], list[Workspace], list[Volume]]:
            return reader.node_instances(self.node.id), reader.storage_pending(), reader.volumes_storage_pending()

        instances, storage, volumes = await self._store.read(load)
        for instance in instances:
            self._consider(instance)
        for workspace in storage:
            if workspace.storage_pool == self.node.storage_pool:
                self._consider_storage(workspace.id)
        for volume in volumes:
            if volume.storage_pool == self.node.storage_pool:
                self._consider_volume(volume.id)

    def _consider(self, instance: Instance) -> None:
        if instance.step == instance.done_step:
            return
        current = self._tasks.get(instance.id)
        if current is not None and current.step >= instance.step:
            return
        if current is not None:
            current.task.cancel()
        task = asyncio.create_task(self._act(instance), name=f"node-agent {instance.id} step {instance.step}")
        self._tasks[instance.id] = _Task(instance.step, task)

    async def _act(self, instance: Instance) -> None:
        step = instance.step
        try:
            report = await self._drive(instance)
            await self._report(report)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %s: acting on %s step %d failed", self.node.id, instance.id, step)
        finally:
            current = self._tasks.get(instance.id)
            if current is not None and current.step == step:
                del self._tasks[instance.id]

    async def _drive(self, instance: Instance) -> Report:
        step = instance.step
        if instance.desired is Desired.RUNNING and instance.phase is Phase.RESTARTING:
            try:
                await self.runtime.restart(instance)
            except RestartError as error:
                return RestartFailed(instance.id, step, str(error))
            return Restarted(instance.id, step)
        if instance.desired is Desired.RUNNING:
            spec = await self._store.read(lambda r: _launch_spec(r, instance))

            async def progress(phase: Phase, volumes: tuple[str, ...]) -> None:
                await self._report(Progress(instance.id, None, phase=phase, volumes_created=volumes))

            # The phases before the runtime's own (LAUNCHING...): visible while it provisions.
            await progress(Phase.PROVISIONING, ())
            try:
                volumes = await self.runtime.launch(spec, progress)
            except LaunchError as error:
                return LaunchFailed(instance.id, step, str(error), error.holds, error.volumes_created)
            return Launched(instance.id, step, volumes)
        if instance.desired in (Desired.STOPPED, Desired.FORCE_STOPPED):
            force = instance.desired is Desired.FORCE_STOPPED
            await self._report(Progress(instance.id, None, phase=Phase.STOPPING))
            try:
                durability = await self.runtime.stop(instance, force=force)
            except SyncError as error:
                return StopFailed(instance.id, step, str(error))
            return Stopped(instance.id, step, StopDurability.UNCONFIRMED if force else durability)
        try:
            await self.runtime.destroy(instance)
        except DestroyError as error:
            return DestroyFailed(instance.id, step, str(error))
        return Destroyed(instance.id, step)

    def _consider_storage(self, workspace_id: str) -> None:
        if workspace_id in self._storage:
            return
        task = asyncio.create_task(self._release_storage(workspace_id))
        self._storage[workspace_id] = task

    async def _release_storage(self, workspace_id: str) -> None:
        delay = 0.5
        try:
            while True:
                workspace = await self._store.read(lambda r: r.get_workspace(workspace_id))
                if workspace is None or not (workspace.storage.layer or workspace.storage.volume_ids):
                    return
                try:
                    await self.runtime.delete_storage(workspace_id, tuple(workspace.storage.volume_ids))
                    await self.runtime.reachable.wait()
                    report = StorageReleased(workspace_id, volume_ids=tuple(workspace.storage.volume_ids))
                    await self._store.transact(controller.apply_storage, report)
                    return
                except (OSError, StoreError) as error:
                    # E.g. an image still mounted while its namespace goes, or a full disk that
                    # cannot record the release: try again (nothing else would, until a restart).
                    log.warning(
                        "node %s: releasing storage of %s failed (%s): retrying", self.node.id, workspace_id, error
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %s: releasing storage of %s failed", self.node.id, workspace_id)
        finally:
            self._storage.pop(workspace_id, None)

    def _consider_volume(self, volume_id: str) -> None:
        if volume_id in self._volumes:
            return
        self._volumes[volume_id] = asyncio.create_task(self._release_volume(volume_id))

    async def _release_volume(self, volume_id: str) -> None:
        """Destroy a deleted volume's files, then record it; retried until it works (the store
        keeps the volume pending, so a restart in between resumes it)."""
        delay = 0.5
        try:
            while True:
                volume = await self._store.read(lambda r: r.get_volume(volume_id))
                if volume is None or not volume.storage_pending:
                    return
                try:
                    await self.runtime.delete_volumes((volume_id,))
                    await self.runtime.reachable.wait()
                    await self._store.transact(controller.apply_volume_released, volume_id)
                    log.info("node %s: deleted volume %s: its files are destroyed", self.node.id, volume_id)
                    return
                except (OSError, StoreError) as error:
                    log.warning("node %s: destroying volume %s failed (%s): retrying", self.node.id, volume_id, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        finally:
            self._volumes.pop(volume_id, None)

    async def _report(self, report: Report) -> None:
        """Store a report; while the store cannot write (disk full), keep trying: a report is
        an observation of something that happened, and applying it twice is harmless."""
        delay = 0.05
        while True:
            # A silent node's reports arrive when it is back.
            await self.runtime.reachable.wait()
            try:
                await self._store.transact(controller.apply, report)
                return
            except StoreError as error:
                log.warning("node %s: storing %s failed (%s); retrying in %.1f s", self.node.id, report, error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _pump_events(self) -> None:
        while True:
            report = await self.runtime.events.get()
            try:
                await self._report(report)
            except Exception:
                log.exception("node %s: report %r failed", self.node.id, report)

    async def _heartbeat(self) -> None:
        while True:
            if self.runtime.reachable.is_set():
                self._liveness.beat(self.node.id)
            await asyncio.sleep(self._liveness.interval)


def _launch_spec(reader: Reader, instance: Instance) -> LaunchSpec:
    workspace = reader.get_workspace(instance.workspace_id)
    assert workspace is not None
    volumes = tuple(v for b in workspace.bindings if (v := reader.get_volume(b.volume_id)) is not None)
    return LaunchSpec(
        instance=instance,
        resources=workspace.resources,
        bindings=tuple(workspace.bindings),
        volumes=volumes,
        network_policy=workspace.network_policy,
    )


class Liveness:
    """Tells whether each node reports. In memory: liveness is about this process's view."""

    def __init__(self, store: Store, node_ids: list[str], timeout: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._clock = clock
        self.timeout = timeout
        self.interval = timeout / 4
        self._last: dict[str, float] = {}
        # None: not yet decided since start (the first beat clears stale silence).
        self._silent: dict[str, bool | None] = dict.fromkeys(node_ids)
        self._writes: set[asyncio.Task[None]] = set()

    def report_age(self, node_id: str) -> float | None:
        """Seconds since the node last reported (its lease's age); None before its first report."""
        last = self._last.get(node_id)
        return None if last is None else self._clock.monotonic() - last

    def beat(self, node_id: str) -> None:
        self._last[node_id] = self._clock.monotonic()
        if self._silent.get(node_id) is not False:
            self._mark(node_id, silent=False)

    def _mark(self, node_id: str, silent: bool) -> None:
        self._silent[node_id] = silent
        task = asyncio.get_running_loop().create_task(self._write(node_id, silent))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, node_id: str, silent: bool) -> None:
        try:
            await self._store.transact(controller.set_node_silent, node_id, silent)
        except Exception:
            log.exception("recording node %s silent=%s failed; retrying at the next beat", node_id, silent)
            self._silent[node_id] = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = self._clock.monotonic()
            for node_id, silent in list(self._silent.items()):
                last = self._last.get(node_id)
                if silent is False and last is not None and now - last > self.timeout:
                    log.warning("node %s stopped reporting", node_id)
                    self._mark(node_id, silent=True)
