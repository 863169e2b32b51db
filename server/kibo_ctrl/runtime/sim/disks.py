"""A simulated node's disk: the files it holds per workspace (its layer, "layer", and its
volumes, "volume/<ID>"), and what a disk move received, with the semantics of the process
runtime's image_transfer.py (the mover cannot tell them apart):

- a file is blocks at BLOCK-aligned offsets; a block here holds a few bytes (its data as far
  as the simulation keeps it) and a block of no data is a hole, never listed nor sent;
- a file's digest is SHA-256 over (offset, block) of its data blocks, in offset order;
- a receive goes into a partial copy, synced every SYNC_BLOCKS blocks and at its end; only
  the synced part survives a crash of the node (`crash`: a power loss, the harsher case),
  and `received` resumes where the synced part ends;
- `finish` checks each copy against the source's digest before it is put in place (a copy
  that differs is dropped), and a file in place is never written over.

The disk outlives its node's runtime (a restart of the simulated process adopts it), as a
real node's data directory does. Blocking-free and pure: SimNode (simulator.py) adds the
virtual time each step costs and its reachability."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ...domain.moves import BLOCK, MoveRefused, StoredFile

# Blocks of a file a simulated workspace's layer and each volume have (its apparent size).
LAYER_BLOCKS = 12
VOLUME_BLOCKS = 8
# A receive is synced once this many blocks came since the last sync (image_transfer.py:
# every 64 MiB), and at the end of the file.
SYNC_BLOCKS = 4


def _digest(blocks: Iterable[tuple[int, bytes]]) -> tuple[int, bytes]:
    digest = hashlib.sha256()
    count = 0
    for offset, data in blocks:
        digest.update(offset.to_bytes(8, "big"))
        digest.update(data)
        count += len(data)
    return count, digest.digest()


def _key(workspace_id: str, name: str) -> str:
    """Where a file of the workspace lives on the node (a volume's path is its own)."""
    if name == "layer":
        return f"layers/{workspace_id}"
    kind, _, volume_id = name.partition("/")
    if kind == "volume" and volume_id:
        return f"volumes/{volume_id}"
    raise MoveRefused(f"no such kind of file: {name[:80]!r} (layer, or volume/<ID>)")


@dataclass
class SimFile:
    size: int
    blocks: dict[int, bytes] = field(default_factory=dict)

    def data(self, start: int = 0) -> Iterator[tuple[int, bytes]]:
        first = start - start % BLOCK
        for offset in sorted(self.blocks):
            if offset >= first and self.blocks[offset]:
                yield offset, self.blocks[offset]

    def stored(self, name: str) -> StoredFile:
        count, digest = _digest(self.data())
        return StoredFile(name, self.size, count, digest)


@dataclass
class Partial:
    """A copy being received: for which version of the file (size, digest), its blocks, how
    far it is synced, and whether a sync was ever recorded (image_transfer's .moving.json)."""

    size: int
    digest: bytes
    blocks: dict[int, bytes] = field(default_factory=dict)
    synced: int = 0
    end: int = 0
    recorded: bool = False


class SimDisk:
    """One simulated node's files."""

    def __init__(self) -> None:
        self.files: dict[str, SimFile] = {}
        self.partial: dict[str, Partial] = {}

    # -- what launches and deletes do ----------------------------------------------------------

    def has(self, workspace_id: str, name: str) -> bool:
        return _key(workspace_id, name) in self.files

    def write_run(self, workspace_id: str, name: str, generation: int) -> None:
        """A run of the workspace (its instance of `generation`) made the file if it was not
        here (a first launch makes the images) and wrote a block of its own data to it."""
        blocks = LAYER_BLOCKS if name == "layer" else VOLUME_BLOCKS
        file = self.files.setdefault(_key(workspace_id, name), SimFile(blocks * BLOCK))
        seed = f"{workspace_id}/{name}/{generation}".encode()
        file.blocks[(generation % blocks) * BLOCK] = hashlib.sha256(seed).digest() * 2

    def delete(self, workspace_id: str | None, volume_ids: Iterable[str]) -> None:
        """The workspace's layer (when named) and these volumes go, with what a move received."""
        names = ["layer"] if workspace_id is not None else []
        names.extend(f"volume/{v}" for v in volume_ids)
        for name in names:
            key = _key(workspace_id or "", name)
            self.files.pop(key, None)
            self.partial.pop(key, None)

    def crash(self) -> None:
        """The node lost power: what a receive wrote and did not sync is gone; a copy never
        synced has no record, and goes whole."""
        for key, partial in list(self.partial.items()):
            if not partial.recorded:
                del self.partial[key]
                continue
            partial.blocks = {o: d for o, d in partial.blocks.items() if o < partial.synced}
            partial.end = partial.synced

    # -- a move's steps (engine/moves.py StorageLink; image_transfer.py's semantics) ------------------

    def list_files(self, workspace_id: str, volume_ids: Iterable[str]) -> list[StoredFile]:
        names = ["layer", *(f"volume/{v}" for v in volume_ids)]
        return [file.stored(name) for name in names if (file := self.files.get(_key(workspace_id, name)))]

    def read(self, workspace_id: str, name: str, offset: int) -> list[tuple[int, bytes]]:
        file = self.files.get(_key(workspace_id, name))
        if file is None:
            raise MoveRefused(f"no {name} of {workspace_id} on this node")
        return list(file.data(max(0, offset)))

    def received(self, workspace_id: str, file: StoredFile) -> int:
        key = _key(workspace_id, file.name)
        partial = self.partial.get(key)
        if partial is not None and partial.recorded and (partial.size, partial.digest) == (file.size, file.digest):
            return partial.synced
        in_place = self.files.get(key)
        if partial is None and in_place is not None and in_place.stored(file.name) == file:
            return file.size  # finished here, not switched: a resumed move goes on to the switch
        self.partial.pop(key, None)
        return 0

    def write(self, workspace_id: str, file: StoredFile, blocks: Iterable[tuple[int, bytes]]) -> int:
        """One WriteStorage call's blocks (image_transfer.Receiver): the synced offset after it."""
        key = _key(workspace_id, file.name)
        if key in self.files:
            raise MoveRefused(f"{file.name} of {workspace_id} is on this node already")
        partial = self.partial.get(key)
        if partial is None:
            partial = self.partial[key] = Partial(file.size, file.digest)
        elif (partial.size, partial.digest) != (file.size, file.digest) or not partial.recorded:
            # Another version's copy (or one never synced): its blocks stay, as in the file a
            # receive reopens; its record does not count.
            partial.size, partial.digest, partial.synced, partial.recorded = file.size, file.digest, 0, False
            partial.end = 0
        ended = False
        floor = partial.synced - partial.synced % BLOCK
        for offset, data in blocks:
            if offset < floor or offset + len(data) > file.size or offset % BLOCK:
                raise MoveRefused(f"block at {offset} ({len(data)} bytes) is outside what {file.name} still needs")
            if not data:
                if offset != file.size:
                    raise MoveRefused("an empty block ends a file, at its size")
                partial.end, ended = file.size, True
                continue
            partial.blocks[offset] = data
            partial.end = offset + len(data)
        if ended or partial.end - partial.synced >= SYNC_BLOCKS * BLOCK:
            partial.synced, partial.recorded = partial.end, True
        return partial.synced

    def finish(self, workspace_id: str, files: Iterable[StoredFile]) -> None:
        checked: list[tuple[str, SimFile]] = []
        for file in files:
            key = _key(workspace_id, file.name)
            partial = self.partial.get(key)
            if partial is not None:
                candidate = SimFile(partial.size, {o: d for o, d in partial.blocks.items() if o < partial.size})
            elif key in self.files:
                candidate = self.files[key]
            else:
                raise MoveRefused(f"{file.name} of {workspace_id} was not received")
            count, digest = _digest(candidate.data())
            if (count, digest, candidate.size) != (file.data_bytes, file.digest, file.size):
                self.partial.pop(key, None)
                raise MoveRefused(f"{file.name} of {workspace_id} arrived different from the source's: received again")
            checked.append((key, candidate))
        for key, candidate in checked:
            if self.partial.pop(key, None) is not None:
                self.files[key] = candidate

    def drop(self, workspace_id: str, volume_ids: Iterable[str], received_only: bool) -> None:
        for name in ["layer", *(f"volume/{v}" for v in volume_ids)]:
            key = _key(workspace_id, name)
            self.partial.pop(key, None)
            if not received_only:
                self.files.pop(key, None)

    def holds(self, workspace_id: str, volume_ids: Iterable[str]) -> dict[str, StoredFile]:
        """What of the workspace is here, in place (for the simulation's invariants)."""
        return {f.name: f for f in self.list_files(workspace_id, volume_ids)}

    def partial_of(self, workspace_id: str, volume_ids: Iterable[str]) -> list[str]:
        names = ["layer", *(f"volume/{v}" for v in volume_ids)]
        return [n for n in names if _key(workspace_id, n) in self.partial]
