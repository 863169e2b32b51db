"""Real sandboxes: `python -m bench.process_runtime [--count N] [--max-idle N] [--supervisor node] [--json FILE]`.

Starts `kibo-ctrl serve --runtime process` (its defaults otherwise, no auth) on a temporary
data directory and measures, through the SDK like a user:

1. latency, one workspace at a time (`--count`, default 30): create -> AVAILABLE (ready:
   the guest answered; the SDK's create_workspace, which settles: `create`), a first
   command (credential + `true`), stop -> STOPPED (graceful, durability confirmed), delete
   -> DELETED; p50/p99 (nearest rank: with 30 samples p99 is the slowest).
2. density: idle workspaces of `--memory-mib` (16) MiB and 1 vCPU, created one after
   another until a create fails, `--max-idle` (300) is reached or MemAvailable drops under
   `--min-available-gib` (2) GiB. Then every one must answer a command. Reported: how many,
   the time per create (first and last tenth), the PSS of all supervisors (with
   `--supervisor node`: the node supervisor, which holds the ready guests), the guests (every
   process in the instances' cgroups), the guests' job doors and the fork server
   (/proc/PID/smaps_rollup) per workspace, the
   drop of MemAvailable per workspace (includes kernel memory: page tables, namespaces,
   cgroups), and the control plane's own PSS. Idle means idle: measured once the job doors
   have closed (the server runs with KIBO_JOB_DOOR_IDLE_S=DOOR_IDLE_S instead of a minute)
   and the last workspace made has been idle `--idle-s` (60) seconds (what a supervisor does
   while idle can grow it); what a door adds to a workspace in use is measured before, and
   reported beside.

Everything it created is deleted at the end, whatever happened; then it checks that no
supervisor or guest process of its data directory and none of its cgroups remain (exit 1 if
any did, after killing them). Needs root and bubblewrap (the runtime's sandbox)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import kibotos
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo_ctrl.runtime.process.forkserver import SUPERVISOR_SPARE

from bench import process_breakdown as breakdown

AVAILABLE = wp.WORKSPACE_STATE_AVAILABLE
STOPPED = wp.WORKSPACE_STATE_STOPPED


# -- the server ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    data_dir: Path
    port: int = field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None
    timings: bool = False  # KIBO_PROCESS_TIMINGS=1: each launch leaves its timings (the breakdown)
    python: str = sys.executable  # another checkout's interpreter (bench/process_ab.py)
    env: dict[str, str] = field(default_factory=dict)  # more of the server's environment
    supervisor: str = "auto"  # --supervisor: who holds ready guests

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def flags(self) -> list[str]:
        # Hundreds of idle default-size workspaces (10 + 10 GiB, sparse, nearly empty): the
        # density run lets their capacities promise more than the free disk, and the node offer
        # more vCPUs and memory than its ratios would (this measures what the host bears).
        flags = ["--runtime", "process", "--insecure-no-auth", "--http-listen", "", "--log-level", "warning"]
        flags += ["--node-vcpus", "100000", "--node-memory-mib", "100000000"]
        return [*flags, "--storage-overcommit", "1000", "--supervisor", self.supervisor]

    def start(self) -> Server:
        log = open(self.data_dir.parent / "server.log", "ab")  # noqa: SIM115 - handed to the child
        command = [self.python, "-m", "kibo_ctrl", "serve", "--listen", self.address, "--node-listen", "127.0.0.1:0"]
        command += ["--data-dir", str(self.data_dir), *self.flags]
        # Its own session: a Ctrl-C at the terminal reaches the bench, which then cleans up.
        env = {**os.environ, "KIBO_PROCESS_TIMINGS": "1" if self.timings else "0", **self.env}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.process.returncode}: {self.log()}")
                with contextlib.suppress(grpc.RpcError):
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return self
                time.sleep(0.05)
        raise TimeoutError(f"the server is not SERVING after 30 s: {self.log()}")

    def log(self) -> str:
        path = self.data_dir.parent / "server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


# -- what is on the machine -------------------------------------------------------------------


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    return parents


def supervisors(data_dir: Path) -> list[int]:
    needle = f"supervisor.py {data_dir}/instances/"
    return [pid for pid in _parents() if needle in _cmdline(pid)]


def node_supervisors(data_dir: Path) -> list[int]:
    needle = f"node_supervisor.py {data_dir} "
    return [pid for pid in _parents() if needle in _cmdline(pid)]


def in_instance_cgroups(data_dir: Path) -> set[int]:
    """Every process in the cgroups of this data directory's instances (the guests, and the
    job doors there are): how guests are found when no supervisor is their parent."""
    tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]
    found: set[int] = set()
    for procs in Path("/sys/fs/cgroup").glob(f"**/kibo-{tag}/*/cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            found |= {int(pid) for pid in procs.read_text().split()}
    return found


def job_doors(server_pid: int) -> list[int]:
    """The guests' job doors (forkserver.py `Door`, one per running workspace): the control
    plane's children."""
    children = [pid for pid, parent in _parents().items() if parent == server_pid]
    return [pid for pid in children if _cmdline(pid).startswith("kibo-job-door")]


def fork_servers(server_pid: int) -> list[int]:
    """The control plane's fork server (runtime/process/forkserver.py), its child, and the
    next supervisor it keeps forked ahead (its spare: shared by all workspaces as it is)."""
    parents = _parents()
    servers = [pid for pid, parent in parents.items() if parent == server_pid and "forkserver.py" in _cmdline(pid)]
    spares = [pid for pid, parent in parents.items() if parent in servers and SUPERVISOR_SPARE in _cmdline(pid)]
    return servers + spares


def descendants(roots: Iterable[int]) -> set[int]:
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [pid for pid in roots if pid in parents]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def pss_mib(pids: Iterable[int]) -> float:
    total_kib = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue  # gone meanwhile
        total_kib += next((int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")), 0)
    return total_kib / 1024


def leftovers(data_dir: Path) -> list[int]:
    """Live processes of this data directory: supervisors and anything in its instances."""
    named = [pid for pid in _parents() if f"{data_dir}/instances/" in _cmdline(pid)]
    return named + sorted(in_instance_cgroups(data_dir) - set(named))


def cgroups_left(data_dir: Path) -> list[str]:
    tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]
    return [str(p) for p in Path("/sys/fs/cgroup").glob(f"**/kibo-{tag}") if p.is_dir()]


# -- statistics -----------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "min": min(values),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


# -- the measurements -------------------------------------------------------------------------------


def spec(memory_mib: int) -> wp.WorkspaceSpec:
    return wp.WorkspaceSpec(resources=wp.Resources(vcpus=1, memory_mib=memory_mib))


def create(client: kibotos.Client, memory_mib: int, created: list[str]) -> wp.Workspace:
    """What a user's `client.create_workspace(spec)` does: one call, which the server answers
    once the create is done (it waits up to its --settle-ms for that), resent while it is not;
    then, only if the workspace is not AVAILABLE yet, a watch until it is."""

    def answered(response: Any) -> None:
        if response.workspace.workspace_id not in created:  # deleted at the end, whatever happens
            created.append(response.workspace.workspace_id)

    response = client.create_workspace(spec(memory_mib), on_answer=answered)
    if response.workspace.state == AVAILABLE:
        return response.workspace
    return client.wait_workspace(response.workspace, response.command.command_id, timeout=120)


def first_command(client: kibotos.Client, workspace_id: str, parts: list[float] | None = None) -> float:
    """Seconds for a credential and `true` with it; `parts` gets the exec's own share."""
    started = time.perf_counter()
    credential = client.issue_data_plane_credential(workspace_id).credential
    issued = time.perf_counter()
    result = client.exec_workspace_command(credential, ["true"])
    if result.exit_code != 0:
        raise RuntimeError(f"`true` exited {result.exit_code} in {workspace_id}: {result.stderr!r}")
    if parts is not None:
        parts.append(time.perf_counter() - issued)
    return time.perf_counter() - started


def latency(
    client: kibotos.Client, count: int, memory_mib: int, created: list[str], data_dir: Path | None = None
) -> dict[str, Any]:
    """`data_dir` (the server runs with KIBO_PROCESS_TIMINGS=1): also each create's breakdown."""
    ready, command, stop, delete = [], [], [], []
    exec_only: list[float] = []  # the exec RPC alone, without the credential
    steps: list[dict[str, float]] = []
    for index in range(count):
        started = time.perf_counter()
        sent = time.time()
        workspace = create(client, memory_mib, created)
        answered = time.time()
        ready.append(time.perf_counter() - started)
        if workspace.state != AVAILABLE:
            raise RuntimeError(f"workspace {index} ended {kibotos.state_name(workspace.state)}: {workspace.failure}")
        workspace_id = workspace.workspace_id
        if data_dir is not None:
            directory = data_dir / "instances" / f"{workspace_id}-g{workspace.execution_generation}"
            steps.append(breakdown.segments(directory, sent, answered))
        command.append(first_command(client, workspace_id, exec_only))
        started = time.perf_counter()
        stopped = client.stop_workspace(workspace_id)
        client.wait_workspace(workspace_id, stopped.command.command_id, timeout=120)
        stop.append(time.perf_counter() - started)
        if stopped.command.result.durability != wp.STOP_DURABILITY_CONFIRMED:
            raise RuntimeError(f"the stop of {workspace_id} was not CONFIRMED: {stopped.command}")
        started = time.perf_counter()
        deleted = client.delete_workspace(workspace_id)
        client.wait_workspace_deleted(workspace_id, deleted.command.command_id, timeout=120)
        delete.append(time.perf_counter() - started)
        created.remove(workspace_id)
        print(
            f"  latency {index + 1}/{count}: ready {ready[-1] * 1000:.0f} ms, stop {stop[-1] * 1000:.0f} ms", flush=True
        )
    result: dict[str, Any] = {
        "ready_s": summary(ready),
        "first_command_s": summary(command),
        "first_exec_only_s": summary(exec_only),
        "stop_s": summary(stop),
        "delete_s": summary(delete),
    }
    if steps:
        result["breakdown_ms"] = breakdown.medians(steps)
    return result


@dataclass
class Density:
    count: int = 0
    stopped_because: str = ""
    create_s: list[float] = field(default_factory=list)
    mem_available_before_mib: float = 0.0
    mem_available_after_mib: float = 0.0
    processes: int = 0
    pss_supervisors_mib: float = 0.0  # the instances' supervisors, and the node supervisor
    pss_node_supervisor_mib: float = 0.0  # of which the node supervisor (--supervisor node)
    pss_fork_server_mib: float = 0.0  # the one interpreter supervisors are forked from, and its spare: shared by all
    pss_doors_mib: float = 0.0  # the guests' job doors left open once idle (none, normally)
    doors_open: int = 0  # right after the creates: the doors of the workspaces made in the last DOOR_IDLE_S
    pss_door_each_mib: float = 0.0  # what an open door (and its spare) adds to a workspace in use
    pss_guests_mib: float = 0.0
    control_plane_pss_before_mib: float = 0.0
    control_plane_pss_after_mib: float = 0.0
    answered: int = 0
    command_s: list[float] = field(default_factory=list)
    idle_s: float = 0.0  # how long the last one made was idle when the memory was measured


# The server's job doors close after this many seconds without a job (default: 60).
DOOR_IDLE_S = 5.0


def density(client: kibotos.Client, server: Server, args: argparse.Namespace, created: list[str]) -> Density:
    assert server.process is not None
    result = Density(mem_available_before_mib=mem_available_mib())
    result.control_plane_pss_before_mib = pss_mib([server.process.pid])
    floor = args.min_available_gib * 1024
    mine: list[str] = []
    while True:
        if len(mine) >= args.max_idle:
            result.stopped_because = f"the bound (--max-idle {args.max_idle})"
            break
        available = mem_available_mib()
        if available < floor:
            result.stopped_because = f"MemAvailable {available:.0f} MiB < {floor:.0f} MiB"
            break
        started = time.perf_counter()
        try:
            workspace = create(client, args.memory_mib, created)
        except kibotos.KiboError as error:
            result.stopped_because = f"a create failed: {error}"
            break
        if workspace.state != AVAILABLE:
            result.stopped_because = (
                f"a create ended {kibotos.state_name(workspace.state)}: {workspace.failure.message}"
            )
            break
        result.create_s.append(time.perf_counter() - started)
        mine.append(workspace.workspace_id)
        if len(mine) % 25 == 0:
            print(f"  density: {len(mine)} idle workspaces, MemAvailable {available:.0f} MiB", flush=True)
    result.count = len(mine)
    made = time.monotonic()
    time.sleep(2)  # let the last ones settle (the guest agent's start-up) before measuring
    doors = job_doors(server.process.pid)
    result.doors_open = len(doors)
    # A door with its spare (the next job, forked ahead: forkserver.py): what an open door costs.
    result.pss_door_each_mib = pss_mib(descendants(doors)) / len(doors) if doors else 0.0
    deadline = time.monotonic() + DOOR_IDLE_S + 10
    while job_doors(server.process.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    # Idle for a while, as idle workspaces are: what a supervisor does while idle can grow it.
    time.sleep(max(0.0, made + args.idle_s - time.monotonic()))
    result.idle_s = time.monotonic() - made
    result.mem_available_after_mib = mem_available_mib()
    data_dir = server.data_dir.resolve()
    nodes = node_supervisors(data_dir)
    roots = supervisors(data_dir) + nodes
    doors = descendants(job_doors(server.process.pid))
    everything = (descendants(roots) | in_instance_cgroups(data_dir)) - doors
    result.processes = len(everything)
    result.pss_supervisors_mib = pss_mib(roots)
    result.pss_node_supervisor_mib = pss_mib(nodes)
    result.pss_guests_mib = pss_mib(everything - set(roots))
    result.pss_fork_server_mib = pss_mib(fork_servers(server.process.pid))
    result.pss_doors_mib = pss_mib(doors)
    result.processes += len(doors)
    result.control_plane_pss_after_mib = pss_mib([server.process.pid])
    # Each must answer a command: idle, not dead.
    for workspace_id in mine:
        with contextlib.suppress(kibotos.KiboError, RuntimeError):
            result.command_s.append(first_command(client, workspace_id))
            result.answered += 1
    return result


# -- cleaning up --------------------------------------------------------------------------------------


def clean_up(server: Server, created: list[str]) -> dict[str, Any]:
    """Delete every workspace of this (private) server: those made here and any whose create
    was cut short before its ID came back; stop the server; verify nothing is left."""
    report: dict[str, Any] = {"deleted": 0, "delete_errors": []}
    data_dir = server.data_dir.resolve()
    started = time.perf_counter()
    if server.process is not None and server.process.poll() is None:
        with kibotos.Client(server.address, timeout=60) as client:
            targets = dict.fromkeys(created)
            try:
                targets.update(dict.fromkeys(w.workspace_id for w in client.list_workspaces()))
            except kibotos.KiboError as error:
                report["delete_errors"].append(f"listing: {error}")
            commands = {}
            for workspace_id in targets:
                try:
                    commands[workspace_id] = client.delete_workspace(workspace_id, settle=False).command.command_id
                except kibotos.KiboError as error:
                    report["delete_errors"].append(f"{workspace_id}: {error}")
            for workspace_id, command_id in commands.items():
                try:
                    client.wait_workspace_deleted(workspace_id, command_id, timeout=300)
                    report["deleted"] += 1
                except kibotos.KiboError as error:
                    report["delete_errors"].append(f"{workspace_id}: {error}")
    report["delete_all_s"] = time.perf_counter() - started
    deadline = time.monotonic() + 30
    while leftovers(data_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    server.stop()
    # A node supervisor exits once it holds nothing and its runtime is gone.
    deadline = time.monotonic() + 15
    while node_supervisors(data_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = leftovers(data_dir) + node_supervisors(data_dir)
    report["processes_left"] = len(left)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # The runtime removes its cgroups (and the empty parents at shutdown); anything left is
    # reported, then removed deepest first once its processes are gone.
    cgroups = cgroups_left(data_dir)
    report["cgroups_left"] = cgroups
    for parent in cgroups:
        for path in sorted(Path(parent).glob("**/"), key=lambda p: len(p.parts), reverse=True):
            deadline = time.monotonic() + 5
            while path.exists() and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    for stray in (path / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(stray), signal.SIGKILL)
                    path.rmdir()
                time.sleep(0.02)
    return report


# -- the report ---------------------------------------------------------------------------------------


def _ms(stats: dict[str, float], key: str) -> str:
    return f"{stats[key] * 1000:8.0f}" if stats else "       -"


def print_table(result: dict[str, Any]) -> None:
    print()
    print(f"kibo process runtime on {result['machine']['cpus']} cores, {result['machine']['mem_total_gib']:.1f} GiB")
    print(f"isolation/limits: {', '.join(result['runtime'])}")
    lat = result["latency"]
    print(f"\nLatency, one workspace at a time (n={lat['ready_s'].get('n', 0)}, ms; p99 = nearest rank)")
    print(f"  {'':28}{'p50':>8}{'p99':>8}{'min':>8}{'max':>8}")
    rows = (
        ("create -> AVAILABLE (ready)", "ready_s"),
        ("first command (cred + true)", "first_command_s"),
        ("  of which the exec of true", "first_exec_only_s"),
        ("stop -> STOPPED (graceful)", "stop_s"),
        ("delete -> DELETED", "delete_s"),
    )
    for label, key in rows:
        stats = lat[key]
        print(f"  {label:28}{_ms(stats, 'p50')}{_ms(stats, 'p99')}{_ms(stats, 'min')}{_ms(stats, 'max')}")
    den = result["density"]
    count = den["count"]
    print(
        f"\nIdle {result['memory_mib']} MiB workspaces held: {count} (stopped by {den['stopped_because']}),"
        f" measured when the last one made had been idle {den['idle_s']:.0f} s"
    )
    if count:
        per = den["pss_per_workspace_mib"]
        print(f"  answering a command:        {den['answered']}/{count}")
        print(
            f"  PSS per idle workspace:     {per:.2f} MiB (supervisor {den['pss_supervisors_mib'] / count:.2f}"
            f" [node supervisor {den.get('pss_node_supervisor_mib', 0.0) / count:.2f}]"
            f" + fork server {den['pss_fork_server_mib'] / count:.2f}"
            f" + job door {den['pss_doors_mib'] / count:.2f}"
            f" + guest {den['pss_guests_mib'] / count:.2f}; {den['processes'] / count:.1f} processes each)"
        )
        print(
            f"  in use, plus door + spare:  {den['pss_door_each_mib']:.2f} MiB"
            f" (measured on the {den['doors_open']} doors open after the creates)"
        )
        print(f"  MemAvailable drop per ws:   {den['mem_available_drop_per_workspace_mib']:.2f} MiB")
        print(
            f"  control plane PSS:          {den['control_plane_pss_before_mib']:.0f} -> "
            f"{den['control_plane_pss_after_mib']:.0f} MiB"
        )
        first, last = den["create_first_tenth_s"], den["create_last_tenth_s"]
        print(
            f"  time per create:            p50 {den['create_s']['p50'] * 1000:.0f} ms, first tenth p50 "
            f"{first['p50'] * 1000:.0f} ms, last tenth p50 {last['p50'] * 1000:.0f} ms"
        )
        print(f"  projected at 2 GiB left:    ~{den['projected_count']} workspaces by PSS")
    floor = result["floors"]
    sandbox = floor["sandbox_true_s"]
    print(
        f"\nFloors (same run): bwrap ... /bin/true p50 {sandbox['p50'] * 1000:.1f} ms, p99 "
        f"{sandbox['p99'] * 1000:.1f} ms; idle sleep in bwrap {floor['idle_sleep_pss_mib']:.2f} MiB PSS"
    )
    if floor.get("sandbox_true_in_cgroups_s"):
        caged = floor["sandbox_true_in_cgroups_s"]
        print(
            f"  the same moved into cgroups of its own first (as every guest): p50 {caged['p50'] * 1000:.1f} ms, "
            f"p99 {caged['p99'] * 1000:.1f} ms; create p50 / that floor = {lat['ready_s']['p50'] / caged['p50']:.1f}"
        )
    print(
        f"  create p99 {result['process_create_p99_ms']:.1f} ms, first exec p50 "
        f"{result['process_first_exec_p50_ms']:.1f} ms, idle {result['process_idle_mib']:.2f} MiB; "
        f"create p50 / floor p50 = {result['process_create_floor_ratio']:.1f}, "
        f"idle / floor = {result['process_idle_floor_ratio']:.1f}"
    )
    if "breakdown_ms" in lat:
        breakdown.print_breakdown(lat["breakdown_ms"])
    clean = result["cleanup"]
    print(
        f"\nCleanup: {clean['deleted']} deleted in {clean['delete_all_s']:.1f} s, "
        f"{clean['processes_left']} processes left, {len(clean['cgroups_left'])} cgroups left, "
        f"{len(clean['delete_errors'])} errors"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.process_runtime", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=30, help="workspaces for the latency figures (default 30)")
    parser.add_argument("--max-idle", type=int, default=300, help="at most this many idle workspaces (default 300)")
    parser.add_argument("--memory-mib", type=int, default=16, help="memory of each idle workspace (default 16)")
    parser.add_argument(
        "--idle-s", type=float, default=60.0, help="how long the last idle workspace made is idle when measured (60)"
    )
    parser.add_argument("--min-available-gib", type=float, default=2.0, help="stop under this MemAvailable (2)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--breakdown", action="store_true", help="also time each step of every create (the median per step)"
    )
    parser.add_argument("--floor-runs", type=int, default=30, help="runs of the bwrap floor (default 30)")
    parser.add_argument(
        "--supervisor", choices=("auto", "instance", "node"), default="auto", help="the server's --supervisor (auto)"
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("bwrap"):
        print("needs root and bubblewrap (apt-get install -y bubblewrap)", file=sys.stderr)
        return 2

    root = Path(tempfile.mkdtemp(prefix="kibo-procbench-"))
    server = Server(
        root / "data",
        timings=args.breakdown,
        env={"KIBO_JOB_DOOR_IDLE_S": str(DOOR_IDLE_S)},
        supervisor=args.supervisor,
    )
    created: list[str] = []
    result: dict[str, Any] = {
        "command": " ".join(["python -m bench.process_runtime", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {
            "cpus": os.cpu_count(),
            "mem_total_gib": int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024,
            "kernel": platform.release(),
            "loadavg_at_start": os.getloadavg(),
        },
        "memory_mib": args.memory_mib,
        "server_flags": server.flags,
    }
    try:
        print(f"floors: bwrap ... /bin/true x {args.floor_runs}, 10 idle sleeps in bwrap", flush=True)
        result["floors"] = breakdown.floors(args.floor_runs, 10)
        server.start()
        with kibotos.Client(server.address, timeout=60) as client:
            result["runtime"] = [c for c in client.get_capabilities() if c.startswith("runtime.")]
            print(f"latency: {args.count} workspaces, one at a time", flush=True)
            timed = server.data_dir.resolve() if args.breakdown else None
            result["latency"] = latency(client, args.count, args.memory_mib, created, timed)
            print(f"density: idle {args.memory_mib} MiB workspaces, up to {args.max_idle}", flush=True)
            found = density(client, server, args, created)
    finally:
        # Also after an error or Ctrl-C: delete everything, then check nothing is left.
        print("cleaning up: deleting every workspace created here", flush=True)
        result["cleanup"] = clean = clean_up(server, created)
        failed = bool(clean["processes_left"] or clean["cgroups_left"] or clean["delete_errors"])
        print(
            f"cleanup: {clean['deleted']} deleted, {clean['processes_left']} processes left (killed), "
            f"{len(clean['cgroups_left'])} cgroups left, {len(clean['delete_errors'])} errors",
            flush=True,
        )
        if failed:
            print(f"cleanup was incomplete: {clean}; kept {root} (server.log)", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    data = asdict(found)
    count = found.count
    data["create_s"] = summary(found.create_s)
    tenth = max(1, count // 10)
    data["create_first_tenth_s"] = summary(found.create_s[:tenth])
    data["create_last_tenth_s"] = summary(found.create_s[-tenth:])
    data["command_s"] = summary(found.command_s)
    total = found.pss_supervisors_mib + found.pss_guests_mib + found.pss_fork_server_mib + found.pss_doors_mib
    data["pss_per_workspace_mib"] = total / count if count else 0.0
    drop = found.mem_available_before_mib - found.mem_available_after_mib
    data["mem_available_drop_per_workspace_mib"] = drop / count if count else 0.0
    per = max(data["pss_per_workspace_mib"], data["mem_available_drop_per_workspace_mib"])
    spare = found.mem_available_before_mib - args.min_available_gib * 1024
    data["projected_count"] = int(spare / per) if per else 0
    result["density"] = data
    lat, floor = result["latency"], result["floors"]
    # The issue's figures, and the create's ratio to the same run's floor (medians).
    result["process_create_p99_ms"] = lat["ready_s"]["p99"] * 1000
    result["process_first_exec_p50_ms"] = lat["first_command_s"]["p50"] * 1000
    result["process_idle_mib"] = data["pss_per_workspace_mib"]
    result["process_create_floor_ratio"] = lat["ready_s"]["p50"] / floor["sandbox_true_s"]["p50"]
    if floor.get("sandbox_true_in_cgroups_s"):
        result["process_create_cgroup_floor_ratio"] = lat["ready_s"]["p50"] / floor["sandbox_true_in_cgroups_s"]["p50"]
    result["process_idle_floor_ratio"] = (
        data["pss_per_workspace_mib"] / floor["idle_sleep_pss_mib"] if floor["idle_sleep_pss_mib"] else 0.0
    )
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
