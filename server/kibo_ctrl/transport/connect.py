"""The Connect transport: Connect (JSON and binary), gRPC-Web and plain HTTP JSON on one
ASGI app, calling the same Api as the gRPC server. Errors go through transport/errors.py."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from connectrpc.code import Code
from connectrpc.codec import Codec
from connectrpc.compat import google_protobuf_binary_codec
from connectrpc.errors import ConnectError, ErrorDetail
from connectrpc.request import RequestContext
from google.protobuf import json_format
from google.protobuf.message import Message
from kibo.ctrl.v1 import (
    data_plane_service_connect,
    observation_service_connect,
    volume_service_connect,
    workspace_service_connect,
)
from kibo.sim.v1 import simulator_connect
from protobuf.wkt import Any as ConnectAny

from ..api.auth import OPEN, Authenticator
from ..domain.errors import InvalidArgument, KiboError
from .errors import status_of

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


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


class StrictJsonCodec:
    """Connect's JSON codec (google.protobuf json_format), without connectrpc's default of
    ignoring what it does not know: an unknown field or enum name (`"mode": "STOP_MODE_NUKE"`)
    is INVALID_ARGUMENT, as a bad binary request is, never silently dropped to a default."""

    def name(self) -> str:
        return "json"

    def encode(self, message: Message) -> bytes:
        return json_format.MessageToJson(message).encode()

    def decode(self, data: bytes | bytearray, message_class: type[Message]) -> Message:
        message = message_class()
        try:
            json_format.Parse(bytes(data), message, ignore_unknown_fields=False)
        except (json_format.ParseError, UnicodeDecodeError, ValueError) as error:
            raise connect_error(
                InvalidArgument(f"the request body is not valid JSON for {message_class.DESCRIPTOR.full_name}: {error}")
            ) from None
        return message


CODECS: list[Codec[Any, Any]] = [google_protobuf_binary_codec(), cast(Codec[Any, Any], StrictJsonCodec())]


class _Adapter:
    """Presents an Api object as a connectrpc service: `name(request, ctx)` -> `api.name(request)`."""

    def __init__(self, api: object, auth: Authenticator, credential_methods: frozenset[str]) -> None:
        self._api = api
        self._auth = auth
        self._open = credential_methods

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._api, name)
        auth = OPEN if _pascal(name) in self._open else self._auth
        if _is_async_generator(target):

            @functools.wraps(target)
            async def stream(request: Message, ctx: RequestContext[Any, Any]) -> AsyncIterator[Message]:
                try:
                    caller = await auth.authenticate(ctx.request_headers.get("authorization"))
                    # Closed at once when the client goes away (connectrpc closes this stream).
                    async with contextlib.aclosing(target(request, caller)) as responses:
                        async for response in responses:
                            yield response
                except Exception as error:  # every exception: status_of tells a domain error from a bug
                    raise connect_error(error) from None

            return stream

        @functools.wraps(target)
        async def unary(request: Message, ctx: RequestContext[Any, Any]) -> Message:
            try:
                caller = await auth.authenticate(ctx.request_headers.get("authorization"))
                response: Message = await target(request, caller)
            except Exception as error:  # as in stream
                raise connect_error(error) from None
            return response

        return unary


def _pascal(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def _is_async_generator(function: Any) -> bool:
    return inspect.isasyncgenfunction(function)


# connectrpc's generated ASGI application for each service, by full name.
APPLICATIONS: dict[str, Any] = {
    "kibo.ctrl.v1.WorkspaceService": workspace_service_connect.WorkspaceServiceASGIApplication,
    "kibo.ctrl.v1.WorkspaceObservationService": observation_service_connect.WorkspaceObservationServiceASGIApplication,
    "kibo.ctrl.v1.VolumeService": volume_service_connect.VolumeServiceASGIApplication,
    "kibo.ctrl.v1.DataPlaneService": data_plane_service_connect.DataPlaneServiceASGIApplication,
    "kibo.sim.v1.SimulatorService": simulator_connect.SimulatorServiceASGIApplication,
}


def application(
    services: list[tuple[str, object, frozenset[str]]], read_max_bytes: int, auth: Authenticator
) -> ASGIApp:
    """One ASGI app routing each service's path prefix to its connectrpc application.

    `services`: (full name, implementation, methods authorized by a credential, not a token)."""
    apps = [
        APPLICATIONS[name](cast(Any, _Adapter(impl, auth, open_)), read_max_bytes=read_max_bytes, codecs=CODECS)
        for name, impl, open_ in services
    ]
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
