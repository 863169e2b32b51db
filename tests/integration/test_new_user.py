"""Issue 36 ("small things a new user trips on"), replayed against simulated servers: a volume's
capacity in its workspace, the first token of a single-machine install, a data dir whose
workspaces another runtime ran, the start line of a server without a local node, the server
pointers local clients read, and a revoked data-plane credential's error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import kibotos
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibotos import token_discovery

from tests.integration.test_metrics import fetch
from tests.postgres import Databases
from tests.server import ServerProcess, free_port

S = wp.WorkspaceState
Factory = Callable[..., ServerProcess]


@pytest.fixture
def sdk(firecracker: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(firecracker.address, token="") as client:
        yield client


# -- item 2: a volume's capacity in the workspace ---------------------------------------------------


def test_a_volumes_capacity_shows_in_its_workspace(sdk: kibotos.Client) -> None:
    """`kibo volume create --capacity 5` showed 5 GiB, the same volume in the workspace 0."""
    volume = sdk.create_volume(5)
    kept = [volume.volume_id]  # bound with --volume: kept on delete, deleted at the end
    spec = wp.WorkspaceSpec(
        volumes=[wp.VolumeBinding(volume_id=volume.volume_id, mount_path="/mnt/five")],
        data_volume_gib=3,
    )
    workspace = sdk.create_workspace(spec).workspace
    try:
        capacities = {b.mount_path: b.capacity_gib for b in sdk.get_workspace(workspace.workspace_id).spec.volumes}
        assert capacities == {"/data": 3, "/mnt/five": 5}
        own = next(b.volume_id for b in workspace.spec.volumes if b.mount_path == "/data")
        assert sdk.get_volume(own).capacity_gib == 3
        # Bound later (STOPPED), a volume's capacity comes with it too; listed workspaces carry it.
        sdk.stop_workspace(workspace.workspace_id)
        seven = sdk.create_volume(7)
        kept.append(seven.volume_id)
        bound = sdk.bind_workspace_volume(workspace.workspace_id, seven.volume_id, "/mnt/seven").workspace
        assert {b.mount_path: b.capacity_gib for b in bound.spec.volumes}["/mnt/seven"] == 7
        (listed,) = [w for w in sdk.list_workspaces() if w.workspace_id == workspace.workspace_id]
        assert sorted(b.capacity_gib for b in listed.spec.volumes) == [3, 5, 7]
    finally:
        sdk.delete_workspace(workspace.workspace_id)
        for volume_id in kept:
            sdk.delete_volume(volume_id)


# -- item 4: the first token of a single-machine install --------------------------------------------


def test_the_first_token_of_an_embedded_server_sees_its_node_and_metrics(server_factory: Factory) -> None:
    """`kibo node list` and /metrics with the first-start token were PERMISSION_DENIED."""
    server = server_factory(auth=True)
    with kibotos.Client(server.address, token=server.admin_token) as owner:
        assert [n.id for n in owner.list_nodes()] == ["node-1"]
    status, text = fetch(server, server.admin_token)
    assert status == 200 and "kibo_node_capacity_vcpus" in text, text[:300]
    listed = subprocess.run(
        [sys.executable, "-m", "kibo_ctrl", "token", "list", "--data-dir", str(server.data_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert listed[1:3] == ["default", "operator"], listed
    assert "created operator token" in server.log()


def test_a_replicas_first_token_on_postgresql_stays_a_tenant_admin(
    server_factory: Factory, postgres_databases: Databases
) -> None:
    """Minting there needs the database: the token file's reader gets no more than a tenant admin."""
    server = server_factory("--no-local-node", auth=True, store=postgres_databases.create())
    with (
        kibotos.Client(server.address, token=server.admin_token) as admin,
        pytest.raises(kibotos.PermissionDeniedError) as caught,
    ):
        admin.list_nodes()
    assert "kibo-ctrl token create --tenant default --role operator" in caught.value.hint
    assert fetch(server, server.admin_token)[0] == 403


# -- item 6: a data dir whose workspaces another runtime ran ---------------------------------------


def test_a_server_refuses_the_workspaces_of_another_runtime_and_leaves_them(
    server_factory: Factory, tmp_path: Path
) -> None:
    """The README's tour switches runtimes on one data dir: the workspaces the first runtime left
    came back FAILED under the second. Now the second does not start, says why, and leaves them."""
    server = server_factory(data_dir=tmp_path / "data")
    with kibotos.Client(server.address, token="") as client:
        workspace_id = client.create_workspace().workspace.workspace_id
    server.stop()
    port = free_port()
    serve = [sys.executable, "-m", "kibo_ctrl", "serve", "--runtime", "process", "--insecure-no-auth"]
    try:
        refused = subprocess.run(
            [*serve, "--data-dir", str(server.data_dir), "--listen", f"127.0.0.1:{port}", "--http-listen", ""],
            capture_output=True,
            text=True,
            timeout=60,  # a refusal takes a second or two
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the process runtime started on the simulator's workspaces instead of refusing")
    assert refused.returncode == 2, refused.stderr
    said = " ".join(refused.stderr.split())
    for words in ("1 workspace (1 with an instance)", "node-1 ran on the sim runtime", "--runtime process cannot"):
        assert words in said, said
    assert "--allow-runtime-change" in said and "another --data-dir" in said
    # Nothing was touched: the first runtime finds its workspace as it left it.
    server.start()
    with kibotos.Client(server.address, token="") as client:
        assert client.get_workspace(workspace_id).state == S.WORKSPACE_STATE_AVAILABLE
        client.delete_workspace(workspace_id)


# -- item 7: the start line, and the pointers local clients read ------------------------------------


def test_a_server_without_a_local_node_names_no_runtime(server_factory: Factory) -> None:
    server = server_factory("--no-local-node", "--log-level", "info")
    (line,) = [line for line in server.log().splitlines() if "serving gRPC on" in line]
    assert "no local node" in line and "runtime sim" not in line, line
    embedded = server_factory("--log-level", "info")
    assert "runtime sim/firecracker" in embedded.log()


def test_a_stopping_server_removes_its_pointer_and_a_killed_ones_is_passed_over(server_factory: Factory) -> None:
    """~/.local/state/kibo/servers/ kept a pointer per port forever (19 found), and discovery
    could follow one to a token of a server gone, its port reused."""
    stopped = server_factory(auth=True)
    pointer = token_discovery.pointer_path(stopped.address)
    owner = pointer.with_name(pointer.name + ".pid")
    assert pointer.read_text().strip() == str((stopped.data_dir / "admin.token").resolve())
    assert owner.read_text().split()[0] == str(stopped.process.pid if stopped.process else 0)
    assert stopped.stop() == 0
    assert not pointer.exists() and not owner.exists()

    killed = server_factory(auth=True)
    gone = token_discovery.pointer_path(killed.address)
    assert killed.process is not None
    os.kill(killed.process.pid, signal.SIGKILL)
    killed.process.wait(10)
    assert gone.exists()
    found = token_discovery.discover(killed.address)
    assert found.token != killed.admin_token, "followed the pointer of a server that is gone"
    assert f"{gone} (passed over: its server, PID {killed.process.pid}, is gone)" in found.describe()
    # The next server to start clears it away.
    server_factory(auth=True)
    assert not gone.exists()


# -- item 5: a revoked data-plane credential --------------------------------------------------------


def test_a_revoked_credentials_error_gives_no_admin_token_advice(server_factory: Factory) -> None:
    server = server_factory(auth=True)
    with kibotos.Client(server.address) as client:
        workspace_id = client.create_workspace().workspace.workspace_id
        credential = client.issue_data_plane_credential(workspace_id).credential
        client.revoke_workspace_data_plane_access(workspace_id)
        with pytest.raises(kibotos.UnauthenticatedError) as caught:
            client.exec_workspace_command(credential, ["true"])
        text = str(caught.value)
        assert "credential was revoked" in text, text
        assert "admin.token" not in text and "the token came from" not in text, text
        # The bearer token's own refusals still say where the token came from.
        with (
            kibotos.Client(server.address, token="kibo_not-a-token") as wrong,
            pytest.raises(kibotos.UnauthenticatedError) as refused,
        ):
            wrong.get_workspace(workspace_id)
        assert "the token came from token=" in str(refused.value)
        client.delete_workspace(workspace_id)
