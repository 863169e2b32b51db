"""Cleanup status read off the machine (issue 5): with `--runtime process`, GetWorkspaceCleanup
shows what the OS shows now (supervisor process, the guest's namespaces, cgroup, layer and
volume directories), not only what the store remembers. Plus unit tests of
`cleanup.with_observation`, the pure step that puts an observation over the derived status.

Needs root and bubblewrap, like tests/system/test_process_runtime.py (whose helpers it uses)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo_ctrl.domain import cleanup
from kibo_ctrl.domain.model import (
    EXECUTION_PARTS,
    Binding,
    CleanupCompleteness,
    CleanupSource,
    CleanupState,
    CommandKind,
    Component,
    ComponentStatus,
    Instance,
    Resources,
    StoragePending,
    Workspace,
    WorkspaceState,
)

from tests.client import Client, S
from tests.server import ServerProcess
from tests.system.guest_net_hosts import netns_names
from tests.system.test_guest_network import netns_of
from tests.system.test_process_runtime import (
    SMALL,
    _alive,
    instance_dir,
    sandbox_server,
    state,
)

INSTANCE = obs.CLEANUP_COMPONENT_INSTANCE
RESERVATION = obs.CLEANUP_COMPONENT_RESERVATION
GUEST_PARTS = (
    obs.CLEANUP_COMPONENT_LAYER_MOUNT,
    obs.CLEANUP_COMPONENT_NETWORK,
    obs.CLEANUP_COMPONENT_VOLUME_ATTACHMENT,
)
LAYER = obs.CLEANUP_COMPONENT_RETAINED_LAYER
VOLUMES = obs.CLEANUP_COMPONENT_VOLUME_DELETION
RELEASED = obs.COMPONENT_STATUS_RELEASED
PRESENT = obs.COMPONENT_STATUS_PRESENT
FROM_NODE = obs.CLEANUP_SOURCE_NODE_REPORT


# -- against the machine --------------------------------------------------------------------


@pytest.fixture(scope="module")
def os_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory, "--backend", "firecracker") as server:
        yield server


@pytest.fixture
async def oc(os_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(os_server.address) as connected:
        yield connected


def by_kind(found: obs.WorkspaceCleanup) -> dict[int, obs.CleanupComponentStatus]:
    return {row.component: row for row in found.components}


def seen_now(row: obs.CleanupComponentStatus, since: float) -> bool:
    """The row was read off the machine during this call (not remembered from earlier)."""
    return row.source == FROM_NODE and row.observe_time.ToDatetime().timestamp() >= since - 1


async def cleanup_until(
    client: Client, workspace_id: str, check: Callable[[dict[int, obs.CleanupComponentStatus]], bool]
) -> obs.WorkspaceCleanup:
    deadline = time.monotonic() + 15
    while not check(by_kind(found := await client.cleanup(workspace_id))):
        assert time.monotonic() < deadline, f"timed out; the cleanup status is {found}"
        await asyncio.sleep(0.02)
    return found


def cgroup_dirs(server: ServerProcess, workspace: wp.Workspace) -> list[Path]:
    spec = json.loads((instance_dir(server, workspace) / "spec.json").read_text())
    return [Path(d) for d in spec["cgroup_dirs"]]


def files(server: ServerProcess, workspace: wp.Workspace) -> tuple[Path, Path]:
    volume = next(b.volume_id for b in workspace.spec.volumes if b.mount_path == "/data")
    return server.data_dir / "layers" / workspace.workspace_id, server.data_dir / "volumes" / volume


async def test_a_running_workspace_is_read_off_the_machine(oc: Client, os_server: ServerProcess) -> None:
    workspace = await oc.create(resources=SMALL)
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
    before = time.time()
    rows = by_kind(await oc.cleanup(workspace.workspace_id))
    for kind in (INSTANCE, RESERVATION, *GUEST_PARTS, LAYER, VOLUMES):
        assert rows[kind].status == PRESENT, rows[kind]
        # The store alone says CONTROL_PLANE for the layer and volumes: NODE_REPORT now means the OS.
        assert seen_now(rows[kind], before), rows[kind]
    assert all(d.is_dir() for d in cgroup_dirs(os_server, workspace))

    # Stopped: everything of the execution is gone from the machine; the layer stays.
    await oc.stop(workspace.workspace_id)
    await oc.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_STOPPED)
    layer, volume = files(os_server, workspace)
    rows = by_kind(await oc.cleanup(workspace.workspace_id))
    for kind in (INSTANCE, RESERVATION, *GUEST_PARTS):
        assert rows[kind].status == RELEASED, rows[kind]
    assert rows[LAYER].status == PRESENT and layer.is_dir(), rows[LAYER]
    assert rows[VOLUMES].status == PRESENT and volume.is_dir(), rows[VOLUMES]
    assert not any(d.exists() for d in cgroup_dirs(os_server, workspace))

    # Deleted and the storage released: the directories are really gone, and so they show.
    await oc.delete(workspace.workspace_id)
    found = await cleanup_until(
        oc, workspace.workspace_id, lambda r: r[LAYER].status == RELEASED and r[VOLUMES].status == RELEASED
    )
    assert not layer.exists() and not volume.exists()
    assert found.state == obs.CLEANUP_STATE_COMPLETE, found


async def test_a_killed_supervisor_shows_released_at_once(oc: Client, os_server: ServerProcess) -> None:
    workspace = await oc.create(resources=SMALL)
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
    supervisor = int(state(os_server, workspace)["supervisor_pid"])
    guest = int(state(os_server, workspace)["guest_pid"])
    os.kill(supervisor, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _alive(supervisor):  # a zombie counts as gone
        assert time.monotonic() < deadline, "the supervisor survives SIGKILL"
        await asyncio.sleep(0.005)
    # No waiting for the store: the very next read shows it.
    before = time.time()
    rows = by_kind(await oc.cleanup(workspace.workspace_id))
    assert rows[INSTANCE].status == RELEASED and seen_now(rows[INSTANCE], before), rows[INSTANCE]
    assert rows[RESERVATION].status == PRESENT, rows[RESERVATION]
    assert rows[LAYER].status == PRESENT, rows[LAYER]
    assert all(d.is_dir() for d in cgroup_dirs(os_server, workspace))

    # The guest dies with its supervisor; its namespaces and mounts go with it, but not its
    # network: the slot (namespace, veth, rules) is the node's, held until the instance is
    # released (a force stop or a delete), as the machine shows (issue 28).
    mounts = [k for k in GUEST_PARTS if k != obs.CLEANUP_COMPONENT_NETWORK]
    await cleanup_until(oc, workspace.workspace_id, lambda r: all(r[k].status == RELEASED for k in mounts))
    assert not _alive(guest)
    rows = by_kind(await oc.cleanup(workspace.workspace_id))
    assert rows[obs.CLEANUP_COMPONENT_NETWORK].status == PRESENT, rows[obs.CLEANUP_COMPONENT_NETWORK]
    assert netns_of(os_server.data_dir, workspace.workspace_id) in netns_names()
    # The store learns of it (FAILED, the instance keeps its parts on record); the OS view still wins.
    await oc.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_FAILED)
    rows = by_kind(await oc.cleanup(workspace.workspace_id))
    assert rows[INSTANCE].status == RELEASED and rows[RESERVATION].status == PRESENT, rows

    netns = netns_of(os_server.data_dir, workspace.workspace_id)
    await oc.delete(workspace.workspace_id)
    layer, volume = files(os_server, workspace)
    await cleanup_until(oc, workspace.workspace_id, lambda r: all(row.status == RELEASED for row in r.values()))
    assert not layer.exists() and not volume.exists()
    assert netns not in netns_names()


# -- with_observation, unit -------------------------------------------------------------------

NOW = 1_000_000.0
ALL = {part: True for part in EXECUTION_PARTS} | {Component.RETAINED_LAYER: True, Component.VOLUME_DELETION: True}
NONE = dict.fromkeys(ALL, False)


def _workspace(**fields: Any) -> Workspace:
    base: dict[str, Any] = {
        "id": "ws-1",
        "seq": 1,
        "state": WorkspaceState.AVAILABLE,
        "resources": Resources(2, 2048, 10),
        "bindings": [Binding("vol-own", "/data", True)],
        "create_time": NOW - 100,
        "update_time": NOW - 10,
        "storage_pool": "local",
        "instance_id": "ws-1-g1",
    }
    base.update(fields)
    return Workspace(**base)


def _instance(holds: list[Component], observe: float | None = NOW - 5) -> Instance:
    return Instance(
        id="ws-1-g1",
        workspace_id="ws-1",
        generation=1,
        vcpus=2,
        memory_mib=2048,
        create_time=NOW - 100,
        step=1,
        done_step=1,
        node_id="node-1",
        holds=holds,
        observe_time=observe,
    )


def _observed(workspace: Workspace, instance: Instance | None, seen: dict[Component, bool]) -> cleanup.Cleanup:
    return cleanup.with_observation(workspace, cleanup.derive(workspace, instance, NOW), seen, NOW)


def _statuses(result: cleanup.Cleanup) -> dict[Component, ComponentStatus]:
    return {row.component: row.status for row in result.components}


def test_no_observation_changes_nothing() -> None:
    workspace, instance = _workspace(), _instance(list(EXECUTION_PARTS))
    derived = cleanup.derive(workspace, instance, NOW)
    assert cleanup.with_observation(workspace, derived, None, NOW) == derived
    assert cleanup.with_observation(workspace, derived, {}, NOW) == derived


def test_observed_parts_override_the_store_and_others_stay() -> None:
    workspace, instance = _workspace(), _instance(list(EXECUTION_PARTS))
    result = _observed(workspace, instance, {Component.INSTANCE: False, Component.RETAINED_LAYER: True})
    rows = {row.component: row for row in result.components}
    assert rows[Component.INSTANCE] == cleanup.ComponentRow(
        Component.INSTANCE, ComponentStatus.RELEASED, CleanupSource.NODE_REPORT, NOW
    )
    assert rows[Component.RETAINED_LAYER].source is CleanupSource.NODE_REPORT
    assert rows[Component.RETAINED_LAYER].observe_time == NOW
    # Not observed: as derived from the store.
    assert rows[Component.RESERVATION] == cleanup.ComponentRow(
        Component.RESERVATION, ComponentStatus.PRESENT, CleanupSource.NODE_REPORT, NOW - 5
    )
    assert rows[Component.VOLUME_DELETION].source is CleanupSource.CONTROL_PLANE
    # Held parts of a running workspace are expected: nothing to release.
    assert (result.state, result.completeness) == (CleanupState.COMPLETE, CleanupCompleteness.COMPLETE)


def test_a_part_the_store_thinks_held_but_gone_completes_a_failed_workspace() -> None:
    workspace = _workspace(state=WorkspaceState.FAILED)
    instance = _instance(list(EXECUTION_PARTS))
    assert cleanup.derive(workspace, instance, NOW).state is CleanupState.NEEDS_ATTENTION
    result = _observed(workspace, instance, {part: False for part in EXECUTION_PARTS})
    assert result.state is CleanupState.COMPLETE
    assert result.pending_since is None and result.last_confirmed_time is None


def test_a_part_the_store_thinks_released_but_present_needs_attention() -> None:
    workspace, instance = _workspace(state=WorkspaceState.STOPPED), _instance([])
    assert cleanup.derive(workspace, instance, NOW).state is CleanupState.COMPLETE
    result = _observed(workspace, instance, {Component.RESERVATION: True})
    assert _statuses(result)[Component.RESERVATION] is ComponentStatus.PRESENT
    assert result.state is CleanupState.NEEDS_ATTENTION
    assert result.last_confirmed_time == NOW and result.pending_since is not None


def test_while_stopping_a_held_part_is_processing() -> None:
    workspace = _workspace(active_kind=CommandKind.STOP, release_pending_since=NOW - 3)
    result = _observed(workspace, _instance([]), {Component.INSTANCE: True})
    assert result.state is CleanupState.PROCESSING
    assert result.pending_since == NOW - 3


def test_a_silent_node_observed_is_known() -> None:
    workspace = _workspace(node_silent=True)
    never_reported = _instance(list(EXECUTION_PARTS), observe=None)
    derived = cleanup.derive(workspace, never_reported, NOW)
    assert (derived.state, derived.completeness) == (CleanupState.UNKNOWN, CleanupCompleteness.UNKNOWN)
    # Only some parts seen: the rest stays unknown, never released.
    partly = _observed(workspace, never_reported, {Component.INSTANCE: True})
    assert partly.completeness is CleanupCompleteness.UNKNOWN
    assert _statuses(partly)[Component.RESERVATION] is ComponentStatus.UNKNOWN
    seen = _observed(workspace, never_reported, {part: True for part in EXECUTION_PARTS})
    assert seen.completeness is CleanupCompleteness.COMPLETE
    assert seen.state is CleanupState.COMPLETE


def test_deleted_storage_pending_in_the_store_but_gone_on_disk_is_complete() -> None:
    workspace = _workspace(
        state=WorkspaceState.DELETED,
        deleted=True,
        deletion_started=True,
        instance_id=None,
        storage=StoragePending(layer=True, volume_ids=["vol-own"], since=NOW - 2),
    )
    derived = cleanup.derive(workspace, None, NOW)
    assert derived.state is CleanupState.PROCESSING
    assert _observed(workspace, None, ALL).state is CleanupState.PROCESSING
    result = _observed(workspace, None, NONE)
    assert all(status is ComponentStatus.RELEASED for status in _statuses(result).values())
    assert result.state is CleanupState.COMPLETE


def test_an_observed_part_without_a_row_adds_none() -> None:
    workspace = _workspace(bindings=[Binding("vol-shared", "/data", False)])
    result = _observed(workspace, _instance(list(EXECUTION_PARTS)), ALL)
    assert Component.VOLUME_DELETION not in _statuses(result)
