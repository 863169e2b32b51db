"""A cgroup setup that fails half-way (runtime/process/cgroups.py) leaves nothing it made:
the rootless server could make its parent in one v1 hierarchy and not in the next, and left
an empty `kibo-<tag>` cgroup on the machine at every start (test_sandbox_rootless.py did).
Replayed on a fake /sys/fs/cgroup."""

from __future__ import annotations

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
