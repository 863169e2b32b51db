"""`python -m bench.stores [--postgres URL] [--reps N] [--seconds S] [--lifecycle N]`: the
embedded SQLite against PostgreSQL (one replica), the same server otherwise.

Per repetition, alternating the two arms, each on a fresh store: durable creates/s (64
clients, answered at commit: --settle-ms 0, as bench/main.py's figure 3) and create ->
AVAILABLE p50/p99 (one client, one at a time, the default settle window: figure 2). Figures
are medians over the repetitions. Without --postgres it starts a throwaway PostgreSQL from
Debian's package with its durable defaults (fsync on, synchronous_commit on: a commit is on
disk before it is acknowledged, like SQLite's synchronous=FULL)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import figures
from .server import ROOT, Server
from .stats import median

ARMS = ("sqlite", "postgresql")


def log(message: str) -> None:
    print(f"[bench.stores {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(work: Path, databases: Any, reps: int, seconds: float, lifecycle: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for rep in range(reps):
        for arm in ARMS if rep % 2 == 0 else reversed(ARMS):
            store = databases.create() if arm == "postgresql" else None
            durable = Server(work / f"{arm}-{rep}-durable", work / "server.log", settle_ms=0, store=store)
            durable.start()
            try:
                creates = figures.durable_creates(durable, 1, seconds)
            finally:
                durable.stop()
            store = databases.create() if arm == "postgresql" else None
            settled = Server(work / f"{arm}-{rep}-settled", work / "server.log", store=store)
            settled.start()
            try:
                life = figures.lifecycle(settled, lifecycle, f"bench-store/{uuid.uuid4().hex[:8]}")
            finally:
                settled.stop()
            run = {
                "durable_creates_per_s": creates["per_s"],
                "durable_create_p50_ms": creates["p50_ms"],
                "durable_create_p99_ms": creates["p99_ms"],
                "errors": creates["errors"],
                "create_to_available_p50_ms": life["create_to_available_p50_ms"],
                "create_to_available_p99_ms": life["create_to_available_p99_ms"],
            }
            log(f"{arm} rep {rep + 1}: {json.dumps(run)}")
            runs[arm].append(run)
    keys = [k for k in runs["sqlite"][0] if k != "errors"]
    result: dict[str, Any] = {arm: {k: median([r[k] for r in runs[arm]]) for k in keys} for arm in ARMS}
    for arm in ARMS:
        result[arm]["errors"] = sum(r["errors"] for r in runs[arm])
    result["postgresql_over_sqlite_creates"] = (
        result["postgresql"]["durable_creates_per_s"] / result["sqlite"]["durable_creates_per_s"]
    )
    result["runs"] = runs
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", help="a PostgreSQL URL whose role may CREATE DATABASE (default: a throwaway)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per durable-creates run")
    parser.add_argument("--lifecycle", type=int, default=200, help="creates -> AVAILABLE per repetition")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    # The tests' throwaway PostgreSQL (initdb under a temp dir, runuser as root), durable here.
    sys.path.insert(0, str(ROOT))
    from tests.postgres import Databases, LocalPostgres

    local = None if args.postgres else LocalPostgres.start(durable=True)
    databases = Databases(args.postgres or local.dsn)  # type: ignore[union-attr]
    work = Path(tempfile.mkdtemp(prefix="kibo-bench-stores-"))
    try:
        result = measure(work, databases, args.reps, args.seconds, args.lifecycle)
    finally:
        databases.drop_all()
        if local is not None:
            local.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = {k: v for k, v in result.items() if k != "runs"}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
