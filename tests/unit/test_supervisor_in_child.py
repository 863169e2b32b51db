"""supervisor_os.InChild: the supervisor's mounts are made by a short-lived child (so the
Python behind them does not stay in the supervisor's private memory for the workspace's
life). What the child returns, raises or dies of reaches the supervisor; what it writes in
memory does not."""

from __future__ import annotations

import os
import select
import signal
from typing import Any

import pytest
from kibo_ctrl.runtime.process.supervisor_os import ChildFailed, InChild, reap_answered

WRITTEN: list[int] = []


def test_the_child_answers_and_its_memory_stays_its_own() -> None:
    def work() -> dict[str, Any]:
        WRITTEN.append(os.getpid())
        return {"pid": os.getpid(), "argv": ["bwrap", "--", "/init"]}

    done = InChild(work).answer()
    assert done["argv"] == ["bwrap", "--", "/init"]
    assert done["pid"] != os.getpid()
    assert WRITTEN == []  # the child's write went with it
    reap_answered()
    with pytest.raises(ChildProcessError):
        os.waitpid(done["pid"], os.WNOHANG)  # reaped


def test_what_the_child_raises_is_raised_here_with_its_kind() -> None:
    def fails_in_os() -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    with pytest.raises(ChildFailed, match="No space left on device") as failed:
        InChild(fails_in_os).answer()
    assert failed.value.oserror

    def fails_otherwise() -> dict[str, Any]:
        raise ValueError("a bad spec")

    with pytest.raises(ChildFailed, match="a bad spec") as failed:
        InChild(fails_otherwise).answer()
    assert not failed.value.oserror


def test_a_child_that_dies_without_an_answer_is_a_failure() -> None:
    def dies() -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGKILL)
        return {}

    with pytest.raises(ChildFailed, match="died without an answer"):
        InChild(dies).answer()


def test_the_child_dies_with_its_parent() -> None:
    """A supervisor killed mid-launch leaves no mount child behind (PR_SET_PDEATHSIG)."""
    read, write = os.pipe()
    supervisor = os.fork()
    if supervisor == 0:  # stands for the supervisor: its child reports its PID, then waits
        os.close(read)

        def waits() -> dict[str, Any]:
            os.write(write, f"{os.getpid()}\n".encode())
            signal.pause()
            return {}

        try:
            InChild(waits).answer()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = int(pipe.readline())
    os.kill(supervisor, signal.SIGKILL)
    os.waitpid(supervisor, 0)
    try:
        pidfd = os.pidfd_open(child)  # not ours to wait for: followed through a pidfd
    except ProcessLookupError:
        return  # gone already
    try:
        ready, _, _ = select.select([pidfd], [], [], 10)
        assert ready, "the mount child outlived its supervisor"
    finally:
        os.close(pidfd)
