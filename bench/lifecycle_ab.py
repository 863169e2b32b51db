"""Figures 2 and 3 of two checkouts side by side on a shared, noisy machine: `python -m
bench.lifecycle_ab --b CHECKOUT [--rounds N] [--count N] [--durable-seconds S]`.

Side A is this checkout's server, side B another checkout's (its server/ and gen/; e.g. a
`git worktree add /tmp/old <commit>`), each a `kibo-ctrl serve --sim-step-ms 0` on its own
data directory. The rounds alternate A, B, A, B, ...: `count` workspaces one at a time,
create -> AVAILABLE and stop -> STOPPED (bench/figures.lifecycle), and with
`--durable-seconds` also durable creates/s from 64 clients on a second pair of servers
answering at commit (`--settle-ms 0`, bench/figures.durable_creates), so both sides see the
same load over time. Prints each side's medians over the rounds."""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench import figures
from bench.server import Server, ab_arguments

LIFECYCLE = ("create_to_available_p50_ms", "create_to_available_p99_ms", "stop_to_stopped_p50_ms")


def _started(work: Path, name: str, code: Path | None, settle_ms: float | None) -> Server:
    (work / name).mkdir()
    server = Server(work / name, work / f"{name}.log", settle_ms=settle_ms, code=code)
    server.start_or_exit(name)
    return server


def main() -> None:
    parser = ab_arguments(__doc__, rounds=5)
    parser.add_argument("--count", type=int, default=200, help="workspaces per side and round")
    parser.add_argument("--durable-seconds", type=float, default=0.0, help="durable creates per side and round")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kibo-lifecycle-ab-"))
    sides = {"A (this checkout)": None, f"B ({args.b})": args.b.resolve()}
    servers: list[Server] = []
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    try:
        pairs = []
        for n, (name, code) in enumerate(sides.items()):
            settled = _started(work, f"{n}-settled", code, None)
            durable = _started(work, f"{n}-durable", code, 0) if args.durable_seconds else None
            servers += [s for s in (settled, durable) if s is not None]
            pairs.append((name, settled, durable))
        for round_ in range(args.rounds):
            for name, settled, durable in pairs:
                result = figures.lifecycle(settled, args.count, f"bench-ab/{round_}")
                if durable is not None:
                    result["durable_creates_per_s"] = figures.durable_creates(durable, 1, args.durable_seconds)["per_s"]
                results[name].append(result)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    keys = LIFECYCLE + (("durable_creates_per_s",) if args.durable_seconds else ())
    for name, runs in results.items():
        medians = ", ".join(f"{key} {statistics.median(r[key] for r in runs):.2f}" for key in keys)
        print(f"{name}: {medians}")


if __name__ == "__main__":
    main()
