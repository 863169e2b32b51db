"""The `kibo` command line against a real server: typer's runner in-process, and a few
runs as a subprocess (a terminal to confirm on, Ctrl-C)."""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kibotos
import pytest
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.sim.v1 import simulator_pb2 as sim
from kibo_cli.exit_codes import ExitCode
from kibo_cli.main import app
from kibo_cli.progress import Progress
from rich.console import Console
from typer.testing import CliRunner, Result

from tests.server import ServerProcess

S = wp.WorkspaceState
KIBO = [sys.executable, "-c", "from kibo_cli.main import main; main()"]
# As at a terminal, where Ctrl-C is not ignored. A suite started in the background (`nohup ...
# &`) hands its processes SIGINT ignored, and a new Python keeps it ignored: the tests that
# press Ctrl-C would wait for nothing (found when the suite was run that way).
KIBO_AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from kibo_cli.main import main; main()",
]
runner = CliRunner()


def kibo(server: ServerProcess, *args: str, input: str | None = None) -> Result:
    return runner.invoke(app, ["--server", server.address, *args], input=input)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return result


@pytest.fixture
def sdk(firecracker: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(firecracker.address) as client:
        yield client


@pytest.fixture(scope="module")
def own_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    """A server of this module's own, whose node may go silent."""
    server = server_factory()
    yield server
    server.stop()


def poll(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.01)


def in_background(action: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def new_workspace(server: ServerProcess, *args: str) -> str:
    return ok(kibo(server, "workspace", "create", "-q", *args)).stdout.strip()


# -- help and exit codes ---------------------------------------------------------------


def test_help_documents_every_exit_code(firecracker: ServerProcess) -> None:
    text = ok(runner.invoke(app, ["--help"])).stdout
    assert "Exit codes" in text
    for code in ExitCode:
        assert f" {int(code)}  " in text
    assert "PARTIAL" in text and "UNKNOWN" in text
    for code in ExitCode:
        assert f"| {int(code)} |" in readme()


def readme() -> str:
    return (Path(__file__).parents[2] / "README.md").read_text()


def test_the_readme_tour_runs_as_written(server_factory: Callable[..., ServerProcess]) -> None:
    """Against a server with auth on, as in the README, with no token given: `kibo` finds it."""
    server = server_factory(auth=True)
    try:
        text = readme()
        start = text.index("```sh\nexport KIBO_SERVER=")
        script = text[start + len("```sh\n") : text.index("```", start + 5)]
        script = script.replace("KIBO_SERVER=127.0.0.1:50051", f"KIBO_SERVER={server.address}")
        env = {k: v for k, v in os.environ.items() if k != "KIBO_TOKEN"}
        env["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
        assert "not confirmed on disk" in run.stdout and "Writes: confirmed on disk." in run.stdout
    finally:
        server.stop()


def test_usage_errors_exit_2(firecracker: ServerProcess) -> None:
    assert kibo(firecracker, "workspace", "create", "--memory", "lots").exit_code == ExitCode.USAGE
    assert kibo(firecracker, "workspace", "stop", "ws-x", "--timeout", "soon").exit_code == ExitCode.USAGE
    assert kibo(firecracker, "workspace", "bogus").exit_code == ExitCode.USAGE


def test_server_errors_map_to_their_exit_codes(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    missing = kibo(firecracker, "workspace", "get", "ws-00000000000000000000")
    assert missing.exit_code == ExitCode.NOT_FOUND and "NOT_FOUND" in missing.stderr
    invalid = kibo(firecracker, "workspace", "get", "nonsense")
    assert invalid.exit_code == ExitCode.INVALID_ARGUMENT and "workspace_id" in invalid.stderr
    reserved = kibo(firecracker, "workspace", "stop", workspace_id, "--command-id", "host-memory/mine")
    assert reserved.exit_code == ExitCode.INVALID_ARGUMENT and "RESERVED_COMMAND_ID" in reserved.stderr

    command_id = kibotos.new_command_id("cli")
    ok(kibo(firecracker, "workspace", "stop", workspace_id, "--command-id", command_id))
    # Resending the same command returns its result.
    ok(kibo(firecracker, "workspace", "stop", workspace_id, "--command-id", command_id))
    reused = kibo(firecracker, "workspace", "start", workspace_id, "--command-id", command_id)
    assert reused.exit_code == ExitCode.COMMAND_ID_REUSED and "COMMAND_ID_REUSED" in reused.stderr

    conflict = kibo(firecracker, "workspace", "stop", workspace_id)
    assert conflict.exit_code == ExitCode.CONFLICT
    assert "CONFLICT" in conflict.stderr and "next: the workspace is already stopped" in conflict.stderr

    mismatch = kibo(firecracker, "workspace", "expire", workspace_id, "--clear", "--if-revision", "99")
    assert mismatch.exit_code == ExitCode.REVISION_MISMATCH and "REVISION_MISMATCH" in mismatch.stderr
    assert sdk.get_workspace(workspace_id).expiration.revision == 1

    unreachable = runner.invoke(app, ["--server", "127.0.0.1:1", "workspace", "get", workspace_id])
    assert unreachable.exit_code == ExitCode.UNAVAILABLE and "is a kibo server running" in unreachable.stderr


def test_any_other_error_exits_1(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    """An oversized request: the transport answers RESOURCE_EXHAUSTED, which has no code of its own."""
    workspace_id = new_workspace(firecracker)
    huge = kibo(firecracker, "workspace", "labels", workspace_id, "-a", "big=" + "x" * (5 * 1024 * 1024))
    assert huge.exit_code == ExitCode.ERROR and "RESOURCE_EXHAUSTED" in huge.stderr
    assert dict(sdk.get_workspace(workspace_id).annotations) == {}


def test_tokens_and_quotas_exit_12_and_13(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory("--quota-workspaces", "1", auth=True)
    try:
        # Neither the server's pointer nor a default admin token: nothing to find.
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        monkeypatch.delenv("KIBO_TOKEN", raising=False)
        refused = kibo(server, "workspace", "list")
        assert refused.exit_code == ExitCode.NOT_ALLOWED and "UNAUTHENTICATED" in refused.stderr
        assert "next: pass --token or set KIBO_TOKEN" in refused.stderr

        token = server.admin_token
        created = runner.invoke(app, ["--server", server.address, "--token", token, "workspace", "create", "-q"])
        workspace_id = ok(created).stdout.strip()
        over = runner.invoke(app, ["--server", server.address, "workspace", "create"], env={"KIBO_TOKEN": token})
        assert over.exit_code == ExitCode.LIMITED and "QUOTA_EXCEEDED" in over.stderr, over.output

        # A local server's admin token is found where `kibo-ctrl serve` wrote it.
        (tmp_path / "kibo").mkdir()
        (tmp_path / "kibo" / "admin.token").write_text(token + "\n")
        assert workspace_id in ok(kibo(server, "workspace", "list")).stdout

        make_reader = ["token", "create", "--data-dir", str(server.data_dir), "--tenant", "default", "--role", "reader"]
        reader = subprocess.run(
            [sys.executable, "-m", "kibo_ctrl", *make_reader],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        read_only = ["--server", server.address, "--token", reader]
        assert workspace_id in ok(runner.invoke(app, [*read_only, "workspace", "get", workspace_id])).stdout
        denied = runner.invoke(app, [*read_only, "workspace", "stop", workspace_id])
        assert denied.exit_code == ExitCode.NOT_ALLOWED and "PERMISSION_DENIED" in denied.stderr
    finally:
        server.stop()


def test_the_token_of_a_local_server_is_found_whatever_its_data_dir(
    server_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 11 item 5: the server runs with --data-dir elsewhere than the default; `kibo`
    finds its admin token through the pointer the server wrote, and says where it was."""
    monkeypatch.delenv("KIBO_TOKEN", raising=False)
    server = server_factory(data_dir=tmp_path / "elsewhere", auth=True)
    try:
        workspace_id = ok(kibo(server, "workspace", "create", "-q")).stdout.strip()
        assert workspace_id in ok(kibo(server, "workspace", "list")).stdout
        # $KIBO_TOKEN comes before the local token: a wrong one is refused and named.
        monkeypatch.setenv("KIBO_TOKEN", "not-a-token")
        refused = kibo(server, "workspace", "list")
        assert refused.exit_code == ExitCode.NOT_ALLOWED, refused.output
        assert "the token came from $KIBO_TOKEN" in refused.stderr
        assert "DIR/admin.token" in refused.stderr
        monkeypatch.delenv("KIBO_TOKEN")
        # The flag comes first of all.
        flagged = runner.invoke(app, ["--server", server.address, "--token", "wrong", "workspace", "list"])
        assert flagged.exit_code == ExitCode.NOT_ALLOWED and "the token came from --token" in flagged.stderr
    finally:
        server.stop()


def test_unauthenticated_says_where_it_looked_for_a_token(
    server_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = server_factory(auth=True)
    try:
        monkeypatch.delenv("KIBO_TOKEN", raising=False)
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
        refused = kibo(server, "workspace", "list")
        assert refused.exit_code == ExitCode.NOT_ALLOWED
        pointer = tmp_path / "state" / "kibo" / "servers" / f"127.0.0.1_{server.port}"
        for place in ("--token (not given)", "$KIBO_TOKEN (not set)", f"{pointer} (no pointer)"):
            assert place in refused.stderr, refused.stderr
        assert f"{tmp_path / 'data' / 'kibo' / 'admin.token'} (missing)" in refused.stderr
        assert "DATA_DIR/admin.token" in refused.stderr
    finally:
        server.stop()


def test_failed_holding_execution_says_force_stop_first(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    sdk.inject_fault(workspace_id, sim.FAULT_VMM_CRASH)
    poll(lambda: sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_FAILED)
    rejected = kibo(firecracker, "workspace", "start", workspace_id)
    assert rejected.exit_code == ExitCode.CONFLICT
    assert "next: the workspace still holds execution: force stop first, then start" in rejected.stderr
    forced = ok(kibo(firecracker, "workspace", "stop", "--force", "--yes", workspace_id))
    assert "not confirmed on disk" in forced.stdout
    ok(kibo(firecracker, "workspace", "start", workspace_id))


def test_a_failed_command_exits_9_with_the_next_step(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    sdk.inject_fault("", sim.FAULT_CREATE_FAIL)
    failed = kibo(firecracker, "workspace", "create")
    assert failed.exit_code == ExitCode.COMMAND_FAILED
    assert "ended FAILED" in failed.stderr and "is FAILED" in failed.stderr
    assert "kibo workspace stop --force" in failed.stderr  # the recovery order


# -- create, get, list -----------------------------------------------------------------


def test_create_get_list_with_volume_labels_and_json(firecracker: ServerProcess) -> None:
    volume_id = ok(kibo(firecracker, "volume", "create", "-q", "--capacity", "2")).stdout.strip()
    workspace_id = new_workspace(
        firecracker,
        "--vcpus",
        "4",
        "--memory",
        "4Gi",
        "--writable-layer",
        "20",
        "--volume",
        volume_id,
        "--label",
        "cli-test=create",
        "--annotation",
        "note=hello",
        "--expire-in",
        "8h",
        "--expire-action",
        "delete",
    )
    text = ok(kibo(firecracker, "workspace", "get", workspace_id)).stdout
    assert "AVAILABLE" in text
    assert "4 vCPU, 4096 MiB memory, 20 GiB writable layer" in text
    assert f"{volume_id} at /mnt/{volume_id}" in text and "kept on delete" in text
    assert "at /data" in text and "deleted with the workspace" in text
    assert "delete at 20" in text and "(revision 1)" in text
    assert "Guest        reset count 0, last reset never, responding" in text
    assert "cli-test=create" in text and "note=hello" in text

    data = json.loads(ok(kibo(firecracker, "workspace", "get", workspace_id, "-o", "json")).stdout)
    assert data["workspaceId"] == workspace_id and data["state"] == "WORKSPACE_STATE_AVAILABLE"
    assert data["labels"] == {"cli-test": "create"}
    assert {v["volumeId"] for v in data["spec"]["volumes"]} >= {volume_id}

    listed = ok(kibo(firecracker, "workspace", "list", "--label", "cli-test=create", "--state", "available")).stdout
    assert workspace_id in listed
    rows = json.loads(ok(kibo(firecracker, "workspace", "list", "--label", "cli-test=create", "-o", "json")).stdout)
    assert [w["workspaceId"] for w in rows["workspaces"]] == [workspace_id]
    stopped_only = ok(kibo(firecracker, "workspace", "list", "--label", "cli-test=create", "--state", "STOPPED"))
    assert workspace_id not in stopped_only.stdout

    volume = json.loads(ok(kibo(firecracker, "volume", "get", volume_id, "-o", "json")).stdout)
    assert volume["workspaceId"] == workspace_id and volume["capacityGib"] == 2


def test_delete_with_workspace_binding(firecracker: ServerProcess) -> None:
    volume_id = ok(kibo(firecracker, "volume", "create", "-q")).stdout.strip()
    workspace_id = new_workspace(
        firecracker, "--volume", volume_id, "--mount-path", "/srv/data", "--delete-with-workspace"
    )
    deleted = ok(kibo(firecracker, "workspace", "delete", workspace_id, "--yes"))
    assert f"Volume {volume_id} at /srv/data will be deleted with the workspace." in deleted.stderr
    assert "DELETED" in deleted.stdout and "Kept volumes" not in deleted.stdout


def test_guest_line_shows_resets(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    sdk.inject_fault(workspace_id, sim.FAULT_GUEST_REBOOT)
    poll(lambda: sdk.get_workspace(workspace_id).guest.reset_count == 1)
    text = ok(kibo(firecracker, "workspace", "get", workspace_id)).stdout
    guest = next(line for line in text.splitlines() if line.startswith("Guest"))
    assert "reset count 1, last reset 20" in guest


# -- stop, start, force stop -------------------------------------------------------------


def test_stop_and_start_print_durability_and_json(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    stopped = ok(kibo(firecracker, "workspace", "stop", workspace_id))
    assert f"{workspace_id} is STOPPED" in stopped.stdout and "confirmed on disk" in stopped.stdout
    assert "not confirmed" not in stopped.stdout
    text = ok(kibo(firecracker, "workspace", "get", workspace_id)).stdout
    assert "Last stop    REQUESTED, command " in text and "durability CONFIRMED" in text
    started = json.loads(ok(kibo(firecracker, "workspace", "start", workspace_id, "-o", "json")).stdout)
    assert started["workspace"]["state"] == "WORKSPACE_STATE_AVAILABLE"
    assert started["command"]["state"] == "COMMAND_STATE_SUCCEEDED"
    assert started["workspace"]["executionGeneration"] == "2"


def test_force_stop_needs_yes_without_a_terminal(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    """Issue 11 item 8: `echo y | kibo workspace stop --force` went ahead; like delete, a piped
    answer is not a confirmation."""
    workspace_id = new_workspace(firecracker)
    piped = kibo(firecracker, "workspace", "stop", "--force", workspace_id, input="y\n")
    assert piped.exit_code == ExitCode.USAGE and "pass --yes" in piped.stderr, piped.output
    assert sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_AVAILABLE
    confirmed = ok(kibo(firecracker, "workspace", "stop", "--force", "--yes", workspace_id))
    assert "not confirmed on disk" in confirmed.stdout
    assert sdk.get_workspace(workspace_id).last_stop.durability == wp.STOP_DURABILITY_UNCONFIRMED


@pytest.mark.parametrize(("answer", "code"), [("y", ExitCode.OK), ("n", ExitCode.NOT_CONFIRMED)])
def test_force_stop_confirms_on_a_terminal(
    firecracker: ServerProcess, sdk: kibotos.Client, answer: str, code: ExitCode
) -> None:
    workspace_id = new_workspace(firecracker)
    controller, terminal = pty.openpty()
    try:
        process = _spawn(firecracker, "workspace", "stop", "--force", workspace_id, stdin=terminal)
        os.write(controller, f"{answer}\n".encode())
        _, err = process.communicate(timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)
    assert process.returncode == code, err
    assert f"Force stop {workspace_id}?" in err
    expected = S.WORKSPACE_STATE_STOPPED if code == ExitCode.OK else S.WORKSPACE_STATE_AVAILABLE
    assert sdk.get_workspace(workspace_id).state == expected


def test_a_deleted_workspace_gets_no_volume_lines_and_no_delete_again_hint(firecracker: ServerProcess) -> None:
    """Issue 11 item 8: delete of a DELETED workspace listed its volumes as "will be deleted"
    before the refusal, and stop said "delete again to finish the delete"."""
    workspace_id = new_workspace(firecracker)
    ok(kibo(firecracker, "workspace", "delete", "--yes", "--command-id", f"cli/del/{workspace_id}", workspace_id))
    again = kibo(firecracker, "workspace", "delete", "--yes", workspace_id)
    assert again.exit_code == ExitCode.CONFLICT, again.output
    assert "Volume" not in again.stderr and "will be deleted" not in again.stderr
    assert "it can only be read" in again.stderr
    stopped = kibo(firecracker, "workspace", "stop", workspace_id)
    assert stopped.exit_code == ExitCode.CONFLICT
    assert "delete again" not in stopped.stderr and "it can only be read" in stopped.stderr
    # The same delete resent with its command ID still answers its result, without a question.
    resent = kibo(firecracker, "workspace", "delete", "--command-id", f"cli/del/{workspace_id}", workspace_id)
    assert f"{workspace_id} is DELETED" in ok(resent).stdout


def test_an_empty_command_id_is_invalid_argument(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    for command in (["stop"], ["start"], ["delete", "--yes"]):
        refused = kibo(firecracker, "workspace", *command, "--command-id", "", workspace_id)
        assert refused.exit_code == ExitCode.INVALID_ARGUMENT, refused.output
        assert "is not a command ID" in refused.stderr and "field: command_id" in refused.stderr
    created = kibo(firecracker, "workspace", "create", "--command-id", "")
    assert created.exit_code == ExitCode.INVALID_ARGUMENT
    assert sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_AVAILABLE


def test_exec_without_dashes_says_where_they_go(firecracker: ServerProcess) -> None:
    refused = kibo(firecracker, "workspace", "exec", "ws-any", "ls", "-l")
    assert refused.exit_code == ExitCode.USAGE
    assert "No such option: -l" in refused.output and "put -- before it" in refused.output


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        ([*KIBO, "--help"], "--token"),
        ([*KIBO, "workspace", "create", "--help"], "--delete-with-workspace"),
        ([sys.executable, "-m", "kibo_ctrl", "serve", "--help"], "--insecure-no-auth / --no-insecure-no-auth"),
    ],
)
def test_help_piped_to_a_file_is_not_cut(argv: list[str], option: str) -> None:
    """Issue 11 item 8: piped help was rich's 80-column boxes, cutting `--insecure-no-au…`."""
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert option in shown and "…" not in shown, shown
    assert "Exit codes:" not in shown or "\n     10  gave up waiting" in shown


def test_a_stalled_stop_settles_with_progress_lines(
    firecracker: ServerProcess, sdk: kibotos.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace_id = new_workspace(firecracker)
    sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    answers: list[int] = []
    original = Progress.on_answer

    def counting(self: Progress, response: kibotos.CommandResponse) -> None:
        answers.append(response.command.state)
        original(self, response)

    monkeypatch.setattr(Progress, "on_answer", counting)

    def unstall_after_a_resend() -> None:
        poll(lambda: len(answers) >= 2)
        sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)

    helper = in_background(unstall_after_a_resend)
    result = ok(kibo(firecracker, "workspace", "stop", workspace_id))
    helper.join()
    assert answers[0] in (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
    assert answers[-1] == command_pb2.COMMAND_STATE_SUCCEEDED
    progress = (f"stopping {workspace_id}: STOPPING, command {state} (" for state in ("PENDING", "RUNNING"))
    assert any(line in result.stderr for line in progress)
    assert f"stopping {workspace_id}: STOPPED (" in result.stderr
    assert "confirmed on disk" in result.stdout


def test_force_stop_supersedes_a_stuck_graceful_stop(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    graceful_id = kibotos.new_command_id("cli")
    pending = ok(kibo(firecracker, "workspace", "stop", workspace_id, "--no-wait", "--command-id", graceful_id))
    assert any(f"command {graceful_id} is {state}" in pending.stdout for state in ("PENDING", "RUNNING"))
    assert f"kibo workspace wait {workspace_id} --command {graceful_id}" in pending.stdout
    forced = ok(kibo(firecracker, "workspace", "stop", "--force", "--yes", workspace_id))
    assert "not confirmed on disk" in forced.stdout
    cancelled = ok(kibo(firecracker, "command", "get", graceful_id)).stdout
    assert "FAILED" in cancelled and "CANCELLED" in cancelled
    data = json.loads(ok(kibo(firecracker, "command", "get", graceful_id, "-o", "json")).stdout)
    assert data["state"] == "COMMAND_STATE_FAILED" and data["error"]["code"] == 1
    waited = kibo(firecracker, "workspace", "wait", workspace_id, "--command", graceful_id)
    assert waited.exit_code == ExitCode.COMMAND_FAILED and "superseded or cancelled" in waited.stderr


# -- delete ----------------------------------------------------------------------------


def test_delete_says_what_happens_to_volumes_and_needs_yes(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    volume_id = ok(kibo(firecracker, "volume", "create", "-q")).stdout.strip()
    workspace_id = new_workspace(firecracker, "--volume", volume_id)
    refused = kibo(firecracker, "workspace", "delete", workspace_id)
    assert refused.exit_code == ExitCode.USAGE and "pass --yes" in refused.stderr
    assert f"Volume {volume_id} at /mnt/{volume_id} will be kept (unbound)." in refused.stderr
    assert "at /data will be deleted with the workspace." in refused.stderr
    assert sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_AVAILABLE

    deleted = ok(kibo(firecracker, "workspace", "delete", workspace_id, "--yes"))
    assert f"{workspace_id} is DELETED" in deleted.stdout and f"Kept volumes: {volume_id}" in deleted.stdout
    assert ok(kibo(firecracker, "volume", "get", volume_id)).stdout.count(workspace_id) == 0
    assert workspace_id not in ok(kibo(firecracker, "workspace", "list")).stdout
    assert workspace_id in ok(kibo(firecracker, "workspace", "list", "--include-deleted")).stdout
    assert "DELETED" in ok(kibo(firecracker, "workspace", "get", workspace_id)).stdout
    # A deleted workspace: delete is a conflict.
    assert kibo(firecracker, "workspace", "delete", workspace_id, "--yes").exit_code == ExitCode.CONFLICT
    assert kibo(firecracker, "volume", "delete", volume_id).exit_code == ExitCode.USAGE
    ok(kibo(firecracker, "volume", "delete", volume_id, "--yes"))


def test_giving_up_the_delete_wait_cancels_nothing(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    command_id = kibotos.new_command_id("cli")
    gave_up = kibo(
        firecracker, "workspace", "delete", workspace_id, "--yes", "--timeout", "0.5s", "--command-id", command_id
    )
    assert gave_up.exit_code == ExitCode.WAIT_TIMEOUT
    assert "the delete goes on" in gave_up.stderr and f"kibo command get {command_id}" in gave_up.stderr
    assert sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_DELETING
    sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
    waited = ok(kibo(firecracker, "workspace", "wait", workspace_id, "--command", command_id, "-o", "json"))
    data = json.loads(waited.stdout)
    assert data["workspace"]["state"] == "WORKSPACE_STATE_DELETED"
    assert data["command"]["state"] == "COMMAND_STATE_SUCCEEDED"


def _spawn(server: ServerProcess, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*KIBO_AT_A_TERMINAL, "--server", server.address, *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(("answer", "code"), [("y", ExitCode.OK), ("n", ExitCode.NOT_CONFIRMED)])
def test_delete_confirms_on_a_terminal(
    firecracker: ServerProcess, sdk: kibotos.Client, answer: str, code: ExitCode
) -> None:
    workspace_id = new_workspace(firecracker)
    controller, terminal = pty.openpty()
    try:
        process = _spawn(firecracker, "workspace", "delete", workspace_id, stdin=terminal)
        os.write(controller, f"{answer}\n".encode())
        out, err = process.communicate(timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)
    assert process.returncode == code, err
    assert "at /data will be deleted with the workspace." in err
    assert f"Delete workspace {workspace_id}?" in err
    expected = S.WORKSPACE_STATE_DELETED if code == ExitCode.OK else S.WORKSPACE_STATE_AVAILABLE
    assert sdk.get_workspace(workspace_id).state == expected
    if code == ExitCode.OK:
        assert f"{workspace_id} is DELETED" in out


def test_interrupting_a_wait_exits_130_and_the_command_goes_on(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    process = _spawn(firecracker, "workspace", "stop", workspace_id)
    try:
        poll(lambda: sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_STOPPING, within=30)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == ExitCode.INTERRUPTED, err
    assert "goes on" in err
    sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
    poll(lambda: sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_STOPPED)


# -- wait, cleanup-status, events, labels, resize, expire ----------------------------------


def test_wait_on_a_failed_workspace_exits_9(firecracker: ServerProcess, sdk: kibotos.Client) -> None:
    workspace_id = new_workspace(firecracker)
    sdk.inject_fault(workspace_id, sim.FAULT_VMM_CRASH)
    poll(lambda: sdk.get_workspace(workspace_id).state == S.WORKSPACE_STATE_FAILED)
    failed = kibo(firecracker, "workspace", "wait", workspace_id)
    assert failed.exit_code == ExitCode.COMMAND_FAILED and "is FAILED" in failed.stderr
    assert "stage: no operation" in failed.stdout  # a VMM exit has no failure.stage


def test_cleanup_status_exits_17_when_partial_and_18_when_unknown(own_server: ServerProcess) -> None:
    with kibotos.Client(own_server.address) as sdk:
        running = new_workspace(own_server)
        complete = kibo(own_server, "workspace", "cleanup-status", running)
        assert complete.exit_code == 0 and "Completeness  COMPLETE" in complete.stdout
        # A create whose instance never reported, on a node that then goes silent: UNKNOWN.
        sdk.inject_fault("", sim.FAULT_STALL)
        unreported = ok(kibo(own_server, "workspace", "create", "-q", "--no-wait")).stdout.strip()
        sdk.inject_fault(running, sim.FAULT_NODE_SILENT)
        try:
            poll(lambda: sdk.get_workspace_cleanup(running).completeness == obs.CLEANUP_COMPLETENESS_PARTIAL)
            partial = kibo(own_server, "workspace", "cleanup-status", running)
            assert partial.exit_code == ExitCode.CLEANUP_PARTIAL, partial.output
            assert "Completeness  PARTIAL" in partial.stdout and "UNKNOWN" in partial.stdout
            data = json.loads(kibo(own_server, "workspace", "cleanup-status", running, "-o", "json").stdout)
            assert data["completeness"] == "CLEANUP_COMPLETENESS_PARTIAL"

            poll(lambda: sdk.get_workspace_cleanup(unreported).completeness == obs.CLEANUP_COMPLETENESS_UNKNOWN)
            unknown = kibo(own_server, "workspace", "cleanup-status", unreported)
            assert unknown.exit_code == ExitCode.CLEANUP_UNKNOWN, unknown.output
            assert "State         UNKNOWN" in unknown.stdout
        finally:
            sdk.inject_fault(running, sim.FAULT_NODE_BACK)
            sdk.inject_fault(unreported, sim.FAULT_UNSTALL)
        poll(lambda: sdk.get_workspace(unreported).state == S.WORKSPACE_STATE_AVAILABLE)


def test_cleanup_status_after_stop_shows_components(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    ok(kibo(firecracker, "workspace", "stop", workspace_id))
    text = ok(kibo(firecracker, "workspace", "cleanup-status", workspace_id)).stdout
    assert "State         COMPLETE" in text
    for component in ("INSTANCE", "RESERVATION", "NETWORK", "VOLUME_ATTACHMENT", "RETAINED_LAYER"):
        assert component in text
    assert "RELEASED  NODE_REPORT" in text and "Release: nothing unfinished" in text


def test_events_labels_resize_expire(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker, "--label", "a=1")
    events = json.loads(ok(kibo(firecracker, "workspace", "events", workspace_id, "-o", "json")).stdout)["events"]
    assert any(e["type"] == "EVENT_TYPE_STATE_CHANGED" and e["toState"] == "WORKSPACE_STATE_AVAILABLE" for e in events)
    assert "CREATING -> AVAILABLE" in ok(kibo(firecracker, "workspace", "events", workspace_id)).stdout

    labels = json.loads(
        ok(kibo(firecracker, "workspace", "labels", workspace_id, "b=2", "a-", "-a", "owner=me", "-o", "json")).stdout
    )
    assert labels == {"labels": {"b": "2"}, "annotations": {"owner": "me"}}
    assert "b=2" in ok(kibo(firecracker, "workspace", "labels", workspace_id)).stdout

    expiring = ok(kibo(firecracker, "workspace", "expire", workspace_id, "--in", "2h", "--action", "stop")).stdout
    assert "stop at 20" in expiring and "(revision 2)" in expiring
    cleared = ok(kibo(firecracker, "workspace", "expire", workspace_id, "--clear", "--if-revision", "2")).stdout
    assert "none (revision 3)" in cleared

    not_stopped = kibo(firecracker, "workspace", "resize", workspace_id, "--vcpus", "8")
    assert not_stopped.exit_code == ExitCode.CONFLICT
    ok(kibo(firecracker, "workspace", "stop", workspace_id))
    resized = ok(kibo(firecracker, "workspace", "resize", workspace_id, "--vcpus", "8", "--memory", "1024"))
    assert "8 vCPU, 1024 MiB memory" in resized.stdout


def test_capabilities_and_env_server(firecracker: ServerProcess) -> None:
    names = json.loads(ok(runner.invoke(app, ["--server", firecracker.address, "capabilities", "-o", "json"])).stdout)
    assert "workspace.stop.force" in names["capabilities"]
    from_env = runner.invoke(app, ["capabilities"], env={"KIBO_SERVER": firecracker.address})
    assert "workspace.stop.force" in ok(from_env).stdout


def test_the_installed_kibo_command_runs_the_seed_command_lines(firecracker: ServerProcess) -> None:
    """`kibo workspace stop --force "$workspace_id"` and friends, typed as written."""
    env = {**os.environ, "KIBO_SERVER": firecracker.address}
    kibo_bin = Path(sys.executable).parent / "kibo"
    created = subprocess.run([kibo_bin, "workspace", "create", "-q"], env=env, capture_output=True, text=True)
    workspace_id = created.stdout.strip()
    assert created.returncode == 0, created.stderr
    forced = subprocess.run(
        [kibo_bin, "workspace", "stop", "--force", "--yes", workspace_id], env=env, capture_output=True, text=True
    )
    assert forced.returncode == 0, forced.stderr
    assert "not confirmed on disk" in forced.stdout
    status = subprocess.run(
        [kibo_bin, "workspace", "cleanup-status", workspace_id], env=env, capture_output=True, text=True
    )
    assert status.returncode == 0 and "Components" in status.stdout


# -- progress --------------------------------------------------------------------------


def test_progress_is_a_live_spinner_on_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    with Progress("stopping ws-x", console) as progress:
        progress.show("STOPPING")
        poll(lambda: "stopping ws-x: STOPPING (" in buffer.getvalue(), within=5)
    assert "\x1b[" in buffer.getvalue()  # drawn in place, not as lines


def test_progress_is_plain_lines_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    console = Console(file=io.StringIO(), force_terminal=False)
    with Progress("waiting", console) as progress:
        progress.show("STARTING")
        progress.show("STARTING")
        progress.show("AVAILABLE")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["waiting: STARTING", "waiting: AVAILABLE"]
