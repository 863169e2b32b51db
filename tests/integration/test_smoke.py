from __future__ import annotations

from kibo.ctrl.v1 import command_pb2

from tests.client import Client, S


async def test_create_stop_start_delete(client: Client) -> None:
    workspace = await client.create()
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE
    stopped = await client.stop(workspace.workspace_id)
    assert stopped.command.state == command_pb2.COMMAND_STATE_SUCCEEDED
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
    started = await client.start(workspace.workspace_id)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert started.workspace.execution_generation == 2
    deleted = await client.delete(workspace.workspace_id)
    assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
