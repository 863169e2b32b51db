"""What a transport serves: services as explicit tables of RPCs, each bound to its handler.

routes.py writes the tables (`Unary("GetWorkspace", ..., api.get_workspace)`), so a
reader goes from a method name to its handler with "go to definition"; grpc.py and
connect.py serve the same tables. A table must name every method of its proto service,
with the proto's request and response types and streaming: `Service` checks that when it
is built, so a table that drifts from the proto stops the server from starting."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from ..api.render import Encoded
from ..domain.access import Caller

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


@dataclass(frozen=True)
class Unary(Generic[Req, Resp]):
    """One request, one response: `handler(request, caller)`."""

    name: str  # the proto method name
    request: type[Req]
    response: type[Resp]
    # A response may come encoded already (render.Encoded: assembled from remembered bytes).
    handler: Callable[[Req, Caller], Awaitable[Resp | Encoded[Resp]]]
    # Authorized by a credential inside the request (the data plane), not by a bearer token.
    credential: bool = False


@dataclass(frozen=True)
class ServerStream(Generic[Req, Resp]):
    """One request, a stream of responses: `handler(request, caller)` is an async generator,
    closed as soon as the call ends (so its cleanup runs at once)."""

    name: str
    request: type[Req]
    response: type[Resp]
    # A response may come encoded already (render.Encoded: one encoding shared by many streams).
    handler: Callable[[Req, Caller], AsyncGenerator[Resp | Encoded[Resp], None]]
    credential: bool = False


@dataclass(frozen=True)
class BidiStream(Generic[Req, Resp]):
    """Requests and responses both streamed: `handler(requests, caller)` is an async generator
    over `requests` (the decoded messages as they come; one that cannot be decoded ends the
    call with INVALID_ARGUMENT), closed as soon as the call ends. Served over gRPC only (the
    node link's guest ports: a Connect client cannot stream both ways over HTTP/1.1)."""

    name: str
    request: type[Req]
    response: type[Resp]
    handler: Callable[[AsyncIterator[Req], Caller], AsyncGenerator[Resp, None]]
    credential: bool = False


Rpc = Unary[Any, Any] | ServerStream[Any, Any] | BidiStream[Any, Any]


class RpcObserver(Protocol):
    """Told about every call a transport serves (metrics, traces): both transports call it
    in the same places, so gRPC and Connect are counted alike. `service` and `method` are
    the table's names (a bounded set: an unknown path never reaches a handler); `code` is
    the gRPC status code's name (OK, NOT_FOUND, ...)."""

    def started(self, service: str, method: str, stream: bool) -> None: ...
    def finished(self, service: str, method: str, stream: bool, code: str, seconds: float) -> None: ...


class NoObserver:
    def started(self, service: str, method: str, stream: bool) -> None:
        pass

    def finished(self, service: str, method: str, stream: bool, code: str, seconds: float) -> None:
        pass


NO_OBSERVER: RpcObserver = NoObserver()


@dataclass(frozen=True)
class Service:
    descriptor: ServiceDescriptor
    rpcs: tuple[Rpc, ...]

    def __post_init__(self) -> None:
        methods = {method.name: method for method in self.descriptor.methods}
        names = [rpc.name for rpc in self.rpcs]
        if sorted(names) != sorted(methods):
            raise ValueError(f"{self.full_name}: the table names {sorted(names)}, the proto {sorted(methods)}")
        for rpc in self.rpcs:
            method = methods[rpc.name]
            if rpc.request.DESCRIPTOR is not method.input_type or rpc.response.DESCRIPTOR is not method.output_type:
                raise ValueError(f"{self.full_name}/{rpc.name}: request or response type is not the proto's")
            if isinstance(rpc, ServerStream | BidiStream) != method.server_streaming or isinstance(
                rpc, BidiStream
            ) != bool(method.client_streaming):
                raise ValueError(f"{self.full_name}/{rpc.name}: streaming does not match the proto")

    @property
    def full_name(self) -> str:
        return self.descriptor.full_name

    @property
    def credential_paths(self) -> frozenset[str]:
        """The HTTP paths of the methods a credential in the body authorizes (no token needed)."""
        return frozenset(f"/{self.full_name}/{rpc.name}" for rpc in self.rpcs if rpc.credential)


def forget_traceback(error: BaseException) -> None:
    """Drop what `error` holds of the call that raised it: its traceback and the errors it
    was raised from, with theirs. Both transports' libraries keep an error they answered in a
    reference cycle (connectrpc in a local of the frame that caught it, `error = e`; grpc.aio
    in the call's state), and the error's traceback holds the call's frames: the request's
    bytes and its decoded message. Only a full garbage collection frees a cycle, and in a
    server full of long-lived objects one runs rarely: refused 4 MiB requests grew the server
    by 8-12 MiB each, by 1.3 GiB after 30 (issue 27). Call it once the error is answered for:
    its status made, its traceback logged."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        pending += [current.__cause__, current.__context__]
        current.__traceback__ = None
        current.__cause__ = current.__context__ = None
