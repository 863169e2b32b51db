"""The examples under examples/python/, run as a user would: `python X.py --server HOST:PORT`,
against a server with authentication on (its default) and nothing but the SDK's token
discovery to find the token: the server's pointer to its admin token, whatever its --data-dir.

Every example deletes what it made (issue 36 item 1: run one after another, they used to
leave a STOPPED and an AVAILABLE workspace each time): the `made` fixture deletes what a test
made itself, then fails the test if any other workspace is left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kibotos
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.sim.v1 import simulator_pb2 as sim

from tests.integration.test_auth import make_token
from tests.server import ServerProcess
from tests.system.test_real_clients import NODE_EXAMPLE, go_client, node_client

# The compiled Go and Node examples, built as tests/system/test_real_clients.py builds them.
__all__ = ["go_client", "node_client"]

S = wp.WorkspaceState
EXAMPLES = Path(__file__).parents[2] / "examples" / "python"


@pytest.fixture(scope="module")
def firecracker(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A server with tokens required, like `kibo-ctrl serve` without flags (module scope: the
    shared session servers run without auth)."""
    return server_factory("--sim-backend", "firecracker", auth=True)


@pytest.fixture
def sdk(firecracker: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(firecracker.address) as client:
        yield client


def _live(client: kibotos.Client) -> set[str]:
    return {w.workspace_id for w in client.list_workspaces()}


@pytest.fixture
def made(sdk: kibotos.Client) -> Iterator[list[str]]:
    """The workspaces the test made itself (it appends them), deleted after it; then no other
    workspace may be left than those there before: what an example made, it deleted."""
    before = _live(sdk)
    mine: list[str] = []
    yield mine
    for workspace_id in mine:
        if sdk.get_workspace(workspace_id).state != S.WORKSPACE_STATE_DELETED:
            sdk.delete_workspace(workspace_id)
    left = _live(sdk) - before
    assert not left, f"the examples left workspaces behind: {sorted(left)}"


def run(server: ServerProcess, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "KIBO_TOKEN"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--server", server.address, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def test_the_examples_server_refuses_calls_without_a_token(firecracker: ServerProcess) -> None:
    with (
        kibotos.Client(firecracker.address, token="not-a-token") as client,
        pytest.raises(kibotos.UnauthenticatedError),
    ):
        client.get_capabilities()


def test_every_example_is_tested() -> None:
    """The Python examples here; the Go and Node clients at the end of this file."""
    tested = {
        "stop_with_settle.py",
        "start_and_wait.py",
        "delete_and_wait.py",
        "recover_from_failed.py",
        "async_stop_start.py",
    }
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_stop_with_settle(firecracker: ServerProcess, sdk: kibotos.Client, made: list[str]) -> None:
    workspace_id = sdk.create_workspace().workspace.workspace_id
    made.append(workspace_id)
    done = run(firecracker, "stop_with_settle.py", "--workspace", workspace_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [workspace_id, "STOPPED", "STOP_DURABILITY_CONFIRMED"]
    stop_id = sdk.get_workspace(workspace_id).last_stop.command_id
    assert stop_id.startswith("example/")


def test_start_and_wait(firecracker: ServerProcess, sdk: kibotos.Client, made: list[str]) -> None:
    workspace_id = sdk.create_workspace().workspace.workspace_id
    made.append(workspace_id)
    sdk.stop_workspace(workspace_id)
    done = run(firecracker, "start_and_wait.py", "--workspace", workspace_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [workspace_id, "AVAILABLE", "2"]


def test_examples_run_without_a_workspace_given_one_after_another_leave_nothing(
    firecracker: ServerProcess, sdk: kibotos.Client, made: list[str]
) -> None:
    """Issue 36 item 1, replayed: `for f in stop_with_settle start_and_wait delete_and_wait
    async_stop_start; do python examples/python/$f.py; done`. Each does its work on a workspace
    of its own and deletes it (`made` checks that nothing else is left)."""
    printed = {
        "stop_with_settle.py": ["STOPPED", "STOP_DURABILITY_CONFIRMED"],
        "start_and_wait.py": ["AVAILABLE", "2"],
        "delete_and_wait.py": ["DELETED"],
        "async_stop_start.py": ["STOPPED", "AVAILABLE", "2"],
    }
    for name, words in printed.items():
        done = run(firecracker, name)
        assert done.returncode == 0, done.stderr
        workspace_id = done.stdout.split()[0]
        assert [w for w in done.stdout.split() if w != workspace_id] == words, done.stdout
        assert sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_DELETED, name


def test_delete_and_wait(firecracker: ServerProcess, sdk: kibotos.Client, made: list[str]) -> None:
    workspace_id = sdk.create_workspace().workspace.workspace_id
    done = run(firecracker, "delete_and_wait.py", "--workspace", workspace_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [workspace_id, "DELETED"]
    assert sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_DELETED


def test_recover_from_failed_holding_execution(
    firecracker: ServerProcess, sdk: kibotos.Client, made: list[str]
) -> None:
    workspace_id = sdk.create_workspace().workspace.workspace_id
    made.append(workspace_id)
    sdk.inject_fault(workspace_id, sim.FAULT_VMM_CRASH)
    deadline = time.monotonic() + 10
    while sdk.get_workspace(workspace_id).state != S.WORKSPACE_STATE_FAILED:
        assert time.monotonic() < deadline, "the workspace did not become FAILED"
        time.sleep(0.01)
    done = run(firecracker, "recover_from_failed.py", "--workspace", workspace_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["force stop: STOPPED", "start: AVAILABLE"]


def test_recover_from_failed_not_holding_execution(
    firecracker: ServerProcess, sdk: kibotos.Client, made: list[str]
) -> None:
    # Arming a fault for the next workspace created reaches the whole node: an operator's.
    with kibotos.Client(firecracker.address, token=make_token(firecracker, "ops", "operator")) as operator:
        operator.inject_fault("", sim.FAULT_CREATE_FAIL)
    with pytest.raises(kibotos.CommandFailedError) as caught:
        sdk.create_workspace()
    assert caught.value.workspace is not None
    workspace_id = caught.value.workspace.workspace_id
    made.append(workspace_id)
    done = run(firecracker, "recover_from_failed.py", "--workspace", workspace_id)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("force stop rejected: ") and "start it directly" in lines[0]
    assert lines[1] == "start: AVAILABLE"


def test_recover_from_failed_when_both_are_rejected(
    firecracker: ServerProcess, sdk: kibotos.Client, made: list[str]
) -> None:
    workspace_id = sdk.create_workspace().workspace.workspace_id
    made.append(workspace_id)
    sdk.stop_workspace(workspace_id)
    sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    sdk.start_workspace(workspace_id, settle=False)  # STARTING, stalled: neither is accepted
    try:
        done = run(firecracker, "recover_from_failed.py", "--workspace", workspace_id)
    finally:
        sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[-1] == "both rejected; the workspace is STARTING: act on that state"


def _client_run(argv: list[str], token: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "KIBO_TOKEN": token}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=environment, cwd=cwd)


def test_the_go_example_sends_the_token(go_client: Path, firecracker: ServerProcess) -> None:
    refused = _client_run([str(go_client), "-addr", firecracker.address], "not-a-token")
    assert refused.returncode != 0 and "Unauthenticated" in refused.stderr + refused.stdout, refused.stdout
    done = _client_run([str(go_client), "-addr", firecracker.address], firecracker.admin_token)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert done.stdout.rstrip().endswith("ok") and "stopped: WORKSPACE_STATE_STOPPED" in done.stdout


@pytest.mark.parametrize("transport", ["connect", "grpc-web"])
def test_the_node_example_sends_the_token(node_client: list[str], firecracker: ServerProcess, transport: str) -> None:
    argv = [*node_client, "--base-url", f"http://{firecracker.http_address}", "--transport", transport]
    refused = _client_run(argv, "not-a-token", cwd=NODE_EXAMPLE)
    assert refused.returncode != 0 and "nauthenticated" in refused.stderr + refused.stdout, refused.stdout
    done = _client_run(argv, firecracker.admin_token, cwd=NODE_EXAMPLE)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "stop durability: STOP_DURABILITY_CONFIRMED" in done.stdout
