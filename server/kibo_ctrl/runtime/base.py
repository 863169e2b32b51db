"""The interface between a node agent and whatever really runs instances."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ..domain.model import (
    Backend,
    Binding,
    Component,
    Instance,
    NetworkPolicy,
    Phase,
    Resources,
    StopDurability,
    Volume,
)
from ..domain.reports import Report


@dataclass(frozen=True)
class LaunchSpec:
    instance: Instance
    resources: Resources
    bindings: tuple[Binding, ...]
    volumes: tuple[Volume, ...]
    network_policy: NetworkPolicy


class LaunchError(Exception):
    """The launch failed; `holds` are the parts the node could not release."""

    def __init__(self, message: str, holds: tuple[Component, ...] = (), volumes_created: tuple[str, ...] = ()):
        super().__init__(message)
        self.holds = holds
        self.volumes_created = volumes_created


class SyncError(Exception):
    """A graceful stop could not confirm the guest's writes are on disk."""


class RestartError(Exception):
    """A new VMM for a reset guest did not start; the instance still holds its parts."""


class DestroyError(Exception):
    """Releasing the instance failed; it still holds its parts."""


class Runtime(Protocol):
    backend: Backend
    # Reports the runtime makes on its own (guest reset, VMM exit, guest silent).
    events: asyncio.Queue[Report]
    # Cleared while the node cannot report (node silent).
    reachable: asyncio.Event

    def capabilities(self) -> list[str]: ...

    def adopt(self, instances: list[Instance]) -> None:
        """After a restart: take over the instances the store says this node holds."""

    async def launch(
        self, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
    ) -> tuple[str, ...]:
        """Provision, launch and wait until the guest answers; returns volumes it created."""

    async def restart(self, instance: Instance) -> None:
        """A new VMM for the same instance (firecracker guest reset)."""

    async def stop(self, instance: Instance, force: bool) -> StopDurability: ...

    async def destroy(self, instance: Instance) -> None: ...

    async def delete_storage(self, workspace_id: str, volume_ids: tuple[str, ...]) -> None:
        """Delete a deleted workspace's retained layer and the volumes that go with it."""

    async def delete_volumes(self, volume_ids: tuple[str, ...]) -> None:
        """Destroy deleted volumes' data for good (idempotent: a volume with no files here is done)."""
