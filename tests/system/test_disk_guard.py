"""A node's disk under its reserve: guests get ENOSPC in their own images before the disk fills
(issue 26 item 1, "thin-provisioned disk that is safe"; runtime/process/disk_guard.py).

Each test has a filesystem of its own (tests/system/test_resource_model.py `small_filesystem`:
4 GiB, reserve 1 GiB), so filling it takes nothing from the host. The first drives a real
server with real sandboxes; the others drive the guard on images mounted here."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.runtime.process import disk_guard, storage

from tests.client import Client, S, meta
from tests.integration.test_metrics import scrape, value
from tests.nodes import list_nodes
from tests.server import ServerProcess
from tests.system.test_process_runtime import DataPlane
from tests.system.test_resource_model import allocate, eventually, failed_ever, process_server, small_filesystem

GIB = 1 << 30
MIB = 1 << 20
SMALL = wp.Resources(vcpus=1, memory_mib=128, writable_layer_gib=1)
BIG_MEMORY = wp.Resources(vcpus=1, memory_mib=3072, writable_layer_gib=1)
ENOSPC = b"No space left on device"


def host_free(path: Path) -> int:
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize


def clamped_now(data_dir: Path) -> dict[str, bool]:
    """Each mounted layer and volume image of the data dir -> whether it takes no new block
    (its reserved_clusters at the guard's mark, clusters - 1), read from the kernel."""
    found = {}
    for loop, image in disk_guard.mounted_images(data_dir.resolve()).items():
        reserved = int((disk_guard.SYS_EXT4 / loop / "reserved_clusters").read_text())
        found[image] = reserved == disk_guard.geometry(image)[0] - 1
    return found


async def _exec(data: DataPlane, credential: str, *argv: str) -> tuple[int, bytes, bytes]:
    """An exec, asked again while the guest does not answer (UNAVAILABLE, "retry"), as a
    user would: under a full suite, a guest beside one writing 1.5 GiB answered late once."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await data.exec(credential, *argv)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


async def test_under_the_disk_reserve_a_writing_guest_gets_enospc_and_the_node_never_fills(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Two workspaces (1 GiB layer, 2 GiB /data) on a 4 GiB data-dir filesystem with 256 MiB
    left above its 1 GiB reserve. Guest A writes 1.5 GiB into /data without syncing: it takes
    the node under its reserve itself, and gets ENOSPC long before its /data is full, while
    the filesystem keeps at least half its reserve (unguarded, it would fill and the guests'
    writes back turn into I/O errors). B reads and overwrites its file meanwhile; its new
    blocks are refused too, also once it is stopped and started again; the server answers and
    records a create (DiskPressure, kibo_guest_storage_clamped 4). The server is restarted
    while clamped and the space freed meanwhile: the new server lifts the clamps, both guests
    write again, and nothing went FAILED."""
    with small_filesystem(tmp_path, 4) as mount:
        data_dir = mount / "data"
        with process_server(server_factory, data_dir=data_dir) as server:
            async with Client.connect(server.address) as client:
                # A's memory holds what it writes in its page cache (a cgroup of 128 MiB would
                # have it written back at once): the guard must count what is in flight.
                a, b = await asyncio.gather(
                    client.create(resources=BIG_MEMORY, data_volume_gib=2),
                    client.create(resources=SMALL, data_volume_gib=2),
                )
                assert a.state == b.state == S.WORKSPACE_STATE_AVAILABLE, (a, b)
                data = DataPlane(client)
                ca, cb = await data.credential(a.workspace_id), await data.credential(b.workspace_id)
                code, digest, err = await _exec(
                    data, cb, "sh", "-c", "head -c 8M /dev/urandom > /data/keep && sync && sha256sum < /data/keep"
                )
                assert code == 0, err

                reserve = storage.reserve_bytes(data_dir)
                filler = mount / "filler"
                await asyncio.to_thread(allocate, filler, host_free(mount) - reserve - 256 * MIB)
                code, out, err = await _exec(
                    data, ca, "sh", "-c", "head -c 1536M /dev/zero > /data/big; sync; stat -c %s /data/big"
                )
                written = int(out.split()[-1])
                free = host_free(mount)
                print(f"A wrote {written / MIB:.0f} MiB before ENOSPC; the data dir keeps {free / MIB:.0f} MiB free")
                assert ENOSPC in err, (code, out, err)
                assert b"Input/output error" not in err
                assert written < GIB, f"{written / MIB:.0f} MiB written: the guest was not held at the reserve"
                assert free >= reserve // 2, f"{free / MIB:.0f} MiB left of a {reserve / MIB:.0f} MiB reserve"

                # Every image of both guests takes no new block; the node says so.
                assert list((await asyncio.to_thread(clamped_now, data_dir)).values()) == [True] * 4
                assert value(await scrape(server), "kibo_guest_storage_clamped", node="node-1") == 4.0

                async def pressure_shown() -> bool:
                    return (await list_nodes(server.address))["node-1"].conditions == ["DiskPressure"]

                await eventually(pressure_shown, 15, "DiskPressure on node-1")

                # B: its files read and overwritten in place; a new block is ENOSPC.
                code, again, err = await _exec(data, cb, "sh", "-c", "sha256sum < /data/keep")
                assert (code, again) == (0, digest), err
                code, _, err = await _exec(
                    data, cb, "dd", "if=/dev/urandom", "of=/data/keep", "bs=1M", "count=8", "conv=notrunc,fsync"
                )
                assert code == 0, err
                code, _, err = await _exec(data, cb, "sh", "-c", "head -c 1M /dev/zero > /data/more")
                assert code != 0 and ENOSPC in err, (code, err)

                # The server answers and its data dir takes writes: a create is recorded (it waits).
                request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=SMALL))
                request_id = (await client.ws.CreateWorkspace(request)).workspace.workspace_id
                assert (await client.get(request_id)).state == S.WORKSPACE_STATE_CREATING

                # B stopped and started under the pressure: its images, mounted again, are clamped too.
                await client.stop(b.workspace_id)
                started = await client.start(b.workspace_id)
                assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE, started

                async def all_clamped() -> bool:
                    now = await asyncio.to_thread(clamped_now, data_dir)
                    return len(now) == 4 and all(now.values())

                await eventually(all_clamped, 10, "B's images mounted again to be clamped")
                cb = await data.credential(b.workspace_id)
                code, _, err = await _exec(data, cb, "sh", "-c", "head -c 1M /dev/zero > /data/more")
                assert code != 0 and ENOSPC in err, (code, err)

                # A restart while clamped, the space freed meanwhile: the new server lifts the clamps.
                await asyncio.to_thread(server.stop)
                filler.unlink()
                await asyncio.to_thread(server.start)

            async with Client.connect(server.address) as client:

                async def lifted() -> bool:
                    now = await asyncio.to_thread(clamped_now, data_dir)
                    return len(now) >= 4 and not any(now.values())  # 6 once the waiting create runs

                await eventually(lifted, 10, "the clamps to be lifted")
                data = DataPlane(client)
                for workspace in (a, b):
                    credential = await data.credential(workspace.workspace_id)
                    code, out, err = await _exec(
                        data,
                        credential,
                        "sh",
                        "-c",
                        "head -c 64M /dev/zero > /data/after && sync && stat -c %s /data/after",
                    )
                    assert (code, out.strip()) == (0, b"67108864"), err
                assert value(await scrape(server), "kibo_guest_storage_clamped", node="node-1") == 0.0
                await eventually(lambda: _no_conditions(server), 15, "DiskPressure to end at the node's next renewal")
                placed = await client.wait_for(request_id, S.WORKSPACE_STATE_AVAILABLE, within=30)
                for workspace_id in (a.workspace_id, b.workspace_id, placed.workspace_id):
                    assert not await failed_ever(client, workspace_id)
                    await client.delete(workspace_id)


async def _no_conditions(server: ServerProcess) -> bool:
    return (await list_nodes(server.address))["node-1"].conditions == []


# -- the guard alone, on images mounted here ------------------------------------------------------


@contextlib.contextmanager
def mounted_volume(data_dir: Path, name: str, size: int) -> Iterator[Path]:
    """A volume image of the data dir's layout, formatted and mounted here as a supervisor
    mounts it (storage.mount_image: a loop device with autoclear)."""
    directory = data_dir / "volumes" / name
    directory.mkdir(parents=True)
    image, mount = directory / storage.VOLUME_IMAGE, directory / "mnt"
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", storage.MKFS_EXTENDED, str(image)], check=True)
    mount.mkdir()
    storage.mount_image(str(image), str(mount))
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        storage.wait_detached([str(image)], 10)


def write_new(mount: Path, name: str, size: int) -> int:
    """Write `size` new bytes and sync them: 0, or the errno it failed with."""
    try:
        with open(mount / name, "wb") as f:
            f.write(b"\1" * size)
            os.fsync(f.fileno())
        return 0
    except OSError as error:
        return error.errno or -1


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the data-dir filesystem's mount, a mounted volume image of its data dir)."""
    if os.geteuid() != 0 or not storage.usable("bwrap"):
        pytest.skip("needs root, loop devices and mkfs.ext4")
    with small_filesystem(tmp_path, 4) as mount:
        data_dir = mount / "data"
        (data_dir / "runtime").mkdir(parents=True)
        with mounted_volume(data_dir, "v", 512 * MIB) as volume:
            yield mount, volume


def reserved(volume: Path) -> int:
    [loop] = disk_guard.mounted_images(volume.parent.parent.parent.resolve())
    return int((disk_guard.SYS_EXT4 / loop / "reserved_clusters").read_text())


def reserved_of(image: Path) -> int:
    """reserved_clusters of the filesystem mounted from `image` (any loop-mounted ext4)."""
    for loop in os.listdir(disk_guard.SYS_EXT4):
        backing = disk_guard.SYS_BLOCK / loop / "loop" / "backing_file"
        if backing.exists() and backing.read_text().strip() == str(image.resolve()):
            return int((disk_guard.SYS_EXT4 / loop / "reserved_clusters").read_text())
    raise AssertionError(f"{image} is not mounted")


def test_a_restarted_guard_restores_what_it_clamped_from_its_record_or_its_mark(guarded: tuple[Path, Path]) -> None:
    """Under the reserve the guard clamps (a new block: ENOSPC; an overwrite in place works);
    a guard started after the space came back (a restarted node) restores the value the image
    had (here one set by hand), from its record; with the record lost, the kernel's default,
    found by its mark."""
    mount, volume = guarded
    data_dir = (mount / "data").resolve()
    assert write_new(volume, "before", MIB) == 0
    default = reserved(volume)  # the kernel's at mount
    [loop] = disk_guard.mounted_images(data_dir)
    original = default // 2  # as an operator may have tuned it: only the record knows
    (disk_guard.SYS_EXT4 / loop / "reserved_clusters").write_text(str(original))
    filler = mount / "filler"
    allocate(filler, host_free(mount) - storage.reserve_bytes(data_dir) + 64 * MIB)
    guard = disk_guard.DiskGuard(data_dir)
    guard.check()
    assert guard.engaged and guard.clamped() == 1
    assert write_new(volume, "new", MIB) == errno.ENOSPC
    with open(volume / "before", "r+b") as f:
        f.write(b"\2" * MIB)
        os.fsync(f.fileno())
    assert (data_dir / "runtime" / disk_guard.STATE_FILE).exists()

    filler.unlink()
    restarted = disk_guard.DiskGuard(data_dir)
    restarted.check()
    assert not restarted.engaged and restarted.clamped() == 0
    assert reserved(volume) == original
    assert write_new(volume, "new", MIB) == 0
    assert not (data_dir / "runtime" / disk_guard.STATE_FILE).exists()

    # Clamped again, and the record lost (a full disk, say): the mark is enough.
    allocate(filler, host_free(mount) - storage.reserve_bytes(data_dir) + 64 * MIB)
    disk_guard.DiskGuard(data_dir).check()
    assert write_new(volume, "newer", MIB) == errno.ENOSPC
    (data_dir / "runtime" / disk_guard.STATE_FILE).unlink()
    filler.unlink()
    disk_guard.DiskGuard(data_dir).check()
    assert reserved(volume) == default
    assert write_new(volume, "newer", MIB) == 0


def test_a_guard_lifts_only_past_the_reserve_and_its_margin(guarded: tuple[Path, Path]) -> None:
    """Hysteresis: back just over the reserve the clamp stays; over the reserve plus a
    quarter of it, it goes. An image not of this data dir is never touched."""
    mount, volume = guarded
    data_dir = (mount / "data").resolve()
    outside = reserved_of(mount.parent / "fs.img")  # the data dir's own filesystem, not a guest's
    reserve = storage.reserve_bytes(data_dir)
    filler = mount / "filler"
    allocate(filler, host_free(mount) - reserve + 64 * MIB)
    guard = disk_guard.DiskGuard(data_dir)
    guard.check()
    assert guard.clamped() == 1
    assert reserved_of(mount.parent / "fs.img") == outside
    filler.unlink()
    allocate(filler, host_free(mount) - reserve - reserve // 8)  # over the reserve, under its margin
    guard._next_scan = 0.0
    guard.check()
    assert guard.engaged and guard.clamped() == 1
    assert write_new(volume, "new", MIB) == errno.ENOSPC
    filler.unlink()
    guard.check()
    assert not guard.engaged and guard.clamped() == 0
    assert write_new(volume, "new", MIB) == 0
