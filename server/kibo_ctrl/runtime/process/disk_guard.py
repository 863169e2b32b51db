"""The node's brake on its guests' writes: under the disk reserve, no guest takes another block.

Why: layers and volumes are sparse images (storage.py). A guest writing into its own image
allocates the host's blocks as it goes, up to its declared capacity; the capacities together
may be ten times the disk (--disk-allocation-ratio). Refusing new storage under the reserve
(`storage.refusal`) does not stop guests that already have an image from writing on until
the filesystem that also holds the store is full, and a full host filesystem turns into
write errors (EIO) in every guest, not ENOSPC in one.

How: ext4's `reserved_clusters` (/sys/fs/ext4/<loopN>/, writable by root at any time):
clusters no ordinary allocation may take, even by a root that is not the host's. While the
node's real free space, less what guests have written into their page caches and not yet
handed to the host (`delayed_allocation_blocks` of each image), is under the reserve
(storage.reserve_bytes, the figure DiskPressure is told by), every mounted layer and volume
image of this data dir gets the largest value the kernel takes, its cluster count - 1: a new
block in that guest is ENOSPC at write(2), while its files can be read, overwritten in place,
truncated and deleted. Images mounted while the pressure lasts are clamped at the next check.
Once that figure is back above the reserve plus `LIFT_FRACTION` of it (hysteresis: a node
hovering at its reserve does not flap), each image gets back the value it had. The values are
kept in DATA_DIR/runtime/disk_guard.json too, so a node restarted under or after the pressure
restores them (an image unmounted meanwhile has its fresh default already); an image found
with the mark clusters - 1 and no record (one that could not be written) gets the kernel's
default back.

Cost (measured here): a check is a statvfs and a read of /proc/meminfo, ~25 us, every
`POLL_S`; only when free space less every dirty page of the host is under the reserve are the
mounted images looked at (/sys/fs/ext4, then each image's loop device and delayed allocations:
~40 us an image, 2 ms for 50), at most every `SCAN_S`, and every `ENGAGED_SCAN_S` while clamped
(for images mounted since; free space back over the lift is seen at the next check).

What it does not bound (SECURITY.md, "Storage"): blocks ext4 may still take from its own
reserve (extent splits, converting unwritten extents), so space a guest `fallocate`d before
the pressure can still be written (at most its image's capacity), the image's journal and
inode tables (holes until first used), and what a guest writes within one check. The reserve
is what absorbs them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import storage

log = logging.getLogger(__name__)

POLL_S = 0.05
SCAN_S = 0.25
ENGAGED_SCAN_S = 1.0
LIFT_FRACTION = 0.25
STATE_FILE = "disk_guard.json"
SYS_BLOCK = Path("/sys/block")
SYS_EXT4 = Path("/sys/fs/ext4")
# The kernel's own reserve at mount (ext4_calculate_resv_clusters): 2 % of the clusters, at
# most 4,096. What an image gets back when the value it had is not known.
KERNEL_RESERVE_FRACTION = 50
KERNEL_RESERVE_MAX = 4096


@dataclass(frozen=True)
class Clamp:
    """One clamped image: which, the value it had, and the value written."""

    image: str
    original: int
    value: int


def geometry(image: str) -> tuple[int, int]:
    """(clusters, bytes per block) of the ext4 filesystem in an image, from its superblock."""
    with open(image, "rb") as f:
        f.seek(1024)
        sb = f.read(1024)
    blocks = int.from_bytes(sb[4:8], "little")
    if int.from_bytes(sb[0x60:0x64], "little") & 0x80:  # INCOMPAT_64BIT
        blocks |= int.from_bytes(sb[0x150:0x154], "little") << 32
    log_block = int.from_bytes(sb[24:28], "little")
    cluster_bits = 0
    if int.from_bytes(sb[0x64:0x68], "little") & 0x200:  # RO_COMPAT_BIGALLOC
        cluster_bits = int.from_bytes(sb[28:32], "little") - log_block
    return blocks >> cluster_bits, 1024 << log_block


def kernel_default(clusters: int) -> int:
    return min(clusters // KERNEL_RESERVE_FRACTION, KERNEL_RESERVE_MAX)


def mounted_images(data_dir: Path) -> dict[str, str]:
    """The loop devices (name -> image) backed by this data dir's layer and volume images and
    mounted, in whatever mount namespace: its guests' writable disks. Only mounted ext4
    filesystems are looked at (/sys/fs/ext4), not every loop device."""
    prefixes = (str(data_dir / "layers") + "/", str(data_dir / "volumes") + "/")
    names = (storage.LAYER_IMAGE, storage.VOLUME_IMAGE)
    found: dict[str, str] = {}
    for name in os.listdir(SYS_EXT4):
        if not name.startswith("loop"):
            continue
        try:
            with open(SYS_BLOCK / name / "loop" / "backing_file") as f:
                backing = f.read().strip().removesuffix(" (deleted)")
        except OSError:
            continue  # detached meanwhile
        if backing.startswith(prefixes) and os.path.basename(backing) in names:
            found[name] = backing
    return found


def _read_int(path: Path) -> int:
    with open(path) as f:
        return int(f.read().strip())


def _write_int(path: Path, value: int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def dirty_bytes() -> int:
    """Dirty and under-writeback page cache, host-wide (/proc/meminfo): an upper bound on what
    guests wrote that the host's filesystem has not counted yet."""
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(("Dirty:", "Writeback:")):
                total += int(line.split()[1]) * 1024
    return total


class DiskGuard:
    """Clamps this data dir's mounted images under disk pressure and restores them after."""

    def __init__(self, data_dir: Path, poll_s: float = POLL_S) -> None:
        self.data_dir = data_dir
        self.poll_s = poll_s
        self.state_path = data_dir / "runtime" / STATE_FILE
        self._lock = threading.Lock()
        self._clamps: dict[str, Clamp] = self._load()
        # Engaged: under pressure (clamping) until free space is over the reserve plus the lift.
        self.engaged = bool(self._clamps)
        # The first check also looks for images this guard clamped without a record (a restart
        # whose record could not be written): they carry its mark, clusters - 1.
        self._adopted = False
        self._next_scan = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""

    # -- what others read --------------------------------------------------------------

    def clamped(self) -> int:
        """How many images are clamped now (the metric kibo_guest_storage_clamped)."""
        return len(self._clamps)

    # -- the loop ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kibo disk guard", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop checking; what is clamped stays clamped (and recorded) until a check lifts it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
                self._last_error = ""
            except OSError as error:
                if str(error) != self._last_error:  # once per distinct failure, not every tick
                    log.warning("disk guard of %s: %s", self.data_dir, error)
                    self._last_error = str(error)
            self._stop.wait(self.poll_s)

    def check(self) -> None:
        """One look: clamp every mounted image under pressure, restore them all after it.
        Every tick reads statvfs and /proc/meminfo (~50 us); the images are looked at (a few
        sysfs reads each) only when the free space less every dirty page is under the reserve,
        at most every `SCAN_S` (`ENGAGED_SCAN_S` once clamped: for images mounted since)."""
        fs = os.statvfs(self.data_dir)
        free = fs.f_bavail * fs.f_frsize
        reserve = storage.reserve_bytes(self.data_dir)
        lift = reserve * (1 + LIFT_FRACTION)
        now = time.monotonic()
        if self._adopted:
            pending = free - dirty_bytes()  # at most what the host's disk will have once written back
            if not self.engaged and pending >= reserve:
                return  # nothing in flight could take it under the reserve
            if not (self.engaged and pending >= lift) and now < self._next_scan:
                return
        self._next_scan = now + (ENGAGED_SCAN_S if self.engaged else SCAN_S)
        images = mounted_images(self.data_dir)
        if not self._adopted:
            self._adopt(images)
        in_flight = self._in_flight(images)
        available = free - in_flight
        with self._lock:
            if self.engaged and available >= lift:
                self._lift(images, available, reserve)
            elif self.engaged or available < reserve:
                if not self.engaged:
                    log.warning(
                        "DISK PRESSURE on %s: %.2f GiB free (%.2f GiB of it still in guests' page caches) "
                        "under the %.2f GiB reserve: guests get ENOSPC for new blocks in their layers and "
                        "volumes until %.2f GiB are free",
                        self.data_dir,
                        free / storage.GIB,
                        in_flight / storage.GIB,
                        reserve / storage.GIB,
                        lift / storage.GIB,
                    )
                    self._next_scan = now + ENGAGED_SCAN_S
                self.engaged = True
                self._clamp(images)

    def _adopt(self, images: dict[str, str]) -> None:
        with self._lock:
            for loop, image in images.items():
                if loop in self._clamps:
                    continue
                with contextlib.suppress(OSError, ValueError):
                    clusters = geometry(image)[0]
                    if _read_int(SYS_EXT4 / loop / "reserved_clusters") == clusters - 1:
                        self._clamps[loop] = Clamp(image, kernel_default(clusters), clusters - 1)
            self.engaged = bool(self._clamps)
            self._adopted = True

    def _in_flight(self, images: dict[str, str]) -> int:
        """Bytes guests wrote into their images that have no block on the host yet (ext4's
        delayed allocations in each image: they will, when written back)."""
        total = 0
        for loop, image in images.items():
            with contextlib.suppress(OSError, ValueError):
                blocks = _read_int(SYS_EXT4 / loop / "delayed_allocation_blocks")
                total += blocks * geometry(image)[1]
        return total

    def _clamp(self, images: dict[str, str]) -> None:
        changed = False
        for loop in [loop for loop in self._clamps if loop not in images]:
            del self._clamps[loop]  # unmounted: nothing to restore (a new mount has its default)
            changed = True
        for loop, image in images.items():
            sysfs = SYS_EXT4 / loop / "reserved_clusters"
            try:
                clusters = geometry(image)[0]
                current = _read_int(sysfs)
                known = self._clamps.get(loop)
                if known is not None and known.image == image and current == known.value:
                    continue
                value = clusters - 1  # the most the kernel takes: no ordinary allocation fits
                original = current
                if current == value:  # clamped before, by this guard: its record says what it was
                    same = known is not None and known.image == image
                    original = known.original if known is not None and same else kernel_default(clusters)
                _write_int(sysfs, value)
            except (OSError, ValueError) as error:
                # Unmounted meanwhile (no sysfs entry), or another filesystem took the loop
                # device (EINVAL): the next check sees the devices as they are then.
                log.debug("disk guard: %s (%s) not clamped: %s", image, loop, error)
                continue
            self._clamps[loop] = Clamp(image, original, value)
            changed = True
            log.info("disk guard: %s clamped (no new blocks: ENOSPC in its guest)", image)
        if changed:
            self._save()

    def _lift(self, images: dict[str, str], available: int, reserve: int) -> None:
        restored = 0
        for loop, known in list(self._clamps.items()):
            image = images.get(loop)
            sysfs = SYS_EXT4 / loop / "reserved_clusters"
            try:
                if image is not None and _read_int(sysfs) == known.value:
                    original = known.original if image == known.image else kernel_default(geometry(image)[0])
                    _write_int(sysfs, original)
                    restored += 1
            except (OSError, ValueError) as error:
                log.debug("disk guard: %s (%s) not restored: %s", known.image, loop, error)
            del self._clamps[loop]
        self.engaged = False
        self._save()
        log.warning(
            "disk pressure on %s over: %.2f GiB free (reserve %.2f GiB); %d guest images may take new blocks again",
            self.data_dir,
            available / storage.GIB,
            reserve / storage.GIB,
            restored,
        )

    # -- the record a restarted node restores from ---------------------------------------

    def _load(self) -> dict[str, Clamp]:
        try:
            raw = json.loads(self.state_path.read_text())
            return {str(loop): Clamp(str(c["image"]), int(c["original"]), int(c["value"])) for loop, c in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            log.warning("disk guard: %s unreadable (%s): starting without it", self.state_path, error)
            return {}

    def _save(self) -> None:
        """Best effort: a record that cannot be written (the disk is full, after all) is made
        up for by the next start's look for the mark (`_adopt`)."""
        try:
            self._write_record()
        except OSError as error:
            log.warning("disk guard: %s not written: %s", self.state_path, error)

    def _write_record(self) -> None:
        if not self._clamps:
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()
            return
        body = {loop: {"image": c.image, "original": c.original, "value": c.value} for loop, c in self._clamps.items()}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.state_path)
