"""Guest processes end to end (issue 29): StartWorkspaceProcess, ConnectWorkspaceProcess,
ListWorkspaceProcesses, SendWorkspaceProcessInput, SignalWorkspaceProcess and
ResizeWorkspaceProcess through gRPC stubs against a real `kibo-ctrl serve --runtime process
--sandbox bwrap` (bubblewrap sandboxes), as a client sees them.

- a background server started by tag: its client goes, another reattaches by tag and by pid
  with the replay, sends input, signals it, reads its exit code; its output stays readable
  once it ended;
- a PTY: `stty size` follows a resize, "\\x03" interrupts `sleep`, `exit 3` gives 3;
  stdout and stderr apart without one; another user of the guest;
- a stop, a force stop and a revoke each end a background process (gone from the guest and
  from the host) and a running Connect stream (UNAUTHENTICATED);
- a start flood past 32: RESOURCE_EXHAUSTED, nothing started beyond;
- a follower that never reads while its process writes fast: the server's memory stays
  bounded, and the process runs on (background) or is held (a foreground start's follower).
Needs root and bubblewrap, like test_process_runtime."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import kibotos
import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.server import ServerProcess
from tests.system.test_data_plane_client import create, delete, poll
from tests.system.test_data_plane_security import (
    RSS_BOUND_KIB,
    RssSampler,
    _descends_from,
    revoke,
    rss_kib,
    server_pid,
    written_bytes,
)
from tests.system.test_process_runtime import processes, sandbox_server

# One worker for the module: its flood tests watch the module server's memory.
pytestmark = pytest.mark.xdist_group("guest_processes")
MAX_GUEST_PROCESSES = 32
# How long a stream may take to end after its revocation (measured: a few ms).
REVOKE_TO_END_BOUND_S = 2.0


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


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as opened:
        yield opened


def stub_of(channel: grpc.Channel) -> Any:
    return dp_grpc.DataPlaneServiceStub(channel)  # type: ignore[no-untyped-call]


def by_tag(tag: str) -> dp.ProcessSelector:
    return dp.ProcessSelector(tag=tag)


def by_pid(pid: int) -> dp.ProcessSelector:
    return dp.ProcessSelector(pid=pid)


def start_background(stub: Any, credential: str, **fields: Any) -> dp.ProcessStarted:
    responses = list(
        stub.StartWorkspaceProcess(dp.StartWorkspaceProcessRequest(credential=credential, background=True, **fields))
    )
    [only] = responses
    assert only.WhichOneof("event") == "started", responses
    started: dp.ProcessStarted = only.started
    return started


def read_until(events: Iterator[Any], text: bytes, field: str = "stdout") -> bytes:
    """Output (of `field`) from `events` until `text` is in it."""
    seen = b""
    while text not in seen:
        event = next(events)
        kind = event.WhichOneof("event")
        assert kind in (field, "dropped_bytes", "replayed"), event
        seen += getattr(event, field) if kind == field else b""
    return seen


def in_guest(sdk: kibotos.Client, credential: str, script: str) -> kibotos.ExecResult:
    return sdk.exec_workspace_command(credential, ["sh", "-c", script])


def guest_pid_runs(sdk: kibotos.Client, credential: str, pid: int) -> bool:
    return in_guest(sdk, credential, f"kill -0 {pid}").exit_code == 0


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as error:
        call()
    code: grpc.StatusCode = error.value.code()
    return code


# -- a background process, reattached ------------------------------------------------------------


def test_a_background_process_by_tag_reattached_fed_and_signalled(
    sdk: kibotos.Client, server: ServerProcess, workspace: str
) -> None:
    credential = sdk.issue_data_plane_credential(workspace).credential
    script = 'echo ready; while read line; do echo "got $line"; done; echo never'
    with grpc.insecure_channel(server.address) as first:  # its client goes once it started
        started = start_background(stub_of(first), credential, shell=script, tag="server")
    assert started.tag == "server" and started.pid > 1
    assert guest_pid_runs(sdk, credential, started.pid)
    with grpc.insecure_channel(server.address) as second:
        stub = stub_of(second)
        [listed] = stub.ListWorkspaceProcesses(dp.ListWorkspaceProcessesRequest(credential=credential)).processes
        assert (listed.pid, listed.tag, listed.running, listed.argv) == (
            started.pid,
            "server",
            True,
            ["/bin/sh", "-c", script],
        )
        assert listed.working_dir == "/" and listed.start_time.seconds > 0
        # Reattached by tag with the replay: what it printed while no one followed.
        by_name = stub.ConnectWorkspaceProcess(
            dp.ConnectWorkspaceProcessRequest(credential=credential, process=by_tag("server"), replay=True)
        )
        assert read_until(by_name, b"ready\n") == b"ready\n"
        stub.SendWorkspaceProcessInput(
            dp.SendWorkspaceProcessInputRequest(credential=credential, process=by_tag("server"), data=b"hello\n")
        )
        assert read_until(by_name, b"got hello\n") == b"got hello\n"
        by_name.cancel()  # leaving the stream leaves the process running
        # By pid, with the replay: all it printed so far.
        by_number = stub.ConnectWorkspaceProcess(
            dp.ConnectWorkspaceProcessRequest(credential=credential, process=by_pid(started.pid), replay=True)
        )
        assert read_until(by_number, b"got hello\n") == b"ready\ngot hello\n"
        stub.SignalWorkspaceProcess(
            dp.SignalWorkspaceProcessRequest(credential=credential, process=by_pid(started.pid))
        )
        rest = list(by_number)
        # (The replay's end, unless the process had ended by then, and) its exit.
        assert [e.WhichOneof("event") for e in rest if e.WhichOneof("event") != "replayed"] == ["exit_code"], rest
        assert rest[-1].exit_code == 128 + 15
        poll(lambda: not guest_pid_runs(sdk, credential, started.pid))
        # Ended: its output is still there, its end too; input and signals are refused.
        replayed = list(
            stub.ConnectWorkspaceProcess(
                dp.ConnectWorkspaceProcessRequest(credential=credential, process=by_tag("server"), replay=True)
            )
        )
        assert b"".join(e.stdout for e in replayed) == b"ready\ngot hello\n" and replayed[-1].exit_code == 143
        [ended] = stub.ListWorkspaceProcesses(dp.ListWorkspaceProcessesRequest(credential=credential)).processes
        assert (ended.running, ended.exit_code) == (False, 143)
        refused = dp.SendWorkspaceProcessInputRequest(credential=credential, process=by_tag("server"), data=b"x")
        assert code_of(lambda: stub.SendWorkspaceProcessInput(refused)) == grpc.StatusCode.FAILED_PRECONDITION
        missing = dp.ConnectWorkspaceProcessRequest(credential=credential, process=by_tag("nothing"))
        assert code_of(lambda: list(stub.ConnectWorkspaceProcess(missing))) == grpc.StatusCode.NOT_FOUND


def test_foreground_streams_apart_and_exit_code(sdk: kibotos.Client, channel: grpc.Channel, workspace: str) -> None:
    credential = sdk.issue_data_plane_credential(workspace).credential
    request = dp.StartWorkspaceProcessRequest(
        credential=credential,
        argv=["sh", "-c", 'cat; echo "$GREETING" >&2; pwd; exit 4'],
        env={"GREETING": "hi"},
        working_dir="/tmp",
        stdin=b"in\n",
        close_stdin=True,
    )
    events = list(stub_of(channel).StartWorkspaceProcess(request))
    assert events[0].WhichOneof("event") == "started"
    assert b"".join(e.stdout for e in events) == b"in\n/tmp\n"
    assert b"".join(e.stderr for e in events) == b"hi\n"
    assert events[-1].WhichOneof("event") == "exit_code" and events[-1].exit_code == 4


def test_a_pty_follows_resizes_takes_ctrl_c_and_gives_the_exit_code(
    sdk: kibotos.Client, channel: grpc.Channel, server: ServerProcess, workspace: str
) -> None:
    credential = sdk.issue_data_plane_credential(workspace).credential
    stub = stub_of(channel)
    events = stub.StartWorkspaceProcess(
        dp.StartWorkspaceProcessRequest(credential=credential, argv=["sh"], pty=dp.PtySize(rows=24, cols=80), tag="tty")
    )
    pid = next(events).started.pid

    def type_in(keys: bytes) -> None:
        stub.SendWorkspaceProcessInput(
            dp.SendWorkspaceProcessInputRequest(credential=credential, process=by_pid(pid), data=keys)
        )

    type_in(b"stty size\n")
    read_until(events, b"24 80", "pty")
    stub.ResizeWorkspaceProcess(
        dp.ResizeWorkspaceProcessRequest(
            credential=credential, process=by_tag("tty"), size=dp.PtySize(rows=30, cols=100)
        )
    )
    type_in(b"stty size\n")
    read_until(events, b"30 100", "pty")
    type_in(b"sleep 7301; echo slept\n")
    poll(lambda: bool(guest_sleepers(server, "sleep 7301")))
    type_in(b"\x03")  # Ctrl-C
    poll(lambda: not guest_sleepers(server, "sleep 7301"), within=5)
    type_in(b"exit 3\n")
    rest = list(events)
    assert rest[-1].exit_code == 3
    assert b"\nslept" not in b"".join(e.pty for e in rest)  # only its echo of the line
    # A process without a PTY cannot be resized.
    plain = start_background(stub, credential, argv=["sleep", "7302"])
    resize = dp.ResizeWorkspaceProcessRequest(
        credential=credential, process=by_pid(plain.pid), size=dp.PtySize(rows=1, cols=1)
    )
    assert code_of(lambda: stub.ResizeWorkspaceProcess(resize)) == grpc.StatusCode.FAILED_PRECONDITION


def guest_sleepers(server: ServerProcess, command: str) -> list[int]:
    """The host pids of `command` run in a guest of this server (a guest_exec of its data dir)."""
    return [pid for pid in processes(command) if _descends_from(pid, f"{server.data_dir}/instances/")]


def test_another_user_of_the_guest(sdk: kibotos.Client, channel: grpc.Channel, workspace: str) -> None:
    credential = sdk.issue_data_plane_credential(workspace).credential
    stub = stub_of(channel)
    passwd = in_guest(sdk, credential, "cat /etc/passwd").stdout.decode()
    names = [line.split(":") for line in passwd.splitlines() if line.count(":") >= 6]
    named = next((f for f in names if f[2] not in ("0", "") and f[0] != "root"), None)
    cases = [("4321", "4321")] + ([(named[0], named[2])] if named else [])
    for user, uid in cases:
        events = list(
            stub.StartWorkspaceProcess(
                dp.StartWorkspaceProcessRequest(credential=credential, argv=["id", "-u"], user=user)
            )
        )
        assert b"".join(e.stdout for e in events) == f"{uid}\n".encode(), (user, events)
        assert events[-1].exit_code == 0
    unknown = dp.StartWorkspaceProcessRequest(credential=credential, argv=["id"], user="no-such-user")
    assert code_of(lambda: list(stub.StartWorkspaceProcess(unknown))) == grpc.StatusCode.INVALID_ARGUMENT


# -- ends: stop, force stop, revoke ------------------------------------------------------------------


@pytest.mark.parametrize("end", ["revoke", "stop", "force-stop"])
def test_an_end_kills_background_processes_and_ends_connect_streams(
    sdk: kibotos.Client, server: ServerProcess, workspace: str, end: str
) -> None:
    credential = sdk.issue_data_plane_credential(workspace).credential
    sleeper = f"sleep 74{['revoke', 'stop', 'force-stop'].index(end)}1"
    with grpc.insecure_channel(server.address) as opened:
        stub = stub_of(opened)
        started = start_background(stub, credential, argv=sleeper.split(), tag="sleeper")
        poll(lambda: bool(guest_sleepers(server, sleeper)))
        stream = stub.ConnectWorkspaceProcess(
            dp.ConnectWorkspaceProcessRequest(credential=credential, process=by_tag("sleeper"))
        )
        ended: list[BaseException] = []
        reader = threading.Thread(target=lambda: _read_all(stream, ended), daemon=True)
        reader.start()
        time.sleep(0.2)  # the stream is open, following
        since = time.monotonic()
        if end == "revoke":
            revoke(sdk, workspace)
        else:
            sdk.stop_workspace(workspace, force=end == "force-stop", settle=False)
        reader.join(10)
        took = time.monotonic() - since
        [error] = ended
        assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.UNAUTHENTICATED, error
        print(f"{end}: the Connect stream ended {took * 1000:.1f} ms after the request")
        assert took < REVOKE_TO_END_BOUND_S
        poll(lambda: not guest_sleepers(server, sleeper))  # gone from the host
    if end == "revoke":
        fresh = sdk.issue_data_plane_credential(workspace).credential
        assert not guest_pid_runs(sdk, fresh, started.pid)  # and from the guest
        with grpc.insecure_channel(server.address) as opened:
            [listed] = (
                stub_of(opened).ListWorkspaceProcesses(dp.ListWorkspaceProcessesRequest(credential=fresh)).processes
            )
            assert (listed.running, listed.exit_code) == (False, 128 + 9)
    else:
        poll(lambda: sdk.get_workspace(workspace).state == wp.WORKSPACE_STATE_STOPPED, within=30)


def _read_all(stream: Any, ended: list[BaseException]) -> None:
    try:
        for _ in stream:
            pass
    except grpc.RpcError as error:
        ended.append(error)


# -- limits ---------------------------------------------------------------------------------------------


@pytest.fixture
def roomy(sdk: kibotos.Client, server: ServerProcess) -> Iterator[str]:
    """A workspace with room for 32 processes' keepers (~2.5 MiB each: a forked guest_exec)."""
    created = sdk.create_workspace(wp.WorkspaceSpec(resources=wp.Resources(vcpus=1, memory_mib=256)))
    workspace = sdk.wait_workspace(created.workspace, created.command.command_id, timeout=30)
    assert workspace.state == wp.WORKSPACE_STATE_AVAILABLE, workspace
    yield workspace.workspace_id
    delete(sdk, workspace.workspace_id, server)


def test_a_start_flood_stops_at_the_cap(
    sdk: kibotos.Client, channel: grpc.Channel, server: ServerProcess, roomy: str
) -> None:
    credential = sdk.issue_data_plane_credential(roomy).credential
    stub = stub_of(channel)
    for i in range(MAX_GUEST_PROCESSES):
        start_background(stub, credential, argv=["sleep", "7501"], tag=f"s{i}")
    for _ in range(3):
        past = dp.StartWorkspaceProcessRequest(credential=credential, argv=["sleep", "7502"], background=True)
        with pytest.raises(grpc.RpcError) as error:
            list(stub.StartWorkspaceProcess(past))
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    counted = sdk.exec_workspace_command(credential, ["pgrep", "-c", "-f", "^sleep 750"])
    assert counted.stdout == f"{MAX_GUEST_PROCESSES}\n".encode()
    assert not guest_sleepers(server, "sleep 7502")
    # The reserved prefix; once one has ended, a tag in use, and the ended one's tag free again.
    reserved = dp.StartWorkspaceProcessRequest(credential=credential, argv=["true"], tag="kibo-upload-1")
    assert code_of(lambda: list(stub.StartWorkspaceProcess(reserved))) == grpc.StatusCode.INVALID_ARGUMENT
    stub.SignalWorkspaceProcess(dp.SignalWorkspaceProcessRequest(credential=credential, process=by_tag("s1"), signal=9))
    poll(lambda: len(guest_sleepers(server, "sleep 7501")) == MAX_GUEST_PROCESSES - 1)
    poll(lambda: all(p.tag != "s1" or not p.running for p in _listed(stub, credential)))
    taken = dp.StartWorkspaceProcessRequest(credential=credential, argv=["true"], tag="s2", background=True)
    assert code_of(lambda: list(stub.StartWorkspaceProcess(taken))) == grpc.StatusCode.FAILED_PRECONDITION
    taken_again = start_background(stub, credential, argv=["sleep", "7501"], tag="s1")
    assert taken_again.tag == "s1"


def _listed(stub: Any, credential: str) -> list[dp.WorkspaceProcess]:
    return list(stub.ListWorkspaceProcesses(dp.ListWorkspaceProcessesRequest(credential=credential)).processes)


# -- a follower that never reads ----------------------------------------------------------------------------

FLOOD = "head -c 64G /dev/zero"


def _flood_writers(server: ServerProcess) -> list[int]:
    """The `head` of FLOOD in this server's guests (not the shell that runs it)."""
    return [pid for pid in guest_sleepers(server, FLOOD) if _comm(pid) == "head"]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""  # gone meanwhile


def _flood_writer(server: ServerProcess) -> int:
    poll(lambda: bool(_flood_writers(server)))
    [writer] = _flood_writers(server)
    return writer


def test_a_follower_that_never_reads_costs_bounded_memory_and_holds_nothing(
    sdk: kibotos.Client, server: ServerProcess, workspace: str
) -> None:
    """A background process writing as fast as it can, followed by a client that stops reading:
    the server's memory stays bounded and the process is not held (it writes far past what any
    buffer holds)."""
    credential = sdk.issue_data_plane_credential(workspace).credential
    start_kib = rss_kib(server_pid(server))
    with grpc.insecure_channel(server.address) as opened:
        stub = stub_of(opened)
        started = start_background(stub, credential, shell=f"{FLOOD}; sleep 7601")
        stream = stub.ConnectWorkspaceProcess(
            dp.ConnectWorkspaceProcessRequest(credential=credential, process=by_pid(started.pid))
        )
        assert next(stream).stdout  # reads a little, then no more
        writer = _flood_writer(server)
        before = written_bytes(writer)
        with RssSampler(server_pid(server)) as sampler:
            time.sleep(2.0)
        peak, wrote = max(sampler.samples), written_bytes(writer) - before
        print(f"background flood: server RSS +{peak - start_kib} KiB, the guest wrote {wrote >> 20} MiB in 2 s")
        assert peak - start_kib < RSS_BOUND_KIB
        assert wrote > 256 << 20, "the writer was held"  # far past any buffer: nothing holds it
        stream.cancel()
        stub.SignalWorkspaceProcess(
            dp.SignalWorkspaceProcessRequest(credential=credential, process=by_pid(started.pid), signal=9)
        )
    poll(lambda: not _flood_writers(server))


def test_a_foreground_client_that_stops_reading_holds_its_process(
    sdk: kibotos.Client, server: ServerProcess, workspace: str
) -> None:
    """A foreground start's stream is the process's output with back-pressure (as an exec's):
    a client that stops reading holds the guest's writer; the server's memory stays bounded."""
    credential = sdk.issue_data_plane_credential(workspace).credential
    start_kib = rss_kib(server_pid(server))
    with grpc.insecure_channel(server.address) as opened:
        stub = stub_of(opened)
        call = stub.StartWorkspaceProcess(dp.StartWorkspaceProcessRequest(credential=credential, shell=FLOOD))
        assert next(call).WhichOneof("event") == "started"
        received = 0
        for event in call:  # read a little, then stop reading
            assert event.WhichOneof("event") == "stdout", event
            received += len(event.stdout)
            if received >= 1 << 20:
                break
        writer = _flood_writer(server)
        with RssSampler(server_pid(server)) as sampler:
            time.sleep(1.5)
        held = written_bytes(writer)
        time.sleep(1.0)
        peak = max(sampler.samples)
        print(f"foreground flood: server RSS +{peak - start_kib} KiB, the guest wrote {held >> 20} MiB")
        assert peak - start_kib < RSS_BOUND_KIB
        assert held < 256 << 20 and written_bytes(writer) == held, "the foreground writer was not held"
        call.cancel()  # the call ends: so does its process
        poll(lambda: not _flood_writers(server))
