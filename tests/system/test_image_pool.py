"""The pool of formatted images (runtime/process/image_pool.py): made between launches the
way the supervisor formats them, taken by storage.admit only once the disk check passed,
never made when a new image would not be admitted, and what other settings or a crash left
in the pool is deleted at start-up. Needs mkfs.ext4 (e2fsprogs); 1 GiB sparse images."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kibo_ctrl.runtime.process import sandbox, storage
from kibo_ctrl.runtime.process.image_pool import ImagePool

GIB = storage.GIB
OWNER = os.geteuid() + 100000 if os.geteuid() == 0 else os.geteuid()


def _superblock(image: Path) -> bytes:
    with open(image, "rb") as f:
        f.seek(1024)
        return f.read(1024)


def _is_fresh_ext4(image: Path, capacity: int) -> bool:
    sb = _superblock(image)
    magic = int.from_bytes(sb[0x38:0x3A], "little")
    return magic == 0xEF53 and storage.filesystem_bytes(str(image)) == capacity and storage.mount_count(str(image)) == 0


def _listing(image: Path, directory: str) -> dict[str, int]:
    """name -> uid of a directory's entries in an ext4 image (debugfs, read-only)."""
    done = subprocess.run(
        ["debugfs", "-R", f"ls -p {directory}", str(image)], capture_output=True, text=True, check=True
    )
    entries = {}
    for line in done.stdout.splitlines():
        fields = line.strip().strip("/").split("/")
        if len(fields) >= 5:
            entries[fields[4]] = int(fields[2])
    return entries


def _wait_ready(pool: ImagePool, kind: str, capacity: int, count: int) -> list[Path]:
    deadline = time.monotonic() + 60
    while len(ready := pool._ready(kind, capacity)) < count:
        assert time.monotonic() < deadline, f"{count} {kind} images were not made"
        time.sleep(0.05)
    return ready


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    assert shutil.which("mkfs.ext4") and shutil.which("debugfs"), "e2fsprogs is missing: apt-get install -y e2fsprogs"
    for sub in ("layers", "volumes", "runtime"):
        (tmp_path / sub).mkdir()
    yield tmp_path


def _pool(data_dir: Path, disk_ratio: float = 1000.0) -> ImagePool:
    return ImagePool(
        data_dir / "runtime" / "pool",
        data_dir,
        owner=OWNER,
        variant="usr",
        make_seed=lambda upper: sandbox.seed_layer(upper, host_usr=True),
        disk_ratio=disk_ratio,
    )


def _layer_entry(data_dir: Path, name: str) -> dict[str, Any]:
    layer = data_dir / "layers" / name
    seed = layer / "seed"
    (seed / "upper").mkdir(parents=True)
    (seed / "work").mkdir()
    sandbox.seed_layer(seed / "upper", host_usr=True)
    return storage.entry(layer, storage.LAYER_IMAGE, 1, seed)


def test_a_new_layer_is_taken_formatted_from_the_pool_once_it_was_asked_for(data_dir: Path) -> None:
    pool = _pool(data_dir)
    try:
        first = _layer_entry(data_dir, "ws-1")
        storage.admit(data_dir, [first], 1000.0, pool.take)
        # Nothing was ready: the supervisor formats this one (a sparse .new file), as before.
        assert Path(first["new"]).exists() and not Path(first["image"]).exists() and first["seed"]
        pool.refill_soon()
        ready = _wait_ready(pool, "layer", GIB, pool.depth)
        assert all(_is_fresh_ext4(image, GIB) for image in ready)
        second = _layer_entry(data_dir, "ws-2")
        storage.admit(data_dir, [second], 1000.0, pool.take)
        image = Path(second["image"])
        assert _is_fresh_ext4(image, GIB), "in place, formatted, never mounted"
        assert not Path(second["new"]).exists()
        assert second["seed"] == "" and not (data_dir / "layers" / "ws-2" / "seed").exists()
        # One of the ready images moved (the worker may be making the next one meanwhile).
        assert len(set(ready) - set(pool._ready("layer", GIB))) == 1
        # The skeleton of a layer, owned by the guests' root, as the supervisor formats it.
        listing = _listing(image, "/upper")
        assert {"bin", "etc", "proc", "tmp", "usr"} <= set(listing)
        assert all(owner == OWNER for owner in listing.values()), listing
        assert _listing(image, "/")[".."] == OWNER, "the filesystem's root: mkfs root_owner"
    finally:
        pool.close()


def test_no_image_is_made_where_a_new_one_would_not_be_admitted(data_dir: Path) -> None:
    # The disk offers a few bytes of declared storage (--disk-allocation-ratio 1e-9): no new
    # image fits. (Under its reserve of real free space, none would either: storage.refusal.)
    pool = _pool(data_dir, disk_ratio=1e-9)
    try:
        volume = data_dir / "volumes" / "v-1"
        volume.mkdir()
        entry = storage.entry(volume, storage.VOLUME_IMAGE, 1, None)
        with pytest.raises(storage.NoSpace):
            storage.admit(data_dir, [entry], 1e-9, pool.take)
        pool.wanted["volume"] = [GIB]
        pool.refill_soon()
        time.sleep(0.5)  # what the worker would have made by now, were there room
        assert pool._ready("volume", GIB) == []
        assert not list((data_dir / "runtime" / "pool").iterdir())
    finally:
        pool.close()


def test_what_other_settings_or_a_crash_left_in_the_pool_goes_at_start_up(data_dir: Path) -> None:
    directory = data_dir / "runtime" / "pool"
    directory.mkdir()
    ours = directory / f"volume-1g-{OWNER}-usr-aaaa.img"
    stale = [
        directory / f"volume-1g-{OWNER + 1}-usr-bbbb.img",  # made for other guest ids
        directory / f"layer-1g-{OWNER}-base-cccc.img",  # for a base image, not the host's /usr
        directory / f"layer-1g-{OWNER}-usr-dddd.tmp",  # half made
    ]
    for path in [ours, *stale]:
        path.write_bytes(b"")
    (directory / f"layer-1g-{OWNER}-usr-dddd.seed").mkdir()
    pool = _pool(data_dir)
    try:
        assert sorted(directory.iterdir()) == [ours]
    finally:
        pool.close()
