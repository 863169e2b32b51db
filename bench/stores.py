"""`python -m bench.stores [--postgres URL] [--reps N] [--seconds S] [--lifecycle N]`: the
embedded SQLite against PostgreSQL, with one replica and with three on one database, the
same server otherwise (three replicas: the creates spread over them, create -> AVAILABLE
through a follower, whose answer crosses the change feed from the leader).

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

from . import figures, workers
from .server import ROOT, Server
from .stats import median, percentile

ARMS = ("sqlite", "postgresql", "postgresql-3")
REPLICAS = 3


def log(message: str) -> None:
    print(f"[bench.stores {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _leader_pid(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT holder FROM kibo_leader WHERE expires_at > now()").fetchone()
    return int(str(row[0]).split("/")[1]) if row else -1


def _spread_creates(servers: list[Server], seconds: float) -> dict[str, Any]:
    """figures.creates with its 64 clients spread over the replicas (one loadgen each)."""
    prefix = f"bench-create/{uuid.uuid4().hex[:8]}"
    specs = [
        {
            "mode": "creates",
            "target": server.address,
            "prefix": f"{prefix}/{i}",
            "concurrency": figures.IN_FLIGHT // len(servers) + (1 if i < figures.IN_FLIGHT % len(servers) else 0),
            "seconds": seconds,
            "token": server.token,
        }
        for i, server in enumerate(servers)
    ]
    results = workers.run(specs)
    latencies = [x for r in results for x in r["latencies_ms"]]
    return {
        "per_s": sum(r["count"] for r in results) / max(r["elapsed"] for r in results),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "errors": sum(r["errors"] for r in results),
    }


def _replicas(work: Path, name: str, url: str, settle_ms: float | None) -> list[Server]:
    servers = [
        Server(work / f"{name}-{i}", work / "server.log", settle_ms=settle_ms, store=url) for i in range(REPLICAS)
    ]
    for server in servers:
        server.start()
    # The first replica made the admin token (in the shared database): every replica takes it.
    token = next(server.token for server in servers if server.token)
    for server in servers:
        (server.data_dir / "admin.token").write_text(token + "\n")
    return servers


def _arm_replicas(work: Path, databases: Any, rep: int, seconds: float, lifecycle: int) -> dict[str, Any]:
    """Three replicas on one database: creates spread over all three; create -> AVAILABLE
    through a follower (the leader runs the loops: the answer crosses the change feed)."""
    servers = _replicas(work, f"r3-{rep}-durable", databases.create(), 0)
    try:
        creates = _spread_creates(servers, seconds)
    finally:
        for server in servers:
            server.stop()
    url = databases.create()
    servers = _replicas(work, f"r3-{rep}-settled", url, None)
    try:
        figures.make_workspace(servers[0], f"bench-warm/{uuid.uuid4().hex}")  # a leader is elected
        follower = next(s for s in servers if s.pid != _leader_pid(url))
        life = figures.lifecycle(follower, lifecycle, f"bench-store/{uuid.uuid4().hex[:8]}")
    finally:
        for server in servers:
            server.stop()
    return {"creates": creates, "life": life}


def measure(work: Path, databases: Any, reps: int, seconds: float, lifecycle: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for rep in range(reps):
        for arm in ARMS if rep % 2 == 0 else reversed(ARMS):
            if arm == "postgresql-3":
                both = _arm_replicas(work, databases, rep, seconds, lifecycle)
                creates, life = both["creates"], both["life"]
                runs[arm].append(_run(arm, rep, creates, life))
                continue
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
            runs[arm].append(_run(arm, rep, creates, life))
    keys = [k for k in runs["sqlite"][0] if k != "errors"]
    result: dict[str, Any] = {arm: {k: median([r[k] for r in runs[arm]]) for k in keys} for arm in ARMS}
    for arm in ARMS:
        result[arm]["errors"] = sum(r["errors"] for r in runs[arm])
    for arm in ARMS[1:]:
        result[f"{arm}_over_sqlite_creates"] = (
            result[arm]["durable_creates_per_s"] / result["sqlite"]["durable_creates_per_s"]
        )
    result["runs"] = runs
    return result


def _run(arm: str, rep: int, creates: dict[str, Any], life: dict[str, Any]) -> dict[str, Any]:
    run = {
        "durable_creates_per_s": creates["per_s"],
        "durable_create_p50_ms": creates["p50_ms"],
        "durable_create_p99_ms": creates["p99_ms"],
        "errors": creates["errors"],
        "create_to_available_p50_ms": life["create_to_available_p50_ms"],
        "create_to_available_p99_ms": life["create_to_available_p99_ms"],
    }
    log(f"{arm} rep {rep + 1}: {json.dumps(run)}")
    return run


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
