"""The same stub interface as the grpc stubs, over Connect (connectrpc's own client).

Lets every behaviour test run through both transports: errors come back as
grpc.aio.AioRpcError with the Connect error details in grpc-status-details-bin, so the
tests' assertions read them the same way."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pyqwest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from google.protobuf import any_pb2
from google.rpc import status_pb2
from kibo.ctrl.v1 import observation_service_connect, volume_service_connect, workspace_service_connect
from kibo.sim.v1 import simulator_connect

STREAMING = frozenset({"WatchWorkspace"})


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def as_grpc_error(error: ConnectError) -> grpc.aio.AioRpcError:
    name = "CANCELLED" if error.code.name == "CANCELED" else error.code.name
    code = grpc.StatusCode[name]
    status = status_pb2.Status(code=code.value[0], message=error.message)
    for detail in error.details:
        status.details.append(
            any_pb2.Any(type_url=f"type.googleapis.com/{detail.type_name}", value=detail.message_bytes)
        )
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details=error.message)


class _Stream:
    """Looks like a grpc.aio UnaryStreamCall: async iteration, read(), cancel(), code()."""

    def __init__(self, responses: AsyncIterator[Any]) -> None:
        self._responses = responses.__aiter__()
        self._code: grpc.StatusCode | None = None

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            response = await self.read()
            if response is grpc.aio.EOF:
                return
            yield response

    async def read(self) -> Any:
        try:
            return await anext(self._responses)
        except StopAsyncIteration:
            self._code = grpc.StatusCode.OK
            return grpc.aio.EOF
        except ConnectError as error:
            if error.code is Code.CANCELED:
                # The read itself was cancelled (e.g. a wait_for timed out), as grpc.aio would say.
                raise asyncio.CancelledError from None
            converted = as_grpc_error(error)
            self._code = converted.code()
            raise converted from None

    def cancel(self) -> bool:
        if self._code is not None:
            return False
        self._code = grpc.StatusCode.CANCELLED
        closing = getattr(self._responses, "aclose", None)
        if closing is not None:
            asyncio.get_running_loop().create_task(closing())
        return True

    async def code(self) -> grpc.StatusCode | None:
        return self._code


class ConnectStub:
    """`stub.CreateWorkspace(request)` -> `client.create_workspace(request)`."""

    def __init__(self, client: Any, headers: dict[str, str] | None = None) -> None:
        self._client = client
        self._headers = headers or {}
        self._methods: dict[str, Any] = {}

    def __getattr__(self, rpc: str) -> Any:
        # The same object each time, like a grpc stub's attributes (tests compare them).
        if rpc not in self._methods:
            self._methods[rpc] = self._method(rpc)
        return self._methods[rpc]

    def _method(self, rpc: str) -> Any:
        method = getattr(self._client, _snake(rpc))
        if rpc in STREAMING:
            return lambda request, **_: _Stream(method(request, headers=self._headers))

        async def call(request: Any, **_: Any) -> Any:
            try:
                return await method(request, headers=self._headers)
            except ConnectError as error:
                raise as_grpc_error(error) from None

        return call


# Idle connections are dropped here before the server closes them (its --http-idle-timeout,
# 5 s by default): with pyqwest's default (90 s) a request sent on a connection the server
# was closing that instant failed with "connection reset by peer" (UNAVAILABLE), a flake.
POOL_IDLE_S = 2.0


def connect_clients(http_address: str) -> tuple[list[Any], pyqwest.HTTPTransport]:
    """The services' Connect clients, and their one transport (the caller acloses it)."""
    base = f"http://{http_address}"
    transport = pyqwest.HTTPTransport(pool_idle_timeout=POOL_IDLE_S)
    http = pyqwest.Client(transport)
    clients = [
        workspace_service_connect.WorkspaceServiceClient(base, http_client=http),
        observation_service_connect.WorkspaceObservationServiceClient(base, http_client=http),
        volume_service_connect.VolumeServiceClient(base, http_client=http),
        simulator_connect.SimulatorServiceClient(base, http_client=http),
    ]
    return clients, transport
