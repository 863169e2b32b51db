"""The Clock port: where the engine and the store read the time.

The real clock by default (app.py); the deterministic simulation (simulate/) hands in a
virtual one, so expirations, node liveness and reset-counting windows follow simulated
time. Sleeps and timeouts go through the event loop's own clock, which the simulation
replaces too."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall time, seconds since the epoch: what records and expirations are stamped with."""
        ...

    def monotonic(self) -> float:
        """A clock that never goes back: for intervals (node liveness)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()
