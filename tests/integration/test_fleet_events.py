"""Fleet-wide events (issue 26 item 7): ListEvents and WatchEvents on real servers.

Each filter narrows a list to exactly the events ListWorkspaceEvents shows that match it, and
pages join up; a tenant never sees another tenant's event (its workspace filter answers byte
for byte as a missing ID's), an operator sees every tenant's; bad filters are INVALID_ARGUMENT;
a watch counts against the tenant's open watches and in kibo_watch_streams_open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, answer_of, error_of, missing_like, rejected
from tests.integration.test_auth import make_token
from tests.integration.test_metrics import scrape, value
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]
INVALID = grpc.StatusCode.INVALID_ARGUMENT
E = obs.EventType


async def listed(client: Client, page_size: int = 1000, **filters: Any) -> list[obs.WorkspaceEvent]:
    """Every page of ListEvents."""
    events: list[obs.WorkspaceEvent] = []
    token = ""
    while True:
        page = await client.obs.ListEvents(obs.ListEventsRequest(page_size=page_size, page_token=token, **filters))
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            assert page.resume_after_sequence >= max((e.sequence for e in events), default=0)
            return events


async def _first(call: Any) -> Any:
    """A unary call's answer, or a stream's first message."""
    return await (call.read() if hasattr(call, "read") else call)


def seqs(events: list[obs.WorkspaceEvent]) -> list[int]:
    return [e.sequence for e in events]


def stamp(seconds: float) -> Timestamp:
    result = Timestamp()
    result.FromNanoseconds(int(seconds * 1e9))
    return result


def seconds(event: obs.WorkspaceEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


async def test_each_filter_narrows_to_the_matching_events_and_pages_join(client: Client) -> None:
    """Over both transports and both stores (the `client` cases)."""
    first = (await client.create()).workspace_id
    second = (await client.create()).workspace_id
    await client.stop(first)
    await client.start(first)
    await client.wait_steady(first)
    mine = await client.events(first)
    everything = await listed(client, workspace_id=first)
    # The workspace filter: what ListWorkspaceEvents shows (now with its workspace and node).
    assert seqs(everything) == seqs(mine) and len(mine) >= 8, (seqs(everything), seqs(mine))
    assert {e.workspace_id for e in everything} == {first}
    assert seqs(await listed(client, workspace_id=second)) == seqs(await client.events(second))
    assert all(e.type == m.type and e.message == m.message for e, m in zip(everything, mine, strict=True))
    # Types.
    kinds = [E.EVENT_TYPE_STATE_CHANGED, E.EVENT_TYPE_SCHEDULED]
    assert seqs(await listed(client, workspace_id=first, types=kinds)) == seqs(
        [e for e in everything if e.type in kinds]
    )
    # The node: the one it was scheduled on; its events there, and the other workspace's.
    node = next(e.node_id for e in everything if e.type == E.EVENT_TYPE_SCHEDULED)
    assert node
    on_node = [e for e in everything if e.node_id == node]
    assert 0 < len(on_node) < len(everything)  # its accepted create came before any node
    assert seqs(await listed(client, workspace_id=first, node_id=node)) == seqs(on_node)
    fleet = await listed(client, node_id=node, types=[E.EVENT_TYPE_SCHEDULED])
    assert {first, second} <= {e.workspace_id for e in fleet}
    assert all(e.node_id == node and e.type == E.EVENT_TYPE_SCHEDULED for e in fleet)
    # Time: start inclusive, end exclusive; bounds between two events' times.
    times = sorted({seconds(e) for e in everything})
    assert len(times) >= 4, times
    low, high = (times[0] + times[1]) / 2, (times[-2] + times[-1]) / 2
    window = await listed(client, workspace_id=first, start_time=stamp(low), end_time=stamp(high))
    assert seqs(window) == seqs([e for e in everything if low <= seconds(e) < high])
    assert 0 < len(window) < len(everything)
    # Pages of 3 join up to the whole list, each but the last full, with a token.
    pages: list[obs.WorkspaceEvent] = []
    token = ""
    while True:
        page = await client.obs.ListEvents(obs.ListEventsRequest(workspace_id=first, page_size=3, page_token=token))
        pages.extend(page.events)
        token = page.next_page_token
        if not token:
            break
        assert len(page.events) == 3 and not page.resume_after_sequence
    assert seqs(pages) == seqs(everything)
    assert page.resume_after_sequence >= everything[-1].sequence


# -- tenants ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tenants(server_factory: Factory) -> tuple[ServerProcess, str, str, str]:
    """A server with tokens on and at most 2 open watches per tenant, its metrics open; admin
    tokens of tenants A and B, and an operator's."""
    server = server_factory("--max-watches-per-tenant", "2", "--metrics", "open", auth=True)
    return (
        server,
        make_token(server, "events-a"),
        make_token(server, "events-b"),
        make_token(server, "events-ops", "operator"),
    )


@contextlib.asynccontextmanager
async def clients(server: ServerProcess, *tokens: str) -> AsyncIterator[list[Client]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Client.connect(server.address, token)) for token in tokens]


async def collect(call: Any, into: list[obs.WorkspaceEvent]) -> None:
    async for message in call:
        if message.HasField("event"):
            into.append(message.event)


async def settled(seen: list[obs.WorkspaceEvent], want: set[int], within: float = 10) -> None:
    """Until `seen` holds every sequence of `want`."""
    for _ in range(int(within / 0.02)):
        if want <= set(seqs(seen)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"missing {sorted(want - set(seqs(seen)))}")


async def test_a_tenant_sees_only_its_own_events_and_an_operator_sees_every_tenants(
    tenants: tuple[ServerProcess, str, str, str],
) -> None:
    server, a_token, b_token, ops_token = tenants
    async with clients(server, a_token, b_token, ops_token) as (a, b, ops):
        # Watches first, from now on: B's and the operator's.
        b_call = b.obs.WatchEvents(obs.WatchEventsRequest())
        ops_call = ops.obs.WatchEvents(obs.WatchEventsRequest())
        b_start, ops_start = (await b_call.read()).resume_after_sequence, (await ops_call.read()).resume_after_sequence
        b_seen: list[obs.WorkspaceEvent] = []
        ops_seen: list[obs.WorkspaceEvent] = []
        tasks = [asyncio.create_task(collect(b_call, b_seen)), asyncio.create_task(collect(ops_call, ops_seen))]
        try:
            theirs = (await a.create()).workspace_id
            await a.stop(theirs)
            mine = (await b.create()).workspace_id
            a_events, b_events = await listed(a), await listed(b)
            a_ids, b_ids = {e.workspace_id for e in a_events}, {e.workspace_id for e in b_events}
            assert theirs in a_ids and mine in b_ids and not a_ids & b_ids
            # The operator lists both tenants' events, each as its tenant lists it.
            everyone = await listed(ops)
            assert set(seqs(a_events)) | set(seqs(b_events)) <= set(seqs(everyone))
            # The watches: B's sees B's events only, the operator's both tenants'.
            await settled(ops_seen, {s for s in seqs(a_events) + seqs(b_events) if s > ops_start})
            await settled(b_seen, {s for s in seqs(b_events) if s > b_start})
            assert {e.workspace_id for e in b_seen} == {mine}
            assert {theirs, mine} <= {e.workspace_id for e in ops_seen}
            assert seqs(ops_seen) == sorted(set(seqs(ops_seen))) and seqs(b_seen) == sorted(set(seqs(b_seen)))
            # B naming A's workspace: NOT_FOUND, the same bytes as naming one that does not exist.
            nobodys = missing_like(theirs)
            for rpc, request in (("ListEvents", obs.ListEventsRequest), ("WatchEvents", obs.WatchEventsRequest)):
                call = getattr(b.obs, rpc)
                foreign = await answer_of(_first(call(request(workspace_id=theirs))))
                missing = await answer_of(_first(call(request(workspace_id=nobodys))))
                assert foreign.code == grpc.StatusCode.NOT_FOUND, foreign
                assert foreign.naming(theirs, nobodys) == missing
            assert await listed(ops, workspace_id=theirs) == [e for e in a_events if e.workspace_id == theirs]
            # A page token is the query's and the tenant's that made it.
            page = await a.obs.ListEvents(obs.ListEventsRequest(page_size=1))
            assert page.next_page_token
            for caller, request in (
                (b, obs.ListEventsRequest(page_size=1, page_token=page.next_page_token)),
                (a, obs.ListEventsRequest(page_size=1, page_token=page.next_page_token, node_id="node-1")),
            ):
                error = await rejected(caller.obs.ListEvents(request))
                assert (error.code, error.detail.field) == (INVALID, "page_token")
        finally:
            b_call.cancel()
            ops_call.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_watches_count_against_the_tenants_cap_and_in_the_gauge(
    tenants: tuple[ServerProcess, str, str, str],
) -> None:
    """With --max-watches-per-tenant 2: a WatchWorkspace and a WatchEvents are the cap, the
    next WatchEvents is RESOURCE_EXHAUSTED; another tenant still watches; a cancelled watch
    gives its place back; kibo_watch_streams_open counts WatchEvents."""
    server, a_token, b_token, _ = tenants
    async with clients(server, a_token, b_token) as (a, b):
        workspace = (await a.create()).workspace_id
        baseline = value(await scrape(server), "kibo_watch_streams_open")
        held = [
            a.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace)),
            a.obs.WatchEvents(obs.WatchEventsRequest()),
        ]
        try:
            for call in held:
                await call.read()
            assert value(await scrape(server), "kibo_watch_streams_open") == baseline + 2
            refused = a.obs.WatchEvents(obs.WatchEventsRequest(workspace_id=workspace))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await refused.read()
            info = error_of(caught.value)
            assert (info.code, info.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED")
            assert "WatchEvents and WatchWorkspace streams open" in (caught.value.details() or "")
            other = b.obs.WatchEvents(obs.WatchEventsRequest())
            await other.read()
            other.cancel()
            held.pop().cancel()
            for _ in range(250):
                again = a.obs.WatchEvents(obs.WatchEventsRequest())
                try:
                    await again.read()
                    again.cancel()
                    break
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.02)
            else:
                raise AssertionError("the cancelled watch's place never came back")
        finally:
            for call in held:
                call.cancel()


# -- bad input -------------------------------------------------------------------------------


async def test_bad_filters_are_invalid_argument_naming_the_field(tenants: tuple[ServerProcess, str, str, str]) -> None:
    server, a_token, _, _ = tenants
    later, earlier = stamp(2_000_000_000), stamp(1_000_000_000)
    bad = [
        ("types", {"types": [E.EVENT_TYPE_STATE_CHANGED] * 17}),
        ("types", {"types": [99]}),
        ("types", {"types": [E.EVENT_TYPE_UNSPECIFIED]}),
        ("workspace_id", {"workspace_id": "x" * 4096}),
        ("workspace_id", {"workspace_id": "vol-abc"}),
        ("node_id", {"node_id": "Node_1!"}),
        ("node_id", {"node_id": "n" * 5000}),
        ("start_time", {"start_time": Timestamp(seconds=-1)}),
        ("end_time", {"start_time": later, "end_time": earlier}),
    ]
    async with clients(server, a_token) as (a,):
        for field, filters in bad:
            listing = await rejected(a.obs.ListEvents(obs.ListEventsRequest(**filters)))
            watching = await rejected(a.obs.WatchEvents(obs.WatchEventsRequest(**filters)).read())
            for error in (listing, watching):
                assert (error.code, error.detail.field) == (INVALID, field), (field, error)
        for size in (1001, 1 << 30, -1):
            error = await rejected(a.obs.ListEvents(obs.ListEventsRequest(page_size=size)))
            assert (error.code, error.detail.field) == (INVALID, "page_size")
        error = await rejected(a.obs.WatchEvents(obs.WatchEventsRequest(after_sequence=-5)).read())
        assert (error.code, error.detail.field) == (INVALID, "after_sequence")
        # Every type at once is 15, within the bound.
        every = [t for t in E.values() if t != E.EVENT_TYPE_UNSPECIFIED]
        assert await a.obs.ListEvents(obs.ListEventsRequest(types=every)) is not None
