"""Issue 36 ("small things a new user trips on"), replayed with the real `kibo` command line
(typer's runner in process, as tests/system/test_cli.py) and the README's own snippet: a
volume's capacity in `kibo workspace get -o json`, `kibo workspace stop --all`, the hints of a
resize on an AVAILABLE workspace and of a wrong server address, and a process runtime taking
over (--allow-runtime-change) a workspace the simulator ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kibotos
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo_cli.exit_codes import ExitCode
from kibo_cli.main import app

from tests.server import ServerProcess
from tests.system.test_cli import kibo, ok, runner
from tests.system.test_process_runtime import FLAGS as PROCESS_FLAGS
from tests.system.test_process_runtime import _require_sandbox, reap
from tests.system.test_readme import block_after, section

S = wp.WorkspaceState
Factory = Callable[..., ServerProcess]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def own(server_factory: Factory) -> Iterator[ServerProcess]:
    """A server of this module's own: `stop --all` reaches every workspace on it."""
    server = server_factory()
    yield server
    server.stop()


@pytest.fixture
def sdk(own: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(own.address, token="") as client:
        yield client
        for workspace in client.list_workspaces():  # each test starts on an empty server
            client.delete_workspace(workspace.workspace_id)


def created(server: ServerProcess, *args: str) -> str:
    return ok(kibo(server, "workspace", "create", "-q", *args)).stdout.strip()


# -- item 2 -----------------------------------------------------------------------------------------


def test_a_volumes_capacity_reads_in_workspace_get_json(own: ServerProcess, sdk: kibotos.Client) -> None:
    volume_id = ok(kibo(own, "volume", "create", "-q", "--capacity", "5")).stdout.strip()
    workspace_id = created(own, "--volume", volume_id)
    shown = json.loads(ok(kibo(own, "workspace", "get", workspace_id, "-o", "json")).stdout)
    capacities = {v["volumeId"]: v["capacityGib"] for v in shown["spec"]["volumes"]}
    own_volume = next(v["volumeId"] for v in shown["spec"]["volumes"] if v["mountPath"] == "/data")
    assert capacities == {volume_id: 5, own_volume: 10}, capacities  # 10: the server's default
    ok(kibo(own, "workspace", "delete", "--yes", workspace_id))
    ok(kibo(own, "volume", "delete", "--yes", volume_id))


# -- item 3: stop it all ------------------------------------------------------------------------------


def _readme_stop_it_all(server: ServerProcess) -> subprocess.CompletedProcess[str]:
    snippet = block_after(section("What keeps running"), "To stop it all")
    environment = {k: v for k, v in os.environ.items() if k != "KIBO_TOKEN"}
    environment.update(KIBO_SERVER=server.address, PATH=f"{BIN}:{environment.get('PATH', '')}")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", snippet], env=environment, capture_output=True, text=True, timeout=120
    )


def test_the_readmes_stop_it_all_with_nothing_available_stops_nothing(own: ServerProcess, sdk: kibotos.Client) -> None:
    """It ran `kibo workspace stop ""` (and failed) when nothing was AVAILABLE."""
    stopped = created(own)
    ok(kibo(own, "workspace", "stop", stopped))
    done = _readme_stop_it_all(own)
    assert done.returncode == 0, done.stderr
    assert "nothing to stop" in done.stderr and done.stdout == "", done.stdout + done.stderr
    assert sdk.get_workspace(stopped).last_stop.command_id, "the STOPPED workspace was not touched"


def test_stop_all_stops_every_available_workspace_with_the_labels_given(
    own: ServerProcess, sdk: kibotos.Client
) -> None:
    docs = [created(own, "--label", "team=docs") for _ in range(3)]
    other = created(own, "--label", "team=infra")
    # No terminal to confirm on: refused, nothing sent.
    refused = kibo(own, "workspace", "stop", "--all", "--label", "team=docs")
    assert refused.exit_code == ExitCode.USAGE and "pass --yes" in refused.stderr
    assert all(sdk.get_workspace(w).state == S.WORKSPACE_STATE_AVAILABLE for w in [*docs, other])
    done = ok(kibo(own, "workspace", "stop", "--all", "--label", "team=docs", "--yes"))
    for workspace_id in docs:
        assert f"Will stop {workspace_id}." in done.stderr
        assert f"{workspace_id} is STOPPED" in done.stdout, done.stdout
        assert sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_STOPPED
    assert sdk.get_workspace(other).state == S.WORKSPACE_STATE_AVAILABLE
    # The rest, as JSON; then nothing is left to stop.
    rest = json.loads(ok(kibo(own, "workspace", "stop", "--all", "--yes", "-o", "json")).stdout)
    assert [w["workspace"]["workspaceId"] for w in rest["workspaces"]] == [other]
    assert "nothing to stop" in ok(kibo(own, "workspace", "stop", "--all", "--yes")).stderr


def test_stop_all_takes_no_id_force_or_command_id(own: ServerProcess) -> None:
    for extra in (["ws-x"], ["--force"], ["--command-id", "mine/1"]):
        refused = kibo(own, "workspace", "stop", "--all", "--yes", *extra)
        assert refused.exit_code == ExitCode.USAGE and "--all" in refused.stderr, refused.output
    assert kibo(own, "workspace", "stop").exit_code == ExitCode.USAGE


# -- item 5: hints ------------------------------------------------------------------------------------


def test_resize_on_an_available_workspace_says_stop_it_first(own: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = created(own)
    rejected = kibo(own, "workspace", "resize", workspace_id, "--vcpus", "4")
    assert rejected.exit_code == ExitCode.CONFLICT
    assert "next: stop it first" in rejected.stderr, rejected.stderr


def test_the_http_port_is_named_at_once(own: ServerProcess) -> None:
    """KIBO_SERVER=127.0.0.1:8080 said "Trying to connect an http1.x server"; a create retried it
    until its --timeout."""
    started = time.monotonic()
    wrong = runner.invoke(app, ["--server", own.http_address, "workspace", "create"])
    assert wrong.exit_code == ExitCode.UNAVAILABLE, wrong.output
    assert "it is the server's HTTP port" in wrong.stderr and "50051" in wrong.stderr, wrong.stderr
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_server_url_says_drop_the_scheme(own: ServerProcess, scheme: str) -> None:
    """KIBO_SERVER=http://127.0.0.1:50051 said "Misformatted domain name"."""
    url = f"{scheme}://{own.address}"
    given = runner.invoke(app, ["workspace", "list"], env={"KIBO_SERVER": url})
    assert given.exit_code == ExitCode.USAGE, given.output
    said = " ".join(given.stderr.split())
    assert "drop the scheme" in said and own.address in said, said
    assert ("--tls" in said) is (scheme == "https")


# -- item 6: a process runtime taking over the simulator's workspace ---------------------------------


@pytest.mark.timeout(180)
def test_a_taken_over_workspace_without_a_sandbox_fails_naming_it(server_factory: Factory, tmp_path: Path) -> None:
    """With --allow-runtime-change, the process runtime finds no sandbox for the simulator's
    workspace: FAILED, in words about a sandbox, not "the VMM exited unexpectedly"."""
    _require_sandbox()
    data_dir = tmp_path / "data"
    simulated = server_factory(data_dir=data_dir)
    workspace_id = created(simulated)
    simulated.stop()
    process = server_factory(*PROCESS_FLAGS, "--allow-runtime-change", data_dir=data_dir)
    try:
        with kibotos.Client(process.address, token="") as client:
            deadline = time.monotonic() + 30
            while (workspace := client.get_workspace(workspace_id)).state != S.WORKSPACE_STATE_FAILED:
                assert time.monotonic() < deadline, kibotos.state_name(workspace.state)
                time.sleep(0.05)
            assert "no sandbox of this instance is on this node" in workspace.failure.message
            shown = ok(kibo(process, "workspace", "get", workspace_id)).stdout
            assert "VMM" not in shown and "no sandbox" in shown, shown
            # Recovered as any FAILED workspace holding execution: force stop, then delete.
            ok(kibo(process, "workspace", "stop", "--force", "--yes", workspace_id))
            ok(kibo(process, "workspace", "delete", "--yes", workspace_id))
        process.stop()
    finally:
        reap(data_dir)
