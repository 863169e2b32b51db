"""Rate-limited logging: a flood of one message cannot fill the disk.

A hostile client can make a library log once per connection or once per failed accept
(154 MB in 40 s of `Too many open files` was measured, issue 10 finding 9). This filter
lets through at most `burst` lines of one kind (logger, level, first line of the message
template) per `period` seconds, and the first line after a quiet period says how many
were dropped."""

from __future__ import annotations

import logging
import time

# Kinds of message remembered; past this the table starts over (messages built with
# f-strings would otherwise grow it without bound).
MAX_KINDS = 1000
# Loggers never limited: the workspace event log (telemetry/events.py) is an audit trail
# of what authenticated callers did, bounded by their rate limit, not a library's flood.
EXEMPT = frozenset({"kibo.events"})


class RateLimitFilter(logging.Filter):
    def __init__(self, burst: int = 10, period: float = 10.0) -> None:
        super().__init__()
        self.burst = burst
        self.period = period
        # kind -> (window start, lines let through in it, lines dropped in it)
        self._windows: dict[tuple[str, int, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in EXEMPT:
            return True
        kind = (record.name, record.levelno, str(record.msg).split("\n", 1)[0][:200])
        now = time.monotonic()
        start, passed, dropped = self._windows.get(kind, (now, 0, 0))
        if now - start >= self.period:
            if dropped:
                # No '%' in the suffix: the record is still formatted with its own args.
                record.msg = f"{record.msg} [{dropped} more like this were dropped in {now - start:.0f} s]"
            start, passed, dropped = now, 0, 0
        if passed < self.burst:
            passed += 1
            allowed = True
        else:
            dropped += 1
            allowed = False
        if len(self._windows) >= MAX_KINDS and kind not in self._windows:
            self._windows.clear()
        self._windows[kind] = (start, passed, dropped)
        return allowed


def install(burst: int = 10, period: float = 10.0) -> None:
    """Rate-limit every line that reaches the root logger's handlers."""
    limit = RateLimitFilter(burst, period)
    for handler in logging.getLogger().handlers:
        handler.addFilter(limit)
