"""The tail of one call at a time, against its floors: `python -m bench.tail [--count N] [--rounds N]`.

Figure 2's goal is about a tail (create -> AVAILABLE p99 < 5 ms, simulator). This puts that
tail beside the same tail of calls that do less, in the same run, one client, one call at a
time, `--rounds` (3) rounds of `--count` (1,000) each, interleaved:

- GetWorkspace on the bare grpc.aio ceiling (bench/ceiling.py: a fixed answer from memory);
- GetWorkspace on kibo;
- CreateWorkspace on kibo (`--sim-step-ms 0`; the answer carries AVAILABLE);
- a single-row SQLite commit (WAL, synchronous=FULL) on the data directory's disk.

Prints p50, p99 and p99/p50 of each. When every one has the same p99/p50, the tail is this
machine's and the stack's, not a step of the create: the create's p99 follows its p50."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from bench.loadgen import channel, create_request, raw_method
from bench.server import ROOT, Server, free_port
from bench.stats import percentile


async def _timed(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        await call()
        times.append((time.perf_counter() - began) * 1000)
    return times


async def measure(work: Path, count: int, rounds: int) -> dict[str, list[float]]:
    server = Server(work / "data", work / "server.log")
    server.start_or_exit("kibo")
    ceiling: asyncio.subprocess.Process | None = None
    try:
        meta = server.metadata
        kibo = channel(server.address)
        create = raw_method(kibo, "CreateWorkspace", meta)
        get = raw_method(kibo, "GetWorkspace", meta)
        first = ws.CreateWorkspaceResponse.FromString(await create(create_request("tail")))
        (work / "payload").write_bytes(ws.GetWorkspaceResponse(workspace=first.workspace).SerializeToString())
        port = free_port()
        command = ["-m", "bench.ceiling", "--port", str(port), "--payload", str(work / "payload")]
        ceiling = await asyncio.create_subprocess_exec(sys.executable, *command, cwd=ROOT)
        bare = raw_method(channel(f"127.0.0.1:{port}"), "GetWorkspace", meta)
        request = ws.GetWorkspaceRequest(workspace_id=first.workspace.workspace_id).SerializeToString()
        deadline = time.monotonic() + 30
        while True:  # the ceiling is up when it answers
            try:
                await bare(request)
                break
            except grpc.aio.AioRpcError:  # not serving yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        db = sqlite3.connect(work / "commits.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t (k TEXT)")

        async def made() -> None:
            reply = ws.CreateWorkspaceResponse.FromString(await create(create_request("tail")))
            if reply.workspace.state != wp.WORKSPACE_STATE_AVAILABLE:
                raise RuntimeError(f"a create answered {reply.workspace.state}: raise the settle window")

        async def commit() -> None:
            db.execute("BEGIN")
            db.execute("INSERT INTO t VALUES (?)", (uuid.uuid4().hex,))
            db.execute("COMMIT")

        times: dict[str, list[float]] = {
            "GetWorkspace, bare grpc.aio ceiling": [],
            "GetWorkspace, kibo": [],
            "CreateWorkspace -> AVAILABLE, kibo": [],
            "SQLite commit, one row (WAL, FULL)": [],
        }
        calls = [lambda: bare(request), lambda: get(request), made, commit]
        for round_ in range(rounds):
            print(f"  round {round_ + 1}/{rounds}", flush=True)
            for name, call in zip(times, calls, strict=True):
                times[name] += await _timed(call, count)
        db.close()
        return times
    finally:
        if ceiling is not None:
            ceiling.terminate()
            await ceiling.wait()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tail", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="calls of each kind per round (1,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, interleaved (3)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kibo-tail-"))
    try:
        times = asyncio.run(measure(work, args.count, args.rounds))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'one at a time, ms':40}{'p50':>8}{'p99':>8}{'p99/p50':>9}")
    for name, values in times.items():
        p50, p99 = percentile(values, 50), percentile(values, 99)
        print(f"{name:40}{p50:8.2f}{p99:8.2f}{p99 / p50:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
