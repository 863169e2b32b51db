"""The exposure listener: an HTTP client's connection spliced to a TCP port in a guest.

An Exposure is a URL (`http://{port}-{workspace_id}.{domain}:{listener port}/`) to a port in a
running workspace. This module is its transport: it reads a client's first request head
(HTTP/1.1, or HTTP/2 with prior knowledge), asks the `ExposureRouter` (the API side: which
exposures exist, their tokens, revocation) for the target named by the Host header and the
token, opens the guest port and splices bytes both ways until both ends are done or the
exposure is revoked, which cuts both sides at once.

It is a listener of its own (never the API's) because the guest's content is untrusted: it must
share neither an origin nor a port with the API. The same protections as the API's HTTP port:
a cap on open connections (in all and per client address, transport/listener.py), a header
timeout, a bound on the first request head.

One upstream per client connection: later requests on a keep-alive connection go to the same
exposure, still bound to the one the first request was authorized for; their heads are
rewritten too (token header and cookie stripped) by `_RequestFramer`, which follows the
requests' framing on the way up until an upgrade (WebSocket) or CONNECT makes the rest opaque.
On HTTP/2 the bytes are replayed verbatim (HPACK's state is shared by the whole connection:
a header cannot be removed without re-encoding every later block), so there the token header
does reach the guest; the guest owns the port the token opens, so it learns nothing it could
use against another workspace.

Tokens are never logged, nor are URLs with their query."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h11

from ..runtime.base import GuestRefused
from .http import MAX_HEAD_BYTES, open_file_limit, split_address
from .listener import CappedListener, ConnectionCaps, listen
from .tls import Tls

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
TOKEN_HEADER = b"x-kibo-exposure-token"
TOKEN_COOKIE = b"kibo_exposure_token"
TOKEN_QUERY = b"kibo_token"
# Longest token accepted in any form; tokens are URL-safe text (checked char by char).
MAX_TOKEN = 512
TOKEN_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")
HOST_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-._:[]")
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
REASONS = {
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    410: "Gone",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class UpstreamStream(Protocol):
    """A connection to a port in the guest (runtime/base.py's GuestStream has this shape):
    read() answers b"" at the end of the guest's output."""

    async def read(self) -> bytes: ...
    async def write(self, data: bytes) -> None: ...
    async def write_eof(self) -> None: ...
    async def close(self) -> None: ...


@dataclass(frozen=True)
class ExposureTarget:
    workspace_id: str
    port: int
    host: str  # the request's host, for messages
    # Opens the guest port; raises GuestRefused("port-closed" | "unavailable", message).
    open: Callable[[], Awaitable[UpstreamStream]]
    # Set by the router's owner when the exposure stops being valid: every splice cut.
    revoked: asyncio.Event


class ExposureRefused(Exception):
    """No target for this request: `status` 404 | 410 | 401 | 403 | 503, `message` the body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ExposureRouter(Protocol):
    async def route(self, host: str, token: str | None) -> ExposureTarget:
        """The target for HOST (lowercase, without the port) and the request's token (None: it
        gave none); raises ExposureRefused."""
        ...


class ExposureObserver(Protocol):
    """The metrics port (telemetry/metrics.py `ExposureMetrics`); labels are fixed words only."""

    def connection_opened(self) -> None: ...
    def connection_closed(self) -> None: ...
    def answered(self, code_class: str) -> None: ...
    def error(self, kind: str) -> None: ...
    def transferred(self, direction: str, count: int) -> None: ...


class _NoObserver:
    def connection_opened(self) -> None:
        pass

    def connection_closed(self) -> None:
        pass

    def answered(self, code_class: str) -> None:
        pass

    def error(self, kind: str) -> None:
        pass

    def transferred(self, direction: str, count: int) -> None:
        pass


@dataclass(frozen=True)
class ExposureLimits:
    # Open connections; 0: a quarter of the process's open-file limit (each one may hold a
    # second descriptor upstream).
    max_connections: int = 0
    max_connections_per_client: int = 256
    # From the connection's start (TLS handshake included) to the end of the first head.
    header_timeout_s: float = 10.0
    max_head_bytes: int = MAX_HEAD_BYTES

    def caps(self) -> ConnectionCaps:
        total = self.max_connections if self.max_connections > 0 else max(16, open_file_limit() // 4)
        return ConnectionCaps(total, self.max_connections_per_client)


class _Answer(Exception):
    """Answer the client ourselves (status, text) and close; `kind` is the error metric's word."""

    def __init__(self, status: int, message: str, kind: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = headers


# -- parsing the first head ------------------------------------------------------------------


def head_end(buffer: bytes | bytearray, start: int = 0) -> int:
    """The index just past the blank line ending a head (as h11 finds it: LF CR? LF), or -1.
    Two linear scans, never a regex over client input."""
    ends = []
    for mark in (b"\n\n", b"\n\r\n"):
        at = buffer.find(mark, max(0, start - len(mark) + 1))
        if at >= 0:
            ends.append(at + len(mark))
    return min(ends) if ends else -1


def normal_host(raw: bytes) -> str:
    """The Host header's name, lowercase, without the port or a trailing dot; _Answer 400 if
    it is not a plain name or address."""
    host = raw.strip().lower()
    if host.startswith(b"["):
        close = host.find(b"]")
        name = host[: close + 1] if close > 0 else b""
    else:
        name, sep, port = host.rpartition(b":")
        if not sep:
            name = host
        elif not port.isdigit():
            name = b""
    name = name.rstrip(b".")
    if not name or len(name) > 255 or not set(name) <= HOST_CHARS:
        raise _Answer(400, "the Host header must name an exposure", "bad_request")
    return name.decode("ascii")


def check_token(raw: bytes) -> str:
    if not raw or len(raw) > MAX_TOKEN or not set(raw) <= TOKEN_CHARS:
        raise _Answer(401, "the exposure token is malformed", "bad_token")
    return raw.decode("ascii")


def split_cookies(values: list[bytes]) -> tuple[bytes | None, list[bytes]]:
    """The token cookie's value (the first) and every other cookie pair, as sent."""
    token: bytes | None = None
    others: list[bytes] = []
    for value in values:
        for pair in value.split(b";"):
            pair = pair.strip()
            if not pair:
                continue
            name, _, cookie = pair.partition(b"=")
            if name.strip() == TOKEN_COOKIE:
                token = cookie.strip().strip(b'"') if token is None else token
            else:
                others.append(pair)
    return token, others


def take_query_token(target: bytes) -> tuple[bytes | None, bytes]:
    """(the kibo_token parameter's value, the target without it); other parameters kept as sent."""
    path, sep, query = target.partition(b"?")
    if not sep:
        return None, target
    token: bytes | None = None
    kept = []
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == TOKEN_QUERY:
            token = _unquote(value) if token is None else token
        else:
            kept.append(part)
    return token, path + (b"?" + b"&".join(kept) if kept else b"")


def _unquote(value: bytes) -> bytes:
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(value.replace(b"+", b" "))


def rewrite_head(request: h11.Request) -> bytes:
    """The request head as it goes upstream: the token header and cookie removed, the rest as sent."""
    lines = [b"%s %s HTTP/%s" % (request.method, request.target, request.http_version)]
    cookies: list[bytes] = []
    for name, value in request.headers.raw_items():
        lower = name.lower()
        if lower == TOKEN_HEADER:
            continue
        if lower == b"cookie":
            cookies.append(value)
            continue
        lines.append(name + b": " + value)
    _, others = split_cookies(cookies)
    if others:
        lines.append(b"Cookie: " + b"; ".join(others))
    return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class _Http1Head:
    request: h11.Request
    rest: bytes  # what the client sent after the head (a body's start, a pipelined request)


@dataclass
class _H2Head:
    buffer: bytes  # every byte read, replayed upstream verbatim
    headers: list[tuple[bytes, bytes]]
    stream_id: int
    h2: h2.connection.H2Connection  # to answer on, when the proxy answers itself


def parse_http1(buffer: bytes, end: int, max_head: int) -> _Http1Head:
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
    parser.receive_data(buffer[:end])
    try:
        event = parser.next_event()
    except h11.RemoteProtocolError as error:
        status = 431 if error.error_status_hint == 431 else 400
        raise _Answer(status, "malformed HTTP request head", "bad_request") from None
    if not isinstance(event, h11.Request):
        raise _Answer(400, "malformed HTTP request head", "bad_request")
    return _Http1Head(event, buffer[end:])


# -- later requests on a keep-alive connection ------------------------------------------------


class _RequestFramer:
    """Follows HTTP/1.1 request framing on the way up, so each later request's head is
    rewritten like the first (token header and cookie stripped). Bounded: a head over the
    limit or a chunk-size line over 1 KiB ends the connection. After a request asking for an
    upgrade (WebSocket) or a CONNECT the rest is opaque bytes."""

    def __init__(self, max_head: int, first: h11.Request) -> None:
        self._max_head = max_head
        self._buffer = bytearray()
        self._opaque = False
        self._body = 0  # bytes of a Content-Length body still to pass
        self._chunked = False
        self._chunk_state = "size"  # size | data | data-end | trailer
        self._start_body(first)

    def feed(self, data: bytes) -> bytes:
        """What to send upstream for DATA (possibly held back: an incomplete head)."""
        if self._opaque:
            return data
        self._buffer += data
        out = bytearray()
        while self._buffer and not self._opaque:
            if self._body:
                take = min(self._body, len(self._buffer))
                out += self._buffer[:take]
                del self._buffer[:take]
                self._body -= take
                continue
            if self._chunked:
                if not self._chunk_step(out):
                    break
                continue
            end = head_end(self._buffer)
            if end < 0:
                if len(self._buffer) > self._max_head:
                    raise _Answer(431, "a request head is too large", "head_too_large")
                break
            head = bytes(self._buffer[:end])
            del self._buffer[:end]
            request = parse_http1(head, end, self._max_head).request
            out += rewrite_head(request)
            self._start_body(request)
        if self._opaque and self._buffer:
            out += self._buffer
            self._buffer.clear()
        return bytes(out)

    def _start_body(self, request: h11.Request) -> None:
        headers = {name: value for name, value in request.headers}
        if request.method == b"CONNECT" or b"upgrade" in headers:
            self._opaque = True
        elif b"chunked" in headers.get(b"transfer-encoding", b""):
            self._chunked, self._chunk_state = True, "size"
        else:
            self._body = int(headers.get(b"content-length", b"0"))

    def _chunk_step(self, out: bytearray) -> bool:
        """One step of a chunked body; False when more bytes are needed."""
        if self._chunk_state == "data":
            take = min(self._body_left, len(self._buffer))
            out += self._buffer[:take]
            del self._buffer[:take]
            self._body_left -= take
            if self._body_left == 0:
                self._chunk_state = "data-end"
            return take > 0
        if self._chunk_state == "trailer":
            end = self._buffer.find(b"\n")
            if end < 0:
                return self._bounded(1024)
            trailer = bytes(self._buffer[: end + 1])
            out += trailer
            del self._buffer[: end + 1]
            if trailer.strip() == b"":
                self._chunked = False
            return True
        end = self._buffer.find(b"\n")
        if end < 0:
            return self._bounded(1024)
        line = bytes(self._buffer[: end + 1])
        out += line
        del self._buffer[: end + 1]
        if self._chunk_state == "data-end":
            self._chunk_state = "size"
            return True
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or not set(size_text) <= frozenset(b"0123456789abcdefABCDEF"):
            raise _Answer(400, "malformed chunked body", "bad_request")
        self._body_left = int(size_text, 16)
        self._chunk_state = "data" if self._body_left else "trailer"
        return True

    _body_left = 0

    def _bounded(self, limit: int) -> bool:
        if len(self._buffer) > limit:
            raise _Answer(400, "malformed chunked body", "bad_request")
        return False


# -- the listener ------------------------------------------------------------------------------


class ExposureProxy:
    """The exposure listener (see the module's docstring)."""

    def __init__(
        self,
        router: ExposureRouter,
        address: str,
        tls: Tls | None,
        limits: ExposureLimits | None = None,
        observer: ExposureObserver | None = None,
    ) -> None:
        self._router = router
        self._limits = limits or ExposureLimits()
        self._observer: ExposureObserver = observer or _NoObserver()
        host, port = split_address(address)
        self._socket: CappedListener = listen(host, port, self._limits.caps())
        self.port: int = self._socket.getsockname()[1]
        self._tls = _ssl_context(tls) if tls is not None else None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def caps(self) -> ConnectionCaps:
        return self._socket.caps

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accepted,
            sock=self._socket,
            ssl=self._tls,
            ssl_handshake_timeout=self._limits.header_timeout_s if self._tls else None,
            limit=CHUNK,
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        self._socket.close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._observer.connection_opened()
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, OSError, ssl.SSLError):
            self._observer.error("client_error")
        except Exception:  # a bug must not end the listener; never logs the request itself
            log.exception("exposure proxy: a connection failed")
            self._observer.error("internal")
        finally:
            writer.transport.abort()
            self._connections.discard(task)
            self._observer.connection_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head: _Http1Head | _H2Head | None = None
        try:
            try:
                async with asyncio.timeout(self._limits.header_timeout_s):
                    head = await self._read_head(reader)
            except TimeoutError:
                raise _Answer(408, "the request head did not arrive in time", "header_timeout") from None
            if head is None:
                return  # closed before a request
            await self._route_and_splice(head, reader, writer)
        except _Answer as answer:
            self._observer.error(answer.kind)
            await self._answer(writer, head, answer)

    async def _read_head(self, reader: asyncio.StreamReader) -> _Http1Head | _H2Head | None:
        max_head = self._limits.max_head_bytes
        buffer = bytearray()
        scanned = 0
        while True:
            data = await reader.read(CHUNK)
            if not data:
                if buffer:
                    raise _Answer(400, "the connection ended inside the request head", "bad_request")
                return None
            buffer += data
            if len(buffer) < len(H2_PREFACE) and H2_PREFACE.startswith(buffer):
                continue
            if buffer.startswith(H2_PREFACE):
                return await self._read_h2_head(reader, bytes(buffer))
            end = head_end(buffer, scanned)
            if 0 <= end <= max_head:
                return parse_http1(bytes(buffer), end, max_head)
            if len(buffer) > max_head:
                raise _Answer(431, f"the request head is over {max_head} bytes", "head_too_large")
            scanned = len(buffer)

    async def _read_h2_head(self, reader: asyncio.StreamReader, buffer: bytes) -> _H2Head:
        """HTTP/2 with prior knowledge: the frames up to the first request's headers, parsed
        only to read :authority and the token (every byte is replayed upstream)."""
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()  # our SETTINGS first, should we answer ourselves
        data = buffer
        while True:
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                raise _H2Answer(conn, 400, "malformed HTTP/2 request", "bad_request") from None
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    headers = [(bytes(name), bytes(value)) for name, value in event.headers or ()]
                    return _H2Head(buffer, headers, event.stream_id or 1, conn)
            if len(buffer) > self._limits.max_head_bytes:
                raise _H2Answer(conn, 431, "the request head is too large", "head_too_large")
            data = await reader.read(CHUNK)
            if not data:
                raise _H2Answer(conn, 400, "the connection ended inside the request head", "bad_request")
            buffer += data

    async def _route_and_splice(
        self, head: _Http1Head | _H2Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if isinstance(head, _Http1Head):
            request = head.request
            headers = list(request.headers)
            target = request.target
        else:
            headers = [(name.lower(), value) for name, value in head.headers]
            target = next((v for n, v in headers if n == b":path"), b"/")
        host_raw = next((v for n, v in headers if n == b":authority"), None) or next(
            (v for n, v in headers if n == b"host"), None
        )
        if host_raw is None:
            raise _Answer(400, "a Host header is required: it names the exposure", "bad_request")
        host = normal_host(host_raw)
        query_token, clean_target = take_query_token(target)
        if query_token is not None:
            token = check_token(query_token)
            await self._route(host, token)
            secure = "; Secure" if self._tls is not None else ""
            raise _Answer(
                303,
                "the token is kept in a cookie for this host; go on without it in the URL",
                "redirected",
                (
                    ("Location", clean_target.decode("latin-1")),
                    ("Set-Cookie", f"kibo_exposure_token={token}; HttpOnly{secure}; SameSite=Lax; Path=/"),
                ),
            )
        raw_token = next((v for n, v in headers if n == TOKEN_HEADER), None)
        if raw_token is None:
            raw_token, _ = split_cookies([v for n, v in headers if n == b"cookie"])
        exposure = await self._route(host, check_token(raw_token) if raw_token is not None else None)
        if exposure.revoked.is_set():
            raise _Answer(410, f"the exposure of port {exposure.port} in {exposure.workspace_id} has ended", "refused")
        # What goes up first, made before the guest port is opened (a bad head opens nothing).
        framer: _RequestFramer | None = None
        if isinstance(head, _Http1Head):
            framer = _RequestFramer(self._limits.max_head_bytes, head.request)
            first = rewrite_head(head.request) + framer.feed(head.rest)
        else:
            first = head.buffer
        try:
            upstream = await exposure.open()
        except GuestRefused as refused:
            if refused.status == "port-closed":
                raise _Answer(
                    502,
                    f"nothing listens on port {exposure.port} in workspace {exposure.workspace_id}",
                    "port_closed",
                ) from None
            if refused.status == "unavailable":
                raise _Answer(
                    503,
                    f"workspace {exposure.workspace_id} cannot be reached right now ({refused}); retry",
                    "unavailable",
                    (("Retry-After", "1"),),
                ) from None
            raise _Answer(
                502, f"port {exposure.port} in workspace {exposure.workspace_id} failed: {refused}", "upstream_error"
            ) from None
        except OSError as error:
            raise _Answer(
                503,
                f"workspace {exposure.workspace_id} cannot be reached right now ({error.strerror}); retry",
                "unavailable",
                (("Retry-After", "1"),),
            ) from None
        await _Splice(reader, writer, upstream, exposure.revoked, self._observer, framer).run(first)

    async def _route(self, host: str, token: str | None) -> ExposureTarget:
        try:
            return await self._router.route(host, token)
        except ExposureRefused as refused:
            raise _Answer(refused.status, refused.message, "refused") from None

    async def _answer(self, writer: asyncio.StreamWriter, head: _Http1Head | _H2Head | None, answer: _Answer) -> None:
        self._observer.answered(f"{answer.status // 100}xx")
        body = (answer.message + "\n").encode("utf-8", "replace")
        conn = answer.conn if isinstance(answer, _H2Answer) else head.h2 if isinstance(head, _H2Head) else None
        if conn is not None:
            stream_id = head.stream_id if isinstance(head, _H2Head) else 1
            data = _h2_answer(conn, stream_id, answer, body)
        else:
            lines = [
                f"HTTP/1.1 {answer.status} {REASONS.get(answer.status, 'Error')}",
                "Content-Type: text/plain; charset=utf-8",
                f"Content-Length: {len(body)}",
                "X-Content-Type-Options: nosniff",
                "Cache-Control: no-store",
                "Connection: close",
            ]
            lines += [f"{name}: {value}" for name, value in answer.headers]
            data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body
        with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
            writer.write(data)
            async with asyncio.timeout(self._limits.header_timeout_s):
                await writer.drain()


class _H2Answer(_Answer):
    def __init__(self, conn: h2.connection.H2Connection, status: int, message: str, kind: str) -> None:
        super().__init__(status, message, kind)
        self.conn = conn


def _h2_answer(conn: h2.connection.H2Connection, stream_id: int, answer: _Answer, body: bytes) -> bytes:
    try:
        headers = [
            (":status", str(answer.status)),
            ("content-type", "text/plain; charset=utf-8"),
            ("content-length", str(len(body))),
            ("x-content-type-options", "nosniff"),
            ("cache-control", "no-store"),
        ] + [(name.lower(), value) for name, value in answer.headers]
        conn.send_headers(stream_id, headers)
        conn.send_data(stream_id, body, end_stream=True)
    except h2.exceptions.H2Error:
        pass  # the stream is not one to answer on (a head that never completed): GOAWAY only
    conn.close_connection()
    return conn.data_to_send()


def _ssl_context(tls: Tls) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:
        context.load_verify_locations(tls.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["http/1.1"])
    return context


class _Splice:
    """Client <-> guest, both ways, 64 KiB at a time with back-pressure; half-closes passed
    on; ends when both ways are done, or at once (both sides cut) when `revoked` is set."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: UpstreamStream,
        revoked: asyncio.Event,
        observer: ExposureObserver,
        framer: _RequestFramer | None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._upstream = upstream
        self._revoked = revoked
        self._observer = observer
        self._framer = framer
        self._answered = False

    async def run(self, first: bytes) -> None:
        up = asyncio.create_task(self._to_guest(first))
        down = asyncio.create_task(self._to_client())
        cut = asyncio.create_task(self._revoked.wait())
        ways = {up, down}
        try:
            while ways:
                done, _ = await asyncio.wait(ways | {cut}, return_when=asyncio.FIRST_COMPLETED)
                if cut in done:
                    self._observer.error("revoked")
                    break
                for way in done:
                    ways.discard(way)
                    if way.exception() is not None:
                        ways.clear()  # one way failed: the other cannot go on meaningfully
        finally:
            self._writer.transport.abort()
            for task in (up, down, cut):
                task.cancel()
            # Closed before anything else is awaited: a stop that cancels this task lands after.
            with contextlib.suppress(Exception):
                await self._upstream.close()
            await asyncio.gather(up, down, cut, return_exceptions=True)
            if not self._answered:
                self._observer.answered("none")

    async def _to_guest(self, first: bytes) -> None:
        if first:
            await self._upstream.write(first)
            self._observer.transferred("to_guest", len(first))
        while True:
            data = await self._reader.read(CHUNK)
            if not data:
                await self._upstream.write_eof()
                return
            if self._framer is not None:
                try:
                    data = self._framer.feed(data)
                except _Answer as answer:
                    self._observer.error(answer.kind)
                    raise ConnectionAbortedError(answer.message) from None
            if data:
                await self._upstream.write(data)
                self._observer.transferred("to_guest", len(data))

    async def _to_client(self) -> None:
        writer = self._writer
        while True:
            data = await self._upstream.read()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                else:
                    # TLS has no half-close: the guest is done, so is the connection.
                    await writer.drain()
                    raise ConnectionAbortedError("the guest closed its side")
                return
            if not self._answered:
                self._answered = True
                self._observer.answered(_status_class(data))
            writer.write(data)
            self._observer.transferred("from_guest", len(data))
            await writer.drain()


def _status_class(data: bytes) -> str:
    """The first response's status class ("2xx"), read from its first bytes; "other" (HTTP/2,
    or not an HTTP/1 response at all)."""
    if data.startswith(b"HTTP/1.") and len(data) >= 12 and data[9:12].isdigit():
        return f"{data[9:10].decode()}xx"
    return "other"
