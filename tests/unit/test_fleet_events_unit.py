"""ListEvents and WatchEvents in process (api/events.py) on a real SQLite store and hub: the
bounds a server test would need thousands of events to reach (a list's rows per call, a
watch's queue), and the orders of a commit, a watch's reads and the hub's feed that a
server test cannot choose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.api import events as events_api
from kibo_ctrl.api.events import EventsApi
from kibo_ctrl.api.fairness import TenantStreams
from kibo_ctrl.domain.access import Caller, Role
from kibo_ctrl.domain.errors import NotFound, Unavailable
from kibo_ctrl.domain.model import Event, EventType
from kibo_ctrl.engine import hub as hub_module
from kibo_ctrl.engine.hub import Hub
from kibo_ctrl.store.base import Tx
from kibo_ctrl.store.sqlite import SqliteStore

from tests.unit.engine_harness import Engine

A = Caller("tenant-a", Role.ADMIN)
B = Caller("tenant-b", Role.ADMIN)


@dataclass
class World:
    store: SqliteStore
    hub: Hub
    api: EventsApi
    scans: list[int]  # the rows of each store scan


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    store = await SqliteStore.open(tmp_path / "kibo.db")
    hub = Hub()
    store.subscribe(hub.publish)
    scans: list[int] = []
    scan = store.scan

    async def counted(fn: Any, query: Any, max_rows: int, want: int) -> Any:
        scans.append(max_rows)
        return await scan(fn, query, max_rows, want)

    store.scan = counted  # type: ignore[method-assign]
    try:
        yield World(store, hub, EventsApi(store, hub, TenantStreams(8, "watches", "watch_streams")), scans)
    finally:
        await store.close()


def _add(tx: Tx, tenant: str, workspace_id: str, types: list[EventType]) -> None:
    for kind in types:
        tx.add_event(Event(workspace_id=workspace_id, time=tx.now, type=kind, tenant=tenant))


async def add(world: World, tenant: str, workspace_id: str, *types: EventType) -> None:
    """One commit of these events."""
    await world.store.transact(_add, tenant, workspace_id, list(types))


PHASE = EventType.INSTANCE_PHASE


async def next_of(watch: AsyncIterator[obs.WatchEventsResponse]) -> obs.WatchEventsResponse:
    """The watch's next message, or a failure after 5 s (one that never comes)."""
    return await asyncio.wait_for(anext(watch), 5)


async def test_another_tenants_workspace_is_not_found_as_a_missing_one_and_nothing_of_it_is_read(
    world: World,
) -> None:
    engine = Engine(world.store)
    created, _ = await engine.command("CreateWorkspace", _create("a-1"), tenant=A.tenant)
    await add(world, A.tenant, created.id, *[PHASE] * 30)
    answers = []
    for named in (created.id, "ws-" + "0" * (len(created.id) - 3)):
        with pytest.raises(NotFound) as refused:
            await world.api.list_events(obs.ListEventsRequest(workspace_id=named), B)
        answers.append(refused.value.message.replace(named, "ID"))
    assert answers[0] == answers[1]
    assert world.scans == []
    listed = await world.api.list_events(obs.ListEventsRequest(workspace_id=created.id), A)
    assert len(listed.events) >= 30 and world.scans


def _create(command_id: str) -> ws.CreateWorkspaceRequest:
    message = ws.CreateWorkspaceRequest()
    message.metadata.command_id = command_id
    return message


async def test_a_sparse_filter_reads_a_bounded_number_of_rows_a_call(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 40 of a tenant's events, one of the wanted type last: each call reads at most
    LIST_ROWS rows and ends short with a token; the calls together find the one event."""
    monkeypatch.setattr(events_api, "SLICE_ROWS", 4)
    monkeypatch.setattr(events_api, "LIST_ROWS", 12)
    await add(world, A.tenant, "ws-a", *[PHASE] * 39, EventType.GUEST_OOM_KILL)
    request = obs.ListEventsRequest(types=[obs.EVENT_TYPE_GUEST_OOM_KILL])
    found: list[obs.WorkspaceEvent] = []
    calls = 0
    while True:
        world.scans.clear()
        page = await world.api.list_events(request, A)
        calls += 1
        assert sum(world.scans) <= 12, world.scans
        found.extend(page.events)
        if not page.next_page_token:
            break
        assert not page.events  # short: nothing matched in its rows
        request = obs.ListEventsRequest(types=[obs.EVENT_TYPE_GUEST_OOM_KILL], page_token=page.next_page_token)
    assert [e.type for e in found] == [obs.EVENT_TYPE_GUEST_OOM_KILL]
    assert calls == 4  # 40 rows, 12 a call


async def test_a_commit_both_read_and_fed_to_a_watch_is_sent_once(world: World) -> None:
    """A commit after the watch subscribed and before its first read is in both the store
    read and the hub's feed: it is sent once, and the next commit after it."""
    watch = world.api.watch_events(obs.WatchEventsRequest(), A)
    header = await anext(watch)
    assert not header.HasField("event")
    await add(world, A.tenant, "ws-a", PHASE, PHASE, PHASE)  # published to the feed, and stored
    got = [await next_of(watch) for _ in range(3)]
    await add(world, A.tenant, "ws-a", EventType.STATE_CHANGED)
    got.append(await next_of(watch))
    await watch.aclose()
    sequences = [m.event.sequence for m in got]
    assert sequences == list(range(header.resume_after_sequence + 1, header.resume_after_sequence + 5))
    assert got[-1].event.type == obs.EVENT_TYPE_STATE_CHANGED


async def test_a_watch_that_falls_behind_the_feed_reads_on_from_the_store(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its queue holds 2 commits: 10 commits while it is not reading overflow it, and it
    reads the rest from the store, after the last event it sent: every one, in order."""
    monkeypatch.setattr(hub_module, "WATCH_QUEUE", 2)
    watch = world.api.watch_events(obs.WatchEventsRequest(), A)
    start = (await anext(watch)).resume_after_sequence
    await add(world, A.tenant, "ws-a", PHASE)
    sequences = [(await anext(watch)).event.sequence]  # now following the feed
    for _ in range(10):
        await add(world, A.tenant, "ws-a", PHASE)
        await add(world, B.tenant, "ws-b", PHASE)  # another tenant's: never sent
    sequences += [(await next_of(watch)).event.sequence for _ in range(10)]
    await watch.aclose()
    # A's events are every other one after the first (B's between them).
    assert sequences == [start + 1, *range(start + 2, start + 21, 2)], sequences


async def test_a_watch_open_at_the_shutdown_or_started_after_it_ends_at_once(world: World) -> None:
    """UNAVAILABLE (watch again), so a watch never holds the server's stop."""
    open_one = world.api.watch_events(obs.WatchEventsRequest(), A)
    await next_of(open_one)
    world.hub.close()
    late = world.api.watch_events(obs.WatchEventsRequest(), B)
    await next_of(late)  # its first message: where it starts
    for watch in (open_one, late):
        with pytest.raises(Unavailable):
            await next_of(watch)
