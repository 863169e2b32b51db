"""The control plane's handle on a supervisor it re-attaches to after its own restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from kibo_ctrl.domain.model import Backend
from kibo_ctrl.domain.reports import Report
from kibo_ctrl.runtime.process.supervisor_handle import Supervised


class _Host:
    backend = Backend.FIRECRACKER

    def __init__(self, root: Path) -> None:
        self.root = root
        self.events: asyncio.Queue[Report] = asyncio.Queue()

    def instance_dir(self, instance_id: str) -> Path:
        return self.root / instance_id

    def socket_name(self, instance_id: str) -> str:
        return f"kibo-test-no-such-socket-{instance_id}"


async def test_a_reattached_supervisor_is_ready_as_it_recorded_before_its_socket_answers(tmp_path: Path) -> None:
    """After a control-plane restart, a data-plane call came before the handle had heard the
    supervisor on its socket and was refused "the guest is not answering" (state ""), though
    the guest ran: the handle starts from the state the supervisor recorded."""
    host = _Host(tmp_path)
    (tmp_path / "i-1").mkdir()
    (tmp_path / "i-1" / "state.json").write_text(json.dumps({"state": "ready", "why": ""}))
    handle = Supervised(host, "i-1", None)
    try:
        assert handle.state == "ready"
    finally:
        handle.task.cancel()
        await asyncio.gather(handle.task, return_exceptions=True)


async def test_a_supervisor_that_recorded_nothing_is_known_only_from_its_socket(tmp_path: Path) -> None:
    (tmp_path / "i-2").mkdir()
    handle = Supervised(_Host(tmp_path), "i-2", None)
    try:
        assert handle.state == ""
    finally:
        handle.task.cancel()
        await asyncio.gather(handle.task, return_exceptions=True)
