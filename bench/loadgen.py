"""The load generator: a separate process (several, when one Python client is the
bottleneck) speaking gRPC to the server over loopback with grpc.aio.

Protocol with the orchestrator (bench/workers.py): the first stdin line is a JSON spec;
the worker connects and warms up, prints "ready", waits for a line "go" on stdin, runs,
and prints one JSON line with its results. Requests are pre-serialized bytes, so the
client spends as little CPU per call as a Python client can."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

SERVICE = "/kibo.ctrl.v1.WorkspaceService/"
AVAILABLE = wp.WORKSPACE_STATE_AVAILABLE
STOPPED = wp.WORKSPACE_STATE_STOPPED
OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 * 1024 * 1024)]

Raw = Callable[[bytes], Awaitable[bytes]]


def channel(target: str) -> grpc.aio.Channel:
    # A local subchannel pool: each channel is its own HTTP/2 connection.
    return grpc.aio.insecure_channel(target, options=OPTIONS)


def auth(spec: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The bearer token the orchestrator read from the server's data directory, if any."""
    token = spec.get("token")
    return (("authorization", f"Bearer {token}"),) if token else ()


def raw_method(chan: grpc.aio.Channel, name: str, metadata: tuple[tuple[str, str], ...] = ()) -> Raw:
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = chan.unary_unary(
        SERVICE + name if not name.startswith("/") else name
    )

    async def invoke(request: bytes) -> bytes:
        return await call(request, metadata=metadata)

    return invoke


async def _line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def _emit(value: Any) -> None:
    sys.stdout.write((value if isinstance(value, str) else json.dumps(value)) + "\n")
    sys.stdout.flush()


async def _closed_loop(
    invoke: Callable[[int], Awaitable[None]], concurrency: int, seconds: float, count: int = 0
) -> float:
    """Run `invoke(i)` from `concurrency` tasks until `seconds` pass (or `count` calls are made)."""
    deadline = time.perf_counter() + seconds
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while time.perf_counter() < deadline and (count == 0 or issued < count):
            issued += 1
            await invoke(issued)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - began


async def unary(spec: dict[str, Any]) -> dict[str, Any]:
    """`concurrency` calls in flight of one method, cycling through pre-serialized requests."""
    requests = [base64.b64decode(r) for r in spec["requests"]]
    channels = [channel(spec["target"]) for _ in range(spec.get("channels", 1))]
    methods = [raw_method(c, spec["method"], auth(spec)) for c in channels]
    latencies: list[float] = []
    errors = 0
    sizes = 0
    record = True

    async def call(i: int) -> None:
        nonlocal errors, sizes
        began = time.perf_counter()
        try:
            reply = await methods[i % len(methods)](requests[i % len(requests)])
        except grpc.aio.AioRpcError:
            errors += 1
            return
        if record:
            latencies.append(time.perf_counter() - began)
            sizes += len(reply)

    record = False
    await _closed_loop(call, spec["concurrency"], spec.get("warmup", 0.5))
    _emit("ready")
    await _line()
    latencies.clear()
    errors = 0
    record = True
    elapsed = await _closed_loop(call, spec["concurrency"], spec["seconds"])
    for c in channels:
        await c.close()
    return {
        "count": len(latencies),
        "errors": errors,
        "elapsed": elapsed,
        "mean_reply_bytes": sizes / max(1, len(latencies)),
        "latencies_ms": [round(x * 1000, 3) for x in latencies],
    }


def create_request(prefix: str, labels: dict[str, str] | None = None) -> bytes:
    return ws.CreateWorkspaceRequest(
        metadata=wp.CommandMetadata(command_id=f"{prefix}/{uuid.uuid4()}"),
        spec=wp.WorkspaceSpec(labels=labels or {"bench": "1"}),
    ).SerializeToString()


async def creates(spec: dict[str, Any]) -> dict[str, Any]:
    """`concurrency` clients, each sending CreateWorkspace as soon as its last one was answered."""
    channels = [channel(spec["target"]) for _ in range(spec.get("channels", 1))]
    methods = [raw_method(c, "CreateWorkspace", auth(spec)) for c in channels]
    latencies: list[float] = []
    states: dict[str, int] = {}
    errors = 0

    async def call(i: int) -> None:
        nonlocal errors
        request = create_request(spec["prefix"])
        began = time.perf_counter()
        try:
            reply = ws.CreateWorkspaceResponse.FromString(await methods[i % len(methods)](request))
        except grpc.aio.AioRpcError:
            errors += 1
            return
        latencies.append(time.perf_counter() - began)
        name = wp.WorkspaceState.Name(reply.workspace.state)
        states[name] = states.get(name, 0) + 1

    await _closed_loop(call, 4, 0, count=4)  # connect, warm
    latencies.clear()
    states.clear()
    _emit("ready")
    await _line()
    elapsed = await _closed_loop(call, spec["concurrency"], spec["seconds"])
    for c in channels:
        await c.close()
    return {
        "count": len(latencies),
        "errors": errors,
        "elapsed": elapsed,
        "states": states,
        "latencies_ms": [round(x * 1000, 3) for x in latencies],
    }


async def _until_state(get: Raw, workspace_id: str, state: int) -> None:
    request = ws.GetWorkspaceRequest(workspace_id=workspace_id).SerializeToString()
    # Polling the server is the point here: the state lives there.
    while ws.GetWorkspaceResponse.FromString(await get(request)).workspace.state != state:  # noqa: ASYNC110
        await asyncio.sleep(0.001)


async def lifecycle(spec: dict[str, Any]) -> dict[str, Any]:
    """One client: `count` creates, each timed until the workspace is AVAILABLE; then a stop
    of each, timed until STOPPED. A command call answers once its command finished (the
    server's settle window), so the answer usually carries the final state; when it does
    not, the client polls GetWorkspace and the poll time counts."""
    chan = channel(spec["target"])
    create, stop, get = (raw_method(chan, m, auth(spec)) for m in ("CreateWorkspace", "StopWorkspace", "GetWorkspace"))
    concurrency = spec.get("concurrency", 1)
    ids: list[str] = []
    create_ms: list[float] = []
    stop_ms: list[float] = []
    polled = 0
    for _ in range(3):  # connect, warm
        await create(create_request(spec["prefix"]))
    _emit("ready")
    await _line()

    async def create_one(i: int) -> None:
        nonlocal polled
        began = time.perf_counter()
        reply = ws.CreateWorkspaceResponse.FromString(await create(create_request(spec["prefix"])))
        if reply.workspace.state != AVAILABLE:
            polled += 1
            await _until_state(get, reply.workspace.workspace_id, AVAILABLE)
        create_ms.append((time.perf_counter() - began) * 1000)
        ids.append(reply.workspace.workspace_id)

    async def stop_one(i: int) -> None:
        nonlocal polled
        workspace_id = ids[i - 1]
        request = ws.StopWorkspaceRequest(
            metadata=wp.CommandMetadata(command_id=f"{spec['prefix']}/stop-{uuid.uuid4()}"), workspace_id=workspace_id
        ).SerializeToString()
        began = time.perf_counter()
        reply = ws.StopWorkspaceResponse.FromString(await stop(request))
        if reply.workspace.state != STOPPED:
            polled += 1
            await _until_state(get, workspace_id, STOPPED)
        stop_ms.append((time.perf_counter() - began) * 1000)

    await _closed_loop(create_one, concurrency, 1e9, count=spec["count"])
    await _closed_loop(stop_one, concurrency, 1e9, count=len(ids))
    await chan.close()
    return {"create_ms": create_ms, "stop_ms": stop_ms, "polled": polled}


async def watch(spec: dict[str, Any]) -> dict[str, Any]:
    """`streams` WatchWorkspace streams over `channels` connections, spread over the given
    workspaces. For every snapshot (workspace, etag) it records when each stream got it,
    as delay after the snapshot's update_time (the server's commit-batch clock)."""
    channels = [channel(spec["target"]) for _ in range(spec["channels"])]
    calls: list[grpc.aio.UnaryStreamMultiCallable[bytes, bytes]] = [
        c.unary_stream(SERVICE + "WatchWorkspace") for c in channels
    ]
    ids: list[str] = spec["workspace_ids"]
    # (workspace_id, etag) -> [update_time, count, last delivery]
    seen: dict[tuple[str, str], list[float]] = {}
    delays: list[float] = []
    latest: dict[int, int] = {}
    recording = False

    failed: list[str] = []
    dead: set[int] = set()
    opened = 0

    async def stream(n: int) -> None:
        nonlocal opened
        workspace_id = ids[n % len(ids)]
        request = ws.WatchWorkspaceRequest(workspace_id=workspace_id).SerializeToString()
        call = calls[n % len(calls)](request, metadata=auth(spec))
        got_first = False
        try:
            async for raw in call:
                now = time.time()
                message = ws.WatchWorkspaceResponse.FromString(raw).workspace
                latest[n] = int(message.etag)
                if not got_first:
                    got_first = True
                    opened += 1
                    continue
                if not recording:
                    continue
                update = message.update_time.seconds + message.update_time.nanos / 1e9
                entry = seen.setdefault((workspace_id, message.etag), [update, 0, 0.0])
                entry[1] += 1
                entry[2] = max(entry[2], now)
                delays.append(now - update)
        except grpc.aio.AioRpcError as error:
            failed.append(f"{error.code().name}: {error.details()}")
            dead.add(n)
        finally:
            if not got_first:
                opened += 1  # counted as settled, so the ramp goes on

    # Open the streams in steps of 100, each once the last step's streams are answered:
    # grpc-core cancels calls beyond its pending-request limit (grpc.server.max_pending_requests,
    # 1000 by default) when thousands arrive at once.
    tasks: list[asyncio.Task[None]] = []
    deadline = time.monotonic() + spec.get("open_timeout", 120)
    for n in range(spec["streams"]):
        tasks.append(asyncio.create_task(stream(n)))
        if len(tasks) % 100 == 0 or len(tasks) == spec["streams"]:
            while opened < len(tasks) and time.monotonic() < deadline:  # noqa: ASYNC110 - a deadline
                await asyncio.sleep(0.005)
    recording = True
    _emit("ready")
    # {"until": {workspace_id: etag}}: wait until every stream has seen that etag, then report.
    until: dict[str, int] = {k: int(v) for k, v in json.loads(await _line())["until"].items()}
    targets = [until.get(ids[n % len(ids)], 0) for n in range(len(tasks))]

    def behind() -> int:
        return sum(1 for n, target in enumerate(targets) if latest.get(n, 0) < target and n not in dead)

    deadline = time.monotonic() + spec.get("drain_timeout", 60)
    while time.monotonic() < deadline and behind():  # noqa: ASYNC110 - a deadline, checked often
        await asyncio.sleep(0.01)
    lagging = behind()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in channels:
        await c.close()
    return {
        "snapshots": {f"{k[0]}|{k[1]}": v for k, v in seen.items()},
        "delays_ms": [round(d * 1000, 3) for d in delays],
        "lagging": lagging,
        "failed": len(failed),
        "failures": sorted(set(failed))[:5],
    }


MODES: dict[str, Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]] = {
    "unary": unary,
    "creates": creates,
    "lifecycle": lifecycle,
    "watch": watch,
}


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    result = asyncio.run(MODES[spec["mode"]](spec))
    _emit(result)


if __name__ == "__main__":
    main()
