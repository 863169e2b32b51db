"""A node's side of moving a STOPPED workspace's disks (kibo.node.v1.NodeStorageService):
its image files listed with digests, read block by block without their holes, received
into `<image>.moving` with how much is synced kept beside it (`.moving.json`), checked and
put in place, or deleted.

Blocking: the API runs each call in a thread. A receive survives a kill -9 of this node:
what was synced before it stays, and the control plane resumes after it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from ...domain.moves import BLOCK, MoveRefused, NodeUnreachable, StoredFile
from . import storage
from .provision import safe

PARTIAL = ".moving"
# How much a receive writes between two syncs of what it has.
SYNC_EVERY = 64 << 20
_ZEROS = bytes(BLOCK)
T = TypeVar("T")


def image_path(data_dir: Path, workspace_id: str, name: str) -> Path:
    """Where a file of the workspace lives on this node: "layer", or "volume/<ID>"."""
    try:
        if name == "layer":
            return data_dir / "layers" / safe(workspace_id) / storage.LAYER_IMAGE
        kind, _, volume_id = name.partition("/")
        if kind == "volume":
            return data_dir / "volumes" / safe(volume_id) / storage.VOLUME_IMAGE
    except ValueError as error:
        raise MoveRefused(str(error)) from None
    raise MoveRefused(f"no such kind of file: {name[:80]!r} (layer, or volume/<ID>)")


def _blocks(path: Path, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """The file's blocks from `start` (rounded down to a block) that are not all zeros,
    reading only its data extents (SEEK_DATA / SEEK_HOLE)."""
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        offset = start - start % BLOCK
        while offset < size:
            try:
                data_at = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after offset
                return
            hole_at = os.lseek(fd, data_at, os.SEEK_HOLE)
            block = data_at - data_at % BLOCK
            while block < hole_at:
                data = os.pread(fd, min(BLOCK, size - block), block)
                if data and data != _ZEROS[: len(data)]:
                    yield block, data
                block += BLOCK
            offset = block


def _digest(blocks: Iterable[tuple[int, bytes]]) -> tuple[int, bytes]:
    digest = hashlib.sha256()
    count = 0
    for offset, data in blocks:
        digest.update(offset.to_bytes(8, "big"))
        digest.update(data)
        count += len(data)
    return count, digest.digest()


def _idle(path: Path) -> None:
    if storage.attached([str(path)]):
        raise MoveRefused(f"{path.name} is in use (mounted): only a STOPPED workspace's disks move")


def list_files(data_dir: Path, workspace_id: str, volume_ids: Iterable[str]) -> list[StoredFile]:
    """The workspace's images here (its layer, then its volumes), each read once for its digest."""
    names = ["layer", *(f"volume/{v}" for v in volume_ids)]
    files = []
    for name in names:
        path = image_path(data_dir, workspace_id, name)
        if not path.exists():
            if name == "layer" and storage.legacy_layer(path.parent):
                raise MoveRefused("its writable layer is a directory from before images: it cannot move")
            if name != "layer" and storage.legacy_volume(path.parent):
                raise MoveRefused(f"{name} is a directory from before images: it cannot move")
            continue  # never made (a volume not used yet): nothing to move
        _idle(path)
        count, digest = _digest(_blocks(path))
        files.append(StoredFile(name, path.stat().st_size, count, digest))
    return files


def read(data_dir: Path, workspace_id: str, name: str, offset: int) -> Generator[tuple[int, bytes], None, None]:
    path = image_path(data_dir, workspace_id, name)
    if not path.exists():
        raise MoveRefused(f"no {name} of {workspace_id} on this node")
    _idle(path)
    yield from _blocks(path, max(0, offset))


def _meta(path: Path) -> Path:
    return path.with_name(path.name + PARTIAL + ".json")


def _synced(path: Path, file: StoredFile) -> int | None:
    """What the record beside a partial copy of this same file (size and digest) says is
    synced; None without one."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        meta = json.loads(_meta(path).read_text())
        if path.with_name(path.name + PARTIAL).exists() and (meta["size"], meta["digest"]) == (
            file.size,
            file.digest.hex(),
        ):
            return int(meta["synced"])
    return None


def received(data_dir: Path, workspace_id: str, file: StoredFile) -> int:
    """Where a copy of `file` resumes (asked before its first block): what a receive of this
    same file synced; its size when this same file is in place here (a finish done, the
    switch not: a move resumed after a crash there); else 0, and a partial copy of another
    version, or never synced, goes."""
    path = image_path(data_dir, workspace_id, file.name)
    synced = _synced(path, file)
    if synced is not None:
        return synced
    in_place = not path.with_name(path.name + PARTIAL).exists() and path.exists() and path.stat().st_size == file.size
    if in_place and _digest(_blocks(path)) == (file.data_bytes, file.digest):
        return file.size
    for stale in (path.with_name(path.name + PARTIAL), _meta(path)):
        stale.unlink(missing_ok=True)
    return 0


def _record(path: Path, file: StoredFile, synced: int) -> None:
    """Write down how much is synced (atomically: a crash leaves the old or the new figure)."""
    meta = _meta(path)
    temporary = meta.with_name(meta.name + ".tmp")
    temporary.write_text(json.dumps({"size": file.size, "digest": file.digest.hex(), "synced": synced}))
    with open(temporary, "rb") as f:
        os.fsync(f.fileno())
    os.replace(temporary, meta)


class Receiver:
    """Blocks of one file, as one WriteStorage call brings them: `put` each (in offset order,
    from where `received` said; an empty block at `file.size` ends the file), then `close`:
    what came is synced once SYNC_EVERY bytes are unsynced, or at the end, and the answer is
    how much is synced (the control plane resumes there after a crash). Refuses what would
    push this node's disk under its reserve."""

    def __init__(self, data_dir: Path, workspace_id: str, file: StoredFile) -> None:
        self.file = file
        self.path = image_path(data_dir, workspace_id, file.name)
        if self.path.exists():
            raise MoveRefused(f"{file.name} of {workspace_id} is on this node already")
        # Blocks of earlier calls may be written and not synced yet: kept (not `received`).
        self.synced = _synced(self.path, file) or 0
        free, reserve, _, _ = storage.disk_status(data_dir)
        if self.synced == 0 and free - reserve < file.data_bytes:
            raise MoveRefused(
                f"not enough disk on this node for {file.data_bytes / storage.GIB:.2f} GiB of data: "
                f"{free / storage.GIB:.1f} GiB free, {reserve / storage.GIB:.1f} GiB kept in reserve"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path.with_name(self.path.name + PARTIAL), os.O_WRONLY | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size != file.size:
            os.ftruncate(self._fd, file.size)
        self._end = self.synced
        self._ended = False

    def put(self, offset: int, data: bytes) -> None:
        size = self.file.size
        if offset < self.synced - self.synced % BLOCK or offset + len(data) > size or offset % BLOCK:
            raise MoveRefused(f"block at {offset} ({len(data)} bytes) is outside what {self.file.name} still needs")
        if not data:
            if offset != size:
                raise MoveRefused("an empty block ends a file, at its size")
            self._end, self._ended = size, True
            return
        os.pwrite(self._fd, data, offset)
        # Everything before the end of this block is here (a skipped block reads as zeros;
        # earlier calls' blocks, unsynced, are synced with this file's next fsync).
        self._end = offset + len(data)

    def close(self) -> int:
        try:
            if self._ended or self._end - self.synced >= SYNC_EVERY:
                os.fsync(self._fd)
                self.synced = self._end
                _record(self.path, self.file, self.synced)
        finally:
            os.close(self._fd)
        return self.synced


def finish(data_dir: Path, workspace_id: str, files: Iterable[StoredFile]) -> None:
    """Check every received file against its digest, then put each in place (a file already
    in place with the same digest counts: a finish that is asked again)."""
    checked: list[tuple[Path, Path]] = []
    for file in files:
        path = image_path(data_dir, workspace_id, file.name)
        partial = path.with_name(path.name + PARTIAL)
        source = partial if partial.exists() else path
        if not source.exists():
            raise MoveRefused(f"{file.name} of {workspace_id} was not received")
        count, digest = _digest(_blocks(source))
        if (count, digest) != (file.data_bytes, file.digest) or source.stat().st_size != file.size:
            # Started again from nothing: a copy that does not match is not kept.
            for stale in (partial, _meta(path)):
                stale.unlink(missing_ok=True)
            raise MoveRefused(f"{file.name} of {workspace_id} arrived different from the source's: received again")
        checked.append((partial, path))
    for partial, path in checked:
        if partial.exists():
            os.replace(partial, path)
            _meta(path).unlink(missing_ok=True)
            (path.parent / "mnt").mkdir(exist_ok=True)
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def drop(data_dir: Path, workspace_id: str, volume_ids: Iterable[str], received_only: bool) -> None:
    """Delete the workspace's files here, or only what a move received and did not finish."""
    for name in ["layer", *(f"volume/{v}" for v in volume_ids)]:
        path = image_path(data_dir, workspace_id, name)
        if received_only:
            for stale in (path.with_name(path.name + PARTIAL), _meta(path)):
                stale.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                (path.parent / "mnt").rmdir()
                path.parent.rmdir()
        else:
            storage.destroy(path.parent)


class NodeDisks:
    """This node's disks as NodeStorageService reaches them (api/node_storage_api.py's port)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def list_files(self, workspace_id: str, volume_ids: list[str]) -> list[StoredFile]:
        return list_files(self.data_dir, workspace_id, volume_ids)

    def read(self, workspace_id: str, name: str, offset: int) -> Generator[tuple[int, bytes], None, None]:
        return read(self.data_dir, workspace_id, name, offset)

    def received(self, workspace_id: str, file: StoredFile) -> int:
        return received(self.data_dir, workspace_id, file)

    def write(self, workspace_id: str, file: StoredFile, blocks: list[tuple[int, bytes]]) -> int:
        receiver = Receiver(self.data_dir, workspace_id, file)
        try:
            for offset, data in blocks:
                receiver.put(offset, data)
        finally:
            synced = receiver.close()
        return synced

    def finish(self, workspace_id: str, files: list[StoredFile]) -> None:
        finish(self.data_dir, workspace_id, files)

    def drop(self, workspace_id: str, volume_ids: list[str], received_only: bool) -> None:
        drop(self.data_dir, workspace_id, volume_ids, received_only)


class LocalDisks:
    """The embedded node's disks as the leader's mover asks them (engine/moves.py
    `StorageLink`), in this process: each call in a thread, as NodeStorageService runs them
    for a remote node. An OS error is a node that cannot answer now (the remote link's
    INTERNAL): the move waits and asks again."""

    def __init__(self, node_id: str, data_dir: Path) -> None:
        self.node_id = node_id
        self._disks = NodeDisks(data_dir)

    async def _call(self, call: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(call)
        except OSError as error:
            raise NodeUnreachable(f"node {self.node_id}: {error}") from None

    async def list_files(self, workspace_id: str, volume_ids: Sequence[str]) -> list[StoredFile]:
        return await self._call(lambda: self._disks.list_files(workspace_id, list(volume_ids)))

    async def read(self, workspace_id: str, name: str, offset: int) -> AsyncIterator[tuple[int, bytes]]:
        blocks = self._disks.read(workspace_id, name, offset)
        try:
            while (block := await self._call(lambda: next(blocks, None))) is not None:
                yield block
        finally:
            blocks.close()

    async def received(self, workspace_id: str, file: StoredFile) -> int:
        return await self._call(lambda: self._disks.received(workspace_id, file))

    async def write(self, workspace_id: str, file: StoredFile, blocks: Sequence[tuple[int, bytes]]) -> int:
        return await self._call(lambda: self._disks.write(workspace_id, file, list(blocks)))

    async def finish(self, workspace_id: str, files: Sequence[StoredFile]) -> None:
        await self._call(lambda: self._disks.finish(workspace_id, list(files)))

    async def drop(self, workspace_id: str, volume_ids: Sequence[str], received_only: bool) -> None:
        await self._call(lambda: self._disks.drop(workspace_id, list(volume_ids), received_only))
