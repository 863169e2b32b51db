"""Start the real `kibo-ctrl serve` as a subprocess on a loopback port, like a user would."""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Fast defaults for tests: small simulated steps, short settle window, quick node timeout.
# Authentication is off except where a test turns it on (tests/integration/test_auth.py): the
# lifecycle does not depend on who asks, and tenancy has its own tests.
TEST_FLAGS = (
    "--runtime",
    "sim",
    "--sim-step-ms",
    "5",
    "--settle-ms",
    "300",
    "--node-timeout-ms",
    "1000",
    "--log-level",
    "warning",
)


# Ports for test servers. A port picked here is bound later, by the server: two pickers must never
# hand out the same one. bind(0) cannot promise that across pytest-xdist workers (the kernel may
# give a port just released by one worker's probe to another's, or to an outgoing connection), so
# each worker walks its own block of ports below the kernel's ephemeral range (32768-60999 here,
# where bind(0) and outgoing connections take theirs), from a random start (two test sessions on
# one machine rarely meet), skipping ports something holds.
PORT_BASE = 10000
PORT_BLOCK = 1000
PORT_BLOCKS = 20  # 10000-29999
_next_port: Iterator[int] | None = None


def worker_index() -> int:
    """This pytest-xdist worker's number (PYTEST_XDIST_WORKER=gw3: 3); 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def _ports() -> Iterator[int]:
    base = PORT_BASE + (worker_index() % PORT_BLOCKS) * PORT_BLOCK
    start = secrets.randbelow(PORT_BLOCK)  # not `random`: hypothesis seeds that one
    for step in itertools.count():
        yield base + (start + step) % PORT_BLOCK


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port no other picker of this test session hands out (see PORT_BLOCK)."""
    global _next_port
    if _next_port is None:
        _next_port = _ports()
    for _ in range(PORT_BLOCK):
        port = next(_next_port)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in this worker's block of {PORT_BLOCK} from {PORT_BASE}")


@dataclass
class ServerProcess:
    data_dir: Path
    flags: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    # The node port (--node-listen: NodeService over mutual TLS), a port of its own: the default
    # 50053 would be one port for every server of the session.
    node_port: int = field(default_factory=free_port)
    # The exposure listener (--exposure-listen), likewise: the default 8090 would be shared.
    exposure_port: int = field(default_factory=free_port)
    # False: --insecure-no-auth. True: tokens required; `admin_token` is the first one.
    auth: bool = False
    # For a server started with --tls-cert: how the health check connects.
    credentials: grpc.ChannelCredentials | None = None
    process: subprocess.Popen[bytes] | None = None
    # RLIMIT_NOFILE (soft and hard) of the server process; None: inherited.
    nofile: int | None = None
    log_path: Path | None = None
    # --store: a PostgreSQL URL; None: the embedded SQLite under data_dir.
    store: str | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_address(self) -> str:
        """Connect, gRPC-Web and plain HTTP JSON."""
        return f"127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"
        command = [
            sys.executable,
            "-m",
            "kibo_ctrl",
            "serve",
            "--listen",
            self.address,
            "--http-listen",
            self.http_address,
            "--data-dir",
            str(self.data_dir),
            "--node-listen",
            f"127.0.0.1:{self.node_port}",
            *(() if "--exposure-listen" in self.flags else ("--exposure-listen", f"127.0.0.1:{self.exposure_port}")),
            *TEST_FLAGS,
            *(() if self.auth else ("--insecure-no-auth",)),
            *(() if self.store is None else ("--store", self.store)),
            *self.flags,
        ]
        if self.nofile is not None:
            # prlimit, not a preexec_fn: a preexec_fn makes subprocess fork() (not vfork) while
            # grpc's threads run, and grpc's fork handler can abort the child before its exec
            # (grpc/grpc#43055: "epoll_wait error: Bad file descriptor", exit -6).
            command = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *command]
        # The child gets its own descriptor of the log; ours is closed once it has it.
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        self._wait_serving(timeout)
        return self

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if self.credentials is None:
            channel = grpc.insecure_channel(self.address)
        else:
            channel = grpc.secure_channel(self.address, self.credentials)
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited with {self.process.returncode}: {self.log()}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.05)
        raise TimeoutError(f"server not SERVING after {timeout}s: {self.log()}")

    @property
    def admin_token(self) -> str:
        """The admin token the server made on first start (tenant `default`)."""
        return (self.data_dir / "admin.token").read_text().strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        """kill -9: no chance to flush or clean up."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def restart(self) -> ServerProcess:
        self.stop()
        return self.start()
