"""What kibotos' workspace access does when a call breaks, against a real `kibo-ctrl serve
--runtime process` behind a real gRPC proxy that loses what a network loses: the answer of a call
that went through (an upload part the server took), or a download stream half-way. And how its
credential follows the workspace: renewed after a new start, never after a revoke."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import kibotos
import pytest
from google.protobuf import descriptor_pool
from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from tests.server import ServerProcess, free_port
from tests.system.test_data_plane_client import create, delete
from tests.system.test_process_runtime import sandbox_server

_SERVICE = "kibo.ctrl.v1.DataPlaneService"


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory) as started:
        yield started


@pytest.fixture(scope="module")
def workspace(server: ServerProcess) -> Iterator[str]:
    with kibotos.Client(server.address) as client:
        workspace_id = create(client)
        yield workspace_id
        delete(client, workspace_id, server)


class LossyProxy:
    """A gRPC proxy on a loopback port in front of `upstream`: every call forwarded as bytes (with
    its metadata, and an error's trailers: its ErrorDetail and ErrorInfo), except that
    `lose_answers[method]` answers of that unary method are dropped after the server answered
    (UNAVAILABLE to the client instead), and a stream of `cut_after[method]` is cut (UNAVAILABLE)
    once that many bytes passed. `requests` keeps every request it forwarded, by method."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.address = f"127.0.0.1:{free_port()}"
        self.lose_answers: dict[str, int] = {}
        self.cut_after: dict[str, int] = {}
        self.requests: dict[str, list[bytes]] = {}
        self.refusals: dict[str, list[grpc.StatusCode]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    def __enter__(self) -> LossyProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.upstream)
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((_Handler(self),))
        self._server.add_insecure_port(self.address)
        await self._server.start()

    async def _stop(self) -> None:
        assert self._server is not None and self._channel is not None
        await self._server.stop(None)
        await self._channel.close()

    def channel(self) -> grpc.aio.Channel:
        assert self._channel is not None
        return self._channel


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: LossyProxy) -> None:
        self.proxy = proxy

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        path = str(details.method)
        service, _, name = path.lstrip("/").rpartition("/")
        method = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name)
        if method.server_streaming:
            return grpc.unary_stream_rpc_method_handler(self._stream(path, name))
        return grpc.unary_unary_rpc_method_handler(self._unary(path, name))

    def _record(self, name: str, request: bytes) -> None:
        self.proxy.requests.setdefault(name, []).append(request)

    def _unary(self, path: str, name: str) -> Callable[[bytes, Any], Any]:
        async def forward(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            self._record(name, request)
            call: Any = self.proxy.channel().unary_unary(path)
            try:
                answer: bytes = await call(request, metadata=context.invocation_metadata(), timeout=30)
            except grpc.aio.AioRpcError as error:
                self.proxy.refusals.setdefault(name, []).append(error.code())
                await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))
            if self.proxy.lose_answers.get(name, 0) > 0:
                self.proxy.lose_answers[name] -= 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the proxy lost the answer")
            return answer

        return forward

    def _stream(self, path: str, name: str) -> Callable[[bytes, Any], AsyncIterator[bytes]]:
        async def forward(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> AsyncIterator[bytes]:
            self._record(name, request)
            stream: Any = self.proxy.channel().unary_stream(path)
            call = stream(request, metadata=context.invocation_metadata())
            passed = 0
            try:
                async for message in call:
                    yield message
                    passed += len(message)
                    limit = self.proxy.cut_after.get(name)
                    if limit is not None and passed >= limit:
                        del self.proxy.cut_after[name]
                        call.cancel()
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "the proxy cut the stream")
            except grpc.aio.AioRpcError as error:
                await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))

        return forward


def _random_file(path: Path, mib: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for _ in range(mib):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def test_an_upload_goes_on_from_the_offset_the_server_names(
    server: ServerProcess, workspace: str, tmp_path: Path
) -> None:
    """The answer to the first part is lost after the server took it: the client sends it again,
    the server refuses it (FAILED_PRECONDITION naming the offset it has) and the upload goes on
    from there: the file arrives whole, each byte once."""
    source = tmp_path / "source.bin"
    expected = _random_file(source, 7)
    with LossyProxy(server.address) as proxy, kibotos.Client(proxy.address) as client:
        files = client.workspace_access(workspace).files
        files.make_dir("/root/resume", parents=True)
        proxy.lose_answers["WriteWorkspaceUpload"] = 1  # the first part's answer
        assert files.upload("/root/resume/file.bin", source) == 7 << 20
        writes = [dp.WriteWorkspaceUploadRequest.FromString(r) for r in proxy.requests["WriteWorkspaceUpload"]]
        assert [w.offset for w in writes[:2]] == [0, 0]  # the first part, sent again
        assert grpc.StatusCode.FAILED_PRECONDITION in proxy.refusals["WriteWorkspaceUpload"]
        assert writes[-1].finish and writes[-1].offset + len(writes[-1].data) == 7 << 20
        back = tmp_path / "back.bin"
        files.download("/root/resume/file.bin", back)
    assert hashlib.sha256(back.read_bytes()).hexdigest() == expected


def test_a_broken_download_resumes_where_it_was(server: ServerProcess, workspace: str, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    expected = _random_file(source, 9)
    with kibotos.Client(server.address) as client:
        client.workspace_access(workspace).files.upload("/root/resume-down.bin", source, parents=True)
    with LossyProxy(server.address) as proxy, kibotos.Client(proxy.address) as client:
        proxy.cut_after["DownloadWorkspaceFile"] = 3 << 20
        back = tmp_path / "back.bin"
        assert client.workspace_access(workspace).files.download("/root/resume-down.bin", back) == 9 << 20
        asked = [dp.DownloadWorkspaceFileRequest.FromString(r) for r in proxy.requests["DownloadWorkspaceFile"]]
    assert [a.offset for a in asked[:1]] == [0] and len(asked) == 2 and asked[1].offset >= 3 << 20
    assert hashlib.sha256(back.read_bytes()).hexdigest() == expected


def test_the_credential_is_renewed_after_a_new_start_and_never_after_a_revoke(
    server: ServerProcess, tmp_path: Path
) -> None:
    with kibotos.Client(server.address) as client:
        workspace_id = create(client)
        try:
            access = client.workspace_access(workspace_id)
            background = access.processes.start(["sleep", "64"], tag="before-stop")
            assert [p.tag for p in access.processes.list() if p.running] == ["before-stop"]
            first = access.credential()
            client.stop_workspace(workspace_id)
            client.start_workspace(workspace_id)
            # The same handle goes on, with a new credential; what ran before the stop is gone.
            assert not [p for p in access.processes.list() if p.pid == background.pid and p.running]
            assert access.credential() != first
            # A revoke is not undone: the handle's calls are refused until the next start.
            client.revoke_workspace_data_plane_access(workspace_id)
            with pytest.raises(kibotos.UnauthenticatedError, match="revoked"):
                access.processes.list()
            with pytest.raises(kibotos.UnauthenticatedError):
                access.files.stat("/")
            # A credential given to the handle is never replaced.
            given = client.workspace_access(workspace_id, credential=first)
            with pytest.raises(kibotos.UnauthenticatedError):
                given.files.stat("/")
        finally:
            delete(client, workspace_id, server)
