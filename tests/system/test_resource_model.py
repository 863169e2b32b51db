"""The resource model on real nodes (issue 26, items 1, 2 and 5).

One model for every node: what it offers is its host's times an allocation ratio (CPU 16 x,
memory 1.5 x, declared storage 10 x the disk: domain/nodes.py AllocationRatios); layers and
volumes are sparse images whose capacity is a limit in the guest, while the node watches
real free space against its reserve; a create no node could hold is refused up front, and
one that does not fit now waits UNSCHEDULABLE, never accepted and then FAILED; and a
workspace's memory is its guest's: one process over it is killed in the guest, which runs on.

Each test drives real servers (tests/server.py) and, for the process runtime, real
bubblewrap sandboxes (helpers of tests/system/test_process_runtime.py). Figures measured here
(2 cores, 24 GiB, 252 GiB disk) are in the README's "Capacity" paragraph."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S, error_of, meta
from tests.integration.test_metrics import scrape, value
from tests.nodes import NodeProcess, list_nodes
from tests.server import ServerProcess
from tests.system.test_process_runtime import DataPlane, _require_sandbox, reap

GIB = 1 << 30
MIB = 1 << 20
# The process runtime as `kibo-ctrl serve` runs it by default (the embedded node, the node
# supervisor), with a settle window for real sandboxes and /metrics open to the test.
PROCESS = ("--runtime", "process", "--sandbox", "bwrap", "--settle-ms", "3000", "--stop-grace-ms", "2000")
METRICS = ("--metrics", "open")
TINY = wp.Resources(vcpus=1, memory_mib=128, writable_layer_gib=1)


@contextlib.contextmanager
def process_server(
    server_factory: Callable[..., ServerProcess], *flags: str, data_dir: Path | None = None
) -> Iterator[ServerProcess]:
    """A process-runtime server; after its stop nothing of its data dir runs (reap)."""
    _require_sandbox()
    server = server_factory(*PROCESS, *METRICS, *flags, data_dir=data_dir)
    try:
        yield server
        server.stop()
    finally:
        reap(server.data_dir)


def host_cores() -> int:
    return len(os.sched_getaffinity(0))


def host_memory_mib() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB


async def failed_ever(client: Client, workspace_id: str) -> bool:
    return any(e.to_state == S.WORKSPACE_STATE_FAILED for e in await client.events(workspace_id))


async def eventually(check: Callable[[], object], within: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not await check():  # type: ignore[misc]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


# -- item 1: thin-provisioned disk ---------------------------------------------------------------


async def test_fifty_default_workspaces_fit_on_the_disk_they_barely_touch_and_a_full_guest_is_alone(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """The embedded default on this machine's disk: every workspace declares the default 10 GiB
    layer and 10 GiB /data (1,000 GiB in all, far over the free disk) and writes a few MiB, so
    all fit (the fourth used to go FAILED). A guest that fills its own small /data gets ENOSPC
    there and nowhere else. (vCPUs given: this host has 2 cores, 32 vCPUs at 16 x, and this
    test is of the disk, not of the CPU.)"""
    with process_server(server_factory, "--node-vcpus", "128") as server:
        async with Client.connect(server.address) as client:
            free_before = os.statvfs(server.data_dir).f_bavail * os.statvfs(server.data_dir).f_frsize
            started = time.monotonic()
            small = wp.Resources(vcpus=1, memory_mib=128)
            created = await asyncio.gather(*(client.create(resources=small) for _ in range(50)))
            took = time.monotonic() - started
            assert all(w.state == S.WORKSPACE_STATE_AVAILABLE for w in created), [
                (w.workspace_id, S.Name(w.state), w.failure.message) for w in created if w.state != 2
            ]
            layer_gib = {w.spec.resources.writable_layer_gib for w in created}
            volumes_gib = {b.capacity_gib for w in created for b in w.spec.volumes}
            assert layer_gib == {10} and volumes_gib == {10}, (layer_gib, volumes_gib)
            # 1,000 GiB declared; real use a few MiB each.
            used = free_before - os.statvfs(server.data_dir).f_bavail * os.statvfs(server.data_dir).f_frsize
            assert used < 50 * 64 * MIB, f"{used / MIB:.0f} MiB of real disk for 50 sparse workspaces"
            print(f"50 default workspaces: {took:.1f} s to AVAILABLE, {used / MIB:.0f} MiB of real disk")

            # A guest with a 1 GiB /data fills it: ENOSPC in that guest, never EIO.
            full = await client.create(resources=small, data_volume_gib=1)
            assert full.state == S.WORKSPACE_STATE_AVAILABLE, full
            data = DataPlane(client)
            credential = await data.credential(full.workspace_id)
            code, _, err = await data.exec(
                credential, "sh", "-c", "fallocate -l 900M /data/fill && head -c 300M /dev/zero > /data/more"
            )
            assert code != 0 and b"No space left on device" in err, (code, err)
            assert b"Input/output error" not in err
            # The others and the server are unaffected: a neighbour writes, and a new create works.
            neighbour = created[0]
            other = await data.credential(neighbour.workspace_id)
            code, out, err = await data.exec(other, "sh", "-c", "head -c 4M /dev/zero > /data/x && wc -c < /data/x")
            assert (code, out.strip()) == (0, b"4194304"), err
            code, _, err = await data.exec(credential, "rm", "/data/more", "/data/fill")
            assert code == 0, err
            after = await client.create(resources=small)
            assert after.state == S.WORKSPACE_STATE_AVAILABLE, after
            assert (await client.get(full.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
            for workspace in [*created, full, after]:
                await client.delete(workspace.workspace_id)


@contextlib.contextmanager
def small_filesystem(root: Path, size_gib: int) -> Iterator[Path]:
    """A filesystem of its own for a data dir: ext4 in a sparse file, loop-mounted (filling it
    with fallocate takes no real disk from the host)."""
    image, mount = root / "fs.img", root / "fs"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_gib * GIB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        image.unlink(missing_ok=True)


def allocate(path: Path, size: int) -> None:
    """Take `size` bytes of the filesystem's real free space at once (no data written)."""
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)


async def test_real_free_space_under_the_reserve_refuses_new_storage_naming_the_node(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A data dir on a 4 GiB filesystem of its own (reserve: 1 GiB). Once real free space is
    under the reserve, a create the scheduler placed on the node's last report is refused by
    the node's admission and placed again (it waits, UNSCHEDULABLE, the node named: not
    FAILED); the node shows DiskPressure and the metric says so; the next create is not
    placed at all; space freed, it runs. What runs keeps running."""
    with small_filesystem(tmp_path, 4) as mount:
        data_dir = mount / "data"
        # A lease of 20 s: the node tells its disk every 5 s, so a create right after the fill
        # is placed on the last report (the node's admission is what refuses it).
        with process_server(server_factory, "--node-timeout-ms", "20000", data_dir=data_dir) as server:
            async with Client.connect(server.address) as client:
                running = await client.create(resources=TINY, data_volume_gib=1)
                assert running.state == S.WORKSPACE_STATE_AVAILABLE, running
                fs = os.statvfs(mount)
                free = fs.f_bavail * fs.f_frsize
                filler = mount / "filler"
                await asyncio.to_thread(allocate, filler, free - 512 * MIB)

                request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=TINY))
                refused = (await client.ws.CreateWorkspace(request)).workspace.workspace_id

                async def told_no_room() -> bool:
                    events = await client.events(refused)
                    return any(e.type == obs.EVENT_TYPE_UNSCHEDULABLE and "disk on node-1" in e.message for e in events)

                await eventually(told_no_room, 20, "the node's admission to refuse it")
                events = [e.message for e in await client.events(refused) if e.type == obs.EVENT_TYPE_UNSCHEDULABLE]
                assert any("node node-1" in m and "reserve" in m for m in events), events
                waiting = await client.get(refused)
                assert waiting.state == S.WORKSPACE_STATE_CREATING, waiting
                assert not await failed_ever(client, refused)

                nodes = await list_nodes(server.address)
                assert nodes["node-1"].conditions == ["DiskPressure"], nodes["node-1"]
                assert nodes["node-1"].disk_free_bytes < nodes["node-1"].disk_reserve_bytes
                assert value(await scrape(server), "kibo_node_disk_pressure", node="node-1") == 1.0

                # The scheduler knows now: the next create is not even placed there.
                request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=TINY))
                second = (await client.ws.CreateWorkspace(request)).workspace.workspace_id

                async def told_by_the_scheduler() -> bool:
                    events = await client.events(second)
                    return any("node-1's disk is under its reserve" in e.message for e in events)

                await eventually(told_by_the_scheduler, 10, "the scheduler to name the node's disk")
                assert (await client.get(running.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE

                # Space again: at the node's next report both are placed and run.
                filler.unlink()
                for workspace_id in (refused, second):
                    placed = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=30)
                    assert placed.node_id == "node-1"
                    assert not await failed_ever(client, workspace_id)
                assert (await list_nodes(server.address))["node-1"].conditions == []
                for workspace_id in (running.workspace_id, refused, second):
                    await client.delete(workspace_id)


# -- item 2 and the up-front refusal: capacity is the host's times a ratio ------------------------


@pytest.fixture
async def remote_node(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> AsyncIterator[tuple[ServerProcess, NodeProcess]]:
    """A control plane with no node of its own, and a `kibo-ctrl node` on this host with its
    defaults (its vCPUs and memory: the host's times the allocation ratios)."""
    server = server_factory("--runtime", "sim", "--no-local-node", "--sim-step-ms", "5")
    node = NodeProcess(server.address, tmp_path / "node", "host-node", ("--vcpus", "0", "--memory-mib", "0")).start()
    try:

        async def joined() -> bool:
            return "host-node" in await list_nodes(server.address)

        await eventually(joined, 20, "the node to join")
        yield server, node
    finally:
        node.stop()


async def test_a_node_on_this_host_holds_as_many_default_workspaces_as_its_ratios_allow(
    remote_node: tuple[ServerProcess, NodeProcess],
) -> None:
    server, _ = remote_node
    cores, memory_mib = host_cores(), host_memory_mib()
    node = (await list_nodes(server.address))["host-node"]
    assert (node.host_vcpus, node.cpu_allocation_ratio, node.vcpus) == (cores, 16.0, cores * 16)
    assert (node.host_memory_mib, node.memory_allocation_ratio) == (memory_mib, 1.5)
    assert node.memory_mib == int(memory_mib * 1.5)
    # A default workspace: 2 vCPU, 2048 MiB.
    fits = min(node.vcpus // 2, node.memory_mib // 2048)
    async with Client.connect(server.address) as client:
        placed = await asyncio.gather(*(client.create() for _ in range(fits)))
        assert [w.state for w in placed] == [S.WORKSPACE_STATE_AVAILABLE] * fits
        assert {w.node_id for w in placed} == {"host-node"}
        # One more does not fit now: it waits, the resource named.
        request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec())
        waiting = (await client.ws.CreateWorkspace(request)).workspace.workspace_id

        async def named() -> bool:
            events = await client.events(waiting)
            return any(e.type == obs.EVENT_TYPE_UNSCHEDULABLE and "short of" in e.message for e in events)

        await eventually(named, 10, "an UNSCHEDULABLE event naming the resource")
        assert (await client.get(waiting)).state == S.WORKSPACE_STATE_CREATING
        # Bigger than the node could ever hold: refused up front, nothing made.
        huge = wp.Resources(vcpus=node.vcpus + 1)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.ws.CreateWorkspace(
                ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=huge))
            )
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_of(error.value).reason == "NO_CAPACITY" and f"{node.vcpus + 1} vCPU" in error.value.details()
        largest = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).largest_workspace
        assert (largest.vcpus, largest.memory_mib) == (node.vcpus, node.memory_mib)
        await client.delete(waiting)
        for workspace in placed:
            await client.delete(workspace.workspace_id)


# -- item 5: memory as a guest sees it -----------------------------------------------------------


def parent_memory_limit(server: ServerProcess, workspace: wp.Workspace) -> Path:
    """The memory limit of the node's share of the host: the parent of the guests' cgroups."""
    spec = json.loads(
        (
            server.data_dir / "instances" / f"{workspace.workspace_id}-g{workspace.execution_generation}" / "spec.json"
        ).read_text()
    )
    oom_file = Path(spec["oom_file"])
    parent = oom_file.parent.parent
    return parent / ("memory.max" if oom_file.name == "memory.events" else "memory.limit_in_bytes")


def parent_usage(limit: Path) -> int:
    usage = limit.parent / ("memory.current" if limit.name == "memory.max" else "memory.usage_in_bytes")
    return int(usage.read_text())


@pytest.fixture(scope="module")
def memory_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with process_server(server_factory) as server:
        yield server


async def test_a_process_over_the_workspace_memory_is_killed_in_the_guest_which_runs_on(
    memory_server: ServerProcess,
) -> None:
    async with Client.connect(memory_server.address) as client:
        workspace = await client.create(resources=wp.Resources(vcpus=1, memory_mib=128))
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
        data = DataPlane(client)
        credential = await data.credential(workspace.workspace_id)
        code, _, err = await data.exec(credential, "sh", "-c", "echo kept > /data/note && sync")
        assert code == 0, err
        # The guest's init (kibo's agent) is the OOM killer's last choice in it: every other
        # process of the guest ranks above it (and above the host's own processes).
        instance = memory_server.data_dir / "instances" / f"{workspace.workspace_id}-g{workspace.execution_generation}"
        agent = json.loads((instance / "state.json").read_text())["guest_pid"]
        assert await asyncio.to_thread(Path(f"/proc/{agent}/oom_score_adj").read_text) == "0\n"
        code, out, _ = await data.exec(credential, "cat", "/proc/self/oom_score_adj")
        assert (code, out) == (0, b"500\n")
        before = await scrape(memory_server)
        code, _, _ = await data.exec(credential, "python3", "-c", "bytearray(400 << 20)")
        assert code == 137  # SIGKILL, as a guest kernel's OOM killer gives it

        async def recorded() -> bool:
            return any(e.type == obs.EVENT_TYPE_GUEST_OOM_KILL for e in await client.events(workspace.workspace_id))

        await eventually(recorded, 10, "the OOM kill's event")
        [kill] = [e for e in await client.events(workspace.workspace_id) if e.type == obs.EVENT_TYPE_GUEST_OOM_KILL]
        assert kill.message.startswith("OOM: killed PID ") and "(python3)" in kill.message, kill.message
        after = await scrape(memory_server)
        assert (
            value(after, "kibo_guest_oom_kills_total", node="node-1")
            - value(before, "kibo_guest_oom_kills_total", node="node-1")
            == 1
        )
        # The workspace runs on, with its data and the same credential.
        current = await client.get(workspace.workspace_id)
        assert current.state == S.WORKSPACE_STATE_AVAILABLE
        assert current.execution_generation == workspace.execution_generation
        assert not await failed_ever(client, workspace.workspace_id)
        code, out, _ = await data.exec(credential, "cat", "/data/note")
        assert (code, out) == (0, b"kept\n")
        await client.delete(workspace.workspace_id)


async def test_the_host_running_out_of_memory_still_takes_the_host_memory_path(
    memory_server: ServerProcess,
) -> None:
    """The runtime's test hook for a host out of memory: the node's share of the host (the
    guests' parent cgroup) is given a limit just above what it uses, and a process in a guest
    that is well within its own memory goes over it. The kernel kills in the guest for lack of
    memory above the guest's: the spec's host-memory-exhaustion path (FAILED, then the
    server's force stop: STOPPED, cause HOST_MEMORY_EXHAUSTED)."""
    async with Client.connect(memory_server.address) as client:
        workspace = await client.create(resources=wp.Resources(vcpus=1, memory_mib=1024))
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
        data = DataPlane(client)
        credential = await data.credential(workspace.workspace_id)
        limit = parent_memory_limit(memory_server, workspace)
        unlimited = limit.read_text().strip()
        limit.write_text(str(parent_usage(limit) + 64 * MIB))
        try:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await data.exec(credential, "python3", "-c", "bytearray(300 << 20)")
            stopped = await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_STOPPED, within=20)
        finally:
            limit.write_text(unlimited)
        assert stopped.last_stop.cause == wp.STOP_CAUSE_HOST_MEMORY_EXHAUSTED
        assert await failed_ever(client, workspace.workspace_id)
        assert not any(e.type == obs.EVENT_TYPE_GUEST_OOM_KILL for e in await client.events(workspace.workspace_id))
        started = await client.start(workspace.workspace_id)
        assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
        await client.delete(workspace.workspace_id)
