"""The counters behind the stream caps of issue 27: open watches per tenant (api/fairness.py),
streams a client may reset on one HTTP/2 connection (transport/http.py), and watches that
start during a shutdown (engine/hub.py)."""

from __future__ import annotations

import pytest
from kibo_ctrl.api.fairness import TenantStreams
from kibo_ctrl.domain.errors import QuotaExceeded
from kibo_ctrl.engine.hub import Hub, Signal
from kibo_ctrl.transport.http import ResetBudget


def test_a_tenant_past_its_cap_is_refused_and_others_are_not() -> None:
    streams = TenantStreams(2, "WatchWorkspace streams", "watch_streams")
    with streams.hold("a"), streams.hold("a"):
        with pytest.raises(QuotaExceeded) as refused, streams.hold("a"):
            pass
        assert refused.value.quota == "watch_streams"
        assert (refused.value.limit, refused.value.used) == (2, 2)
        assert "2 WatchWorkspace streams open" in refused.value.message
        assert streams.open("a") == 2  # the refusal took nothing
        with streams.hold("b"), streams.hold("b"):
            assert streams.open("b") == 2
    assert streams.open("a") == streams.open("b") == 0


def test_a_stream_that_fails_gives_its_place_back() -> None:
    streams = TenantStreams(1, "WatchWorkspace streams", "watch_streams")
    for _ in range(3):
        with pytest.raises(RuntimeError), streams.hold("a"):
            raise RuntimeError("the handler failed")
    with streams.hold("a"):
        assert streams.open("a") == 1
    assert streams.open("a") == 0


def test_zero_is_no_cap() -> None:
    streams = TenantStreams(0, "WatchWorkspace streams", "watch_streams")
    holds = [streams.hold("a") for _ in range(1000)]
    for hold in holds:
        hold.__enter__()
    assert streams.open("a") == 1000
    for hold in holds:
        hold.__exit__(None, None, None)
    assert streams.open("a") == 0


def test_a_reset_budget_allows_a_burst_then_a_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("kibo_ctrl.transport.http.time.monotonic", lambda: now[0])
    budget = ResetBudget(burst=200, per_second=100)
    assert all(budget.take() for _ in range(200))
    assert not budget.take()
    now[0] += 0.5  # 50 more
    assert all(budget.take() for _ in range(50))
    assert not budget.take()
    now[0] += 60  # refilled to the burst, no more
    assert sum(budget.take() for _ in range(300)) == 200


async def test_a_watch_that_starts_after_the_hub_closed_ends_at_once() -> None:
    """A watch started during the shutdown (a client's queued stream) is told at once, like
    those open at the close, instead of waiting for a change that never comes."""
    hub = Hub()
    with hub.watch("ws-a") as before:
        hub.close()
        assert before.get_nowait() is Signal.CLOSED
        with hub.watch("ws-a") as after:
            assert after.get_nowait() is Signal.CLOSED
