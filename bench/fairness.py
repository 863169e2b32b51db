"""One tenant's heavy lists against another tenant's point reads (issue 10, finding 11).

Starts a real `kibo-ctrl serve --runtime sim` with tokens, gives tenant `heavy` WORKSPACES
workspaces with labels, and measures tenant `light`'s GetWorkspaceCommand latency and its
CreateWorkspace latency (the writer) alone, then while `heavy` runs LISTERS concurrent
ListWorkspaces loops with a filter of N terms that every row must evaluate
(`labels.kI != "x"` ... and a last term that matches nothing). Prints medians. Run it
against another checkout's server with `--server-path DIR` (prepended to PYTHONPATH, e.g.
/work/main/server:/work/main/gen) to compare before/after:

    .venv/bin/python -m bench.fairness --terms 990 --terms 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc

from bench.server import free_port


def token(data_dir: Path, tenant: str, env: dict[str, str]) -> str:
    command = [sys.executable, "-m", "kibo_ctrl", "token", "create", "--data-dir", str(data_dir), "--tenant", tenant]
    return subprocess.run(command, capture_output=True, text=True, check=True, env=env, timeout=60).stdout.strip()


def wait_serving(address: str, process: subprocess.Popen[bytes]) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(400):
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise TimeoutError("server not SERVING")


def heavy_filter(terms: int) -> str:
    # Every term but the last is true for every row, so SQLite evaluates all of them.
    parts = [f'labels.k{i} != "x"' for i in range(terms - 1)]
    return " AND ".join([*parts, 'labels.team = "nobody"'])


async def seed(stub: ws_grpc.WorkspaceServiceStub, metadata: tuple[tuple[str, str], ...], count: int) -> None:
    semaphore = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        request = ws.CreateWorkspaceRequest(
            metadata=wp.CommandMetadata(command_id=f"seed-{uuid.uuid4().hex}"),
            spec=wp.WorkspaceSpec(labels={"team": f"t{i % 10}", "k1": "v", "k2": "v"}),
        )
        async with semaphore:
            while True:
                try:
                    await stub.CreateWorkspace(request, metadata=metadata)
                    return
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    await asyncio.sleep(0.05)  # the per-tenant rate limit: resend

    await asyncio.gather(*(one(i) for i in range(count)))


async def latencies(
    stub: ws_grpc.WorkspaceServiceStub, metadata: tuple[tuple[str, str], ...], command_id: str, samples: int
) -> list[float]:
    times = []
    for _ in range(samples):
        begin = time.perf_counter()
        await stub.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=command_id), metadata=metadata)
        times.append((time.perf_counter() - begin) * 1000)
        await asyncio.sleep(0.005)
    return times


async def create_latencies(
    stub: ws_grpc.WorkspaceServiceStub, metadata: tuple[tuple[str, str], ...], samples: int
) -> list[float]:
    """The writer's side: CreateWorkspace answered once recorded (--settle-ms 0)."""
    times = []
    for _ in range(samples):
        request = ws.CreateWorkspaceRequest(metadata=wp.CommandMetadata(command_id=f"light-{uuid.uuid4().hex}"))
        begin = time.perf_counter()
        await stub.CreateWorkspace(request, metadata=metadata)
        times.append((time.perf_counter() - begin) * 1000)
        await asyncio.sleep(0.005)
    return times


async def lister(
    stub: ws_grpc.WorkspaceServiceStub, metadata: tuple[tuple[str, str], ...], text: str, stop: asyncio.Event
) -> tuple[int, dict[str, int]]:
    calls, outcomes = 0, {}
    while not stop.is_set():
        try:
            await stub.ListWorkspaces(ws.ListWorkspacesRequest(filter=text, page_size=50), metadata=metadata)
            name = "OK"
        except grpc.aio.AioRpcError as error:
            name = error.code().name
        outcomes[name] = outcomes.get(name, 0) + 1
        calls += 1
    return calls, outcomes


async def measure(args: argparse.Namespace, address: str, heavy_token: str, light_token: str) -> None:
    heavy = (("authorization", f"Bearer {heavy_token}"),)
    light = (("authorization", f"Bearer {light_token}"),)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ws_grpc.WorkspaceServiceStub(channel)
        begin = time.monotonic()
        await seed(stub, heavy, args.workspaces)
        print(f"seeded {args.workspaces} workspaces for tenant heavy in {time.monotonic() - begin:.1f} s")
        created = await stub.CreateWorkspace(
            ws.CreateWorkspaceRequest(metadata=wp.CommandMetadata(command_id="light-1")), metadata=light
        )
        command_id = created.command.command_id
        await latencies(stub, light, command_id, 20)  # warm up
        alone = await latencies(stub, light, command_id, args.samples)
        writes = await create_latencies(stub, light, args.samples // 4)
        print(f"light GetWorkspaceCommand alone: p50 {statistics.median(alone):.2f} ms")
        print(f"light CreateWorkspace alone: p50 {statistics.median(writes):.2f} ms")
        for terms in args.terms:
            stop = asyncio.Event()
            text = heavy_filter(terms)
            tasks = [asyncio.create_task(lister(stub, heavy, text, stop)) for _ in range(args.listers)]
            await asyncio.sleep(0.5)
            loaded = await latencies(stub, light, command_id, args.samples)
            writes = await create_latencies(stub, light, args.samples // 4)
            stop.set()
            results = await asyncio.gather(*tasks)
            outcomes: dict[str, int] = {}
            for _, counts in results:
                for name, n in counts.items():
                    outcomes[name] = outcomes.get(name, 0) + n
            print(
                f"light GetWorkspaceCommand with {args.listers} heavy lists of {terms} terms "
                f"({len(text)} chars): p50 {statistics.median(loaded):.2f} ms, "
                f"p90 {statistics.quantiles(loaded, n=10)[-1]:.2f} ms; CreateWorkspace p50 "
                f"{statistics.median(writes):.2f} ms; heavy lists answered: {outcomes}"
            )


def run(args: argparse.Namespace) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="kibo-fairness-")) / "data"
    env = dict(os.environ)
    if args.server_path:
        env["PYTHONPATH"] = args.server_path + os.pathsep + env.get("PYTHONPATH", "")
    address = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "kibo_ctrl", "serve", "--listen", address, "--http-listen", ""]
    # A port of its own for the node link (the default 50053 would clash with another server's).
    command += ["--node-listen", "127.0.0.1:0"]
    command += ["--data-dir", str(data_dir), "--runtime", "sim", "--sim-step-ms", "0", "--settle-ms", "0"]
    command += ["--log-level", "warning", "--node-vcpus", "100000000", "--node-memory-mib", "100000000000"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_serving(address, process)
        asyncio.run(measure(args, address, token(data_dir, "heavy", env), token(data_dir, "light", env)))
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(data_dir.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspaces", type=int, default=3000)
    parser.add_argument("--listers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--terms", type=int, action="append", help="filter terms (repeat); default 990 and 32")
    parser.add_argument("--server-path", default="", help="PYTHONPATH entries for the server (another checkout)")
    args = parser.parse_args()
    args.terms = args.terms or [990, 32]
    run(args)


if __name__ == "__main__":
    main()
