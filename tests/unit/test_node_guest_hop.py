"""The guest processes' node hop on its own (issue 29): the control plane's RemoteGuests
against a real NodeGuestService (routes.node_guest_service, served by grpc.aio with the node's
authenticator, as node_host.py serves it) whose runtime is a recording GuestProcesses. What
crosses the hop must arrive as it was sent (every field of a ProcessSpec, the answers, a
refusal's status, message and errno, output larger than a frame, Dropped, Exit), `hold` must
reach the node's follower and gRPC's flow control must then stop the guest's output while the
consumer does not read; closing the consumer (or `stop`) closes the node's follower; a caller
without the secret and hostile arguments are refused before the runtime is asked. The
system test (tests/system/test_guest_processes_node.py) runs the same hop with a real node
agent and real processes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2
from kibo.node.v1 import node_guest_service_pb2_grpc as guest_grpc
from kibo_ctrl import routes
from kibo_ctrl.api.node_guest_api import MAX_ARGUMENTS_BYTES, MAX_DATA_BYTES, NodeGuestApi, guest_authenticator
from kibo_ctrl.domain.errors import Unimplemented
from kibo_ctrl.runtime.base import (
    Dropped,
    Exit,
    GuestRefused,
    JobStopped,
    Output,
    ProcessInfo,
    ProcessSpec,
    Selector,
)
from kibo_ctrl.transport.grpc import bind, service_handler
from kibo_ctrl.transport.node_guest_client import RemoteGuests

SECRET = "the-nodes-secret"
INSTANCE = "ws-hop-g1"
BIG = 600 * 1024  # more than one frame of the hop (256 KiB)


def info(pid: int, tag: str = "", **changes: Any) -> ProcessInfo:
    fields: dict[str, Any] = {
        "pid": pid,
        "tag": tag,
        "argv": ("sh", "-c", "cat"),
        "pty": False,
        "running": True,
        "exit_code": 0,
        "start_time": 1700000000.25,
        "cwd": "/srv",
        "user": "app",
        "received": 0,
    }
    return ProcessInfo(**{**fields, **changes})


@dataclass
class Follower:
    """One follow_guest_process generator as the node ran it."""

    selector: Selector
    replay: bool
    hold: bool
    sent: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class RecordingProcesses:
    """A node runtime that keeps no guests: it records what the hop hands it and answers as
    the test scripts it (GuestAccess for NodeGuestApi, GuestProcesses for the new RPCs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.followers: list[Follower] = []
        self.refuse: GuestRefused | None = None
        # What a follower yields: these items, or (`flood`) 64 KiB of output for as long as it is read.
        self.script: list[Output | Dropped | Exit] = []
        self.flood = False

    # GuestAccess (NodeGuestApi takes one).
    def guest_ready(self, instance_id: str) -> bool:
        return True

    def check_file_path(self, path: str, mounts: list[str]) -> None:
        pass

    async def guest_job(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Output | Exit, None]:
        raise GuestRefused("unavailable", "no jobs here")
        yield

    # GuestProcesses.
    def _refused(self) -> None:
        if self.refuse is not None:
            raise self.refuse

    async def start_guest_process(self, instance_id: str, spec: ProcessSpec) -> ProcessInfo:
        self.calls.append(("start", instance_id, spec))
        self._refused()
        return info(41, spec.tag, argv=spec.argv, pty=spec.pty is not None)

    async def list_guest_processes(self, instance_id: str) -> list[ProcessInfo]:
        self.calls.append(("list", instance_id))
        self._refused()
        return [info(41, "web"), info(42, "", running=False, exit_code=130), info(43, "kibo-upload-0", upload=True)]

    async def follow_guest_process(
        self,
        instance_id: str,
        selector: Selector,
        replay: bool = False,
        stop: asyncio.Event | None = None,
        hold: bool = False,
    ) -> AsyncGenerator[Output | Dropped | Exit, None]:
        follower = Follower(selector, replay, hold)
        self.followers.append(follower)
        try:
            self._refused()
            for item in self.script:
                yield item
            while self.flood:
                yield Output("stdout", b"x" * 65536)
                follower.sent += 65536
        finally:
            follower.closed.set()

    async def send_guest_process_input(
        self, instance_id: str, selector: Selector, data: bytes, close: bool = False, offset: int | None = None
    ) -> int:
        self.calls.append(("input", instance_id, selector, data, close, offset))
        self._refused()
        return (offset or 0) + len(data)

    async def signal_guest_process(self, instance_id: str, selector: Selector, signum: int) -> None:
        self.calls.append(("signal", instance_id, selector, signum))
        self._refused()

    async def resize_guest_process(self, instance_id: str, selector: Selector, rows: int, cols: int) -> None:
        self.calls.append(("resize", instance_id, selector, rows, cols))
        self._refused()

    async def end_guest_processes(self, instance_id: str, keep_owner: int | None = None) -> None:
        self.calls.append(("end", instance_id, keep_owner))
        self._refused()


@dataclass
class Hop:
    runtime: Any
    address: str
    remote: RemoteGuests


@contextlib.asynccontextmanager
async def serving(runtime: Any) -> AsyncIterator[Hop]:
    """NodeGuestService over `runtime`, as a node agent serves it (node_host._serve_guests)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 << 20)])
    service = routes.node_guest_service(NodeGuestApi(runtime))
    server.add_generic_rpc_handlers([service_handler(service, guest_authenticator(SECRET))])
    port = bind(server, "127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    remote = RemoteGuests(address, SECRET, lambda path, mounts: None)
    try:
        yield Hop(runtime, address, remote)
    finally:
        await remote.close()
        await server.stop(0)


@pytest.fixture
async def hop() -> AsyncIterator[Hop]:
    async with serving(RecordingProcesses()) as served:
        yield served


async def test_every_operation_crosses_the_hop_as_it_was_sent(hop: Hop) -> None:
    remote, runtime = hop.remote, hop.runtime
    job = {"mode": "write", "path": "/data/f", "file_mode": 0o600, "parents": True}
    spec = ProcessSpec(
        argv=("sh", "-c", "read x; echo $x"),
        env={"A": "1", "ÜBER": "ß"},
        cwd="/srv",
        user="app",
        tag="web",
        pty=(30, 100),
        stdin=b"\x00\xffhello\n",
        close_stdin=True,
        owner=7,
    )
    started = await remote.start_guest_process(INSTANCE, spec)
    assert started == info(41, "web", argv=spec.argv, pty=True)
    assert runtime.calls[-1] == ("start", INSTANCE, spec)
    upload = ProcessSpec(tag="kibo-upload-00112233aabbccdd", job=job)
    await remote.start_guest_process(INSTANCE, upload)
    assert runtime.calls[-1] == ("start", INSTANCE, upload)

    listed = await remote.list_guest_processes(INSTANCE)
    assert listed == [
        info(41, "web"),
        info(42, "", running=False, exit_code=130),
        info(43, "kibo-upload-0", upload=True),
    ]

    assert await remote.send_guest_process_input(INSTANCE, "web", b"line\n") == 5
    assert runtime.calls[-1] == ("input", INSTANCE, "web", b"line\n", False, None)
    part = bytes(range(256)) * (MAX_DATA_BYTES // 256)  # an upload's largest part
    assert await remote.send_guest_process_input(INSTANCE, 41, part, close=True, offset=1 << 40) == (1 << 40) + len(
        part
    )
    assert runtime.calls[-1] == ("input", INSTANCE, 41, part, True, 1 << 40)

    await remote.signal_guest_process(INSTANCE, 41, 9)
    assert runtime.calls[-1] == ("signal", INSTANCE, 41, 9)
    await remote.resize_guest_process(INSTANCE, "web", 50, 200)
    assert runtime.calls[-1] == ("resize", INSTANCE, "web", 50, 200)
    await remote.end_guest_processes(INSTANCE, keep_owner=8)
    assert runtime.calls[-1] == ("end", INSTANCE, 8)
    await remote.end_guest_processes(INSTANCE)
    assert runtime.calls[-1] == ("end", INSTANCE, None)


async def test_the_largest_command_the_public_api_takes_crosses_and_a_larger_message_is_refused(hop: Hop) -> None:
    remote, runtime = hop.remote, hop.runtime
    # argv and env of 1 MiB together (api/data_plane_processes.py MAX_COMMAND_BYTES), text with
    # quotes and newlines (escaped in JSON), and a stdin of 1 MiB.
    argv = ("sh", "-c", 'echo "a\\b"\n' * (400 * 1024 // 9))
    env = {f"V{i}": "é" * 100 for i in range(2000)}
    spec = ProcessSpec(argv=argv, env=env, stdin=b"\n" * (1 << 20), tag="big")
    assert sum(len(a.encode()) + 1 for a in argv) + sum(len(k) + len(v.encode()) + 2 for k, v in env.items()) < 1 << 20
    started = await remote.start_guest_process(INSTANCE, spec)
    assert runtime.calls[-1] == ("start", INSTANCE, spec) and started.argv == argv
    # Past the hop's 4 MiB message (1 MiB of control characters is 6 MiB of JSON): refused, not
    # "retry", and the hop serves on.
    with pytest.raises(GuestRefused) as refused:
        await remote.start_guest_process(INSTANCE, ProcessSpec(argv=("\x01" * (1 << 20),)))
    assert refused.value.status == "error"
    assert await remote.list_guest_processes(INSTANCE)


async def test_a_refusal_crosses_with_its_status_message_and_errno(hop: Hop) -> None:
    remote, runtime = hop.remote, hop.runtime
    for status, errno in (("not-found", ""), ("conflict", ""), ("limit", ""), ("os-error", "ENOENT")):
        runtime.refuse = GuestRefused(status, f"refused: {status}", errno)
        operations = (
            remote.start_guest_process(INSTANCE, ProcessSpec(argv=("true",))),
            remote.list_guest_processes(INSTANCE),
            remote.send_guest_process_input(INSTANCE, "web", b"x", offset=3),
            remote.signal_guest_process(INSTANCE, "web", 15),
            remote.resize_guest_process(INSTANCE, "web", 10, 10),
            remote.end_guest_processes(INSTANCE),
        )
        for operation in operations:
            with pytest.raises(GuestRefused) as refused:
                await operation
            assert (refused.value.status, str(refused.value), refused.value.errno) == (
                status,
                f"refused: {status}",
                errno,
            )
        with pytest.raises(GuestRefused) as refused:
            async for _ in remote.follow_guest_process(INSTANCE, 404):
                pass
        assert (refused.value.status, refused.value.errno) == (status, errno)


async def test_a_follower_gets_output_dropped_and_exit_with_replay_and_hold_passed(hop: Hop) -> None:
    remote, runtime = hop.remote, hop.runtime
    big = bytes(range(256)) * (BIG // 256)
    runtime.script = [Output("pty", b"$ "), Dropped(123456), Output("stderr", big), Exit(130)]
    got: list[Output | Dropped | Exit] = []
    async for item in remote.follow_guest_process(INSTANCE, "web", replay=True, hold=True):
        got.append(item)
    # Output larger than a frame arrives in frames, in order.
    assert got[:2] == [Output("pty", b"$ "), Dropped(123456)] and got[-1] == Exit(130)
    assert all(isinstance(item, Output) and item.stream == "stderr" for item in got[2:-1])
    assert b"".join(item.data for item in got[2:-1] if isinstance(item, Output)) == big
    assert len(got) > 5
    follower = runtime.followers[-1]
    assert (follower.selector, follower.replay, follower.hold) == ("web", True, True)
    async for _ in remote.follow_guest_process(INSTANCE, 41):
        pass
    follower = runtime.followers[-1]
    assert (follower.selector, follower.replay, follower.hold) == (41, False, False)


async def test_a_held_follower_stops_the_output_while_its_consumer_does_not_read(hop: Hop) -> None:
    remote, runtime = hop.remote, hop.runtime
    runtime.flood = True
    items = remote.follow_guest_process(INSTANCE, "web", hold=True)
    first = await anext(items)
    assert isinstance(first, Output)
    follower = runtime.followers[-1]
    # The consumer does not read: the node's follower is stopped by gRPC's flow control.
    await asyncio.sleep(0.5)
    stalled = follower.sent
    await asyncio.sleep(0.5)
    print(f"a consumer that does not read holds the node's follower after {stalled / (1 << 20):.1f} MiB")
    assert follower.sent == stalled and stalled < 32 << 20
    # It reads again: the output flows again.
    for _ in range(200):
        await anext(items)
    assert follower.sent > stalled
    # Closing the consumer closes the node's follower (the process would run on).
    await items.aclose()
    await asyncio.wait_for(follower.closed.wait(), 5)


async def test_stop_ends_a_follower_with_job_stopped_and_closes_the_nodes(hop: Hop) -> None:
    remote, runtime = hop.remote, hop.runtime
    runtime.flood = True
    stop = asyncio.Event()
    with pytest.raises(JobStopped):
        async for _ in remote.follow_guest_process(INSTANCE, "web", stop=stop):
            stop.set()
            await asyncio.sleep(0.1)
    await asyncio.wait_for(runtime.followers[-1].closed.wait(), 5)


async def _raw(address: str, secret: str, rpc: str, request: Any) -> grpc.StatusCode:
    """One call as anyone may make it: its status (a stream's is read to its end)."""
    metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
    async with grpc.aio.insecure_channel(address) as channel:
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


def call(operation: str, arguments: bytes = b"{}", data: bytes = b"", instance_id: str = INSTANCE) -> Any:
    return guest_pb2.CallGuestProcessesRequest(
        instance_id=instance_id, operation=operation, arguments=arguments, data=data
    )


def follow(selector: bytes, instance_id: str = INSTANCE) -> Any:
    return guest_pb2.FollowGuestProcessRequest(instance_id=instance_id, selector=selector)


HOSTILE_CALLS = {
    "unknown-operation": call("exec", b'{"argv": ["sh"]}'),
    "no-operation": call(""),
    "not-json": call("list", b"{not json"),
    "not-an-object": call("signal", b"[1, 2]"),
    "unknown-field": call("signal", b'{"pid": 3, "signal": 9, "all": true}'),
    "wrong-type": call("signal", b'{"pid": "3"}'),
    "pid-and-tag": call("signal", b'{"pid": 3, "tag": "web"}'),
    "neither": call("resize", b'{"rows": 3, "cols": 3}'),
    "pid-0": call("signal", b'{"pid": 0}'),
    "pid-huge": call("signal", b'{"pid": 99999999999999999999999}'),
    "signal-65": call("signal", b'{"pid": 3, "signal": 65}'),
    "rows-0": call("resize", b'{"tag": "web", "rows": 0, "cols": 80}'),
    "cols-65536": call("resize", b'{"tag": "web", "rows": 24, "cols": 65536}'),
    "tag-long": call("input", b'{"tag": "' + b"t" * 300 + b'"}'),
    "negative-offset": call("input", b'{"tag": "web", "offset": -1}'),
    "input-too-big": call("input", b'{"tag": "web"}', b"x" * (MAX_DATA_BYTES + 1)),
    "data-for-signal": call("signal", b'{"pid": 3}', b"x"),
    "arguments-too-big": call("start", b'{"argv": ["' + b"a" * MAX_ARGUMENTS_BYTES + b'"]}'),
    "deep-job": call("start", b'{"job": {"a": ' + b"[" * 20000 + b"]" * 20000 + b"}}"),
    "argv-and-job": call("start", b'{"argv": ["sh"], "job": {"mode": "write"}}'),
    "no-command": call("start", b"{}"),
    "nul-in-argv": call("start", b'{"argv": ["sh\\u0000x"]}'),
    "nul-in-env": call("start", b'{"argv": ["sh"], "env": {"A": "\\u0000"}}'),
    "pty-0": call("start", b'{"argv": ["sh"], "pty": [0, 80]}'),
    "negative-owner": call("end", b'{"keep_owner": -1}'),
    "bad-utf8": call("start", b'{"argv": ["\xff"]}'),
    "no-instance": call("list", instance_id=""),
    "long-instance": call("list", instance_id="i" * 10_000),
}

HOSTILE_FOLLOWS = {
    "not-json": follow(b"\x00"),
    "neither": follow(b"{}"),
    "pid-and-tag": follow(b'{"pid": 3, "tag": "web"}'),
    "unknown-field": follow(b'{"pid": 3, "replay": true}'),
    "too-big": follow(b'{"tag": "' + b"t" * 70000 + b'"}'),
    "long-instance": follow(b'{"pid": 3}', instance_id="i" * 10_000),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CALLS))
async def test_hostile_arguments_are_invalid_and_never_reach_the_runtime(hop: Hop, name: str) -> None:
    assert (
        await _raw(hop.address, SECRET, "CallGuestProcesses", HOSTILE_CALLS[name]) == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert hop.runtime.calls == []
    # The hop serves on.
    assert await hop.remote.list_guest_processes(INSTANCE)


@pytest.mark.parametrize("name", sorted(HOSTILE_FOLLOWS))
async def test_a_hostile_selector_is_invalid_and_never_reaches_the_runtime(hop: Hop, name: str) -> None:
    code = await _raw(hop.address, SECRET, "FollowGuestProcess", HOSTILE_FOLLOWS[name])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert hop.runtime.followers == []


async def test_a_caller_without_the_secret_is_refused_before_the_runtime_is_asked(hop: Hop) -> None:
    for secret in ("", "not-the-secret"):
        assert await _raw(hop.address, secret, "CallGuestProcesses", call("list")) == grpc.StatusCode.UNAUTHENTICATED
        assert await _raw(hop.address, secret, "CallGuestProcesses", call("end")) == grpc.StatusCode.UNAUTHENTICATED
        code = await _raw(hop.address, secret, "FollowGuestProcess", follow(b'{"pid": 3}'))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    assert hop.runtime.calls == [] and hop.runtime.followers == []


class JobsOnly:
    """A runtime with guest jobs and no guest processes."""

    def guest_ready(self, instance_id: str) -> bool:
        return True

    def check_file_path(self, path: str, mounts: list[str]) -> None:
        pass

    async def guest_job(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Output | Exit, None]:
        yield Exit(0)


async def test_a_node_whose_runtime_keeps_no_processes_answers_unimplemented() -> None:
    async with serving(JobsOnly()) as hop:
        assert await _raw(hop.address, SECRET, "CallGuestProcesses", call("list")) == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(Unimplemented):
            await hop.remote.list_guest_processes(INSTANCE)
        with pytest.raises(Unimplemented):
            async for _ in hop.remote.follow_guest_process(INSTANCE, 3):
                pass


async def test_a_node_that_does_not_answer_is_unavailable() -> None:
    async with serving(RecordingProcesses()) as hop:
        address = hop.address
    remote = RemoteGuests(address, SECRET, lambda path, mounts: None)
    try:
        with pytest.raises(GuestRefused) as refused:
            await remote.signal_guest_process(INSTANCE, 3, 15)
        assert refused.value.status == "unavailable"
        with pytest.raises(GuestRefused) as refused:
            async for _ in remote.follow_guest_process(INSTANCE, 3):
                pass
        assert refused.value.status == "unavailable"
    finally:
        await remote.close()
