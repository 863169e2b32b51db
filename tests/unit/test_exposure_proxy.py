"""The exposure listener (transport/exposure_proxy.py) over real sockets on 127.0.0.1: a
test router whose targets open connections to a backend this test runs (HTTP/1.1 with h11,
WebSocket with wsproto, HTTP/2 with h2), so no guest is needed."""

from __future__ import annotations

import asyncio
import gc
import resource
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h11
import pytest
import pytest_asyncio
import wsproto
import wsproto.events
from kibo_ctrl.runtime.base import GuestRefused
from kibo_ctrl.transport.exposure_proxy import (
    ExposureLimits,
    ExposureProxy,
    ExposureRefused,
    ExposureTarget,
    UpstreamStream,
)

pytestmark = pytest.mark.asyncio

HOST = "3000-ws-abc.localhost"
TOKEN = "tok-good_1"
MIB = 1024 * 1024
BIG = 100 * MIB
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


# -- the backend: what the guest would serve ----------------------------------------------------


class Backend:
    """HTTP/1.1 (/hello echoes the request head; /stream: chunked, a part every 0.2 s;
    /big: BIG bytes; /ws: a WebSocket echo) and HTTP/2 with prior knowledge (/hello)."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []  # every request head received, raw
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        # Python 3.11: wait_closed does not wait for handlers; they end as their peer closes.

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.readexactly(len(H2_PREFACE))
        except asyncio.IncompleteReadError:
            writer.close()
            return
        try:
            if first == H2_PREFACE:
                await self._serve_h2(first, reader, writer)
            else:
                await self._serve_h1(first, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _serve_h1(self, data: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buffer = bytearray(data)
        while True:
            while b"\r\n\r\n" not in buffer:
                more = await reader.read(65536)
                if not more:
                    return
                buffer += more
            end = buffer.index(b"\r\n\r\n") + 4
            head, rest = bytes(buffer[:end]), bytes(buffer[end:])
            self.heads.append(head)
            target = head.split(b" ", 2)[1]
            if target == b"/ws":
                await self._serve_ws(head + rest, reader, writer)
                return
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if b"transfer-encoding: chunked" in head.lower():  # the tests' bodies: one chunk
                while b"\r\n0\r\n\r\n" not in rest:
                    rest += await reader.read(65536)
                length = rest.index(b"\r\n0\r\n\r\n") + 7
            while len(rest) < length:
                rest += await reader.read(65536)
            buffer = bytearray(rest[length:])
            if target == b"/stream":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(5):
                    part = f"part {i}\n".encode()
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    await writer.drain()
                    await asyncio.sleep(0.2)
                writer.write(b"0\r\n\r\n")
            elif target == b"/big":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG)
                block = b"x" * (1 << 20)
                for _ in range(BIG // len(block)):
                    writer.write(block)
                    await writer.drain()
            elif target == b"/endless":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n")
                while True:
                    writer.write(b"y" * 65536)
                    await writer.drain()
                    await asyncio.sleep(0.01)
            else:
                body = head
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def _serve_ws(self, data: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        ws.receive_data(data)
        while True:
            for event in ws.events():
                if isinstance(event, wsproto.events.Request):
                    writer.write(ws.send(wsproto.events.AcceptConnection()))
                elif isinstance(event, wsproto.events.TextMessage):
                    writer.write(ws.send(wsproto.events.Message(data="echo: " + event.data)))
                elif isinstance(event, wsproto.events.CloseConnection):
                    writer.write(ws.send(event.response()))
                    await writer.drain()
                    return
            await writer.drain()
            more = await reader.read(65536)
            if not more:
                return
            ws.receive_data(more)

    async def _serve_h2(self, data: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        while True:
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    headers = {str(name): str(value) for name, value in event.headers or ()}
                    body = f"h2 {headers.get(':path')} token={headers.get('x-kibo-exposure-token')}".encode()
                    conn.send_headers(event.stream_id or 1, [(":status", "200"), ("content-length", str(len(body)))])
                    conn.send_data(event.stream_id or 1, body, end_stream=True)
            writer.write(conn.data_to_send())
            await writer.drain()
            data = await reader.read(65536)
            if not data:
                return


# -- the router ---------------------------------------------------------------------------------


class TcpUpstream:
    """UpstreamStream over a TCP connection (the runtime's GuestStream in these tests)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self) -> bytes:
        return await self._reader.read(65536)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def write_eof(self) -> None:
        if not self._writer.is_closing():
            self._writer.write_eof()

    async def close(self) -> None:
        self._writer.close()


@dataclass
class Router:
    backend_port: int
    revoked: asyncio.Event = field(default_factory=asyncio.Event)
    refusal: ExposureRefused | None = None
    open_refusal: GuestRefused | None = None
    tokens_seen: list[str | None] = field(default_factory=list)
    hosts_seen: list[str] = field(default_factory=list)
    opened: int = 0

    async def route(self, host: str, token: str | None) -> ExposureTarget:
        self.hosts_seen.append(host)
        self.tokens_seen.append(token)
        if self.refusal is not None:
            raise self.refusal
        if host != HOST:
            raise ExposureRefused(404, f"no exposure at {host}")
        if token != TOKEN:
            raise ExposureRefused(401, "this exposure needs its token")
        return ExposureTarget("ws-abc", 3000, host, self._open, self.revoked)

    async def _open(self) -> UpstreamStream:
        if self.open_refusal is not None:
            raise self.open_refusal
        self.opened += 1
        reader, writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        return TcpUpstream(reader, writer)


@dataclass
class Setup:
    backend: Backend
    router: Router
    proxy: ExposureProxy


async def make_setup(limits: ExposureLimits | None = None) -> AsyncIterator[Setup]:
    backend = Backend()
    await backend.start()
    router = Router(backend.port)
    proxy = ExposureProxy(router, "127.0.0.1:0", None, limits or ExposureLimits())
    await proxy.start()
    try:
        yield Setup(backend, router, proxy)
    finally:
        await proxy.stop()
        await backend.stop()


@pytest_asyncio.fixture
async def setup() -> AsyncIterator[Setup]:
    async for value in make_setup():
        yield value


# -- a client ------------------------------------------------------------------------------------


def request_bytes(target: str = "/hello", headers: list[tuple[str, str]] | None = None, host: str = HOST) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}:8090"] + [f"{k}: {v}" for k, v in headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def exchange(port: int, data: bytes) -> tuple[h11.Response, bytes]:
    """Send DATA on a new connection; the first response and its whole body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()


class Responses:
    """Reads responses one after another off one connection (h11, client side)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._client = h11.Connection(h11.CLIENT)

    async def next(self) -> tuple[h11.Response, bytes]:
        client = self._client
        if client.our_state is h11.DONE and client.their_state is h11.DONE:
            client.start_next_cycle()
        client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        client.send(h11.EndOfMessage())
        response: h11.Response | None = None
        body = bytearray()
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await asyncio.wait_for(self._reader.read(65536), 10))
                continue
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                assert response is not None
                return response, bytes(body)


async def read_response(reader: asyncio.StreamReader) -> tuple[h11.Response, bytes]:
    return await Responses(reader).next()


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((v for n, v in response.headers if n == name), None)


# -- the tests -----------------------------------------------------------------------------------


async def test_a_get_goes_through_to_the_exposed_port(setup: Setup) -> None:
    response, body = await exchange(setup.proxy.port, request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN)]))
    assert response.status_code == 200
    assert body.startswith(b"GET /hello HTTP/1.1\r\n")
    assert setup.router.hosts_seen == [HOST]  # lowercase, without the listener's port


async def test_the_token_header_and_cookie_are_not_forwarded_upstream(setup: Setup) -> None:
    response, body = await exchange(
        setup.proxy.port,
        request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN), ("Cookie", f"a=1; kibo_exposure_token={TOKEN}; b=2")]),
    )
    assert response.status_code == 200
    assert TOKEN.encode() not in body and b"kibo_exposure_token" not in body.lower()
    assert b"x-kibo-exposure-token" not in body.lower()
    assert b"Cookie: a=1; b=2\r\n" in body
    # Later requests on the same keep-alive connection are rewritten too (same exposure).
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
    responses = Responses(reader)
    try:
        for _ in range(3):
            writer.write(request_bytes(headers=[("Cookie", f"kibo_exposure_token={TOKEN}")]))
            await writer.drain()
            response, body = await responses.next()
            assert response.status_code == 200
            assert TOKEN.encode() not in body
        writer.write(
            b"POST /hello HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n" + request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN)])
        )
        await writer.drain()
        for _ in range(2):
            response, body = await responses.next()
            assert response.status_code == 200
            assert TOKEN.encode() not in body
    finally:
        writer.close()
    assert setup.router.opened == 2
    assert len(setup.backend.heads) == 6
    assert not any(TOKEN.encode() in head for head in setup.backend.heads)


async def test_a_token_by_cookie_and_by_query_with_a_redirect_that_sets_the_cookie(setup: Setup) -> None:
    response, _ = await exchange(setup.proxy.port, request_bytes(headers=[("Cookie", f"kibo_exposure_token={TOKEN}")]))
    assert response.status_code == 200
    response, _ = await exchange(setup.proxy.port, request_bytes(target=f"/app?x=1&kibo_token={TOKEN}&y=2"))
    assert response.status_code == 303
    assert header(response, b"location") == b"/app?x=1&y=2"
    cookie = header(response, b"set-cookie")
    assert cookie == f"kibo_exposure_token={TOKEN}; HttpOnly; SameSite=Lax; Path=/".encode()  # no Secure: no TLS
    assert setup.router.opened == 1  # the redirect opened nothing
    response, body = await exchange(
        setup.proxy.port, request_bytes(target="/app?x=1&y=2", headers=[("Cookie", cookie.split(b";")[0].decode())])
    )
    assert response.status_code == 200
    assert body.startswith(b"GET /app?x=1&y=2 HTTP/1.1")
    # A bad token in the query is 401, and sets no cookie.
    response, body = await exchange(setup.proxy.port, request_bytes(target="/app?kibo_token=nope"))
    assert response.status_code == 401 and header(response, b"set-cookie") is None
    # None at all: the router says why.
    response, body = await exchange(setup.proxy.port, request_bytes())
    assert response.status_code == 401 and b"token" in body
    assert None in setup.router.tokens_seen


async def test_a_token_that_could_inject_a_header_is_refused(setup: Setup) -> None:
    response, _ = await exchange(setup.proxy.port, request_bytes(target="/?kibo_token=a%0d%0aSet-Cookie:%20x=1"))
    assert response.status_code == 401
    assert header(response, b"set-cookie") is None


async def test_router_refusals_pass_through_with_their_status_and_message(setup: Setup) -> None:
    response, body = await exchange(setup.proxy.port, request_bytes(host="9-ws-none.localhost"))
    assert response.status_code == 404 and body == b"no exposure at 9-ws-none.localhost\n"
    message = "workspace ws-abc is STOPPED: exposures end at a stop; create a new one after the start"
    setup.router.refusal = ExposureRefused(410, message)
    response, body = await exchange(setup.proxy.port, request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN)]))
    assert response.status_code == 410 and body == (message + "\n").encode()
    assert header(response, b"content-type") == b"text/plain; charset=utf-8"


async def test_nothing_listening_on_the_port_is_502_naming_the_port(setup: Setup) -> None:
    setup.router.open_refusal = GuestRefused("port-closed", "connection refused")
    response, body = await exchange(setup.proxy.port, request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN)]))
    assert response.status_code == 502
    assert body == b"nothing listens on port 3000 in workspace ws-abc\n"
    setup.router.open_refusal = GuestRefused("unavailable", "the guest is restarting")
    response, body = await exchange(setup.proxy.port, request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN)]))
    assert response.status_code == 503 and header(response, b"retry-after") == b"1"


async def test_a_request_without_host_is_400(setup: Setup) -> None:
    response, body = await exchange(setup.proxy.port, b"GET / HTTP/1.0\r\n\r\n")
    assert response.status_code == 400 and b"Host" in body
    assert setup.router.hosts_seen == []


async def test_a_streamed_response_arrives_part_by_part(setup: Setup) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
    try:
        writer.write(request_bytes(target="/stream", headers=[("X-Kibo-Exposure-Token", TOKEN)]))
        start = time.monotonic()
        arrivals = []
        received = b""
        while b"0\r\n\r\n" not in received:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data
            received += data
            arrivals.append(time.monotonic() - start)
        assert received.count(b"part ") == 5
        assert len(arrivals) >= 4  # not one block at the end
        assert arrivals[0] < 0.15  # the first part did not wait for the rest (they take 1 s)
    finally:
        writer.close()


async def test_a_100_mib_download(setup: Setup) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
    try:
        writer.write(request_bytes(target="/big", headers=[("X-Kibo-Exposure-Token", TOKEN)]))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: %d" % BIG in head
        total = 0
        while total < BIG:
            data = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert data
            total += len(data)
        assert total == BIG
    finally:
        writer.close()


async def websocket(port: int) -> tuple[wsproto.WSConnection, asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket to /ws through the proxy, token by cookie (as a browser's would be)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    writer.write(
        ws.send(
            wsproto.events.Request(
                host=HOST, target="/ws", extra_headers=[(b"cookie", f"kibo_exposure_token={TOKEN}".encode())]
            )
        )
    )
    await writer.drain()
    while True:
        ws.receive_data(await asyncio.wait_for(reader.read(65536), 5))
        if any(isinstance(event, wsproto.events.AcceptConnection) for event in ws.events()):
            return ws, reader, writer


async def ws_echo(
    ws: wsproto.WSConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, text: str
) -> str:
    writer.write(ws.send(wsproto.events.Message(data=text)))
    await writer.drain()
    while True:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "the WebSocket was closed"
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, wsproto.events.TextMessage):
                return str(event.data)


async def test_a_websocket_echo(setup: Setup) -> None:
    ws, reader, writer = await websocket(setup.proxy.port)
    try:
        for i in range(3):
            assert await ws_echo(ws, reader, writer, f"hi {i}") == f"echo: hi {i}"
    finally:
        writer.close()
    assert b"kibo_exposure_token" not in setup.backend.heads[0]


async def cut_seconds(reader: asyncio.StreamReader, revoked: asyncio.Event) -> float:
    """Sets REVOKED, then reads until the proxy closes the connection: the seconds it took."""
    start = time.monotonic()
    revoked.set()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        while time.monotonic() - start < 5:  # a download not cut keeps sending: a deadline of its own
            data = await asyncio.wait_for(reader.read(1 << 20), 5)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
    return time.monotonic() - start


async def test_revocation_cuts_an_open_websocket_and_a_download(setup: Setup) -> None:
    ws, ws_reader, ws_writer = await websocket(setup.proxy.port)
    assert await ws_echo(ws, ws_reader, ws_writer, "before") == "echo: before"
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
    writer.write(request_bytes(target="/endless", headers=[("X-Kibo-Exposure-Token", TOKEN)]))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    await reader.read(65536)
    try:
        revoked = setup.router.revoked
        start = time.monotonic()
        websocket_cut = asyncio.create_task(cut_seconds(ws_reader, revoked))
        download_cut = await cut_seconds(reader, revoked)
        ws_seconds = await websocket_cut
        assert time.monotonic() - start < 1.0
        print(f"revocation cut: websocket {ws_seconds * 1000:.1f} ms, download {download_cut * 1000:.1f} ms")
        assert ws_seconds < 1.0 and download_cut < 1.0
    finally:
        ws_writer.close()
        writer.close()


async def test_h2c_with_prior_knowledge(setup: Setup) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    headers = [(":method", "GET"), (":path", "/h2path"), (":scheme", "http"), (":authority", f"{HOST}:8090")]
    conn.send_headers(1, [*headers, ("x-kibo-exposure-token", TOKEN)], end_stream=True)
    writer.write(conn.data_to_send())
    await writer.drain()
    status, body = await h2_response(conn, reader, writer)
    writer.close()
    assert status == "200"
    assert body.startswith(b"h2 /h2path")
    # Refused on h2: an HTTP/2 answer, not an HTTP/1 one.
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, headers, end_stream=True)
    writer.write(conn.data_to_send())
    status, body = await h2_response(conn, reader, writer)
    writer.close()
    assert status == "401" and b"token" in body


async def h2_response(
    conn: h2.connection.H2Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[str, bytes]:
    status, body = "", b""
    while True:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "closed before the response ended"
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status = {str(name): str(value) for name, value in event.headers or ()}[":status"]
            elif isinstance(event, h2.events.DataReceived):
                body += event.data or b""
            elif isinstance(event, h2.events.StreamEnded):
                return status, body
        writer.write(conn.data_to_send())


async def test_a_head_over_16_kib_is_431_and_closed() -> None:
    async for setup in make_setup(ExposureLimits(header_timeout_s=2)):
        reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: " + HOST.encode() + b"\r\nX-Pad: " + b"a" * 17_000)
            await writer.drain()
            response, _body = await read_response(reader)
            assert response.status_code == 431
            assert await asyncio.wait_for(reader.read(), 2) == b""  # closed
        finally:
            writer.close()
        assert setup.router.hosts_seen == []


async def test_a_client_that_never_sends_its_head_is_cut_after_the_timeout() -> None:
    async for setup in make_setup(ExposureLimits(header_timeout_s=0.3)):
        reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.port)
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: ")  # and then nothing
            start = time.monotonic()
            response, _ = await read_response(reader)
            assert response.status_code == 408
            assert await asyncio.wait_for(reader.read(), 2) == b""
            assert 0.25 < time.monotonic() - start < 2.0
        finally:
            writer.close()


async def test_a_thousand_idle_connections_are_held_within_the_cap() -> None:
    """1,000 connections that send nothing: at most the cap are held (the rest closed at accept),
    and the process's memory does not grow with them past a bound."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2600:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    cap = 200
    async for setup in make_setup(
        ExposureLimits(max_connections=cap, max_connections_per_client=cap, header_timeout_s=30)
    ):
        gc.collect()
        rss_before = resident_kib()
        sockets = []
        try:
            for _ in range(1000):
                sock = socket.socket()
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", setup.proxy.port))
                sockets.append(sock)
            await asyncio.sleep(0.5)
            assert setup.proxy.caps.open == cap
            grown = resident_kib() - rss_before
            assert grown < 20 * 1024, f"{grown} KiB for {cap} idle connections"
            # The refused ones were closed by the proxy: a read sees the end at once.
            closed = 0
            for sock in sockets[cap:]:
                try:
                    closed += sock.recv(1) == b""
                except (BlockingIOError, ConnectionError):
                    closed += 1
            assert closed >= 1000 - cap - 5
        finally:
            for sock in sockets:
                sock.close()
        # A connection after they are gone is served.
        await asyncio.sleep(0.2)
        response, _ = await exchange(setup.proxy.port, request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN)]))
        assert response.status_code == 200


def resident_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_metrics_count_answers_bytes_errors_and_open_connections() -> None:
    """The telemetry adapter sees each answer's class, the bytes each way and the errors; no
    workspace or host is a label."""
    from kibo_ctrl.telemetry.metrics import Metrics

    metrics = Metrics()
    backend = Backend()
    await backend.start()
    router = Router(backend.port)
    proxy = ExposureProxy(router, "127.0.0.1:0", None, ExposureLimits(), metrics.exposure_observer())
    await proxy.start()
    try:
        response, body = await exchange(proxy.port, request_bytes(headers=[("X-Kibo-Exposure-Token", TOKEN)]))
        assert response.status_code == 200
        response, _ = await exchange(proxy.port, request_bytes())
        assert response.status_code == 401
        await asyncio.sleep(0.05)
        value = metrics.registry.get_sample_value
        assert value("kibo_exposure_requests_total", {"code_class": "2xx"}) == 1
        assert value("kibo_exposure_requests_total", {"code_class": "4xx"}) == 1
        assert value("kibo_exposure_errors_total", {"kind": "refused"}) == 1
        assert (value("kibo_exposure_bytes_total", {"direction": "from_guest"}) or 0) > len(body)
        assert (value("kibo_exposure_bytes_total", {"direction": "to_guest"}) or 0) > 0
        assert value("kibo_exposure_connections_open", {}) == 0
        text = metrics.render([], {}).decode()
        assert "ws-abc" not in text and HOST not in text
    finally:
        await proxy.stop()
        await backend.stop()
