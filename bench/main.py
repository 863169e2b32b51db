"""`bench/run [--quick] [--json FILE]`: measure kibo against its ceiling (see bench/README.md).

The server (`kibo-ctrl serve --sim-step-ms 0`), the ceiling server and the load generators
are separate processes on loopback. Comparisons are ratios measured in the same run,
alternating the two sides; figures are medians over repetitions."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kibo.ctrl.v1 import workspace_service_pb2 as ws

from . import figures, report
from .figures import GET
from .seed import Template, seed
from .server import Ceiling, Server
from .stats import median, ratio


@dataclass(frozen=True)
class Plan:
    quick: bool
    sizes: tuple[int, ...]  # stored workspaces for the growth runs; the first is the baseline
    get_reps: int  # figure 1 repetitions at the baseline size
    growth_reps: int  # figure 1 and 3 repetitions at the other sizes
    seconds: float  # per repetition of a throughput run
    h2load_reps: int
    list_reps: int
    lifecycle_count: int  # figure 2 at the baseline size
    growth_lifecycle_count: int
    create_reps: int
    scale_reps: int
    watchers: int
    watch_processes: int
    watch_cycles: int

    @classmethod
    def full(cls) -> Plan:
        return cls(
            quick=False,
            sizes=(1_000, 10_000, 100_000),
            get_reps=5,
            growth_reps=3,
            seconds=3.0,
            h2load_reps=3,
            list_reps=3,
            lifecycle_count=1000,
            growth_lifecycle_count=300,
            create_reps=3,
            scale_reps=4,
            watchers=5000,
            watch_processes=4,
            watch_cycles=4,
        )

    @classmethod
    def quick_plan(cls) -> Plan:
        return cls(
            quick=True,
            sizes=(1_000, 10_000),
            get_reps=3,
            growth_reps=1,
            seconds=1.5,
            h2load_reps=2,
            list_reps=0,  # the scale phase measures List at both sizes
            lifecycle_count=200,
            growth_lifecycle_count=100,
            create_reps=2,
            scale_reps=2,
            watchers=5000,
            watch_processes=4,
            watch_cycles=1,
        )


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, plan: Plan, work: Path) -> None:
        self.plan = plan
        self.work = work
        self.base = work / "base"  # the seeded store, grown size by size
        self.sizes: dict[int, dict[str, Any]] = {}
        self.figure1: dict[str, Any] = {}
        self.h2load: dict[str, Any] = {}
        self.connect: dict[str, Any] = {}
        self.figure2: dict[str, Any] = {}
        self.watch: dict[str, Any] = {}
        self.scale: dict[str, Any] = {}
        self.templates: list[Template] = []

    def server(self, data_dir: Path, settle_ms: float | None = None) -> Server:
        return Server(data_dir, self.work / "server.log", settle_ms=settle_ms)

    def run(self) -> None:
        log(f"work directory {self.work}")
        first = self.server(self.base)
        first.start()
        try:
            running = figures.make_workspace(first, f"bench-seed/{uuid.uuid4()}")
            stopped = figures.make_workspace(first, f"bench-seed/{uuid.uuid4()}", stop=True)
            self.templates = [Template(*running), Template(*stopped)]
            payload = self.work / "ceiling-payload.bin"
            payload.write_bytes(figures.raw_get(first, running[0]))
        finally:
            first.stop()
        ceiling = Ceiling(payload, self.work / "ceiling.log")
        ceiling.start()
        try:
            for n, size in enumerate(self.plan.sizes):
                self.size_phase(size, baseline=n == 0, ceiling=ceiling)
            self.scale_phase()
            self.watch_phase(ceiling)
        finally:
            ceiling.stop()

    def size_phase(self, size: int, baseline: bool, ceiling: Ceiling) -> None:
        plan = self.plan
        stored, seed_s = seed(self.base, self.templates, max(0, size - _count(self.base, self.templates)))
        log(f"{stored:,} workspaces stored (seeding took {seed_s:.1f}s)")
        if size in (self.plan.sizes[0], self.plan.sizes[-1]):
            shutil.copytree(self.base, self.pristine(size))  # for the scale phase
        work = self.work / f"store-{size}"
        shutil.copytree(self.base, work)
        out: dict[str, Any] = {"stored": stored, "seed_s": seed_s}
        try:
            server = self.server(work)
            out["restart_to_serving_s"] = server.start()
            out["server_rss_mib_start"] = server.rss_mib()
            try:
                sample = figures.walk(server, ids=1000, pages=200)
                out["list_all_s"] = sample.seconds
                kibo, top = figures.kibo_target(server), figures.ceiling_target(ceiling, server.token)
                gets = [ws.GetWorkspaceRequest(workspace_id=i).SerializeToString() for i in sample.ids]
                reps = plan.get_reps if baseline else plan.growth_reps
                log(f"{size:,}: GetWorkspace vs ceiling, {reps} x {plan.seconds}s each")
                out["get"] = figures.ceiling_ratio(kibo, top, gets, reps, plan.seconds)
                if baseline:
                    log(f"{size:,}: h2load second opinion")
                    self.h2load = figures.h2load_ratio(kibo, top, gets[0], plan.h2load_reps, plan.seconds, self.work)
                    log(f"{size:,}: Connect vs gRPC (h2load)")
                    self.connect = figures.connect_ratio(server, gets[0], plan.h2load_reps, plan.seconds, self.work)
                if plan.list_reps:
                    log(f"{size:,}: ListWorkspaces(page_size=100), tokens from every depth")
                    out["list"] = figures.summarize(
                        [
                            figures.unary_load(kibo, LIST, sample.list_requests, plan.seconds, 8)
                            for _ in range(plan.list_reps)
                        ]
                    )
                out["server_rss_mib_after_reads"] = server.rss_mib()
                count = plan.lifecycle_count if baseline else plan.growth_lifecycle_count
                log(f"{size:,}: lifecycle, {count} creates then {count} stops, one at a time")
                out["lifecycle"] = figures.lifecycle(server, count, f"bench-life/{uuid.uuid4().hex[:8]}")
                log(f"{size:,}: creates answered when AVAILABLE, 64 clients")
                out["creates_settled"] = figures.settled_creates(
                    server, plan.create_reps if baseline else plan.growth_reps, plan.seconds
                )
            finally:
                server.stop()
            server = self.server(work, settle_ms=0)
            out["restart_to_serving_s_2"] = server.start()
            try:
                log(f"{size:,}: durable creates answered at commit, 64 clients")
                out["creates_durable"] = figures.durable_creates(
                    server, plan.create_reps if baseline else plan.growth_reps, plan.seconds
                )
                out["server_rss_mib_end"] = server.rss_mib()
            finally:
                server.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self.sizes[size] = out

    def pristine(self, size: int) -> Path:
        return self.work / f"pristine-{size}"

    def scale_phase(self) -> None:
        """Figure 4: a server on the smallest store and one on the largest, both up, the same
        loads alternating between them: Get at 64 in flight, List(page_size=100) at 8."""
        plan = self.plan
        small, large = plan.sizes[0], plan.sizes[-1]
        servers = {small: self.server(self.pristine(small)), large: self.server(self.pristine(large))}
        out: dict[str, Any] = {"sizes": [small, large]}
        try:
            out["restart_to_serving_s"] = {}
            out["restart_to_first_create_s"] = {}
            for size, server in servers.items():
                began = time.monotonic()
                out["restart_to_serving_s"][size] = server.start()
                # SERVING is not the whole story: startup work in the engine delays commands.
                figures.make_workspace(server, f"bench-restart/{uuid.uuid4()}")
                out["restart_to_first_create_s"][size] = time.monotonic() - began
            out["server_rss_mib_start"] = {size: server.rss_mib() for size, server in servers.items()}
            walks = {size: figures.walk(server, ids=1000, pages=200) for size, server in servers.items()}
            out["list_all_s"] = {size: w.seconds for size, w in walks.items()}
            log(f"scale: {small:,} and {large:,} stored, alternating, {plan.scale_reps} x {plan.seconds}s")
            runs: dict[str, dict[int, list[dict[str, Any]]]] = {"get": {}, "list": {}}
            for _ in range(plan.scale_reps):
                for size, server in servers.items():
                    target = figures.kibo_target(server)
                    gets = [ws.GetWorkspaceRequest(workspace_id=i).SerializeToString() for i in walks[size].ids]
                    runs["get"].setdefault(size, []).append(
                        figures.unary_load(target, GET, gets, plan.seconds, figures.IN_FLIGHT)
                    )
                    runs["list"].setdefault(size, []).append(
                        figures.unary_load(target, LIST, walks[size].list_requests, plan.seconds, 8)
                    )
            for kind, by_size in runs.items():
                out[kind] = {size: figures.summarize(r) for size, r in by_size.items()}
                for stat in ("p50_ms", "p99_ms", "qps"):
                    pairs = zip(by_size[large], by_size[small], strict=True)
                    out[kind][f"{stat}_ratio"] = median([ratio(b[stat], a[stat]) for b, a in pairs])
            out["server_rss_mib_after_reads"] = {size: server.rss_mib() for size, server in servers.items()}
        finally:
            for server in servers.values():
                server.stop()
        self.scale = out

    def watch_phase(self, ceiling: Ceiling) -> None:
        plan = self.plan
        server = self.server(self.work / "watch")
        server.start()
        # grpc-core lets 100 streams share a connection; keep under that.
        channels = math.ceil(plan.watchers / plan.watch_processes / 90)
        try:
            log(f"watchers: {plan.watchers} WatchWorkspace streams on one workspace")
            self.watch = figures.watchers(
                server,
                plan.watchers,
                processes=plan.watch_processes,
                channels_per_process=channels,
                cycles=plan.watch_cycles,
                pause=0.2,
            )
        finally:
            server.stop()
        # The floor: the same streams and load generators on the bare grpc.aio server, which
        # sends as many changes, in bursts as kibo's commands make them (one encoding each).
        bursts = 2 * plan.watch_cycles
        per_burst = max(1, round(self.watch["changes"] / bursts))
        log(f"watchers: the same on the ceiling, {bursts} bursts of {per_burst} changes")
        self.watch["ceiling"] = figures.watchers_ceiling(
            ceiling,
            plan.watchers,
            processes=plan.watch_processes,
            channels_per_process=channels,
            bursts=bursts,
            per_burst=per_burst,
            pause=0.2,
        )


LIST = "/kibo.ctrl.v1.WorkspaceService/ListWorkspaces"
assert GET.endswith("GetWorkspace")


def _count(data_dir: Path, templates: list[Template]) -> int:
    total, _ = seed(data_dir, templates, 0)
    return total


def figures_json(bench: Bench, elapsed: float, command: str) -> dict[str, Any]:
    plan = bench.plan
    sizes = bench.sizes
    small, large = plan.sizes[0], plan.sizes[-1]
    base = sizes[small]

    scale = bench.scale

    durable = base["creates_durable"]
    out: dict[str, Any] = {
        "rpc_ceiling_ratio": base["get"]["ratio"],
        "get_qps": base["get"]["kibo"]["qps"],
        "get_p50_ms": base["get"]["kibo"]["p50_ms"],
        "get_p99_ms": base["get"]["kibo"]["p99_ms"],
        "ceiling_qps": base["get"]["ceiling"]["qps"],
        "ceiling_p50_ms": base["get"]["ceiling"]["p50_ms"],
        "ceiling_p99_ms": base["get"]["ceiling"]["p99_ms"],
        "rpc_ceiling_ratio_h2load": bench.h2load.get("ratio"),
        "rpc_ceiling_cpu_ratio": base["get"]["cpu_ratio"],
        "get_server_cpu_us_per_call": base["get"]["kibo"]["server_cpu_us_per_call"],
        "ceiling_server_cpu_us_per_call": base["get"]["ceiling"]["server_cpu_us_per_call"],
        "create_to_available_p50_ms": base["lifecycle"]["create_to_available_p50_ms"],
        "create_to_available_p99_ms": base["lifecycle"]["create_to_available_p99_ms"],
        "stop_to_stopped_p50_ms": base["lifecycle"]["stop_to_stopped_p50_ms"],
        "stop_to_stopped_p99_ms": base["lifecycle"]["stop_to_stopped_p99_ms"],
        "durable_creates_per_s": durable["per_s"],
        "durable_creates_to_available_per_s": durable["to_available_per_s"],
        "durable_creates_ceiling_ratio": ratio(durable["per_s"], base["get"]["ceiling"]["qps"]),
        "settled_creates_per_s": base["creates_settled"]["per_s"],
        "scale_size": large,
        "scale_get_ratio_100k_vs_1k": scale["get"]["p50_ms_ratio"],
        "scale_get_p99_ratio_100k_vs_1k": scale["get"]["p99_ms_ratio"],
        "scale_list_ratio_100k_vs_1k": scale["list"]["p50_ms_ratio"],
        "scale_list_p99_ratio_100k_vs_1k": scale["list"]["p99_ms_ratio"],
        "get_p50_ms_1k": scale["get"][small]["p50_ms"],
        "get_p50_ms_100k": scale["get"][large]["p50_ms"],
        "list_p50_ms_1k": scale["list"][small]["p50_ms"],
        "list_p50_ms_100k": scale["list"][large]["p50_ms"],
        "server_rss_mib_1k": scale["server_rss_mib_after_reads"][small],
        "server_rss_mib_100k": scale["server_rss_mib_after_reads"][large],
        "restart_to_serving_s_1k": scale["restart_to_serving_s"][small],
        "restart_to_serving_s_100k": scale["restart_to_serving_s"][large],
        "restart_to_first_create_available_s_1k": scale["restart_to_first_create_s"][small],
        "restart_to_first_create_available_s_100k": scale["restart_to_first_create_s"][large],
        "watch_fanout_p99_ms": bench.watch["fanout_p99_ms"],
        "watch_delivery_p99_ms": bench.watch["delivery_p99_ms"],
        "watch_streams": bench.watch["streams"],
        "watch_server_rss_mib": bench.watch["server_rss_mib_after_changes"],
        "watch_fanout_ceiling_p99_ms": bench.watch["ceiling"]["fanout_p99_ms"],
        "watch_fanout_ceiling_ratio": ratio(bench.watch["fanout_p99_ms"], bench.watch["ceiling"]["fanout_p99_ms"]),
        "watch_server_cpu_us_per_message": bench.watch["server_cpu_us_per_message"],
        "watch_ceiling_cpu_us_per_message": bench.watch["ceiling"]["server_cpu_us_per_message"],
        "connect_vs_grpc_ratio": bench.connect.get("ratio"),
        "connect_qps": bench.connect.get("connect_qps"),
        "notes": {
            "connect_vs_grpc_ratio": (
                f"null: {bench.connect['skipped']}"
                if "skipped" in bench.connect
                else "GetWorkspace QPS, Connect (binary, HTTP/1.1, 64 connections) / gRPC (1 connection, 64 streams),"
                " both driven by h2load against the same server"
            ),
            "scale": (
                f"--quick: the scale figures compare {large:,} stored workspaces with {small:,} "
                "(keys keep the _100k_vs_1k names)"
                if plan.quick and large != 100_000
                else f"{large:,} stored workspaces against {small:,}"
            ),
            "scale_ratios": (
                "p50 latency with N stored / with 1k, two servers up side by side, loads alternating; Get at 64 "
                "in flight over 1,000 IDs drawn from the whole store, List(page_size=100) at 8 in flight from "
                "page tokens at every depth"
            ),
            "rpc_ceiling_ratio": (
                "GetWorkspace QPS / the ceiling's, the same requests to both (the bearer token too, which the "
                "ceiling ignores: before issue 14 the ceiling got none, and the client's cost of sending it was "
                "charged to kibo alone)"
            ),
            "durable_creates_per_s": "answered at commit (--settle-ms 0): durably recorded, PENDING",
            "watch_fanout_p99_ms": "per stored change: its update_time to the last of all streams receiving it",
            "watch_fanout_ceiling_ratio": (
                "kibo's fan-out p99 / the bare grpc.aio server's, same streams and load generators, as many "
                "changes in bursts of the same size (bench/ceiling.py Burst)"
            ),
            "durable_creates_ceiling_ratio": "durable creates/s at 64 clients / the ceiling's Get QPS, same run",
        },
        "goals": report.goals(),
        "quick": plan.quick,
        "plan": asdict(plan),
        "sizes": {str(k): v for k, v in sizes.items()},
        "scale": scale,
        "h2load": bench.h2load,
        "connect": bench.connect,
        "watch": bench.watch,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_end": list(os.getloadavg()),
            "python": sys.version.split()[0],
        },
        "elapsed_s": elapsed,
        "command": command,
    }
    cleaned: dict[str, Any] = _clean(out)
    return cleaned


def _clean(value: Any) -> Any:
    """NaN is not JSON: make it null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts; finishes in under two minutes")
    parser.add_argument("--json", type=Path, help="write every figure to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (stores, logs)")
    args = parser.parse_args(argv)
    plan = Plan.quick_plan() if args.quick else Plan.full()
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kibo-bench-run-"))
    bench = Bench(plan, work)
    ok = False
    try:
        bench.run()
        ok = True
    finally:
        if not ok or args.keep:
            log(f"logs and stores kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    command = "bench/run" + (" --quick" if args.quick else "") + (f" --json {args.json}" if args.json else "")
    result = figures_json(bench, time.monotonic() - began, command)
    print(report.table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        log(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
