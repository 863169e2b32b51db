"""Runs the Connect ASGI app in this process's event loop (uvicorn or hypercorn).

The port faces the internet: both servers listen on a CappedListener (a cap on open
connections, in all and per client address), cut a connection whose request headers do
not arrive within the header timeout, close idle keep-alive connections, and bound the
size of a request head (issue 10, finding 9)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from .connect import ASGIApp
from .listener import CappedListener, ConnectionCaps, listen
from .tls import Tls

log = logging.getLogger(__name__)

# Largest request line plus headers (h11's own default, said here so both servers agree).
MAX_HEAD_BYTES = 16 * 1024


def open_file_limit() -> int:
    """The process's soft RLIMIT_NOFILE, as a number (unlimited counts as 2**20)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class HttpLimits:
    # Open connections on the HTTP port; 0: half the process's open-file limit, so the
    # gRPC port and the rest of the process keep the other half.
    max_connections: int = 0
    max_connections_per_client: int = 256
    # From a connection's start (or the end of its last response) to the end of the next
    # request's headers: a client that trickles or never finishes its headers is cut here.
    header_timeout_s: float = 10.0
    # A keep-alive connection with no request in flight is closed after this.
    idle_timeout_s: float = 5.0

    def connection_cap(self) -> int:
        if self.max_connections > 0:
            return self.max_connections
        return max(16, open_file_limit() // 2)

    def caps(self) -> ConnectionCaps:
        return ConnectionCaps(self.connection_cap(), self.max_connections_per_client)


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


class HttpServer(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def _header_timeout_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a header timeout, which uvicorn has not: its keep-alive
    timer starts only after a response and stops at the first byte of the next request,
    so a connection that never completes its headers is held forever."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _header_timeout(self) -> None:
            # IDLE: no request head completed since the timer was armed.
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11Protocol


# Streams a client may reset on one HTTP/2 connection (hypercorn serves h2c): a token bucket
# per connection, RESET_BURST at once (a client cancelling every stream it may have open, 100,
# twice over) and RESET_PER_SECOND after that; past it the connection gets GOAWAY
# (ENHANCE_YOUR_CALM) and is closed. The HTTP/2 rapid reset (CVE-2023-44487, issue 27): HEADERS
# then RST_STREAM in a loop goes past the 100 streams a connection may hold. hypercorn keeps each
# reset stream in its send queue until its sender catches up, and past 1,000 of them an
# exception ended the connection (no GOAWAY, a traceback in the log: 16 KB in 8 s), and each
# read of 64 KiB (~600 streams) was parsed in one go: the event loop, which serves the gRPC
# port too, stalled, and another client's gRPC call took up to 2.6 s (median 1.6 ms). Reads
# are now parsed H2_SLICE_BYTES at a time, yielding between slices: over 8 s of rapid resets
# from one process that call's p99 is 55-110 ms, as under a plain flood of requests (67 ms).
RESET_BURST = 200
RESET_PER_SECOND = 100.0
H2_SLICE_BYTES = 16 * 1024
# How long past hypercorn's graceful timeout a stop waits for it before cancelling it.
STOP_MARGIN_S = 1.0


class ResetBudget:
    """How many more streams a connection's client may reset now (a token bucket)."""

    def __init__(self, burst: float = RESET_BURST, per_second: float = RESET_PER_SECOND) -> None:
        self.burst = burst
        self.per_second = per_second
        self._tokens = burst
        self._last = time.monotonic()

    def take(self) -> bool:
        """One reset: True if the budget allows it."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_second)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def _install_reset_budget() -> None:
    """Make hypercorn's HTTP/2 connections parse in slices and keep a ResetBudget: its
    ProtocolWrapper makes each from the name `hypercorn.protocol.H2Protocol`, and hypercorn
    has no option for either."""
    import h2.errors
    import h2.events
    import hypercorn.protocol
    from hypercorn.events import Closed, Event, RawData
    from hypercorn.protocol.h2 import H2Protocol

    if getattr(hypercorn.protocol, "H2Protocol", None) is not H2Protocol:
        return  # installed already

    class ResetBudgetH2Protocol(H2Protocol):
        _budget: ResetBudget | None = None
        _refused = False

        async def handle(self, event: Event) -> None:
            if not isinstance(event, RawData) or len(event.data) <= H2_SLICE_BYTES:
                await super().handle(event)
                return
            for start in range(0, len(event.data), H2_SLICE_BYTES):
                if self._refused:
                    return
                await super().handle(RawData(data=event.data[start : start + H2_SLICE_BYTES]))
                await asyncio.sleep(0)  # the other connections, and the gRPC port, in between

        async def _handle_events(self, events: list[h2.events.Event]) -> None:
            if self._budget is None:
                self._budget = ResetBudget()
            for event in events:
                if isinstance(event, h2.events.StreamReset) and event.remote_reset and not self._budget.take():
                    self.connection.close_connection(
                        error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, additional_data=b"too many streams reset"
                    )
                    await self._flush()
                    self._refused = True
                    await self.send(Closed())
                    return
            await super()._handle_events(events)

    hypercorn.protocol.H2Protocol = ResetBudgetH2Protocol  # type: ignore[attr-defined]


class UvicornServer:
    """HTTP/1.1: Connect, gRPC-Web, plain JSON. The fastest for Connect over h1 here."""

    def __init__(self, app: ASGIApp, address: str, grace_seconds: float, tls: Tls | None, limits: HttpLimits) -> None:
        import uvicorn

        host, port = split_address(address)
        self._socket: CappedListener = listen(host, port, limits.caps())
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="off",
            # Its lines go to the root logger's handlers (rate-limited there), not its own.
            log_config=None,
            log_level="warning",
            access_log=False,
            http=_header_timeout_protocol(limits.header_timeout_s),
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            timeout_keep_alive=max(1, round(limits.idle_timeout_s)),
            timeout_graceful_shutdown=max(1, int(grace_seconds)),
            ssl_certfile=str(tls.cert) if tls else None,
            ssl_keyfile=str(tls.key) if tls else None,
            ssl_ca_certs=str(tls.client_ca) if tls and tls.client_ca else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls and tls.client_ca else ssl.CERT_NONE,
        )

        class _Server(uvicorn.Server):
            # The process owns SIGTERM/SIGINT; uvicorn must not take them over.
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                error = self._task.exception() if not self._task.cancelled() else None
                raise OSError(f"the HTTP listener did not start: {error!r}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task
        self._socket.close()


class HypercornServer:
    """HTTP/1.1 and h2c: Connect, gRPC-Web, plain JSON, and gRPC over h2c too."""

    def __init__(self, app: ASGIApp, address: str, grace_seconds: float, tls: Tls | None, limits: HttpLimits) -> None:
        from hypercorn.config import Config

        _install_reset_budget()
        host, port = split_address(address)
        self._socket: CappedListener = listen(host, port, limits.caps())
        self._config = Config()
        if tls is not None:
            self._config.certfile = str(tls.cert)
            self._config.keyfile = str(tls.key)
            if tls.client_ca is not None:
                self._config.ca_certs = str(tls.client_ca)
                self._config.verify_mode = ssl.CERT_REQUIRED
        self._config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        self._config.graceful_timeout = grace_seconds
        # Its default (1000) sends GOAWAY after 1000 requests on a connection.
        self._config.keep_alive_max_requests = 2**31
        self._config.accesslog = None
        # Its lines go to the root logger's handlers (rate-limited there), not its own.
        self._config.errorlog = logging.getLogger("hypercorn.error")
        # Hypercorn's one idle timer runs from a connection's start (and each response's
        # end) until a request's headers are complete: it is also the header timeout.
        self._config.keep_alive_timeout = min(limits.idle_timeout_s, limits.header_timeout_s)
        self._config.h11_max_incomplete_size = MAX_HEAD_BYTES
        self._config.ssl_handshake_timeout = limits.header_timeout_s
        self._app = app
        self._host, self._port = host, port
        self._shutdown = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        from hypercorn.asyncio.run import worker_serve
        from hypercorn.config import Sockets
        from hypercorn.utils import wrap_app

        # worker_serve is what hypercorn.asyncio.serve calls; it takes ready sockets.
        ours: list[socket.socket] = [self._socket]
        sockets = Sockets(ours if self._config.ssl_enabled else [], [] if self._config.ssl_enabled else ours, [])
        self._task = asyncio.create_task(
            worker_serve(
                wrap_app(self._app, self._config.wsgi_max_body_size, "asgi"),  # type: ignore[arg-type]
                self._config,
                sockets=sockets,
                shutdown_trigger=self._shutdown.wait,
            )
        )
        for _ in range(500):
            if self._task.done():
                raise OSError(f"the HTTP listener did not start: {self._task.exception()!r}")
            try:
                _, writer = await asyncio.open_connection(self._host, self._port)
            except OSError:
                await asyncio.sleep(0.01)
                continue
            writer.close()
            return
        raise OSError("the HTTP listener did not start within 5 s")

    async def stop(self) -> None:
        self._shutdown.set()
        if self._task is not None:
            # hypercorn cancels the streams still open after its graceful timeout, but a Connect
            # stream's handler then sends its end of stream (connectrpc does, once cancelled),
            # and waits for hypercorn's send buffer to drain, which it no longer does: a client
            # with streams past its connection's 100 held the shutdown for good (issue 27). A
            # second cancellation ends such a wait.
            for _ in range(2):
                done, _ = await asyncio.wait({self._task}, timeout=self._config.graceful_timeout + STOP_MARGIN_S)
                if done:
                    break
                self._task.cancel()
            with contextlib.suppress(BaseException):
                if self._task.done():
                    self._task.result()
        self._socket.close()


SERVERS: dict[str, type[UvicornServer] | type[HypercornServer]] = {
    "uvicorn": UvicornServer,
    "hypercorn": HypercornServer,
}
