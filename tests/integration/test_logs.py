"""`--log-format json`: one JSON object a line, each workspace event with its workspace,
command and node IDs as fields; `text` carries the same fields as key=value; no token
ever reaches a line (issue 15)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from tests.client import Client, S
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]


def json_lines(server: ServerProcess) -> list[dict[str, Any]]:
    assert server.log_path is not None
    text = server.log_path.read_text()
    # Every line is one JSON object (a line that is not fails here, with its text).
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def wait_lines(server: ServerProcess, found: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """Lines reach the file right after the commit; poll the file a short while for them."""
    deadline = time.monotonic() + 5
    while True:
        lines = json_lines(server)
        if found(lines) or time.monotonic() > deadline:
            return lines
        await asyncio.sleep(0.02)


async def test_json_lines_parse_and_carry_workspace_command_and_node_ids(server_factory: Factory) -> None:
    server = server_factory("--log-format", "json", "--log-level", "info", auth=True)
    token = server.admin_token
    async with Client.connect(server.address, token) as client:
        workspace = await client.create()
        stopped = await client.stop(workspace.workspace_id)
        await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_STOPPED)
    workspace_id, stop_id = workspace.workspace_id, stopped.command.command_id

    def mine(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [line for line in lines if line.get("workspace_id") == workspace_id]

    lines = await wait_lines(server, lambda lines: any(line.get("command_id") == stop_id for line in mine(lines)))
    assert token not in server.log_path.read_text()  # type: ignore[union-attr]
    events = mine(lines)
    for line in events:
        assert {"time", "level", "logger", "message"} <= line.keys()
        assert line["logger"] == "kibo.events"
    succeeded = [line for line in events if line["message"].startswith("command_succeeded")]
    kinds = {line["kind"]: line for line in succeeded}
    assert set(kinds) == {"create", "stop"}, events
    create = kinds["create"]
    assert create["outcome"] == "succeeded" and create["node_id"] == "node-1" and create["tenant"] == "default"
    assert create["command_id"] and create["seconds"] >= 0
    assert kinds["stop"]["command_id"] == stop_id
    states = [(line["from_state"], line["state"]) for line in events if line["message"].startswith("state_changed")]
    assert ("creating", "available") in states and ("stopping", "stopped") in states, states
    assert any(line["message"].startswith("scheduled") and line["node_id"] == "node-1" for line in events)


async def test_text_lines_carry_the_same_ids_as_key_value(server_factory: Factory) -> None:
    server = server_factory("--log-level", "info")
    async with Client.connect(server.address) as client:
        workspace = await client.create()
    assert server.log_path is not None
    deadline = time.monotonic() + 5
    wanted = f"workspace_id={workspace.workspace_id}"
    while time.monotonic() < deadline:
        if wanted in server.log_path.read_text():
            break
        await asyncio.sleep(0.02)
    lines = [line for line in server.log_path.read_text().splitlines() if wanted in line]
    assert any("command_succeeded" in line and "kind=create" in line and "node_id=node-1" in line for line in lines)
