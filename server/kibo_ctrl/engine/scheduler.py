"""The scheduler: the loop that runs placement (placement.py) when there may be work."""

from __future__ import annotations

import asyncio
import logging

from ..domain.errors import StoreError
from ..domain.model import Phase
from ..store.base import Changes, Store
from .hub import Wakeup
from .placement import Backlog, schedule_pending

__all__ = ["Backlog", "Scheduler", "schedule_pending"]

log = logging.getLogger(__name__)

# After a failed pass: the first pause, and the longest (how late placement may resume once
# the store takes writes again).
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 8.0


class Scheduler:
    """Runs a pass when there is new work, or when a node may take more (it joined, returned,
    grew or was uncordoned) while instances wait. A released reservation may make room too:
    then a read of the nodes' reservation sums comes first, and the pass only if a waiting
    size fits somewhere. Under load most releases free too little, and a pass reads every
    waiting instance, where the read is one row per node."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._wakeup = Wakeup()
        self._waiting = 0
        self._backlog = Backlog()
        # Since the current pass (or check) began, which its snapshot may not show: a pass is
        # due (new work, a node with more room), or a reservation may have been released.
        self._due = True
        self._released = False
        self._retry_s = RETRY_FIRST_S

    def room_on_nodes(self) -> None:
        """A node joined, returned, grew or was uncordoned: instances waiting may fit."""
        self._due = True
        if self._waiting:
            self._wakeup.set()

    def on_changes(self, changes: Changes) -> None:
        for instance in changes.instances.values():
            if instance.node_id is None:
                if instance.phase is Phase.PENDING:
                    self._due = True  # new work
                    self._wakeup.set()
            elif not instance.reserved:
                self._released = True
        if self._released and self._waiting:
            self._wakeup.set()

    async def run(self) -> None:
        self._wakeup.set()
        while True:
            await self._wakeup.wait()
            # A change published from here on may come after the snapshot read next: it sets
            # the flags again. One published before is in the snapshot.
            if not self._due:
                if not (self._released and self._waiting):
                    continue
                self._released = False
                try:
                    room = await self._store.read(self._backlog.room)
                except Exception as error:
                    await self._failed("reading the nodes' room", error)
                    continue
                if not room:
                    continue
            self._due = self._released = False
            try:
                self._waiting = await self._store.transact(schedule_pending, self._backlog)
            except Exception as error:
                await self._failed("a scheduling pass", error)
                continue
            self._retry_s = RETRY_FIRST_S
            if self._waiting and (self._due or self._released):
                self._wakeup.set()

    async def _failed(self, what: str, error: Exception) -> None:
        """Try the pass again after a pause that doubles while the store stays unavailable
        (a full disk may last minutes: a pass a second would each fail at its first write)."""
        if isinstance(error, StoreError) and error.unavailable is not None:
            log.warning("%s failed (%s); retrying in %g s", what, error.unavailable, self._retry_s)
        else:
            log.exception("%s failed; retrying in %g s", what, self._retry_s)
        self._due = True
        await asyncio.sleep(self._retry_s)
        self._retry_s = min(2 * self._retry_s, RETRY_MAX_S)
        self._wakeup.set()
