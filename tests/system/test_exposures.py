"""Exposures end to end (issue 28): a real `kibo-ctrl serve` (process runtime, tokens on), a
web server in the guest (HTTP, a streamed response, a WebSocket echo), reached through the
exposure listener by its URL `{port}-{workspace}.localhost`: tokens by header, cookie and
the ?kibo_token= form; 502 naming the port while nothing listens; each way an exposure ends
(delete it, revoke, stop, force stop, delete the workspace, the guest's crash) cuts an open
WebSocket and answers later requests 404/410; a new exposure after the next start works.
A token opens only its own exposure; another tenant can neither use nor see it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import wsproto
import wsproto.events
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S, error_of, meta
from tests.nodes import list_nodes
from tests.server import ServerProcess, free_port
from tests.system.test_durability import eventually
from tests.system.test_guest_ports import _node, _placed_on
from tests.system.test_process_runtime import SMALL, DataPlane, _require_sandbox, reap, supervisors
from tests.system.test_resource_model import PROCESS, process_server

PORT = 8000

# The guest's web server (python3's standard library only): GET /hello, GET /stream (five
# chunks 0.2 s apart, chunked), GET /ws (a WebSocket echo of text and binary messages).
GUEST_WEB = r"""
import base64, hashlib, socket, struct, sys, threading, time

def reply(conn, status, body, extra=b""):
    conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % len(body) + extra + b"\r\n" + body)

def websocket(conn, key):
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    stream = conn.makefile("rb")
    while True:
        head = stream.read(2)
        if len(head) < 2:
            return
        opcode, size = head[0] & 0x0F, head[1] & 0x7F
        if size == 126:
            size = struct.unpack("!H", stream.read(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", stream.read(8))[0]
        mask = stream.read(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(stream.read(size)))
        if opcode == 8:
            conn.sendall(b"\x88\x00")
            return
        if size < 126:
            conn.sendall(bytes([0x80 | opcode, size]) + data)
        else:
            conn.sendall(bytes([0x80 | opcode, 126]) + struct.pack("!H", size) + data)

def handle(conn):
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        lines = head.split(b"\r\n")
        path = lines[0].split(b" ")[1]
        headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(b":") for l in lines[1:] if l)}
        if path == b"/hello":
            told = b"x-kibo-exposure-token" in headers or b"kibo_exposure_token" in headers.get(b"cookie", b"")
            seen = b"token=" + (b"yes" if told else b"no")
            reply(conn, b"200 OK", b"hello from the guest; " + seen + b"; host=" + headers.get(b"host", b""))
        elif path == b"/stream":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(5):
                part = b"part %d\n" % i
                conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
                time.sleep(0.2)
            conn.sendall(b"0\r\n\r\n")
        elif path == b"/ws":
            websocket(conn, headers[b"sec-websocket-key"])
        else:
            reply(conn, b"404 Not Found", b"no such page")

listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", int(sys.argv[1])))
listener.listen(64)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
"""


def make_token(server: ServerProcess, tenant: str) -> str:
    command = [sys.executable, "-m", "kibo_ctrl", "token", "create", "--data-dir", str(server.data_dir)]
    done = subprocess.run([*command, "--tenant", tenant], capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def exposing(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    _require_sandbox()
    # A supervisor per instance: the guest-crash case kills the instance's own (its "VMM").
    server = server_factory(*PROCESS, "--supervisor", "instance", auth=True)
    try:
        yield server
        server.stop()
    finally:
        reap(server.data_dir)


@contextlib.asynccontextmanager
async def connected(server: ServerProcess, token: str | None = None) -> AsyncIterator[Client]:
    async with Client.connect(server.address, token or server.admin_token) as client:
        yield client


async def closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


class Http:
    """Requests to the exposure listener, one connection each (as `curl` makes them)."""

    def __init__(self, server: ServerProcess) -> None:
        self.port = server.exposure_port

    async def open(self, host: str, path: str, headers: dict[str, str] | None = None) -> Any:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        return reader, writer

    async def get(self, host: str, path: str = "/hello", headers: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(status, head, body) of one request."""
        reader, writer = await self.open(host, path, headers)
        try:
            raw = await asyncio.wait_for(reader.read(), 15)
        finally:
            await closed(writer)
        head, _, body = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        return status, head.decode(), body.decode(errors="replace")


async def running_with_web(client: Client, port: int = PORT) -> wp.Workspace:
    """An AVAILABLE workspace whose guest serves GUEST_WEB on `port`."""
    workspace = await client.create(resources=SMALL)
    workspace = await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
    await serve_web(client, workspace.workspace_id, port)
    return workspace


async def serve_web(client: Client, workspace_id: str, port: int = PORT) -> None:
    plane = DataPlane(client)
    credential = await plane.credential(workspace_id)
    await plane.write(credential, "/data/web.py", GUEST_WEB.encode())
    script = f"setsid python3 /data/web.py {port} </dev/null >/data/web.log 2>&1 &"
    code, out, err = await plane.exec(credential, "sh", "-c", script)
    assert code == 0, (out, err)


async def expose(client: Client, workspace_id: str, port: int = PORT, public: bool = False) -> wp.Exposure:
    access = wp.EXPOSURE_ACCESS_PUBLIC if public else wp.EXPOSURE_ACCESS_TOKEN
    request = ws.CreateWorkspaceExposureRequest(metadata=meta(), workspace_id=workspace_id, port=port, access=access)
    answer = await client.ws.CreateWorkspaceExposure(request)
    exposure: wp.Exposure = answer.exposure
    assert exposure.url.startswith(f"http://{port}-{workspace_id}.localhost:")
    assert bool(exposure.token) is not public
    return exposure


def url_host(exposure: wp.Exposure) -> str:
    return exposure.url.split("//", 1)[1].rstrip("/")


async def answered(http: Http, exposure: wp.Exposure, **headers: str) -> tuple[int, str, str]:
    """GET /hello, retried while the guest's server is not listening yet (502)."""
    result: tuple[int, str, str] = (0, "", "")

    async def ready() -> bool:
        nonlocal result
        result = await http.get(url_host(exposure), "/hello", headers)
        return result[0] != 502

    await eventually(ready, within=20, what="the guest's web server")
    return result


class WebSocket:
    """A WebSocket client (wsproto) through the exposure listener."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)

    @classmethod
    async def open(cls, http: Http, exposure: wp.Exposure) -> WebSocket:
        reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
        socket = cls(reader, writer)
        request = wsproto.events.Request(
            host=url_host(exposure),
            target="/ws",
            extra_headers=[(b"x-kibo-exposure-token", exposure.token.encode())] if exposure.token else [],
        )
        writer.write(socket.ws.send(request))
        await writer.drain()
        event = await socket._event()
        assert isinstance(event, wsproto.events.AcceptConnection), event
        return socket

    async def _event(self) -> Any:
        while True:
            for event in self.ws.events():
                return event
            data = await asyncio.wait_for(self.reader.read(65536), 10)
            if not data:
                return None
            self.ws.receive_data(data)

    async def echo(self, text: str) -> str:
        self.writer.write(self.ws.send(wsproto.events.TextMessage(data=text)))
        await self.writer.drain()
        event = await self._event()
        assert isinstance(event, wsproto.events.TextMessage), event
        return str(event.data)

    async def cut_within(self, seconds: float) -> float:
        """Wait for the listener to cut the connection: how long it took."""
        started = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while await asyncio.wait_for(self.reader.read(65536), seconds):
                pass
        return time.monotonic() - started


# -- an exposure serves ------------------------------------------------------------------------


async def test_an_exposure_serves_http_a_stream_and_a_websocket(exposing: ServerProcess) -> None:
    http = Http(exposing)
    async with connected(exposing) as client:
        workspace = await running_with_web(client)
        exposure = await expose(client, workspace.workspace_id)
        host = url_host(exposure)
        # The token in a header; the guest never sees it (stripped).
        status, _, body = await answered(http, exposure, **{"X-Kibo-Exposure-Token": exposure.token})
        assert status == 200 and body.startswith("hello from the guest; token=no"), body
        assert f"host={host}" in body
        # Without it: 401 saying how; another token: 403.
        status, _, body = await http.get(host)
        assert status == 401 and "X-Kibo-Exposure-Token" in body, body
        status, _, _ = await http.get(host, headers={"X-Kibo-Exposure-Token": "kex1_" + "A" * 43})
        assert status == 403
        # The browser's form: ?kibo_token= answers 303 with a cookie, which then opens it.
        status, head, _ = await http.get(host, f"/hello?kibo_token={exposure.token}")
        assert status == 303 and "Set-Cookie: kibo_exposure_token=" in head and "HttpOnly" in head, head
        cookie = head.split("Set-Cookie: ", 1)[1].split(";", 1)[0]
        status, _, body = await http.get(host, headers={"Cookie": cookie})
        assert status == 200 and "token=no" in body, body
        # A streamed response arrives as it is made (five parts 0.2 s apart), not at its end.
        reader, writer = await http.open(host, "/stream", {"X-Kibo-Exposure-Token": exposure.token})
        try:
            arrivals: list[float] = []
            received = b""
            while len(arrivals) < 5 and (chunk := await asyncio.wait_for(reader.read(4096), 10)):
                received += chunk
                arrivals += [time.monotonic()] * (received.count(b"part ") - len(arrivals))
            assert len(arrivals) == 5, received
            assert arrivals[-1] - arrivals[0] > 0.5, arrivals
        finally:
            await closed(writer)
        # A WebSocket echo.
        socket = await WebSocket.open(http, exposure)
        assert await socket.echo("hello over a websocket") == "hello over a websocket"
        await closed(socket.writer)
        # Listed, without its token.
        listed = await client.ws.ListWorkspaceExposures(
            ws.ListWorkspaceExposuresRequest(workspace_id=workspace.workspace_id)
        )
        assert [(e.exposure_id, e.port, e.token) for e in listed.exposures] == [(exposure.exposure_id, PORT, "")]
        await client.delete(workspace.workspace_id)


async def test_a_port_nothing_listens_on_answers_502_naming_it(exposing: ServerProcess) -> None:
    http = Http(exposing)
    async with connected(exposing) as client:
        workspace = await client.create(resources=SMALL)
        await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
        exposure = await expose(client, workspace.workspace_id, 8123, public=True)
        status, _, body = await http.get(url_host(exposure))
        assert status == 502 and "port 8123" in body and "nothing listens" in body, body
        # Then the server starts: the same URL answers.
        await serve_web(client, workspace.workspace_id, 8123)
        status, _, body = await answered(http, exposure)
        assert status == 200, body
        await client.delete(workspace.workspace_id)


async def test_a_token_opens_only_its_exposure_and_another_tenant_sees_none(exposing: ServerProcess) -> None:
    http = Http(exposing)
    other_token = make_token(exposing, "other-tenant")
    async with connected(exposing) as client, connected(exposing, other_token) as other:
        workspace = await running_with_web(client)
        await serve_web(client, workspace.workspace_id, PORT + 1)
        first = await expose(client, workspace.workspace_id, PORT)
        second = await expose(client, workspace.workspace_id, PORT + 1)
        assert (await answered(http, first, **{"X-Kibo-Exposure-Token": first.token}))[0] == 200
        assert (await answered(http, second, **{"X-Kibo-Exposure-Token": second.token}))[0] == 200
        # One exposure's token does not open the other; an API token opens none.
        assert (await http.get(url_host(second), headers={"X-Kibo-Exposure-Token": first.token}))[0] == 403
        assert (await http.get(url_host(first), headers={"X-Kibo-Exposure-Token": other_token}))[0] == 403
        # One port, one exposure.
        with pytest.raises(grpc.aio.AioRpcError) as twice:
            await expose(client, workspace.workspace_id, PORT)
        assert error_of(twice.value).reason == "CONFLICT"
        # Another tenant: the workspace does not exist for it.
        for call in (
            other.ws.ListWorkspaceExposures(ws.ListWorkspaceExposuresRequest(workspace_id=workspace.workspace_id)),
            other.ws.CreateWorkspaceExposure(
                ws.CreateWorkspaceExposureRequest(metadata=meta(), workspace_id=workspace.workspace_id, port=9)
            ),
            other.ws.DeleteWorkspaceExposure(
                ws.DeleteWorkspaceExposureRequest(
                    metadata=meta(), workspace_id=workspace.workspace_id, exposure_id=first.exposure_id
                )
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert (await http.get(url_host(first), headers={"X-Kibo-Exposure-Token": first.token}))[0] == 200
        await client.delete(workspace.workspace_id)


# -- every way an exposure ends cuts its open connections -----------------------------------


async def _end(client: Client, server: ServerProcess, workspace: wp.Workspace, exposure: wp.Exposure, how: str) -> int:
    """End the exposure `how`; the HTTP status a request gets afterwards."""
    workspace_id = workspace.workspace_id
    if how == "unexpose":
        await client.ws.DeleteWorkspaceExposure(
            ws.DeleteWorkspaceExposureRequest(
                metadata=meta(), workspace_id=workspace_id, exposure_id=exposure.exposure_id
            )
        )
        return 404
    if how == "revoke":
        await client.ws.RevokeWorkspaceDataPlaneAccess(
            ws.RevokeWorkspaceDataPlaneAccessRequest(metadata=meta(), workspace_id=workspace_id)
        )
        return 404
    if how in ("stop", "force-stop"):
        await client.stop(workspace_id, force=how == "force-stop")
        return 410
    if how == "delete":
        await client.delete(workspace_id)
        return 404  # DELETED: no such exposure (410 while DELETING)
    assert how == "guest-crash"
    for supervisor in supervisors(server, workspace):
        os.kill(supervisor, signal.SIGKILL)
    return 410


@pytest.mark.parametrize("how", ["unexpose", "revoke", "stop", "force-stop", "delete", "guest-crash"])
async def test_an_ended_exposure_cuts_its_open_websocket(exposing: ServerProcess, how: str) -> None:
    http = Http(exposing)
    async with connected(exposing) as client:
        workspace = await running_with_web(client)
        exposure = await expose(client, workspace.workspace_id)
        await answered(http, exposure, **{"X-Kibo-Exposure-Token": exposure.token})
        socket = await WebSocket.open(http, exposure)
        assert await socket.echo("before") == "before"
        if how == "unexpose":
            # Another exposure of the workspace, open too: only the deleted one's connection ends.
            await serve_web(client, workspace.workspace_id, PORT + 1)
            kept = await expose(client, workspace.workspace_id, PORT + 1)
            await answered(http, kept, **{"X-Kibo-Exposure-Token": kept.token})
            other = await WebSocket.open(http, kept)
        started = time.monotonic()
        expected = await _end(client, exposing, workspace, exposure, how)
        took = await socket.cut_within(5.0) + (time.monotonic() - started)
        await closed(socket.writer)
        print(f"{how}: the open WebSocket was cut {1000 * took:.0f} ms after the request")
        if how == "unexpose":
            assert await other.echo("still open") == "still open"
            await closed(other.writer)
        if how == "guest-crash":
            # The guest's end went with it; the exposure ends when the node's report is folded.
            await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_FAILED, within=30)
        status, _, body = await http.get(url_host(exposure), headers={"X-Kibo-Exposure-Token": exposure.token})
        assert status == expected or (how == "delete" and status == 410), (status, body)
        if how == "guest-crash":
            await client.stop(workspace.workspace_id, force=True)
        if how != "delete":
            await client.delete(workspace.workspace_id)


async def test_after_a_start_a_new_exposure_serves_and_the_old_one_is_gone(exposing: ServerProcess) -> None:
    http = Http(exposing)
    async with connected(exposing) as client:
        workspace = await running_with_web(client)
        old = await expose(client, workspace.workspace_id)
        await answered(http, old, **{"X-Kibo-Exposure-Token": old.token})
        await client.stop(workspace.workspace_id)
        started = await client.start(workspace.workspace_id)
        assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
        workspace_id = workspace.workspace_id
        listed = await client.ws.ListWorkspaceExposures(ws.ListWorkspaceExposuresRequest(workspace_id=workspace_id))
        assert list(listed.exposures) == []
        status, _, _ = await http.get(url_host(old), headers={"X-Kibo-Exposure-Token": old.token})
        assert status == 404
        await serve_web(client, workspace_id)
        new = await expose(client, workspace_id)
        assert new.token != old.token and new.execution_generation == old.execution_generation + 1
        status, _, body = await answered(http, new, **{"X-Kibo-Exposure-Token": new.token})
        assert status == 200, body
        # The old token does not open the new exposure of the same port.
        assert (await http.get(url_host(new), headers={"X-Kibo-Exposure-Token": old.token}))[0] == 403
        await client.delete(workspace_id)


# -- across machines: the workspace on a node agent, the URL on the control plane -------------


@pytest.mark.timeout(180)
async def test_an_exposure_of_a_workspace_on_a_node_agent_answers_through_the_control_plane(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The control plane (any replica: it reads the store) serves the URL; the bytes go
    through the node's guest hop (NodeGuestService.OpenGuestPort, mutual TLS)."""
    _require_sandbox()
    with process_server(server_factory, "--node-timeout-ms", "3000") as server:
        node = _node(server, tmp_path, "node-r", free_port()).start()
        try:
            async with Client.connect(server.address) as client:

                async def joined() -> bool | None:
                    return True if "node-r" in await list_nodes(server.address) else None

                await eventually(joined, within=30, what="node-r joined")
                local_id = next(n for n in await list_nodes(server.address) if n != "node-r")
                there = await _placed_on(client, server, "node-r", [local_id])
                await serve_web(client, there.workspace_id)
                exposure = await expose(client, there.workspace_id)
                http = Http(server)
                status, _, body = await answered(http, exposure, **{"X-Kibo-Exposure-Token": exposure.token})
                assert status == 200 and body.startswith("hello from the guest"), body
                socket = await WebSocket.open(http, exposure)
                assert await socket.echo("across machines") == "across machines"
                started = time.monotonic()
                await client.stop(there.workspace_id)
                took = await socket.cut_within(5.0) + (time.monotonic() - started)
                await closed(socket.writer)
                print(f"through the node's hop: the open WebSocket was cut {1000 * took:.0f} ms after the stop")
                assert (await http.get(url_host(exposure), headers={"X-Kibo-Exposure-Token": exposure.token}))[0] == 410
                await client.delete(there.workspace_id)
                await client.wait_for(there.workspace_id, S.WORKSPACE_STATE_DELETED, within=30)
        finally:
            node.kill()
            reap(node.data_dir)  # what the node's runtime made (its cgroups, its network)
