"""Run `kibo-ctrl serve` (and the ceiling server) as separate processes on loopback."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent

# Nodes large enough that 100,000 running workspaces (2 vCPU each) still leave room.
NODE_FLAGS = ("--node-vcpus", "100000000", "--node-memory-mib", "100000000000")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    """VmRSS of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def ab_arguments(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The arguments every A/B of two checkouts' control planes takes (bench/lifecycle_ab.py,
    bench/list_ab.py): `--b`, the other checkout's root, and `--rounds`; the caller adds its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--b", type=Path, required=True, help="the other checkout (its root)")
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser


def wait_serving(address: str, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}")
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.01)
    raise TimeoutError(f"{address} not SERVING after {timeout}s")


@dataclass
class Server:
    """One `kibo-ctrl serve` process with `--sim-step-ms 0`."""

    data_dir: Path
    log_path: Path
    settle_ms: float | None = None
    # --store: a postgresql:// URL (bench/stores.py); None: the embedded SQLite under data_dir.
    store: str | None = None
    # Another checkout to run instead of this one (same-run A/B): its server/ and gen/.
    code: Path | None = None
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def token(self) -> str | None:
        """The admin token the server wrote on its first start (None when auth is off)."""
        path = self.data_dir / "admin.token"
        return path.read_text().strip() if path.exists() else None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        token = self.token
        return (("authorization", f"Bearer {token}"),) if token else ()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def command(self) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "kibo_ctrl",
            "serve",
            "--listen",
            self.address,
            # A port of its own for the node link (the default 50053 would clash with another's).
            "--node-listen",
            "127.0.0.1:0",
            "--http-listen",
            self.http_address,
            "--data-dir",
            str(self.data_dir),
            "--runtime",
            "sim",
            "--sim-step-ms",
            "0",
            "--log-level",
            "warning",
            # The benchmark is one tenant at full speed: the default per-tenant limits would cap it.
            "--rate-limit-rps",
            "0",
            *self._unlimited_watches(),
            *NODE_FLAGS,
        ]
        if self.settle_ms is not None:
            command += ["--settle-ms", str(self.settle_ms)]
        if self.store is not None:
            command += ["--store", self.store]
        return command

    def _unlimited_watches(self) -> tuple[str, ...]:
        """No cap on a tenant's WatchWorkspace streams (the watch phase holds 5,000), where the
        checkout has one (an A/B may run a checkout from before it)."""
        fairness = (self.code or ROOT) / "server" / "kibo_ctrl" / "api" / "fairness.py"
        known = fairness.exists() and "WATCHES_PER_TENANT" in fairness.read_text()
        return ("--max-watches-per-tenant", "0") if known else ()

    def start(self, timeout: float = 120.0) -> float:
        """Start and wait for grpc.health.v1 SERVING; returns the seconds that took."""
        with open(self.log_path, "ab") as log:
            began = time.monotonic()
            paths = [] if self.code is None else [str(self.code / "server"), str(self.code / "gen")]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)} if paths else None
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        try:
            wait_serving(self.address, timeout, self.process)
        except BaseException:
            self.kill()
            raise
        return time.monotonic() - began

    def start_or_exit(self, name: str) -> None:
        """Start, or end the bench with the server's log if it exits first (a side of an A/B
        whose checkout cannot serve)."""
        try:
            self.start()
        except RuntimeError:
            raise SystemExit(f"{name} did not start:\n{self.log_path.read_text()[-2000:]}") from None

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


@dataclass
class Ceiling:
    """The bare grpc.aio server of bench/ceiling.py answering one fixed response."""

    payload_path: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        command = [sys.executable, "-m", "bench.ceiling", "--port", str(self.port), "--payload", str(self.payload_path)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_serving(self.address, 30, self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}
