"""`kibo-ctrl node --runtime process` (issue 13): real sandboxes on a node agent of its own,
under a control plane with no node (`serve --no-local-node`). Killed with -9 and started
again on the same data dir, the agent adopts the sandbox that ran on: nothing started twice,
nothing orphaned."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from tests.client import Client, S
from tests.nodes import NodeProcess
from tests.server import ServerProcess
from tests.system.test_durability import eventually
from tests.system.test_process_runtime import (
    SMALL,
    _alive,
    _require_sandbox,
    agent_pid,
    processes,
    reap,
    supervisors,
)

NODE_FLAGS = ("--sandbox", "bwrap", "--stop-grace-ms", "2000", "--storage-overcommit", "100")


async def test_a_process_node_readopts_its_sandbox_after_kill9(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    _require_sandbox()
    server = server_factory("--no-local-node", "--node-timeout-ms", "1500", "--settle-ms", "3000")
    node = NodeProcess(server.address, tmp_path / "node-p", "node-p", NODE_FLAGS, runtime="process").start()
    # The helpers of the process-runtime tests read a server's data dir: here, the node's.
    host = cast(Any, node)
    try:
        async with Client.connect(server.address) as client:

            async def placed() -> Any:
                workspace = await client.create(resources=SMALL)
                return workspace if workspace.state == S.WORKSPACE_STATE_AVAILABLE else None

            kept = await eventually(placed, within=30, what="a workspace AVAILABLE on the process node")
            assert kept.node_id == "node-p"
            [supervisor] = supervisors(host, kept)
            guest = agent_pid(host, kept)
            node.kill()
            # The sandbox runs on without its agent; the control plane marks it UNKNOWN.
            assert _alive(supervisor) and _alive(guest)
            await client.wait_for(kept.workspace_id, S.WORKSPACE_STATE_UNKNOWN, within=15)
            node.start()
            again = await client.wait_for(kept.workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=30)
            assert again.execution_generation == kept.execution_generation
            # Adopted, not started again: the same supervisor and guest, and only them.
            assert supervisors(host, kept) == [supervisor]
            assert agent_pid(host, kept) == guest
            assert len(processes(f"supervisor.py {node.data_dir}")) == 1
            # Fully controllable after the adoption: a graceful stop ends both processes.
            response = await client.stop(kept.workspace_id)
            assert response.workspace.state == S.WORKSPACE_STATE_STOPPED
            assert not _alive(supervisor) and not _alive(guest)
            await client.delete(kept.workspace_id)
            assert (await client.wait_steady(kept.workspace_id, within=30)).state == S.WORKSPACE_STATE_DELETED
        assert node.stop() == 0, node.log()
        assert not processes(f"{node.data_dir}/instances")
    finally:
        node.kill()
        reap(node.data_dir)
