"""An exposure's token is in the answer of the send that made the exposure only (the server
stores its digest; a resend of the same command answers without it). While settling, the SDK
resends until the command is terminal, so the token may come in an earlier answer than the
last: both clients must keep it. A gRPC server in this process answers as the real one can:
first RUNNING with the exposure and its token, then SUCCEEDED without the token."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import kibotos
import pytest
from kibo.ctrl.v1 import command_pb2, workspace_pb2
from kibo.ctrl.v1 import workspace_service_pb2 as ws_pb2
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc

TOKEN = "kex1_only-in-the-first-answer"
FAST = kibotos.SettleOptions(initial_backoff=0.01, max_backoff=0.01, timeout=10)


class _FirstAnswerRunning(ws_grpc.WorkspaceServiceServicer):
    """CreateWorkspaceExposure: the first send's answer RUNNING with the token, every resend's
    SUCCEEDED without it (the same command ID each time, as settle resends)."""

    def __init__(self) -> None:
        self.sends: list[ws_pb2.CreateWorkspaceExposureRequest] = []

    def CreateWorkspaceExposure(
        self, request: ws_pb2.CreateWorkspaceExposureRequest, context: Any
    ) -> ws_pb2.CreateWorkspaceExposureResponse:
        self.sends.append(request)
        first = len(self.sends) == 1
        state = command_pb2.COMMAND_STATE_RUNNING if first else command_pb2.COMMAND_STATE_SUCCEEDED
        exposure = workspace_pb2.Exposure(
            exposure_id="ex-00000000000000000001",
            workspace_id=request.workspace_id,
            port=request.port,
            access=workspace_pb2.EXPOSURE_ACCESS_TOKEN,
            url=f"http://{request.port}-{request.workspace_id}.localhost:8090/",
            token=TOKEN if first else "",
        )
        return ws_pb2.CreateWorkspaceExposureResponse(
            workspace=workspace_pb2.Workspace(workspace_id=request.workspace_id),
            command=command_pb2.WorkspaceCommand(command_id=request.metadata.command_id, state=state),
            exposure=exposure,
        )


@pytest.fixture
def server() -> Iterator[tuple[str, _FirstAnswerRunning]]:
    servicer = _FirstAnswerRunning()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ws_grpc.add_WorkspaceServiceServicer_to_server(servicer, grpc_server)  # type: ignore[no-untyped-call]
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        grpc_server.stop(0).wait()


def test_the_blocking_client_keeps_the_token_of_an_earlier_answer(server: tuple[str, _FirstAnswerRunning]) -> None:
    address, servicer = server
    with kibotos.Client(address, token="t", settle_options=FAST) as client:
        created = client.create_workspace_exposure("ws-00000000000000000000", 8080)
    assert len(servicer.sends) == 2 and servicer.sends[0] == servicer.sends[1]  # resent identically
    assert created.command.state == command_pb2.COMMAND_STATE_SUCCEEDED
    assert created.exposure.token == TOKEN


def test_the_async_client_keeps_the_token_of_an_earlier_answer(server: tuple[str, _FirstAnswerRunning]) -> None:
    address, servicer = server

    async def create() -> ws_pb2.CreateWorkspaceExposureResponse:
        async with kibotos.AsyncClient(address, token="t", settle_options=FAST) as client:
            return await client.create_workspace_exposure("ws-00000000000000000000", 8080, public=False)

    created = asyncio.run(create())
    assert len(servicer.sends) == 2 and created.exposure.token == TOKEN
