"""The interface between the engine and whatever really runs instances.

`Runtime` is what every runtime does (the node agent drives it). What only some runtimes
can do is a capability protocol of its own, so a caller asks for exactly what it needs and
app.py, which builds the runtimes, hands each capability to whoever uses it:

- `GuestAccess`: commands and files inside a running guest (the data plane);
- `GuestPorts`: TCP connections to ports inside a running guest (exposures);
- `MachineObserver`: which parts of a workspace are on this machine (cleanup status);
- `Closable`: connections to drop at shutdown;
- `GuestLimitCounters`: how often guests ran into their limits (read by the metrics).

The simulator has none of them; the process runtime has them all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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
    """The launch failed; `holds` are the parts the node could not release; `no_room`: the
    node had no room for it after all (the resource: "disk"), and holds nothing of it."""

    def __init__(
        self,
        message: str,
        holds: tuple[Component, ...] = (),
        volumes_created: tuple[str, ...] = (),
        no_room: str = "",
    ):
        super().__init__(message)
        self.holds = holds
        self.volumes_created = volumes_created
        self.no_room = no_room


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


# -- capabilities some runtimes have ---------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """A chunk of a guest job's output."""

    stream: str  # "stdout" or "stderr"
    data: bytes


@dataclass(frozen=True)
class Exit:
    """How a guest job ended: the command's exit code (128 + N: killed by signal N; 124: timed out)."""

    code: int


class GuestRefused(Exception):
    """A guest job could not run or failed: `status` is unavailable, invalid, not-found,
    os-error (with the errno's name in `errno`) or error."""

    def __init__(self, status: str, message: str, errno: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.errno = errno


class JobStopped(Exception):
    """The job's `stop` event was set: its command was killed and its output dropped."""


class GuestAccess(Protocol):
    """Commands and files inside a running guest: the data plane's hands."""

    def guest_ready(self, instance_id: str) -> bool:
        """Whether the instance's guest runs and has answered (not restarting, not halted)."""
        ...

    def check_file_path(self, path: str, mounts: list[str]) -> None:
        """Refuse (ValueError, saying why) a file path the guest's hands would refuse, before
        a job starts: the same rule they apply in the guest."""
        ...

    def guest_job(
        self,
        instance_id: str,
        job: dict[str, Any],
        stdin: bytes = b"",
        seconds: float = 0.0,
        stop: asyncio.Event | None = None,
    ) -> AsyncGenerator[Output | Exit, None]:
        """Run a job in the guest: its output, then how it ended; GuestRefused when it cannot
        run; JobStopped once `stop` is set (the command is killed)."""
        ...


class GuestStream(Protocol):
    """One TCP connection to a port in a guest (GuestPorts.open_guest_port). Once the
    connection is gone (reset, or cut by `close`), `read` answers b"" and `write` raises
    ConnectionError."""

    async def read(self) -> bytes:
        """Up to 256 KiB; b"" once the guest side closed."""
        ...

    async def write(self, data: bytes) -> None:
        """Waits for room (back-pressure)."""
        ...

    async def write_eof(self) -> None:
        """Half-close toward the guest."""
        ...

    async def close(self) -> None:
        """Idempotent; cuts both directions."""
        ...


@runtime_checkable
class GuestPorts(Protocol):
    """TCP connections into running guests: an exposure's last hop."""

    async def open_guest_port(self, instance_id: str, port: int) -> GuestStream:
        """A TCP connection to `port` on the guest's loopback, opened inside the guest's
        network namespace. GuestRefused("port-closed", "nothing listens on port P in the
        guest") when refused; GuestRefused("unavailable", ...) when the guest is not running."""
        ...


@runtime_checkable
class NetworkControl(Protocol):
    async def set_network_policy(self, instance_id: str, policy: NetworkPolicy) -> None:
        """Enforce `policy` on a running instance's guest now, without a restart (connections
        the new policy forbids are cut); idempotent. Raises when it could not."""
        ...


class MachineObserver(Protocol):
    """Reads off this machine which parts of a workspace are present (cleanup status)."""

    def observe(
        self, instance_id: str | None, workspace_id: str, volume_ids: tuple[str, ...] = ()
    ) -> dict[Component, bool] | None:
        """Which parts are here right now (True: present); None for IDs that are not this
        runtime's. Blocking, cheap: call it in a thread."""
        ...


class Closable(Protocol):
    async def close(self) -> None:
        """At control-plane shutdown: drop connections; what runs keeps running."""
        ...


@runtime_checkable
class GuestLimitCounters(Protocol):
    def pids_limit_hits(self) -> int:
        """Forks refused in this node's guests because a PIDs limit was reached (a counter).
        Blocking, cheap: read at scrape."""
        ...

    def storage_clamped(self) -> int:
        """This node's guest images held at no new blocks now, because its disk is under its
        reserve (a gauge). Cheap: read at scrape."""
        ...
