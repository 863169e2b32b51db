"""Formatted ext4 images made ahead of need: a new layer or volume is a rename, not a mkfs.

Formatting a new image (storage.format_image: mkfs.ext4 of a sparse file, the layer with
its skeleton) was ~20-35 ms of every first launch, on its critical path (bench/
process_runtime.py --breakdown). The pool keeps up to `depth` images of each recently
asked size and kind ready under <data dir>/runtime/pool/, formatted by a background
thread of the control plane after a launch (not during one), exactly as the supervisor
would have: the same mkfs options, owned by the guests' root, the layer seeded with the
same fresh skeleton (`make_seed`). No guest has ever seen a pooled image; it is fsynced
before it is offered; taking one is a rename into the layer's or volume's directory (`take`,
called by storage.admit once the disk check passed, so a pooled image is promised to a
guest only as a new sparse file would be; admit fsyncs both directories).

Pool files are named kind-<GiB>g-<owner>-<variant>-<n>.img: a pool made for other guest
ids or another base image is deleted at start-up (as are half-made ones). The pool's own
files are not guests' storage: they are not counted as promised, and a size is refilled
only while a new image of it would be admitted."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import storage

log = logging.getLogger(__name__)

# Images kept ready per (kind, size), and how many sizes per kind are remembered.
DEPTH = 2
SIZES_PER_KIND = 2
KINDS = {storage.LAYER_IMAGE: "layer", storage.VOLUME_IMAGE: "volume"}


class ImagePool:
    def __init__(
        self,
        directory: Path,
        data_dir: Path,
        owner: int,
        variant: str,
        make_seed: Callable[[Path], None],
        disk_ratio: float = 10.0,
        depth: int = DEPTH,
    ) -> None:
        self.dir = directory
        self.data_dir = data_dir
        self.owner = owner
        self.variant = variant  # what the layer skeleton depends on (host /usr or a base image)
        self.make_seed = make_seed
        self.disk_ratio = disk_ratio
        self.depth = depth
        # kind -> the sizes (bytes) asked for lately, most recent last.
        self.wanted: dict[str, list[int]] = {}
        self._wake = threading.Condition()
        self._pending = False
        self._closed = False
        # Launches in progress: the worker formats only while there are none, since an
        # image's writes would join the journal commit a launch's fsyncs wait for (ext4).
        self._launching = 0
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._forget_others()
        self._worker = threading.Thread(target=self._run, name="kibo image pool", daemon=True)
        self._worker.start()

    def _prefix(self, kind: str, capacity: int) -> str:
        return f"{kind}-{capacity // storage.GIB}g-{self.owner}-{self.variant}-"

    def _ready(self, kind: str, capacity: int) -> list[Path]:
        return sorted(self.dir.glob(self._prefix(kind, capacity) + "*.img"))

    def _forget_others(self) -> None:
        """At start-up: half-made images and seeds, and images made for other settings, go."""
        for path in self.dir.iterdir():
            kind = path.name.split("-", 1)[0]
            ours = (
                path.name.endswith(".img") and f"-{self.owner}-{self.variant}-" in path.name and kind in KINDS.values()
            )
            if not ours:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        path.unlink()

    # -- the control plane's side (storage.admit) ----------------------------------------

    def take(self, entry: dict[str, Any]) -> Path | None:
        """Put a ready image of the entry's kind and capacity at its place (returns the pool's
        directory, which the caller fsyncs with the image's), or leave the entry to be
        formatted by the supervisor (None). Remembers the size either way."""
        kind = KINDS.get(os.path.basename(entry["image"]))
        if kind is None:
            return None
        capacity = int(entry["capacity"])
        with self._wake:
            sizes = self.wanted.setdefault(kind, [])
            if capacity in sizes:
                sizes.remove(capacity)
            sizes.append(capacity)
            del sizes[:-SIZES_PER_KIND]
        for ready in self._ready(kind, capacity):
            try:
                os.replace(ready, entry["image"])
            except FileNotFoundError:
                continue  # taken meanwhile by another launch
            if entry.get("seed"):
                # The pooled layer has the skeleton already: no seed is made (provision.py), and
                # one left by an earlier launch that did not get to format goes.
                shutil.rmtree(entry["seed"], ignore_errors=True)
                entry["seed"] = ""
            return self.dir
        return None

    def refill_soon(self) -> None:
        """Make what is missing, in the background (called after a launch, not during one)."""
        with self._wake:
            self._pending = True
            self._wake.notify()

    def launching(self, started: bool) -> None:
        """A launch began (True) or ended (False): the worker waits while any runs."""
        with self._wake:
            self._launching += 1 if started else -1
            self._wake.notify()

    def _idle(self) -> bool:
        """Wait until no launch runs (False: closed)."""
        with self._wake:
            while self._launching > 0 and not self._closed:
                self._wake.wait()
            return not self._closed

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._worker.join(storage.MKFS_TIMEOUT_S + 5)

    # -- the worker -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                self._pending = False
                todo = [(kind, size) for kind, sizes in self.wanted.items() for size in sizes]
            for kind, capacity in todo:
                while self._idle() and len(self._ready(kind, capacity)) < self.depth and self._room(capacity):
                    try:
                        self._make(kind, capacity)
                    except OSError as error:
                        log.warning("image pool: making a %s image failed: %s", kind, error)
                        break

    def _room(self, capacity: int) -> bool:
        """Whether a new image of `capacity` would be admitted now (storage.admit's rule)."""
        return not storage.refusal(self.data_dir, capacity, self.disk_ratio)

    def _make(self, kind: str, capacity: int) -> None:
        name = self._prefix(kind, capacity) + os.urandom(6).hex()
        tmp, seed = self.dir / f"{name}.tmp", self.dir / f"{name}.seed"
        try:
            with open(tmp, "wb") as f:
                f.truncate(capacity)
            if kind == "layer":
                (seed / "upper").mkdir(parents=True)
                (seed / "work").mkdir()
                self.make_seed(seed / "upper")
            entry = {
                "new": str(tmp),
                "image": str(self.dir / f"{name}.img"),
                "seed": str(seed) if kind == "layer" else "",
            }
            storage.format_image(entry, self.owner)  # fsyncs, then renames to the .img name
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            shutil.rmtree(seed, ignore_errors=True)
