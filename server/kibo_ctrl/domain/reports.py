"""What a node reports about its instances: the observations the controller folds in."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .model import Component, Phase, StopDurability


class ExitReason(Enum):
    CRASH = "crash"
    HOST_OOM = "host-oom"
    # kibovm: a guest reset exits the VMM with the same code as an internal fault.
    GUEST_RESET = "guest-reset"
    # kibovm: the guest powered itself off.
    GUEST_POWEROFF = "guest-poweroff"


@dataclass(frozen=True)
class Report:
    instance_id: str
    # The instance step this report answers; None for unsolicited reports.
    step: int | None = None


@dataclass(frozen=True)
class Progress(Report):
    phase: Phase = Phase.PROVISIONING
    volumes_created: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launched(Report):
    volumes_created: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchFailed(Report):
    message: str = ""
    holds: tuple[Component, ...] = ()
    volumes_created: tuple[str, ...] = ()
    # The node had no room for it after all (its disk under its reserve, or its storage all
    # promised): which resource ("disk"). Such an instance is placed again, not FAILED.
    no_room: str = ""


@dataclass(frozen=True)
class Stopped(Report):
    durability: StopDurability = StopDurability.CONFIRMED


@dataclass(frozen=True)
class StopFailed(Report):
    message: str = ""


@dataclass(frozen=True)
class Destroyed(Report):
    pass


@dataclass(frozen=True)
class DestroyFailed(Report):
    message: str = ""


@dataclass(frozen=True)
class GuestReset(Report):
    """firecracker: the guest reset itself; the node can start a new VMM for it."""


@dataclass(frozen=True)
class Restarted(Report):
    pass


@dataclass(frozen=True)
class RestartFailed(Report):
    """The new VMM for a reset guest did not start (or the node restarted meanwhile)."""

    message: str = ""


@dataclass(frozen=True)
class VmmExited(Report):
    reason: ExitReason = ExitReason.CRASH
    # What ended, in the runtime's words (a process sandbox has no VMM: its supervisor, or its
    # guest, ended); "" for the generic wording of `reason`.
    detail: str = ""


@dataclass(frozen=True)
class GuestOomKill(Report):
    """A process in the guest went over the workspace's memory and the kernel killed it
    there (the guest runs on): its PID as the node sees it and its command, "" where the
    node could not tell; `count` kills seen at once."""

    pid: int = 0
    command: str = ""
    count: int = 1


@dataclass(frozen=True)
class GuestResponding(Report):
    responding: bool = True


@dataclass(frozen=True)
class StorageReleased:
    workspace_id: str
    pool_lost: bool = False
    volume_ids: tuple[str, ...] = field(default_factory=tuple)
