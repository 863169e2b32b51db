"""Runs the Connect ASGI app in this process's event loop (uvicorn or hypercorn)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterator
from typing import Any, Protocol

from ..tls import Tls
from .connect import ASGIApp

log = logging.getLogger(__name__)


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


class HttpServer(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class UvicornServer:
    """HTTP/1.1: Connect, gRPC-Web, plain JSON. The fastest for Connect over h1 here."""

    def __init__(self, app: ASGIApp, address: str, grace_seconds: float, tls: Tls | None = None) -> None:
        import uvicorn

        host, port = split_address(address)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="off",
            log_level="warning",
            access_log=False,
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
        self._task = asyncio.create_task(self._server.serve())
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


class HypercornServer:
    """HTTP/1.1 and h2c: Connect, gRPC-Web, plain JSON, and gRPC over h2c too."""

    def __init__(self, app: ASGIApp, address: str, grace_seconds: float, tls: Tls | None = None) -> None:
        from hypercorn.config import Config

        host, port = split_address(address)
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
        self._app = app
        self._host, self._port = host, port
        self._shutdown = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        from hypercorn.asyncio import serve

        self._task = asyncio.create_task(
            serve(self._app, self._config, shutdown_trigger=self._shutdown.wait, mode="asgi")  # type: ignore[arg-type]
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
            with contextlib.suppress(BaseException):
                await self._task


SERVERS: dict[str, type[UvicornServer] | type[HypercornServer]] = {
    "uvicorn": UvicornServer,
    "hypercorn": HypercornServer,
}
