"""The node agent: follows its node's feed of work from the control plane, drives the
runtime, reports back. It sees the control plane only through a `ControlPlaneLink`
(engine/node_link.py), the same code whether the control plane is in this process or on
another host.

One task per instance at a time; when the control plane changes what it wants of an
instance (a new `step`), the task for the old step is cancelled and a new one starts. Each
(instance, step) is started at most once per agent: a feed item seen again (a resumed feed,
a snapshot) starts nothing. Reports wait while the node is unreachable (a silent node
reports nothing) and are retried while the control plane cannot take them. An instance's
reports are sent one after another, in order; the progress of a step is sent without holding
up the runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ..domain.errors import StoreError
from ..domain.model import Desired, Instance, Node, Phase, StopDurability
from ..domain.nodes import DiskStatus, NodeResources
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
from ..runtime.base import DestroyError, LaunchError, NetworkControl, RestartError, Runtime, SyncError
from .node_link import (
    MAX_BATCH_REPORTS,
    ControlPlaneLink,
    Cursor,
    Declaration,
    InstanceWork,
    LinkDown,
    StorageWork,
    VolumeWork,
    Work,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a call to the control plane may meet that passes: retried with backoff.
PASSING = (StoreError, LinkDown)
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 5.0
# A live network policy change that fails is tried this many times more, then left to the
# next launch (engine/node_agent.py _apply_network).
NETWORK_TRIES = 5


@dataclass
class _Task:
    step: int
    task: asyncio.Task[None]


class NodeAgent:
    def __init__(
        self,
        node: Node,
        runtime: Runtime,
        link: ControlPlaneLink,
        labels: dict[str, str] | None = None,
        data_plane: tuple[str, str] = ("", ""),
        resources: NodeResources | None = None,
        disk: Callable[[], DiskStatus] | None = None,
    ) -> None:
        self.node = node
        # What its capacity was made of, declared at each join; and how to read its disk
        # now (blocking, cheap: run in a thread), told with each renewal and each refusal.
        self._resources = resources or NodeResources()
        self._disk = disk
        self.runtime = runtime
        self._link = link
        self._labels = dict(labels or {})
        # (address, secret) where this node serves its guests to the control plane, if it does.
        self._data_plane = data_plane
        self._tasks: dict[str, _Task] = {}
        # The highest step started per instance: a repeated feed item starts nothing.
        self._started: dict[str, int] = {}
        # Per instance, its reports not sent yet and the task sending them, in order.
        self._outbox: dict[str, list[tuple[Report, asyncio.Future[None]]]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}
        self._storage: dict[str, asyncio.Task[None]] = {}
        # Deleted volumes whose files this node's storage pool may hold.
        self._volumes: dict[str, asyncio.Task[None]] = {}
        # Live network policy changes (SetWorkspaceNetworkPolicy while AVAILABLE): per instance
        # the newest revision and policy wanted, and the one task applying them in order.
        self._network_wanted: dict[str, Instance] = {}
        self._network_applied: dict[str, int] = {}
        self._network_tasks: dict[str, asyncio.Task[None]] = {}
        self._adopted = False
        self.lease_seconds = 0.0
        # Set once the first snapshot is taken in (tests and `kibo-ctrl node` wait for it).
        self.ready = asyncio.Event()

    async def run(self) -> None:
        await self._join()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._pump_events())
            group.create_task(self._renew_lease())
            await self._follow()

    async def stop(self) -> None:
        tasks = [t.task for t in self._tasks.values()] + list(self._storage.values()) + list(self._volumes.values())
        tasks += self._senders.values()
        tasks += self._network_tasks.values()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _join(self) -> None:
        address, secret = self._data_plane
        declaration = Declaration(
            self.node,
            self._labels,
            tuple(self.runtime.capabilities()),
            address,
            secret,
            self._resources,
            await self._disk_now() or DiskStatus(),
        )
        joined = await self._retrying(lambda: self._link.join(declaration), "joining")
        self.lease_seconds = joined.lease_seconds

    async def _follow(self) -> None:
        """Take the feed in, batch by batch; after a disconnect, rejoin and resume after the
        last batch taken in (a silent node takes nothing in until it is reachable again)."""
        cursor: Cursor | None = None
        delay = RETRY_FIRST_S
        while True:
            try:
                async for batch in self._link.work(cursor):
                    if not self.runtime.reachable.is_set():
                        break  # this batch is not taken in: resumed from `cursor` below
                    if batch.snapshot and not self._adopted:
                        # After a restart: take over the sandboxes the control plane says this node holds.
                        self.runtime.adopt([i.instance for i in batch.items if isinstance(i, InstanceWork)])
                        self._adopted = True
                    for item in batch.items:
                        self._take(item)
                    cursor = batch.cursor
                    self.ready.set()
                    delay = RETRY_FIRST_S
            except PASSING as error:
                log.warning("node %s: the feed broke (%s); resuming in %.1f s", self.node.id, error, delay)
            else:
                if not self.runtime.reachable.is_set():
                    await self.runtime.reachable.wait()
                    continue
                log.info("node %s: the control plane ended the feed; resuming in %.1f s", self.node.id, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            await self._join()

    def _take(self, item: Work) -> None:
        if isinstance(item, InstanceWork):
            self._consider(item.instance)
        elif isinstance(item, StorageWork):
            self._consider_storage(item)
        else:
            self._consider_volume(item)

    def _consider(self, instance: Instance) -> None:
        self._consider_network(instance)
        if instance.step == instance.done_step or instance.step <= self._started.get(instance.id, 0):
            return
        current = self._tasks.get(instance.id)
        if current is not None:
            current.task.cancel()
        self._started[instance.id] = instance.step
        task = asyncio.create_task(self._act(instance), name=f"node-agent {instance.id} step {instance.step}")
        self._tasks[instance.id] = _Task(instance.step, task)

    def _consider_network(self, instance: Instance) -> None:
        """A newer live network policy for a running instance: applied by the runtime without a
        restart (after a restart of this process, the feed's snapshot applies the newest again:
        applying is idempotent)."""
        if instance.desired is not Desired.RUNNING:
            # Stopping or gone: its next launch applies the workspace's policy as it is then.
            self._network_wanted.pop(instance.id, None)
            task = self._network_tasks.pop(instance.id, None)
            if task is not None:
                task.cancel()
            return
        if instance.network_policy is None or instance.network_revision <= self._network_applied.get(instance.id, 0):
            return
        if not isinstance(self.runtime, NetworkControl):
            return
        self._network_wanted[instance.id] = instance
        if instance.id not in self._network_tasks:
            task = asyncio.create_task(self._apply_network(instance.id), name=f"node-agent {instance.id} network")
            self._network_tasks[instance.id] = task

    async def _apply_network(self, instance_id: str) -> None:
        runtime = self.runtime
        assert isinstance(runtime, NetworkControl)
        delay, tries = 0.2, 0
        try:
            while (wanted := self._network_wanted.get(instance_id)) is not None:
                if wanted.network_revision <= self._network_applied.get(instance_id, 0):
                    del self._network_wanted[instance_id]
                    continue
                assert wanted.network_policy is not None
                try:
                    await runtime.set_network_policy(instance_id, wanted.network_policy)
                except Exception as error:  # the runtime's failure: logged, tried a few times more
                    tries += 1
                    if tries > NETWORK_TRIES:
                        # E.g. its guest is gone (a VMM exit): a start applies the policy anew.
                        log.warning(
                            "node %s: network policy revision %d of %s not applied after %d tries (%s)",
                            self.node.id,
                            wanted.network_revision,
                            instance_id,
                            tries,
                            error,
                        )
                        self._network_wanted.pop(instance_id, None)
                        return
                    log.warning(
                        "node %s: applying network policy revision %d to %s failed (%s): retrying in %.1f s",
                        self.node.id,
                        wanted.network_revision,
                        instance_id,
                        error,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                tries = 0
                self._network_applied[instance_id] = max(
                    self._network_applied.get(instance_id, 0), wanted.network_revision
                )
        finally:
            self._network_tasks.pop(instance_id, None)

    async def _act(self, instance: Instance) -> None:
        step = instance.step
        try:
            report = await self._drive(instance)
            await self._send(report)
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

            async def progress(phase: Phase, volumes: tuple[str, ...]) -> None:
                # Not waited for: the launch goes on while the control plane records the phase
                # (a round trip and a commit each, on the path of every create).
                self._send(Progress(instance.id, step, phase=phase, volumes_created=volumes))

            # The phases before the runtime's own (LAUNCHING...): visible while it provisions.
            # Announced first, so that its commit and the spec's read go side by side.
            await progress(Phase.PROVISIONING, ())
            spec = await self._retrying(lambda: self._link.launch_spec(instance.id, step), "reading a launch spec")
            try:
                volumes = await self.runtime.launch(spec, progress)
            except LaunchError as error:
                if error.no_room:
                    # The disk as it is now reaches the scheduler before the instance does
                    # (it is placed again: not where it was just refused).
                    disk = await self._disk_now()
                    await self._retrying(lambda: self._link.renew(disk), "telling its disk")
                return LaunchFailed(
                    instance.id, step, str(error), error.holds, error.volumes_created, no_room=error.no_room
                )
            return Launched(instance.id, step, volumes)
        if instance.desired in (Desired.STOPPED, Desired.FORCE_STOPPED):
            force = instance.desired is Desired.FORCE_STOPPED
            self._send(Progress(instance.id, step, phase=Phase.STOPPING))
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

    def _consider_storage(self, work: StorageWork) -> None:
        if work.workspace_id in self._storage:
            return
        self._storage[work.workspace_id] = asyncio.create_task(self._release_storage(work))

    async def _release_storage(self, work: StorageWork) -> None:
        """Delete a deleted workspace's retained files, then record it; retried until it works
        (the control plane keeps the storage pending, so a restart in between resumes it)."""
        delay = 0.5
        try:
            while True:
                try:
                    await self.runtime.delete_storage(work.workspace_id, work.volume_ids)
                    await self.runtime.reachable.wait()
                    await self._link.storage_released(StorageReleased(work.workspace_id, volume_ids=work.volume_ids))
                    return
                except (OSError, *PASSING) as error:
                    # E.g. an image still mounted while its namespace goes, or a full disk that
                    # cannot record the release: try again (nothing else would, until a restart).
                    log.warning(
                        "node %s: releasing storage of %s failed (%s): retrying", self.node.id, work.workspace_id, error
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %s: releasing storage of %s failed", self.node.id, work.workspace_id)
        finally:
            self._storage.pop(work.workspace_id, None)

    def _consider_volume(self, work: VolumeWork) -> None:
        if work.volume_id in self._volumes:
            return
        self._volumes[work.volume_id] = asyncio.create_task(self._release_volume(work.volume_id))

    async def _release_volume(self, volume_id: str) -> None:
        """Destroy a deleted volume's files, then record it; retried until it works."""
        delay = 0.5
        try:
            while True:
                try:
                    await self.runtime.delete_volumes((volume_id,))
                    await self.runtime.reachable.wait()
                    await self._link.volume_released(volume_id)
                    log.info("node %s: deleted volume %s: its files are destroyed", self.node.id, volume_id)
                    return
                except (OSError, *PASSING) as error:
                    log.warning("node %s: destroying volume %s failed (%s): retrying", self.node.id, volume_id, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        finally:
            self._volumes.pop(volume_id, None)

    def _send(self, report: Report) -> asyncio.Future[None]:
        """Queue a report of an instance; resolved once the control plane took it. An
        instance's reports go in order, and those queued while one is under way go together
        (a launch's last progress and its answer: one round trip, one transaction). Progress
        carries its step, so one that arrives after the control plane moved on is dropped."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.setdefault(report.instance_id, []).append((report, sent))
        if report.instance_id not in self._senders:
            task = asyncio.create_task(self._send_queued(report.instance_id))
            self._senders[report.instance_id] = task
        return sent

    async def _send_queued(self, instance_id: str) -> None:
        queued: list[tuple[Report, asyncio.Future[None]]] = []
        try:
            while queued := self._outbox.pop(instance_id, []):
                if len(queued) > MAX_BATCH_REPORTS:
                    self._outbox[instance_id] = queued[MAX_BATCH_REPORTS:]
                    queued = queued[:MAX_BATCH_REPORTS]
                await self._report_all([report for report, _ in queued])
                for _, sent in queued:
                    if not sent.done():
                        sent.set_result(None)
        finally:
            del self._senders[instance_id]
            for _, sent in queued + self._outbox.pop(instance_id, []):
                sent.cancel()

    async def _report_all(self, reports: list[Report]) -> None:
        """Send reports in order: together, or one by one if the batch was refused (it then
        changed nothing) or is just one. A report refused alone is logged and dropped."""
        if len(reports) > 1:
            try:
                await self._retrying(lambda: self._link.report_batch(reports), f"reporting {len(reports)} reports")
                return
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning(
                    "node %s: a batch of reports was refused (%s); sending them one by one", self.node.id, error
                )
        for report in reports:
            try:
                await self._report(report)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("node %s: sending %s failed", self.node.id, report)

    async def _report(self, report: Report) -> None:
        """Send a report; while the control plane cannot take it (down, disk full), keep
        trying: a report is an observation of something that happened, and applying it
        twice is harmless. A silent node's reports arrive when it is back."""
        await self._retrying(lambda: self._link.report(report), f"reporting {report}")

    async def _retrying(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        delay = RETRY_FIRST_S
        while True:
            await self.runtime.reachable.wait()
            try:
                return await call()
            except PASSING as error:
                log.warning("node %s: %s failed (%s); retrying in %.1f s", self.node.id, what, error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _disk_now(self) -> DiskStatus | None:
        """The node's disk now (None: this node has none to tell); a failed read tells nothing."""
        if self._disk is None:
            return None
        try:
            return await asyncio.to_thread(self._disk)
        except OSError as error:
            log.warning("node %s: reading its disk failed: %s", self.node.id, error)
            return None

    async def _pump_events(self) -> None:
        while True:
            report = await self.runtime.events.get()
            try:
                await self._report(report)
            except Exception:
                log.exception("node %s: report %r failed", self.node.id, report)

    async def _renew_lease(self) -> None:
        """Renew the lease every quarter of it, while the node is reachable (a silent node
        lets it run out: the control plane then shows its workspaces UNKNOWN)."""
        while True:
            await asyncio.sleep(self.lease_seconds / 4)
            if not self.runtime.reachable.is_set():
                continue
            try:
                await self._link.renew(await self._disk_now())
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the next renewal tries again; the feed loop rejoins
                log.warning("node %s: renewing its lease failed (%s)", self.node.id, error)
