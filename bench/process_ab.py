"""Two process runtimes side by side on a shared, noisy machine: `python -m bench.process_ab
--a PYTHON [--b PYTHON] [--b-env K=V] [--a-supervisor MODE] [--b-supervisor MODE] [--rounds N]`.

Each side is a `kibo-ctrl serve --runtime process` of its own (PYTHON: the interpreter of a
checkout's venv, e.g. /work/main/.venv/bin/python; default: this one) on its own data
directory. The rounds alternate A, B, A, B, ...: one workspace at a time, create ->
AVAILABLE, a first command, stop, delete (as bench/process_runtime.py's latency run), so
both see the same load over time; a `bwrap ... /bin/true` floor is measured in every
round too. Prints p50/p99 per side and each side's p50 over the floor's p50. Needs root and
bubblewrap; deletes everything it made and checks nothing is left (as process_runtime)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kibotos

from bench import process_breakdown
from bench.process_runtime import AVAILABLE, Server, clean_up, create, first_command, summary


def _round(client: kibotos.Client, created: list[str], into: dict[str, list[float]]) -> None:
    started = time.perf_counter()
    workspace = create(client, 16, created)
    into["ready"].append(time.perf_counter() - started)
    if workspace.state != AVAILABLE:
        raise RuntimeError(f"ended {kibotos.state_name(workspace.state)}: {workspace.failure}")
    into["first_command"].append(first_command(client, workspace.workspace_id, into["exec_only"]))
    stopped = client.stop_workspace(workspace.workspace_id)
    client.wait_workspace(workspace.workspace_id, stopped.command.command_id, timeout=120)
    deleted = client.delete_workspace(workspace.workspace_id)
    client.wait_workspace_deleted(workspace.workspace_id, deleted.command.command_id, timeout=120)
    created.remove(workspace.workspace_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.process_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", default=sys.executable, help="side A's python (a checkout's venv)")
    parser.add_argument("--b", default=sys.executable, help="side B's python (default: this one)")
    parser.add_argument("--b-env", action="append", default=[], help="K=V in side B's environment")
    for side in ("a", "b"):
        parser.add_argument(
            f"--{side}-supervisor", choices=("auto", "instance", "node"), default="auto", help="its --supervisor"
        )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kibo-procab-"))
    b_env = dict(item.split("=", 1) for item in args.b_env)
    sides = {
        "A": Server(root / "a" / "data", python=args.a, supervisor=args.a_supervisor),
        "B": Server(root / "b" / "data", python=args.b, env=b_env, supervisor=args.b_supervisor),
    }
    created: dict[str, list[str]] = {name: [] for name in sides}
    times: dict[str, dict[str, list[float]]] = {
        name: {"ready": [], "first_command": [], "exec_only": []} for name in sides
    }
    floor: list[float] = []
    failed = False
    try:
        for server in sides.values():
            server.data_dir.mkdir(parents=True)
            server.start()
        clients = {name: kibotos.Client(server.address, timeout=60) for name, server in sides.items()}
        for index in range(args.rounds):
            floor += process_breakdown.sandbox_floor(1)
            for name in ("A", "B") if index % 2 == 0 else ("B", "A"):
                _round(clients[name], created[name], times[name])
            print(f"  round {index + 1}/{args.rounds}", flush=True)
        for client in clients.values():
            client.close()
    finally:
        for name, server in sides.items():
            clean = clean_up(server, created[name])
            failed = failed or bool(clean["processes_left"] or clean["cgroups_left"] or clean["delete_errors"])
        if not failed:
            shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {"command": " ".join(["python -m bench.process_ab", *(argv or sys.argv[1:])])}
    result["floor_s"] = summary(floor)
    print(f"\nfloor (bwrap ... /bin/true): p50 {result['floor_s']['p50'] * 1000:.1f} ms")
    for name in sides:
        result[name] = {key: summary(values) for key, values in times[name].items()}
        ready, first = result[name]["ready"], result[name]["first_command"]
        print(
            f"{name}: create -> AVAILABLE p50 {ready['p50'] * 1000:.0f} ms, p99 {ready['p99'] * 1000:.0f} ms "
            f"({ready['p50'] / result['floor_s']['p50']:.1f} x floor); first command p50 {first['p50'] * 1000:.0f} ms "
            f"(exec alone {result[name]['exec_only']['p50'] * 1000:.0f} ms)"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
