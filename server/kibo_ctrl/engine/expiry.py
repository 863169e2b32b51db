"""The expiry loop: sleeps until the next expiration, then stops or deletes as set."""

from __future__ import annotations

import logging

from ..domain.clock import SYSTEM_CLOCK, Clock
from ..store.base import Changes, Store
from .hub import Wakeup
from .service import Service

log = logging.getLogger(__name__)
BATCH = 100


class ExpiryLoop:
    def __init__(self, store: Store, service: Service, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._clock = clock
        self._service = service
        self._wakeup = Wakeup()

    def on_changes(self, changes: Changes) -> None:
        if any(w.expiration.expire_time is not None for w in changes.workspaces.values()):
            self._wakeup.set()

    async def run(self) -> None:
        while True:
            due = await self._store.read(lambda r: r.next_expirations(BATCH))
            now = self._clock.now()
            times = [(w.id, w.expiration.expire_time or 0.0, w.active_command) for w in due]
            later = [when for _, when, _ in times if when > now]
            for workspace_id, when, active in times:
                if when <= now and active is None:
                    try:
                        await self._store.transact(self._service.expire, workspace_id=workspace_id)
                    except Exception:
                        log.exception("expiring %s failed", workspace_id)
            timeout = min(later) - now if later else None
            await self._wakeup.wait(timeout)
