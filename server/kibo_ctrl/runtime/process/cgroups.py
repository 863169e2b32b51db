"""CPU, memory and PID limits for a guest: cgroup v2 where writable, else cgroup v1, else rlimits.

One cgroup per instance, under a parent named after the control plane's data directory
(so two control planes on one machine do not meet): v2 at `/sys/fs/cgroup/kibo-<tag>/`,
v1 under the control plane's own cgroup of each controller (`memory`, `cpu`, `pids`).
The supervisor moves the guest into it before exec; the OOM killer's kills are counted
in v2 `memory.events` (`oom_kill`) or v1 `memory.oom_control` (`oom_kill`).

PIDs (issue 27.1: a thread bomb in each of eight guests, 4,096 tasks apiece, took every
PID of a host whose pid_max is 32,768): the parent's `pids.max` is the node's budget
(`node_pids_budget`: the kernel's task limit less a reserve for kibo itself and the host,
whose processes are outside the parent), and each guest's is its memory's share of that
budget (`guest_pids_max`), so that guests that fit in the host's memory together fit in
the budget and one that hits its own limit takes nobody else's PIDs. Forks a limit refused
are counted (`Cgroups.pids_limit_hits`: the metric kibo_guest_pids_limit_hits_total)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "cpu", "pids")
# The node's PID budget keeps max(NODE_PIDS_RESERVE, a quarter) of the kernel's task limit
# (never more than half) for what runs outside the guests: the server, the supervisors,
# the fork server, sshd, a shell to repair things.
NODE_PIDS_RESERVE = 1024
# The least a guest gets, whatever its size (a shell, a build's make -j and its compilers),
# and so the most a tiny guest can hold of the budget.
GUEST_PIDS_FLOOR = 512
# Forks refused in instance cgroups already removed, by their parent (`Cgroups.remove` is
# a class method, run in threads): kept so the node's counter never goes down.
_RETIRED: dict[str, int] = {}
_RETIRED_LOCK = threading.Lock()


def kernel_task_limit() -> int:
    """How many tasks (processes and threads) the kernel lets exist at once: the lower of
    `kernel.pid_max` and `kernel.threads-max`."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    threads_max = int(Path("/proc/sys/kernel/threads-max").read_text())
    return min(pid_max, threads_max)


def node_pids_budget(task_limit: int) -> int:
    """The tasks all of a node's guests may hold together: `task_limit` less a reserve of
    max(NODE_PIDS_RESERVE, 25 %), at most half (pid_max 32,768: 24,576 for guests, 8,192 kept)."""
    reserve = min(max(NODE_PIDS_RESERVE, task_limit // 4), task_limit // 2)
    return task_limit - reserve


def guest_pids_max(budget: int, memory_mib: int, host_memory_mib: int) -> int:
    """A guest's `pids.max`: its memory's share of the node's budget (what a task costs is
    memory: its kernel stack and structures, its own stack), at least GUEST_PIDS_FLOOR and
    never more than the budget. Guests that fit in the host's memory fit in the budget."""
    share = budget * memory_mib // max(1, host_memory_mib)
    return min(budget, max(GUEST_PIDS_FLOOR, share))


def host_memory_mib() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20


def _refused_forks(directory: Path) -> int:
    """Forks refused in this pids cgroup because a PIDs limit was reached (`max` of its
    `pids.events`: on cgroup v1, and v2 before Linux 6.12, counted where the fork was
    tried); 0 where there is no such file."""
    try:
        text = (directory / "pids.events").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "max":
            return int(value)
    return 0


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


def _rmdir_counted(path: Path) -> None:
    """Remove an (empty) instance cgroup, its refused forks added to its parent's retired
    count in the same step."""
    with _RETIRED_LOCK:
        refused = _refused_forks(path)
        path.rmdir()
        if refused:
            _RETIRED[str(path.parent)] = _RETIRED.get(str(path.parent), 0) + refused


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class Cgroups:
    """Creates and removes per-instance cgroups; `mode` says which mechanism applies."""

    def __init__(self, tag: str, wanted: str = "auto", pids_budget: int = 0) -> None:
        """`pids_budget`: the tasks the node's guests may hold together (0: derived from
        the kernel's limits, `node_pids_budget`)."""
        self.tag = tag
        self.parents: list[Path] = []
        self.pids_budget = pids_budget or node_pids_budget(kernel_task_limit())
        self.host_memory_mib = host_memory_mib()
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
            if "pids" in wanted:
                _write(parent / "pids.max", str(self.pids_budget))
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
                if controller == "pids":
                    _write(parent / "pids.max", str(self.pids_budget))
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
        pids_max = guest_pids_max(self.pids_budget, memory_mib, self.host_memory_mib)
        if self.mode == "cgroup-v2":
            directory = dirs[0]
            _write(directory / "memory.max", str(memory))
            with contextlib.suppress(OSError):
                _write(directory / "memory.swap.max", "0")
            if (directory / "cpu.max").exists():
                _write(directory / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            if (directory / "pids.max").exists():
                _write(directory / "pids.max", str(pids_max))
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
                    _write(directory / "pids.max", str(pids_max))
            oom = str(next(d for d in dirs if d.relative_to(ROOT).parts[0] == "memory") / "memory.oom_control")
        return Limits(tuple(str(d) for d in dirs), tuple(str(d / "cgroup.procs") for d in dirs), oom, ())

    def pids_limit_hits(self) -> int:
        """Forks refused in this node's guests because a PIDs limit (a guest's own, or the
        node's budget) was reached: a counter (cheap: one small read per running guest, at
        scrape; on cgroup v2 since Linux 6.12 the parent's alone, whose `pids.events`
        counts its whole subtree, removed guests included)."""
        parent = self._pids_parent()
        if parent is None:
            return 0
        if (parent / "pids.events.local").exists():
            return _refused_forks(parent)
        with _RETIRED_LOCK:  # a guest's count is read here or in _RETIRED, never both or neither
            total = _RETIRED.get(str(parent), 0)
            with contextlib.suppress(OSError):
                total += sum(_refused_forks(child) for child in parent.iterdir() if child.is_dir())
        return total

    def _pids_parent(self) -> Path | None:
        """The parent cgroup that holds the guests' PID limits (None: there is none)."""
        for parent in self.parents:
            if (parent / "pids.max").exists():
                return parent
        return None

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
                    _rmdir_counted(path)
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
