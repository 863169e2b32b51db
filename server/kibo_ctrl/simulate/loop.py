"""An asyncio event loop on virtual time: when nothing is ready to run, time jumps to the
next timer instead of waiting for it. asyncio.sleep, wait_for and call_later all follow it,
so a simulated hour takes as long as the work done in it.

Idle time still costs: the agents' lease renewals and the registry's expiry check tick every
0.75 virtual seconds, and a simulated hour holds ~19,000 of their wake-ups. A warp skips them
when they provably do nothing (see `Warp`): it moves the loop's clock and every periodic timer
by the same whole number of cycles (a cycle: the stretch in which the registry stores each
lease once), so the ticks keep their phase, and the clock the registry reads (`LaggingClock`)
does not see the skipped time, so every lease it compares is as fresh as it would have been.
Every other timer fires at the same virtual time as without the warp;
`tests/system/test_simulation.py` checks that histories are identical."""

from __future__ import annotations

import asyncio
import heapq
import math
import selectors
import threading
from collections.abc import Collection, Coroutine
from dataclasses import dataclass
from types import CodeType
from typing import Any

# The callback of asyncio.sleep's timer.
_SLEEP_DONE = asyncio.futures._set_result_unless_cancelled  # type: ignore[attr-defined]

# Where the virtual wall clock starts: a fixed date, so records do not depend on when the
# simulation ran (2026-01-01T00:00:00Z).
EPOCH = 1_767_225_600.0


class Deadlock(RuntimeError):
    """Nothing is ready, no timer is set and nothing can arrive: the simulation is stuck."""


@dataclass(frozen=True)
class Warp:
    """Which loops are periodic, and when skipping their ticks changes nothing.

    A tick of the periodic loops (lease renewals, the registry's expiry check) refreshes a
    node's lease in memory; the first renewal of each cycle (`cycle_s`, the registry's
    `persist_s`) also stores it, a write that wakes nothing (no placement changes) and whose
    value depends only on the cycle (NodeRegistry.stored_lease). Skipping whole cycles, in
    the registry's lagging time, therefore leaves its memory and the stored lease as they
    would have been relative to its clock. A tick that changes whether a node is silent
    writes as well, and that write matters. Everything else the engine does starts from a timer firing (nothing
    arrives from outside) and runs at that virtual instant. A reachable node marked silent
    (or whose mark failed) is marked reporting at its next beat; an unreachable one is marked
    silent once its silence timeout passed. So once `quiet_s` (more than a period: every node
    beat since) passed in which no other timer fired and no task was started, and `settle_s`
    (the silence timeout and more than a period) since a node's reachability last changed
    (`VirtualTimeLoop.unsettle`), the ticks change nothing until some other timer fires: the
    loop jumps by the whole number of periods that ends before the next such timer."""

    periodic: frozenset[CodeType]  # the code of each periodic loop's coroutine
    period_s: float
    quiet_s: float
    settle_s: float
    # A warp skips a whole number of these (a multiple of the period).
    cycle_s: float = 0.0


class _VirtualSelector(selectors.BaseSelector):
    """Polls the real selector without blocking when something besides the loop's own
    self-pipe is registered (nothing is, in a simulation: nothing arrives from outside); a
    wait becomes a jump of the virtual clock to the next timer."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._inner = selectors.DefaultSelector()
        self._loop = loop
        self._registered = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._inner.register(fileobj, events, data)
        self._registered += 1
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._inner.unregister(fileobj)
        self._registered -= 1
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._registered > 1:
            ready = self._inner.select(0)
            if ready:
                return ready
        if timeout == 0:
            return []
        if timeout is None:
            raise Deadlock("no task can run and no timer is set")
        self._loop.idle(timeout)
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        # Virtual seconds skipped by warps (the liveness clock lags by this much).
        self.warped = 0.0
        self.warps = 0
        self._warp: Warp | None = None
        self._last_activity = 0.0
        self._unsettled = 0.0
        self._periodic_tasks: set[asyncio.Task[Any]] = set()
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def enable_warp(self, warp: Warp | None) -> None:
        self._warp = warp

    def unsettle(self) -> None:
        """A node's reachability changed: its silence may be decided within a timeout."""
        self._unsettled = self._virtual_now

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:  # type: ignore[override]
        # The store calls it on this thread (store/sqlite.py: its writer is a thread there):
        # no self-pipe write is needed to wake a loop that never waits.
        if threading.get_ident() == self._thread_id:  # type: ignore[attr-defined]
            return self.call_soon(callback, *args, context=context)
        return super().call_soon_threadsafe(callback, *args, context=context)

    def create_task(self, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:  # type: ignore[override]
        self._last_activity = self._virtual_now
        task = super().create_task(coro, **kwargs)
        if self._warp is not None and getattr(coro, "cr_code", None) in self._warp.periodic:
            self._periodic_tasks.add(task)
            task.add_done_callback(self._periodic_tasks.discard)
        return task

    def idle(self, timeout: float) -> None:
        """Nothing is ready: move to the next timer (exactly to its time), or warp."""
        heap: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        now = self._virtual_now
        warp = self._warp
        if (
            warp is not None
            and now - self._last_activity >= warp.quiet_s
            and now - self._unsettled >= warp.settle_s
            and self._try_warp(heap)
        ):
            return
        target = now + timeout
        if heap and now <= heap[0]._when <= target:  # type: ignore[attr-defined]
            target = heap[0]._when  # type: ignore[attr-defined]
        if warp is not None and self._due_other(heap, target + self._clock_resolution):  # type: ignore[attr-defined]
            self._last_activity = target
        self._virtual_now = target

    def _is_periodic(self, handle: asyncio.TimerHandle) -> bool:
        """Whether the timer is the sleep of a periodic loop: asyncio.sleep's timer resolves a
        future that the sleeping task awaits (the future's callback is the task's)."""
        if handle._callback is not _SLEEP_DONE:  # type: ignore[attr-defined]
            return False
        callbacks = handle._args[0]._callbacks
        return bool(callbacks) and getattr(callbacks[0][0], "__self__", None) in self._periodic_tasks

    def _due_other(self, heap: list[asyncio.TimerHandle], before: float) -> bool:
        """Whether a timer of a non-periodic loop fires before `before` (a walk of the heap's
        top, which holds the earliest timers)."""
        if not heap:
            return False
        if not self._is_periodic(heap[0]):
            return True
        todo = [1, 2]
        while todo:
            i = todo.pop()
            if i >= len(heap) or heap[i]._when >= before:  # type: ignore[attr-defined]
                continue
            if not heap[i].cancelled() and not self._is_periodic(heap[i]):
                return True
            todo.extend((2 * i + 1, 2 * i + 2))
        return False

    def _try_warp(self, heap: list[asyncio.TimerHandle]) -> bool:
        warp = self._warp
        assert warp is not None
        others = [h.when() for h in heap if not h.cancelled() and not self._is_periodic(h)]
        if not others:
            return False
        # Skip the ticks strictly before the next other timer, and keep their phase: the
        # ticks that follow fire at the times they would have fired at.
        periods = math.ceil((min(others) - self._virtual_now) / warp.period_s - 1e-9) - 1
        per_cycle = max(1, round(warp.cycle_s / warp.period_s))
        periods -= periods % per_cycle
        if periods < 1:
            return False
        skip = periods * warp.period_s
        for handle in heap:
            if self._is_periodic(handle):
                handle._when += skip  # type: ignore[attr-defined]
        heapq.heapify(heap)
        self._virtual_now += skip
        self.warped += skip
        self.warps += 1
        return True


def periodic_codes(loops: Collection[Any]) -> frozenset[CodeType]:
    """The code objects of the given coroutine functions (bound or not)."""
    return frozenset(getattr(f, "__func__", f).__code__ for f in loops)


class VirtualClock:
    """The Clock port (domain/clock.py) on the loop's virtual time."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self.loop = loop

    def now(self) -> float:
        return EPOCH + self.loop.time()

    def monotonic(self) -> float:
        return self.loop.time()


class LaggingClock(VirtualClock):
    """The clock of the node registry: it stops while the loop warps (as CLOCK_MONOTONIC stops
    while a machine sleeps), so a warp ages no lease. Its wall time lags as much: the
    registry compares leases it stores with it, and a restarted registry reads them."""

    def now(self) -> float:
        return EPOCH + self.loop.time() - self.loop.warped

    def monotonic(self) -> float:
        return self.loop.time() - self.loop.warped
