"""A cgroup setup that fails half-way (runtime/process/cgroups.py) leaves nothing it made:
the rootless server could make its parent in one v1 hierarchy and not in the next, and left
an empty `kibo-<tag>` cgroup on the machine at every start (test_sandbox_rootless.py did).
Replayed on a fake /sys/fs/cgroup. And the PID limits' arithmetic and where each is
written, and how refused forks are counted (issue 27.1; real guests try them in
tests/system/test_sandbox_limits.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kibo_ctrl.runtime.process import cgroups


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "_own_path", lambda controller: "/own")
    (tmp_path / "memory" / "own").mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("0")
    return tmp_path


def test_a_v1_setup_that_fails_in_a_later_hierarchy_leaves_no_parent(fake_root: Path) -> None:
    (fake_root / "cpu").mkdir()
    (fake_root / "cpu" / "own").write_text("")  # not a directory: the parent cannot be made there
    made = cgroups.Cgroups("tag")
    assert made.mode == "rlimit" and made.parents == []
    assert not (fake_root / "memory" / "own" / "kibo-tag").exists()


def test_a_parent_that_was_there_before_stays(fake_root: Path) -> None:
    (fake_root / "memory" / "own" / "kibo-tag").mkdir()  # another server's, on the same data dir
    (fake_root / "cpu").mkdir()
    (fake_root / "cpu" / "own").write_text("")
    assert cgroups.Cgroups("tag").mode == "rlimit"
    assert (fake_root / "memory" / "own" / "kibo-tag").is_dir()


# -- PIDs: the node's budget and each guest's share (issue 27.1) ------------------------------


def test_the_node_budget_keeps_a_reserve_for_the_host() -> None:
    assert cgroups.node_pids_budget(32_768) == 24_576  # the host: 8,192 kept
    assert cgroups.node_pids_budget(4_194_304) == 3_145_728  # systemd's pid_max: a quarter kept
    assert cgroups.node_pids_budget(2_048) == 1_024  # at least NODE_PIDS_RESERVE kept
    assert cgroups.node_pids_budget(1_500) == 750  # but never more than half


def test_a_guests_pids_max_is_its_memorys_share_of_the_budget() -> None:
    assert cgroups.guest_pids_max(24_576, 4_096, 16_384) == 6_144  # a quarter of the memory
    assert cgroups.guest_pids_max(24_576, 128, 16_384) == cgroups.GUEST_PIDS_FLOOR  # a small guest
    assert cgroups.guest_pids_max(24_576, 1 << 20, 16_384) == 24_576  # never above the budget
    assert cgroups.guest_pids_max(300, 128, 16_384) == 300  # nor the floor above it
    # Guests that fill the host's memory fill the budget, no more.
    assert sum(cgroups.guest_pids_max(24_576, 2_048, 16_384) for _ in range(8)) == 24_576


@pytest.fixture
def v1_writes(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[Path, str]:
    """A fake v1 machine (memory, cpu and pids hierarchies, pid_max 32,768, 16 GiB), its
    cgroup files' writes recorded (a real cgroupfs makes the files; tmp does not)."""
    for controller in ("cpu", "pids"):
        (fake_root / controller / "own").mkdir(parents=True)
    writes: dict[Path, str] = {}
    monkeypatch.setattr(cgroups, "_write", lambda path, value: writes.__setitem__(path, value))
    monkeypatch.setattr(cgroups, "kernel_task_limit", lambda: 32_768)
    monkeypatch.setattr(cgroups, "host_memory_mib", lambda: 16_384)
    return writes


def test_v1_the_parent_holds_the_node_budget_and_each_guest_its_share(
    fake_root: Path, v1_writes: dict[Path, str]
) -> None:
    made = cgroups.Cgroups("tag", "cgroup-v1")
    assert made.mode == "cgroup-v1"
    parent = fake_root / "pids" / "own" / "kibo-tag"
    assert v1_writes[parent / "pids.max"] == "24576"
    made.create("i1", 2, 4_096)
    assert v1_writes[parent / "i1" / "pids.max"] == "6144"
    cpu = fake_root / "cpu" / "own" / "kibo-tag" / "i1"
    assert (v1_writes[cpu / "cpu.cfs_quota_us"], v1_writes[cpu / "cpu.cfs_period_us"]) == ("200000", "100000")


def test_an_operators_budget_replaces_the_derived_one(fake_root: Path, v1_writes: dict[Path, str]) -> None:
    made = cgroups.Cgroups("tag", "cgroup-v1", pids_budget=800)
    made.create("i1", 1, 128)
    parent = fake_root / "pids" / "own" / "kibo-tag"
    assert (v1_writes[parent / "pids.max"], v1_writes[parent / "i1" / "pids.max"]) == ("800", "512")


def _events(directory: Path, refused: int, local: bool = False) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pids.max").write_text("512\n")
    (directory / "pids.events").write_text(f"max {refused}\n")
    if local:
        (directory / "pids.events.local").write_text("max 0\n")


def test_refused_forks_are_counted_and_stay_counted_when_the_guest_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = cgroups.Cgroups("tag", "none")
    parent = tmp_path / "kibo-tag"
    made.parents = [tmp_path / "memory-parent", parent]  # v1: the pids hierarchy's is the one read
    _events(parent, 0)
    _events(parent / "a", 3)
    _events(parent / "b", 4)
    assert made.pids_limit_hits() == 7
    # cgroupfs removes a directory of interface files; tmp needs them gone first.
    monkeypatch.setattr(Path, "rmdir", lambda self: shutil.rmtree(self))
    cgroups.Cgroups.remove((str(parent / "a"),))
    assert not (parent / "a").exists()
    assert made.pids_limit_hits() == 7
    _events(parent / "a", 1)  # the next generation of that instance starts at 0 again
    assert made.pids_limit_hits() == 8


def test_on_cgroup_v2_since_linux_6_12_the_parent_counts_its_subtree(tmp_path: Path) -> None:
    made = cgroups.Cgroups("tag", "none")
    parent = tmp_path / "kibo-tag"
    made.parents = [parent]
    _events(parent, 9, local=True)  # hierarchical: every refusal below, removed guests' too
    _events(parent / "a", 5, local=True)
    assert made.pids_limit_hits() == 9
