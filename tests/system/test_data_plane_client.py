"""The data plane as users reach it: the SDK (kibotos) and `kibo workspace exec` / `cp`,
against a real `kibo-ctrl serve --runtime process` (bubblewrap sandboxes), plus the
simulator answering UNIMPLEMENTED. Needs root and bubblewrap, like test_process_runtime."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import kibotos
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo_cli.exit_codes import ExitCode
from kibo_cli.main import app
from typer.testing import CliRunner, Result

from tests.server import ServerProcess
from tests.system.test_process_runtime import processes, reap, sandbox_server

FLAGS = ("--runtime", "process", "--sandbox", "bwrap", "--settle-ms", "3000", "--stop-grace-ms", "2000")
SMALL = wp.WorkspaceSpec(resources=wp.Resources(vcpus=1, memory_mib=64))
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


def _require_sandbox() -> None:
    assert shutil.which("bwrap"), "bubblewrap is missing: apt-get install -y bubblewrap (the process runtime needs it)"
    assert os.geteuid() == 0, "the process runtime runs sandboxes with cgroups: run these tests as root"


def kibo(server: ServerProcess, *args: str, input: bytes | str | None = None) -> Result:
    return runner.invoke(app, ["--server", server.address, *args], input=input)


def kibo_process(server: ServerProcess, *args: str, input: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """`kibo` as a real subprocess: a real pipe on stdin, real exit status."""
    return subprocess.run(
        [*KIBO, "--server", server.address, *args], input=input, capture_output=True, timeout=60, check=False
    )


def poll(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def create(client: kibotos.Client) -> str:
    created = client.create_workspace(SMALL)
    workspace = client.wait_workspace(created.workspace, created.command.command_id, timeout=30)
    assert workspace.state == wp.WORKSPACE_STATE_AVAILABLE, workspace
    return workspace.workspace_id


def delete(client: kibotos.Client, workspace_id: str, server: ServerProcess) -> None:
    deleted = client.delete_workspace(workspace_id)
    client.wait_workspace_deleted(workspace_id, deleted.command.command_id, timeout=30)
    poll(lambda: not processes(f"{server.data_dir}/instances/{workspace_id}-g"))


def none_running(client: kibotos.Client, credential: str, pattern: str) -> bool:
    """No process in the guest whose command line matches `pattern` (pgrep excludes itself)."""
    return client.exec_workspace_command(credential, ["pgrep", "-f", pattern]).exit_code == 1


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory) as started:
        yield started


@pytest.fixture
def sdk(server: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(server.address) as client:
        yield client


@pytest.fixture
def workspace(sdk: kibotos.Client, server: ServerProcess) -> Iterator[str]:
    workspace_id = create(sdk)
    yield workspace_id
    delete(sdk, workspace_id, server)


# -- SDK --------------------------------------------------------------------------------------


def test_sdk_runs_commands_and_moves_files(sdk: kibotos.Client, workspace: str) -> None:
    issued = sdk.issue_data_plane_credential(workspace)
    assert issued.execution_generation == 1 and issued.credential
    credential = issued.credential

    # A command: its output, its exit code (a result, not an error), stdin, env, directory.
    assert sdk.exec_workspace_command(credential, ["sh", "-c", "echo out; echo err >&2; exit 3"]) == (
        kibotos.ExecResult(3, b"out\n", b"err\n")
    )
    assert sdk.exec_workspace_command(credential, ["cat"], stdin=b"\x00binary\xff").stdout == b"\x00binary\xff"
    shown = sdk.exec_workspace_command(credential, ["sh", "-c", 'echo "$GREETING"; pwd'], env={"GREETING": "hi"})
    assert shown.ok and shown.stdout == b"hi\n/\n"
    assert sdk.exec_workspace_command(credential, ["pwd"], working_dir="/data").stdout == b"/data\n"
    assert sdk.exec_workspace_command(credential, ["no-such-command"]).exit_code == 127
    # Its timeout: the server kills the command and everything it started; exit code 124.
    timed = sdk.exec_workspace_command(credential, ["sh", "-c", "sleep 27 & sleep 28; echo never"], timeout=0.5)
    assert timed == kibotos.ExecResult(124, b"", b"")
    poll(lambda: none_running(sdk, credential, "sleep 2[78]"))
    with pytest.raises(TypeError):
        sdk.exec_workspace_command(credential, "ls /data")  # a str is a sequence: refused

    # The stream delivers output as it comes: the command waits for a file only we write
    # after seeing its first line (else this would end in the 124 of its timeout).
    waiter = "echo first; while [ ! -e /data/go ]; do sleep 0.02; done; echo second >&2"
    events = sdk.exec_workspace_command_stream(credential, ["sh", "-c", waiter], timeout=20)
    assert next(events) == kibotos.ExecOutput("stdout", b"first\n")
    assert sdk.write_workspace_file(credential, "/data/go", b"") == 0
    assert list(events) == [kibotos.ExecOutput("stderr", b"second\n"), kibotos.ExecExit(0)]
    # Leaving the stream early cancels the call, which kills the command and its children.
    events = sdk.exec_workspace_command_stream(credential, ["sh", "-c", "echo up; sleep 29 & sleep 29"])
    assert next(events) == kibotos.ExecOutput("stdout", b"up\n")
    events.close()
    poll(lambda: none_running(sdk, credential, "sleep 29"))

    # Files under the volume, as the guest sees them; written atomically with their mode.
    content = bytes(range(256)) * 1000
    assert sdk.write_workspace_file(credential, "/data/blob", content, mode=0o600) == len(content)
    assert sdk.read_workspace_file(credential, "/data/blob") == content
    assert sdk.exec_workspace_command(credential, ["stat", "-c", "%a %s", "/data/blob"]).stdout == b"600 256000\n"
    with pytest.raises(kibotos.InvalidArgumentError) as outside:
        sdk.read_workspace_file(credential, "/etc/passwd")
    assert outside.value.field == "path" and "not under a volume mount" in outside.value.message
    with pytest.raises(kibotos.NotFoundError):
        sdk.read_workspace_file(credential, "/data/missing")
    with pytest.raises(ValueError, match="up to 3 MiB"):
        sdk.write_workspace_file(credential, "/data/big", b"x" * ((3 << 20) + 1))
    with pytest.raises(kibotos.UnauthenticatedError):
        sdk.read_workspace_file("kdp1.forged.credential", "/data/blob")


async def test_async_client(server: ServerProcess, workspace: str) -> None:
    async with kibotos.AsyncClient(server.address) as client:
        credential = (await client.issue_data_plane_credential(workspace)).credential
        assert await client.write_workspace_file(credential, "/data/async.txt", b"awaited") == 7
        assert await client.read_workspace_file(credential, "/data/async.txt") == b"awaited"
        result = await client.exec_workspace_command(credential, ["sh", "-c", "cat /data/async.txt; exit 4"])
        assert result == kibotos.ExecResult(4, b"awaited", b"")
        events = [e async for e in client.exec_workspace_command_stream(credential, ["echo", "streamed"])]
        assert events == [kibotos.ExecOutput("stdout", b"streamed\n"), kibotos.ExecExit(0)]
        with pytest.raises(kibotos.InvalidArgumentError):
            await client.write_workspace_file(credential, "/tmp/outside", b"")


def test_a_credential_is_refused_after_stop(sdk: kibotos.Client, server: ServerProcess, workspace: str) -> None:
    credential = sdk.issue_data_plane_credential(workspace).credential
    sdk.write_workspace_file(credential, "/data/kept.txt", b"before the stop")
    sdk.stop_workspace(workspace)
    for call in (
        lambda: sdk.exec_workspace_command(credential, ["true"]),
        lambda: sdk.read_workspace_file(credential, "/data/kept.txt"),
        lambda: sdk.write_workspace_file(credential, "/data/kept.txt", b"after"),
    ):
        with pytest.raises(kibotos.UnauthenticatedError, match="revoked"):
            call()
    # No new one while STOPPED; the CLI says what to do.
    with pytest.raises(kibotos.ConflictError) as stopped:
        sdk.issue_data_plane_credential(workspace)
    assert stopped.value.workspace_state == "STOPPED"
    refused = kibo(server, "workspace", "exec", workspace, "--", "true")
    assert refused.exit_code == ExitCode.CONFLICT, refused.output
    assert "STOPPED" in refused.stderr and f"kibo workspace start {workspace}" in refused.stderr
    assert kibo(server, "workspace", "cp", f"{workspace}:/data/kept.txt", "-").exit_code == ExitCode.CONFLICT
    # After a start the old credential stays refused; a new one reads what was written.
    sdk.start_workspace(workspace)
    with pytest.raises(kibotos.UnauthenticatedError):
        sdk.read_workspace_file(credential, "/data/kept.txt")
    fresh = sdk.issue_data_plane_credential(workspace)
    assert fresh.execution_generation == 2
    assert sdk.read_workspace_file(fresh.credential, "/data/kept.txt") == b"before the stop"


# -- CLI --------------------------------------------------------------------------------------


def test_cli_exec(server: ServerProcess, workspace: str) -> None:
    exec_ = ("workspace", "exec", workspace)
    # The command's exit code passes through; its stdout and stderr stay apart.
    ran = kibo(server, *exec_, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (ran.exit_code, ran.stdout, ran.stderr) == (7, "out\n", "err\n")
    assert kibo(server, *exec_, "--", "true").exit_code == 0
    assert kibo(server, *exec_, "--", "no-such-command").exit_code == 127
    assert kibo(server, *exec_, "--timeout", "1s", "--", "sleep", "30").exit_code == 124
    options = kibo(server, *exec_, "-e", "A=1", "--env", "B=two", "-w", "/data", "--", "sh", "-c", "echo $A $B; pwd")
    assert (options.exit_code, options.stdout) == (0, "1 two\n/data\n")
    # stdin (not a terminal here) is given to the command, unless --no-stdin.
    assert kibo(server, *exec_, "--", "wc", "-c", input="12345").stdout.strip() == "5"
    assert kibo(server, *exec_, "--no-stdin", "--", "wc", "-c", input="12345").stdout.strip() == "0"
    # Usage errors, and a workspace that does not exist.
    assert kibo(server, *exec_, "--env", "novalue", "--", "true").exit_code == ExitCode.USAGE
    assert kibo(server, *exec_).exit_code == ExitCode.USAGE  # no command
    missing = kibo(server, "workspace", "exec", "ws-missing", "--", "true")
    assert missing.exit_code == ExitCode.NOT_FOUND and "NOT_FOUND" in missing.stderr

    # As a real process: a real pipe on stdin, the exit status as the shell sees it.
    piped = kibo_process(server, *exec_, "--", "sh", "-c", "wc -c; exit 42", input=b"x" * 200_000)
    assert (piped.returncode, piped.stdout.strip()) == (42, b"200000"), piped.stderr
    # Ctrl-C stops the command in the workspace and exits 130.
    running = subprocess.Popen(
        [
            *KIBO_AT_A_TERMINAL,
            "--server",
            server.address,
            *exec_,
            "--",
            "sh",
            "-c",
            "echo started; sleep 26 & sleep 26",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert running.stdout is not None
        assert running.stdout.readline() == b"started\n"  # streamed while the command runs
        running.send_signal(signal.SIGINT)
        _, err = running.communicate(timeout=20)
        assert running.returncode == ExitCode.INTERRUPTED and b"the command was stopped" in err
    finally:
        running.kill()
    with kibotos.Client(server.address) as client:
        credential = client.issue_data_plane_credential(workspace).credential
        poll(lambda: none_running(client, credential, "sleep 26"))


def test_cli_cp(server: ServerProcess, workspace: str, tmp_path: Path) -> None:
    local = tmp_path / "notes.txt"
    local.write_bytes(b"local notes\n")
    local.chmod(0o640)
    remote = f"{workspace}:/data/notes.txt"

    # Upload: a file (its mode kept), into a directory path, from stdin.
    up = kibo(server, "workspace", "cp", str(local), remote)
    assert up.exit_code == 0 and "12 bytes written" in up.stderr, up.output
    assert kibo(server, "workspace", "cp", str(local), f"{workspace}:/data/dir-less/").exit_code != 0
    assert kibo(server, "workspace", "cp", str(local), f"{workspace}:/data/").exit_code == 0
    assert kibo(server, "workspace", "cp", "-", f"{workspace}:/data/stdin.txt", input="from stdin").exit_code == 0
    shown = kibo(server, "workspace", "exec", workspace, "--", "sh", "-c", "stat -c '%a %n' /data/*.txt")
    assert shown.stdout.splitlines() == ["640 /data/notes.txt", "644 /data/stdin.txt"]

    # Download: to stdout, to a file, into a directory.
    assert kibo(server, "workspace", "cp", f"{workspace}:/data/stdin.txt", "-").stdout == "from stdin"
    target = tmp_path / "copy.txt"
    assert kibo(server, "workspace", "cp", remote, str(target)).exit_code == 0
    assert target.read_bytes() == b"local notes\n"
    into = tmp_path / "into"
    into.mkdir()
    assert kibo(server, "workspace", "cp", remote, str(into)).exit_code == 0
    assert (into / "notes.txt").read_bytes() == b"local notes\n"
    assert not list(into.glob(".*tmp"))

    # Clear errors: which side is remote, a relative path, a missing file.
    both_local = kibo(server, "workspace", "cp", str(local), str(target))
    assert both_local.exit_code == ExitCode.USAGE and "exactly one side" in both_local.stderr
    assert kibo(server, "workspace", "cp", remote, f"{workspace}:/data/x").exit_code == ExitCode.USAGE
    assert kibo(server, "workspace", "cp", f"{workspace}:data/x", "-").exit_code == ExitCode.USAGE
    missing = kibo(server, "workspace", "cp", f"{workspace}:/data/missing", "-")
    assert missing.exit_code == ExitCode.NOT_FOUND and "not found" in missing.stderr
    # Anywhere in the guest (not only under a volume), and larger than one message (3 MiB).
    assert kibo(server, "workspace", "cp", str(local), f"{workspace}:/etc/notes.txt").exit_code == 0
    assert kibo(server, "workspace", "exec", workspace, "--", "cat", "/etc/notes.txt").stdout == "local notes\n"
    big = tmp_path / "big"
    big.write_bytes(b"x" * ((3 << 20) + 1))
    assert kibo(server, "workspace", "cp", str(big), f"{workspace}:/data/big").exit_code == 0
    assert kibo(server, "workspace", "exec", workspace, "--", "wc", "-c", "/data/big").stdout.split()[0] == str(
        (3 << 20) + 1
    )
    assert stat.S_IMODE(local.stat().st_mode) == 0o640  # nothing local was touched


# -- a restarting guest, and a server without a data plane ----------------------------------------------


def test_reads_retry_a_restarting_guest_and_exec_does_not(server_factory: Callable[..., ServerProcess]) -> None:
    """A guest that takes 3 s to answer: a firecracker reboot leaves a window of UNAVAILABLE."""
    _require_sandbox()
    slow = "sh -c 'sleep 3; exec sh /run/kibo/bin/agent'"
    slow_server = server_factory(*FLAGS, "--guest-command", slow)
    try:
        with kibotos.Client(slow_server.address) as client:
            workspace_id = create(client)
            credential = client.issue_data_plane_credential(workspace_id).credential
            client.write_workspace_file(credential, "/data/kept", b"across the reboot")
            instance = slow_server.data_dir / "instances" / f"{workspace_id}-g1"
            # Its VMM: the node supervisor, or its own supervisor (--supervisor instance).
            recorded = json.loads((instance / "state.json").read_text())
            os.kill(int(recorded["guest_pid"]), signal.SIGUSR1)  # /run/kibo/bin/reboot in the guest
            # A new VMM runs: its guest answers only 3 s after it starts.
            vmm = recorded["supervisor_pid"]
            poll(lambda: json.loads((instance / "state.json").read_text())["supervisor_pid"] != vmm)
            with pytest.raises(kibotos.UnavailableError):
                client.read_workspace_file(credential, "/data/kept", retry_unavailable=0)
            with pytest.raises(kibotos.UnavailableError):
                client.exec_workspace_command(credential, ["true"])  # never retried
            # Retried until the guest answers again; the credential survives the reboot.
            assert client.read_workspace_file(credential, "/data/kept") == b"across the reboot"
            assert client.get_workspace(workspace_id).guest.reset_count == 1
            delete(client, workspace_id, slow_server)
        slow_server.stop()
    finally:
        slow_server.kill()
        reap(slow_server.data_dir)


def test_the_simulator_has_no_data_plane(firecracker: ServerProcess) -> None:
    with kibotos.Client(firecracker.address) as client:
        created = client.create_workspace()
        workspace_id = created.workspace.workspace_id
        client.wait_workspace(created.workspace, created.command.command_id, timeout=30)
        credential = client.issue_data_plane_credential(workspace_id).credential
        with pytest.raises(kibotos.KiboError) as unimplemented:
            client.exec_workspace_command(credential, ["true"])
        assert unimplemented.value.code == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(kibotos.KiboError) as also:
            client.read_workspace_file(credential, "/data/x")
        assert also.value.code == grpc.StatusCode.UNIMPLEMENTED
        refused = kibo(firecracker, "workspace", "exec", workspace_id, "--", "true")
        assert refused.exit_code == ExitCode.ERROR
        assert "UNIMPLEMENTED" in refused.stderr and "--runtime process" in refused.stderr
        client.delete_workspace(workspace_id)
