"""Streams on the listeners under hostile clients (issue 27, "not yet tried"), against a real
`kibo-ctrl serve`: HTTP/2 rapid reset (CVE-2023-44487) and floods of streams on both ports,
and the per-tenant cap on open WatchWorkspace streams.

The floods come from a process of their own (`python -m tests.h2_flood`), bounded in streams
and seconds; meanwhile this process times an authenticated call on a connection of its own,
against its median measured in the same test before the flood (a ratio, never an absolute
time). Figures are printed (`pytest -s`).

Before the fixes: the gRPC port advertised no stream limit, so one connection's streams that
never send their request held ~90,000 calls and 1.7 GiB and others' calls waited up to 1.3 s,
and a rapid reset grew the server by 425 MiB; on hypercorn's port a rapid reset ended its
connection with an exception and no GOAWAY, and another client's call waited up to 2.6 s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, error_of
from tests.h2_flood import ENHANCE_YOUR_CALM, rss_mib
from tests.integration.test_auth import make_token
from tests.server import ServerProcess
from tests.system.test_listener_abuse import authenticated_latencies, connect, grpc_health, healthz, serve

REPO = Path(__file__).resolve().parents[2]
# A full handler that needs no token (the flood is anonymous, as anyone on the network is).
HEALTH = "/grpc.health.v1.Health/Check"
CAPABILITIES = "/kibo.ctrl.v1.WorkspaceService/GetCapabilities"
WATCH = "/kibo.ctrl.v1.WorkspaceService/WatchWorkspace"
# What the server may grow by during a flood: before the fixes the floods below grew it by
# hundreds of MiB; a bound on memory is a correctness property.
RSS_BOUND_MIB = 64
# How much slower another client's median call may be during a flood than before it, on this
# machine shared with the flood's own process (figures are printed).
LATENCY_RATIO = 25
# Streams per connection on the gRPC port (transport/grpc.py) and hypercorn's, and kibo's reset
# budget on hypercorn's connections (transport/http.py).
GRPC_STREAMS = 1024
H2C_STREAMS = 100
RESET_BURST = 200


class Flood:
    """`python -m tests.h2_flood` running, and this process's view of the server meanwhile:
    its peak RSS and another client's call times."""

    def __init__(self, server: ServerProcess, *args: str) -> None:
        assert server.process is not None
        self.pid = server.process.pid
        self.server = server
        self.rss_before = rss_mib(self.pid)
        self.rss_peak = self.rss_before
        self.latencies: list[float] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.h2_flood", *args], cwd=REPO, stdout=subprocess.PIPE, text=True
        )

    def measure_until_done(self) -> dict[str, Any]:
        """Time calls and sample RSS until the flood ends; its summary."""
        while self.process.poll() is None:
            self.rss_peak = max(self.rss_peak, rss_mib(self.pid))
            self.latencies.extend(authenticated_latencies(self.server, 1))
            time.sleep(0.01)
        out, _ = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, out
        self.rss_peak = max(self.rss_peak, rss_mib(self.pid))
        summary: dict[str, Any] = json.loads(out)
        return summary

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextlib.contextmanager
def flood(server: ServerProcess, *args: str) -> Iterator[Flood]:
    running = Flood(server, *args)
    try:
        yield running
    finally:
        running.kill()


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def report(name: str, quiet: list[float], running: Flood, summary: dict[str, Any]) -> None:
    loaded = sorted(running.latencies)
    p99 = loaded[int(len(loaded) * 0.99)] * 1000 if loaded else float("nan")
    print(
        f"\n{name}: {summary}; server RSS {running.rss_before:.0f} -> peak {running.rss_peak:.0f} MiB; "
        f"another client's call: median {median_ms(quiet):.2f} ms quiet, {median_ms(loaded):.2f} ms "
        f"(p99 {p99:.1f} ms, n={len(loaded)}) during the flood"
    )


def assert_others_served(quiet: list[float], running: Flood) -> None:
    assert running.latencies, "no call completed during the flood"
    assert median_ms(running.latencies) <= LATENCY_RATIO * median_ms(quiet), (
        f"another client's median call went from {median_ms(quiet):.2f} to {median_ms(running.latencies):.2f} ms"
    )


# -- the gRPC port ---------------------------------------------------------------------------


def test_rapid_reset_on_the_grpc_port_is_refused_past_the_stream_limit(tmp_path: Path) -> None:
    """60,000 streams on one connection, each HEADERS + an empty message + RST_STREAM: the
    server refuses streams while 1,024 are allocated (REFUSED_STREAM), so its memory stays
    bounded (it grew by 425 MiB), and it keeps serving others."""
    with serve(tmp_path, "uvicorn") as server:
        quiet = authenticated_latencies(server, 50)
        with flood(server, "reset", "127.0.0.1", str(server.port), HEALTH, "60000", "15") as running:
            summary = running.measure_until_done()
        report("gRPC port, rapid reset", quiet, running, summary)
        assert summary["sent"] == 60_000
        assert running.rss_peak - running.rss_before < RSS_BOUND_MIB
        assert_others_served(quiet, running)
        assert summary["refused"] > 0, "the server refused no stream: it advertised no limit"
        grpc_health(server)


def test_streams_that_never_end_hold_at_most_the_limit_on_the_grpc_port(tmp_path: Path) -> None:
    """30,000 streams on one connection that never send their request (the token comes with
    it, so nobody is authenticated yet): the server holds at most 1,024 and refuses the rest
    at once; its memory stays bounded (it held every one: +1.7 GiB at 300,000)."""
    with serve(tmp_path, "uvicorn") as server:
        quiet = authenticated_latencies(server, 50)
        with flood(server, "open", "127.0.0.1", str(server.port), CAPABILITIES, "30000", "15") as running:
            summary = running.measure_until_done()
        report("gRPC port, streams that never end", quiet, running, summary)
        assert summary["sent"] == 30_000
        assert running.rss_peak - running.rss_before < RSS_BOUND_MIB
        assert_others_served(quiet, running)
        assert summary["max_concurrent_streams"] == GRPC_STREAMS
        assert summary["refused"] >= 30_000 - GRPC_STREAMS, summary
        grpc_health(server)


# -- the HTTP port ---------------------------------------------------------------------------


def test_rapid_reset_on_hypercorn_gets_goaway_enhance_your_calm(tmp_path: Path) -> None:
    """hypercorn speaks h2c on the HTTP port: a rapid reset is cut after the connection's
    reset budget with GOAWAY(ENHANCE_YOUR_CALM), not by an exception after ~1,000 streams
    (a traceback in the log each time); again and again for 5 s, others are served."""
    with serve(tmp_path, "hypercorn") as server:
        with flood(server, "reset", "127.0.0.1", str(server.http_port), CAPABILITIES, "20000", "10") as running:
            once = running.measure_until_done()
        print(f"\none connection: {once}")
        assert once["goaways"] == {str(ENHANCE_YOUR_CALM): 1}, once
        # The last stream it took: its budget and what one slice of the read held besides.
        assert once["last_streams"][0] <= 2 * 4 * RESET_BURST, once
        quiet = authenticated_latencies(server, 50)
        with flood(
            server, "reset", "127.0.0.1", str(server.http_port), CAPABILITIES, "20000", "5", "reconnect"
        ) as running:
            summary = running.measure_until_done()
        report("HTTP port (hypercorn), rapid reset on one connection after another", quiet, running, summary)
        assert summary["connections"] > 1
        assert_others_served(quiet, running)
        healthz(server, "127.0.0.2")
        assert "Traceback" not in server.log(), server.log()


def test_streams_past_hypercorns_limit_end_the_connection(tmp_path: Path) -> None:
    """More streams than hypercorn's 100 open at once on one connection: a protocol error
    (GOAWAY), not held streams; the port keeps serving."""
    with serve(tmp_path, "hypercorn") as server:
        with flood(server, "open", "127.0.0.1", str(server.http_port), CAPABILITIES, "5000", "10") as running:
            summary = running.measure_until_done()
        print(f"\n{summary}")
        assert summary["max_concurrent_streams"] == H2C_STREAMS
        assert summary["goaways"] == {"1": 1}, summary  # PROTOCOL_ERROR
        assert summary["last_streams"][0] <= 2 * (H2C_STREAMS + 1)
        healthz(server, "127.0.0.2")


async def test_a_server_stops_while_a_channel_queues_streams_past_hypercorns_limit(tmp_path: Path) -> None:
    """A gRPC client on the h2c port with 150 watches on one channel (hypercorn takes 100 at
    once; its channel queues the rest and sends them as others end, during the shutdown):
    SIGTERM stops the server within its grace (it waited for good)."""
    server = ServerProcess(tmp_path / "data", ("--http-server", "hypercorn"), auth=True).start()
    try:
        async with Client.connect(server.http_address, server.admin_token) as client:
            workspace_id = (await client.create()).workspace_id
            calls = [client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id)) for _ in range(150)]
            firsts = [asyncio.ensure_future(_first_message(call)) for call in calls]
            for streaming, first in enumerate(asyncio.as_completed(firsts, timeout=10), 1):
                await first
                if streaming == H2C_STREAMS:
                    break
            assert sum(f.done() for f in firsts) == H2C_STREAMS  # the rest wait in the channel
            started = time.monotonic()
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(server.process.wait, 30)
            print(f"\nstopped in {time.monotonic() - started:.1f} s (grace 5 s)")
            for call in calls:
                call.cancel()
            await asyncio.gather(*firsts, return_exceptions=True)
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()
    assert server.process.returncode == 0, server.log()


def test_uvicorn_does_not_speak_http2(tmp_path: Path) -> None:
    """uvicorn (the default HTTP server) speaks HTTP/1.1 only: an HTTP/2 preface and a flood
    of streams behind it get no HTTP/2 answer, only the connection's end."""
    from tests.h2_flood import H2Flooder

    with serve(tmp_path, "uvicorn") as server:
        connection = H2Flooder("127.0.0.1", server.http_port)
        try:
            connection.send(b"".join(connection.stream_frames(CAPABILITIES) for _ in range(100)))
            connection.read(2)
            assert connection.seen.closed
            assert connection.seen.max_concurrent_streams is None and not connection.seen.headers
        finally:
            connection.close()
        healthz(server, "127.0.0.1")


# -- open WatchWorkspace streams per tenant -----------------------------------------------


WATCH_CAP = 3


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A sim server whose tenants may each hold WATCH_CAP watches; hypercorn on the HTTP port."""
    flags = ("--max-watches-per-tenant", str(WATCH_CAP))
    with serve(tmp_path_factory.mktemp("capped"), "hypercorn", *flags) as server:
        yield server


async def _first_message(call: Any) -> None:
    async for _ in call:
        return
    raise AssertionError("the watch ended before its first message")


@contextlib.asynccontextmanager
async def watches(client: Client, workspace_id: str, count: int) -> AsyncIterator[list[Any]]:
    """`count` WatchWorkspace streams, each past its first message; cancelled at the end."""
    calls = [client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id)) for _ in range(count)]
    try:
        await asyncio.wait_for(asyncio.gather(*(_first_message(call) for call in calls)), 10)
        yield calls
    finally:
        for call in calls:
            call.cancel()


async def refused(client: Client, workspace_id: str) -> grpc.aio.AioRpcError:
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(_first_message(call), 10)
    return caught.value


async def accepted_again(client: Client, workspace_id: str) -> None:
    """A new watch is accepted within a few seconds (the server frees a slot when it sees the
    end of a stream, a moment after the client's)."""
    deadline = time.monotonic() + 5
    while True:
        call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
        try:
            await asyncio.wait_for(_first_message(call), 10)
            call.cancel()
            return
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline, error
            await asyncio.sleep(0.05)


def quota_failure(error: grpc.aio.AioRpcError) -> error_details_pb2.QuotaFailure:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for packed in status_pb2.Status.FromString(value).details:
                if packed.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
                    failure = error_details_pb2.QuotaFailure()
                    packed.Unpack(failure)
                    return failure
    raise AssertionError("no QuotaFailure in the error details")


async def test_a_tenant_past_its_watch_cap_is_refused_in_words(capped: ServerProcess) -> None:
    """The cap's next watch is RESOURCE_EXHAUSTED naming the cap, whatever workspace it
    names; another tenant still watches; once a watch ends, a new one is accepted."""
    other_token = make_token(capped, "watch-other")
    async with (
        Client.connect(capped.address, capped.admin_token) as client,
        Client.connect(capped.address, other_token) as other,
    ):
        mine = (await client.create()).workspace_id
        theirs = (await other.create()).workspace_id
        async with watches(client, mine, WATCH_CAP) as held:
            error = await refused(client, mine)
            info = error_of(error)
            assert (info.code, info.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED")
            assert f"WatchWorkspace streams open, the most a tenant may have ({WATCH_CAP})" in (error.details() or "")
            assert info.info.metadata["quota"] == "watch_streams"
            assert info.info.metadata["limit"] == str(WATCH_CAP)
            assert quota_failure(error).violations[0].subject == "watch_streams"
            # At its cap a tenant learns nothing about IDs: refused before the lookup.
            assert error_of(await refused(client, "ws-does-not-exist")).reason == "QUOTA_EXCEEDED"
            # Another tenant is not counted with this one.
            async with watches(other, theirs, WATCH_CAP):
                pass
            held[0].cancel()
            await accepted_again(client, mine)


async def test_watches_that_fail_or_disconnect_give_their_place_back(capped: ServerProcess) -> None:
    """A watch that fails (NOT_FOUND), a channel closed under its watches and a Connect
    stream whose connection is dropped leave no count behind: the full cap is open again."""
    async with Client.connect(capped.address, capped.admin_token) as client:
        workspace_id = (await client.create()).workspace_id
        for _ in range(2 * WATCH_CAP):
            assert error_of(await refused(client, "ws-does-not-exist")).reason == "NOT_FOUND"
        async with (
            Client.connect(capped.address, capped.admin_token) as doomed,
            watches(doomed, workspace_id, WATCH_CAP),
        ):
            await doomed.channel.close()  # type: ignore[union-attr]
        await accepted_again(client, workspace_id)
        dropped = [_connect_watch(capped, workspace_id) for _ in range(WATCH_CAP)]
        assert error_of(await refused(client, workspace_id)).reason == "QUOTA_EXCEEDED"
        for sock in dropped:
            sock.close()
        await accepted_again(client, workspace_id)
        async with watches(client, workspace_id, WATCH_CAP):
            pass


def _connect_watch(server: ServerProcess, workspace_id: str) -> socket.socket:
    """A Connect (HTTP/1.1) WatchWorkspace stream, past its first message, left open."""
    message = ws.WatchWorkspaceRequest(workspace_id=workspace_id).SerializeToString()
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    sock = connect(server, timeout=5)
    sock.sendall(
        f"POST {WATCH} HTTP/1.1\r\nHost: kibo\r\nContent-Type: application/connect+proto\r\n"
        f"Authorization: Bearer {server.admin_token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while b"\r\n\r\n" not in received or b"\r\n" not in received.partition(b"\r\n\r\n")[2]:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower(), received
    # The first chunk: a message (flags 0), not the end of the stream (flags 2).
    assert body.partition(b"\r\n")[2][:1] == b"\x00", received
    return sock


async def test_many_watches_on_one_channel_are_answered_at_once(tmp_path: Path) -> None:
    """Issue 27's 3,000 watches on one channel, at the default cap (256): 256 stream and the
    rest are refused at once; nothing waits in the channel's queue for long."""
    with serve(tmp_path, "uvicorn", "--rate-limit-rps", "0") as server:
        async with Client.connect(server.address, server.admin_token) as client:
            workspace_id = (await client.create()).workspace_id
            calls = [client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id)) for _ in range(3000)]
            started = time.monotonic()
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(_first_message(call) for call in calls), return_exceptions=True), 60
            )
            seconds = time.monotonic() - started
            for call in calls:
                call.cancel()
        streaming = [o for o in outcomes if o is None]
        codes = Counter(o.code() for o in outcomes if isinstance(o, grpc.aio.AioRpcError))
        print(f"\n3,000 watches on one channel: {len(streaming)} streaming, the rest {codes}, in {seconds:.1f} s")
        assert len(streaming) == 256
        # Past the connection's 1,024 streams the channel queues its calls, and as they come
        # and go grpc core refuses some that would pass it (UNAVAILABLE, safe to retry).
        assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}, codes
        assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] > codes[grpc.StatusCode.UNAVAILABLE], codes
