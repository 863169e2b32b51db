"""TCP connections into a running guest (issue 28: an exposure's last hop), with a real
`kibo-ctrl serve` (its own process node) and a real `kibo-ctrl node` agent: a small python3
server in each guest is reached through the runtime (runtime/process/guest_ports.py, as the
embedded node opens it) and through the remote node's hop (NodeGuestService.OpenGuestPort, as
the control plane's RemoteGuests opens it): bytes both ways (10 MiB each way at once, with
back-pressure), each side's half-close, "port-closed" for a port nothing listens on, the
guest's own 127.0.0.1 (not the host's, which listens on the same port), a server bound to
0.0.0.0, and close() ending the guest-side connection at once. Hostile input on the hop (a
bad first frame, ports 0 and 65536, a foreign instance, an oversized frame, no secret) is a
clean refusal and the hop serves on. A pid reused after the guest ended, or a guest without
a network namespace of its own (--sandbox none), is never entered (fake instance
directories naming host processes, on the host's network, where a host server listens)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2
from kibo.node.v1 import node_guest_service_pb2_grpc as guest_grpc
from kibo_ctrl.runtime.base import GuestRefused, GuestStream
from kibo_ctrl.runtime.process import safepath
from kibo_ctrl.runtime.process.guest_access import ports as guest_ports
from kibo_ctrl.transport.node_guest_client import RemoteGuests

from tests.client import Client, S
from tests.nodes import NodeProcess, admin, list_nodes
from tests.server import ServerProcess, free_port
from tests.system.test_durability import eventually
from tests.system.test_process_runtime import SMALL, DataPlane, _require_sandbox, instance_dir, reap, state
from tests.system.test_resource_model import process_server

NODE_FLAGS = ("--sandbox", "bwrap", "--stop-grace-ms", "2000")
BIG = 10 << 20

# The guest's server: on LOOP (127.0.0.1) and ANY (0.0.0.0), each connection is greeted with
# "guest:PORT\n" and echoed; when the client's side ends (EOF or reset) the server closes it
# and appends the time (CLOCK_MONOTONIC: the host's, no time namespace) to /data/closed.
GUEST_SERVER = r"""
import socket, sys, threading, time

def handle(conn, port):
    try:
        conn.sendall(b"guest:%d\n" % port)
        while True:
            data = conn.recv(65536)
            if not data:
                break
            conn.sendall(data)
    except OSError:
        pass
    with open("/data/closed", "a") as log:
        log.write("%r\n" % time.monotonic())
    conn.close()

def serve(host, port):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn, port), daemon=True).start()

loop, anywhere = int(sys.argv[1]), int(sys.argv[2])
threading.Thread(target=serve, args=("0.0.0.0", anywhere), daemon=True).start()
serve("127.0.0.1", loop)
"""

Opener = Callable[[int], Awaitable[GuestStream]]


class HostServer:
    """A server on the host's 127.0.0.1:PORT that greets with "host\\n": what an exposure must
    never reach."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", port))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                with conn:
                    conn.sendall(b"host\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5)


@contextlib.contextmanager
def host_server(port: int) -> Iterator[HostServer]:
    server = HostServer(port)
    try:
        yield server
    finally:
        server.close()


async def read_exactly(stream: GuestStream, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = await stream.read()
        assert chunk, f"the connection ended after {len(got)} of {size} bytes: {got[:80]!r}"
        got += chunk
    return got


async def read_to_end(stream: GuestStream) -> bytes:
    got = bytearray()
    while chunk := await stream.read():
        got += chunk
    return bytes(got)


async def refusal(opening: Awaitable[GuestStream]) -> str:
    with pytest.raises(GuestRefused) as refused:
        stream = await opening
        await stream.close()
    return refused.value.status


async def start_guest_server(
    client: Client, workspace_id: str, root: Path, loop: int, anywhere: int, opener: Opener
) -> None:
    plane = DataPlane(client)
    credential = await plane.credential(workspace_id)
    await plane.write(credential, "/data/server.py", GUEST_SERVER.encode())
    script = f"setsid python3 /data/server.py {loop} {anywhere} </dev/null >/dev/null 2>&1 &"
    code, out, err = await plane.exec(credential, "sh", "-c", script)
    assert code == 0, (out, err)

    async def listening() -> bool | None:
        seen = closed_count(root)
        try:
            stream = await opener(loop)
        except GuestRefused as refused:
            assert refused.status == "port-closed", refused
            return None
        await stream.close()
        await guest_side_closed(root, seen)  # logged before the checks count
        return True

    await eventually(listening, within=15, what="the guest's server listening")


def closed_count(root: Path) -> int:
    log = root / "data" / "closed"
    return len(log.read_text().split()) if log.exists() else 0


async def guest_side_closed(root: Path, seen: int, within: float = 5.0) -> float:
    """Wait for the guest's server to log its (seen + 1)th closed connection: when it did."""
    deadline = time.monotonic() + within
    while closed_count(root) <= seen:
        assert time.monotonic() < deadline, "the guest's side of the connection stayed open"
        await asyncio.sleep(0.005)
    return float((root / "data" / "closed").read_text().split()[seen])


async def check_guest_ports(opener: Opener, guest_root: Path, loop: int, anywhere: int, where: str) -> None:
    """What both paths must do (see the module docstring); prints the measured figures."""
    closed = closed_count(guest_root)
    with host_server(loop):
        # The guest's own 127.0.0.1, though the host listens on the same port number.
        stream = await opener(loop)
        assert await read_exactly(stream, len(f"guest:{loop}\n")) == f"guest:{loop}\n".encode()
        # A half-close reaches the guest's server, which echoes what it had and closes: EOF here.
        await stream.write(b"ping")
        await stream.write_eof()
        assert await read_to_end(stream) == b"ping"
        await stream.close()
        await stream.close()  # idempotent
    closed += 1
    await guest_side_closed(guest_root, closed - 1)

    # A server bound to 0.0.0.0 in the guest answers too.
    stream = await opener(anywhere)
    assert await read_exactly(stream, len(f"guest:{anywhere}\n")) == f"guest:{anywhere}\n".encode()
    await stream.close()
    closed += 1
    await guest_side_closed(guest_root, closed - 1)

    # 10 MiB each way at once: the guest echoes while we still send (back-pressure both ways).
    payload = bytes(range(256)) * (BIG // 256)
    stream = await opener(loop)
    await read_exactly(stream, len(f"guest:{loop}\n"))
    started = time.monotonic()

    async def send() -> None:
        for offset in range(0, BIG, 256 * 1024):
            await stream.write(payload[offset : offset + 256 * 1024])
        await stream.write_eof()

    sender = asyncio.create_task(send())
    echoed = await read_to_end(stream)
    await sender
    seconds = time.monotonic() - started
    assert echoed == payload
    print(f"{where}: 10 MiB each way in {seconds:.2f} s ({2 * BIG / seconds / 1e6:.0f} MB/s both ways)")
    await stream.close()
    closed += 1
    await guest_side_closed(guest_root, closed - 1)

    # close() cuts the connection: the guest's server sees it end at once.
    stream = await opener(loop)
    await read_exactly(stream, len(f"guest:{loop}\n"))
    cut = time.monotonic()
    await stream.close()
    ended = await guest_side_closed(guest_root, closed)
    print(f"{where}: close() ended the guest's side {1000 * (ended - cut):.1f} ms later")
    assert ended - cut < 0.5
    assert await stream.read() == b""
    with pytest.raises(ConnectionError):
        await stream.write(b"after the close")

    # Nothing listens: port-closed; a port no TCP connection can have: invalid.
    assert await refusal(opener(free_port())) == "port-closed"
    for port in (0, 65536):
        assert await refusal(opener(port)) == "invalid"


def _node(server: ServerProcess, tmp_path: Path, name: str, hop: int) -> NodeProcess:
    flags = (*NODE_FLAGS, "--data-plane-listen", f"127.0.0.1:{hop}")
    return NodeProcess(server.address, tmp_path / name, name, flags, runtime="process")


async def _placed_on(client: Client, server: ServerProcess, node_id: str, others: list[str]) -> Any:
    """A workspace placed on `node_id` (the others cordoned meanwhile)."""
    for other in others:
        await admin(server.address, "CordonNode", other)
    try:
        workspace_id = (await client.create(resources=SMALL)).workspace_id
        placed = await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE, within=60)
    finally:
        for other in others:
            await admin(server.address, "UncordonNode", other)
    assert placed.node_id == node_id
    return placed


def _guest_root(host: Any, workspace: Any) -> Path:
    return Path(f"/proc/{int(state(host, workspace)['guest_pid'])}/root")


async def _raw_call(
    address: str, secret: str, *frames: guest_pb2.OpenGuestPortRequest, end: bool = False
) -> tuple[grpc.StatusCode, list[str]]:
    """OpenGuestPort with these frames, then (`end`) the end of the client's side: the status
    and the kinds of the frames the node answered. (A refusal before any frame is read is
    checked with nothing sent: grpc's client may report a write that meets the server's
    refusal as INTERNAL 'Internal error from Core', whatever the status was.)"""
    metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = guest_grpc.NodeGuestServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.OpenGuestPort(metadata=metadata)
        kinds: list[str] = []
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            for frame in frames:
                await call.write(frame)
            if end:
                await call.done_writing()
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for answer in call:
                kinds.append(str(answer.WhichOneof("frame")))
        code: grpc.StatusCode = await call.code()
        print(f"OpenGuestPort {[f.WhichOneof('frame') for f in frames]}: {code.name} {await call.details()!r}")
        return code, kinds


@pytest.mark.timeout(180)
async def test_guest_ports_in_process_and_through_a_nodes_hop(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    _require_sandbox()
    with process_server(server_factory, "--node-timeout-ms", "3000") as server:
        hop = free_port()
        node = _node(server, tmp_path, "node-r", hop).start()
        remote: RemoteGuests | None = None
        try:
            async with Client.connect(server.address) as client:

                async def joined() -> bool | None:
                    return True if "node-r" in await list_nodes(server.address) else None

                await eventually(joined, within=30, what="node-r joined")
                local_id = next(n for n in await list_nodes(server.address) if n != "node-r")
                here = await _placed_on(client, server, local_id, ["node-r"])
                there = await _placed_on(client, server, "node-r", [local_id])

                # In process: the embedded node's runtime opens it (guest_ports.py).
                directory = instance_dir(server, here)

                async def local(port: int) -> GuestStream:
                    return await guest_ports.open_guest_port(directory, port)

                loop, anywhere = free_port(), free_port()
                await start_guest_server(client, here.workspace_id, _guest_root(server, here), loop, anywhere, local)
                await check_guest_ports(local, _guest_root(server, here), loop, anywhere, "in process")

                # Through the node's hop, as the control plane opens it (RemoteGuests).
                with contextlib.closing(sqlite3.connect(server.data_dir / "kibo.db")) as db:
                    record = json.loads(db.execute("SELECT data FROM nodes WHERE id = 'node-r'").fetchone()[0])
                secret = record["data_plane_token"]
                remote = RemoteGuests(f"127.0.0.1:{hop}", secret, safepath.guest_file_path)
                instance = f"{there.workspace_id}-g{there.execution_generation}"

                async def through(port: int) -> GuestStream:
                    assert remote is not None
                    return await remote.open_guest_port(instance, port)

                node_host = cast(Any, node)  # its data dir, as the helpers read a server's
                root = _guest_root(node_host, there)
                await start_guest_server(client, there.workspace_id, root, loop, anywhere, through)
                await check_guest_ports(through, _guest_root(node_host, there), loop, anywhere, "through the hop")

                # Hostile input on the hop: a clean refusal each, and the hop serves on.
                address = f"127.0.0.1:{hop}"
                opening = guest_pb2.OpenGuestPortRequest(open=guest_pb2.GuestPortOpen(instance_id=instance, port=loop))
                assert (await _raw_call(address, ""))[0] == grpc.StatusCode.UNAUTHENTICATED
                assert (await _raw_call(address, "not-the-secret"))[0] == grpc.StatusCode.UNAUTHENTICATED
                data_first = guest_pb2.OpenGuestPortRequest(data=b"GET / HTTP/1.1\r\n\r\n")
                assert (await _raw_call(address, secret, data_first))[0] == grpc.StatusCode.INVALID_ARGUMENT
                assert (await _raw_call(address, secret, end=True))[0] == grpc.StatusCode.INVALID_ARGUMENT
                for bad_id in ("", "x" * 10_000):
                    bad = guest_pb2.OpenGuestPortRequest(open=guest_pb2.GuestPortOpen(instance_id=bad_id, port=loop))
                    assert (await _raw_call(address, secret, bad))[0] == grpc.StatusCode.INVALID_ARGUMENT
                for foreign in (f"{here.workspace_id}-g{here.execution_generation}", "../../../proc/1", "ws-none-g1"):
                    assert await refusal(remote.open_guest_port(foreign, loop)) == "unavailable"
                # A data frame over 64 KiB: the node cuts that connection (the guest sees it end).
                seen = closed_count(_guest_root(node_host, there))
                too_big = guest_pb2.OpenGuestPortRequest(data=b"x" * (64 * 1024 + 1))
                code, kinds = await _raw_call(address, secret, opening, too_big)
                assert code == grpc.StatusCode.OK and kinds[0] == "opened" and kinds[-1] == "eof", kinds
                await guest_side_closed(_guest_root(node_host, there), seen)
                stream = await through(loop)
                assert await read_exactly(stream, len(f"guest:{loop}\n")) == f"guest:{loop}\n".encode()
                await stream.close()
                assert node.process is not None and node.process.poll() is None, node.log()
        finally:
            if remote is not None:
                await remote.close()
            node.kill()
            reap(node.data_dir)


# -- a guest that is not there any more, or has no network of its own ---------------------------------


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _fake_instance(directory: Path, isolation: str, pid: int, start: int) -> Path:
    """An instance directory as a supervisor leaves it, naming `pid` (a host process, on the
    host's network) as its guest."""
    directory.mkdir(parents=True)
    (directory / "spec.json").write_text(json.dumps({"isolation": isolation}))
    (directory / "state.json").write_text(json.dumps({"state": "ready", "guest_pid": pid, "guest_start": start}))
    return directory


async def test_a_reused_pid_or_a_guest_without_its_own_network_is_never_entered(tmp_path: Path) -> None:
    _require_sandbox()
    port = free_port()
    stand_in = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        start = _start_time(stand_in.pid)
        with host_server(port):
            # The control: the same directory with the process's true start time is entered
            # (here, the host's network: what the checks below keep an exposure from).
            entered = _fake_instance(tmp_path / "control", "bwrap", stand_in.pid, start)
            stream = await guest_ports.open_guest_port(entered, port)
            assert await read_exactly(stream, 5) == b"host\n"
            await stream.close()
            # The guest ended and its pid now names another process (started at another time).
            reused = _fake_instance(tmp_path / "reused", "bwrap", stand_in.pid, start + 1)
            assert await refusal(guest_ports.open_guest_port(reused, port)) == "unavailable"
            # --sandbox none: the guest is a host process; its ports are the host's.
            unsandboxed = _fake_instance(tmp_path / "none", "none", stand_in.pid, start)
            assert await refusal(guest_ports.open_guest_port(unsandboxed, port)) == "unavailable"
            # Not ready, or gone: unavailable.
            (entered / "state.json").write_text(json.dumps({"state": "starting", "guest_pid": stand_in.pid}))
            assert await refusal(guest_ports.open_guest_port(entered, port)) == "unavailable"
            assert await refusal(guest_ports.open_guest_port(tmp_path / "missing", port)) == "unavailable"
    finally:
        stand_in.kill()
        await stand_in.wait()
