"""The data plane's processes (StartWorkspaceProcess, ConnectWorkspaceProcess, ...), kept by the
workspace's node (runtime.base.GuestProcesses)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from ..domain.access import Caller
from ..domain.errors import Unimplemented

if TYPE_CHECKING:
    from .data_plane import DataPlane


class DataPlaneProcesses:
    def __init__(self, data_plane: DataPlane) -> None:
        self._dp = data_plane

    async def start_workspace_process(
        self, request: dp.StartWorkspaceProcessRequest, caller: Caller
    ) -> AsyncGenerator[dp.StartWorkspaceProcessResponse, None]:
        raise Unimplemented("StartWorkspaceProcess: not written yet")
        yield

    async def connect_workspace_process(
        self, request: dp.ConnectWorkspaceProcessRequest, caller: Caller
    ) -> AsyncGenerator[dp.ConnectWorkspaceProcessResponse, None]:
        raise Unimplemented("ConnectWorkspaceProcess: not written yet")
        yield

    async def list_workspace_processes(
        self, request: dp.ListWorkspaceProcessesRequest, caller: Caller
    ) -> dp.ListWorkspaceProcessesResponse:
        raise Unimplemented("ListWorkspaceProcesses: not written yet")

    async def send_workspace_process_input(
        self, request: dp.SendWorkspaceProcessInputRequest, caller: Caller
    ) -> dp.SendWorkspaceProcessInputResponse:
        raise Unimplemented("SendWorkspaceProcessInput: not written yet")

    async def signal_workspace_process(
        self, request: dp.SignalWorkspaceProcessRequest, caller: Caller
    ) -> dp.SignalWorkspaceProcessResponse:
        raise Unimplemented("SignalWorkspaceProcess: not written yet")

    async def resize_workspace_process(
        self, request: dp.ResizeWorkspaceProcessRequest, caller: Caller
    ) -> dp.ResizeWorkspaceProcessResponse:
        raise Unimplemented("ResizeWorkspaceProcess: not written yet")
