"""Size-capped storage of the process runtime: one ext4 image per writable layer and volume.

Standard library only: the supervisor (run with `python -I -S`) loads this file too.

Why images: a guest writing into a plain directory on the data dir's filesystem can fill
it (the store lives there). A loop-mounted ext4 image caps what the guest can write at
the image's size: a full image gives ENOSPC inside the guest, and the host filesystem
never sees more than the image's size. (Measured here: mkfs of a sparse 10 GiB image
~10 ms, loop mount + umount ~17 ms; project quotas would need the data dir on a
filesystem mounted with prjquota, which a user's machine rarely has.)

Layout, under the data directory:
    layers/<workspace>/layer.img     the writable layer's filesystem: upper/ (the guest's
                                     root, or the overlay's upper dir) and work/
    layers/<workspace>/mnt/          its mount point (mounted only inside the supervisor's
                                     private mount namespace: the host sees an empty dir)
    volumes/<volume>/volume.img      a volume's filesystem, mounted at volumes/<volume>/mnt
    <dir>/<name>.img.new             a sparse file made by the control plane (the space
                                     is counted from then on), formatted by the supervisor
                                     on first start (it knows the guest's uid: root_owner)
    layers/<workspace>/seed/         the skeleton the new layer is formatted with (mkfs -d),
                                     made by the control plane in a fresh directory

Who does what: the control plane (provision.py) decides the layout, admits new images
against free space (`admit`), and destroys them (`destroy`); the supervisor formats and
mounts them (`prepare`) in its own mount namespace before the guest starts, so every
mount vanishes with it (mount -o loop sets the loop device's autoclear flag).

Images are sparse (thin-provisioned): a declared capacity is a limit inside the guest,
not space taken from the host. What admission watches is real usage (issue 26: three
default workspaces, which write a few MiB, used to exhaust an 80 GiB disk they barely
touched, because every capacity was counted as if it were written):

- real free space: below the reserve (`reserve_bytes`: max(1 GiB, 2 % of the filesystem),
  room for the store, its logs and the guests' metadata) the node makes no new image, and
  says so to the control plane (`disk_status`: DiskPressure; the scheduler places nothing
  there that needs new storage);
- what is promised: the declared capacities of all images together may be at most the
  filesystem's size times `disk_ratio` (--disk-allocation-ratio, default 10), so a node
  does not take thousands of workspaces whose modest writes together would fill it.

A guest that fills its own image gets ENOSPC there and nowhere else (the image's size is
its filesystem's). Guests that all keep writing into the images they have are held at the
reserve as well: under it, no mounted image takes another block (disk_guard.py: ENOSPC in
the guest, lifted once free space is back). A ratio below 1 (say 0.9) keeps the declared
capacities within the disk whatever guests do, the rest left for the store. (fallocate would
bound it too, but take every declared capacity from the disk at once, 20 GiB per default
workspace.)

Directories from before images (layers/<ws>/upper/, a volume directory with files and no
image) keep working as they are, without a size limit (`legacy_*`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GIB = 1 << 30
LAYER_IMAGE = "layer.img"
VOLUME_IMAGE = "volume.img"
NEW_SUFFIX = ".new"
# What stays free on the data dir's filesystem for the store and logs, at least.
RESERVE_MIN_BYTES = 1 * GIB
RESERVE_FRACTION = 0.02
# ext4 options: no blocks reserved for root (the guest's uid 0 is not the host's), no
# discard (pointless on a sparse file), inode tables and journal left unzeroed (they are
# holes of a new sparse file, which read as zeros).
MKFS_EXTENDED = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
# noinit_itable: do not start the kernel's lazy zeroing of inode tables, which would
# write ~1.5 % of the capacity into the sparse file for nothing.
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
MKFS_TIMEOUT_S = 60.0
# How long a release waits for a gone VMM's images to be unmounted (their loop devices freed).
DETACH_TIMEOUT_S = 10.0

_admission = threading.Lock()


class NoSpace(OSError):
    """No new image now: the data dir's real free space is under its reserve, or the declared
    capacities would pass the filesystem's size times the disk allocation ratio."""


def usable(isolation: str) -> bool:
    """Whether layers and volumes can be images here: root, mkfs.ext4, mount and loop
    devices, and a sandbox (unisolated guests see the host's files: a cap would mean nothing)."""
    return (
        isolation != "none"
        and os.geteuid() == 0
        and shutil.which("mkfs.ext4") is not None
        and shutil.which("mount") is not None
        and os.path.exists("/dev/loop-control")
    )


# -- layout ------------------------------------------------------------------------------


def legacy_layer(layer_dir: Path) -> bool:
    """A directory layer from before images: kept, unlimited."""
    return (layer_dir / "upper").is_dir() and not (layer_dir / LAYER_IMAGE).exists()


def legacy_volume(volume_dir: Path) -> bool:
    """A volume directory with files and no image, from before images: kept, unlimited."""
    if not volume_dir.is_dir() or (volume_dir / VOLUME_IMAGE).exists():
        return False
    ours = {"mnt", VOLUME_IMAGE + NEW_SUFFIX}
    return any(entry.name not in ours for entry in volume_dir.iterdir())


def entry(directory: Path, name: str, capacity_gib: int, seed: Path | None) -> dict[str, Any]:
    """What the supervisor needs to format (if new) and mount one image (kept in spec.json)."""
    return {
        "image": str(directory / name),
        "new": str(directory / (name + NEW_SUFFIX)),
        "mount": str(directory / "mnt"),
        "capacity": capacity_gib * GIB,
        "seed": str(seed) if seed is not None else "",
    }


# -- admission (control plane) -----------------------------------------------------------


def _images(data_dir: Path) -> list[Path]:
    found = []
    for kind, name in (("layers", LAYER_IMAGE), ("volumes", VOLUME_IMAGE)):
        found += list((data_dir / kind).glob(f"*/{name}"))
        found += list((data_dir / kind).glob(f"*/{name}{NEW_SUFFIX}"))
    return found


# promised_bytes per data directory: (when it was counted, bytes), kept COMMITTED_MAX_AGE_S.
# Counting stats every image (~10 ms per create at 1,000 workspaces); between counts an
# admission adds what it promised (so the figure is never lower than a fresh count), and a
# deletion forgets it, so a create right after one sees the room it made.
_committed: dict[Path, tuple[float, int]] = {}
COMMITTED_MAX_AGE_S = 1.0


def promised_bytes(data_dir: Path) -> int:
    """The declared capacities of the images on the data dir (their files' sizes)."""
    known = _committed.get(data_dir)
    now = time.monotonic()
    if known is not None and now - known[0] < COMMITTED_MAX_AGE_S:
        return known[1]
    total = 0
    for image in _images(data_dir):
        with contextlib.suppress(FileNotFoundError):
            total += image.stat().st_size
    _committed[data_dir] = (now, total)
    return total


def reserve_bytes(data_dir: Path) -> int:
    fs = os.statvfs(data_dir)
    return max(RESERVE_MIN_BYTES, int(fs.f_blocks * fs.f_frsize * RESERVE_FRACTION))


def disk_bytes(data_dir: Path) -> int:
    """The size of the data dir's filesystem."""
    fs = os.statvfs(data_dir)
    return fs.f_blocks * fs.f_frsize


def offered_bytes(data_dir: Path, disk_ratio: float) -> int:
    """The declared capacity the node's images may add up to: the filesystem's size times
    the disk allocation ratio (0: not bounded)."""
    return int(disk_bytes(data_dir) * disk_ratio) if disk_ratio > 0 else 0


def disk_status(data_dir: Path) -> tuple[int, int, int, bool]:
    """The data dir's disk now: (real free bytes, reserve, promised, under its reserve)."""
    fs = os.statvfs(data_dir)
    free = fs.f_bavail * fs.f_frsize
    reserve = reserve_bytes(data_dir)
    return free, reserve, promised_bytes(data_dir), free < reserve


def refusal(data_dir: Path, need: int, disk_ratio: float) -> str:
    """Why `need` bytes of new declared capacity cannot be admitted now ("": they can)."""
    free, reserve, promised, pressure = disk_status(data_dir)
    if pressure:
        return (
            f"not enough disk for new storage: {free / GIB:.1f} GiB free, under the "
            f"{reserve / GIB:.1f} GiB this node keeps in reserve"
        )
    offered = offered_bytes(data_dir, disk_ratio)
    if offered and promised + need > offered:
        return (
            f"not enough disk for {need / GIB:.0f} GiB of new storage: {promised / GIB:.0f} GiB promised to "
            f"existing layers and volumes, of the {offered / GIB:.0f} GiB this node offers "
            f"({disk_bytes(data_dir) / GIB:.0f} GiB disk x --disk-allocation-ratio {disk_ratio:g})"
        )
    return ""


def admit(
    data_dir: Path,
    wanted: list[dict[str, Any]],
    disk_ratio: float = 10.0,
    take: Callable[[dict[str, Any]], Path | None] | None = None,
) -> None:
    """Make the sparse files of the `wanted` images that do not exist yet, if the node may
    take new storage now (`refusal`: its real free space is above the reserve, and their
    capacities fit in what its disk offers at `disk_ratio`); else NoSpace, with nothing made.
    `take` (image_pool.py) may put an already formatted image in place of a sparse file
    (it returns the directory it took it from, fsynced here with the others)."""
    with _admission:
        new = [e for e in wanted if not os.path.exists(e["image"]) and not os.path.exists(e["new"])]
        # A layer resized up while stopped: its file grows here, its filesystem at the next mount.
        grown = [(e, _size(e["image"])) for e in wanted if e not in new and 0 < _size(e["image"]) < int(e["capacity"])]
        if not new and not grown:
            return
        need = sum(int(e["capacity"]) for e in new) + sum(int(e["capacity"]) - size for e, size in grown)
        why = refusal(data_dir, need, disk_ratio)
        if why:
            raise NoSpace(why)
        # All files first, then all fsyncs: the first fsync commits the journal with every
        # change before it, so the later ones are cheap (one commit per phase, not per image).
        made: list[tuple[str, str]] = []
        dirs: set[Path] = set()
        for e in new:
            source = take(e) if take is not None else None
            if source is not None:
                dirs.update((source, Path(e["image"]).parent))
                continue
            tmp = e["new"] + ".tmp"
            with open(tmp, "wb") as f:
                f.truncate(int(e["capacity"]))
            made.append((tmp, e["new"]))
        for tmp, _ in made:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)  # its size, before its name appears
            finally:
                os.close(fd)
        for tmp, final in made:
            os.replace(tmp, final)
            dirs.add(Path(final).parent)
        for directory in sorted(dirs):
            _fsync_dir(directory)
        for e, _ in grown:
            os.truncate(e["image"], int(e["capacity"]))
        when, counted = _committed.get(data_dir, (0.0, 0))
        _committed[data_dir] = (when, counted + need)  # what was just promised, until the next count


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


# -- format and mount (supervisor) -----------------------------------------------------


def _chown_tree(root: Path, owner: int) -> None:
    for path, dirs, files in os.walk(root):
        os.lchown(path, owner, owner)
        for name in dirs + files:
            os.lchown(os.path.join(path, name), owner, owner)


def format_image(e: dict[str, Any], owner: int) -> None:
    """mkfs the control plane's sparse file (with the seed tree, owned by the guest's root)
    and give it its final name. Safe to repeat after a crash: `new` stays until renamed."""
    seed = Path(e["seed"]) if e["seed"] else None
    argv = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={owner}:{owner},{MKFS_EXTENDED}"]
    if seed is not None and seed.is_dir():
        # The seed is the control plane's fresh directory: no guest has touched it.
        _chown_tree(seed, owner)
        argv += ["-d", str(seed)]
    done = subprocess.run([*argv, e["new"]], capture_output=True, text=True, timeout=MKFS_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise OSError(f"mkfs.ext4 {e['new']} failed: {done.stderr.strip() or done.returncode}")
    fd = os.open(e["new"], os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(e["new"], e["image"])
    _fsync_dir(Path(e["image"]).parent)
    if seed is not None:
        shutil.rmtree(seed, ignore_errors=True)


def prepare(entries: list[dict[str, Any]], owner: int, marks: list[tuple[str, float]] | None = None) -> None:
    """Format what is new and mount every image at its mount point, the images side by side
    (mkfs and mount are mostly waiting). Call only in a private mount namespace: the mounts
    then go when the namespace goes. `marks`: gets (step, wall-clock end) of each mkfs and mount."""
    errors: list[BaseException] = []

    def one(e: dict[str, Any]) -> None:
        try:
            _prepare_one(e, owner, marks)
        except BaseException as error:  # re-raised below, in the caller's thread
            errors.append(error)

    workers = [threading.Thread(target=one, args=(e,)) for e in entries]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def _prepare_one(e: dict[str, Any], owner: int, marks: list[tuple[str, float]] | None = None) -> None:
    name = os.path.basename(e["image"])
    started = time.time()
    fresh = not os.path.exists(e["image"])
    if fresh:
        if not os.path.exists(e["new"]):
            raise OSError(f"the image {e['image']} is gone")
        format_image(e, owner)
    if marks is not None:
        marks.append((f"{name}:start", started))
        marks.append((f"{name}:mkfs", time.time()))
    _grow_to_file(e)
    # Formatted here or ahead (image_pool.py): never mounted yet (mkfs leaves the count 0).
    first_mount = mount_count(e["image"]) == 0
    os.makedirs(e["mount"], exist_ok=True)
    mount_image(e["image"], e["mount"])
    if marks is not None:
        marks.append((f"{name}:mount", time.time()))
    if first_mount and os.path.basename(e["image"]) == VOLUME_IMAGE:
        # A volume shows the guest an empty /data (e2fsck makes lost+found again if needed).
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(e["mount"], "lost+found"))


# -- loop mounts ----------------------------------------------------------------------------

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID_MOUNT, MS_NODEV_MOUNT = 2, 4  # what MOUNT_OPTIONS' nosuid,nodev are as flags
EXT4_DATA = b"noinit_itable"  # the rest of MOUNT_OPTIONS, for the filesystem


class _LoopInfo64(ctypes.Structure):
    _fields_ = [
        ("lo_device", ctypes.c_uint64),
        ("lo_inode", ctypes.c_uint64),
        ("lo_rdevice", ctypes.c_uint64),
        ("lo_offset", ctypes.c_uint64),
        ("lo_sizelimit", ctypes.c_uint64),
        ("lo_number", ctypes.c_uint32),
        ("lo_encrypt_type", ctypes.c_uint32),
        ("lo_encrypt_key_size", ctypes.c_uint32),
        ("lo_flags", ctypes.c_uint32),
        ("lo_file_name", ctypes.c_char * 64),
        ("lo_crypt_name", ctypes.c_char * 64),
        ("lo_encrypt_key", ctypes.c_char * 32),
        ("lo_init", ctypes.c_uint64 * 2),
    ]


class _LoopConfig(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("info", _LoopInfo64),
        ("reserved", ctypes.c_uint64 * 8),
    ]


def mount_image(image: str, target: str) -> None:
    """`mount -t ext4 -o MOUNT_OPTIONS image target`, done with the system calls themselves
    (a free loop device set up with LOOP_CONFIGURE and autoclear, then mount(2)): the same
    mount, without starting mount(8) (a few ms of each launch). Where that is not possible
    (no LOOP_CONFIGURE before Linux 5.8, no /dev/loopN node), mount(8) does it."""
    try:
        device = _attach_loop(image)
    except OSError:
        _mount_with_mount8(image, target)
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flags = MS_NOSUID_MOUNT | MS_NODEV_MOUNT
        if libc.mount(f"/dev/loop{device[1]}".encode(), target.encode(), b"ext4", flags, EXT4_DATA) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mounting {image} failed: {os.strerror(err)}")
    finally:
        os.close(device[0])  # autoclear: the device goes with the mount (or now, if it failed)


def _attach_loop(image: str) -> tuple[int, int]:
    """A free loop device backed by `image` with autoclear: (its open fd, its number)."""
    import fcntl

    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(16):  # another process may take the free device first: EBUSY, again
            number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
            fd = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
            config = _LoopConfig(fd=backing)
            config.info.lo_flags = LO_FLAGS_AUTOCLEAR
            config.info.lo_file_name = os.fsencode(image)[:63]
            try:
                fcntl.ioctl(fd, LOOP_CONFIGURE, bytes(config))
            except OSError as error:
                os.close(fd)
                if error.errno == errno.EBUSY:
                    continue
                raise
            return fd, number
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(backing)
        os.close(control)


def _mount_with_mount8(image: str, target: str) -> None:
    done = subprocess.run(
        ["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, image, target],
        capture_output=True,
        text=True,
        timeout=MKFS_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(f"mounting {image} failed: {done.stderr.strip() or done.returncode}")


def mount_count(image: str) -> int:
    """How often the ext4 filesystem in an image was mounted (s_mnt_count; 0: never)."""
    with open(image, "rb") as f:
        f.seek(1024 + 0x34)
        return int.from_bytes(f.read(2), "little")


def filesystem_bytes(image: str) -> int:
    """The size of the ext4 filesystem in an image, from its superblock."""
    with open(image, "rb") as f:
        f.seek(1024)
        sb = f.read(1024)
    blocks = int.from_bytes(sb[4:8], "little")
    if int.from_bytes(sb[0x60:0x64], "little") & 0x80:  # INCOMPAT_64BIT: the high half counts
        blocks |= int.from_bytes(sb[0x150:0x154], "little") << 32
    return blocks * (1024 << int.from_bytes(sb[24:28], "little"))


def _grow_to_file(e: dict[str, Any]) -> None:
    """If the image file was made bigger (a resized layer), grow its filesystem to match, before
    it is mounted (online growth is refused on this kind of machine). A file smaller than its
    capacity stays as it is: shrinking is not done."""
    if os.stat(e["image"]).st_size <= filesystem_bytes(e["image"]):
        return
    for argv in (["e2fsck", "-f", "-p", e["image"]], ["resize2fs", e["image"]]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=MKFS_TIMEOUT_S, check=False)
        if done.returncode not in (0, 1):  # e2fsck: 1 = errors corrected
            raise OSError(f"growing {e['image']}: {argv[0]} failed: {done.stderr.strip() or done.returncode}")


# What the guest's /run/kibo (the ready file, the agent's PID) may hold: it is writable by
# the guest, so on the host's disk it would be one more unbounded place to write.
RUN_TMPFS_OPTIONS = "size=1m,nr_inodes=64,mode=0755"
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8


def mount_run_dir(run_dir: str, owner: int) -> None:
    """A tiny tmpfs over the instance's run directory (in the private mount namespace)."""
    os.makedirs(run_dir, exist_ok=True)
    options = f"{RUN_TMPFS_OPTIONS},uid={owner},gid={owner}"
    libc = ctypes.CDLL(None, use_errno=True)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"kibo-run", run_dir.encode(), b"tmpfs", flags, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting a tmpfs on {run_dir}: {os.strerror(err)}")


# -- sync, attachment, destruction -----------------------------------------------------


def image_files(entries: list[dict[str, Any]]) -> list[str]:
    return [e["image"] for e in entries]


def attached(paths: list[str]) -> list[str]:
    """Which of these image files a loop device still uses (its filesystem is mounted in
    some namespace, or being torn down)."""
    wanted = {os.path.abspath(p) for p in paths}
    found: list[str] = []
    if not wanted:
        return found
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            name = backing.read_text().strip().removesuffix(" (deleted)")
            if name in wanted:
                found.append(name)
    return found


def wait_detached(paths: list[str], seconds: float) -> list[str]:
    """Wait until no loop device uses these images (the last mount went and the loop
    device's autoclear freed it); returns those still attached after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        still = attached(paths)
        if not still or time.monotonic() >= deadline:
            return still
        time.sleep(0.02)


def fsync_files(paths: list[str]) -> str:
    """fsync image files (what a gone supervisor's unmount wrote to them); "" or what failed."""
    errors = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except OSError as error:
            errors.append(f"{path}: {error.strerror}")
            continue
        try:
            os.fsync(fd)
        except OSError as error:
            errors.append(f"{path}: {error.strerror}")
        finally:
            os.close(fd)
    return "; ".join(errors)


def images_in(directory: Path) -> list[str]:
    return [str(p) for name in (LAYER_IMAGE, VOLUME_IMAGE) for p in directory.glob(name + "*")]


def destroy(directory: Path, wait_s: float = 10.0) -> None:
    """Delete a layer's or volume's directory and image for good: wait until no loop device
    uses the image, free its blocks (truncate), remove it and make the removal durable.
    Raises OSError if the image is still in use (retry later)."""
    if not directory.exists():
        return
    images = images_in(directory)
    still = wait_detached(images, wait_s)
    if still:
        raise OSError(f"{', '.join(still)} is still mounted: not deleted yet")
    for image in images:
        with contextlib.suppress(FileNotFoundError):
            os.truncate(image, 0)
    remove_tree(directory)
    _fsync_dir(directory.parent)
    _committed.clear()  # what it promised is free: the next admission counts again


def remove_tree(directory: Path, ignore_errors: bool = False) -> None:
    """shutil.rmtree, also of directories a rootless guest made unreadable or unwritable
    (`chmod 0` on its own directories, or overlayfs's mode-0 work/work): as the server's own
    user, without CAP_DAC_OVERRIDE, rmtree could neither list nor empty them, and a guest
    could keep its layer from ever being deleted. Only what rmtree walked into (it never
    follows a symlink) is made u+rwx, and the guest is not running."""
    try:
        shutil.rmtree(directory, onerror=_make_writable_and_retry)
    except FileNotFoundError:
        pass
    except OSError:
        if not ignore_errors:
            raise


def _make_writable_and_retry(function: Any, path: str, _info: Any) -> None:
    if function in (os.unlink, os.rmdir):
        # The entry's directory is not writable to us: make it so, then remove the entry.
        os.chmod(os.path.dirname(path), 0o700)
        function(path)
        return
    # os.open / os.scandir of a directory we may not read: once (a second failure is real).
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or info.st_mode & 0o700 == 0o700:
        raise OSError(f"{path}: cannot be removed")
    os.chmod(path, 0o700)
    shutil.rmtree(path, onerror=_make_writable_and_retry)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_instance(spec: dict[str, Any], wait_s: float = 0.0) -> str:
    """Sync what a gone VMM's guest wrote: its images once their filesystems are unmounted
    (the namespaces die with the last guest process), and the plain-directory parts."""
    images = image_files(spec.get("storage") or [])
    still = wait_detached(images, wait_s or DETACH_TIMEOUT_S)
    mounts = {e["mount"] for e in spec.get("storage") or []}
    # An image's mount point is an empty directory on the host: its files are in the image.
    plain = [p for p in spec.get("sync_paths") or () if not any(p == m or p.startswith(m + "/") for m in mounts)]
    errors = [error for error in (fsync_files(images), sync_paths(plain)) if error]
    if still:
        errors.append(f"{', '.join(still)} is still mounted")
    return "; ".join(errors)


def sync_paths(paths: list[str]) -> str:
    errors = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as error:
            errors.append(f"{path}: {error.strerror}")
            continue
        try:
            os.fsync(fd)
            syncfs(fd)
        except OSError as error:
            errors.append(f"{path}: {error.strerror}")
        finally:
            os.close(fd)
    return "; ".join(errors)


def syncfs(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
