"""The node link inside one process: a node agent on the control plane's own event loop
(the embedded default node, and the simulator's nodes) calls the registry directly. The
node's identity is fixed when the link is made, as a node token fixes it over gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from ..domain.nodes import DiskStatus
from ..domain.reports import Report, StorageReleased
from ..runtime.base import LaunchSpec
from .node_link import Batch, Cursor, Declaration, Joined
from .node_registry import NodeRegistry


class LocalLink:
    def __init__(self, registry: NodeRegistry, node_id: str) -> None:
        self._registry = registry
        self.node_id = node_id

    async def join(self, declaration: Declaration) -> Joined:
        if declaration.node.id != self.node_id:
            raise ValueError(f"this link is node {self.node_id}'s, not {declaration.node.id}'s")
        return await self._registry.join(declaration)

    def work(self, cursor: Cursor | None) -> AsyncIterator[Batch]:
        return self._registry.feed(self.node_id, cursor)

    async def launch_spec(self, instance_id: str, step: int) -> LaunchSpec:
        return await self._registry.launch_spec(self.node_id, instance_id, step)

    async def report(self, report: Report) -> None:
        await self._registry.report(self.node_id, report)

    async def report_batch(self, reports: Sequence[Report]) -> None:
        await self._registry.report_batch(self.node_id, reports)

    async def storage_released(self, report: StorageReleased) -> None:
        await self._registry.storage_released(self.node_id, report)

    async def volume_released(self, volume_id: str) -> None:
        await self._registry.volume_released(self.node_id, volume_id)

    async def renew(self, disk: DiskStatus | None = None) -> None:
        await self._registry.renew(self.node_id, disk)
