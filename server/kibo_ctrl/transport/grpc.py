"""The gRPC transport (grpc.aio). Handlers take raw bytes and decode them here, so a
request that cannot be decoded is INVALID_ARGUMENT, not grpc.aio's UNKNOWN."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from ..api.auth import OPEN, Authenticator
from ..api.render import Encoded
from ..domain.access import Caller
from ..domain.errors import InvalidArgument
from .errors import status_of
from .rpc import NO_OBSERVER, BidiStream, RpcObserver, ServerStream, Service, forget_traceback

# grpc's servers set SO_REUSEPORT on their sockets by default, so a second server bound to a
# taken port takes it too and the kernel splits the connections between the two: two node
# agents on one host both "served" 0.0.0.0:50052 and the control plane's calls reached either
# (issue 26). Every kibo gRPC server binds with this option, so the second one fails at start.
EXCLUSIVE_PORT = ("grpc.so_reuseport", 0)
# HTTP/2 streams one connection may hold at once (SETTINGS_MAX_CONCURRENT_STREAMS). Without it
# the port advertised no limit and held whatever a client opened (issue 27): one connection of
# 300,000 streams that never send their request (an anonymous client: the token is read with
# the request) held ~90,000 open calls and 1.7 GiB, and others' calls waited up to 1.3 s; a
# rapid reset (CVE-2023-44487: HEADERS then RST_STREAM, 200,000 times) grew the server by 425
# MiB. With a limit grpc core refuses a stream (RST_STREAM REFUSED_STREAM) while this many are
# allocated, counting reset ones until the server lets go of them: one connection's 100,000
# such streams grow it by ~22 and ~35 MiB. 1,024: four times a tenant's watches
# (api/fairness.py), so a client that keeps every call on one channel meets that cap's
# RESOURCE_EXHAUSTED first. Past the limit a client's channel queues its calls, and as they
# come and go some are refused (UNAVAILABLE, safe to retry): more streams need more channels.
STREAMS_PER_CONNECTION = ("grpc.max_concurrent_streams", 1024)


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None = None) -> int:
    """Bind `address` (HOST:PORT) to a server made with `EXCLUSIVE_PORT`; the port bound. A port
    that is taken, or a host that is not this machine's, is an OSError that names the address."""
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpc's "Failed to bind to address ..."
        port = 0
    if port == 0:
        raise OSError(
            f"cannot listen on {address}: the port is in use (by another kibo-ctrl?) or the host is not this machine's"
        )
    return port


UnaryFn = Callable[[Any, Caller], Awaitable[Message | Encoded[Any]]]
StreamFn = Callable[[Any, Caller], AsyncGenerator[Message | Encoded[Any], None]]
BidiFn = Callable[[AsyncIterator[Any], Caller], AsyncGenerator[Message, None]]


async def _abort(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, status: Any) -> None:
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


def _common_names(context: grpc.aio.ServicerContext[Any, Any]) -> tuple[str, ...]:
    """The common names of the peer's certificate, as grpc verified it (none over plaintext)."""
    names = context.auth_context().get("x509_common_name", ())
    return tuple(n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in names)


async def _caller(auth: Authenticator, context: grpc.aio.ServicerContext[Any, Any]) -> Caller:
    caller = await auth.authenticate(_authorization(context))
    # A mutual-TLS listener's rule: the verified client certificate must fit the caller.
    return caller if auth.peer is None else auth.peer(caller, _common_names(context))


def _unary(
    names: tuple[str, str], request_class: type[Message], fn: UnaryFn, auth: Authenticator, observer: RpcObserver
) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        start = time.perf_counter()
        observer.started(*names, False)
        outcome = "CANCELLED"  # unless the handler returns or raises: the call was cancelled
        observed = False
        try:
            caller = await _caller(auth, context)
            response = await fn(_decode(request_class, raw), caller)
            outcome = "OK"
        except Exception as error:  # every exception: status_of tells a domain error from a bug
            code, status = status_of(error)
            # Observed before the status goes out: abort sends it and only then raises, so a
            # client that reads /metrics once it has its answer would miss this call.
            observer.finished(*names, False, code.name, time.perf_counter() - start)
            observed = True
            # abort's AbortError stays in a reference cycle of grpc.aio's (forget_traceback):
            # neither the request's bytes nor this error's frames may be in it with it.
            del raw
            forget_traceback(error)
            await _abort(context, code, status)
        finally:
            if not observed:
                observer.finished(*names, False, outcome, time.perf_counter() - start)
        return response.data if isinstance(response, Encoded) else response.SerializeToString()

    return grpc.unary_unary_rpc_method_handler(handle)


def _stream(
    names: tuple[str, str], request_class: type[Message], fn: StreamFn, auth: Authenticator, observer: RpcObserver
) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        start = time.perf_counter()
        observer.started(*names, True)
        outcome = "CANCELLED"
        observed = False
        try:
            caller = await _caller(auth, context)
            # Closed here, at once, when the call ends early (the client cancelled or went
            # away): the handler's cleanup (e.g. killing an exec's command) must not wait for
            # the garbage collector.
            async with contextlib.aclosing(fn(_decode(request_class, raw), caller)) as responses:
                async for response in responses:
                    yield response.data if isinstance(response, Encoded) else response.SerializeToString()
            outcome = "OK"
        except Exception as error:  # as in _unary
            code, status = status_of(error)
            observer.finished(*names, True, code.name, time.perf_counter() - start)
            observed = True
            del raw  # as in _unary
            forget_traceback(error)
            await _abort(context, code, status)
        finally:
            if not observed:
                observer.finished(*names, True, outcome, time.perf_counter() - start)

    return grpc.unary_stream_rpc_method_handler(handle)


async def _decoded(request_class: type[Message], raws: AsyncIterator[bytes]) -> AsyncIterator[Message]:
    async for raw in raws:
        yield _decode(request_class, raw)


def _bidi(
    names: tuple[str, str], request_class: type[Message], fn: BidiFn, auth: Authenticator, observer: RpcObserver
) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        start = time.perf_counter()
        observer.started(*names, True)
        outcome = "CANCELLED"
        observed = False
        try:
            caller = await _caller(auth, context)  # before a request is read
            # Closed at once when the call ends early, as in _stream.
            async with contextlib.aclosing(fn(_decoded(request_class, raws), caller)) as responses:
                async for response in responses:
                    yield response.SerializeToString()
            outcome = "OK"
        except Exception as error:  # as in _unary
            code, status = status_of(error)
            observer.finished(*names, True, code.name, time.perf_counter() - start)
            observed = True
            forget_traceback(error)
            await _abort(context, code, status)
        finally:
            if not observed:
                observer.finished(*names, True, outcome, time.perf_counter() - start)

    return grpc.stream_stream_rpc_method_handler(handle)


def service_handler(
    service: Service, auth: Authenticator, observer: RpcObserver = NO_OBSERVER
) -> grpc.GenericRpcHandler:
    """Serve `service`'s table: each RPC calls its handler as `handler(request, caller)` once
    the caller is authenticated."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for rpc in service.rpcs:
        # Methods authorized by a credential in the request need no token.
        rpc_auth = OPEN if rpc.credential else auth
        names = (service.full_name, rpc.name)
        if isinstance(rpc, BidiStream):
            handlers[rpc.name] = _bidi(names, rpc.request, rpc.handler, rpc_auth, observer)
        elif isinstance(rpc, ServerStream):
            handlers[rpc.name] = _stream(names, rpc.request, rpc.handler, rpc_auth, observer)
        else:
            handlers[rpc.name] = _unary(names, rpc.request, rpc.handler, rpc_auth, observer)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
