"""supervisor_os.oom_kills: the OOM killer's kills in a cgroup's counter file, read the way an
idle supervisor reads it four times a second (one pread of a file kept open)."""

from __future__ import annotations

from pathlib import Path

from kibo_ctrl.runtime.process import supervisor_os
from kibo_ctrl.runtime.process.supervisor_os import oom_kills


def test_v1_oom_control_counts_its_oom_kill_line_not_the_disable_flag(tmp_path: Path) -> None:
    control = tmp_path / "memory.oom_control"
    control.write_text("oom_kill_disable 1\nunder_oom 0\noom_kill 3\n")
    assert oom_kills(str(control)) == 3


def test_v2_memory_events_counts_oom_kill_not_oom_group_kill(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 9\noom 4\noom_group_kill 7\noom_kill 2")  # no final newline
    assert oom_kills(str(events)) == 2


def test_the_file_is_reread_as_it_changes(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    assert oom_kills(str(events)) == 0
    events.write_text("oom 1\noom_kill 1\n")  # the same inode, rewritten: as the kernel's counters
    assert oom_kills(str(events)) == 1
    assert str(events) in supervisor_os._OOM_FDS, "kept open, not reopened each time"


def test_nothing_to_count_is_zero(tmp_path: Path) -> None:
    assert oom_kills("") == 0
    assert oom_kills(str(tmp_path / "gone")) == 0
    odd = tmp_path / "odd"
    odd.write_text("oom_kill many\n")
    assert oom_kills(str(odd)) == 0
    other = tmp_path / "other"
    other.write_text("under_oom 0\n")
    assert oom_kills(str(other)) == 0
