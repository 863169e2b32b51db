"""A failed gRPC call is observed (metrics, traces) before its status goes out: grpc.aio's
abort sends the status and only then raises, so a client that reads /metrics as soon as it
has its answer found the call missing (a CI run of test_metrics failed on that order)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import grpc
import pytest
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.api.auth import OPEN
from kibo_ctrl.domain.access import Caller
from kibo_ctrl.domain.errors import NotFound
from kibo_ctrl.transport import grpc as transport


class Observer:
    def __init__(self) -> None:
        self.finished_codes: list[str] = []

    def started(self, service: str, method: str, stream: bool) -> None:
        pass

    def finished(self, service: str, method: str, stream: bool, code: str, seconds: float) -> None:
        self.finished_codes.append(code)


class Aborted(Exception):
    """What grpc.aio's abort raises once the status is sent."""


class Context:
    """The two parts of a grpc.aio servicer context a handler touches."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        self.observed_when_sent: list[str] | None = None

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        # The status is on the wire from here: what the observer has now is what a client sees.
        self.observed_when_sent = list(self.observer.finished_codes)
        raise Aborted


async def missing(request: ws.GetWorkspaceRequest, caller: Caller) -> ws.GetWorkspaceResponse:
    raise NotFound("workspace ws-nosuch not found")


async def missing_stream(request: ws.WatchWorkspaceRequest, caller: Caller) -> AsyncGenerator[Any, None]:
    raise NotFound("workspace ws-nosuch not found")
    yield  # an async generator, as a stream's handler is


async def test_a_unary_error_is_observed_before_its_status_is_sent() -> None:
    observer = Observer()
    context = Context(observer)
    handler = transport._unary(("S", "Get"), ws.GetWorkspaceRequest, missing, OPEN, observer)
    with pytest.raises(Aborted):
        await handler.unary_unary(b"", context)
    assert context.observed_when_sent == ["NOT_FOUND"]
    assert observer.finished_codes == ["NOT_FOUND"]  # once, not again on the way out


async def test_a_stream_error_is_observed_before_its_status_is_sent() -> None:
    observer = Observer()
    context = Context(observer)
    handler = transport._stream(("S", "Watch"), ws.WatchWorkspaceRequest, missing_stream, OPEN, observer)
    with pytest.raises(Aborted):
        async for _ in handler.unary_stream(b"", context):
            pass
    assert context.observed_when_sent == ["NOT_FOUND"]
    assert observer.finished_codes == ["NOT_FOUND"]


async def test_a_successful_call_is_observed_once() -> None:
    observer = Observer()

    async def found(request: ws.GetWorkspaceRequest, caller: Caller) -> ws.GetWorkspaceResponse:
        return ws.GetWorkspaceResponse()

    handler = transport._unary(("S", "Get"), ws.GetWorkspaceRequest, found, OPEN, observer)
    assert await handler.unary_unary(b"", Context(observer)) == b""
    assert observer.finished_codes == ["OK"]
