"""A node's side of a disk move (runtime/process/image_transfer.py), on real sparse files:
blocks without holes, a receive resumed after a crash from what it synced, a digest check
that keeps no copy that differs, and names that reach only the workspace's own images."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from kibo_ctrl.domain.moves import BLOCK, MoveRefused
from kibo_ctrl.runtime.process import image_transfer as t

WS = "ws-1"


def _image(data_dir: Path, size_mib: int = 80) -> Path:
    path = data_dir / "layers" / WS / "layer.img"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(size_mib << 20)
        for offset in (3 << 20, (10 << 20) + 12345, (40 << 20) - 7):
            f.seek(offset)
            f.write(os.urandom(1_500_000))
        f.seek((size_mib << 20) - 100)
        f.write(b"x" * 100)
        f.seek(60 << 20)
        f.write(bytes(3 << 20))  # zeros written as data: not sent
    return path


def _send(source: Path, target: Path, start: int = 0, stop_after: int | None = None) -> int:
    """Copy as the control plane does, in calls of 3 blocks; `stop_after` blocks: a crash."""
    target.mkdir(exist_ok=True)  # a node's data dir
    file = t.list_files(source, WS, [])[0]
    blocks = list(t.read(source, WS, "layer", start))
    if stop_after is not None:
        blocks = blocks[:stop_after]
    else:
        blocks.append((file.size, b""))
    synced = 0
    for i in range(0, len(blocks), 3):
        synced = t.NodeDisks(target).write(WS, file, blocks[i : i + 3])
    return synced


def test_a_sparse_image_moves_only_its_data_and_arrives_the_same(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    _image(source)
    file = t.list_files(source, WS, [])[0]
    assert file.data_bytes < 10 * BLOCK  # 80 MiB apparent, holes and zero blocks not counted
    target.mkdir()
    assert t.received(target, WS, file) == 0
    assert _send(source, target) == file.size
    t.finish(target, WS, [file])
    moved = target / "layers" / WS / "layer.img"
    assert moved.read_bytes() == (source / "layers" / WS / "layer.img").read_bytes()
    assert t.list_files(target, WS, [])[0] == file
    assert os.stat(moved).st_blocks * 512 < 20 * BLOCK  # still sparse
    assert not list(moved.parent.glob("*.moving*"))


def test_a_receive_resumes_after_a_crash_from_what_it_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    _image(source)
    file = t.list_files(source, WS, [])[0]
    monkeypatch.setattr(t, "SYNC_EVERY", 2 * BLOCK)
    _send(source, target, stop_after=5)  # the target died after 5 blocks
    resume = t.received(target, WS, file)
    assert 0 < resume < file.size
    _send(source, target, start=resume)
    t.finish(target, WS, [file])
    assert (target / "layers" / WS / "layer.img").read_bytes() == (source / "layers" / WS / "layer.img").read_bytes()


def test_a_copy_that_differs_is_not_put_in_place(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    _image(source)
    file = t.list_files(source, WS, [])[0]
    _send(source, target)
    partial = target / "layers" / WS / ("layer.img" + t.PARTIAL)
    with open(partial, "r+b") as f:
        f.seek(3 << 20)
        f.write(b"tampered")
    with pytest.raises(MoveRefused, match="arrived different"):
        t.finish(target, WS, [file])
    assert not (target / "layers" / WS / "layer.img").exists()
    assert not partial.exists()  # received again from nothing
    # A record for another version of the file is not resumed either.
    assert t.received(target, WS, replace(file, digest=bytes(32))) == 0


def test_a_file_in_place_is_never_overwritten(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    _image(source)
    _image(target)
    file = t.list_files(source, WS, [])[0]
    with pytest.raises(MoveRefused, match="already"):
        t.NodeDisks(target).write(WS, file, [(3 << 20, b"x" * 10)])


@pytest.mark.parametrize(
    ("workspace_id", "name"),
    [(WS, "../../etc/passwd"), (WS, "volume/../../x"), ("../ws", "layer"), (WS, "volume/"), (WS, "layers")],
)
def test_names_reach_only_the_workspaces_own_images(tmp_path: Path, workspace_id: str, name: str) -> None:
    with pytest.raises(MoveRefused):
        t.image_path(tmp_path, workspace_id, name)


def test_blocks_outside_the_file_are_refused(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    _image(source)
    target.mkdir()
    file = t.list_files(source, WS, [])[0]
    for offset, data in ((file.size, b"x"), (5, b"x"), (-BLOCK, b"x")):
        with pytest.raises(MoveRefused):
            t.NodeDisks(target).write(WS, file, [(offset, data)])
