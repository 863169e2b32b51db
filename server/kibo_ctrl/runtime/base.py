"""The interface between the engine and whatever really runs instances.

`Runtime` is what every runtime does (the node agent drives it). What only some runtimes
can do is a capability protocol of its own, so a caller asks for exactly what it needs and
app.py, which builds the runtimes, hands each capability to whoever uses it:

- `GuestAccess`: commands and files inside a running guest (the data plane);
- `GuestPorts`: TCP connections to ports inside a running guest (exposures);
- `GuestProcesses`: processes started in a running guest and kept by the node (the data
  plane's processes: background, PTY, input, signals; and its uploads);
- `MachineObserver`: which parts of a workspace are on this machine (cleanup status);
- `Closable`: connections to drop at shutdown;
- `GuestLimitCounters`: how often guests ran into their limits (read by the metrics).

The simulator has none of them; the process runtime has them all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
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


# -- guest processes ----------------------------------------------------------------------------

# Per instance: processes running at once (uploads included), ended ones kept (with their
# output's tail) for a later look, and the output kept per process for a reattach.
MAX_GUEST_PROCESSES = 32
MAX_ENDED_PROCESSES = 16
PROCESS_REPLAY_BYTES = 128 * 1024
# Per instance, uploads at once; an upload not written for this long is cancelled.
MAX_UPLOADS = 4
UPLOAD_IDLE_S = 60.0
# Tags with this prefix are the data plane's own (uploads): a client's are refused.
RESERVED_TAG_PREFIX = "kibo-"


@dataclass(frozen=True)
class ProcessSpec:
    """A process to start in a guest (GuestProcesses.start_guest_process)."""

    # The command (no shell); empty for an upload (`job`).
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    # A guest user: a name in its /etc/passwd or a number; "" is root.
    user: str = ""
    # Unique among the instance's running processes; "" for none.
    tag: str = ""
    # A terminal of (rows, cols): stdin, stdout and stderr are its slave; output comes as "pty".
    pty: tuple[int, int] | None = None
    # Written to stdin first (then closed when close_stdin).
    stdin: bytes = b""
    close_stdin: bool = False
    # The data-plane credential revision it was started under (end_guest_processes).
    owner: int = 0
    # An upload instead of a command: a file job of guest_exec ("write" or "untar", with its
    # path, mode...) whose stdin is this process's input. Not listed; cancelled when idle.
    job: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ProcessInfo:
    """A guest process as its node keeps it."""

    # In the guest's PID namespace.
    pid: int
    tag: str
    argv: tuple[str, ...]
    pty: bool
    running: bool
    # Meaningful once not running (128 + N: killed by signal N).
    exit_code: int
    # Seconds since the epoch.
    start_time: float
    cwd: str
    user: str
    # Input bytes taken so far (an upload's offset).
    received: int
    upload: bool = False


@dataclass(frozen=True)
class Dropped:
    """Output a follower missed (not kept, or dropped while it did not read): `count` bytes."""

    count: int


@dataclass(frozen=True)
class Replayed:
    """Following with `replay` a process that runs, once: the output kept when the follow began
    has all come; what follows comes as it is written (for an ended one, its Exit says that)."""


# A process: its pid in the guest, or its tag.
Selector = int | str


@runtime_checkable
class GuestProcesses(Protocol):
    """Processes started in running guests and kept by the node. Refusals are GuestRefused:
    "not-found" (no such process), "conflict" (a tag in use, input after stdin closed or to an
    ended process, an upload's offset not the one taken so far, a resize without a PTY),
    "limit" (past MAX_GUEST_PROCESSES or MAX_UPLOADS), "invalid" (a user unknown to the guest),
    "unavailable" (the guest is not running), "os-error" (its working directory)."""

    async def start_guest_process(self, instance_id: str, spec: ProcessSpec) -> ProcessInfo:
        """Start it: once this returns it runs (its pid is known)."""
        ...

    async def list_guest_processes(self, instance_id: str) -> list[ProcessInfo]:
        """Running and kept ended ones, oldest first; uploads included (`upload`)."""
        ...

    def follow_guest_process(
        self,
        instance_id: str,
        selector: Selector,
        replay: bool = False,
        stop: asyncio.Event | None = None,
        hold: bool = False,
    ) -> AsyncGenerator[Output | Dropped | Replayed | Exit, None]:
        """Its output from now (or from what is kept: `replay`, then Replayed), then its Exit. `hold`: the
        process's output waits for this follower rather than being dropped for it (a
        foreground start's: back-pressure to the guest, as an exec). JobStopped once `stop`
        is set; closing the generator leaves the process running."""
        ...

    async def send_guest_process_input(
        self, instance_id: str, selector: Selector, data: bytes, close: bool = False, offset: int | None = None
    ) -> int:
        """Write to its stdin (waits while it does not read), then close it if `close`; the
        input bytes taken so far. `offset`: refused ("conflict") unless it is that count."""
        ...

    async def signal_guest_process(self, instance_id: str, selector: Selector, signum: int) -> None: ...

    async def resize_guest_process(self, instance_id: str, selector: Selector, rows: int, cols: int) -> None: ...

    async def end_guest_processes(self, instance_id: str, keep_owner: int | None = None) -> None:
        """Kill the instance's processes (uploads too) not started under `keep_owner` (all
        when None): a revoke's; idempotent, and nothing for an unknown instance."""
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
