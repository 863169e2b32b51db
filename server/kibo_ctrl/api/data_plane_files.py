"""The data plane's files anywhere in the guest: stat, list, mkdir, move, remove, download, uploads, watch."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from ..domain.access import Caller
from ..domain.errors import Unimplemented

if TYPE_CHECKING:
    from .data_plane import DataPlane


class DataPlaneFiles:
    def __init__(self, data_plane: DataPlane) -> None:
        self._dp = data_plane

    async def stat_workspace_path(
        self, request: dp.StatWorkspacePathRequest, caller: Caller
    ) -> dp.StatWorkspacePathResponse:
        raise Unimplemented("StatWorkspacePath: not written yet")

    async def list_workspace_directory(
        self, request: dp.ListWorkspaceDirectoryRequest, caller: Caller
    ) -> dp.ListWorkspaceDirectoryResponse:
        raise Unimplemented("ListWorkspaceDirectory: not written yet")

    async def make_workspace_directory(
        self, request: dp.MakeWorkspaceDirectoryRequest, caller: Caller
    ) -> dp.MakeWorkspaceDirectoryResponse:
        raise Unimplemented("MakeWorkspaceDirectory: not written yet")

    async def move_workspace_path(
        self, request: dp.MoveWorkspacePathRequest, caller: Caller
    ) -> dp.MoveWorkspacePathResponse:
        raise Unimplemented("MoveWorkspacePath: not written yet")

    async def remove_workspace_path(
        self, request: dp.RemoveWorkspacePathRequest, caller: Caller
    ) -> dp.RemoveWorkspacePathResponse:
        raise Unimplemented("RemoveWorkspacePath: not written yet")

    async def download_workspace_file(
        self, request: dp.DownloadWorkspaceFileRequest, caller: Caller
    ) -> AsyncGenerator[dp.DownloadWorkspaceFileResponse, None]:
        raise Unimplemented("DownloadWorkspaceFile: not written yet")
        yield

    async def start_workspace_upload(
        self, request: dp.StartWorkspaceUploadRequest, caller: Caller
    ) -> dp.StartWorkspaceUploadResponse:
        raise Unimplemented("StartWorkspaceUpload: not written yet")

    async def write_workspace_upload(
        self, request: dp.WriteWorkspaceUploadRequest, caller: Caller
    ) -> dp.WriteWorkspaceUploadResponse:
        raise Unimplemented("WriteWorkspaceUpload: not written yet")

    async def cancel_workspace_upload(
        self, request: dp.CancelWorkspaceUploadRequest, caller: Caller
    ) -> dp.CancelWorkspaceUploadResponse:
        raise Unimplemented("CancelWorkspaceUpload: not written yet")

    async def watch_workspace_directory(
        self, request: dp.WatchWorkspaceDirectoryRequest, caller: Caller
    ) -> AsyncGenerator[dp.WatchWorkspaceDirectoryResponse, None]:
        raise Unimplemented("WatchWorkspaceDirectory: not written yet")
        yield
