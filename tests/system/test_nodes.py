"""Node agents as their own processes (issue 13): a control plane with no node of its own
(`serve --no-local-node`) and two `kibo-ctrl node --runtime sim` processes on loopback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.node.v1 import node_admin_service_pb2 as adm

from tests.client import Client, S, meta, rejected
from tests.integration.test_auth import make_token
from tests.integration.test_node_api import join_token
from tests.nodes import NodeProcess, admin, list_nodes
from tests.server import ServerProcess
from tests.system.test_durability import eventually

pytestmark = pytest.mark.timeout(180)

# The lease (--node-timeout-ms): short, so a killed node is noticed within the test.
LEASE_MS = "3000"


@pytest.fixture
def cluster(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> Iterator[tuple[ServerProcess, dict[str, NodeProcess]]]:
    server = server_factory("--no-local-node", "--node-timeout-ms", LEASE_MS)
    labels = {"node-a": "zone=a", "node-b": "zone=b,disk=ssd"}
    nodes = {
        name: NodeProcess(server.address, tmp_path / name, name, ("--labels", labels[name])).start()
        for name in ("node-a", "node-b")
    }
    try:
        yield server, nodes
    finally:
        for node in nodes.values():
            node.kill()


async def provisionings(client: Client, workspace_id: str) -> int:
    """How many launches the workspace's instances began (each begins PROVISIONING once)."""
    return sum(1 for e in await client.events(workspace_id) if "provisioning on" in e.message)


async def both_joined(server: ServerProcess) -> bool:
    nodes = await list_nodes(server.address)
    return all(nodes.get(n) is not None and nodes[n].state == adm.NODE_STATE_READY for n in ("node-a", "node-b"))


async def test_two_node_processes_run_the_lifecycle_and_survive_a_kill(
    cluster: tuple[ServerProcess, dict[str, NodeProcess]],
) -> None:
    server, nodes = cluster
    await eventually(lambda: both_joined(server), within=60, what="both nodes joined")
    async with Client.connect(server.address) as client:
        created = [await client.create() for _ in range(6)]
        assert {w.state for w in created} == {S.WORKSPACE_STATE_AVAILABLE}
        # The scheduler spreads: both nodes run some.
        assert {w.node_id for w in created} == {"node-a", "node-b"}
        for workspace in created[:2]:
            assert (await client.stop(workspace.workspace_id)).command.state
            assert (await client.wait_steady(workspace.workspace_id)).state == S.WORKSPACE_STATE_STOPPED
            await client.start(workspace.workspace_id)
            assert (await client.wait_steady(workspace.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        await client.delete(created[2].workspace_id)
        assert (await client.wait_steady(created[2].workspace_id)).state == S.WORKSPACE_STATE_DELETED
        running = [await client.get(w.workspace_id) for w in created if w is not created[2]]
        on_a = [w for w in running if w.node_id == "node-a"]
        assert on_a, "some workspace runs on node-a"
        launches = {w.workspace_id: await provisionings(client, w.workspace_id) for w in running}

        # kill -9 node-a: after its lease its workspaces are UNKNOWN; node-b's stay AVAILABLE.
        nodes["node-a"].kill()

        async def unknown() -> bool:
            states = [(await client.get(w.workspace_id)).state for w in on_a]
            return all(s == S.WORKSPACE_STATE_UNKNOWN for s in states)

        await eventually(unknown, within=30, what="node-a's workspaces UNKNOWN after its lease")
        for workspace in running:
            if workspace.node_id == "node-b":
                assert (await client.get(workspace.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        assert (await list_nodes(server.address))["node-a"].state == adm.NODE_STATE_SILENT

        # Started again on the same data dir: it rejoins, adopts, and its workspaces are back.
        nodes["node-a"].start()

        async def back() -> bool:
            states = [(await client.get(w.workspace_id)).state for w in on_a]
            return all(s == S.WORKSPACE_STATE_AVAILABLE for s in states)

        await eventually(back, within=60, what="node-a's workspaces AVAILABLE again")
        # Nothing was launched again: no instance began a second launch.
        for workspace in running:
            assert await provisionings(client, workspace.workspace_id) == launches[workspace.workspace_id]
            assert (await client.get(workspace.workspace_id)).execution_generation == workspace.execution_generation

        # Cordon node-b: new workspaces all go to node-a.
        cordoned = await admin(server.address, "CordonNode", "node-b")
        assert cordoned.state == adm.NODE_STATE_CORDONED
        later = [await client.create() for _ in range(3)]
        assert {w.node_id for w in later} == {"node-a"}
        assert {w.state for w in later} == {S.WORKSPACE_STATE_AVAILABLE}

        # Drain node-a (node-b uncordoned): DRAINING while it holds instances, new ones go to
        # node-b, and DRAINED once its workspaces are gone.
        await admin(server.address, "UncordonNode", "node-b")
        draining = await admin(server.address, "DrainNode", "node-a")
        assert draining.state == adm.NODE_STATE_DRAINING and draining.instances > 0
        moved = await client.create()
        assert moved.node_id == "node-b"
        for workspace in [*running, *later]:
            if (await client.get(workspace.workspace_id)).node_id == "node-a":
                await client.delete(workspace.workspace_id)
                assert (await client.wait_steady(workspace.workspace_id)).state == S.WORKSPACE_STATE_DELETED

        async def drained() -> bool:
            return (await list_nodes(server.address))["node-a"].state == adm.NODE_STATE_DRAINED

        await eventually(drained, within=15, what="node-a DRAINED")
    # Both agents stop cleanly on SIGTERM (their sandboxes would keep running).
    assert nodes["node-a"].stop() == 0, nodes["node-a"].log()
    assert nodes["node-b"].stop() == 0, nodes["node-b"].log()


async def test_node_selectors_place_on_the_nodes_whose_labels_match(
    cluster: tuple[ServerProcess, dict[str, NodeProcess]],
) -> None:
    server, _ = cluster
    await eventually(lambda: both_joined(server), within=60, what="both nodes joined")
    async with Client.connect(server.address) as client:
        on_b = [await client.create(node_selector={"zone": "b"}) for _ in range(3)]
        assert {(w.node_id, w.state) for w in on_b} == {("node-b", S.WORKSPACE_STATE_AVAILABLE)}
        assert dict(on_b[0].spec.node_selector) == {"zone": "b"}
        both = await client.create(node_selector={"disk": "ssd", "zone": "b"})
        assert both.node_id == "node-b"
        # No node has both labels: the workspace waits, saying why.
        request = ws.CreateWorkspaceRequest(
            metadata=meta(), spec=wp.WorkspaceSpec(node_selector={"disk": "ssd", "zone": "a"})
        )
        waiting = (await client.ws.CreateWorkspace(request)).workspace

        async def unschedulable() -> bool:
            events = await client.events(waiting.workspace_id)
            return any("no ready node has the labels disk=ssd,zone=a" in e.message for e in events)

        await eventually(unschedulable, within=20, what="an UNSCHEDULABLE event naming the labels")
        assert (await client.get(waiting.workspace_id)).state == S.WORKSPACE_STATE_CREATING
        # A selector that is no label: refused, naming the field.
        bad = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(node_selector={"Bad Key!": "x"}))
        error = await rejected(client.ws.CreateWorkspace(bad))
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.detail.field == "spec.node_selector"


async def test_a_node_started_before_its_control_plane_joins_when_it_comes(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A node agent retries until the control plane answers (start order does not matter),
    and a control plane restart is a resumed feed (a snapshot: new epoch), not a lost one."""
    server = server_factory("--no-local-node", "--node-timeout-ms", LEASE_MS)
    node = NodeProcess(server.address, tmp_path / "node-c", "node-c").start()
    try:
        await eventually(lambda: _ready(server, "node-c"), within=60, what="node-c joined")
        async with Client.connect(server.address) as client:
            workspace = await client.create()
            assert workspace.node_id == "node-c" and workspace.state == S.WORKSPACE_STATE_AVAILABLE
        server.restart()
        async with Client.connect(server.address) as client:
            await client.stop(workspace.workspace_id)
            assert (await client.wait_steady(workspace.workspace_id, within=20)).state == S.WORKSPACE_STATE_STOPPED
            await client.start(workspace.workspace_id)
            assert (await client.wait_steady(workspace.workspace_id, within=20)).state == S.WORKSPACE_STATE_AVAILABLE
    finally:
        node.kill()


async def _ready(server: ServerProcess, node_id: str) -> bool:
    node = (await list_nodes(server.address)).get(node_id)
    await asyncio.sleep(0)
    return node is not None and node.state == adm.NODE_STATE_READY


def kibo(server: ServerProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "kibo"), "--server", server.address, "--token", token, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


async def test_a_node_joins_with_its_token_and_an_operator_manages_it_with_kibo_node(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory("--no-local-node", "--node-timeout-ms", LEASE_MS, auth=True)
    token = join_token(server, "node-s")
    operator = make_token(server, "default", "operator")
    # A join token names its node: started as another node, the agent gets no certificate and exits.
    impostor = NodeProcess(server.address, tmp_path / "node-t", "node-t", ("--token", token)).start()
    assert impostor.process is not None
    assert impostor.process.wait(30) == 2
    assert "no active join token of node node-t" in impostor.log()
    node = NodeProcess(server.address, tmp_path / "node-s", "node-s", ("--token", token, "--labels", "zone=a")).start()
    try:

        def listed() -> dict[str, Any]:
            result = kibo(server, operator, "node", "list", "-o", "json")
            assert result.returncode == 0, result.stderr
            return {n["id"]: n for n in json.loads(result.stdout)["nodes"]}

        async def joined() -> bool:
            return listed().get("node-s", {}).get("state") == "NODE_STATE_READY"

        await eventually(joined, within=60, what="node-s joined with its token")
        assert listed()["node-s"]["labels"] == {"zone": "a"}
        assert "node-t" not in listed()
        # A tenant admin may not manage nodes.
        refused = kibo(server, make_token(server, "default", "admin"), "node", "cordon", "node-s")
        assert refused.returncode != 0 and "PERMISSION_DENIED" in refused.stderr
        assert listed()["node-s"]["state"] == "NODE_STATE_READY"

        cordoned = kibo(server, operator, "node", "cordon", "node-s")
        assert cordoned.returncode == 0 and "CORDONED" in cordoned.stdout, cordoned.stderr
        async with Client.connect(server.address, server.admin_token) as client:
            response = await client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta()))
            workspace_id = response.workspace.workspace_id
            await asyncio.sleep(0.5)
            waiting = await client.get(workspace_id)
            assert waiting.state == S.WORKSPACE_STATE_CREATING and not waiting.node_id
            assert kibo(server, operator, "node", "uncordon", "node-s").returncode == 0
            placed = await client.wait_steady(workspace_id, within=20)
            assert placed.state == S.WORKSPACE_STATE_AVAILABLE and placed.node_id == "node-s"
        # kibo workspace create --node-selector: placed on the node whose labels match.
        created = kibo(server, server.admin_token, "workspace", "create", "--node-selector", "zone=a", "-o", "json")
        assert created.returncode == 0, created.stderr
        assert '"nodeId": "node-s"' in created.stdout and '"zone": "a"' in created.stdout
    finally:
        node.kill()


async def test_a_silent_node_is_forgotten_only_when_asked_and_its_disks_only_with_abandon_disks(
    cluster: tuple[ServerProcess, dict[str, NodeProcess]],
) -> None:
    """kibo node forget (issue 26): node-a dies for good. Its workspaces are UNKNOWN and their
    disks are on it: a forget is refused without --abandon-disks (nothing changes), and on a
    live node; with it, the running one is released (FAILED, start directly) and both start
    on node-b with empty disks. node-a, started again, may not join under its ID."""
    server, nodes = cluster
    await eventually(lambda: both_joined(server), within=60, what="both nodes joined")
    async with Client.connect(server.address) as client:
        await admin(server.address, "CordonNode", "node-b")
        running = await client.create()
        stopped = await client.create()
        assert running.node_id == stopped.node_id == "node-a"
        await client.stop(stopped.workspace_id)
        await client.wait_for(stopped.workspace_id, S.WORKSPACE_STATE_STOPPED)
        await admin(server.address, "UncordonNode", "node-b")
        nodes["node-a"].kill()
        await eventually(lambda: _state_is(client, running.workspace_id, S.WORKSPACE_STATE_UNKNOWN), 30, "UNKNOWN")

        kibo = [str(Path(sys.executable).parent / "kibo"), "--server", server.address, "node", "forget"]
        alive = await _run([*kibo, "node-b"])
        assert alive.returncode != 0 and "alive" in alive.stderr, alive
        refused = await _run([*kibo, "node-a"])
        assert refused.returncode != 0 and "2 workspaces and" in refused.stderr, refused
        assert "--abandon-disks" in refused.stderr
        assert (await client.get(running.workspace_id)).state == S.WORKSPACE_STATE_UNKNOWN
        assert (await list_nodes(server.address))["node-a"].state == adm.NODE_STATE_SILENT

        forgot = await _run([*kibo, "node-a", "--abandon-disks", "-o", "json"])
        assert forgot.returncode == 0, forgot.stderr
        answer = json.loads(forgot.stdout)
        assert answer["releasedWorkspaceIds"] == [running.workspace_id], answer
        assert sorted(answer["abandonedWorkspaceIds"]) == sorted([running.workspace_id, stopped.workspace_id])
        assert (await list_nodes(server.address))["node-a"].state == adm.NODE_STATE_FORGOTTEN
        released = await client.get(running.workspace_id)
        assert released.state == S.WORKSPACE_STATE_FAILED, released
        for workspace in (running, stopped):
            await client.start(workspace.workspace_id)
            placed = await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=30)
            assert placed.node_id == "node-b"

        # node-a comes back with its old data dir: refused, and it says why.
        nodes["node-a"].start()

        async def told() -> bool:
            return "forgotten" in nodes["node-a"].log()

        await eventually(told, 30, "node-a told it was forgotten")
        assert (await list_nodes(server.address))["node-a"].state == adm.NODE_STATE_FORGOTTEN


async def _state_is(client: Client, workspace_id: str, state: int) -> bool:
    return (await client.get(workspace_id)).state == state


async def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
