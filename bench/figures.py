"""Each figure: drive the servers through load-generator processes, return plain dicts."""

from __future__ import annotations

import base64
import contextlib
import os
import random
import struct
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc

from . import h2load, workers
from .ceiling import BURST
from .server import Ceiling, Server, rss_mib
from .stats import median, percentile, ratio

GET = "/kibo.ctrl.v1.WorkspaceService/GetWorkspace"
IN_FLIGHT = 64


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = (*(base.metadata or ()), *metadata)
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


class _Auth(grpc.UnaryUnaryClientInterceptor):
    """Adds the bearer token to every call of the orchestrator's own (synchronous) client."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def intercept_unary_unary(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(_Details(details, self._metadata), request)


@contextlib.contextmanager
def connect(server: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as channel:
        yield grpc.intercept_channel(channel, _Auth(server.metadata))


def stub_of(channel: grpc.Channel) -> Any:
    """The generated stub (untyped)."""
    return ws_grpc.WorkspaceServiceStub(channel)  # type: ignore[no-untyped-call]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Target:
    name: str
    address: str
    pid: int
    token: str | None = None


def unary_load(
    target: Target, method: str, requests: list[bytes], seconds: float, concurrency: int, processes: int = 1
) -> dict[str, Any]:
    """Closed-loop load: `concurrency` calls in flight (split over processes) for `seconds`."""
    spec: dict[str, Any] = {
        "mode": "unary",
        "target": target.address,
        "method": method,
        "requests": [b64(r) for r in requests],
        "seconds": seconds,
        "warmup": 0.3,
        "token": target.token,
    }
    specs = []
    for i in range(processes):
        share = concurrency // processes + (1 if i < concurrency % processes else 0)
        # Each process starts at another place in the request list.
        offset = i * len(requests) // processes
        specs.append({**spec, "concurrency": share, "requests": spec["requests"][offset:] + spec["requests"][:offset]})
    cpu0 = cpu_seconds(target.pid)
    results = workers.run(specs)
    cpu1 = cpu_seconds(target.pid)
    count = sum(r["count"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    latencies = [x for r in results for x in r["latencies_ms"]]
    return {
        "qps": count / elapsed if elapsed else 0.0,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "count": count,
        "errors": sum(r["errors"] for r in results),
        "server_cpu_us_per_call": (cpu1 - cpu0) / count * 1e6 if count else None,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions of the figures of unary_load."""
    keys = ("qps", "p50_ms", "p99_ms", "server_cpu_us_per_call")
    out: dict[str, Any] = {k: median([r[k] for r in runs if r[k] is not None]) for k in keys}
    out["errors"] = sum(r["errors"] for r in runs)
    out["reps"] = len(runs)
    return out


def ceiling_ratio(kibo: Target, ceiling: Target, requests: list[bytes], reps: int, seconds: float) -> dict[str, Any]:
    """Figure 1: GetWorkspace at 64 in flight against the ceiling, alternating, same run."""
    pairs = []
    for _ in range(reps):
        k = unary_load(kibo, GET, requests, seconds, IN_FLIGHT)
        c = unary_load(ceiling, GET, requests, seconds, IN_FLIGHT)
        pairs.append((k, c))
    return {
        "kibo": summarize([k for k, _ in pairs]),
        "ceiling": summarize([c for _, c in pairs]),
        "ratio": median([ratio(k["qps"], c["qps"]) for k, c in pairs]),
        "ratios": [round(ratio(k["qps"], c["qps"]), 3) for k, c in pairs],
        # Server CPU per call, ceiling / kibo: the same comparison, blind to a client bottleneck.
        "cpu_ratio": median(
            [
                ratio(c["server_cpu_us_per_call"], k["server_cpu_us_per_call"])
                for k, c in pairs
                if k["server_cpu_us_per_call"] and c["server_cpu_us_per_call"]
            ]
        ),
        "client": f"1 Python grpc.aio process, 1 connection, {IN_FLIGHT} calls in flight",
    }


def h2load_ratio(
    kibo: Target, ceiling: Target, request: bytes, reps: int, seconds: float, work: Path
) -> dict[str, Any]:
    """Figure 1, second opinion: the same comparison driven by h2load."""
    if h2load.available() is None:
        return {"skipped": "h2load not found: install Debian's nghttp2-client for this second opinion"}
    body = work / "get-request.grpc"
    body.write_bytes(h2load.frame(request))
    headers = (*h2load.GRPC_HEADERS, *_auth_headers(kibo.token))
    pairs = []
    for _ in range(reps):
        k = h2load.run(kibo.address, GET, body, seconds, headers=headers)
        # The same request, headers included: the ceiling ignores the token.
        c = h2load.run(ceiling.address, GET, body, seconds, headers=headers)
        pairs.append((k, c))
    return {
        "kibo_qps": median([k.qps for k, _ in pairs]),
        "ceiling_qps": median([c.qps for _, c in pairs]),
        "kibo_mean_ms": median([k.mean_ms for k, _ in pairs]),
        "ceiling_mean_ms": median([c.mean_ms for _, c in pairs]),
        "ratio": median([ratio(k.qps, c.qps) for k, c in pairs]),
        "failed": sum(k.failed + c.failed for k, c in pairs),
        "reps": reps,
        "client": f"h2load, 1 connection, {IN_FLIGHT} streams, pre-framed request",
    }


def _auth_headers(token: str | None) -> tuple[str, ...]:
    return (f"authorization: Bearer {token}",) if token else ()


def connect_probe(server: Server, request: bytes) -> str | None:
    """None if the server answers Connect (binary proto over HTTP/1.1), else why not."""
    headers = {"content-type": "application/proto"}
    if server.token:
        headers["authorization"] = f"Bearer {server.token}"
    url = f"http://{server.http_address}{GET}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=request, headers=headers), timeout=10) as reply:
            if reply.status == 200 and ws.GetWorkspaceResponse.FromString(reply.read()).workspace.workspace_id:
                return None
            return f"{url} answered HTTP {reply.status}"
    except (OSError, ValueError) as error:
        return f"no Connect endpoint at {url}: {error}"


def connect_ratio(server: Server, request: bytes, reps: int, seconds: float, work: Path) -> dict[str, Any]:
    """Figure 6: GetWorkspace through Connect (binary proto, HTTP/1.1, 64 connections) against
    gRPC (HTTP/2, 1 connection, 64 streams), both driven by h2load, alternating, same server."""
    if h2load.available() is None:
        return {"skipped": "h2load not found: install Debian's nghttp2-client"}
    why = connect_probe(server, request)
    if why is not None:
        return {"skipped": why}
    grpc_body, connect_body = work / "get-request.grpc", work / "get-request.proto"
    grpc_body.write_bytes(h2load.frame(request))
    connect_body.write_bytes(request)
    token = _auth_headers(server.token)
    pairs = []
    for _ in range(reps):
        g = h2load.run(server.address, GET, grpc_body, seconds, headers=(*h2load.GRPC_HEADERS, *token))
        c = h2load.run(
            server.http_address,
            GET,
            connect_body,
            seconds,
            connections=IN_FLIGHT,
            headers=(*h2load.CONNECT_HEADERS, *token),
            http1=True,
        )
        pairs.append((g, c))
    return {
        "grpc_qps": median([g.qps for g, _ in pairs]),
        "connect_qps": median([c.qps for _, c in pairs]),
        "grpc_mean_ms": median([g.mean_ms for g, _ in pairs]),
        "connect_mean_ms": median([c.mean_ms for _, c in pairs]),
        "ratio": median([ratio(c.qps, g.qps) for g, c in pairs]),
        "failed": sum(g.failed + c.failed for g, c in pairs),
        "reps": reps,
        "client": "h2load: gRPC 1 connection x 64 streams; Connect (application/proto) HTTP/1.1 64 connections",
    }


@dataclass(frozen=True)
class Walk:
    ids: list[str]  # workspace IDs drawn from the whole collection
    list_requests: list[bytes]  # ListWorkspaces(page_size=100) from tokens at every depth
    rows: int
    seconds: float  # to list every workspace, 1000 a page


def walk(server: Server, ids: int, pages: int, seed: int = 7) -> Walk:
    """List the whole collection (page_size=1000): sample IDs, and page tokens at every depth."""
    rng = random.Random(seed)
    sample: list[str] = []
    tokens = [""]
    rows = 0
    began = time.monotonic()
    with connect(server) as channel:
        stub = stub_of(channel)
        token = ""
        while True:
            reply = stub.ListWorkspaces(ws.ListWorkspacesRequest(page_size=1000, page_token=token), timeout=60)
            for w in reply.workspaces:
                rows += 1
                if len(sample) < ids:
                    sample.append(w.workspace_id)
                elif (j := rng.randrange(rows)) < ids:
                    sample[j] = w.workspace_id
            token = reply.next_page_token
            if not token:
                break
            tokens.append(token)
    seconds = time.monotonic() - began
    chosen = [tokens[rng.randrange(len(tokens))] for _ in range(pages)]
    requests = [ws.ListWorkspacesRequest(page_size=100, page_token=t).SerializeToString() for t in chosen]
    rng.shuffle(sample)
    return Walk(sample, requests, rows, seconds)


def lifecycle(server: Server, count: int, prefix: str) -> dict[str, Any]:
    """Figure 2: CreateWorkspace -> AVAILABLE and StopWorkspace -> STOPPED, one client, one at a time."""
    spec = {"mode": "lifecycle", "target": server.address, "count": count, "prefix": prefix, "token": server.token}
    result = workers.run([spec])[0]
    create_ms, stop_ms = result["create_ms"], result["stop_ms"]
    return {
        "count": len(create_ms),
        "create_to_available_p50_ms": percentile(create_ms, 50),
        "create_to_available_p99_ms": percentile(create_ms, 99),
        "stop_to_stopped_p50_ms": percentile(stop_ms, 50),
        "stop_to_stopped_p99_ms": percentile(stop_ms, 99),
        "answers_not_final": result["polled"],
    }


def creates(server: Server, seconds: float, concurrency: int = IN_FLIGHT, processes: int = 1) -> dict[str, Any]:
    """64 clients, each sending CreateWorkspace as soon as its previous one was answered."""
    prefix = f"bench-create/{uuid.uuid4().hex[:8]}"
    specs = []
    for i in range(processes):
        share = concurrency // processes + (1 if i < concurrency % processes else 0)
        specs.append(
            {
                "mode": "creates",
                "target": server.address,
                "prefix": prefix,
                "concurrency": share,
                "seconds": seconds,
                "token": server.token,
            }
        )
    results = workers.run(specs)
    count = sum(r["count"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    latencies = [x for r in results for x in r["latencies_ms"]]
    states: dict[str, int] = {}
    for r in results:
        for k, v in r["states"].items():
            states[k] = states.get(k, 0) + v
    return {
        "per_s": count / elapsed if elapsed else 0.0,
        "count": count,
        "elapsed_s": elapsed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "errors": sum(r["errors"] for r in results),
        "answered_states": states,
    }


def wait_quiet(server: Server, timeout: float = 300.0) -> float:
    """Wait until no workspace is CREATING (the engine caught up); returns the seconds waited."""
    began = time.monotonic()
    with connect(server) as channel:
        stub = stub_of(channel)
        request = ws.ListWorkspacesRequest(page_size=1, filter="state = CREATING")
        while time.monotonic() - began < timeout:
            if not stub.ListWorkspaces(request, timeout=30).workspaces:
                break
            time.sleep(0.05)
    return time.monotonic() - began


def durable_creates(server: Server, reps: int, seconds: float) -> dict[str, Any]:
    """Figure 3 on a server answering at commit (--settle-ms 0): every answer is a command
    durably recorded (fsync'd), still PENDING. After each rep the engine's backlog is drained
    (all AVAILABLE), and the sustained rate counts that time too."""
    runs = []
    for _ in range(reps):
        wait_quiet(server)
        run = creates(server, seconds)
        drain = wait_quiet(server)
        run["drain_s"] = drain
        run["to_available_per_s"] = run["count"] / (run["elapsed_s"] + drain)
        runs.append(run)
    return {
        "per_s": median([r["per_s"] for r in runs]),
        "to_available_per_s": median([r["to_available_per_s"] for r in runs]),
        "p50_ms": median([r["p50_ms"] for r in runs]),
        "p99_ms": median([r["p99_ms"] for r in runs]),
        "errors": sum(r["errors"] for r in runs),
        "runs": [{k: v for k, v in r.items() if k != "answered_states"} for r in runs],
        "answered_states": runs[-1]["answered_states"] if runs else {},
    }


def settled_creates(server: Server, reps: int, seconds: float) -> dict[str, Any]:
    """Creates answered once the command finished (the default settle window): AVAILABLE."""
    runs = [creates(server, seconds) for _ in range(reps)]
    return {
        "per_s": median([r["per_s"] for r in runs]),
        "p50_ms": median([r["p50_ms"] for r in runs]),
        "p99_ms": median([r["p99_ms"] for r in runs]),
        "errors": sum(r["errors"] for r in runs),
        "answered_states": runs[-1]["answered_states"] if runs else {},
    }


def make_workspace(server: Server, command_id: str, stop: bool = False) -> tuple[str, tuple[str, ...]]:
    """One workspace through the API (AVAILABLE, or STOPPED); returns its ID and command IDs."""
    with connect(server) as channel:
        stub = stub_of(channel)
        reply = stub.CreateWorkspace(
            ws.CreateWorkspaceRequest(
                metadata=wp.CommandMetadata(command_id=command_id),
                spec=wp.WorkspaceSpec(labels={"bench": "seed"}),
            ),
            timeout=30,
        )
        workspace_id = reply.workspace.workspace_id
        _wait_state(stub, workspace_id, wp.WORKSPACE_STATE_AVAILABLE)
        if not stop:
            return workspace_id, (command_id,)
        stop_id = f"{command_id}-stop"
        stub.StopWorkspace(
            ws.StopWorkspaceRequest(metadata=wp.CommandMetadata(command_id=stop_id), workspace_id=workspace_id),
            timeout=30,
        )
        _wait_state(stub, workspace_id, wp.WORKSPACE_STATE_STOPPED)
        return workspace_id, (command_id, stop_id)


def _wait_state(stub: Any, workspace_id: str, state: int, timeout: float = 30) -> wp.Workspace:
    deadline = time.monotonic() + timeout
    while True:
        workspace: wp.Workspace = stub.GetWorkspace(
            ws.GetWorkspaceRequest(workspace_id=workspace_id), timeout=10
        ).workspace
        if workspace.state == state or time.monotonic() > deadline:
            if workspace.state != state:
                raise TimeoutError(f"{workspace_id} is {wp.WorkspaceState.Name(workspace.state)}, not {state}")
            return workspace
        time.sleep(0.005)


def raw_get(server: Server, workspace_id: str) -> bytes:
    with connect(server) as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(GET)
        reply: bytes = call(ws.GetWorkspaceRequest(workspace_id=workspace_id).SerializeToString(), timeout=10)
        return reply


def watchers(
    server: Server, streams: int, processes: int, channels_per_process: int, cycles: int, pause: float
) -> dict[str, Any]:
    """Figure 5: `streams` WatchWorkspace streams on one workspace; `cycles` stop+start commands
    each send a few stored changes to every stream. Per change: the delay until the last stream
    got it (from its update_time, the commit's clock). Server RSS with the streams open."""
    workspace_id, _ = make_workspace(server, f"bench-watch/{uuid.uuid4()}")

    def drive() -> int:
        with connect(server) as channel:
            stub = stub_of(channel)
            for i in range(cycles):
                for kind in ("stop", "start"):
                    meta = wp.CommandMetadata(command_id=f"bench-watch/{kind}-{i}-{uuid.uuid4()}")
                    if kind == "stop":
                        stub.StopWorkspace(
                            ws.StopWorkspaceRequest(metadata=meta, workspace_id=workspace_id), timeout=60
                        )
                        _wait_state(stub, workspace_id, wp.WORKSPACE_STATE_STOPPED, timeout=120)
                    else:
                        stub.StartWorkspace(
                            ws.StartWorkspaceRequest(metadata=meta, workspace_id=workspace_id), timeout=60
                        )
                        _wait_state(stub, workspace_id, wp.WORKSPACE_STATE_AVAILABLE, timeout=120)
                    time.sleep(pause)
            final = stub.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=workspace_id), timeout=10).workspace
        return int(final.etag)

    return _fanout(kibo_target(server), workspace_id, streams, processes, channels_per_process, drive)


def watchers_ceiling(
    ceiling: Ceiling, streams: int, processes: int, channels_per_process: int, bursts: int, per_burst: int, pause: float
) -> dict[str, Any]:
    """Figure 5's floor: the same streams and load generators on the bare grpc.aio server,
    which sends `bursts` bursts of `per_burst` changes (each serialized once for all streams),
    as kibo's commands do."""

    def drive() -> int:
        with grpc.insecure_channel(ceiling.address) as channel:
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(BURST)
            etag = 0
            for _ in range(bursts):
                (etag,) = struct.unpack(">Q", call(struct.pack(">I", per_burst), timeout=60))
                time.sleep(pause)
        return etag

    return _fanout(ceiling_target(ceiling), "ws-ceiling", streams, processes, channels_per_process, drive)


def _fanout(
    target: Target,
    workspace_id: str,
    streams: int,
    processes: int,
    channels_per_process: int,
    drive: Callable[[], int],
) -> dict[str, Any]:
    """Open the streams, `drive()` the changes (it returns the last etag), wait until every
    stream has seen it; per change, the delay until the last stream got it."""
    rss_before = rss_mib(target.pid)
    per = [streams // processes + (1 if i < streams % processes else 0) for i in range(processes)]
    specs = [
        {
            "mode": "watch",
            "target": target.address,
            "workspace_ids": [workspace_id],
            "streams": n,
            "channels": channels_per_process,
            "drain_timeout": 120,
            "token": target.token,
        }
        for n in per
    ]
    began = time.monotonic()
    pool = workers.Workers(specs)
    try:
        pool.ready()
        opened_s = time.monotonic() - began
        rss_open = rss_mib(target.pid)
        cpu0 = cpu_seconds(target.pid)
        final_etag = drive()
        rss_peak = rss_mib(target.pid)
        pool.send(f'{{"until": {{"{workspace_id}": {final_etag}}}}}')
        results = pool.results()
        cpu1 = cpu_seconds(target.pid)
    finally:
        pool.kill()
    snapshots: dict[str, list[float]] = {}
    for r in results:
        for key, (update, count, last) in r["snapshots"].items():
            entry = snapshots.setdefault(key, [update, 0, 0.0])
            entry[1] += count
            entry[2] = max(entry[2], last)
    all_ms = [(last - update) * 1000 for update, count, last in snapshots.values()]
    complete = [(last - update) * 1000 for update, count, last in snapshots.values() if count == streams]
    delays = [x for r in results for x in r["delays_ms"]]
    return {
        "streams": streams,
        "processes": processes,
        "connections": processes * channels_per_process,
        "open_s": opened_s,
        "changes": len(snapshots),
        "changes_seen_by_all": len(complete),
        "lagging_streams": sum(r["lagging"] for r in results),
        "failed_streams": sum(r["failed"] for r in results),
        "failures": sorted({f for r in results for f in r["failures"]}),
        "fanout_p50_ms": percentile(all_ms, 50),
        "fanout_p99_ms": percentile(all_ms, 99),
        "delivery_p50_ms": percentile(delays, 50),
        "delivery_p99_ms": percentile(delays, 99),
        # Server CPU per message delivered, from the first change to the last delivery.
        "server_cpu_us_per_message": (cpu1 - cpu0) / len(delays) * 1e6 if delays else None,
        "server_rss_mib_idle": rss_before,
        "server_rss_mib_streams_open": rss_open,
        "server_rss_mib_after_changes": rss_peak,
    }


def ceiling_target(ceiling: Ceiling, token: str | None = None) -> Target:
    """The ceiling as a target; with kibo's token, the load generators send both servers the
    same requests, headers included (the ceiling ignores it, as it ignores the body)."""
    return Target("ceiling", ceiling.address, ceiling.pid, token)


def kibo_target(server: Server) -> Target:
    return Target("kibo", server.address, server.pid, server.token)
