"""The HTTP port under hostile clients (issue 10, findings 9 and 10), against a real
`kibo-ctrl serve`. All traffic goes to 127.0.0.x, bounded in count and time.

Finding 9: idle, incomplete connections without a token exhausted the server's file
descriptors; health and gRPC calls timed out and the log grew without bound. Finding 10:
request bodies were read and decoded before the token was checked, so anonymous 4 MB
bodies slowed every authenticated call.

Figures (latency medians, RSS) are printed (`pytest -s`), never asserted."""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc

from tests.server import ServerProcess

HTTP_SERVERS = ("uvicorn", "hypercorn")
CREATE = "/kibo.ctrl.v1.WorkspaceService/CreateWorkspace"
WATCH = "/kibo.ctrl.v1.WorkspaceObservationService/WatchWorkspace"
# The attack of finding 10: a 4 MB Connect JSON body.
BIG_BODY_BYTES = 4 * 1024 * 1024
# Open-file limit of the flooded server: small enough that a bounded flood proves the point.
NOFILE = 1024


@contextlib.contextmanager
def serve(tmp_path: Path, http_server: str, *flags: str, nofile: int | None = None) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data", ("--http-server", http_server, *flags), auth=True, nofile=nofile)
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop(timeout=20)
        except Exception:
            server.kill()


def log_bytes(server: ServerProcess) -> int:
    assert server.log_path is not None
    return server.log_path.stat().st_size


# -- raw HTTP/1.1 clients -------------------------------------------------------------------


def connect(server: ServerProcess, source: str = "127.0.0.1", timeout: float = 0.5) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(
    path: str, content_type: str, length: int | None = None, token: str | None = None, chunked: bool = False
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: kibo", f"Content-Type: {content_type}"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one HTTP/1.1 response (Content-Length framed)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data!r}")
        data += chunk
    raw_head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    status = int(status_line.split()[1])
    if headers.get("transfer-encoding") == "chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, headers, _unchunk(body)
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


def is_open(sock: socket.socket) -> bool:
    """Still open from the server's side (no EOF or reset waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def open_idle_connections(server: ServerProcess, count: int, seconds: float) -> list[socket.socket]:
    """`count` connections that send half a request head, no token, and then nothing."""
    partial = b"POST " + CREATE.encode() + b" HTTP/1.1\r\nHost: kibo\r\nContent-Type: application/json\r\n"
    opened: list[socket.socket] = []
    failures = 0
    deadline = time.monotonic() + seconds
    while len(opened) + failures < count and time.monotonic() < deadline:
        try:
            sock = connect(server, timeout=0.2)
            sock.sendall(partial)
            opened.append(sock)
        except OSError:
            failures += 1
    return opened


def healthz(server: ServerProcess, source: str) -> float:
    """GET /healthz on a fresh connection from `source`; seconds it took."""
    started = time.perf_counter()
    with connect(server, source, timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: kibo\r\n\r\n")
        status, _, body = read_response(sock, 5)
    assert (status, body) == (200, b"SERVING\n")
    return time.perf_counter() - started


def grpc_health(server: ServerProcess) -> float:
    """A health check on a fresh gRPC connection; seconds it took."""
    started = time.perf_counter()
    with grpc.insecure_channel(server.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return time.perf_counter() - started


def authenticated_latencies(server: ServerProcess, calls: int, seconds: float = 0.0) -> list[float]:
    """Seconds each authenticated GetCapabilities took, over one gRPC channel: `calls`
    of them, and more until `seconds` have passed."""
    metadata = (("authorization", f"Bearer {server.admin_token}"),)
    times: list[float] = []
    until = time.monotonic() + seconds
    with grpc.insecure_channel(server.address) as channel:
        stub = ws_grpc.WorkspaceServiceStub(channel)
        while len(times) < calls or time.monotonic() < until:
            started = time.perf_counter()
            reply = stub.GetCapabilities(ws.GetCapabilitiesRequest(), metadata=metadata, timeout=30)
            times.append(time.perf_counter() - started)
            assert "workspace.stop.force" in reply.capabilities
    return times


def ms(seconds: list[float]) -> str:
    return f"p50 {statistics.median(seconds) * 1000:.1f} ms (n={len(seconds)})"


# -- finding 9: connections -------------------------------------------------------------------


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_idle_connections_past_the_cap_leave_both_ports_serving(tmp_path: Path, http_server: str) -> None:
    """Default limits, an open-file limit of 1024: 1,100 idle half-headers without a token
    (more than the server has descriptors). Health over gRPC and HTTP stays SERVING, an
    authenticated call works, the HTTP port holds at most its per-client cap from the
    attacker's address, the idle ones are closed after the header timeout, the log stays small."""
    with serve(tmp_path, http_server, nofile=NOFILE) as server:
        before = log_bytes(server)
        attack = open_idle_connections(server, 1100, seconds=30)
        try:
            time.sleep(0.5)
            held = sum(is_open(sock) for sock in attack)
            grpc_times = [grpc_health(server) for _ in range(10)]
            http_times = [healthz(server, "127.0.0.2") for _ in range(10)]
            call_times = authenticated_latencies(server, 10)
            print(
                f"\n[{http_server}] {len(attack)} idle connections, {held} held by the server; "
                f"gRPC health (new connection) {ms(grpc_times)}, HTTP /healthz {ms(http_times)}, "
                f"authenticated GetCapabilities {ms(call_times)}"
            )
            # Default cap per client address (256); the rest were closed at accept.
            assert held <= 256
            # The header timeout (10 s; hypercorn: its 5 s idle timeout) closes the held ones.
            deadline = time.monotonic() + 20
            while any(is_open(sock) for sock in attack) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not any(is_open(sock) for sock in attack)
        finally:
            for sock in attack:
                sock.close()
        grown = log_bytes(server) - before
        print(f"[{http_server}] server log grew {grown} bytes during the flood")
        assert grown < 16_000, server.log()


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_caps_and_header_timeout_from_flags(tmp_path: Path, http_server: str) -> None:
    """Low caps set by flags: per client address, per listener, and a client that
    trickles its headers one byte at a time is cut at the header timeout."""
    flags = (
        "--http-max-connections", "30", "--http-max-connections-per-client", "10",
        "--http-header-timeout", "1", "--http-idle-timeout", "1",
    )  # fmt: skip
    with serve(tmp_path, http_server, *flags) as server:
        one_address = open_idle_connections(server, 25, seconds=10)
        many = [connect(server, f"127.0.0.{3 + i % 4}") for i in range(40)]
        try:
            time.sleep(0.3)
            assert sum(is_open(sock) for sock in one_address) <= 10
            assert sum(is_open(sock) for sock in one_address + many) <= 30
            # Trickle: a byte each 0.2 s never completes a head; it is closed while it sends.
            time.sleep(1.5)  # the idle ones are gone, so the trickler gets a place
            trickler = connect(server, "127.0.0.9")
            sent = 0
            request = head(CREATE, "application/json", 2)
            deadline = time.monotonic() + 8
            while is_open(trickler) and time.monotonic() < deadline:
                try:
                    trickler.send(request[sent % len(request) : sent % len(request) + 1])
                except OSError:
                    break
                sent += 1
                time.sleep(0.2)
            assert not is_open(trickler), f"still open after {sent} bytes"
            assert sent < len(request)
            assert not any(is_open(sock) for sock in one_address + many)
            trickler.close()
        finally:
            for sock in one_address + many:
                sock.close()
        # The port serves again once they are gone.
        healthz(server, "127.0.0.1")
        # A request head past 16 KiB is refused, not buffered.
        with connect(server, "127.0.0.10", timeout=5) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: kibo\r\nX-Fill: " + b"a" * 32768)
            status, _, _ = read_response(sock, 5)
        assert status in (400, 431)


def test_a_flood_of_bad_requests_logs_a_few_lines(tmp_path: Path) -> None:
    """uvicorn logs a warning for each invalid request: 300 of them give a few lines."""
    with serve(tmp_path, "uvicorn") as server:
        before = log_bytes(server)
        for _ in range(300):
            with connect(server, timeout=5) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                with contextlib.suppress(OSError):
                    read_response(sock, 5)
        time.sleep(0.2)
        assert server.log_path is not None
        text = server.log_path.read_text(errors="replace")
        assert text.count("Invalid HTTP request") <= 11, text[-2000:]
        assert log_bytes(server) - before < 8_000


# -- finding 10: bodies -----------------------------------------------------------------------


def _json_error(body: bytes) -> dict[str, str]:
    error: dict[str, str] = json.loads(body)
    return error


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_a_request_without_a_token_is_refused_before_its_body(tmp_path: Path, http_server: str) -> None:
    """Only the headers are sent (they announce 4 MB): the answer comes without the body,
    in the protocol the client speaks."""
    with serve(tmp_path, http_server) as server:
        # Connect unary (JSON): HTTP 401 and code unauthenticated.
        with connect(server, timeout=5) as sock:
            sock.sendall(head(CREATE, "application/json", BIG_BODY_BYTES))
            status, headers, body = read_response(sock, 5)
        assert status == 401
        error = _json_error(body)
        assert error["code"] == "unauthenticated"
        assert "token" in error["message"]
        # A wrong token is refused the same way.
        with connect(server, timeout=5) as sock:
            sock.sendall(head(CREATE, "application/proto", BIG_BODY_BYTES, token="kibo_not-a-token"))
            status, _, body = read_response(sock, 5)
        assert (status, _json_error(body)["code"]) == (401, "unauthenticated")
        # gRPC-Web: trailers-only, grpc-status 16 (UNAUTHENTICATED).
        with connect(server, timeout=5) as sock:
            sock.sendall(head(CREATE, "application/grpc-web+proto", BIG_BODY_BYTES))
            status, headers, _ = read_response(sock, 5)
        assert (status, headers["grpc-status"]) == (200, "16")
        # Connect streaming: HTTP 200 and the error in the end-of-stream message.
        with connect(server, timeout=5) as sock:
            sock.sendall(head(WATCH, "application/connect+json", BIG_BODY_BYTES))
            status, headers, body = read_response(sock, 5)
        assert status == 200
        assert body[0] == 0x02
        assert json.loads(body[5:])["error"]["code"] == "unauthenticated"
        # Health stays open.
        healthz(server, "127.0.0.1")
        if http_server == "hypercorn":
            _grpc_over_h2c_needs_the_token(server)


def _grpc_over_h2c_needs_the_token(server: ServerProcess) -> None:
    """hypercorn also serves gRPC over h2c on the HTTP port: refused from the headers too."""
    with grpc.insecure_channel(server.http_address) as channel:
        stub = ws_grpc.WorkspaceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetCapabilities(ws.GetCapabilitiesRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        metadata = (("authorization", f"Bearer {server.admin_token}"),)
        reply = stub.GetCapabilities(ws.GetCapabilitiesRequest(), metadata=metadata, timeout=10)
        assert "workspace.stop.force" in reply.capabilities


def _flood_once(server: ServerProcess, body: bytes) -> tuple[bool, int | None]:
    """Send one anonymous 4 MB request in 64 KiB pieces, watching for an answer between
    pieces. (answered before the whole body was sent, HTTP status or None if reset)."""
    with connect(server, timeout=10) as sock:
        sock.sendall(head(CREATE, "application/json", len(body)))
        answered_early = False
        for offset in range(0, len(body), 65536):
            if select.select([sock], [], [], 0)[0]:
                answered_early = True
                break
            try:
                sock.sendall(body[offset : offset + 65536])
            except OSError:
                answered_early = True  # the server closed the connection while we sent
                break
        try:
            status, _, _ = read_response(sock, 30)
        except OSError:
            return answered_early, None
        return answered_early, status


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_anonymous_large_bodies_are_not_read(tmp_path: Path, http_server: str) -> None:
    """8 connections send 4 MB JSON bodies without a token, over and over, while an
    authenticated gRPC call is timed: every one is answered before its body is sent."""
    # Many small annotations: costly to decode, as the attack of finding 10 was.
    annotations = {f"k{i}": "v" for i in range(BIG_BODY_BYTES // 17)}
    body = json.dumps({"metadata": {"annotations": annotations}}).encode()
    with serve(tmp_path, http_server) as server:
        quiet = authenticated_latencies(server, 50)
        outcomes: list[tuple[bool, int | None]] = []
        stop = threading.Event()

        def flood() -> None:
            while not stop.is_set():
                outcomes.append(_flood_once(server, body))

        threads = [threading.Thread(target=flood) for _ in range(8)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)
            loaded = authenticated_latencies(server, 20, seconds=5)
            assert server.process is not None
            rss_kib = int(re.findall(r"VmRSS:\s+(\d+)", Path(f"/proc/{server.process.pid}/status").read_text())[0])
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        print(
            f"\n[{http_server}] authenticated GetCapabilities: quiet {ms(quiet)}, "
            f"under 8 anonymous 4 MB bodies {ms(loaded)}; {len(outcomes)} flood requests; "
            f"server RSS {rss_kib // 1024} MiB"
        )
        assert outcomes
        late = [outcome for outcome in outcomes if not outcome[0]]
        # On a loaded machine the client can push a whole body into the socket buffers before
        # the server's (early) answer is scheduled, so a few may look late; on main all were
        # (the body was read and decoded first). The exact property, an answer while the body
        # is still unsent, is test_a_request_without_a_token_is_refused_before_its_body.
        assert len(late) <= len(outcomes) // 10, f"{len(late)} of {len(outcomes)} were answered only after their body"
        assert {status for _, status in outcomes} <= {401, None}
        assert any(status == 401 for _, status in outcomes)


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_a_body_over_the_limit_is_refused(tmp_path: Path, http_server: str) -> None:
    """With a token: a Content-Length over --http-max-body-bytes is refused from the
    headers; a chunked body is cut off once it passes the limit, while it streams in; a
    body that stalls past --http-body-timeout is cut off."""
    with serve(tmp_path, http_server, "--http-max-body-bytes", "65536", "--http-body-timeout", "1") as server:
        token = server.admin_token
        with connect(server, timeout=5) as sock:
            sock.sendall(head(CREATE, "application/json", 200_000, token=token))
            status, _, body = read_response(sock, 5)
        assert (status, _json_error(body)["code"]) == (429, "resource_exhausted")
        assert "65536" in _json_error(body)["message"]
        with connect(server, timeout=5) as sock:
            sock.sendall(head(CREATE, "application/json", token=token, chunked=True))
            sent = 0
            piece = b"a" * 16384
            while sent < 4 * 1024 * 1024 and not select.select([sock], [], [], 0.05)[0]:
                try:
                    sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                except OSError:
                    break
                sent += len(piece)
            status, _, body = read_response(sock, 5)
        assert (status, _json_error(body)["code"]) == (429, "resource_exhausted")
        assert 65536 <= sent < 1024 * 1024
        with connect(server, timeout=5) as sock:
            sock.sendall(head(CREATE, "application/json", 1000, token=token) + b'{"metadata":')
            status, _, body = read_response(sock, 10)
        assert (status, _json_error(body)["code"]) == (504, "deadline_exceeded")
        # A request within the limit still works.
        with connect(server, timeout=5) as sock:
            sock.sendall(head("/kibo.ctrl.v1.WorkspaceService/GetCapabilities", "application/json", 2, token) + b"{}")
            status, _, body = read_response(sock, 5)
        assert status == 200
        assert "workspace.stop.force" in json.loads(body)["capabilities"]


def open_fds(server: ServerProcess) -> int:
    assert server.process is not None
    return len(list(Path(f"/proc/{server.process.pid}/fd").iterdir()))


def test_idle_connections_on_the_grpc_port_stay_under_its_cap(tmp_path: Path) -> None:
    """The gRPC port has its own cap: 400 idle TCP connections that never start HTTP/2
    hold at most about its cap of the server's descriptors; HTTP keeps serving."""
    with (
        serve(tmp_path, "uvicorn", "--grpc-max-connections", "50", nofile=NOFILE) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        before = open_fds(server)
        attack: list[socket.socket] = []
        try:
            for _ in range(400):
                with contextlib.suppress(OSError):
                    attack.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.2))
            time.sleep(1)
            held = open_fds(server) - before
            print(f"\n{len(attack)} idle gRPC-port connections; the server holds {held} more descriptors")
            assert held <= 60
            healthz(server, "127.0.0.2")
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            for sock in attack:
                sock.close()
