"""CPU and memory limits for a guest: cgroup v2 where writable, else cgroup v1, else rlimits.

One cgroup per instance, under a parent named after the control plane's data directory
(so two control planes on one machine do not meet): v2 at `/sys/fs/cgroup/kibo-<tag>/`,
v1 under the control plane's own cgroup of each controller (`memory`, `cpu`, `pids`).
The supervisor moves the guest into it before exec; the OOM killer's kills are counted
in v2 `memory.events` (`oom_kill`) or v1 `memory.oom_control` (`oom_kill`)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
PIDS_MAX = 4096
V1_CONTROLLERS = ("memory", "cpu", "pids")


@dataclass(frozen=True)
class Limits:
    """The cgroup of one instance, as the supervisor needs it (JSON-friendly)."""

    dirs: tuple[str, ...]  # cgroup directories, one per hierarchy
    procs: tuple[str, ...]  # their cgroup.procs files: the guest writes its PID there
    oom_file: str  # where the OOM killer's kills are counted ("" if nowhere)
    rlimits: tuple[tuple[str, int], ...]  # (RLIMIT_* name, value) when there is no cgroup


def _made(directory: Path) -> list[Path]:
    """Make `directory` if it is not there; [it] if this call made it, else []."""
    try:
        directory.mkdir()
    except FileExistsError:
        return []
    return [directory]


def _unmake(made: list[Path]) -> None:
    """Remove what a setup that then failed made (nothing of it is left on the machine)."""
    for directory in reversed(made):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _own_path(controller: str | None) -> str:
    """This process's cgroup in a v1 hierarchy (`controller`) or in v2 (None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller is None and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return "/"


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class Cgroups:
    """Creates and removes per-instance cgroups; `mode` says which mechanism applies."""

    def __init__(self, tag: str, wanted: str = "auto") -> None:
        self.tag = tag
        self.parents: list[Path] = []
        self.mode = self._detect(wanted)

    def _detect(self, wanted: str) -> str:
        order = ["cgroup-v2", "cgroup-v1", "rlimit"] if wanted == "auto" else [wanted]
        for mode in order:
            if mode == "cgroup-v2" and self._setup_v2():
                return mode
            if mode == "cgroup-v1" and self._setup_v1():
                return mode
            if mode in ("rlimit", "none"):
                return mode
        raise RuntimeError(f"limits {wanted!r} cannot be used on this machine")

    def _setup_v2(self) -> bool:
        if not (ROOT / "cgroup.controllers").exists():
            return False
        try:
            available = (ROOT / "cgroup.controllers").read_text().split()
            if "memory" not in available:
                return False
            wanted = [c for c in ("memory", "cpu", "pids") if c in available]
            parent = ROOT / f"kibo-{self.tag}"
            made = _made(parent)
            enabled = " ".join(f"+{c}" for c in wanted)
            _write(ROOT / "cgroup.subtree_control", enabled)
            _write(parent / "cgroup.subtree_control", enabled)
            probe = parent / "probe"
            probe.mkdir(exist_ok=True)
            ok = (probe / "memory.max").exists()
            probe.rmdir()
        except OSError:
            ok = False
        if ok:
            self.parents = [parent]
        else:
            _unmake(made)
        return ok

    def _setup_v1(self) -> bool:
        if not (ROOT / "memory" / "memory.limit_in_bytes").exists():
            return False
        parents: list[Path] = []
        made: list[Path] = []
        try:
            for controller in V1_CONTROLLERS:
                hierarchy = ROOT / controller
                if not hierarchy.is_dir():
                    continue
                parent = hierarchy / _own_path(controller).lstrip("/") / f"kibo-{self.tag}"
                made += _made(parent)
                parents.append(parent)
            probe = parents[0] / "probe"
            probe.mkdir(exist_ok=True)
            _write(probe / "memory.limit_in_bytes", str(64 << 20))
            probe.rmdir()
        except (OSError, IndexError):
            # A hierarchy this user may not write (the rootless server: one of three, here).
            _unmake(made)
            return False
        self.parents = parents
        return True

    def create(self, name: str, vcpus: int, memory_mib: int) -> Limits:
        """A fresh cgroup for instance `name` with the workspace's limits."""
        memory = memory_mib << 20
        if self.mode == "rlimit":
            return Limits((), (), "", (("RLIMIT_DATA", memory),))
        if self.mode == "none":
            return Limits((), (), "", ())
        dirs = [parent / name for parent in self.parents]
        self.remove(tuple(str(d) for d in dirs))
        for directory in dirs:
            directory.mkdir()
        quota = vcpus * CPU_PERIOD_US
        if self.mode == "cgroup-v2":
            directory = dirs[0]
            _write(directory / "memory.max", str(memory))
            with contextlib.suppress(OSError):
                _write(directory / "memory.swap.max", "0")
            if (directory / "cpu.max").exists():
                _write(directory / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            if (directory / "pids.max").exists():
                _write(directory / "pids.max", str(PIDS_MAX))
            oom = str(directory / "memory.events")
        else:
            for directory in dirs:
                controller = directory.relative_to(ROOT).parts[0]
                if controller == "memory":
                    _write(directory / "memory.limit_in_bytes", str(memory))
                    with contextlib.suppress(OSError):
                        _write(directory / "memory.memsw.limit_in_bytes", str(memory))
                elif controller == "cpu":
                    _write(directory / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                    _write(directory / "cpu.cfs_quota_us", str(quota))
                elif controller == "pids":
                    _write(directory / "pids.max", str(PIDS_MAX))
            oom = str(next(d for d in dirs if d.relative_to(ROOT).parts[0] == "memory") / "memory.oom_control")
        return Limits(tuple(str(d) for d in dirs), tuple(str(d / "cgroup.procs") for d in dirs), oom, ())

    @staticmethod
    def pids(dirs: tuple[str, ...]) -> set[int]:
        found: set[int] = set()
        for directory in dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in Path(directory, "cgroup.procs").read_text().split())
        return found

    @classmethod
    def remove(cls, dirs: tuple[str, ...], timeout: float = 3.0) -> None:
        """Kill whatever still runs in the cgroups and remove them. Blocking: run in a thread."""
        deadline = time.monotonic() + timeout
        for directory in dirs:
            path = Path(directory)
            while path.exists():
                for pid in cls.pids((directory,)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    path.rmdir()
                except FileNotFoundError:
                    break
                except OSError as error:
                    if error.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)

    def close(self) -> None:
        """Remove the empty parents (at shutdown; a parent still in use stays)."""
        for parent in self.parents:
            with contextlib.suppress(OSError):
                parent.rmdir()
