"""Soak: kill -9 the server at random points under mixed load, for N minutes (local runs, not CI).

    .venv/bin/python -m bench.soak --minutes 2 [--seed S] [--workers W]

Each round runs W clients sending random lifecycle commands, kills the server with SIGKILL
after a random 0.2-1.5 s, checks the files it left (integrity), restarts it, then checks:
every command acknowledged before the kill is found, every unfinished command reaches a
terminal state, no workspace stays transitional, every workspace's events feed has no gap.
The same checks as tests/system/test_durability.py::test_kill_9_under_load_loses_no_acknowledged_command.
Exit status 1 if anything was lost, stuck, out of order, or answered INTERNAL/UNKNOWN."""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import TERMINAL, Client, meta
from tests.server import ServerProcess
from tests.system.test_durability import STEADY, feed_gaps, integrity_of_copy, list_all

BAD = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


@dataclass
class Totals:
    rounds: int = 0
    commands: int = 0  # calls sent
    kills: int = 0
    acknowledged: int = 0
    lost: int = 0
    internal: int = 0  # INTERNAL or UNKNOWN answers
    stuck: int = 0  # commands or workspaces that did not settle after a restart
    gaps: int = 0  # events-feed problems
    corrupt: int = 0  # integrity checks that failed
    problems: list[str] = field(default_factory=list)


@dataclass
class Round:
    acknowledged: dict[str, str] = field(default_factory=dict)  # command ID -> workspace ID
    commands: int = 0
    internal: int = 0


async def worker(client: Client, rng: random.Random, workspaces: list[str], load: Round, totals: Totals) -> None:
    """Random mixed lifecycle commands until the server goes away."""
    while True:
        workspace_id = rng.choice(workspaces) if workspaces else ""
        choice = rng.random() if len(workspaces) >= 4 else 0.0
        request: Any
        if choice < 0.2:
            method, request = client.ws.CreateWorkspace, ws.CreateWorkspaceRequest(metadata=meta())
        elif choice < 0.45:
            mode = ws.STOP_MODE_FORCE if rng.random() < 0.3 else ws.STOP_MODE_GRACEFUL
            request = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, mode=mode)
            method = client.ws.StopWorkspace
        elif choice < 0.8:
            method = client.ws.StartWorkspace
            request = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
        elif choice < 0.9:
            method = client.ws.DeleteWorkspace
            request = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
        else:
            method = client.ws.SetWorkspaceLabels
            request = ws.SetWorkspaceLabelsRequest(
                metadata=meta(), workspace_id=workspace_id, labels={"n": str(rng.randrange(100))}
            )
        load.commands += 1
        try:
            response = await method(request)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                return  # killed
            if error.code() in BAD:
                load.internal += 1
                totals.problems.append(f"{type(request).__name__}: {error.code().name} {error.details()}")
            continue
        load.acknowledged[request.metadata.command_id] = response.workspace.workspace_id
        if isinstance(request, ws.CreateWorkspaceRequest):
            workspaces.append(response.workspace.workspace_id)


async def settle_and_check(client: Client, unfinished: set[str], load: Round, totals: Totals) -> tuple[int, int]:
    """After a restart: lost, stuck and feed problems of this round; (lost, gaps)."""
    lost = 0
    for command_id, workspace_id in load.acknowledged.items():
        try:
            command = await client.command(command_id)
        except grpc.aio.AioRpcError as error:
            lost += 1
            totals.problems.append(f"lost {command_id}: {error.code().name}")
            continue
        if command.workspace_id != workspace_id:
            lost += 1
            totals.problems.append(f"{command_id} now belongs to {command.workspace_id}, not {workspace_id}")
        if command.state not in TERMINAL:
            unfinished.add(command_id)
    deadline = time.monotonic() + 20
    while unfinished and time.monotonic() < deadline:
        for command_id in list(unfinished):
            if (await client.command(command_id)).state in TERMINAL:
                unfinished.discard(command_id)
        await asyncio.sleep(0.05)
    workspaces = await list_all(client)
    while time.monotonic() < deadline:
        if all(w.state in STEADY for w in workspaces):
            break
        await asyncio.sleep(0.05)
        workspaces = await list_all(client)
    stuck = len(unfinished) + sum(w.state not in STEADY for w in workspaces)
    if stuck:
        totals.problems.append(f"{stuck} commands/workspaces did not settle")
    unfinished.clear()
    gaps = 0
    for workspace in workspaces:
        problems = feed_gaps(workspace, await client.events(workspace.workspace_id))
        gaps += len(problems)
        totals.problems += problems
    totals.stuck += stuck
    return lost, gaps


async def soak(minutes: float, seed: int, workers: int) -> Totals:
    rng = random.Random(seed)
    totals = Totals()
    workspaces: list[str] = []
    unfinished: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="kibo-soak-") as scratch:
        # Slow steps, no settle wait: commands are answered PENDING and are executing when killed.
        server = ServerProcess(Path(scratch) / "data", ("--sim-step-ms", "30", "--settle-ms", "0"))
        await asyncio.to_thread(server.start)
        end = time.monotonic() + minutes * 60
        try:
            while time.monotonic() < end:
                load = Round()
                async with Client.connect(server.address) as client:
                    tasks = [
                        asyncio.create_task(worker(client, random.Random(rng.random()), workspaces, load, totals))
                        for _ in range(workers)
                    ]
                    await asyncio.sleep(rng.uniform(0.2, 1.5))
                    await asyncio.to_thread(server.kill)
                    await asyncio.wait_for(asyncio.gather(*tasks), 10)
                totals.kills += 1
                integrity = integrity_of_copy(server.data_dir)
                if integrity != "ok":
                    totals.corrupt += 1
                    totals.problems.append(f"integrity after kill {totals.kills}: {integrity}")
                await asyncio.to_thread(server.start)
                async with Client.connect(server.address) as client:
                    lost, gaps = await settle_and_check(client, unfinished, load, totals)
                totals.rounds += 1
                totals.commands += load.commands
                totals.acknowledged += len(load.acknowledged)
                totals.lost += lost
                totals.gaps += gaps
                totals.internal += load.internal
                print(
                    f"round {totals.rounds:3d}: {load.commands:4d} commands, {len(load.acknowledged):4d} acknowledged, "
                    f"{lost} lost, {load.internal} INTERNAL, {gaps} feed gaps, {len(workspaces)} workspaces",
                    flush=True,
                )
        finally:
            await asyncio.to_thread(server.stop)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"soak: {args.minutes} min, seed {seed}, {args.workers} workers", flush=True)
    totals = asyncio.run(soak(args.minutes, seed, args.workers))
    rows = [
        ("rounds", totals.rounds),
        ("commands", totals.commands),
        ("kills", totals.kills),
        ("acknowledged", totals.acknowledged),
        ("lost", totals.lost),
        ("INTERNAL/UNKNOWN", totals.internal),
        ("stuck", totals.stuck),
        ("feed gaps", totals.gaps),
        ("integrity failures", totals.corrupt),
    ]
    print()
    print("| figure | count |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for problem in totals.problems[:20]:
        print("problem:", problem)
    bad = totals.lost + totals.internal + totals.stuck + totals.gaps + totals.corrupt
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
