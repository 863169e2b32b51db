"""The Python SDK's workspace access, the parts decided before or after a call (kibotos.access_common):
which offset a refused upload part names, what names a process, which arguments are refused before
any call (TypeError/ValueError), and how input is cut into the parts the server takes."""

from __future__ import annotations

import grpc
import kibotos
import pytest
from google.rpc import error_details_pb2
from kibo.ctrl.v1 import error_pb2
from kibotos import access_common as common


def _conflict(message: str, field: str = "offset", metadata: dict[str, str] | None = None) -> kibotos.KiboError:
    return kibotos.ConflictError(
        message,
        code=grpc.StatusCode.FAILED_PRECONDITION,
        detail=error_pb2.ErrorDetail(reason=error_pb2.ERROR_REASON_CONFLICT, field=field),
        info=error_details_pb2.ErrorInfo(reason="CONFLICT", metadata=metadata or {}),
    )


def test_the_offset_to_go_on_from_is_the_one_the_server_has() -> None:
    refused = "offset 0 is not where upload kibo-upload-1 is: it has taken 2097152 bytes; go on from offset 2097152"
    assert common.server_offset(_conflict(refused)) == 2097152  # not the refused offset it names first
    assert common.server_offset(_conflict("whatever", metadata={"offset": "42"})) == 42
    assert common.server_offset(_conflict("upload kibo-upload-1 has finished (9 bytes)", field="upload_id")) is None
    assert common.server_offset(_conflict("no number here")) is None
    assert common.server_offset(kibotos.NotFoundError("go on from offset 5")) is None


def test_what_names_a_process() -> None:
    assert common.selector(7).pid == 7 and common.selector("web").tag == "web"
    handle = kibotos.ProcessHandle(12, "t", None)
    assert common.selector(handle).pid == 12
    for wrong in (True, 1.5, None):
        with pytest.raises(TypeError):
            common.selector(wrong)  # type: ignore[arg-type]
    for empty in (0, -1, ""):
        with pytest.raises(ValueError):
            common.selector(empty)


def test_start_arguments_are_checked_before_any_call() -> None:
    def start(**changes: object) -> object:
        arguments: dict[str, object] = {
            "argv": ["true"], "shell": "", "env": None, "cwd": "", "user": "", "pty": None, "tag": "",
            "stdin": b"", "close_stdin": False, "background": True,
        }  # fmt: skip
        arguments.update(changes)
        return common.start_request(**arguments)  # type: ignore[arg-type]

    assert start(pty=(24, 80)).pty.rows == 24  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        start(argv="ls -l")
    with pytest.raises(ValueError):
        start(argv=[], shell="")
    with pytest.raises(ValueError):
        start(shell="ls")
    for size in ((0, 80), (24, 0), (70000, 80)):
        with pytest.raises(ValueError):
            start(pty=size)


def test_input_goes_in_parts_of_1_mib_the_last_closing() -> None:
    data = b"a" * (common.MAX_INPUT_BYTES * 2 + 5)
    parts = common.input_parts(data, close=True)
    assert [len(p) for p, _ in parts] == [common.MAX_INPUT_BYTES, common.MAX_INPUT_BYTES, 5]
    assert [last for _, last in parts] == [False, False, True]
    assert common.input_parts(b"", close=True) == [(b"", True)]
