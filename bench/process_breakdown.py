"""Where a process-runtime create goes, and the floors its figures are judged against.

Used by `python -m bench.process_runtime --breakdown`: the server runs with
KIBO_PROCESS_TIMINGS=1, so each launch leaves two files in its instance directory:
launch-timings.json (the control plane's steps: runtime.py) and timings.json (the
supervisor's: supervisor.py, storage.py), each a list of (step, wall-clock time it ended).
With the client's own send and answer times they cut one create into consecutive
segments (`SEGMENTS`), whose medians over the run are the breakdown.

The floors, measured in the same run (the machine is shared, so only same-run ratios mean
anything):
- sandbox creation: `bwrap --unshare-all --die-with-parent ... /bin/true` spawned and
  reaped (what any bwrap sandbox costs here), and the same moved into cgroups of its own
  first, as a guest is (on cgroup v1 that move waits for an RCU grace period: a floor of
  every launch with limits on such a host);
- memory: an idle `sleep` in a bwrap sandbox (its bwrap and sleep processes), PSS."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

# (segment name, the mark it starts at, the mark it ends at). "sent" and "answered" are the
# client's; the supervisor's marks are prefixed "supervisor:", its images' "layer.img:" and
# "volume.img:" (storage.py, per image: start, mkfs, mount; the images are done side by side).
SEGMENTS = (
    ("control plane: command, schedule, node agent", "sent", "launch"),
    ("provision (dirs, seed, sparse files)", "launch", "provisioned"),
    ("LAUNCHING report (a transaction)", "provisioned", "progress-reported"),
    ("spec.json + cgroup", "progress-reported", "spec-written"),
    ("spawn the supervisor (fork/exec)", "spec-written", "supervisor-spawned"),
    ("supervisor: python start-up + imports", "supervisor-spawned", "supervisor:main"),
    ("supervisor: lock, read spec", "supervisor:main", "supervisor:spec-read"),
    ("supervisor: user namespace", "supervisor:spec-read", "supervisor:userns"),
    ("supervisor: mount ns", "supervisor:userns", "supervisor:mount-ns"),
    ("supervisor: fork its mount child", "supervisor:mount-ns", "supervisor:forked"),
    ("mount child: load storage.py", "supervisor:forked", "supervisor:storage-module"),
    ("mount child: images (mkfs+mount, parallel)", "supervisor:storage-module", "supervisor:storage"),
    ("mount child: overlay, stage (tmpfs, binds, scripts)", "supervisor:storage", "supervisor:stage"),
    ("supervisor: the mount child's answer", "supervisor:stage", "supervisor:mounted"),
    ("supervisor: start bwrap (fork/exec)", "supervisor:mounted", "supervisor:bwrap-spawned"),
    ("bwrap + agent start + ready seen", "supervisor:bwrap-spawned", "supervisor:ready-seen"),
    ("ready message -> control plane", "supervisor:ready-seen", "ready"),
    ("Launched report, fold, reply", "ready", "answered"),
)
# Parts of segments, and what runs beside them (overlapping: not added to the total).
IMAGE_PARTS = (
    ("  layer image: mkfs", "layer.img:start", "layer.img:mkfs"),
    ("  layer image: mount", "layer.img:mkfs", "layer.img:mount"),
    ("  volume image: mkfs", "volume.img:start", "volume.img:mkfs"),
    ("  volume image: mount", "volume.img:mkfs", "volume.img:mount"),
    ("  images: wait for old loop devices to go", "supervisor:storage-module", "supervisor:images-detached"),
    ("  images: mkfs/mount threads (all)", "supervisor:images-detached", "supervisor:images-mounted"),
    ("  images: the run directory's tmpfs", "supervisor:images-mounted", "supervisor:storage"),
    ("  meanwhile, the supervisor: fork the early guest, listen", "supervisor:mount-ns", "supervisor:listen"),
    ("  bwrap: before the fork", "supervisor:mounted", "supervisor:bwrap-fork"),
    ("  bwrap: fork, cgroup, userns, exec", "supervisor:bwrap-fork", "supervisor:bwrap-exec"),
)


def _marks(path: Path, prefix: str) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    found: dict[str, float] = {}
    for step, when in data.get("marks") or ():
        # The images' own marks keep their names; the supervisor's steps get the prefix.
        name = step if ":" in step else prefix + step
        found[name] = float(when)
    return found


def segments(instance_dir: Path, sent: float, answered: float) -> dict[str, float]:
    """One create's segments in ms (those whose two marks are both known)."""
    marks = {"sent": sent, "answered": answered}
    marks.update(_marks(instance_dir / "launch-timings.json", ""))
    marks.update(_marks(instance_dir / "timings.json", "supervisor:"))
    found = {}
    for name, start, end in SEGMENTS + IMAGE_PARTS:
        if start in marks and end in marks:
            found[name] = (marks[end] - marks[start]) * 1000
    found["total"] = (answered - sent) * 1000
    return found


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """The median of each segment over the creates (in SEGMENTS order, then the image parts)."""
    names = [name for name, _, _ in SEGMENTS + IMAGE_PARTS] + ["total"]
    return {
        name: round(statistics.median(values), 2)
        for name in names
        if (values := [sample[name] for sample in samples if name in sample])
    }


def print_breakdown(breakdown: dict[str, float]) -> None:
    print("\nWhere a create goes (median ms per segment over the latency run; they add up to ~the total)")
    for name, value in breakdown.items():
        print(f"  {name:48}{value:8.1f}")


# -- the floors --------------------------------------------------------------------------------

FLOOR_SANDBOX = [
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
]


def sandbox_floor(runs: int) -> list[float]:
    """Seconds to spawn and reap `bwrap ... /bin/true`, `runs` times (after one warm-up)."""
    times = []
    for index in range(runs + 1):
        started = time.perf_counter()
        subprocess.run([*FLOOR_SANDBOX, "/bin/true"], check=True, stdin=subprocess.DEVNULL)
        if index:
            times.append(time.perf_counter() - started)
    return times


def cgroup_sandbox_floor(runs: int) -> list[float]:
    """Seconds to spawn and reap `bwrap ... /bin/true` moved first into cgroups of its own,
    as every guest is (the runtime's Cgroups: memory, CPU, pids), `runs` times, 50 ms apart
    (as launches are: a move right after another one is cheaper). Empty without cgroups."""
    from kibo_ctrl.runtime.process.cgroups import Cgroups

    cgroups = Cgroups(f"floor-{os.getpid()}")
    if not cgroups.parents:
        return []
    limits = cgroups.create("floor", 1, 256)

    def enter() -> None:  # in the child, before the exec: what a guest pays
        for procs in limits.procs:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

    times = []
    try:
        for index in range(runs + 1):
            time.sleep(0.05)
            started = time.perf_counter()
            subprocess.run([*FLOOR_SANDBOX, "/bin/true"], check=True, stdin=subprocess.DEVNULL, preexec_fn=enter)
            if index:
                times.append(time.perf_counter() - started)
    finally:
        Cgroups.remove(limits.dirs)
        cgroups.close()
    return times


def _pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")), 0)


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError, ValueError):
            todo += [int(p) for p in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
    return found


def memory_floor(count: int) -> float:
    """PSS (MiB) per idle `sleep` in a bwrap sandbox, `count` of them at once."""
    sleepers = [
        subprocess.Popen([*FLOOR_SANDBOX, "sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(count)
    ]
    try:
        deadline = time.monotonic() + 10
        # Until every sandbox runs its sleep (bwrap -> bwrap -> sleep).
        while time.monotonic() < deadline and any(len(_tree(s.pid)) < 3 for s in sleepers):
            time.sleep(0.02)
        time.sleep(0.2)
        total = sum(_pss_kib(pid) for sleeper in sleepers for pid in _tree(sleeper.pid))
    finally:
        for sleeper in sleepers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
    return total / 1024 / count


def floors(runs: int, sleepers: int) -> dict[str, Any]:
    from bench.process_runtime import summary

    in_cgroups = cgroup_sandbox_floor(runs)
    return {
        "sandbox_true_s": summary(sandbox_floor(runs)),
        "sandbox_true_in_cgroups_s": summary(in_cgroups) if in_cgroups else None,
        "idle_sleep_pss_mib": memory_floor(sleepers),
    }
