"""What the data plane's process RPCs accept (api/data_plane_processes.py): every field is
checked before the credential is even read, with INVALID_ARGUMENT naming it, in linear time
(no regex), and the "kibo-" tags stay the data plane's own (uploads)."""

from __future__ import annotations

import time
from typing import Any
from unittest.mock import Mock

import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo_ctrl.api.data_plane_processes import DataPlaneProcesses
from kibo_ctrl.domain.errors import InvalidArgument

PTY = dp.PtySize(rows=24, cols=80)
START_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({}, "argv"),
    ({"argv": ["ls"], "shell": "ls"}, "argv"),
    ({"argv": [""]}, "argv"),
    ({"argv": ["ls", "a\0b"]}, "argv"),
    ({"argv": ["x"] * 4097}, "argv"),
    ({"argv": ["x" * (1 << 20)]}, "argv"),
    ({"shell": "echo \0"}, "shell"),
    ({"argv": ["ls"], "env": {"": "x"}}, "env"),
    ({"argv": ["ls"], "env": {"A=B": "x"}}, "env"),
    ({"argv": ["ls"], "env": {"A\0": "x"}}, "env"),
    ({"argv": ["ls"], "env": {"A": "x\0"}}, "env"),
    ({"argv": ["ls"], "working_dir": "relative"}, "working_dir"),
    ({"argv": ["ls"], "working_dir": "/a\0"}, "working_dir"),
    ({"argv": ["ls"], "working_dir": "/" + "a" * 4095}, "working_dir"),
    ({"argv": ["ls"], "user": "a:b"}, "user"),
    ({"argv": ["ls"], "user": "root\n"}, "user"),
    ({"argv": ["ls"], "user": "u" * 65}, "user"),
    ({"argv": ["ls"], "tag": "a b"}, "tag"),
    ({"argv": ["ls"], "tag": "t" * 65}, "tag"),
    ({"argv": ["ls"], "tag": "é"}, "tag"),
    ({"argv": ["ls"], "tag": "kibo-upload-0123"}, "tag"),
    ({"argv": ["ls"], "tag": "kibo-"}, "tag"),
    ({"argv": ["ls"], "pty": dp.PtySize(rows=0, cols=80)}, "pty.rows"),
    ({"argv": ["ls"], "pty": dp.PtySize(rows=24, cols=1001)}, "pty.cols"),
    ({"argv": ["ls"], "pty": dp.PtySize()}, "pty.rows"),
    ({"argv": ["ls"], "stdin": b"x" * ((1 << 20) + 1)}, "stdin"),
]


def processes() -> tuple[DataPlaneProcesses, Mock]:
    data_plane = Mock()
    data_plane._claims.side_effect = AssertionError("the credential was read before the request was checked")
    return DataPlaneProcesses(data_plane), data_plane


async def refused_field(call: Any) -> str:
    with pytest.raises(InvalidArgument) as refused:
        if hasattr(call, "__anext__"):
            await call.__anext__()
        else:
            await call
    return refused.value.field


START_IDS = [f"{field}-{i}" for i, (_, field) in enumerate(START_REFUSALS)]
# The reserved prefix's cases, by name (tests/mutations/guestprocesses.py names them).
START_IDS[20], START_IDS[21] = "reserved-tag", "reserved-prefix-alone"


@pytest.mark.parametrize(("fields", "field"), START_REFUSALS, ids=START_IDS)
async def test_a_start_names_the_field_it_refuses(fields: dict[str, Any], field: str) -> None:
    handlers, _ = processes()
    request = dp.StartWorkspaceProcessRequest(credential="c", **fields)
    assert await refused_field(handlers.start_workspace_process(request, Mock())) == field


async def test_a_good_start_goes_on_to_the_credential() -> None:
    handlers, data_plane = processes()
    request = dp.StartWorkspaceProcessRequest(
        credential="c", shell="echo hi", env={"A": "b"}, working_dir="/tmp", user="app-1", tag="web.server_1", pty=PTY
    )
    with pytest.raises(AssertionError, match="credential was read"):
        await handlers.start_workspace_process(request, Mock()).__anext__()
    data_plane._claims.assert_called_once_with("c")


SELECTORS: list[tuple[dp.ProcessSelector, str]] = [
    (dp.ProcessSelector(), "process"),
    (dp.ProcessSelector(pid=0), "process.pid"),
    (dp.ProcessSelector(pid=-4), "process.pid"),
    (dp.ProcessSelector(tag=""), "process.tag"),
    (dp.ProcessSelector(tag="a/b"), "process.tag"),
    (dp.ProcessSelector(tag="kibo-upload-1"), "process.tag"),
]


@pytest.mark.parametrize(
    ("selector", "field"), SELECTORS, ids=["none", "pid-0", "pid-negative", "tag-empty", "tag-slash", "tag-reserved"]
)
async def test_every_call_checks_its_selector(selector: dp.ProcessSelector, field: str) -> None:
    handlers, _ = processes()
    calls = [
        handlers.connect_workspace_process(dp.ConnectWorkspaceProcessRequest(credential="c", process=selector), Mock()),
        handlers.send_workspace_process_input(
            dp.SendWorkspaceProcessInputRequest(credential="c", process=selector), Mock()
        ),
        handlers.signal_workspace_process(dp.SignalWorkspaceProcessRequest(credential="c", process=selector), Mock()),
        handlers.resize_workspace_process(
            dp.ResizeWorkspaceProcessRequest(credential="c", process=selector, size=PTY), Mock()
        ),
    ]
    for call in calls:
        assert await refused_field(call) == field


async def test_signals_sizes_and_input_are_bounded() -> None:
    handlers, _ = processes()
    pid = dp.ProcessSelector(pid=7)
    for signum in (-1, 65, 1000):
        request = dp.SignalWorkspaceProcessRequest(credential="c", process=pid, signal=signum)
        assert await refused_field(handlers.signal_workspace_process(request, Mock())) == "signal"
    for size, field in (
        (None, "size"),
        (dp.PtySize(rows=1001, cols=1), "size.rows"),
        (dp.PtySize(rows=1), "size.cols"),
    ):
        resize = dp.ResizeWorkspaceProcessRequest(credential="c", process=pid, size=size)
        assert await refused_field(handlers.resize_workspace_process(resize, Mock())) == field
    data = dp.SendWorkspaceProcessInputRequest(credential="c", process=pid, data=b"x" * ((1 << 20) + 1))
    assert await refused_field(handlers.send_workspace_process_input(data, Mock())) == "data"


async def test_checks_take_linear_time() -> None:
    """A 3 MiB tag or user is refused at once (no regex to backtrack)."""
    handlers, _ = processes()
    huge: list[dict[str, Any]] = [
        {"tag": "a" * (3 << 20)},
        {"user": "a" * (3 << 20)},
        {"tag": "a" * 64 + "!" * (3 << 20)},
    ]
    for fields in huge:
        started = time.perf_counter()
        request = dp.StartWorkspaceProcessRequest(credential="c", argv=["ls"], **fields)
        await refused_field(handlers.start_workspace_process(request, Mock()))
        assert time.perf_counter() - started < 0.05
