"""Figure 4's List of two checkouts side by side on a shared, noisy machine: `python -m
bench.list_ab --b CHECKOUT [--rounds N] [--large N] [--seconds S]`.

Side A is this checkout's server, side B another checkout's (its server/ and gen/; e.g. a
`git worktree add /tmp/old <commit>`). One store of 1,000 workspaces and one of `--large`
(100,000) are seeded once (bench/seed.py, as bench/run does) and copied for each side, so all
four servers (two sizes, two sides) read the same rows. The rounds alternate A small, A
large, B small, B large: ListWorkspaces(page_size=100) at 8 in flight for `--seconds` each,
over pages spread through the store (bench/figures.walk). Prints each server's List p50 per
round, its median, and each side's median ratio of the large store's p50 to the small one's
(bench/run's `scale_list_ratio_100k_vs_1k`, with the other side beside it in the same run)."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import uuid
from pathlib import Path

from bench import figures
from bench.main import LIST
from bench.seed import Template, seed
from bench.server import Server, ab_arguments

SMALL = 1000


def _seeded(work: Path, large: int) -> dict[int, Path]:
    """Pristine stores of SMALL and `large` workspaces, clones of two made through the API."""
    base = work / "base"
    server = Server(base, work / "seed.log")
    server.start()
    try:
        running = figures.make_workspace(server, f"bench-seed/{uuid.uuid4()}")
        stopped = figures.make_workspace(server, f"bench-seed/{uuid.uuid4()}", stop=True)
    finally:
        server.stop()
    templates, stored, pristine = [Template(*running), Template(*stopped)], 2, {}
    for size in (SMALL, large):
        seed(base, templates, size - stored)
        stored = size
        pristine[size] = work / f"pristine-{size}"
        shutil.copytree(base, pristine[size])
        print(f"seeded {size:,} workspaces", flush=True)
    return pristine


def main() -> None:
    parser = ab_arguments(__doc__, rounds=6)
    parser.add_argument("--large", type=int, default=100_000, help="workspaces in the large store")
    parser.add_argument("--seconds", type=float, default=3.0, help="List load per server and round")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kibo-list-ab-"))
    sides = {"A": None, "B": args.b.resolve()}
    servers: dict[tuple[str, int], Server] = {}
    try:
        pristine = _seeded(work, args.large)
        for side, code in sides.items():
            for size, store in pristine.items():
                data = work / f"{side}-{size}"
                shutil.copytree(store, data)
                server = Server(data, work / f"{side}-{size}.log", code=code)
                server.start_or_exit(f"{side} ({size:,} stored)")
                servers[side, size] = server
        walks = {key: figures.walk(server, ids=100, pages=200) for key, server in servers.items()}
        p50s: dict[tuple[str, int], list[float]] = {key: [] for key in servers}
        for n in range(args.rounds):
            print(f"  round {n + 1}/{args.rounds}", flush=True)
            for key, server in servers.items():
                target = figures.kibo_target(server)
                run = figures.unary_load(target, LIST, walks[key].list_requests, args.seconds, 8)
                p50s[key].append(run["p50_ms"])
        print()
        for (side, size), values in p50s.items():
            shown = ", ".join(f"{v:.1f}" for v in values)
            who = sides[side] or "this checkout"
            print(f"{side} ({who}), {size:,} stored: List p50 {shown}; median {statistics.median(values):.2f} ms")
        for side in sides:
            ratios = [big / small for small, big in zip(p50s[side, SMALL], p50s[side, args.large], strict=True)]
            print(f"{side}: List p50 {args.large:,} / {SMALL:,}: median {statistics.median(ratios):.2f}")
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
