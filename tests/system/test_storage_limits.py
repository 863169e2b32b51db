"""Disk limits and data destruction on the process runtime (issue 10, findings 4 and 8).

A guest is hostile: it writes past its volume's and its writable layer's declared capacity,
and a deleted volume's files must not stay on the host. Each test drives a real
`kibo-ctrl serve --runtime process` (bubblewrap sandboxes; helpers of
tests/system/test_process_runtime.py) and checks the host: free space, files, loop devices, mounts.
Capacities are the minimum (1 GiB); the images are sparse and the fills mostly fallocate,
so a test writes little real data."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.runtime.process.sandbox import seed_layer

from tests.client import Client, S, meta
from tests.server import ServerProcess
from tests.system.test_cleanup_os import LAYER, RELEASED, VOLUMES, by_kind, cleanup_until
from tests.system.test_process_runtime import (
    CONFIRMED,
    FLAGS,
    DataPlane,
    _require_sandbox,
    command_of,
    instance_dir,
    reap,
    supervisors,
    volume_dir,
    wait_until,
)

GIB = 1 << 30
MIB = 1 << 20
ONE_GIB = wp.Resources(vcpus=1, memory_mib=128, writable_layer_gib=1)
NO_SPACE = b"No space left on device"


# -- what is on the host -----------------------------------------------------------------------


def free_bytes(path: Path) -> int:
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize


def allocated_bytes(root: Path) -> int:
    """Disk blocks of every file under `root` (what it really takes from the filesystem)."""
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def files_containing(root: Path, needle: bytes) -> list[str]:
    """Files under `root` whose data holds `needle` (reading only the data extents of sparse files)."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if _holds(fd, needle):
                    found.append(path)
            finally:
                os.close(fd)
    return found


def _holds(fd: int, needle: bytes) -> bool:
    if not os.path.isfile(f"/proc/self/fd/{fd}"):
        return False
    offset = 0
    while True:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:
            return False  # ENXIO: no data after offset
        end = os.lseek(fd, start, os.SEEK_HOLE)
        position = start
        tail = b""
        while position < end:
            chunk = os.pread(fd, min(8 * MIB, end - position), position)
            if not chunk:
                break
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
            position += len(chunk)
        offset = end


def loop_devices(data_dir: Path) -> list[str]:
    listing = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if str(data_dir.resolve()) in line]


def host_mounts(data_dir: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(data_dir.resolve()) in line]


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def storage_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    _require_sandbox()
    # Declared capacities at most the disk's size (the default lets them promise 10 times it).
    server = server_factory(*FLAGS, "--disk-allocation-ratio", "1")
    yield server
    server.kill()
    reap(server.data_dir)
    # Nothing of the guests' storage outlives the server: no loop device, no host mount.
    assert not loop_devices(server.data_dir)
    assert not host_mounts(server.data_dir)


@pytest.fixture
async def client(storage_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(storage_server.address) as connected:
        yield connected


async def create_small(client: Client, **spec: object) -> wp.Workspace:
    workspace = await client.create(resources=ONE_GIB, data_volume_gib=1, **spec)
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
    return workspace


async def shell(data: DataPlane, credential: str, script: str) -> tuple[int, bytes, bytes]:
    return await data.exec(credential, "sh", "-c", script)


async def assert_full_at_capacity(data: DataPlane, credential: str, directory: str) -> None:
    """From inside the guest: `directory`'s filesystem is ~1 GiB, refuses more, and is then full."""
    code, out, _ = await shell(data, credential, f"df -k -P {directory} | tail -1")
    assert code == 0
    size_kib = int(out.split()[1])
    assert 900 * 1024 <= size_kib <= 1024 * 1024, out
    # More than the capacity at once: refused up front.
    code, _, err = await data.exec(credential, "fallocate", "-l", "1100M", f"{directory}/too-big")
    assert code != 0 and NO_SPACE in err, (code, err)
    # Fill it, then write real bytes past the end: ENOSPC, never EIO.
    code, _, err = await shell(
        data,
        credential,
        f"rm -f {directory}/too-big; fallocate -l 900M {directory}/fill && head -c 300M /dev/zero > {directory}/more",
    )
    assert code != 0 and NO_SPACE in err, (code, err)
    assert b"Input/output error" not in err


# -- finding 4: disk is bounded -------------------------------------------------------------------


async def test_a_guest_cannot_write_past_its_volume_or_its_writable_layer(
    client: Client, storage_server: ServerProcess
) -> None:
    data_dir = storage_server.data_dir
    workspace = await create_small(client)
    data = DataPlane(client)
    credential = await data.credential(workspace.workspace_id)
    free_before = free_bytes(data_dir)

    await assert_full_at_capacity(data, credential, "/data")
    await assert_full_at_capacity(data, credential, "/var/tmp")  # the writable layer (the guest's root)
    # The guest's other writable place, /run/kibo (its ready file), is a tiny tmpfs, not the host's disk.
    code, _, err = await shell(data, credential, "head -c 8M /dev/zero > /run/kibo/junk")
    assert code != 0 and NO_SPACE in err, (code, err)
    assert not (instance_dir(storage_server, workspace) / "run" / "junk").exists()
    # Nor is its init's stdout (the supervisor's log, on the data dir): bounded.
    log = instance_dir(storage_server, workspace) / "supervisor.log"
    await shell(data, credential, "head -c 3M /dev/zero > /proc/1/fd/1; head -c 3M /dev/zero > /proc/2/fd/2")
    assert log.stat().st_size <= (1 << 20) + 64 * 1024

    # The host gave the two full filesystems at most their capacity, and really much less:
    # they are sparse images and the fills were mostly fallocated.
    assert allocated_bytes(data_dir) <= 2 * GIB
    assert free_before - free_bytes(data_dir) <= 2 * GIB + 256 * MIB  # other writers share the disk
    # The guest's files are not on the host's filesystem beneath: only in the images.
    assert not (volume_dir(storage_server, workspace) / "fill").exists()

    # Deleted: cleanup shows the layer and the volume released only once they are gone from
    # the machine (no file, no loop device holding the unlinked image's blocks).
    await client.delete(workspace.workspace_id)
    layer = data_dir / "layers" / workspace.workspace_id
    volume = volume_dir(storage_server, workspace)

    def released(rows: dict[int, object]) -> bool:
        done = by_kind_released(rows, LAYER) and by_kind_released(rows, VOLUMES)
        if done:
            assert not layer.exists() and not volume.exists()
            assert not loop_devices(data_dir)
        return done

    found = await cleanup_until(client, workspace.workspace_id, released)
    assert by_kind(found)[VOLUMES].status == RELEASED


def by_kind_released(rows: dict[int, object], kind: int) -> bool:
    row = rows.get(kind)
    return row is not None and getattr(row, "status", None) == RELEASED


async def test_storage_that_does_not_fit_on_the_disk_is_refused(client: Client, storage_server: ServerProcess) -> None:
    # 1024 GiB of writable layer, more than the node's disk offers in all (its size, at
    # --disk-allocation-ratio 1): refused up front with the reason (issue 26: not accepted and
    # then FAILED), before anything is recorded or made.
    huge = wp.Resources(vcpus=1, memory_mib=128, writable_layer_gib=1024)
    assert os.statvfs(storage_server.data_dir).f_blocks * os.statvfs(storage_server.data_dir).f_frsize < 1024 * GIB
    request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=huge, data_volume_gib=1))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.ws.CreateWorkspace(request)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "1025 GiB of storage" in refused.value.details(), refused.value.details()
    assert not list((storage_server.data_dir / "layers").glob("*/*.img*"))


async def test_data_on_the_images_survives_stop_start_and_a_control_plane_kill9(
    client: Client, storage_server: ServerProcess
) -> None:
    workspace = await create_small(client)
    wid = workspace.workspace_id
    token = secrets.token_hex(16)
    data = DataPlane(client)
    credential = await data.credential(wid)
    code, _, err = await shell(data, credential, f"echo {token} > /data/kept.txt && echo {token} > /root/kept.txt")
    assert code == 0, err

    stopped = await client.stop(wid)
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert (await command_of(client, stopped)).result.durability == CONFIRMED
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    credential = await data.credential(wid)
    assert await shell(data, credential, "cat /data/kept.txt /root/kept.txt") == (
        0,
        f"{token}\n{token}\n".encode(),
        b"",
    )

    # The control plane dies hard; the supervisor (and its mounts) run on and are re-adopted.
    [supervisor] = supervisors(storage_server, started.workspace)
    storage_server.kill()
    storage_server.start()
    async with Client.connect(storage_server.address) as again:
        assert (await again.get(wid)).state == S.WORKSPACE_STATE_AVAILABLE
        assert supervisors(storage_server, started.workspace) == [supervisor]
        data = DataPlane(again)
        credential = await data.credential(wid)
        assert await shell(data, credential, "cat /data/kept.txt /root/kept.txt") == (
            0,
            f"{token}\n{token}\n".encode(),
            b"",
        )
        # Still capped after the re-adoption, and still graceful: synced and confirmed.
        await assert_full_at_capacity(data, credential, "/data")
        stopped = await again.stop(wid)
        assert (await command_of(again, stopped)).result.durability == CONFIRMED
        assert not loop_devices(storage_server.data_dir)  # the stop unmounted everything
        started = await again.start(wid)
        credential = await data.credential(wid)
        assert await shell(data, credential, "cat /data/kept.txt /root/kept.txt") == (
            0,
            f"{token}\n{token}\n".encode(),
            b"",
        )
        await again.delete(wid)
        await wait_until(lambda: not (storage_server.data_dir / "layers" / wid).exists(), within=20)


async def test_a_writable_layer_resized_while_stopped_grows_at_the_next_start(
    client: Client, storage_server: ServerProcess
) -> None:
    workspace = await create_small(client)
    wid = workspace.workspace_id
    data = DataPlane(client)
    credential = await data.credential(wid)
    assert (await shell(data, credential, "echo before > /root/kept.txt"))[0] == 0
    await client.stop(wid)
    await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
    bigger = wp.Resources(vcpus=1, memory_mib=128, writable_layer_gib=2)
    resize = ws.ResizeWorkspaceRequest(metadata=meta(), workspace_id=wid, resources=bigger)
    await client.settle(client.ws.ResizeWorkspace, resize)
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    credential = await data.credential(wid)
    code, out, _ = await shell(data, credential, "cat /root/kept.txt; df -k -P /root | tail -1")
    assert code == 0 and out.startswith(b"before\n"), out
    assert 1900 * 1024 <= int(out.split()[2]) <= 2048 * 1024, out
    # The new capacity is the limit: 1.5 GiB fits now, 2.1 GiB does not.
    assert (await data.exec(credential, "fallocate", "-l", "1500M", "/root/big"))[0] == 0
    code, _, err = await data.exec(credential, "fallocate", "-l", "2100M", "/root/bigger")
    assert code != 0 and NO_SPACE in err, (code, err)
    await client.delete(wid)
    await wait_until(lambda: not (storage_server.data_dir / "layers" / wid).exists(), within=20)


async def test_a_layer_and_a_volume_from_before_images_keep_working_unlimited(
    client: Client, storage_server: ServerProcess
) -> None:
    # Made by an older kibo: plain directories (layers/<ws>/upper/, volumes/<vol>/ with files).
    # They are used as they are, not converted, and not limited (the runtime logs it).
    workspace = await create_small(client)
    wid = workspace.workspace_id
    await client.stop(wid)
    await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
    layer, volume = storage_server.data_dir / "layers" / wid, volume_dir(storage_server, workspace)
    for directory in (layer, volume):
        shutil.rmtree(directory)
    seed_layer(layer / "upper", host_usr=True)
    (layer / "upper" / "root" / "old.txt").write_text("old layer\n")
    volume.mkdir()
    (volume / "old.txt").write_text("old volume\n")
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE, started.workspace
    data = DataPlane(client)
    credential = await data.credential(wid)
    assert await shell(data, credential, "cat /root/old.txt /data/old.txt") == (0, b"old layer\nold volume\n", b"")
    assert (await shell(data, credential, "echo new > /data/new.txt"))[0] == 0
    assert (volume / "new.txt").read_text() == "new\n"  # still the plain directory
    assert not list(layer.glob("*.img*")) and not list(volume.glob("*.img*"))
    await client.delete(wid)
    await wait_until(lambda: not layer.exists() and not volume.exists(), within=20)


# -- finding 8: a deleted volume's data is destroyed ----------------------------------------------


async def test_a_deleted_volume_leaves_nothing_on_disk_even_after_a_restart(
    client: Client, storage_server: ServerProcess
) -> None:
    data_dir = storage_server.data_dir
    volume = await client.create_volume(capacity_gib=1)
    binding = wp.VolumeBinding(volume_id=volume.volume_id, mount_path="/mnt/secret")
    workspace = await create_small(client, volumes=[binding])
    wid = workspace.workspace_id
    secret = secrets.token_hex(24)
    data = DataPlane(client)
    credential = await data.credential(wid)
    assert (await shell(data, credential, f"echo {secret} > /mnt/secret/secret.txt"))[0] == 0
    await client.stop(wid)
    await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
    assert files_containing(data_dir, secret.encode())  # on disk, in the volume's image

    unbind = ws.UnbindWorkspaceVolumeRequest(metadata=meta(), workspace_id=wid, volume_id=volume.volume_id)
    await client.settle(client.ws.UnbindWorkspaceVolume, unbind)
    deleted = await client.vol.DeleteVolume(vol.DeleteVolumeRequest(metadata=meta(), volume_id=volume.volume_id))
    assert deleted.volume.state == vol.VOLUME_STATE_DELETED
    # The node destroys its files (asynchronously, durably).
    volume_files = data_dir / "volumes" / volume.volume_id
    await wait_until(lambda: not volume_files.exists(), within=20)
    assert not files_containing(data_dir, secret.encode())

    # A restart neither brings them back nor needs to do anything more.
    storage_server.stop()
    storage_server.start()
    async with Client.connect(storage_server.address) as again:
        got = await again.vol.GetVolume(vol.GetVolumeRequest(volume_id=volume.volume_id))
        assert got.volume.state == vol.VOLUME_STATE_DELETED
        started = await again.start(wid)  # the workspace runs on without it
        assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
        assert not volume_files.exists()
        assert not files_containing(data_dir, secret.encode())
        await again.delete(wid)
        await wait_until(lambda: not (data_dir / "layers" / wid).exists(), within=20)


async def test_a_volume_deletion_interrupted_by_a_crash_resumes_at_start(
    client: Client, storage_server: ServerProcess, tmp_path: Path
) -> None:
    # The store keeps a deleted volume pending until its files are gone: a control plane
    # that dies between the delete and the destruction finishes it when it comes back.
    data_dir = storage_server.data_dir
    volume = await client.create_volume(capacity_gib=1)
    binding = wp.VolumeBinding(volume_id=volume.volume_id, mount_path="/mnt/secret")
    workspace = await create_small(client, volumes=[binding])
    wid = workspace.workspace_id
    secret = secrets.token_hex(24)
    data = DataPlane(client)
    credential = await data.credential(wid)
    assert (await shell(data, credential, f"echo {secret} > /mnt/secret/secret.txt"))[0] == 0
    await client.stop(wid)
    await client.wait_for(wid, S.WORKSPACE_STATE_STOPPED)
    unbind = ws.UnbindWorkspaceVolumeRequest(metadata=meta(), workspace_id=wid, volume_id=volume.volume_id)
    await client.settle(client.ws.UnbindWorkspaceVolume, unbind)
    # Someone else still has the image mounted (its own mount namespace): the node must not
    # call the volume destroyed while a loop device holds its blocks.
    volume_files = data_dir / "volumes" / volume.volume_id
    (tmp_path / "holder").mkdir()
    script = f"mount -o loop,ro {volume_files / 'volume.img'} {tmp_path / 'holder'} && echo held && exec sleep 120"
    holder = await asyncio.create_subprocess_exec(
        "unshare", "--mount", "--propagation", "private", "sh", "-c", script, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and await holder.stdout.readline() == b"held\n"
        await client.vol.DeleteVolume(vol.DeleteVolumeRequest(metadata=meta(), volume_id=volume.volume_id))
        await asyncio.sleep(1.0)
        assert files_containing(volume_files, secret.encode())  # not destroyed under a mount
        storage_server.kill()
    finally:
        holder.kill()
        await holder.wait()
    await wait_until(lambda: not loop_devices(data_dir))
    storage_server.start()
    await wait_until(lambda: not volume_files.exists(), within=20)
    assert not files_containing(data_dir, secret.encode())
    async with Client.connect(storage_server.address) as again:
        await again.delete(wid)
        await wait_until(lambda: not (data_dir / "layers" / wid).exists(), within=20)


async def test_on_the_simulator_a_deleted_volume_is_released_through_the_same_interface(
    server_factory: Callable[..., ServerProcess],
) -> None:
    # The node agent drives Runtime.delete_volumes on every runtime; the store records when.
    server = server_factory("--runtime", "sim", "--sim-step-ms", "1")
    async with Client.connect(server.address) as sim_client:
        volume = await sim_client.create_volume(capacity_gib=1)
        before = time.time()
        await sim_client.vol.DeleteVolume(vol.DeleteVolumeRequest(metadata=meta(), volume_id=volume.volume_id))

        def record() -> dict[str, object]:
            with contextlib.closing(sqlite3.connect(server.data_dir / "kibo.db")) as db:
                row = db.execute("SELECT data FROM volumes WHERE id = ?", (volume.volume_id,)).fetchone()
            data: dict[str, object] = json.loads(row[0])
            return data

        await wait_until(lambda: record().get("storage_pending") is False)
        released = record()["storage_release_time"]
        assert isinstance(released, float) and released >= before - 1
    server.stop()
