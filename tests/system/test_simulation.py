"""The deterministic simulation (kibo_ctrl.simulate, issue 17): fixed seeds hold every
invariant, the seeds that found engine bugs stay fixed, a bug put in on purpose is found
and replays from its seed, and a seed always gives the same history."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from kibo_ctrl.domain.errors import StoreError
from kibo_ctrl.domain.model import Component, Event, EventType, WorkspaceState
from kibo_ctrl.domain.reports import Destroyed, Report
from kibo_ctrl.engine import controller
from kibo_ctrl.engine.hub import Hub
from kibo_ctrl.engine.node_registry import NodeRegistry
from kibo_ctrl.simulate.__main__ import main
from kibo_ctrl.simulate.loop import VirtualClock, VirtualTimeLoop
from kibo_ctrl.simulate.run import Outcome, shrink, simulate, violation_kind
from kibo_ctrl.simulate.store import LoopStore
from kibo_ctrl.store.base import Changes, Tx

STEPS = 300
SEEDS = range(100, 116)


@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_seed_holds_every_invariant(seed: int) -> None:
    outcome = simulate(seed, STEPS)
    assert outcome.ok, "\n".join([*outcome.history[-60:], f"violation: {outcome.violation}"])


# Seeds that found engine bugs (each failed before its fix; see the commit messages):
#  2: SQLITE_FULL rolled the batch back, the store answered "no such savepoint" (INTERNAL);
#  7: a guest reset during a stalled graceful stop restarted the guest: STOPPING forever;
# 11: a deleted workspace's storage release ended for good on a full disk: never released;
# 13: a VMM-exit report queued while the node was silent, applied after the delete,
#     marked the destroyed instance held: a DELETED workspace kept its reservation;
# 42: a guest reset after the VM started but before its Launched report was stored
#     superseded the launch's step: the create stayed RUNNING (CREATING) forever;
# 2043: a VMM exit reported before the launch's own (delayed) report: the late Launched
#     marked the exited instance RUNNING, FAILED -> AVAILABLE with a dead guest;
# 3007: asyncio.wait_for (Python 3.11) swallowed the expiry loop's cancel at a crash: the
#     loop ran on into the dead store and the restart waited for it forever (a deadlock);
# 4270: as 2043, through a late Progress report: it set the exited instance LAUNCHING.
# 10005 (at step 4354; first found as 10074, which a later scheduler change moved away from
#     it): a node back for a moment sent a report before its lease was renewed, then fell
#     silent again; the report ended its workspace's UNKNOWN while the node stayed recorded
#     silent: AVAILABLE on a silent node (also replayed directly: tests/unit/test_report_folds.py).
@pytest.mark.parametrize(
    ("seed", "steps"),
    [(2, 1000), (7, 1000), (11, 1000), (13, 1000), (42, 1000), (2043, 1000), (3007, 1000), (4270, 1000), (10005, 4400)],
)
def test_regression_seed(seed: int, steps: int) -> None:
    outcome = simulate(seed, steps)
    assert outcome.ok, "\n".join([*outcome.history[-60:], f"violation: {outcome.violation}"])


def test_a_violation_kind_leaves_out_ids_and_numbers() -> None:
    """What the shrinker keeps (simulate/run.py shrink): a trial that fails in another way is
    not a smaller replay of the same bug (it once shrank a silent-node violation to a false
    alarm of the checker)."""

    def failed(violation: str) -> Outcome:
        return Outcome(1, 10, [], "", violation, 3, 0.0)

    one = failed("ws-15d2bf5b4c1d4cd68d0a runs on silent node node-3 but does not show it silent; x")
    other = failed("ws-00aa11bb22cc33dd44ee runs on silent node node-1 but does not show it silent")
    assert violation_kind(one) == violation_kind(other)
    assert violation_kind(one) != violation_kind(
        failed("node node-3 is cut off past its lease but not recorded silent")
    )


def test_same_seed_same_history() -> None:
    first, second, other = simulate(5, 200), simulate(5, 200), simulate(6, 200)
    assert first.history == second.history
    assert first.digest == second.digest
    assert other.digest != first.digest


@pytest.mark.parametrize("seed", [5, 2043])
def test_warp_skips_idle_ticks_and_changes_nothing(seed: int) -> None:
    """The loop skips heartbeat ticks that provably change nothing (simulate/loop.py): the
    history, every virtual time in it, is the one a run of every tick writes."""
    warped, ticked = simulate(seed, 1000), simulate(seed, 1000, warp=False)
    assert warped.ok and ticked.ok
    assert warped.warped_s > 0.5 * warped.virtual_s and ticked.warped_s == 0
    assert warped.history == ticked.history


@contextlib.contextmanager
def _leaky_destroy() -> Iterator[None]:
    """The bug put in on purpose: every third Destroyed report leaves the reservation held
    (the rare path that forgets to release it)."""
    real = controller.apply
    seen = [0]

    def apply(tx: Tx, report: Report) -> None:
        real(tx, report)
        if isinstance(report, Destroyed):
            seen[0] += 1
            instance = tx.get_instance(report.instance_id)
            if seen[0] % 3 == 0 and instance is not None and not instance.holds:
                instance.holds = [Component.RESERVATION]
                tx.put_instance(instance)

    with mock.patch.object(controller, "apply", apply):
        yield


def test_injected_bug_is_found_replayed_and_shrunk() -> None:
    steps = 120
    found = simulate(1, steps, bug=_leaky_destroy)
    assert not found.ok
    assert found.violation is not None and "RESERVATION" in found.violation
    # Without the bug the same seed holds: the violation is the bug's.
    assert simulate(1, steps).ok
    again = simulate(1, steps, bug=_leaky_destroy)
    assert (again.digest, again.violation) == (found.digest, found.violation)
    keep, shrunk = shrink(1, steps, found, bug=_leaky_destroy, budget=12)
    assert not shrunk.ok and len(keep) < steps
    # Shrunk to the same kind of violation, not to another one met on the way.
    assert violation_kind(shrunk) == violation_kind(found)
    assert not simulate(1, steps, keep=keep, bug=_leaky_destroy).ok


@contextlib.contextmanager
def _watchers_miss_stopped() -> Iterator[None]:
    """Another bug put in on purpose: the hub tells watchers of every change but STOPPED."""
    real = Hub.publish

    def publish(self: Hub, changes: Changes) -> None:
        changes.workspace_history = [w for w in changes.workspace_history if w.state is not WorkspaceState.STOPPED]
        real(self, changes)

    with mock.patch.object(Hub, "publish", publish):
        yield


def test_a_watch_that_misses_a_change_is_found() -> None:
    found = simulate(1, 120, bug=_watchers_miss_stopped)
    assert not found.ok
    assert found.violation is not None and "a watcher saw" in found.violation and "STOPPED" in found.violation


@contextlib.contextmanager
def _silent_mark_forgotten_on_full_disk() -> Iterator[None]:
    """The bug the old in-memory Liveness had (reports/sim.md): a node is taken as marked
    silent before its mark is stored, so a mark that fails on a full disk is never retried
    and the node's workspaces stay AVAILABLE while it is cut off."""
    real = NodeRegistry._expire

    def expire(self: NodeRegistry, tx: Tx, nodes: list[str], now: float) -> tuple[list[str], dict[str, float]]:
        for node in nodes:
            self._silent[node] = True
        return real(self, tx, nodes, now)

    with mock.patch.object(NodeRegistry, "_expire", expire):
        yield


def test_a_silent_mark_lost_to_a_full_disk_is_found() -> None:
    # Seed 25 cuts a node off while the disk is full (found at step 504 with the bug).
    found = simulate(25, 600, bug=_silent_mark_forgotten_on_full_disk)
    assert not found.ok
    assert found.violation is not None and "cut off past its lease but not recorded silent" in found.violation
    assert simulate(25, 600).ok


def test_command_line_prints_the_hash_line() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    run = subprocess.run(
        [sys.executable, "-m", "kibo_ctrl.simulate", "--seed", "3", "--steps", "60"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == f"seed 3 steps 60 hash {simulate(3, 60).digest}"


def test_command_line_reports_a_failure_with_its_replay(capsys: pytest.CaptureFixture[str]) -> None:
    with _leaky_destroy():
        status = main(["--seed", "1", "--steps", "120", "--shrink-runs", "4"])
    out = capsys.readouterr().out.splitlines()
    assert status == 1
    assert "replay: python -m kibo_ctrl.simulate --seed 1 --steps 120" in out
    assert any(line.startswith("shrunk to ") for line in out)
    assert any(line.startswith("violation: ") and "RESERVATION" in line for line in out)
    assert out[-1].startswith("seed 1 steps 120 hash ")


def test_full_disk_inside_a_job_is_unavailable(tmp_path: Path) -> None:
    """SQLite may roll the whole transaction back on SQLITE_FULL: the caller gets the store
    unavailable (retry later), not the "no such savepoint" that followed it (seed 2)."""
    loop = VirtualTimeLoop()

    def big_event(tx: Tx, n: int) -> None:
        tx.add_event(Event("ws-x", tx.now, EventType.COMMAND_ACCEPTED, message="x" * 200_000 * n))

    async def main() -> Any:
        store = await LoopStore.open_here(tmp_path / "kibo.db", VirtualClock(loop))
        try:
            store.set_disk_full(True)
            return await asyncio.gather(*(store.transact(big_event, n) for n in (1, 2)), return_exceptions=True)
        finally:
            await store.close()

    try:
        outcomes = loop.run_until_complete(main())
    finally:
        loop.close()
    for outcome in outcomes:
        assert isinstance(outcome, StoreError), outcome
        assert outcome.unavailable is not None, outcome
        assert "full" in str(outcome.unavailable)
