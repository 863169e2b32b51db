"""The gRPC transport (grpc.aio). Handlers take raw bytes and decode them here, so a
request that cannot be decoded is INVALID_ARGUMENT, not grpc.aio's UNKNOWN."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from ..api.auth import OPEN, Authenticator
from ..domain.errors import InvalidArgument
from .errors import status_of

UnaryFn = Callable[[Any, Any], Awaitable[Message]]
StreamFn = Callable[[Any, Any], AsyncGenerator[Message, None]]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: Exception) -> None:
    code, status = status_of(error)
    await context.abort(
        code, status.message, trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),)
    )


def _decode(request_class: type[Message], raw: bytes) -> Message:
    try:
        return request_class.FromString(raw)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise InvalidArgument(
            f"the request body cannot be decoded as {request_class.DESCRIPTOR.full_name}: {error}"
        ) from None


def _authorization(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


def _unary(request_class: type[Message], fn: UnaryFn, auth: Authenticator) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            caller = await auth.authenticate(_authorization(context))
            response = await fn(_decode(request_class, raw), caller)
        except Exception as error:  # every exception: status_of tells a domain error from a bug
            await _abort(context, error)
        return response.SerializeToString()

    return grpc.unary_unary_rpc_method_handler(handle)


def _stream(request_class: type[Message], fn: StreamFn, auth: Authenticator) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        try:
            caller = await auth.authenticate(_authorization(context))
            # Closed here, at once, when the call ends early (the client cancelled or went
            # away): the handler's cleanup (e.g. killing an exec's command) must not wait for
            # the garbage collector.
            async with contextlib.aclosing(fn(_decode(request_class, raw), caller)) as responses:
                async for response in responses:
                    yield response.SerializeToString()
        except Exception as error:  # as in _unary
            await _abort(context, error)

    return grpc.unary_stream_rpc_method_handler(handle)


def service_handler(
    descriptor: ServiceDescriptor,
    implementation: object,
    auth: Authenticator,
    credential_methods: frozenset[str] = frozenset(),
) -> grpc.GenericRpcHandler:
    """Bind every method of `descriptor` to the snake_case method of `implementation`,
    called as `method(request, caller)` once the caller is authenticated."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in descriptor.methods:
        fn = getattr(implementation, _snake(method.name))
        request_class = GetMessageClass(method.input_type)
        handler = _stream if method.server_streaming else _unary
        # Methods authorized by a credential in the request need no token.
        handlers[method.name] = handler(request_class, fn, OPEN if method.name in credential_methods else auth)
    return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)
