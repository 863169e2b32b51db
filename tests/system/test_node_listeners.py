"""Listeners that cannot be shared by accident (issue 26, item 6). grpc's servers set
SO_REUSEPORT by default, so a second server on a taken port bound it too and the kernel split
the connections between the two: two node agents on one host both "served" 0.0.0.0:50052,
and an exec reached whichever node the kernel picked (UNAUTHENTICATED from the wrong one).
Now a second server on a taken port fails at its start with the address named; with ports of
their own, every call reaches its own node; and the guest hop binds, by default, this host's
address towards the control plane, not every interface."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.client import Client, S
from tests.nodes import NodeProcess
from tests.server import ServerProcess, free_port
from tests.system.test_durability import eventually
from tests.system.test_node_process_runtime import NODE_FLAGS
from tests.system.test_process_runtime import SMALL, DataPlane, _require_sandbox, reap


def _exits(node: NodeProcess, within: float = 30.0) -> int:
    assert node.process is not None
    deadline = time.monotonic() + within
    while node.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    code = node.process.poll()
    assert code is not None, f"the node agent is still running: {node.log()}"
    return code


def _listening(port: int) -> list[str]:
    """The local addresses with a TCP socket listening on `port` (from /proc/net/tcp{,6})."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


def test_a_second_server_on_a_taken_grpc_port_fails_naming_it(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    first = server_factory("--runtime", "sim")
    command = [sys.executable, "-m", "kibo_ctrl", "serve", "--runtime", "sim", "--listen", first.address]
    command += ["--http-listen", "", "--data-dir", str(tmp_path / "second")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, "a second server took a port another server serves"
    assert f"cannot listen on {first.address}" in result.stderr, result.stderr
    assert "in use" in result.stderr


async def test_two_node_agents_on_one_host_each_serve_their_own_guests(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    _require_sandbox()
    server = server_factory("--no-local-node", "--node-timeout-ms", "3000", "--settle-ms", "3000")
    hop = free_port()
    flags = {name: (*NODE_FLAGS, "--labels", f"name={name}") for name in ("node-a", "node-b")}
    taken = ("--data-plane-listen", f"127.0.0.1:{hop}")
    a = NodeProcess(server.address, tmp_path / "node-a", "node-a", (*flags["node-a"], *taken), runtime="process")
    b = NodeProcess(server.address, tmp_path / "node-b", "node-b", (*flags["node-b"], *taken), runtime="process")
    nodes = [a, b]
    try:
        a.start()
        async with Client.connect(server.address) as client:
            # The first agent serves the hop; only then is the second started on the same port.
            placed_a = await eventually(
                lambda: _available(client, "node-a"), within=30, what="a workspace AVAILABLE on node-a"
            )
            b.start()
            assert _exits(b) == 2, b.log()
            assert f"cannot listen on 127.0.0.1:{hop}" in b.log() and "port of its own" in b.log(), b.log()

            # With a port of its own, each node serves its own guests: every exec answers.
            b.flags = (*flags["node-b"], "--data-plane-listen", f"127.0.0.1:{free_port()}")
            b.start()
            placed_b = await eventually(
                lambda: _available(client, "node-b"), within=30, what="a workspace AVAILABLE on node-b"
            )
            plane = DataPlane(client)
            for workspace in (placed_a, placed_b):
                credential = await plane.credential(workspace.workspace_id)
                for _ in range(8):  # connections split between two nodes failed about half the time
                    code, out, _ = await plane.exec(credential, "cat", "/proc/sys/kernel/hostname")
                    assert code == 0, out
            for workspace in (placed_a, placed_b):
                await client.delete(workspace.workspace_id)
                assert (await client.wait_steady(workspace.workspace_id, within=30)).state == S.WORKSPACE_STATE_DELETED
    finally:
        for node in nodes:
            if node.process is not None:
                node.kill()
            reap(node.data_dir)


async def _available(client: Client, node: str) -> wp.Workspace | None:
    workspace = await client.create(resources=SMALL, node_selector={"name": node})
    if workspace.state != S.WORKSPACE_STATE_AVAILABLE:
        return None
    assert workspace.node_id == node
    return workspace


def test_the_guest_hop_binds_the_route_to_the_control_plane_by_default(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Not every interface: the control plane is on loopback here, so the hop is too."""
    _require_sandbox()
    server = server_factory("--no-local-node")
    with socket.socket() as probe:  # the default port must be free for this test's node
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", 50052))
    node = NodeProcess(server.address, tmp_path / "node-d", "node-d", NODE_FLAGS, runtime="process").start()
    try:
        deadline = time.monotonic() + 30
        while not _listening(50052) and time.monotonic() < deadline:
            assert node.process is not None and node.process.poll() is None, node.log()
            time.sleep(0.2)
        # 127.0.0.1 as /proc/net/tcp{,6} write it (grpc binds it v4-mapped); all zeros would be
        # every interface.
        loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
        assert _listening(50052) and set(_listening(50052)) <= loopback, (_listening(50052), node.log())
        assert "hop to this node's guests on 127.0.0.1:50052" in node.log()
    finally:
        node.kill()
        reap(node.data_dir)
