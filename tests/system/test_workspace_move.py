"""Moving a STOPPED workspace's disks between two process-runtime nodes (issue 26): its data
in /data (a volume) and in its writable layer go with it, the move survives a kill -9 of the
target in the middle, a start waits for it (CONFLICT), and the source keeps nothing after."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.node.v1 import node_storage_service_pb2 as storage_pb2
from kibo.node.v1 import node_storage_service_pb2_grpc as storage_grpc

from tests.client import Client, S, meta
from tests.nodes import NodeProcess, admin, list_nodes
from tests.server import ServerProcess, free_port
from tests.system.test_durability import eventually
from tests.system.test_process_runtime import SMALL, DataPlane, _require_sandbox, reap
from tests.system.test_resource_model import process_server

NODE_FLAGS = ("--sandbox", "bwrap", "--stop-grace-ms", "2000")
BIG_MIB = 400


def _node(server: ServerProcess, tmp_path: Path, name: str) -> NodeProcess:
    flags = (*NODE_FLAGS, "--data-plane-listen", f"127.0.0.1:{free_port()}")
    return NodeProcess(server.address, tmp_path / name, name, flags, runtime="process")


async def _storage_refuses(node: NodeProcess, token: str) -> grpc.StatusCode:
    """A call straight to a node's NodeStorageService, as an intruder on the network would."""
    address = node.flags[node.flags.index("--data-plane-listen") + 1]
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = storage_grpc.NodeStorageServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            await stub.ListStorage(storage_pb2.ListStorageRequest(workspace_id="ws-x"), metadata=metadata)
        except grpc.aio.AioRpcError as error:
            return error.code()
    raise AssertionError("a node listed its disks for a caller without its secret")


async def _stopped_on_node_a(client: Client, server: ServerProcess) -> tuple[str, bytes]:
    """A workspace made on node-a (node-b cordoned meanwhile) with a file in its layer, one
    in /data and BIG_MIB of random data there, then STOPPED: its ID and the data's sha256sum."""
    await admin(server.address, "CordonNode", "node-b")
    created = await client.create(resources=SMALL)
    workspace_id = created.workspace_id
    placed = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
    assert placed.node_id == "node-a"
    await admin(server.address, "UncordonNode", "node-b")
    digest = await _exec(
        client,
        workspace_id,
        f"echo layer > /root/keep.txt && echo volume > /data/keep.txt && "
        f"head -c {BIG_MIB}M /dev/urandom > /data/big && sync && sha256sum /data/big",
    )
    await client.stop(workspace_id)
    await client.wait_for(workspace_id, S.WORKSPACE_STATE_STOPPED, within=60)
    return workspace_id, digest


async def _finished(client: Client, command_id: str, within: float) -> command_pb2.WorkspaceCommand:
    async def terminal() -> command_pb2.WorkspaceCommand | None:
        command = await client.command(command_id)
        return command if command.state in (3, 4) else None

    done: command_pb2.WorkspaceCommand = await eventually(terminal, within=within, what="the move finished")
    return done


async def _exec(client: Client, workspace_id: str, script: str) -> bytes:
    plane = DataPlane(client)
    credential = await plane.credential(workspace_id)
    code, out, err = await plane.exec(credential, "sh", "-c", script)
    assert code == 0, (script, out, err)
    return out


@pytest.mark.timeout(300)
async def test_a_stopped_workspace_moves_its_disks_to_another_node_through_a_kill9_of_the_target(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    _require_sandbox()
    server = server_factory("--no-local-node", "--node-timeout-ms", "3000", "--settle-ms", "3000")
    nodes = {name: _node(server, tmp_path, name).start() for name in ("node-a", "node-b")}
    try:
        async with Client.connect(server.address) as client:
            # Placed on node-a (node-b cordoned until then).
            await eventually(lambda: _joined(server, nodes), within=30, what="both nodes joined")
            # Its disks answer only the control plane (the secret of its join).
            for token in ("", "not-the-secret"):
                assert await _storage_refuses(nodes["node-a"], token) == grpc.StatusCode.UNAUTHENTICATED
            workspace_id, digest = await _stopped_on_node_a(client, server)

            request = ws.MoveWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, target_node_id="node-b")
            answer = await client.ws.MoveWorkspace(request)
            command_id = answer.command.command_id
            assert answer.command.state == command_pb2.COMMAND_STATE_RUNNING
            assert answer.workspace.state == S.WORKSPACE_STATE_STOPPED

            # A start waits for the move: CONFLICT, naming it.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.ws.StartWorkspace(ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace_id))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "MOVE" in (refused.value.details() or "")

            # kill -9 of the target once some data has arrived; started again, the move goes on.
            async def copying() -> command_pb2.WorkspaceCommand | None:
                command = await client.command(command_id)
                return command if command.progress.done_bytes > 0 or command.state != 2 else None

            midway = await eventually(copying, within=60, what="the move copying data")
            killed_midway = midway.state == command_pb2.COMMAND_STATE_RUNNING
            nodes["node-b"].kill()
            await asyncio.sleep(1.0)
            nodes["node-b"] = _node(server, tmp_path, "node-b")
            nodes["node-b"].data_dir = tmp_path / "node-b"
            nodes["node-b"].start()

            started = time.monotonic()
            done = await _finished(client, command_id, within=180)
            assert done.state == command_pb2.COMMAND_STATE_SUCCEEDED, done.error.message
            assert done.progress.done_bytes == done.progress.total_bytes >= BIG_MIB << 20
            print(f"move finished {time.monotonic() - started:.1f} s after the restart; killed midway: {killed_midway}")

            # It starts on node-b, with its data; node-a holds nothing of it any more.
            await client.start(workspace_id)
            running = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
            assert running.node_id == "node-b"
            out = await _exec(client, workspace_id, "cat /root/keep.txt /data/keep.txt && sha256sum /data/big")
            assert out.startswith(b"layer\nvolume\n") and digest in out
            assert not list((tmp_path / "node-a" / "layers").glob(f"{workspace_id}*"))

            # Stopped again, its node drained with --move-stopped (the CLI): its disks go back
            # to node-a, the one ready node left, and it starts there with its data.
            await client.stop(workspace_id)
            await client.wait_for(workspace_id, S.WORKSPACE_STATE_STOPPED, within=60)
            kibo = str(Path(sys.executable).parent / "kibo")
            drain = [kibo, "--server", server.address, "node", "drain", "node-b", "--move-stopped", "-o", "json"]
            drained = await asyncio.to_thread(subprocess.run, drain, capture_output=True, text=True, timeout=60)
            assert drained.returncode == 0, drained.stderr
            answer_json = json.loads(drained.stdout)
            assert [m["workspace_id"] for m in answer_json["moves"]] == [workspace_id], answer_json
            back = answer_json["moves"][0]["command_id"]

            assert (await _finished(client, back, within=120)).state == command_pb2.COMMAND_STATE_SUCCEEDED
            await client.start(workspace_id)
            running = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
            assert running.node_id == "node-a"
            out = await _exec(client, workspace_id, "cat /root/keep.txt /data/keep.txt && sha256sum /data/big")
            assert out.startswith(b"layer\nvolume\n") and digest in out
            await client.delete(workspace_id)
            await client.wait_for(workspace_id, S.WORKSPACE_STATE_DELETED, within=60)
    finally:
        for node in nodes.values():
            node.stop()
            # A failed run may leave a workspace running: its sandbox outlives the agent.
            reap(node.data_dir)


async def _joined(server: ServerProcess, nodes: dict[str, NodeProcess]) -> bool | None:
    from tests.nodes import list_nodes

    known = await list_nodes(server.address)
    return True if all(name in known for name in nodes) else None


@pytest.mark.timeout(300)
async def test_a_move_goes_on_after_a_kill9_of_the_control_plane(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The mover runs on the control plane: killed mid-copy and started again on the same
    store, it finds the MOVE still running and resumes where node-b's synced copy ends."""
    _require_sandbox()
    server = server_factory("--no-local-node", "--node-timeout-ms", "3000", "--settle-ms", "3000")
    nodes = {name: _node(server, tmp_path, name).start() for name in ("node-a", "node-b")}
    try:
        async with Client.connect(server.address) as client:
            await eventually(lambda: _joined(server, nodes), within=30, what="both nodes joined")
            workspace_id, digest = await _stopped_on_node_a(client, server)
            request = ws.MoveWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, target_node_id="node-b")
            command_id = (await client.ws.MoveWorkspace(request)).command.command_id

            async def copying() -> command_pb2.WorkspaceCommand | None:
                command = await client.command(command_id)
                return command if command.progress.done_bytes > 0 or command.state != 2 else None

            await eventually(copying, within=60, what="the move copying data")
        server.kill()
        server.restart()
        async with Client.connect(server.address) as client:
            done = await _finished(client, command_id, within=180)
            assert done.state == command_pb2.COMMAND_STATE_SUCCEEDED, done.error.message
            await client.start(workspace_id)
            running = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
            assert running.node_id == "node-b"
            out = await _exec(client, workspace_id, "cat /root/keep.txt /data/keep.txt && sha256sum /data/big")
            assert out.startswith(b"layer\nvolume\n") and digest in out

            # Back to node-a with the CLI, which waits for the move with its progress.
            await client.stop(workspace_id)
            await client.wait_for(workspace_id, S.WORKSPACE_STATE_STOPPED, within=60)
            kibo = [str(Path(sys.executable).parent / "kibo"), "--server", server.address]
            moved = await asyncio.to_thread(
                subprocess.run,
                [*kibo, "workspace", "move", workspace_id, "--to", "node-a"],
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert moved.returncode == 0, moved.stderr
            assert "SUCCEEDED, on node node-a" in moved.stdout, moved.stdout
            await client.start(workspace_id)
            assert (await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)).node_id == "node-a"
            await client.delete(workspace_id)
            await client.wait_for(workspace_id, S.WORKSPACE_STATE_DELETED, within=60)
    finally:
        for node in nodes.values():
            node.stop()
            # A failed run may leave a workspace running: its sandbox outlives the agent.
            reap(node.data_dir)


@pytest.mark.timeout(300)
async def test_a_workspace_moves_from_the_embedded_node_to_a_remote_one(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The embedded server's own node (node-1, process runtime) moves its disks in process,
    a remote node over the node link: a workspace made on node-1 moves to node-r and starts
    there with its data. A simulated node of another process cannot take disks: refused."""
    _require_sandbox()
    with process_server(server_factory, "--node-timeout-ms", "3000") as server:
        remote = _node(server, tmp_path, "node-r").start()
        simulated = NodeProcess(server.address, tmp_path / "node-s", "node-s").start()
        try:
            async with Client.connect(server.address) as client:

                async def joined() -> bool | None:
                    return True if {"node-r", "node-s"} <= set(await list_nodes(server.address)) else None

                await eventually(joined, within=30, what="node-r and node-s joined")
                await admin(server.address, "CordonNode", "node-s")
                await admin(server.address, "CordonNode", "node-r")
                workspace_id = (await client.create(resources=SMALL)).workspace_id
                placed = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
                assert placed.node_id == "node-1"
                await admin(server.address, "UncordonNode", "node-r")
                write = "head -c 64M /dev/urandom > /data/big && sync && sha256sum /data/big"
                digest = await _exec(client, workspace_id, write)
                await client.stop(workspace_id)
                await client.wait_for(workspace_id, S.WORKSPACE_STATE_STOPPED, within=60)
                # A simulated node of another process has no disks to take them: refused, named.
                refused = ws.MoveWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, target_node_id="node-s")
                with pytest.raises(grpc.aio.AioRpcError) as no_disks:
                    await client.ws.MoveWorkspace(refused)
                assert no_disks.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "node-s" in (no_disks.value.details() or ""), no_disks.value.details()
                assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_STOPPED
                request = ws.MoveWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, target_node_id="node-r")
                command_id = (await client.ws.MoveWorkspace(request)).command.command_id
                done = await _finished(client, command_id, within=120)
                assert done.state == command_pb2.COMMAND_STATE_SUCCEEDED, done.error.message
                await client.start(workspace_id)
                running = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
                assert running.node_id == "node-r"
                assert digest in await _exec(client, workspace_id, "sha256sum /data/big")
                await client.delete(workspace_id)
                await client.wait_for(workspace_id, S.WORKSPACE_STATE_DELETED, within=60)
        finally:
            simulated.stop()
            remote.stop()
            reap(remote.data_dir)
