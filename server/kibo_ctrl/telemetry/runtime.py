"""A `Runtime` that times and counts each operation of the runtime it wraps, and logs each
failure with the workspace, instance and node it concerns. app.py wraps every runtime it
hands to a node agent, so the engine stays free of metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from ..domain.model import Instance, NetworkPolicy, Phase, StopDurability
from ..runtime.base import (
    DestroyError,
    GuestLimitCounters,
    LaunchError,
    LaunchSpec,
    NetworkControl,
    RestartError,
    Runtime,
    SyncError,
)
from .metrics import Metrics
from .tracing import TraceParentOf, Tracing

log = logging.getLogger("kibo.runtime")

# The failure reasons: the runtime's error kinds (runtime/base.py), a bounded label set.
REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (LaunchError, "launch_error"),
    (SyncError, "sync_error"),
    (RestartError, "restart_error"),
    (DestroyError, "destroy_error"),
    (TimeoutError, "timeout"),
    (OSError, "os_error"),
)


def reason_of(error: BaseException) -> str:
    for kind, reason in REASONS:
        if isinstance(error, kind):
            return reason
    return "other"


class MeteredRuntime:
    def __init__(
        self,
        inner: Runtime,
        node_id: str,
        metrics: Metrics,
        tracing: Tracing | None = None,
        trace_parent_of: TraceParentOf | None = None,
    ) -> None:
        self.inner = inner
        self.node_id = node_id
        self._metrics = metrics
        # With tracing: each operation is a span in the trace of the command it acts for.
        self._tracing = tracing
        self._trace_parent_of = trace_parent_of
        # The same objects as the inner runtime's: the node agent reads and waits on them.
        self.backend = inner.backend
        self.events = inner.events
        self.reachable = inner.reachable
        if isinstance(inner, GuestLimitCounters):  # the process runtime: its guests' PID limits
            metrics.guest_limit_hits.watch(node_id, inner.pids_limit_hits)
            metrics.guest_storage_clamped.watch(node_id, inner.storage_clamped)

    def capabilities(self) -> list[str]:
        return self.inner.capabilities()

    def adopt(self, instances: list[Instance]) -> None:
        self.inner.adopt(instances)

    async def set_network_policy(self, instance_id: str, policy: NetworkPolicy) -> None:
        """runtime/base.py `NetworkControl`, passed to the inner runtime when it has it (one
        without it has no guest network to change: nothing to do)."""
        if isinstance(self.inner, NetworkControl):
            await self.inner.set_network_policy(instance_id, policy)

    @asynccontextmanager
    async def _timed(self, operation: str, workspace_id: str, instance_id: str = "") -> AsyncIterator[None]:
        if self._tracing is None or self._trace_parent_of is None or not workspace_id:
            async with self._measured(operation, workspace_id, instance_id):
                yield
            return
        parent = await self._trace_parent_of(workspace_id)
        with self._tracing.runtime_step(operation, self.node_id, workspace_id, parent):
            async with self._measured(operation, workspace_id, instance_id):
                yield

    @asynccontextmanager
    async def _measured(self, operation: str, workspace_id: str, instance_id: str) -> AsyncIterator[None]:
        start = time.perf_counter()
        try:
            yield
        except Exception as error:
            reason = reason_of(error)
            self._metrics.runtime_failures.labels(self.node_id, operation, reason).inc()
            log.warning(
                "runtime %s failed (%s): %s",
                operation,
                reason,
                error,
                extra={"workspace_id": workspace_id, "instance_id": instance_id, "node_id": self.node_id},
            )
            raise
        finally:
            self._metrics.runtime_duration.labels(self.node_id, operation).observe(time.perf_counter() - start)

    async def launch(
        self, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
    ) -> tuple[str, ...]:
        instance = spec.instance
        async with self._timed("launch", instance.workspace_id, instance.id):
            return await self.inner.launch(spec, progress)

    async def restart(self, instance: Instance) -> None:
        async with self._timed("restart", instance.workspace_id, instance.id):
            await self.inner.restart(instance)

    async def stop(self, instance: Instance, force: bool) -> StopDurability:
        async with self._timed("force_stop" if force else "stop", instance.workspace_id, instance.id):
            durability = await self.inner.stop(instance, force)
        # A failed sync raises SyncError (counted above); a force stop ends unconfirmed.
        self._metrics.runtime_stops.labels(self.node_id, durability.name.lower()).inc()
        return durability

    async def destroy(self, instance: Instance) -> None:
        async with self._timed("destroy", instance.workspace_id, instance.id):
            await self.inner.destroy(instance)

    async def delete_storage(self, workspace_id: str, volume_ids: tuple[str, ...]) -> None:
        async with self._timed("delete_storage", workspace_id):
            await self.inner.delete_storage(workspace_id, volume_ids)

    async def delete_volumes(self, volume_ids: tuple[str, ...]) -> None:
        async with self._timed("delete_volumes", ""):
            await self.inner.delete_volumes(volume_ids)
