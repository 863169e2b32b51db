"""The two nodes' sides of a disk move where the simulation found gaps (issue 26): a move
resumed after its target checked and put the files in place, but before the switch was
stored, goes on to the switch (it failed with "on this node already", and left the whole
copy there); and the simulated disk keeps image_transfer.py's semantics (a copy that
differs is not put in place; a crash keeps only what was synced)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kibo_ctrl.domain.moves import BLOCK, MoveRefused, StoredFile
from kibo_ctrl.runtime.process import image_transfer as t
from kibo_ctrl.runtime.sim.disks import SYNC_BLOCKS, SimDisk

WS = "ws-1"


def test_a_node_says_a_file_it_put_in_place_is_received_whole(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    path = source / "layers" / WS / "layer.img"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(8 * BLOCK)
        f.seek(3 * BLOCK + 17)
        f.write(os.urandom(5000))
    target.mkdir()
    file = t.list_files(source, WS, [])[0]
    disks = t.NodeDisks(target)
    disks.write(WS, file, [*t.read(source, WS, "layer", 0), (file.size, b"")])
    disks.finish(WS, [file])
    # The control plane crashed before it stored the switch: the move asks again.
    assert t.received(target, WS, file) == file.size
    t.finish(target, WS, [file])  # a finish asked again counts
    # Another version in place is not this file: the copy starts from nothing (and is refused).
    other = StoredFile(file.name, file.size, file.data_bytes, bytes(32))
    assert t.received(target, WS, other) == 0
    with pytest.raises(MoveRefused, match="on this node already"):
        disks.write(WS, other, [(file.size, b"")])


def _source(disk: SimDisk, generations: int) -> StoredFile:
    for generation in range(1, generations + 1):
        disk.write_run(WS, "layer", generation)
    return disk.list_files(WS, [])[0]


def test_a_simulated_copy_resumes_from_what_was_synced_and_is_checked() -> None:
    source, target = SimDisk(), SimDisk()
    file = _source(source, SYNC_BLOCKS + 3)
    blocks = source.read(WS, "layer", 0)
    assert len(blocks) == SYNC_BLOCKS + 3 and file.data_bytes == sum(len(d) for _, d in blocks)
    # The first call is under the sync interval: nothing synced, so a crash loses it all.
    assert target.write(WS, file, blocks[:2]) == 0
    target.crash()
    assert target.received(WS, file) == 0
    synced = target.write(WS, file, blocks[:SYNC_BLOCKS])
    assert synced == blocks[SYNC_BLOCKS - 1][0] + len(blocks[SYNC_BLOCKS - 1][1])
    target.write(WS, file, blocks[SYNC_BLOCKS : SYNC_BLOCKS + 1])  # unsynced: lost below
    target.crash()
    assert target.received(WS, file) == synced
    with pytest.raises(MoveRefused, match="outside"):
        target.write(WS, file, blocks[:1])  # before what it synced
    rest = [b for b in blocks if b[0] >= synced]
    assert target.write(WS, file, [*rest, (file.size, b"")]) == file.size
    target.finish(WS, [file])
    assert target.holds(WS, []) == {"layer": file} and not target.partial_of(WS, [])
    assert target.received(WS, file) == file.size


def test_a_simulated_copy_that_differs_is_not_put_in_place() -> None:
    source, target = SimDisk(), SimDisk()
    file = _source(source, 3)
    blocks = source.read(WS, "layer", 0)
    corrupt = [(blocks[0][0], b"x" * len(blocks[0][1])), *blocks[1:], (file.size, b"")]
    target.write(WS, file, corrupt)
    with pytest.raises(MoveRefused, match="arrived different"):
        target.finish(WS, [file])
    assert not target.holds(WS, []) and not target.partial_of(WS, [])
    with pytest.raises(MoveRefused, match="not received"):
        target.finish(WS, [file])
    # A file in place is never written over.
    target.write(WS, file, [*blocks, (file.size, b"")])
    target.finish(WS, [file])
    with pytest.raises(MoveRefused, match="on this node already"):
        target.write(WS, file, blocks[:1])
