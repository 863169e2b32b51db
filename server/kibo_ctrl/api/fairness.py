"""Per-tenant fairness: how many expensive reads and long-lived streams each tenant may hold.

A list scans stored rows; a tenant that sends many at once would otherwise fill the store's
scan thread and every other tenant's lists would wait behind them. Each tenant gets a few
slots; its further lists wait for one of its own slots, never for another tenant's.
A watch holds server memory for as long as it is open: each tenant may hold a bounded
number of them (`TenantStreams`), and past that a new one is refused, not queued."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from ..domain.errors import QuotaExceeded

# WatchWorkspace streams a tenant may hold open at once (kibo-ctrl serve
# --max-watches-per-tenant; 0: no cap): ~6 MiB of the server per tenant at ~25 KiB a stream.
# Far above what a client needs (the SDK holds one per command it waits on), and a quarter of
# the gRPC port's streams per connection (transport/grpc.py: 1,024), so a client that keeps all
# its calls on one channel is refused in words before its channel would queue its calls.
WATCHES_PER_TENANT = 256


class TenantSlots:
    """At most `per_tenant` holders at once for each tenant; waiters queue per tenant (FIFO)."""

    def __init__(self, per_tenant: int) -> None:
        if per_tenant < 1:
            raise ValueError("per_tenant must be at least 1")
        self._per_tenant = per_tenant
        # A tenant's semaphore and how many hold or wait for it; dropped at 0, so idle
        # tenants cost nothing.
        self._slots: dict[str, tuple[asyncio.Semaphore, int]] = {}

    def in_use(self, tenant: str) -> int:
        """Holders and waiters of `tenant` now."""
        entry = self._slots.get(tenant)
        return 0 if entry is None else entry[1]

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        semaphore, users = self._slots.get(tenant) or (asyncio.Semaphore(self._per_tenant), 0)
        self._slots[tenant] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._slots[tenant]
            if users == 1:
                del self._slots[tenant]
            else:
                self._slots[tenant] = (semaphore, users - 1)


class TenantStreams:
    """At most `per_tenant` streams open at once for each tenant (0: no cap); past it a new
    one is refused at once with RESOURCE_EXHAUSTED (QuotaExceeded), never queued: a stream is
    long-lived, so a queued one would hold its client waiting for another to end.

    Issue 27: 3,000 WatchWorkspace streams on one channel did not finish. Each open stream
    holds ~25 KiB of the server (measured: 1,000 streams +25 MiB, 6,000 +146 MiB RSS), so a
    tenant's streams are bounded, and a client learns at once, in words, that it hit the cap.
    A stream counts from `hold` until its handler ends, however it ends (the client
    cancelled or went away: both transports close the handler at once; an error)."""

    def __init__(self, per_tenant: int, what: str, quota: str) -> None:
        if per_tenant < 0:
            raise ValueError("per_tenant must be 0 (no cap) or more")
        self.per_tenant = per_tenant
        self._what = what  # what is counted, for the refusal's words: "WatchWorkspace streams"
        self._quota = quota  # and its name in the refusal's QuotaFailure: "watch_streams"
        self._open: dict[str, int] = {}  # tenants with none open are absent

    def open(self, tenant: str) -> int:
        """Streams of `tenant` open now."""
        return self._open.get(tenant, 0)

    @contextlib.contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        """One stream of `tenant`, for the block's duration; QuotaExceeded past the cap."""
        used = self._open.get(tenant, 0)
        if self.per_tenant and used >= self.per_tenant:
            raise QuotaExceeded(
                f"tenant {tenant} already has {used} {self._what} open, the most a tenant may have "
                f"({self.per_tenant}): end one before opening another",
                quota=self._quota,
                limit=self.per_tenant,
                used=used,
                requested=1,
            )
        self._open[tenant] = used + 1
        try:
            yield
        finally:
            left = self._open[tenant] - 1
            if left:
                self._open[tenant] = left
            else:
                del self._open[tenant]
