"""Fixtures: real servers on loopback ports and gRPC clients for them."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.client import Client
from tests.postgres import DSN_VARIABLE, Databases, LocalPostgres
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
        store: str | None = None,
    ) -> ServerProcess:
        directory = data_dir or tmp_path_factory.mktemp(f"kibo{next(_count)}") / "data"
        server = ServerProcess(directory, tuple(flags), auth=auth, credentials=credentials, store=store).start()
        started.append(server)
        return server

    start.started = started  # type: ignore[attr-defined]
    yield start
    for server in started:
        if server.process is not None and server.process.poll() is None:
            # Stopped as its user would stop it, so that it removes what it made on the machine
            # (a process runtime's cgroup parents: a kill -9 left them); killed if it hangs.
            try:
                server.stop(10)
            except subprocess.TimeoutExpired:
                server.kill()
    # A guest network namespace, veth, nftables table, address claim or ip_forward flip of a
    # server's data dir left behind (runtime/process/network/: its tests' teardown reaps them).
    from kibo_ctrl.runtime.process.network import leftovers

    left = {str(server.data_dir): found for server in started if (found := leftovers(server.data_dir))}
    assert not left, f"guest networks left behind: {left}"


@pytest.fixture(scope="session")
def firecracker(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A shared server with the firecracker personality. Do not make its node silent."""
    return server_factory("--sim-backend", "firecracker")


@pytest.fixture(scope="session")
def postgres_databases(server_factory: Callable[..., ServerProcess]) -> Iterator[Databases]:
    """Fresh databases on this worker's throwaway PostgreSQL (tests/postgres.py), or on the one
    KIBO_TEST_POSTGRES_DSN names; started on first use, stopped and removed at the end (after
    the servers that use them)."""
    named = os.environ.get(DSN_VARIABLE)
    local = None if named else LocalPostgres.start()
    databases = Databases(named if local is None else local.dsn)
    try:
        yield databases
    finally:
        for server in server_factory.started:  # type: ignore[attr-defined]
            if server.store is not None and server.process is not None and server.process.poll() is None:
                server.kill()
        databases.drop_all()
        if local is not None:
            local.stop()


@pytest.fixture(scope="session")
def firecracker_postgresql(
    server_factory: Callable[..., ServerProcess], postgres_databases: Databases
) -> ServerProcess:
    """The shared firecracker server on PostgreSQL (the `client` fixture's postgresql case)."""
    return server_factory("--sim-backend", "firecracker", store=postgres_databases.create())


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


# The behaviour suite runs through both transports (gRPC and Connect: same domain code) and on
# both stores: (transport, store) pairs, each transport and each store at least once, not all
# four (the transports do not touch the store). A test that also asks for `firecracker` itself
# (it reaches the shared SQLite server another way) gets the SQLite pairs only.
CLIENT_CASES = (("grpc", "sqlite"), ("connect", "sqlite"), ("grpc", "postgresql"))
SHARED_SERVER = {"sqlite": "firecracker", "postgresql": "firecracker_postgresql"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "client" in metafunc.fixturenames:
        cases = [c for c in CLIENT_CASES if c[1] == "sqlite" or "firecracker" not in metafunc.fixturenames]
        ids = [t if s == "sqlite" else f"{t}-{s}" for t, s in cases]
        metafunc.parametrize("client", cases, ids=ids, indirect=True)


@pytest.fixture
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    transport, store = request.param
    server: ServerProcess = request.getfixturevalue(SHARED_SERVER[store])
    async with _client(server, transport) as connected:
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
