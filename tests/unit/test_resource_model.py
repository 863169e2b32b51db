"""The resource model's arithmetic and rules, in process (issue 26): a node's capacity is its
host's times the allocation ratios; what no node could ever hold is told up front; a node's
disk refuses new storage under its reserve of real free space or past its declared bound;
a node's refusal at launch puts the instance back to the scheduler, never FAILED; and a
process killed over the guest's memory is an event, the workspace running on."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.domain.errors import NoCapacity
from kibo_ctrl.domain.model import CommandState, EventType, Phase, WorkspaceState
from kibo_ctrl.domain.nodes import (
    AllocationRatios,
    DiskStatus,
    NodeRecord,
    NodeResources,
    allocatable,
    capacity,
    storage_room,
    too_big,
)
from kibo_ctrl.domain.reports import GuestOomKill, Launched, LaunchFailed
from kibo_ctrl.engine import controller
from kibo_ctrl.engine.placement import schedule_pending
from kibo_ctrl.runtime.process import storage
from kibo_ctrl.store.base import Tx

from tests.unit.engine_harness import Engine, engine

__all__ = ["engine"]

GIB = 1 << 30


# -- capacity: the host's times a ratio -----------------------------------------------------------


def test_a_node_offers_its_host_times_the_ratios_unless_told() -> None:
    ratios = AllocationRatios()
    assert (ratios.cpu, ratios.memory, ratios.disk) == (16.0, 1.5, 10.0)
    vcpus, memory_mib, resources = capacity((2, 24105), ratios)
    assert (vcpus, memory_mib) == (32, 36157)
    assert (resources.host_vcpus, resources.host_memory_mib) == (2, 24105)
    assert (resources.cpu_ratio, resources.memory_ratio) == (16.0, 1.5)
    # Given explicitly: as given, and no ratio recorded.
    vcpus, memory_mib, resources = capacity((2, 24105), ratios, vcpus=7, memory_mib=1000)
    assert (vcpus, memory_mib, resources.cpu_ratio, resources.memory_ratio) == (7, 1000, 0.0, 0.0)
    # At least one of each, however small the ratio.
    assert capacity((1, 100), AllocationRatios(cpu=0.1, memory=0.001))[:2] == (1, 1)
    assert allocatable(3, 1.5) == 4  # floor
    disk = resources.with_disk(252, 10.0, 2520)
    assert (disk.host_disk_gib, disk.disk_ratio, disk.storage_gib) == (252, 10.0, 2520)


def _node(node_id: str, vcpus: int, memory_mib: int, storage_gib: int = 0, **disk: object) -> NodeRecord:
    record = NodeRecord(node_id, vcpus, memory_mib, "local")
    record.resources = NodeResources(storage_gib=storage_gib)
    record.disk = DiskStatus(**disk)  # type: ignore[arg-type]
    return record


def test_what_no_node_could_ever_hold_is_told_with_the_resource_and_the_largest_node() -> None:
    nodes = [_node("a", 8, 4096, 100), _node("b", 4, 16384, 300)]
    assert too_big([], 10_000, 10**9, 10**6) == ""  # no node yet: one may join
    assert too_big(nodes, 8, 4096, 100) == ""
    why = too_big(nodes, 9, 1024, 1)
    assert "9 vCPU" in why and "the most a node offers is 8, a" in why
    why = too_big(nodes, 1, 20000, 1)
    assert "20000 MiB" in why and "16384 MiB, b" in why
    why = too_big(nodes, 1, 1024, 301)
    assert "301 GiB of storage" in why and "300 GiB, b" in why
    # Each resource fits some node, but no node all of them together.
    why = too_big(nodes, 8, 16384, 1)
    assert "together" in why
    # A node that does not bound its storage (the simulator) holds any.
    assert too_big([_node("sim", 8, 4096)], 1, 1024, 10**6) == ""


def test_a_nodes_disk_takes_no_new_storage_under_pressure_or_past_what_it_offers() -> None:
    assert storage_room(_node("a", 1, 1, 100, promised_bytes=90 * GIB), 10) == ""
    assert "no room left in the 100 GiB" in storage_room(_node("a", 1, 1, 100, promised_bytes=91 * GIB), 10)
    assert "under its reserve" in storage_room(_node("a", 1, 1, 100, pressure=True), 1)
    assert storage_room(_node("a", 1, 1, 100, pressure=True), 0) == ""  # nothing new to make there
    # A change the scheduler cares about is stored; free space moving a little is not.
    base = DiskStatus(free_bytes=10 * GIB, reserve_bytes=GIB, promised_bytes=20 * GIB)
    assert not base.differs(DiskStatus(free_bytes=10 * GIB + 100, reserve_bytes=GIB, promised_bytes=20 * GIB))
    assert base.differs(DiskStatus(free_bytes=8 * GIB, reserve_bytes=GIB, promised_bytes=20 * GIB))
    assert base.differs(DiskStatus(free_bytes=10 * GIB, reserve_bytes=GIB, promised_bytes=30 * GIB))
    assert base.differs(DiskStatus(free_bytes=10 * GIB, reserve_bytes=GIB, promised_bytes=20 * GIB, pressure=True))


# -- the process runtime's admission: real free space and the declared bound ----------------------


def _disk(monkeypatch: pytest.MonkeyPatch, size_gib: float, free_gib: float) -> None:
    """The data dir's filesystem as statvfs tells it: `size_gib`, `free_gib` free."""
    fs = SimpleNamespace(f_frsize=4096, f_blocks=int(size_gib * GIB) // 4096, f_bavail=int(free_gib * GIB) // 4096)
    monkeypatch.setattr(storage.os, "statvfs", lambda path: fs)


@pytest.fixture(autouse=True)
def fresh_counts() -> object:
    storage._committed.clear()
    yield None
    storage._committed.clear()


def _image(data_dir: Path, name: str, gib: int) -> None:
    directory = data_dir / "layers" / name
    directory.mkdir(parents=True)
    with open(directory / storage.LAYER_IMAGE, "wb") as f:
        f.truncate(gib * GIB)


def test_admission_counts_real_free_space_not_declared_capacities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: 76.2 GiB free, three default workspaces (60 GiB declared, a few MiB used):
    the fourth's 20 GiB used to be refused. Now what is declared counts only against the
    disk times the ratio (80 GiB x 10), and real free space only against the reserve."""
    for i in range(3):
        _image(tmp_path, f"ws-{i}", 20)
    _disk(monkeypatch, size_gib=80, free_gib=76.2)
    assert storage.reserve_bytes(tmp_path) == int(80 * GIB * 0.02)
    assert storage.refusal(tmp_path, 20 * GIB, 10.0) == ""
    # Past what the disk offers at the ratio: refused, the figures named.
    why = storage.refusal(tmp_path, 800 * GIB, 10.0)
    assert "60 GiB promised" in why and "800 GiB this node offers" in why and "--disk-allocation-ratio 10" in why
    # At 1 the declared capacities must fit on the disk.
    assert "GiB promised" in storage.refusal(tmp_path, 21 * GIB, 1.0)
    assert storage.refusal(tmp_path, 20 * GIB, 1.0) == ""


def test_under_the_reserve_no_new_storage_whatever_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _disk(monkeypatch, size_gib=100, free_gib=1.5)  # reserve: 2 GiB
    free, reserve, promised, pressure = storage.disk_status(tmp_path)
    assert (free, reserve, promised, pressure) == (int(1.5 * GIB), 2 * GIB, 0, True)
    why = storage.refusal(tmp_path, 1, 10.0)
    assert "1.5 GiB free, under the 2.0 GiB this node keeps in reserve" in why
    entry = storage.entry(tmp_path / "layers" / "ws-1", storage.LAYER_IMAGE, 1, None)
    (tmp_path / "layers" / "ws-1").mkdir(parents=True)
    with pytest.raises(storage.NoSpace):
        storage.admit(tmp_path, [entry], 10.0)
    assert not os.listdir(tmp_path / "layers" / "ws-1"), "nothing made"
    _disk(monkeypatch, size_gib=100, free_gib=2.5)
    storage.admit(tmp_path, [entry], 10.0)
    assert os.path.exists(entry["new"])


# -- the engine: placement on the disk as reported, a refusal placed again ------------------------


async def _with_node(engine: Engine, **disk: object) -> None:
    def put(tx: Tx) -> None:
        record = NodeRecord("node-1", 8, 8192, "local")
        record.resources = NodeResources(storage_gib=100)
        record.disk = DiskStatus(**disk)  # type: ignore[arg-type]
        tx.put_node(record)

    await engine.store.transact(put)


def _small(command_id: str, vcpus: int = 1) -> ws.CreateWorkspaceRequest:
    resources = wp.Resources(vcpus=vcpus, memory_mib=512, writable_layer_gib=1)
    message = ws.CreateWorkspaceRequest(spec=wp.WorkspaceSpec(resources=resources, data_volume_gib=1))
    message.metadata.command_id = command_id
    return message


async def test_a_create_bigger_than_every_node_is_refused_and_nothing_is_stored(engine: Engine) -> None:
    await _with_node(engine)
    with pytest.raises(NoCapacity) as refused:
        await engine.command("CreateWorkspace", _small("too-big", vcpus=9))
    assert "9 vCPU" in refused.value.message and "node-1" in refused.value.message
    assert await engine.store.read(lambda r: r.get_command("default", "too-big")) is None
    assert await engine.store.read(lambda r: r.unscheduled_instances()) == []


async def test_a_node_under_its_disk_reserve_is_passed_over_with_the_reason(engine: Engine) -> None:
    await _with_node(engine, pressure=True, free_bytes=GIB, reserve_bytes=2 * GIB)
    await engine.command("CreateWorkspace", _small("create-1"))
    assert await engine.store.transact(schedule_pending) == 1
    [instance] = await engine.store.read(lambda r: r.unscheduled_instances())
    assert instance.node_id is None
    assert "2 GiB of new storage" in instance.reason and "node-1's disk is under its reserve" in instance.reason


async def test_a_launch_the_node_had_no_room_for_is_placed_again_not_failed(engine: Engine) -> None:
    """The scheduler placed on the node's last report; the node's admission, which sees the
    disk as it is now, refused (LaunchFailed with no_room). The instance waits for the
    scheduler again (a new step), nothing is pinned to that node, the create goes on."""
    await _with_node(engine)
    workspace, command = await engine.command("CreateWorkspace", _small("create-1"))
    assert await engine.store.transact(schedule_pending) == 0
    placed = await engine.workspace(workspace.id)
    assert placed.node_id == "node-1" and placed.storage_node == "node-1"
    instance_id = placed.instance_id or ""
    step = (await engine.store.read(lambda r: r.get_instance(instance_id))).step  # type: ignore[union-attr]
    refusal = LaunchFailed(instance_id, step, "node node-1: not enough disk for new storage", no_room="disk")
    await engine.store.transact(controller.apply, refusal)

    after = await engine.workspace(workspace.id)
    assert after.state is WorkspaceState.CREATING and after.failure is None
    assert after.node_id is None and after.storage_node is None
    instance = await engine.store.read(lambda r: r.get_instance(instance_id))
    assert instance is not None
    assert (instance.node_id, instance.phase, instance.holds, instance.step) == (None, Phase.PENDING, [], step + 1)
    assert (await engine.command_record(command)).state is not CommandState.FAILED
    volumes = [await engine.store.read(lambda r, b=b: r.get_volume(b.volume_id)) for b in after.bindings]
    assert all(v is not None and v.storage_node is None for v in volumes)
    events = await engine.store.read(lambda r: r.list_events(workspace.id, 0, 100))
    assert any(e.type is EventType.UNSCHEDULABLE and e.message.startswith("disk on node-1:") for e in events)
    # The scheduler places it again; this time it runs.
    assert await engine.store.transact(schedule_pending) == 0
    await engine.store.transact(controller.apply, Launched(instance_id, step + 1))
    assert (await engine.workspace(workspace.id)).state is WorkspaceState.AVAILABLE
    # Any other launch failure is still a failure.
    other, _ = await engine.command("CreateWorkspace", _small("create-2"))
    await engine.store.transact(schedule_pending)
    other_instance = (await engine.workspace(other.id)).instance_id or ""
    await engine.store.transact(controller.apply, LaunchFailed(other_instance, 1, "mkfs failed"))
    assert (await engine.workspace(other.id)).state is WorkspaceState.FAILED


async def test_a_process_killed_over_the_guests_memory_is_an_event_and_the_workspace_runs_on(engine: Engine) -> None:
    await _with_node(engine)
    workspace, _ = await engine.command("CreateWorkspace", _small("create-1"))
    await engine.store.transact(schedule_pending)
    instance_id = (await engine.workspace(workspace.id)).instance_id or ""
    await engine.store.transact(controller.apply, Launched(instance_id, 1))
    await engine.store.transact(controller.apply, GuestOomKill(instance_id, pid=4242, command="python3"))
    after = await engine.workspace(workspace.id)
    assert after.state is WorkspaceState.AVAILABLE and after.failure is None and after.last_stop is None
    events = await engine.store.read(lambda r: r.list_events(workspace.id, 0, 100))
    [kill] = [e for e in events if e.type is EventType.GUEST_OOM_KILL]
    assert kill.message.startswith("OOM: killed PID 4242 (python3)")
