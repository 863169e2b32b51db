"""Clients no one here wrote, against the real server: `buf curl` (Connect, gRPC-Web, gRPC via
reflection), plain `curl` JSON, a Node client on @connectrpc/connect-node (examples/node) and a
grpc-go client built offline from Debian's packages (examples/go).

The tools come from `bash examples/setup.sh` (Go, protoc, curl from Debian; the Node example's
npm packages) and the repository's own `npm ci` (buf). A missing tool fails these tests with a
message saying what to run: they never skip.

The servers here answer command RPCs at once (`--settle-ms 0`), so every command comes back
PENDING first and the clients really settle: they resend the same request until it is terminal.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.rpc import error_details_pb2
from kibo.ctrl.v1 import error_pb2

from tests.client import Client, S, new_id
from tests.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
NODE_EXAMPLE = EXAMPLES / "node"
GO_EXAMPLE = EXAMPLES / "go"
BUF = REPO / "node_modules" / ".bin" / "buf"
SETUP = "run `bash examples/setup.sh` (Go, protoc and curl from Debian; npm packages of examples/node)"
WS = "kibo.ctrl.v1.WorkspaceService"
TIMEOUT = 60.0

# -- tools ------------------------------------------------------------------------------------


def _need_tool(name: str, how: str = SETUP) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not installed: {how}", pytrace=False)
    return path


def _need_file(path: Path, how: str = SETUP) -> Path:
    if not path.exists():
        pytest.fail(f"{path.relative_to(REPO)} is missing: {how}", pytrace=False)
    return path


@dataclass(frozen=True)
class Result:
    argv: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> Result:
        assert self.returncode == 0, f"{' '.join(self.argv)} exited {self.returncode}:\n{self.stdout}\n{self.stderr}"
        return self


async def run(*argv: str | Path, cwd: Path = REPO) -> Result:
    """Run a command without blocking the event loop (the servers' clients share it)."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Result([str(a) for a in argv], process.returncode, out.decode(), err.decode())


def json_values(text: str) -> list[Any]:
    """buf curl prints one JSON document per message (pretty-printed, back to back)."""
    decoder, values, index = json.JSONDecoder(), [], 0
    text = text.strip()
    while index < len(text):
        value, index = decoder.raw_decode(text, index)
        values.append(value)
        while index < len(text) and text[index].isspace():
            index += 1
    return values


def unb64(value: str) -> bytes:
    """Connect JSON error details: base64, standard or URL-safe alphabet, padding optional."""
    return base64.urlsafe_b64decode(value.replace("+", "-").replace("/", "_") + "=" * (-len(value) % 4))


def conflict_details(error: dict[str, Any]) -> tuple[error_pb2.ErrorDetail, error_details_pb2.ErrorInfo]:
    """Decode the two details every rejection carries, from a Connect-JSON error body."""
    assert error["code"] == "failed_precondition", error
    by_type = {detail["type"]: unb64(detail["value"]) for detail in error["details"]}
    detail = error_pb2.ErrorDetail.FromString(by_type["kibo.ctrl.v1.ErrorDetail"])
    info = error_details_pb2.ErrorInfo.FromString(by_type["google.rpc.ErrorInfo"])
    assert detail.reason == error_pb2.ERROR_REASON_CONFLICT
    assert info.reason == "CONFLICT"
    return detail, info


# -- servers and builds -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def h1(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    """The default HTTP server (uvicorn, HTTP/1.1), answering command RPCs at once."""
    server = server_factory("--settle-ms", "0")
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def h2(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    """hypercorn: HTTP/1.1 and h2c (Connect, gRPC-Web and gRPC over h2c)."""
    server = server_factory("--http-server", "hypercorn", "--settle-ms", "0")
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def buf() -> Path:
    return _need_file(BUF, "run `npm ci` at the repository root (it installs buf)")


@pytest.fixture(scope="module")
def node_client() -> list[str]:
    """Generates the TypeScript code (buf + local protoc-gen-es) and compiles the client."""
    node = _need_tool("node")
    npm = _need_tool("npm")
    _need_file(NODE_EXAMPLE / "node_modules" / ".bin" / "protoc-gen-es")
    _need_file(NODE_EXAMPLE / "node_modules" / ".bin" / "tsc")
    build = subprocess.run(
        [npm, "run", "--silent", "build"], cwd=NODE_EXAMPLE, capture_output=True, text=True, timeout=120
    )
    assert build.returncode == 0, f"npm run build failed:\n{build.stdout}\n{build.stderr}"
    return [node, str(NODE_EXAMPLE / "dist" / "client.js")]


@pytest.fixture(scope="module")
def go_client() -> Path:
    """Builds examples/go/quickstart offline (GOPATH mode, Debian's Go packages) into the
    gitignored examples/go/build, a fixed place so that go's build cache is reused."""
    for tool in ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc"):
        _need_tool(tool)
    _need_file(Path("/usr/share/gocode/src/google.golang.org/grpc"))
    out = GO_EXAMPLE / "build"
    build = subprocess.run(
        ["bash", str(GO_EXAMPLE / "build.sh"), str(out)], capture_output=True, text=True, timeout=300
    )
    assert build.returncode == 0, f"examples/go/build.sh failed:\n{build.stdout}\n{build.stderr}"
    return out / "quickstart"


@pytest.fixture
async def grpc_client(h1: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(h1.address) as connected:
        yield connected


# -- buf curl ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """How buf curl reaches the server: protocol, flags, and which listener."""

    protocol: str
    flags: tuple[str, ...]
    server: str  # "h1" or "h2" fixture
    port: str  # "http" or "grpc"


ROUTES = {
    "connect-h1": Route("connect", ("--schema", "proto"), "h1", "http"),
    "grpcweb-h1": Route("grpcweb", ("--schema", "proto"), "h1", "http"),
    "connect-h2c": Route("connect", ("--schema", "proto", "--http2-prior-knowledge"), "h2", "http"),
    "grpc-h2c-http-listener": Route("grpc", ("--schema", "proto", "--http2-prior-knowledge"), "h2", "http"),
    "grpc-reflection": Route("grpc", ("--http2-prior-knowledge",), "h1", "grpc"),
}


@pytest.mark.parametrize("route_name", list(ROUTES))
async def test_buf_curl(route_name: str, buf: Path, request: pytest.FixtureRequest) -> None:
    """Unary, a CONFLICT with its details, and the WatchWorkspace server stream to its end."""
    route = ROUTES[route_name]
    server: ServerProcess = request.getfixturevalue(route.server)
    address = server.http_address if route.port == "http" else server.address

    def curl(method: str, body: dict[str, Any]) -> list[str | Path]:
        return [
            buf,
            "curl",
            "--protocol",
            route.protocol,
            *route.flags,
            "-d",
            json.dumps(body),
            f"http://{address}/{WS}/{method}",
        ]

    capabilities = json.loads((await run(*curl("GetCapabilities", {}))).check().stdout)
    assert "workspace.stop.force" in capabilities["capabilities"]

    async with Client.connect(server.address) as client:
        workspace = await client.create()
        workspace_id = workspace.workspace_id

        # A start of an AVAILABLE workspace: FAILED_PRECONDITION, ErrorDetail + ErrorInfo.
        conflict = await run(
            *curl("StartWorkspace", {"metadata": {"commandId": new_id()}, "workspaceId": workspace_id})
        )
        assert conflict.returncode != 0, conflict.stdout
        (error,) = json_values(conflict.stderr)
        detail, _ = conflict_details(error)
        assert detail.workspace_state == "AVAILABLE"

        # The stream: the current snapshot first, then each change, ending after DELETED.
        argv = [str(a) for a in curl("WatchWorkspace", {"workspaceId": workspace_id})]
        watch = await asyncio.create_subprocess_exec(
            *argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert watch.stdout is not None
            first = b""
            while not first.rstrip().endswith(b"\n}"):  # the first message, pretty-printed
                chunk = await asyncio.wait_for(watch.stdout.read(4096), TIMEOUT)
                assert chunk, f"the watch ended before its first message: {(await watch.communicate())[1]!r}"
                first += chunk
            await client.delete(workspace_id)
            rest, err = await asyncio.wait_for(watch.communicate(), TIMEOUT)
        finally:
            if watch.returncode is None:
                watch.kill()
                await watch.wait()
        assert watch.returncode == 0, err.decode()
    states = [message["workspace"]["state"] for message in json_values((first + rest).decode())]
    assert states[0] == "WORKSPACE_STATE_AVAILABLE", states
    assert states[-1] == "WORKSPACE_STATE_DELETED", states
    assert "WORKSPACE_STATE_DELETING" in states


# -- plain curl -------------------------------------------------------------------------------


async def test_plain_curl_json(h1: ServerProcess) -> None:
    """JSON over HTTP/1.1 POST, no Connect library: create (settled), conflict, get, delete."""
    curl_bin = _need_tool("curl")

    async def post(method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        result = await run(
            curl_bin,
            "-sS",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body),
            f"http://{h1.http_address}/{WS}/{method}",
        )
        text, _, status = result.check().stdout.rpartition("\n")
        return int(status), json.loads(text)

    async def settle(method: str, body: dict[str, Any]) -> dict[str, Any]:
        calls = 0
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while True:
            status, reply = await post(method, body)
            calls += 1
            assert status == 200, reply
            assert reply["command"]["commandId"] == body["metadata"]["commandId"]
            if reply["command"]["state"] in ("COMMAND_STATE_SUCCEEDED", "COMMAND_STATE_FAILED"):
                assert reply["command"]["state"] == "COMMAND_STATE_SUCCEEDED", reply
                assert calls > 1, "with --settle-ms 0 the first answer is PENDING or RUNNING"
                return reply
            assert asyncio.get_running_loop().time() < deadline, reply
            await asyncio.sleep(0.02)

    created = await settle("CreateWorkspace", {"metadata": {"commandId": new_id("curl")}, "spec": {}})
    workspace_id = created["workspace"]["workspaceId"]

    status, error = await post(
        "StartWorkspace", {"metadata": {"commandId": new_id("curl")}, "workspaceId": workspace_id}
    )
    assert status == 400, error  # Connect maps failed_precondition to HTTP 400
    conflict_details(error)

    status, reply = await post("GetWorkspace", {"workspaceId": workspace_id})
    assert status == 200
    assert reply["workspace"]["state"] == "WORKSPACE_STATE_AVAILABLE", reply

    deleted = await settle("DeleteWorkspace", {"metadata": {"commandId": new_id("curl")}, "workspaceId": workspace_id})
    assert deleted["workspace"]["state"] in ("WORKSPACE_STATE_DELETING", "WORKSPACE_STATE_DELETED")
    status, error = await post("GetWorkspace", {"workspaceId": "ws-doesnotexist"})
    assert (status, error["code"]) == (404, "not_found")


# -- the Node client (@connectrpc/connect-node) -----------------------------------------------

NODE_TRANSPORTS = {
    "connect-h1-json": ("h1", "http", ("--transport", "connect", "--http", "1.1")),
    "connect-h1-binary": ("h1", "http", ("--transport", "connect", "--http", "1.1", "--binary")),
    "connect-h2c-binary": ("h2", "http", ("--transport", "connect", "--http", "2", "--binary")),
    "connect-h2c-json": ("h2", "http", ("--transport", "connect", "--http", "2")),
    "grpcweb-h1": ("h1", "http", ("--transport", "grpc-web", "--http", "1.1")),
    "grpcweb-h2c": ("h2", "http", ("--transport", "grpc-web", "--http", "2")),
    "grpc-grpc-listener": ("h1", "grpc", ("--transport", "grpc")),
}


def _finished_workspace(output: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith("ok ")]
    return line.removeprefix("ok ")


@pytest.mark.parametrize("transport", list(NODE_TRANSPORTS))
async def test_node_client(transport: str, node_client: list[str], request: pytest.FixtureRequest) -> None:
    server_name, port, flags = NODE_TRANSPORTS[transport]
    server: ServerProcess = request.getfixturevalue(server_name)
    address = server.http_address if port == "http" else server.address
    result = (await run(*node_client, "--base-url", f"http://{address}", *flags, cwd=NODE_EXAMPLE)).check()
    out = result.stdout
    assert "reason=ERROR_REASON_CONFLICT workspace_state=AVAILABLE" in out, out
    for operation in ("create", "stop", "start", "delete"):
        assert f"{operation}: call 1: COMMAND_STATE_" in out, f"{operation} was not settled by resending:\n{out}"
    assert "stop durability: STOP_DURABILITY_CONFIRMED" in out, out
    async with Client.connect(server.address) as client:
        workspace = await client.get(_finished_workspace(out))
    assert workspace.state == S.WORKSPACE_STATE_DELETED


# -- the Go client (grpc-go) ------------------------------------------------------------------


async def test_go_client(go_client: Path, h1: ServerProcess, grpc_client: Client) -> None:
    result = (await run(go_client, "-addr", h1.address, "-timeout", f"{int(TIMEOUT)}s")).check()
    out = result.stdout
    assert "error detail: reason=ERROR_REASON_CONFLICT workspace_state=AVAILABLE" in out, out
    assert "error info: reason=CONFLICT domain=" in out, out
    assert "conflict: code=FailedPrecondition reason=ERROR_REASON_CONFLICT" in out, out
    assert "is COMMAND_STATE_PENDING: resending" in out or "is COMMAND_STATE_RUNNING: resending" in out, out
    assert "stopped: WORKSPACE_STATE_STOPPED durability=STOP_DURABILITY_CONFIRMED" in out, out
    assert "started: WORKSPACE_STATE_AVAILABLE" in out, out
    (deleted,) = [line.removeprefix("deleted: ") for line in out.splitlines() if line.startswith("deleted: ")]
    assert out.rstrip().endswith("ok"), out
    workspace = await grpc_client.get(deleted)
    assert workspace.state == S.WORKSPACE_STATE_DELETED
