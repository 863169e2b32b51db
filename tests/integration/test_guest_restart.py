"""A firecracker guest reset whose new VMM cannot start, or whose restart the node's own
restart interrupts, ends FAILED with the reason (lifecycle.md, "guest reboots itself")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S
from tests.server import ServerProcess


async def test_new_vmm_failing_to_start_fails_the_workspace(client: Client) -> None:
    workspace = await client.create()
    workspace_id = workspace.workspace_id
    # FAULT_CREATE_FAIL applies to the next VMM start: the restart after the reset.
    await client.inject(workspace_id, sim.FAULT_CREATE_FAIL)
    await client.inject(workspace_id, sim.FAULT_GUEST_REBOOT)
    failed = await client.wait_for(workspace_id, S.WORKSPACE_STATE_FAILED)
    assert "failed to start" in failed.failure.message
    assert failed.failure.stage == ""
    assert failed.guest.reset_count == 1
    # Still holding execution: start is refused until a force stop.
    stopped = await client.stop(workspace_id, force=True)
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED


async def test_node_restart_during_a_guest_restart_fails_the_workspace(
    server_factory: Callable[..., ServerProcess],
) -> None:
    # Slow steps so the restart is still in progress when the node (server) dies.
    server = server_factory("--sim-step-ms", "1500")
    async with Client.connect(server.address) as client:
        workspace = await client.create()
        workspace_id = workspace.workspace_id
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE
        await client.inject(workspace_id, sim.FAULT_GUEST_REBOOT)
        # The reset is reported asynchronously; the guest is being restarted meanwhile.
        deadline = asyncio.get_running_loop().time() + 5
        restarting = await client.get(workspace_id)
        while restarting.guest.reset_count == 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
            restarting = await client.get(workspace_id)
        assert restarting.state == S.WORKSPACE_STATE_AVAILABLE
        assert restarting.guest.reset_count == 1
        assert not restarting.guest.responding
    server.kill()
    server.start()
    async with Client.connect(server.address) as client:
        failed = await client.wait_for(workspace_id, S.WORKSPACE_STATE_FAILED, within=15)
        assert "node restarted" in failed.failure.message
        assert failed.execution_generation == workspace.execution_generation
