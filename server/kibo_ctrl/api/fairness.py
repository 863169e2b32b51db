"""Per-tenant fairness for expensive reads: how many each tenant may run at once.

A list scans stored rows; a tenant that sends many at once would otherwise fill the store's
scan thread and every other tenant's lists would wait behind them. Each tenant gets a few
slots; its further lists wait for one of its own slots, never for another tenant's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


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
