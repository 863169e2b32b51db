"""kibo.node.v1.NodeStorageService, transport-free: a node's side of moving a STOPPED
workspace's disks, served beside NodeGuestService with the same credentials (the control
plane only). Every call names the workspace; names of files map to this node's paths only
(runtime/process/image_transfer.py), and a refused step changes nothing here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Protocol, TypeVar

from kibo.node.v1 import node_storage_service_pb2 as pb

from ..domain.access import Caller
from ..domain.errors import Conflict, InvalidArgument
from ..domain.moves import BLOCK, MoveRefused, StoredFile

MAX_VOLUMES = 64
MAX_BLOCKS_PER_WRITE = 3
T = TypeVar("T")


def stored_file(message: pb.StorageFile) -> StoredFile:
    if len(message.name) > 200 or message.size < 0 or message.data_bytes < 0 or len(message.digest) != 32:
        raise InvalidArgument("file: a name, a size, its data bytes and a SHA-256 digest", field="file")
    return StoredFile(message.name, message.size, message.data_bytes, message.digest)


def file_message(file: StoredFile) -> pb.StorageFile:
    return pb.StorageFile(name=file.name, size=file.size, data_bytes=file.data_bytes, digest=file.digest)


def _volumes(ids: list[str]) -> list[str]:
    if len(ids) > MAX_VOLUMES:
        raise InvalidArgument(f"at most {MAX_VOLUMES} volumes", field="volume_ids")
    return ids


async def _refusals(call: Callable[[], T]) -> T:
    try:
        return await asyncio.to_thread(call)
    except MoveRefused as refused:
        raise Conflict(str(refused)) from None


class NodeDisks(Protocol):
    """A node's disks (runtime/process/image_transfer.py NodeDisks): blocking calls."""

    def list_files(self, workspace_id: str, volume_ids: list[str]) -> list[StoredFile]: ...
    def read(self, workspace_id: str, name: str, offset: int) -> Generator[tuple[int, bytes], None, None]: ...
    def received(self, workspace_id: str, file: StoredFile) -> int: ...
    def write(self, workspace_id: str, file: StoredFile, blocks: list[tuple[int, bytes]]) -> int: ...
    def finish(self, workspace_id: str, files: list[StoredFile]) -> None: ...
    def drop(self, workspace_id: str, volume_ids: list[str], received_only: bool) -> None: ...


class NodeStorageApi:
    def __init__(self, disks: NodeDisks) -> None:
        self._disks = disks

    async def list_storage(self, request: pb.ListStorageRequest, caller: Caller) -> pb.ListStorageResponse:
        volumes = _volumes(list(request.volume_ids))
        files = await _refusals(lambda: self._disks.list_files(request.workspace_id, volumes))
        return pb.ListStorageResponse(files=[file_message(f) for f in files])

    async def read_storage(
        self, request: pb.ReadStorageRequest, caller: Caller
    ) -> AsyncGenerator[pb.ReadStorageResponse, None]:
        if request.offset < 0:
            raise InvalidArgument("offset must not be negative", field="offset")
        blocks: Generator[tuple[int, bytes], None, None] = await _refusals(
            lambda: self._disks.read(request.workspace_id, request.name, request.offset)
        )

        def take() -> tuple[int, bytes] | None:
            return next(blocks, None)

        with contextlib.closing(blocks):
            while True:
                block = await _refusals(take)
                if block is None:
                    return
                offset, data = block
                yield pb.ReadStorageResponse(chunk=pb.StorageChunk(offset=offset, data=data))

    async def get_storage_received(
        self, request: pb.GetStorageReceivedRequest, caller: Caller
    ) -> pb.GetStorageReceivedResponse:
        file = stored_file(request.file)
        synced = await _refusals(lambda: self._disks.received(request.workspace_id, file))
        return pb.GetStorageReceivedResponse(synced_offset=synced)

    async def write_storage(self, request: pb.WriteStorageRequest, caller: Caller) -> pb.WriteStorageResponse:
        file = stored_file(request.file)
        if len(request.chunks) > MAX_BLOCKS_PER_WRITE or any(len(c.data) > BLOCK for c in request.chunks):
            raise InvalidArgument(f"at most {MAX_BLOCKS_PER_WRITE} blocks of 1 MiB a call", field="chunks")

        blocks = [(chunk.offset, chunk.data) for chunk in request.chunks]
        synced = await _refusals(lambda: self._disks.write(request.workspace_id, file, blocks))
        return pb.WriteStorageResponse(synced_offset=synced)

    async def finish_storage(self, request: pb.FinishStorageRequest, caller: Caller) -> pb.FinishStorageResponse:
        if len(request.files) > MAX_VOLUMES + 1:
            raise InvalidArgument("too many files", field="files")
        files = [stored_file(f) for f in request.files]
        await _refusals(lambda: self._disks.finish(request.workspace_id, files))
        return pb.FinishStorageResponse()

    async def drop_storage(self, request: pb.DropStorageRequest, caller: Caller) -> pb.DropStorageResponse:
        volumes = _volumes(list(request.volume_ids))
        await _refusals(lambda: self._disks.drop(request.workspace_id, volumes, request.received_only))
        return pb.DropStorageResponse()
