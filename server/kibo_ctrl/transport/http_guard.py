"""ASGI middleware in front of the Connect app: refuse from the headers alone.

A request without a valid token is answered UNAUTHENTICATED before one byte of its body
is read or decoded, so anonymous traffic costs a header parse and a (cached) token
lookup, never a JSON decode (issue 10, finding 10). A body over the size limit is refused
from its Content-Length before it is read, and cut off while it streams in if it has none
(chunked) or lies; a body that stalls is cut off too.

The refusal is written in the protocol the client speaks (from its Content-Type), so
every client reads the right code: Connect unary (HTTP status + JSON error), Connect
streaming (end-of-stream message), gRPC-Web and gRPC over h2c (trailers-only)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import struct
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import status_pb2

from ..api.auth import Authenticator
from .errors import status_of

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The Connect protocol's HTTP status for each code (connectrpc.com/docs/protocol#error-codes).
CONNECT_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}

# Connect streaming: an envelope with this flag carries the end-of-stream JSON.
END_STREAM_FLAG = 0x02


@dataclass(frozen=True)
class BodyLimits:
    # Largest request body accepted, bytes (Content-Length or counted while it streams in).
    max_bytes: int
    # Longest pause between two pieces of a request body before the request is cut off.
    stall_timeout_s: float


def guard(app: ASGIApp, auth: Authenticator, open_paths: frozenset[str], limits: BodyLimits) -> ASGIApp:
    """Wrap `app`: paths outside `open_paths` need a valid token in the headers; every
    request body is bounded by `limits`."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if auth.enabled and scope.get("path", "") not in open_paths:
            try:
                await auth.identify(_header(headers, b"authorization"))
            except Exception as error:  # the one error map: a domain error, a store condition or a bug
                code, status = status_of(error)
                await _drain_small_body(headers, receive)
                await refuse(scope, send, code, status)
                return
        declared = _content_length(headers)
        if declared is not None and declared > limits.max_bytes:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            await refuse(scope, send, code, _status(code, _too_large(str(declared), limits.max_bytes)))
            return
        await _Bounded(app, scope, receive, send, limits).run()

    return guarded


class _Bounded:
    """One request passed to the app with its body counted and its pauses timed."""

    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, limits: BodyLimits) -> None:
        self._app, self._scope, self._receive, self._send, self._limits = app, scope, receive, send, limits
        self._received = 0
        self._body_done = False
        self._started = False
        self._refused = False

    async def run(self) -> None:
        await self._app(self._scope, self.receive, self.send)

    async def receive(self) -> Any:
        if self._refused:
            return {"type": "http.disconnect"}
        if self._body_done:
            # Past the body, receive() only waits for a disconnect (e.g. while a stream
            # is answered): no stall timeout there.
            return await self._receive()
        try:
            message = await asyncio.wait_for(self._receive(), self._limits.stall_timeout_s)
        except TimeoutError:
            await self._refuse(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request body stalled for more than {self._limits.stall_timeout_s:g} s",
            )
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            self._body_done = not message.get("more_body", False)
            if self._received > self._limits.max_bytes:
                limit = self._limits.max_bytes
                await self._refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, _too_large(f"more than {limit}", limit))
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Any) -> None:
        if self._refused:
            return  # this middleware answered already; the app's late words go nowhere
        if message["type"] == "http.response.start":
            self._started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            await self._drain()
        await self._send(message)

    async def _drain(self) -> None:
        """Before an answer ends, the rest of its request's body (within the limits) is read
        and dropped: the app may answer before it read it all (connectrpc refuses a gRPC-Web
        message from its length prefix), and an HTTP/1 client still writing the body would
        read a connection reset instead of the answer. It is the body of an authenticated
        request under --http-max-body-bytes, which the app would have read anyway."""
        while not self._body_done and not self._refused:
            message = await self.receive()
            if message["type"] != "http.request":
                return

    async def _refuse(self, code: grpc.StatusCode, message: str) -> None:
        self._refused = True
        if not self._started:
            await refuse(self._scope, self._send, code, _status(code, message))


# A refused request whose body is at most this is read (and dropped) before the answer: an
# ordinary client that is still writing its small request then reads a clean error, not a
# reset (EPIPE). Reading 64 KiB without decoding it costs next to nothing; a body declared
# larger is never read, and a chunked one (Node's HTTP/1.1 clients send those) only up to it.
DRAIN_BYTES = 64 * 1024
DRAIN_SECONDS = 2.0


async def _drain_small_body(headers: list[tuple[bytes, bytes]], receive: Receive) -> None:
    declared = _content_length(headers)
    if declared is not None and declared > DRAIN_BYTES:
        return
    limit = DRAIN_BYTES if declared is None else declared
    received = 0
    deadline = asyncio.get_running_loop().time() + DRAIN_SECONDS
    while received <= limit:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), remaining)
        except TimeoutError:
            return
        if message["type"] != "http.request":
            return
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _status(code: grpc.StatusCode, message: str) -> status_pb2.Status:
    number: int = code.value[0]
    return status_pb2.Status(code=number, message=message)


def _too_large(size: str, limit: int) -> str:
    return f"the request body is {size} bytes; this server accepts at most {limit} (--http-max-body-bytes)"


async def refuse(scope: Scope, send: Send, code: grpc.StatusCode, status: status_pb2.Status) -> None:
    """Answer with `status` in the client's protocol, and close an HTTP/1 connection
    whose body was not read (reading it is the work being refused)."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    content_type = (_header(headers, b"content-type") or "").lower()
    extra = [(b"connection", b"close")] if str(scope.get("http_version", "1.1")).startswith("1") else []
    if content_type.startswith("application/grpc"):
        grpc_status = [
            (b"grpc-status", str(status.code).encode()),
            (b"grpc-message", urllib.parse.quote(status.message, safe="").encode()),
        ]
        if status.details:
            grpc_status.append((b"grpc-status-details-bin", base64.b64encode(status.SerializeToString()).rstrip(b"=")))
        kind = [(b"content-type", content_type.encode())]
        trailers = "http.response.trailers" in scope.get("extensions", {})
        if content_type.startswith("application/grpc-web") or not trailers:
            # gRPC-Web: trailers-only, the status in the response headers.
            await _respond(send, 200, kind + grpc_status + extra, b"")
            return
        # gRPC (h2c): the status in HTTP/2 trailers, where gRPC clients read it.
        await send({"type": "http.response.start", "status": 200, "headers": kind, "trailers": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        await send({"type": "http.response.trailers", "headers": grpc_status, "more_trailers": False})
        return
    error = _connect_error(code, status)
    if content_type.startswith("application/connect+"):
        # Connect streaming: HTTP 200 and the error in the end-of-stream message.
        payload = json.dumps({"error": error}).encode()
        body = struct.pack(">BI", END_STREAM_FLAG, len(payload)) + payload
        await _respond(send, 200, [(b"content-type", content_type.encode()), *extra], body)
        return
    body = json.dumps(error).encode()
    await _respond(send, CONNECT_HTTP_STATUS[code], [(b"content-type", b"application/json"), *extra], body)


def _connect_error(code: grpc.StatusCode, status: status_pb2.Status) -> dict[str, Any]:
    name = "canceled" if code is grpc.StatusCode.CANCELLED else code.name.lower()
    error: dict[str, Any] = {"code": name, "message": status.message}
    if status.details:
        error["details"] = [
            {
                "type": packed.type_url.rpartition("/")[2],
                "value": base64.b64encode(packed.value).rstrip(b"=").decode(),
            }
            for packed in status.details
        ]
    return error


async def _respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    value = _header(headers, b"content-length")
    # The HTTP servers refuse a malformed Content-Length before the app sees it.
    return int(value) if value is not None and value.strip().isdigit() else None
