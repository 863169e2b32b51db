"""An asyncio event loop on virtual time: when nothing is ready to run, time jumps to the
next timer instead of waiting for it. asyncio.sleep, wait_for and call_later all follow it,
so a simulated hour takes as long as the work done in it."""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

# Where the virtual wall clock starts: a fixed date, so records do not depend on when the
# simulation ran (2026-01-01T00:00:00Z).
EPOCH = 1_767_225_600.0


class Deadlock(RuntimeError):
    """Nothing is ready, no timer is set and nothing can arrive: the simulation is stuck."""


class _VirtualSelector(selectors.BaseSelector):
    """Polls the real selector without blocking (the loop's self-pipe still works); a wait
    becomes a jump of the virtual clock by the time the loop would have slept."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._inner = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Deadlock("no task can run and no timer is set")
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += max(0.0, seconds)


class VirtualClock:
    """The Clock port (domain/clock.py) on the loop's virtual time."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return EPOCH + self._loop.time()

    def monotonic(self) -> float:
        return self._loop.time()
