"""The Connect transport: Connect (JSON and binary), gRPC-Web and plain HTTP JSON on one
ASGI app, serving the same RPC tables (rpc.py, routes.py) as the gRPC server. Errors go
through transport/errors.py."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from connectrpc.code import Code
from connectrpc.codec import Codec
from connectrpc.compat import google_protobuf_binary_codec
from connectrpc.errors import ConnectError, ErrorDetail
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import json_format
from google.protobuf.message import Message
from protobuf.wkt import Any as ConnectAny

from ..api.auth import OPEN, Authenticator
from ..api.render import Encoded
from ..domain.errors import InvalidArgument, KiboError
from ..domain.validation import quote
from .errors import status_of
from .rpc import NO_OBSERVER, BidiStream, Rpc, RpcObserver, ServerStream, Service, Unary, forget_traceback

if TYPE_CHECKING:
    # connectrpc exports only their base class, Endpoint.
    from connectrpc._server_shared import EndpointServerStream, EndpointUnary

    AnyEndpoint = EndpointUnary[Any, Any] | EndpointServerStream[Any, Any]

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class ForgetTracebacks:
    """connectrpc metadata interceptor (leading, so it ends every call whatever failed,
    decoding included): an error answered is answered from its code, message and details;
    `forget_traceback` drops the rest before connectrpc keeps it."""

    async def on_start(self, ctx: RequestContext[Any, Any]) -> None:
        return None

    async def on_end(self, token: None, ctx: RequestContext[Any, Any], error: Exception | None, /) -> None:
        if error is not None:
            forget_traceback(error)


def connect_error(error: Exception) -> ConnectError:
    """Any exception a handler raised, as Connect's error (the one map: transport/errors.py)."""
    if isinstance(error, ConnectError):
        return error
    code, status = status_of(error)
    name = "CANCELED" if code.name == "CANCELLED" else code.name
    # connectrpc's details are its own runtime's Any: hand over type URL and bytes as they are.
    details = [ErrorDetail(ConnectAny(type_url=packed.type_url, value=packed.value)) for packed in status.details]
    # Connect's JSON clients (curl, browsers) read the message, not base64 details: the hint
    # (the next step) goes into the message too; gRPC clients read it from ErrorDetail.
    hint = error.hint if isinstance(error, KiboError) else ""
    message = f"{status.message} (next: {hint})" if hint and hint not in status.message else status.message
    return ConnectError(Code[name], message, details=details)


# The JSON values a Connect JSON request may hold (issue 27). json_format converts each in
# Python (~1-2.5 us), and json.loads makes an object of each first (an empty list: 72 bytes):
# a 4 MiB body of 280,000 CIDRs held the event loop for 1.2 s, one of 1.4 million `[]` took
# 0.35 s and 100 MiB. 100,000 values cost at most ~0.25 s, about what 4 MiB in one string
# costs (0.14 s); no request needs more (64 KiB of annotations are far fewer), and binary
# protobuf (gRPC, Connect or gRPC-Web with proto) has no such bound.
MAX_JSON_VALUES = 100_000
# How much of json_format's error (which may quote the whole value) a message shows.
JSON_ERROR_CHARS = 200


class StrictJsonCodec:
    """Connect's JSON codec (google.protobuf json_format), without connectrpc's default of
    ignoring what it does not know: an unknown field or enum name (`"mode": "STOP_MODE_NUKE"`)
    is INVALID_ARGUMENT, as a bad binary request is, never silently dropped to a default.
    A body with over MAX_JSON_VALUES values is refused before it is parsed: every value but
    a container's first follows a comma and every container opens with a bracket, so their
    count bounds the values (commas inside strings count too, which errs on the safe side)."""

    def name(self) -> str:
        return "json"

    def encode(self, message: Message) -> bytes:
        return json_format.MessageToJson(message).encode()

    def decode(self, data: bytes | bytearray, message_class: type[Message]) -> Message:
        body = bytes(data)
        name = message_class.DESCRIPTOR.full_name
        if body.count(b",") + body.count(b"[") + body.count(b"{") > MAX_JSON_VALUES:
            raise connect_error(
                InvalidArgument(
                    f"the JSON request for {name} has over {MAX_JSON_VALUES} values (commas and brackets); "
                    "send it as binary protobuf"
                )
            )
        message = message_class()
        try:
            json_format.Parse(body, message, ignore_unknown_fields=False)
        except (json_format.ParseError, UnicodeDecodeError, ValueError) as error:
            raise connect_error(
                InvalidArgument(f"the request body is not valid JSON for {name}: {quote(str(error), JSON_ERROR_CHARS)}")
            ) from None
        return message


CODECS: list[Codec[Any, Any]] = [google_protobuf_binary_codec(), cast(Codec[Any, Any], StrictJsonCodec())]


def _unary(
    names: tuple[str, str], rpc: Unary[Any, Any], auth: Authenticator, observer: RpcObserver
) -> Callable[[Message, RequestContext[Any, Any]], Awaitable[Message]]:
    async def unary(request: Message, ctx: RequestContext[Any, Any]) -> Message:
        start = time.perf_counter()
        observer.started(*names, False)
        outcome = "CANCELLED"  # unless the handler returns or raises: the client went away
        try:
            caller = await auth.authenticate(ctx.request_headers.get("authorization"))
            answer = await rpc.handler(request, caller)
            response: Message = answer.message if isinstance(answer, Encoded) else answer
            outcome = "OK"
        except Exception as error:  # every exception: status_of tells a domain error from a bug
            outcome = _code_name(error)
            raise connect_error(error) from None
        finally:
            observer.finished(*names, False, outcome, time.perf_counter() - start)
        return response

    return unary


def _stream(
    names: tuple[str, str], rpc: ServerStream[Any, Any], auth: Authenticator, observer: RpcObserver
) -> Callable[[Message, RequestContext[Any, Any]], AsyncIterator[Message]]:
    async def stream(request: Message, ctx: RequestContext[Any, Any]) -> AsyncIterator[Message]:
        start = time.perf_counter()
        observer.started(*names, True)
        outcome = "CANCELLED"
        try:
            caller = await auth.authenticate(ctx.request_headers.get("authorization"))
            # Closed at once when the client goes away (connectrpc closes this stream).
            async with contextlib.aclosing(rpc.handler(request, caller)) as responses:
                async for response in responses:
                    yield response.message if isinstance(response, Encoded) else response
            outcome = "OK"
        except Exception as error:  # as in _unary
            outcome = _code_name(error)
            raise connect_error(error) from None
        finally:
            observer.finished(*names, True, outcome, time.perf_counter() - start)

    return stream


def _code_name(error: Exception) -> str:
    """The gRPC code's name an exception answers with (OK, NOT_FOUND, ...), for observers."""
    if isinstance(error, ConnectError):
        return "CANCELLED" if error.code is Code.CANCELED else error.code.name
    return status_of(error)[0].name


def _endpoint(service: Service, rpc: Rpc, auth: Authenticator, observer: RpcObserver) -> AnyEndpoint:
    """connectrpc's endpoint for one RPC of the table (what its generated code would build)."""
    if isinstance(rpc, BidiStream):
        raise ValueError(f"{service.full_name}/{rpc.name}: a stream both ways is served over gRPC only")
    # Methods authorized by a credential in the request need no token.
    rpc_auth = OPEN if rpc.credential else auth
    streaming = isinstance(rpc, ServerStream)
    method = MethodInfo(
        name=rpc.name,
        service_name=service.full_name,
        input=rpc.request,
        output=rpc.response,
        idempotency_level=IdempotencyLevel.UNKNOWN,
        stream_type=StreamType.SERVER_STREAM if streaming else StreamType.UNARY,
    )
    names = (service.full_name, rpc.name)
    if isinstance(rpc, ServerStream):
        return Endpoint.server_stream(method=method, function=_stream(names, rpc, rpc_auth, observer))
    return Endpoint.unary(method=method, function=_unary(names, rpc, rpc_auth, observer))


class ServiceApplication(ConnectASGIApplication[Service]):
    """One service's table as a connectrpc ASGI application, mounted at /FULL.NAME/."""

    def __init__(
        self, service: Service, auth: Authenticator, read_max_bytes: int, observer: RpcObserver = NO_OBSERVER
    ) -> None:
        endpoints = {
            f"/{service.full_name}/{rpc.name}": _endpoint(service, rpc, auth, observer) for rpc in service.rpcs
        }

        def resolve(_: Service) -> Mapping[str, AnyEndpoint]:
            return endpoints

        super().__init__(
            service=service,
            endpoints=resolve,
            interceptors=(ForgetTracebacks(),),
            read_max_bytes=read_max_bytes,
            codecs=CODECS,
        )
        self._path = f"/{service.full_name}"

    @property
    def path(self) -> str:
        return self._path


def application(
    services: list[Service], read_max_bytes: int, auth: Authenticator, observer: RpcObserver = NO_OBSERVER
) -> ASGIApp:
    """One ASGI app routing each service's path prefix to its connectrpc application."""
    apps = [ServiceApplication(service, auth, read_max_bytes, observer) for service in services]
    routes = {f"/{app.path.strip('/')}/": app for app in apps}

    async def route(
        scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] == "lifespan":
            return
        path: str = scope.get("path", "")
        if path == "/healthz":
            await _plain(send, 200, b"SERVING\n")
            return
        prefix = path[: path.find("/", 1) + 1] if path.count("/") >= 2 else ""
        app = routes.get(prefix)
        if app is None:
            await _plain(send, 404, b"no such service\n")
            return
        await app(scope, receive, send)

    return route


async def _plain(send: Callable[[Any], Awaitable[None]], status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
