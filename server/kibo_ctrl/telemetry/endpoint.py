"""`GET /metrics` on the HTTP listener: the Prometheus text exposition.

Access (`--metrics`): `operator` (the default) needs an operator token; `open` needs none
(for a listener only the scraper can reach); `off` serves no /metrics. The default is not
open because the HTTP port is treated as internet-facing and the metrics name every tenant
and the fleet's size and load; not any token, because a tenant's token must not see the
other tenants. The listener's guard (transport/http_guard.py) refuses a request without a
valid token before this runs, unless /metrics is among its open paths (`open`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from ..api.auth import Authenticator
from ..domain.errors import KiboError, Unauthenticated
from ..store.base import Store
from ..transport.connect import ASGIApp
from .metrics import Metrics

PATH = "/metrics"


class MetricsAccess(StrEnum):
    OPERATOR = "operator"
    OPEN = "open"
    OFF = "off"


def serve_metrics(app: ASGIApp, metrics: Metrics, store: Store, auth: Authenticator, access: MetricsAccess) -> ASGIApp:
    """`app`, with GET /metrics answered here (every other path goes to `app`)."""
    if access is MetricsAccess.OFF:
        return app

    async def route(
        scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH:
            await app(scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _plain(send, 405, b"GET /metrics\n")
            return
        if access is MetricsAccess.OPERATOR:
            try:
                caller = await auth.identify(_header(scope, b"authorization"))
                caller.require_operator("read /metrics")
            except KiboError as error:
                status = 401 if isinstance(error, Unauthenticated) else 403
                await _plain(send, status, error.message.encode() + b"\n")
                return
        counts, usage = await store.read(metrics.snapshot)
        body = metrics.render(counts, usage)
        headers = [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})

    return route


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _plain(send: Callable[[Any], Awaitable[None]], status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
