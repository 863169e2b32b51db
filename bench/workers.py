"""Start load-generator processes (bench/loadgen.py), release them together, collect results."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from typing import Any

from .server import ROOT, python_env


class Workers:
    """`count` loadgen processes running `spec` (each gets its own copy, plus its index)."""

    def __init__(self, specs: list[dict[str, Any]]) -> None:
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.loadgen"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
                env=python_env(),
                text=True,
            )
            for _ in specs
        ]
        for process, spec in zip(self.processes, specs, strict=True):
            assert process.stdin is not None
            process.stdin.write(json.dumps(spec) + "\n")
            process.stdin.flush()

    def ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            assert process.stdout is not None
            readable, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = process.stdout.readline().strip() if readable else "(nothing in time)"
            if line != "ready":
                self.kill()
                raise RuntimeError(f"load generator failed to start (said {line!r})")

    def send(self, line: str) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(line + "\n")
            process.stdin.flush()

    def results(self) -> list[dict[str, Any]]:
        out = []
        for process in self.processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            process.wait(60)
            if not line:
                raise RuntimeError(f"load generator exited with {process.returncode} and no result")
            out.append(json.loads(line))
        return out

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def run(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start, wait until all are ready, release them together, return their results."""
    workers = Workers(specs)
    try:
        workers.ready()
        workers.send("go")
        return workers.results()
    finally:
        workers.kill()
