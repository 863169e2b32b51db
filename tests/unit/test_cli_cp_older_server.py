"""`kibo workspace cp` against a server of the release before the streamed file calls: it answers
UNIMPLEMENTED to StatWorkspacePath, StartWorkspaceUpload and DownloadWorkspaceFile (as the
generated servicer does for every RPC it does not serve), so cp moves one file of up to 3 MiB
with WriteWorkspaceFile / ReadWorkspaceFile, as it did before. The server here serves exactly
that older API over real gRPC, on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo_cli.exit_codes import ExitCode
from kibo_cli.main import app
from typer.testing import CliRunner

from tests.server import free_port

runner = CliRunner()
WORKSPACE = "ws-older"


class OlderDataPlane(dp_grpc.DataPlaneServiceServicer):
    """IssueDataPlaneCredential, ReadWorkspaceFile and WriteWorkspaceFile over a dict; every other
    RPC UNIMPLEMENTED (the base class's answer)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, int]] = {}
        self.calls: list[str] = []

    def IssueDataPlaneCredential(
        self, request: dp.IssueDataPlaneCredentialRequest, context: grpc.ServicerContext
    ) -> dp.IssueDataPlaneCredentialResponse:
        self.calls.append("Issue")
        return dp.IssueDataPlaneCredentialResponse(credential="kdp1.older", execution_generation=1)

    def WriteWorkspaceFile(
        self, request: dp.WriteWorkspaceFileRequest, context: grpc.ServicerContext
    ) -> dp.WriteWorkspaceFileResponse:
        self.calls.append("Write")
        assert request.credential == "kdp1.older"
        self.files[request.path] = (request.content, request.mode)
        return dp.WriteWorkspaceFileResponse(size=len(request.content))

    def ReadWorkspaceFile(
        self, request: dp.ReadWorkspaceFileRequest, context: grpc.ServicerContext
    ) -> dp.ReadWorkspaceFileResponse:
        self.calls.append("Read")
        if request.path not in self.files:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{request.path}: not found")
        return dp.ReadWorkspaceFileResponse(content=self.files[request.path][0])


@pytest.fixture
def older() -> Iterator[tuple[str, OlderDataPlane]]:
    servicer = OlderDataPlane()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dp_grpc.add_DataPlaneServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def test_cp_of_one_file_falls_back_to_the_older_calls(older: tuple[str, OlderDataPlane], tmp_path: Path) -> None:
    address, servicer = older
    local = tmp_path / "notes.txt"
    local.write_bytes(b"kept\n")
    local.chmod(0o640)
    up = runner.invoke(app, ["--server", address, "workspace", "cp", str(local), f"{WORKSPACE}:/data/notes.txt"])
    assert up.exit_code == 0, up.output
    assert servicer.files["/data/notes.txt"] == (b"kept\n", 0o640)
    assert "Write" in servicer.calls

    down = runner.invoke(
        app, ["--server", address, "workspace", "cp", f"{WORKSPACE}:/data/notes.txt", str(tmp_path / "back")]
    )
    assert down.exit_code == 0, down.output
    assert (tmp_path / "back").read_bytes() == b"kept\n"
    assert not list(tmp_path.glob(".*tmp"))
    shown = runner.invoke(app, ["--server", address, "workspace", "cp", f"{WORKSPACE}:/data/notes.txt", "-"])
    assert (shown.exit_code, shown.stdout) == (0, "kept\n")

    big = tmp_path / "big"
    big.write_bytes(b"x" * ((3 << 20) + 1))
    too_big = runner.invoke(app, ["--server", address, "workspace", "cp", str(big), f"{WORKSPACE}:/data/big"])
    assert too_big.exit_code == ExitCode.INVALID_ARGUMENT and "older kibo-ctrl" in too_big.stderr
    assert "/data/big" not in servicer.files
    missing = runner.invoke(app, ["--server", address, "workspace", "cp", f"{WORKSPACE}:/data/missing", "-"])
    assert missing.exit_code == ExitCode.NOT_FOUND
