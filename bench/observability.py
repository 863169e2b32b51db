"""`python -m bench.observability [--quick] [--json FILE]`: what metrics and traces cost.

Three arms, each its own `kibo-ctrl serve` process: metrics off (`--metrics off`: nothing
counted), metrics on (`--metrics open`: counting as with the default `operator`, which only
adds a token check to the scrape, so the end-of-run scrape needs no operator token), and
metrics on + traces sampled
at 100 % (OTLP/HTTP export, `OTEL_TRACES_SAMPLER=always_on`, to a sink on 127.0.0.1 that
accepts every batch and drops it: the spans are made, serialized and sent, as in
production). Two figures per arm: GetWorkspace throughput ÷ the bare grpc.aio ceiling
(bench/ceiling.py, each kibo run paired with a ceiling run right after it), and durable
creates/s (answered at commit, `--settle-ms 0`). Repetitions alternate between the arms
(the order rotated each round); figures are medians; each arm is reported as a ratio to
the metrics-off arm of the same run."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kibo.ctrl.v1 import workspace_service_pb2 as ws
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from . import figures
from .server import ROOT, Ceiling, Server, wait_serving
from .stats import median, ratio

ARMS = ("metrics off", "metrics on", "metrics + traces 100%")


@dataclass(frozen=True)
class Plan:
    quick: bool
    get_reps: int  # GetWorkspace ÷ ceiling pairs per arm
    create_reps: int  # durable-create runs per arm
    seconds: float  # per run

    @classmethod
    def of(cls, quick: bool) -> Plan:
        return cls(quick=True, get_reps=5, create_reps=3, seconds=1.0) if quick else cls(False, 7, 5, 3.0)


def log(message: str) -> None:
    print(f"[observability {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class _Sink(BaseHTTPRequestHandler):
    """Accepts an OTLP/HTTP export and drops it (counting what arrived)."""

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        stats: SinkStats = self.server.stats  # type: ignore[attr-defined]
        with stats.lock:
            stats.exports += 1
            stats.received_bytes += length
            stats.bodies.append(body)  # parsed after the run, not while it is measured
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class SinkStats:
    exports: int = 0
    received_bytes: int = 0
    bodies: list[bytes] = field(default_factory=list, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class OtlpSink:
    """An OTLP/HTTP trace endpoint on 127.0.0.1 (a thread of this process)."""

    def __init__(self) -> None:
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
        self.stats = SinkStats()
        self.http.stats = self.stats  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/v1/traces"

    def __enter__(self) -> OtlpSink:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.http.shutdown()
        self.http.server_close()


@dataclass
class ArmServer(Server):
    """bench's Server with this arm's --metrics flag and OTEL_* environment."""

    metrics: str = "open"
    environ: dict[str, str] = field(default_factory=dict)

    def command(self) -> list[str]:
        return [*super().command(), "--metrics", self.metrics]

    def start(self, timeout: float = 120.0) -> float:
        # Server.start with this arm's environment (tracing.from_env reads it at startup).
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | self.environ
        with open(self.log_path, "ab") as log_file:
            began = time.monotonic()
            self.process = subprocess.Popen(
                self.command(), stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT, env=env
            )
        try:
            wait_serving(self.address, timeout, self.process)
        except BaseException:
            self.kill()
            raise
        return time.monotonic() - began

    def scrape(self) -> str:
        """GET /metrics (open access)."""
        with urllib.request.urlopen(f"http://{self.http_address}/metrics", timeout=10) as reply:
            text: str = reply.read().decode()
            return text


def arm_servers(work: Path, sink: OtlpSink) -> dict[str, ArmServer]:
    traces = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
        # Export as fast as spans come, so the queue never drops any (the default 2048-span
        # queue, flushed every 5 s, would drop spans at these rates and hide their cost).
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_BSP_MAX_QUEUE_SIZE": "65536",
    }
    settings = {ARMS[0]: ("off", {}), ARMS[1]: ("open", {}), ARMS[2]: ("open", traces)}
    servers = {}
    for i, (arm, (metrics, environ)) in enumerate(settings.items()):
        (work / f"arm{i}").mkdir()
        servers[arm] = ArmServer(work / f"arm{i}", work / f"arm{i}.log", settle_ms=0, metrics=metrics, environ=environ)
    return servers


def rounds(reps: int) -> list[tuple[str, ...]]:
    """The arms' order in each round, rotated so no arm always runs first or last."""
    return [tuple(ARMS[(r + i) % len(ARMS)] for i in range(len(ARMS))) for r in range(reps)]


def measure(plan: Plan, work: Path) -> dict[str, Any]:
    with OtlpSink() as sink:
        servers = arm_servers(work, sink)
        ceiling: Ceiling | None = None
        try:
            for arm, server in servers.items():
                log(f"starting {arm}: {server.start():.1f}s")
            # One AVAILABLE workspace per server; the ceiling answers the same bytes kibo does.
            gets: dict[str, bytes] = {}
            for arm, server in servers.items():
                workspace_id, _ = figures.make_workspace(server, f"bench-obs/{uuid.uuid4()}")
                gets[arm] = ws.GetWorkspaceRequest(workspace_id=workspace_id).SerializeToString()
            payload = work / "ceiling-payload.bin"
            payload.write_bytes(
                figures.raw_get(servers[ARMS[0]], ws.GetWorkspaceRequest.FromString(gets[ARMS[0]]).workspace_id)
            )
            ceiling = Ceiling(payload, work / "ceiling.log")
            ceiling.start()
            top = figures.ceiling_target(ceiling)
            get_runs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {arm: [] for arm in ARMS}
            log(f"GetWorkspace ÷ ceiling: {plan.get_reps} rounds x 3 arms x {plan.seconds}s")
            for order in rounds(plan.get_reps):
                for arm in order:
                    kibo = figures.kibo_target(servers[arm])
                    k = figures.unary_load(kibo, figures.GET, [gets[arm]], plan.seconds, figures.IN_FLIGHT)
                    c = figures.unary_load(top, figures.GET, [gets[arm]], plan.seconds, figures.IN_FLIGHT)
                    get_runs[arm].append((k, c))
            create_runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
            log(f"durable creates: {plan.create_reps} rounds x 3 arms x {plan.seconds}s")
            for order in rounds(plan.create_reps):
                for arm in order:
                    figures.wait_quiet(servers[arm])
                    create_runs[arm].append(figures.creates(servers[arm], plan.seconds))
                    figures.wait_quiet(servers[arm])
            checks = sanity(servers, sink)
        finally:
            if ceiling is not None:
                ceiling.stop()
            for server in servers.values():
                server.stop()
        return {"arms": summarize(get_runs, create_runs), "checks": checks}


def sanity(servers: dict[str, ArmServer], sink: OtlpSink) -> dict[str, Any]:
    """Proof each arm is what it says: /metrics counted the calls (or is absent), spans arrived."""
    counted: dict[str, float | str] = {}
    for arm, server in servers.items():
        try:
            text = server.scrape()
        except OSError as error:
            counted[arm] = f"no /metrics ({error})"
            continue
        counted[arm] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("kibo_rpc_handled_total{") and 'method="GetWorkspace"' in line
        )
    # The last batch of spans leaves within OTEL_BSP_SCHEDULE_DELAY.
    time.sleep(0.5)
    with sink.stats.lock:
        spans: dict[str, int] = {}
        for body in sink.stats.bodies:
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        spans[span.name] = spans.get(span.name, 0) + 1
        return {
            "get_workspace_counted": counted,
            "otlp_exports": sink.stats.exports,
            "otlp_bytes": sink.stats.received_bytes,
            "spans_received": dict(sorted(spans.items(), key=lambda kv: -kv[1])),
        }


def summarize(
    get_runs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]], create_runs: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        pairs = get_runs[arm]
        out[arm] = {
            "get_ceiling_ratio": median([ratio(k["qps"], c["qps"]) for k, c in pairs]),
            "get_qps": median([k["qps"] for k, _ in pairs]),
            "ceiling_qps": median([c["qps"] for _, c in pairs]),
            "get_p99_ms": median([k["p99_ms"] for k, _ in pairs]),
            "get_server_cpu_us_per_call": median(
                [k["server_cpu_us_per_call"] for k, _ in pairs if k["server_cpu_us_per_call"]]
            ),
            "get_ratios": [round(ratio(k["qps"], c["qps"]), 3) for k, c in pairs],
            "get_errors": sum(k["errors"] for k, _ in pairs),
            "durable_creates_per_s": median([r["per_s"] for r in create_runs[arm]]),
            "durable_creates_p99_ms": median([r["p99_ms"] for r in create_runs[arm]]),
            "durable_creates_runs": [round(r["per_s"], 1) for r in create_runs[arm]],
            "create_errors": sum(r["errors"] for r in create_runs[arm]),
        }
    base = out[ARMS[0]]
    for arm in ARMS:
        out[arm]["get_vs_off"] = ratio(out[arm]["get_ceiling_ratio"], base["get_ceiling_ratio"])
        out[arm]["creates_vs_off"] = ratio(out[arm]["durable_creates_per_s"], base["durable_creates_per_s"])
    return out


def table(result: dict[str, Any]) -> str:
    rows = [
        f"{'arm':<24}{'Get ÷ ceiling':>15}{'vs off':>9}{'Get/s':>9}{'µs CPU/Get':>12}{'creates/s':>11}{'vs off':>9}",
    ]
    for arm, f in result["arms"].items():
        rows.append(
            f"{arm:<24}{f['get_ceiling_ratio']:>15.3f}{f['get_vs_off']:>9.3f}{f['get_qps']:>9.0f}"
            f"{f['get_server_cpu_us_per_call']:>12.0f}{f['durable_creates_per_s']:>11.0f}{f['creates_vs_off']:>9.3f}"
        )
    checks = result["checks"]
    rows.append(
        f"checks: GetWorkspace counted by /metrics {checks['get_workspace_counted']}; "
        f"OTLP exports received {checks['otlp_exports']} ({checks['otlp_bytes']:,} bytes)"
    )
    rows.append(f"spans received by name: {checks['spans_received']}")
    return "\n".join(rows)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.observability", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repetitions (about 90 s)")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    plan = Plan.of(args.quick)
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kibo-bench-obs-"))
    ok = False
    try:
        result = measure(plan, work)
        ok = True
    finally:
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"logs and stores kept in {work}")
    result |= {
        "plan": asdict(plan),
        "elapsed_s": time.monotonic() - began,
        "loadavg_end": list(os.getloadavg()),
        "command": "python -m bench.observability" + (" --quick" if args.quick else ""),
    }
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(_clean(result), indent=2) + "\n")
        log(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
