"""Start the real `kibo-ctrl serve` as a subprocess on a loopback port, like a user would."""

from __future__ import annotations

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

# Fast defaults for tests: small simulated steps, short settle window, quick node timeout.
# Authentication is off except where a test turns it on (tests/test_auth.py): the
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    data_dir: Path
    flags: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    # False: --insecure-no-auth. True: tokens required; `admin_token` is the first one.
    auth: bool = False
    # For a server started with --tls-cert: how the health check connects.
    credentials: grpc.ChannelCredentials | None = None
    process: subprocess.Popen[bytes] | None = None
    # RLIMIT_NOFILE (soft and hard) of the server process; None: inherited.
    nofile: int | None = None
    log_path: Path | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_address(self) -> str:
        """Connect, gRPC-Web and plain HTTP JSON."""
        return f"127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
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
            *TEST_FLAGS,
            *(() if self.auth else ("--insecure-no-auth",)),
            *self.flags,
        ]
        if self.nofile is not None:
            # prlimit, not a preexec_fn: a preexec_fn makes subprocess fork() (not vfork) while
            # grpc's threads run, and grpc's fork handler can abort the child before its exec
            # (grpc/grpc#43055: "epoll_wait error: Bad file descriptor", exit -6).
            command = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *command]
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
