"""`kibo-ctrl node --runtime process` (issue 13): real sandboxes on a node agent of its own,
under a control plane with no node (`serve --no-local-node`). Killed with -9 and started
again on the same data dir, the agent adopts the sandbox that ran on: nothing started twice,
nothing orphaned."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import grpc
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2
from kibo.node.v1 import node_guest_service_pb2_grpc as guest_grpc

from tests.client import Client, S
from tests.nodes import NodeProcess
from tests.server import ServerProcess, free_port
from tests.system.test_durability import eventually
from tests.system.test_process_runtime import (
    SMALL,
    DataPlane,
    _alive,
    _require_sandbox,
    agent_pid,
    processes,
    reap,
    state,
    supervisor_processes,
    supervisors,
    wait_until,
)

NODE_FLAGS = ("--sandbox", "bwrap", "--stop-grace-ms", "2000")


async def guest_hop_refuses(address: str, token: str) -> grpc.StatusCode:
    """A call straight to the node's guest service, as an intruder on the network would."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = guest_grpc.NodeGuestServiceStub(channel)  # type: ignore[no-untyped-call]
        request = guest_pb2.RunGuestJobRequest(instance_id="x", job=b'{"argv": ["id"]}')
        try:
            async for _ in stub.RunGuestJob(request, metadata=metadata):
                pass
        except grpc.aio.AioRpcError as error:
            return error.code()
    raise AssertionError("the node ran a job for a caller without its secret")


async def test_a_process_node_readopts_its_sandbox_after_kill9(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    _require_sandbox()
    server = server_factory("--no-local-node", "--node-timeout-ms", "3000", "--settle-ms", "3000")
    hop = free_port()
    flags = (*NODE_FLAGS, "--data-plane-listen", f"127.0.0.1:{hop}")
    node = NodeProcess(server.address, tmp_path / "node-p", "node-p", flags, runtime="process").start()
    # The helpers of the process-runtime tests read a server's data dir: here, the node's.
    host = cast(Any, node)
    try:
        async with Client.connect(server.address) as client:

            async def placed() -> Any:
                workspace = await client.create(resources=SMALL)
                return workspace if workspace.state == S.WORKSPACE_STATE_AVAILABLE else None

            kept = await eventually(placed, within=30, what="a workspace AVAILABLE on the process node")
            assert kept.node_id == "node-p"
            # Its supervisor hands the ready guest to the node's node supervisor (the default).
            await wait_until(lambda: bool(state(host, kept).get("parked")) and not supervisors(host, kept))
            supervisor = int(state(host, kept)["supervisor_pid"])
            assert processes(f"node_supervisor.py {node.data_dir}") == [supervisor]
            guest = agent_pid(host, kept)

            # The data plane reaches the guest through its node: client -> control plane
            # (the credential, checked as for the embedded node) -> the node's guest service.
            plane = DataPlane(client)
            credential = await plane.credential(kept.workspace_id)
            code, out, _ = await plane.exec(credential, "sh", "-c", "echo hello from $(hostname)")
            assert code == 0 and out.startswith(b"hello from"), out
            await plane.write(credential, "/data/note", b"through the node")
            assert await plane.read(credential, "/data/note") == b"through the node"
            assert (
                await _refusal(plane.read(credential, "/etc/../../proc/1/environ")) == grpc.StatusCode.INVALID_ARGUMENT
            )
            # The node's guest service takes the control plane's secret only.
            for token in ("", "kibo_not-the-secret-of-this-join", server_token_like()):
                assert await guest_hop_refuses(f"127.0.0.1:{hop}", token) == grpc.StatusCode.UNAUTHENTICATED

            node.kill()
            # The sandbox runs on without its agent; the control plane marks it UNKNOWN.
            assert _alive(supervisor) and _alive(guest)
            await client.wait_for(kept.workspace_id, S.WORKSPACE_STATE_UNKNOWN, within=15)
            node.start()
            again = await client.wait_for(kept.workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=30)
            assert again.execution_generation == kept.execution_generation
            # Adopted, not started again: the same node supervisor and guest, and only them.
            assert processes(f"node_supervisor.py {node.data_dir}") == [supervisor]
            assert int(state(host, kept)["supervisor_pid"]) == supervisor
            assert agent_pid(host, kept) == guest
            assert len(supervisor_processes(f"supervisor.py {node.data_dir}")) == 1
            # The new agent made a new secret: the data plane follows it.
            credential = await plane.credential(kept.workspace_id)

            async def note() -> bytes | None:
                """UNAVAILABLE says retry: the control plane's link to the restarted node's data
                plane may still be in its reconnect backoff."""
                try:
                    return (await plane.exec(credential, "cat", "/data/note"))[1]
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    return None

            assert await eventually(note, within=20, what="the data plane through the restarted node") == (
                b"through the node"
            )
            # Fully controllable after the adoption: a graceful stop ends the guest.
            response = await client.stop(kept.workspace_id)
            assert response.workspace.state == S.WORKSPACE_STATE_STOPPED
            assert not _alive(guest)
            await client.delete(kept.workspace_id)
            assert (await client.wait_steady(kept.workspace_id, within=30)).state == S.WORKSPACE_STATE_DELETED
        assert node.stop() == 0, node.log()
        assert not processes(f"{node.data_dir}/instances")
        # Holding nothing, with no node agent connected: the node supervisor exits.
        await wait_until(lambda: not _alive(supervisor), within=15)
    finally:
        node.kill()
        reap(node.data_dir)


def server_token_like() -> str:
    return "kibo_" + "A" * 43


async def _refusal(call: Any) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    raise AssertionError("accepted")
