"""Guest processes of a workspace on a `kibo-ctrl node` agent (issue 29): the control plane
reaches them only through the node's hop (NodeGuestService.CallGuestProcesses and
FollowGuestProcess, transport/node_guest_client.py), and a client sees exactly what it sees
on the embedded node, through the public API (kibo.ctrl.v1.DataPlaneService over gRPC):

- a background server started by tag, listed, followed with a replay of its output, given
  input, left (it runs on), reattached by pid, signalled: 143;
- a PTY shell: `stty size` follows a resize, `exit 3` is its exit code;
- a foreground start whose client stops reading: the guest's writer stops (the node's
  follower is held: gRPC's flow control carries the back-pressure across both hops), and
  then every byte arrives, none dropped;
- an upload in parts of the largest size (2 MiB: the hop's data cap), its part resent refused
  with FAILED_PRECONDITION, the file whole in the guest, and never listed as a process;
- a revoke ends the processes on the node (the hop's `end`) while the guest runs on;
- the hop's own guard, on the real node: its new RPCs refuse a caller without the control
  plane's secret, hostile arguments are INVALID_ARGUMENT, a foreign instance is unavailable,
  and the node serves on.

The hop's wire in detail (every field, refusals, frames, flow control, cancel) is
tests/unit/test_node_guest_hop.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2
from kibo.node.v1 import node_guest_service_pb2_grpc as guest_grpc
from kibo_ctrl.runtime.base import GuestRefused, ProcessSpec
from kibo_ctrl.runtime.process import safepath
from kibo_ctrl.transport.node_guest_client import RemoteGuests

from tests.client import Client, S, meta
from tests.nodes import NodeProcess, list_nodes
from tests.server import ServerProcess, free_port
from tests.system.test_durability import eventually
from tests.system.test_guest_ports import _node, _placed_on
from tests.system.test_process_runtime import DataPlane, processes, reap
from tests.system.test_resource_model import process_server

pytestmark = pytest.mark.xdist_group("guest_processes_node")

MIB = 1 << 20
# The guest's echo server: "ready", then "echo:LINE" for each line of its input.
ECHO = "import sys\nprint('ready', flush=True)\nfor line in sys.stdin:\n    print('echo:' + line.strip(), flush=True)\n"
# The guest's flood: COUNT chunks of 64 KiB to stdout, its progress (chunks written) in PROGRESS.
FLOOD = """
import os, sys
count, progress = int(sys.argv[1]), sys.argv[2]
chunk = b"x" * 65536
for i in range(count):
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
    with open(progress + ".new", "w") as f:
        f.write(str(i + 1))
    os.replace(progress + ".new", progress)
"""


@dataclass
class Remote:
    server: ServerProcess
    node: NodeProcess
    client: Client
    workspace: wp.Workspace
    hop: str  # the node's NodeGuestService address
    secret: str  # the control plane's secret for it
    instance_id: str


@pytest.fixture(scope="module")
async def remote(
    server_factory: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Remote]:
    """A workspace placed on node agent node-p (the embedded node cordoned meanwhile)."""
    with process_server(server_factory, "--node-timeout-ms", "3000") as server:
        hop = free_port()
        node = _node(server, tmp_path_factory.mktemp("node-p"), "node-p", hop).start()
        try:
            async with Client.connect(server.address) as client:

                async def joined() -> bool | None:
                    return True if "node-p" in await list_nodes(server.address) else None

                await eventually(joined, within=30, what="node-p joined")
                local_id = next(n for n in await list_nodes(server.address) if n != "node-p")
                workspace = await _placed_on(client, server, "node-p", [local_id])
                with contextlib.closing(sqlite3.connect(server.data_dir / "kibo.db")) as db:
                    record = json.loads(db.execute("SELECT data FROM nodes WHERE id = 'node-p'").fetchone()[0])
                instance_id = f"{workspace.workspace_id}-g{workspace.execution_generation}"
                yield Remote(
                    server, node, client, workspace, f"127.0.0.1:{hop}", record["data_plane_token"], instance_id
                )
                assert node.process is not None and node.process.poll() is None, node.log()
                await client.delete(workspace.workspace_id)
                await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_DELETED, within=30)
        finally:
            node.kill()
            reap(node.data_dir)


class Processes:
    """DataPlaneService's processes and uploads, as a client calls them."""

    def __init__(self, client: Client) -> None:
        assert client.channel is not None
        self.plane = DataPlane(client)
        self.stub = dp_grpc.DataPlaneServiceStub(client.channel)  # type: ignore[no-untyped-call]

    async def credential(self, workspace_id: str) -> str:
        return await self.plane.credential(workspace_id)

    def start(self, credential: str, *argv: str, **fields: Any) -> Any:
        return self.stub.StartWorkspaceProcess(
            dp.StartWorkspaceProcessRequest(credential=credential, argv=argv, **fields)
        )

    async def background(self, credential: str, *argv: str, **fields: Any) -> dp.ProcessStarted:
        events = [event async for event in self.start(credential, *argv, background=True, **fields)]
        assert [event.WhichOneof("event") for event in events] == ["started"], events
        started: dp.ProcessStarted = events[0].started
        assert started.pid > 0
        return started

    def connect(self, credential: str, selector: dp.ProcessSelector, replay: bool = False) -> Any:
        request = dp.ConnectWorkspaceProcessRequest(credential=credential, process=selector, replay=replay)
        return self.stub.ConnectWorkspaceProcess(request)

    async def listed(self, credential: str) -> dict[int, dp.WorkspaceProcess]:
        response = await self.stub.ListWorkspaceProcesses(dp.ListWorkspaceProcessesRequest(credential=credential))
        return {process.pid: process for process in response.processes}

    async def send(self, credential: str, selector: dp.ProcessSelector, data: bytes, close: bool = False) -> None:
        request = dp.SendWorkspaceProcessInputRequest(
            credential=credential, process=selector, data=data, close_stdin=close
        )
        await self.stub.SendWorkspaceProcessInput(request)

    async def signal(self, credential: str, selector: dp.ProcessSelector, signum: int = 0) -> None:
        request = dp.SignalWorkspaceProcessRequest(credential=credential, process=selector, signal=signum)
        await self.stub.SignalWorkspaceProcess(request)

    async def resize(self, credential: str, selector: dp.ProcessSelector, rows: int, cols: int) -> None:
        size = dp.PtySize(rows=rows, cols=cols)
        await self.stub.ResizeWorkspaceProcess(
            dp.ResizeWorkspaceProcessRequest(credential=credential, process=selector, size=size)
        )


def by_tag(tag: str) -> dp.ProcessSelector:
    return dp.ProcessSelector(tag=tag)


def by_pid(pid: int) -> dp.ProcessSelector:
    return dp.ProcessSelector(pid=pid)


async def next_event(events: Any) -> Any:
    """A stream's next message (the calls are read with read(): they are no async iterators)."""
    event = await events.read()
    assert event is not grpc.aio.EOF, "the stream ended"
    return event


async def read_until(events: Any, wanted: bytes, within: float = 10.0) -> bytes:
    """A follower's output (stdout or pty) until it holds `wanted`."""
    seen = b""
    async with asyncio.timeout(within):
        while wanted not in seen:
            event = await next_event(events)
            kind = event.WhichOneof("event")
            if kind == "replayed":  # the replay's end, through the node's hop too
                continue
            assert kind in ("stdout", "stderr", "pty"), (kind, seen)
            seen += getattr(event, kind)
    return seen


async def exit_code(events: Any, within: float = 10.0) -> int:
    async with asyncio.timeout(within):
        while True:
            event = await next_event(events)
            if event.WhichOneof("event") == "exit_code":
                code: int = event.exit_code
                return code


async def test_a_background_server_by_tag_is_followed_fed_left_and_signalled_through_the_hop(
    remote: Remote,
) -> None:
    processes_ = Processes(remote.client)
    credential = await processes_.credential(remote.workspace.workspace_id)
    started = await processes_.background(credential, "python3", "-u", "-c", ECHO, tag="echo")
    assert started.tag == "echo"
    listed = (await processes_.listed(credential))[started.pid]
    assert (listed.tag, list(listed.argv[:2]), listed.running, listed.pty) == ("echo", ["python3", "-u"], True, False)

    # Reattach with the replay: its first line, then what it answers to our input.
    follower = processes_.connect(credential, by_tag("echo"), replay=True)
    assert (await read_until(follower, b"ready\n")).startswith(b"ready\n")
    await processes_.send(credential, by_tag("echo"), b"hello\n")
    assert b"echo:hello\n" in await read_until(follower, b"echo:hello\n")
    # Leaving the follower leaves the process running.
    follower.cancel()
    await asyncio.sleep(0.2)
    assert (await processes_.listed(credential))[started.pid].running

    # By pid, replayed: all it wrote so far; then a signal ends it (128 + SIGTERM).
    follower = processes_.connect(credential, by_pid(started.pid), replay=True)
    assert b"ready\necho:hello\n" in await read_until(follower, b"echo:hello\n")
    await processes_.signal(credential, by_pid(started.pid))
    assert await exit_code(follower) == 143
    ended = (await processes_.listed(credential))[started.pid]
    assert (ended.running, ended.exit_code) == (False, 143)
    # An ended process answers its exit at once.
    assert await exit_code(processes_.connect(credential, by_tag("echo"))) == 143


async def test_a_pty_shell_follows_a_resize_and_exits_with_its_code_through_the_hop(remote: Remote) -> None:
    processes_ = Processes(remote.client)
    credential = await processes_.credential(remote.workspace.workspace_id)
    pty = dp.PtySize(rows=24, cols=80)
    started = await processes_.background(credential, "sh", tag="tty", pty=pty)
    assert (await processes_.listed(credential))[started.pid].pty
    follower = processes_.connect(credential, by_tag("tty"), replay=True)
    await processes_.send(credential, by_tag("tty"), b"stty size\n")
    assert b"24 80" in await read_until(follower, b"24 80")
    await processes_.resize(credential, by_tag("tty"), 40, 120)
    await processes_.send(credential, by_tag("tty"), b"stty size\n")
    assert b"40 120" in await read_until(follower, b"40 120")
    await processes_.send(credential, by_tag("tty"), b"exit 3\n")
    assert await exit_code(follower) == 3


async def test_a_foreground_client_that_stops_reading_stops_the_guest_and_loses_nothing(remote: Remote) -> None:
    processes_ = Processes(remote.client)
    credential = await processes_.credential(remote.workspace.workspace_id)
    count = 1024  # 64 MiB: far more than every buffer on the way (the pipe, the ring, two gRPC windows)
    progress = f"/tmp/flood-{secrets.token_hex(4)}"
    events = processes_.start(credential, "python3", "-c", FLOOD, str(count), progress)
    assert (await next_event(events)).WhichOneof("event") == "started"

    async def written() -> int:
        code, out, err = await processes_.plane.exec(credential, "sh", "-c", f"cat {progress} 2>/dev/null || echo 0")
        assert code == 0, err
        return int(out)

    # The client does not read: the guest's writer stops and stays stopped.
    await asyncio.sleep(1.0)
    stalled = await written()
    await asyncio.sleep(0.5)
    assert await written() == stalled
    print(f"a foreground client that does not read stops the guest after {stalled * 64 / 1024:.1f} MiB")
    assert stalled < count
    # It reads again: every byte, none dropped, then the exit.
    received, code, dropped = 0, None, 0
    while (event := await events.read()) is not grpc.aio.EOF:
        kind = event.WhichOneof("event")
        if kind == "stdout":
            received += len(event.stdout)
        elif kind == "dropped_bytes":
            dropped += event.dropped_bytes
        elif kind == "exit_code":
            code = event.exit_code
    assert (received, dropped, code) == (count * 65536, 0, 0)


async def test_an_upload_in_the_largest_parts_crosses_the_hop_whole(remote: Remote) -> None:
    processes_ = Processes(remote.client)
    credential = await processes_.credential(remote.workspace.workspace_id)
    content = secrets.token_bytes(5 * 2 * MIB + 12345)
    started = await processes_.stub.StartWorkspaceUpload(
        dp.StartWorkspaceUploadRequest(credential=credential, path="/tmp/uploaded.bin", mode=0o600)
    )
    upload_id = started.upload_id
    assert upload_id
    # Not a process a client lists.
    assert all(not p.tag.startswith("kibo-") for p in (await processes_.listed(credential)).values())
    offset = 0
    for start in range(0, len(content), 2 * MIB):
        part = content[start : start + 2 * MIB]
        finish = start + len(part) == len(content)
        request = dp.WriteWorkspaceUploadRequest(
            credential=credential, upload_id=upload_id, offset=offset, data=part, finish=finish
        )
        answer = await processes_.stub.WriteWorkspaceUpload(request)
        offset += len(part)
        assert answer.size == offset and answer.finished == finish
        if start == 0:
            # The same part again: refused, naming the offset to go on from.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await processes_.stub.WriteWorkspaceUpload(request)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    code, out, err = await processes_.plane.exec(credential, "sha256sum", "/tmp/uploaded.bin")
    assert code == 0, err
    assert out.split()[0].decode() == hashlib.sha256(content).hexdigest()


async def test_a_revoke_ends_the_processes_on_the_node_and_the_guest_runs_on(remote: Remote) -> None:
    processes_ = Processes(remote.client)
    workspace_id = remote.workspace.workspace_id
    credential = await processes_.credential(workspace_id)
    marker = f"kibo-revoked-{secrets.token_hex(4)}"
    await processes_.background(credential, "sh", "-c", "exec sleep 1000", marker, tag="sleeper")
    assert processes(marker), "the background process runs on the node's machine"
    await remote.client.ws.RevokeWorkspaceDataPlaneAccess(
        ws.RevokeWorkspaceDataPlaneAccessRequest(metadata=meta(), workspace_id=workspace_id)
    )

    async def gone() -> bool:
        return not processes(marker)

    started = time.monotonic()
    await eventually(gone, within=10, what="the revoked credential's process ended on the node")
    print(f"a revoke ended the node's process {1000 * (time.monotonic() - started):.0f} ms later")
    fresh = await processes_.credential(workspace_id)
    assert (await remote.client.get(workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
    code, out, _ = await processes_.plane.exec(fresh, "echo", "still here")
    assert (code, out) == (0, b"still here\n")


# -- the hop's own guard, on the real node -------------------------------------------------------


async def _raw(remote: Remote, secret: str, rpc: str, request: Any) -> grpc.StatusCode:
    metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
    async with grpc.aio.insecure_channel(remote.hop) as channel:
        stub = guest_grpc.NodeGuestServiceStub(channel)  # type: ignore[no-untyped-call]
        call = getattr(stub, rpc)(request, metadata=metadata)
        with contextlib.suppress(grpc.aio.AioRpcError):
            if rpc == "FollowGuestProcess":
                async for _ in call:
                    pass
            else:
                await call
        code: grpc.StatusCode = await call.code()
        return code


def _call(remote: Remote, operation: str, arguments: bytes, data: bytes = b"") -> Any:
    return guest_pb2.CallGuestProcessesRequest(
        instance_id=remote.instance_id, operation=operation, arguments=arguments, data=data
    )


async def test_the_nodes_hop_refuses_a_caller_without_the_secret_and_hostile_arguments(remote: Remote) -> None:
    start = _call(remote, "start", b'{"argv": ["sh", "-c", "touch /tmp/not-by-a-stranger"]}')
    follow = guest_pb2.FollowGuestProcessRequest(instance_id=remote.instance_id, selector=b'{"tag": "echo"}')
    for secret in ("", "not-the-secret"):
        assert await _raw(remote, secret, "CallGuestProcesses", start) == grpc.StatusCode.UNAUTHENTICATED
        assert await _raw(remote, secret, "FollowGuestProcess", follow) == grpc.StatusCode.UNAUTHENTICATED

    hostile = [
        _call(remote, "list", b"{not json"),
        _call(remote, "exec", b'{"argv": ["sh"]}'),
        _call(remote, "input", b'{"tag": "echo"}', b"x" * (2 * MIB + 1)),
        _call(remote, "start", b'{"argv": ["' + b"a" * (2 * MIB) + b'"]}'),
        _call(remote, "start", b'{"job": {"a": ' + b"[" * 20_000 + b"]" * 20_000 + b"}}"),
        _call(remote, "signal", b'{"pid": 1, "tag": "echo"}'),
        guest_pb2.CallGuestProcessesRequest(instance_id="i" * 10_000, operation="list", arguments=b"{}"),
    ]
    for request in hostile:
        assert await _raw(remote, remote.secret, "CallGuestProcesses", request) == grpc.StatusCode.INVALID_ARGUMENT
    bad_follow = guest_pb2.FollowGuestProcessRequest(instance_id=remote.instance_id, selector=b"[]")
    assert await _raw(remote, remote.secret, "FollowGuestProcess", bad_follow) == grpc.StatusCode.INVALID_ARGUMENT

    # Nothing of it ran in the guest; the node serves on, as the control plane calls it.
    credential = await Processes(remote.client).credential(remote.workspace.workspace_id)
    code, out, _ = await DataPlane(remote.client).exec(credential, "ls", "/tmp")
    assert code == 0 and b"not-by-a-stranger" not in out
    assert remote.node.process is not None and remote.node.process.poll() is None, remote.node.log()
    guests = RemoteGuests(remote.hop, remote.secret, safepath.guest_file_path)
    try:
        assert isinstance(await guests.list_guest_processes(remote.instance_id), list)
        # Another node's instance, or a path: not a guest of this node.
        for foreign in ("ws-elsewhere-g1", "../../../proc/1"):
            with pytest.raises(GuestRefused) as refused:
                await guests.start_guest_process(foreign, ProcessSpec(argv=("true",)))
            assert refused.value.status == "unavailable"
    finally:
        await guests.close()
