"""The report table (engine/controller.py FOLDS): every report type has exactly one fold,
and reports fold into instance, workspace and command in process, on a real SQLite store."""

from __future__ import annotations

from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.domain import reports
from kibo_ctrl.domain.model import CommandState, Component, Instance, Phase, StopDurability, WorkspaceState
from kibo_ctrl.domain.nodes import NodeRecord
from kibo_ctrl.domain.reports import (
    Destroyed,
    GuestReset,
    GuestResponding,
    Launched,
    LaunchFailed,
    Report,
    Restarted,
    StopFailed,
    Stopped,
    VmmExited,
)
from kibo_ctrl.engine import controller
from kibo_ctrl.store.base import Tx

from tests.unit.engine_harness import Engine, engine

__all__ = ["engine"]


def _report_types() -> set[type[Report]]:
    found: set[type[Report]] = set()
    pending = [Report]
    while pending:
        for sub in pending.pop().__subclasses__():
            found.add(sub)
            pending.append(sub)
    return found


def test_every_report_type_has_exactly_one_fold() -> None:
    declared = {value for value in vars(reports).values() if isinstance(value, type) and issubclass(value, Report)}
    assert declared - {Report} <= _report_types()
    # A dict has one fold per key; every report type is a key, and nothing else is.
    assert set(controller.FOLDS) == _report_types()
    assert len(set(controller.FOLDS.values())) == len(controller.FOLDS), "one fold serves two report types"


async def _instance(engine: Engine, instance_id: str) -> Instance:
    found = await engine.store.read(lambda r: r.get_instance(instance_id))
    assert found is not None
    return found


async def _stop(engine: Engine, workspace_id: str, mode: int = ws.STOP_MODE_GRACEFUL) -> None:
    message = ws.StopWorkspaceRequest(workspace_id=workspace_id, mode=mode)
    message.metadata.command_id = f"stop-{mode}"
    await engine.command("StopWorkspace", message)


async def test_launched_finishes_the_create(engine: Engine) -> None:
    workspace, created = await engine.create()
    await engine.store.transact(controller.apply, Launched(instance_id=workspace.instance_id or ""))
    after = await engine.workspace(workspace.id)
    assert after.state is WorkspaceState.AVAILABLE and after.failure is None and after.active_command is None
    assert (await engine.command_record(created)).state is CommandState.SUCCEEDED
    assert (await _instance(engine, workspace.instance_id or "")).phase is Phase.RUNNING


async def test_launch_failed_fails_the_create_and_names_the_stage(engine: Engine) -> None:
    workspace, created = await engine.create()
    await engine.store.transact(
        controller.apply, LaunchFailed(instance_id=workspace.instance_id or "", message="no image")
    )
    after = await engine.workspace(workspace.id)
    assert after.state is WorkspaceState.FAILED
    assert after.failure is not None and (after.failure.stage, after.failure.message) == ("CREATE", "no image")
    assert after.release_pending_since is None  # it holds nothing: nothing to release
    assert (await engine.command_record(created)).state is CommandState.FAILED


async def test_a_stop_folds_to_stopped_with_its_durability(engine: Engine) -> None:
    workspace, _ = await engine.create()
    instance_id = workspace.instance_id or ""
    await engine.store.transact(controller.apply, Launched(instance_id=instance_id))
    revision = (await engine.workspace(workspace.id)).data_plane_revision
    await _stop(engine, workspace.id)
    stopping = await engine.workspace(workspace.id)
    assert stopping.state is WorkspaceState.STOPPING and stopping.release_pending_since is not None
    assert stopping.data_plane_revision == revision + 1  # the stop ended every credential
    step = (await _instance(engine, instance_id)).step
    await engine.store.transact(controller.apply, Stopped(instance_id=instance_id, step=step))
    stopped = await engine.workspace(workspace.id)
    assert stopped.state is WorkspaceState.STOPPED and stopped.release_pending_since is None
    assert stopped.last_stop is not None and stopped.last_stop.durability is StopDurability.CONFIRMED


async def test_a_report_for_a_superseded_step_is_ignored(engine: Engine) -> None:
    workspace, _ = await engine.create()
    instance_id = workspace.instance_id or ""
    await engine.store.transact(controller.apply, Launched(instance_id=instance_id))
    await _stop(engine, workspace.id)
    step = (await _instance(engine, instance_id)).step
    await engine.store.transact(controller.apply, StopFailed(instance_id=instance_id, step=step - 1, message="x"))
    assert (await engine.workspace(workspace.id)).state is WorkspaceState.STOPPING


async def test_a_failed_stop_fails_the_workspace_at_stage_stop(engine: Engine) -> None:
    workspace, _ = await engine.create()
    instance_id = workspace.instance_id or ""
    await engine.store.transact(controller.apply, Launched(instance_id=instance_id))
    await _stop(engine, workspace.id)
    step = (await _instance(engine, instance_id)).step
    await engine.store.transact(controller.apply, StopFailed(instance_id=instance_id, step=step, message="stuck"))
    after = await engine.workspace(workspace.id)
    assert after.failure is not None and (after.failure.stage, after.failure.message) == ("STOP", "stuck")
    assert after.active_command is None


async def test_a_host_oom_owes_a_force_stop_that_starts_at_once(engine: Engine) -> None:
    workspace, _ = await engine.create()
    instance_id = workspace.instance_id or ""
    await engine.store.transact(controller.apply, Launched(instance_id=instance_id))
    revision = (await engine.workspace(workspace.id)).data_plane_revision
    oom = VmmExited(instance_id=instance_id, reason=reports.ExitReason.HOST_OOM)
    await engine.store.transact(controller.apply, oom)
    after = await engine.workspace(workspace.id)
    assert after.failure is not None and after.release_pending_since is not None
    assert after.owed_stop is None  # started already: no other command was in progress
    assert after.active_command is not None and after.active_command.startswith("host-memory/")
    # Owing the stop and starting it each ended every credential.
    assert after.data_plane_revision == revision + 2 and not after.guest.responding


async def test_a_fourth_guest_reset_within_the_window_fails_the_workspace(engine: Engine) -> None:
    workspace, _ = await engine.create()
    instance_id = workspace.instance_id or ""
    await engine.store.transact(controller.apply, Launched(instance_id=instance_id))
    for count in range(1, controller.MAX_RESETS + 1):
        await engine.store.transact(controller.apply, GuestReset(instance_id=instance_id))
        restarting = await engine.workspace(workspace.id)
        assert (restarting.guest.reset_count, restarting.guest.responding) == (count, False)
        assert restarting.failure is None
        assert (await _instance(engine, instance_id)).phase is Phase.RESTARTING
        await engine.store.transact(controller.apply, Restarted(instance_id=instance_id))
        assert (await engine.workspace(workspace.id)).guest.responding
    await engine.store.transact(controller.apply, GuestReset(instance_id=instance_id))
    failed = await engine.workspace(workspace.id)
    assert failed.state is WorkspaceState.FAILED and failed.release_pending_since is not None
    assert failed.failure is not None and "resets within 10 minutes" in failed.failure.message
    assert (await _instance(engine, instance_id)).phase is Phase.EXITED


async def _on_silent_node(engine: Engine) -> tuple[str, str]:
    """A running workspace on node-1, then node-1's lease lapsed: recorded silent, the
    workspace UNKNOWN (as NodeRegistry._expire does)."""
    workspace, _ = await engine.create()
    instance_id = workspace.instance_id or ""

    def place(tx: Tx) -> None:
        tx.put_node(NodeRecord("node-1", 8, 8192, "local"))
        instance = tx.get_instance(instance_id)
        assert instance is not None
        instance.node_id, instance.phase, instance.holds = "node-1", Phase.SCHEDULED, [Component.RESERVATION]
        tx.put_instance(instance)

    def lapse(tx: Tx) -> None:
        record = tx.get_node("node-1")
        assert record is not None
        record.silent = True
        tx.put_node(record)
        controller.set_node_silent(tx, "node-1", True)

    await engine.store.transact(place)
    await engine.store.transact(controller.apply, Launched(instance_id=instance_id))
    await engine.store.transact(lapse)
    assert (await engine.workspace(workspace.id)).state is WorkspaceState.UNKNOWN
    return workspace.id, instance_id


async def test_a_report_from_a_node_recorded_silent_leaves_its_workspace_unknown(engine: Engine) -> None:
    """Simulation seed 10074: node-3 was back for a moment, its report went through before
    its lease was renewed, and it fell silent again. The report ended the workspace's
    UNKNOWN while the node stayed recorded silent: AVAILABLE on a silent node. The node's
    record decides; its renewal ends every UNKNOWN of the node together."""
    workspace_id, instance_id = await _on_silent_node(engine)
    await engine.store.transact(controller.apply, GuestResponding(instance_id=instance_id, responding=True))
    after = await engine.workspace(workspace_id)
    assert after.node_silent and after.state is WorkspaceState.UNKNOWN
    # Its renewal (NodeRegistry._renew_record): the node is back, and so is the workspace.
    await engine.store.transact(controller.set_node_silent, "node-1", False)
    assert (await engine.workspace(workspace_id)).state is WorkspaceState.AVAILABLE


async def test_a_report_that_leaves_nothing_on_a_silent_node_ends_the_unknown(engine: Engine) -> None:
    """The one report from a node recorded silent that settles its workspace: the instance
    has nothing left on the node (the node's return would not find it among the node's
    instances), and the report confirms the state. Here: deleted while its node is silent,
    and the node's Destroyed report came through."""
    workspace_id, instance_id = await _on_silent_node(engine)
    message = ws.DeleteWorkspaceRequest(workspace_id=workspace_id)
    message.metadata.command_id = "delete-1"
    await engine.command("DeleteWorkspace", message)
    assert (await engine.workspace(workspace_id)).node_silent
    await engine.store.transact(controller.apply, Destroyed(instance_id=instance_id))
    after = await engine.workspace(workspace_id)
    assert not (await _instance(engine, instance_id)).active
    assert not after.node_silent and after.state is WorkspaceState.DELETED
