"""The control plane's side of moving disks: each node's kibo.node.v1.NodeStorageService
(served beside its guest hop, with the same secret and, by default, mutual TLS), as the
`StorageLink` engine/moves.py drives."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from kibo.node.v1 import node_storage_service_pb2 as pb
from kibo.node.v1 import node_storage_service_pb2_grpc as pb_grpc

from ..domain.moves import MoveRefused, NodeUnreachable, StoredFile
from .node_guest_client import GuestTls

Endpoints = Callable[[str], tuple[str, str] | None]
# Answers that say the node could not take the call now: wait and ask again.
_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
}
CALL_TIMEOUT_S = 60.0


def _failure(node_id: str, error: grpc.aio.AioRpcError) -> Exception:
    message = f"node {node_id}: {error.details() or error.code().name}"
    if error.code() in _TRANSIENT:
        return NodeUnreachable(message)
    return MoveRefused(message)


def _file(file: StoredFile) -> pb.StorageFile:
    return pb.StorageFile(name=file.name, size=file.size, data_bytes=file.data_bytes, digest=file.digest)


class RemoteStorage:
    """One node's disks, over its NodeStorageService."""

    def __init__(self, node_id: str, address: str, secret: str, tls: GuestTls | None) -> None:
        self.node_id = node_id
        self._channel = grpc.aio.insecure_channel(address) if tls is None else tls.channel(address, node_id)
        self._stub = pb_grpc.NodeStorageServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {secret}"),)

    async def close(self) -> None:
        await self._channel.close()

    async def _unary(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, method)(request, metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise _failure(self.node_id, error) from None

    async def list_files(self, workspace_id: str, volume_ids: Sequence[str]) -> list[StoredFile]:
        answer = await self._unary(
            "ListStorage", pb.ListStorageRequest(workspace_id=workspace_id, volume_ids=volume_ids)
        )
        return [StoredFile(f.name, f.size, f.data_bytes, f.digest) for f in answer.files]

    async def read(self, workspace_id: str, name: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
        call = self._stub.ReadStorage(
            pb.ReadStorageRequest(workspace_id=workspace_id, name=name, offset=offset), metadata=self._metadata
        )
        try:
            async for response in call:
                yield response.chunk.offset, response.chunk.data
        except grpc.aio.AioRpcError as error:
            raise _failure(self.node_id, error) from None
        finally:
            call.cancel()

    async def received(self, workspace_id: str, file: StoredFile) -> int:
        request = pb.GetStorageReceivedRequest(workspace_id=workspace_id, file=_file(file))
        return int((await self._unary("GetStorageReceived", request)).synced_offset)

    async def write(self, workspace_id: str, file: StoredFile, blocks: Sequence[tuple[int, bytes]]) -> int:
        chunks = [pb.StorageChunk(offset=offset, data=data) for offset, data in blocks]
        request = pb.WriteStorageRequest(workspace_id=workspace_id, file=_file(file), chunks=chunks)
        return int((await self._unary("WriteStorage", request)).synced_offset)

    async def finish(self, workspace_id: str, files: Sequence[StoredFile]) -> None:
        await self._unary(
            "FinishStorage", pb.FinishStorageRequest(workspace_id=workspace_id, files=[_file(f) for f in files])
        )

    async def drop(self, workspace_id: str, volume_ids: Sequence[str], received_only: bool) -> None:
        request = pb.DropStorageRequest(workspace_id=workspace_id, volume_ids=volume_ids, received_only=received_only)
        await self._unary("DropStorage", request)


class NodeStorageLinks:
    """By node ID: its disks' link, at the hop it declared at its last join (None: it has
    none, a simulated or in-process node)."""

    def __init__(self, endpoints: Endpoints, tls: GuestTls | None = None) -> None:
        self._endpoints = endpoints
        self._tls = tls
        self._links: dict[str, tuple[tuple[str, str], RemoteStorage]] = {}

    def __call__(self, node_id: str) -> RemoteStorage | None:
        endpoint = self._endpoints(node_id)
        if endpoint is None:
            return None
        known = self._links.get(node_id)
        if known is not None and known[0] == endpoint:
            return known[1]
        link = RemoteStorage(node_id, endpoint[0], endpoint[1], self._tls)
        self._links[node_id] = (endpoint, link)
        return link

    async def close(self) -> None:
        for _, link in self._links.values():
            with contextlib.suppress(Exception):
                await link.close()
