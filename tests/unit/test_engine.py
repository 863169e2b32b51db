"""The engine in process, on a real SQLite store in a temporary directory: no server, no
runtime, no transport. A command is handled by `Service.execute` in one transaction, a node's
report is folded by `controller.apply` in another, exactly as `api/` and the node agent call
them; each test takes milliseconds.

What the engine must do is lifecycle.md's ("Commands", "How status is derived"); the wire
behaviour of the same paths is in tests/integration/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kibo_ctrl.domain.errors import CommandIdReused, Conflict
from kibo_ctrl.domain.model import (
    Command,
    CommandKind,
    CommandState,
    Instance,
    NetworkPolicy,
    Node,
    Phase,
    Resources,
    StopCause,
    StopDurability,
    Workspace,
    WorkspaceState,
)
from kibo_ctrl.domain.reports import Launched, Stopped
from kibo_ctrl.engine import controller
from kibo_ctrl.engine.scheduler import schedule_pending
from kibo_ctrl.engine.service import CommandRequest, CreateSpec, Service, Settings
from kibo_ctrl.store.base import Reader, Tx
from kibo_ctrl.store.sqlite import SqliteStore

NODE = Node("node-1", vcpus=4, memory_mib=4096, storage_pool="local-node-1")
SPEC = CreateSpec(
    resources=Resources(vcpus=1, memory_mib=512, writable_layer_gib=1),
    labels={"team": "unit"},
    annotations={},
    bindings=[],
    network_policy=NetworkPolicy(),
    data_volume_gib=1,
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(tmp_path / "kibo.db")
    yield opened
    await opened.close()


@pytest.fixture
def service() -> Service:
    return Service(Settings(storage_pool="local"))


def create(command_id: str = "create-1", fingerprint: str = "create-1") -> CommandRequest:
    return CommandRequest(CommandKind.CREATE, command_id, fingerprint, create=SPEC)


def stop(workspace_id: str, command_id: str = "stop-1") -> CommandRequest:
    return CommandRequest(CommandKind.STOP, command_id, command_id, workspace_id=workspace_id)


def snapshot(reader: Reader, workspace_id: str, command_id: str) -> tuple[Workspace, Command, Instance]:
    """The workspace, one of its commands and its current instance, as stored."""
    workspace = reader.get_workspace(workspace_id)
    command = reader.get_command("default", command_id)
    assert workspace is not None and command is not None and workspace.instance_id is not None
    instance = reader.get_instance(workspace.instance_id)
    assert instance is not None
    return workspace, command, instance


def workspace_count(reader: Reader) -> int:
    return reader.count_workspaces()


def command_of(reader: Reader, command_id: str) -> Command | None:
    return reader.get_command("default", command_id)


def schedule(tx: Tx) -> int:
    return schedule_pending(tx, [NODE])


async def running_workspace(store: SqliteStore, service: Service) -> Workspace:
    """A workspace created, scheduled on NODE and launched: AVAILABLE."""
    workspace, command = await store.transact(service.execute, create())
    await store.transact(schedule)
    _, _, instance = await store.read(snapshot, workspace.id, command.id)
    await store.transact(controller.apply, Launched(instance.id, instance.step))
    return workspace


async def test_create_records_the_workspace_its_pending_command_and_an_unscheduled_instance(
    store: SqliteStore, service: Service
) -> None:
    workspace, command = await store.transact(service.execute, create())

    stored, stored_command, instance = await store.read(snapshot, workspace.id, command.id)
    assert stored.state is WorkspaceState.CREATING
    assert stored.labels == {"team": "unit"}
    assert stored_command.kind is CommandKind.CREATE and stored_command.state is CommandState.PENDING
    assert stored.active_command == command.id
    assert instance.phase is Phase.PENDING and instance.node_id is None
    # Its own data volume, mounted at /data, deleted with it.
    [own] = stored.bindings
    assert own.mount_path == "/data" and own.delete_with_workspace


async def test_a_resent_create_answers_the_same_workspace_and_a_reused_command_id_is_refused(
    store: SqliteStore, service: Service
) -> None:
    first, _ = await store.transact(service.execute, create())
    again, command = await store.transact(service.execute, create())
    assert again.id == first.id and command.id == "create-1"
    assert await store.read(workspace_count) == 1

    with pytest.raises(CommandIdReused) as refused:
        await store.transact(service.execute, create(fingerprint="another request"))
    assert refused.value.field == "metadata.command_id"
    assert await store.read(workspace_count) == 1


async def test_reports_fold_a_create_into_available_and_a_stop_into_stopped(
    store: SqliteStore, service: Service
) -> None:
    workspace, create_command = await store.transact(service.execute, create())
    assert await store.transact(schedule) == 0
    scheduled, _, instance = await store.read(snapshot, workspace.id, create_command.id)
    assert instance.node_id == NODE.id and instance.phase is Phase.SCHEDULED
    assert scheduled.state is WorkspaceState.CREATING

    await store.transact(controller.apply, Launched(instance.id, instance.step))
    available, create_command, instance = await store.read(snapshot, workspace.id, create_command.id)
    assert available.state is WorkspaceState.AVAILABLE
    assert create_command.state is CommandState.SUCCEEDED and available.active_command is None
    assert instance.phase is Phase.RUNNING and instance.done_step == instance.step

    _, stop_command = await store.transact(service.execute, stop(workspace.id))
    stopping, stop_command, instance = await store.read(snapshot, workspace.id, stop_command.id)
    assert stopping.state is WorkspaceState.STOPPING and stop_command.state is CommandState.PENDING
    assert instance.done_step < instance.step  # the node has a step to take

    await store.transact(controller.apply, Stopped(instance.id, instance.step, StopDurability.CONFIRMED))
    stopped, stop_command, _ = await store.read(snapshot, workspace.id, stop_command.id)
    assert stopped.state is WorkspaceState.STOPPED
    assert stop_command.state is CommandState.SUCCEEDED and stop_command.durability is StopDurability.CONFIRMED
    assert stopped.last_stop is not None
    assert (stopped.last_stop.cause, stopped.last_stop.durability) == (StopCause.REQUESTED, StopDurability.CONFIRMED)


async def test_a_report_answering_a_superseded_step_changes_nothing(store: SqliteStore, service: Service) -> None:
    workspace = await running_workspace(store, service)
    _, stop_command = await store.transact(service.execute, stop(workspace.id))
    before, _, instance = await store.read(snapshot, workspace.id, stop_command.id)

    # A late answer to the launch step (step 1), after the stop moved the instance on.
    await store.transact(controller.apply, Stopped(instance.id, instance.step - 1))

    after, stop_command, instance_after = await store.read(snapshot, workspace.id, stop_command.id)
    assert after.state is WorkspaceState.STOPPING and stop_command.state is CommandState.PENDING
    assert instance_after.done_step == instance.done_step and after.update_time == before.update_time


async def test_stopping_a_stopped_workspace_is_refused_by_the_state_table_and_records_nothing(
    store: SqliteStore, service: Service
) -> None:
    workspace = await running_workspace(store, service)
    await store.transact(service.execute, stop(workspace.id))
    _, _, instance = await store.read(snapshot, workspace.id, "stop-1")
    await store.transact(controller.apply, Stopped(instance.id, instance.step))

    with pytest.raises(Conflict) as refused:
        await store.transact(service.execute, stop(workspace.id, command_id="stop-2"))
    assert refused.value.state == "STOPPED"
    assert await store.read(command_of, "stop-2") is None


async def test_what_a_transaction_committed_is_there_after_the_store_is_reopened(
    tmp_path: Path, service: Service
) -> None:
    path = tmp_path / "reopened" / "kibo.db"
    store = await SqliteStore.open(path)
    try:
        workspace, command = await store.transact(service.execute, create())
    finally:
        await store.close()
    reopened = await SqliteStore.open(path)
    try:
        stored, stored_command, _ = await reopened.read(snapshot, workspace.id, command.id)
    finally:
        await reopened.close()
    assert stored.state is WorkspaceState.CREATING and stored_command.state is CommandState.PENDING
