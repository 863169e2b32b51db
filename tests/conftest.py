"""Fixtures: real servers on loopback ports and gRPC clients for them."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.client import Client
from tests.server import ServerProcess

_count = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "serial: runs alone, no other test of the session meanwhile (it needs the machine's throughput)",
    )


@pytest.fixture(autouse=True)
def _serial_tests_run_alone(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A readers-writer lock across the pytest-xdist workers, in the session's shared temp dir:
    every test holds it shared, a `serial` test exclusively. The gate lets a waiting serial test
    stop new tests from starting (Linux flock does not favour writers), so it waits only for the
    tests already running."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps are <root>/popen-gwN
    with open(root / "serial.gate", "a+b") as gate, open(root / "serial.lock", "a+b") as lock:
        if request.node.get_closest_marker("serial") is None:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        else:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the files releases the locks


@pytest.fixture(scope="session", autouse=True)
def _private_user_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers started with auth record where their admin token is under $XDG_STATE_HOME, and
    clients read the default $XDG_DATA_HOME/kibo/admin.token: keep both out of the real home
    (servers inherit the environment), so tests leave nothing there and read nothing of it."""
    saved = {name: os.environ.get(name) for name in ("XDG_STATE_HOME", "XDG_DATA_HOME")}
    for name in saved:
        os.environ[name] = str(tmp_path_factory.mktemp(name.lower()))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProcess]]:
    """Start extra servers (own data dir each); all are stopped at the end of the session."""
    started: list[ServerProcess] = []

    def start(
        *flags: str,
        data_dir: Path | None = None,
        auth: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> ServerProcess:
        directory = data_dir or tmp_path_factory.mktemp(f"kibo{next(_count)}") / "data"
        server = ServerProcess(directory, tuple(flags), auth=auth, credentials=credentials).start()
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process is not None and server.process.poll() is None:
            server.kill()


@pytest.fixture(scope="session")
def firecracker(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A shared server with the firecracker personality. Do not make its node silent."""
    return server_factory("--sim-backend", "firecracker")


@pytest.fixture(scope="session")
def kibovm(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory("--sim-backend", "kibovm")


TRANSPORTS = ("grpc", "connect")


@contextlib.asynccontextmanager
async def _client(server: ServerProcess, transport: str) -> AsyncIterator[Client]:
    if transport == "grpc":
        async with Client.connect(server.address) as connected:
            yield connected
    else:
        async with Client.connect_http(server.http_address) as connected:
            yield connected


# The behaviour suite runs through both transports: gRPC and Connect (same domain code).
@pytest.fixture(params=TRANSPORTS)
async def client(firecracker: ServerProcess, request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    async with _client(firecracker, request.param) as connected:
        yield connected


@pytest.fixture(params=TRANSPORTS)
async def kibovm_client(kibovm: ServerProcess, request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    async with _client(kibovm, request.param) as connected:
        yield connected


@pytest.fixture(params=[(p, t) for p in ("firecracker", "kibovm") for t in TRANSPORTS], ids=lambda v: "-".join(v))
async def any_client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """A client of the shared server of each personality, over each transport."""
    personality, transport = request.param
    server: ServerProcess = request.getfixturevalue(personality)
    async with _client(server, transport) as connected:
        yield connected


@pytest.fixture
async def grpc_client(firecracker: ServerProcess) -> AsyncIterator[Client]:
    """For tests about the gRPC transport itself (raw bytes, metadata)."""
    async with Client.connect(firecracker.address) as connected:
        yield connected


def rpc_error(excinfo: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> grpc.aio.AioRpcError:
    return excinfo.value
