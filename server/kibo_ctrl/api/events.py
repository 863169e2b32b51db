"""Fleet-wide events (issue 26 item 7): `ListEvents` and `WatchEvents` over every workspace
the caller may see, filtered by type, workspace, node and time.

Tenancy: a tenant's token sees its own tenant's events; an operator's token sees every
tenant's (`EventQuery.tenant` None). The store query and the hub's feed are both scoped by
tenant, so another tenant's event is never read for a tenant's call. A workspace filter
naming another tenant's workspace is NOT_FOUND exactly as one naming no workspace (as
ListWorkspaceEvents), after one point read and before any scan: neither the answer nor its
cost tells the two apart.

Order and resumption: an event's sequence is global, and the stores assign it in commit
order (SQLite has one writer; PostgreSQL's writers take one write lock per transaction,
store/postgres.py, and each replica publishes every commit in that order, postgres_feed.py).
So a reader that has every matching event up to sequence N from one replica asks any replica
for the events after N and misses none: the events at or below N were all committed before
N was. A watch first subscribes to the hub, then reads what is stored after its start, then
follows the hub's feed, skipping what it already sent; a watch that falls behind the feed
(its queue full) reads on from the store, after the last event it sent.

Bounds: at most MAX_TYPES types, IDs checked as everywhere else, page size 1 to 1000, a
list reads at most LIST_ROWS stored events a call (a sparse filter's page ends short, with a
token), in slices of SLICE_ROWS on the store's scan connection, a tenant's lists and a
watch's store reads at most LIST_SLOTS at once; each watch counts against the tenant's open
watches (api/fairness.py, shared with WatchWorkspace)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace

from kibo.ctrl.v1 import observation_service_pb2 as obs_pb2

from ..domain import nodes, validation
from ..domain.access import Caller, Role
from ..domain.errors import InvalidArgument, NotFound, Unavailable
from ..domain.model import Event, EventType
from ..engine.hub import Hub, Signal
from ..store.base import EventQuery, EventSlice, Reader, Store
from . import parse, render

# Page tokens as ListWorkspaces makes them (bound to the tenant and the query).
from .control_plane import MAX_SEQ, _decode_token, _digest, _encode_token
from .fairness import TenantSlots, TenantStreams

# One request's types: EventType has 15 (UNSPECIFIED is refused); room for a few more.
MAX_TYPES = 16
# Stored events one store read scans (whatever the filter), and one list call at most: past
# it the page ends short with a token (AIP-158 allows a short page).
SLICE_ROWS = 4096
LIST_ROWS = 200_000
# Event lists (and watch catch-ups) a tenant runs at once; the rest wait for one of its own.
LIST_SLOTS = 2
# Room in a response for what is not an event.
PAGE_BUDGET_BYTES = 3 * 1024 * 1024
_MAX_TIME = 253402300799  # 9999-12-31, the largest valid Timestamp
_EVENT_TYPES = frozenset(int(t) for t in EventType if t is not EventType.UNSPECIFIED)


def _time(message: object, field: str) -> float:
    seconds, nanos = int(getattr(message, "seconds")), int(getattr(message, "nanos"))  # noqa: B009
    if not 0 <= seconds <= _MAX_TIME or not 0 <= nanos < 1_000_000_000:
        raise InvalidArgument(f"{field} is not a valid timestamp", field=field)
    return float(seconds) + nanos / 1e9


def query_of(request: obs_pb2.ListEventsRequest | obs_pb2.WatchEventsRequest, caller: Caller) -> EventQuery:
    """The request's filters, checked (counts before values), for this caller's tenant or,
    for an operator, every tenant."""
    if len(request.types) > MAX_TYPES:
        raise InvalidArgument(f"at most {MAX_TYPES} types", field="types")
    types = set()
    for value in request.types:
        if value not in _EVENT_TYPES:
            raise InvalidArgument("types: each is an EventType other than EVENT_TYPE_UNSPECIFIED", field="types")
        types.add(EventType(value))
    workspace = parse.workspace_id(request.workspace_id) if request.workspace_id else ""
    node = nodes.node_id(request.node_id) if request.node_id else ""
    start = _time(request.start_time, "start_time") if request.HasField("start_time") else None
    end = _time(request.end_time, "end_time") if request.HasField("end_time") else None
    if start is not None and end is not None and end <= start:
        raise InvalidArgument("end_time must be after start_time", field="end_time")
    return EventQuery(
        tenant=None if caller.role is Role.OPERATOR else caller.tenant,
        workspace_id=workspace,
        node_id=node,
        types=frozenset(types),
        start_time=start,
        end_time=end,
    )


def _scope(query: EventQuery, caller: Caller) -> str:
    """What a page token is bound to: the caller's tenant and every filter."""
    kinds = ",".join(str(int(t)) for t in sorted(query.types))
    everyone = "*" if query.tenant is None else ""
    return _digest(
        f"{caller.tenant}|{everyone}|{query.workspace_id}|{query.node_id}|{kinds}|{query.start_time}|{query.end_time}"
    )


def _scan(reader: Reader, query: EventQuery, max_rows: int, want: int) -> EventSlice:
    return reader.scan_events(query, max_rows, want)


def _newest(reader: Reader) -> int:
    """The newest event's sequence, any tenant's (a scan of nothing reads it)."""
    return reader.scan_events(EventQuery(tenant=None, after_seq=MAX_SEQ), 1, 1).newest


def _message(event: Event) -> obs_pb2.WatchEventsResponse:
    return obs_pb2.WatchEventsResponse(event=render.event(event), resume_after_sequence=event.seq)


class EventsApi:
    """ListEvents and WatchEvents (kibo.ctrl.v1.WorkspaceObservationService)."""

    def __init__(self, store: Store, hub: Hub, watch_streams: TenantStreams) -> None:
        self._store = store
        self._hub = hub
        self._watch_streams = watch_streams
        self._slots = TenantSlots(LIST_SLOTS)

    async def _check_workspace(self, query: EventQuery) -> None:
        """The query's workspace, if it names one, exists for the caller: another tenant's is
        NOT_FOUND as a missing one is (nothing of it is scanned)."""
        if not query.workspace_id:
            return
        workspace_id = query.workspace_id
        workspace = await self._store.read(lambda r: r.get_workspace(workspace_id))
        if workspace is None or (query.tenant is not None and workspace.tenant != query.tenant):
            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")

    async def list_events(self, request: obs_pb2.ListEventsRequest, caller: Caller) -> obs_pb2.ListEventsResponse:
        query = query_of(request, caller)
        size = validation.page_size(request.page_size, 100)
        scope = _scope(query, caller)
        query = replace(query, after_seq=_decode_token(request.page_token, scope))
        await self._check_workspace(query)
        response = obs_pb2.ListEventsResponse()
        async with self._slots.slot(caller.tenant):
            found, resume, newest = await self._page(query, size)
        budget = PAGE_BUDGET_BYTES
        for event in found:
            message = render.event(event)
            budget -= message.ByteSize() + 8
            if response.events and budget < 0:
                # As large as a page may be: the rest comes on the next one.
                resume = response.events[-1].sequence
                break
            response.events.append(message)
        if resume:
            response.next_page_token = _encode_token(resume, scope)
        else:
            response.resume_after_sequence = newest
        return response

    async def _page(self, query: EventQuery, size: int) -> tuple[list[Event], int, int]:
        """Up to `size` matching events after `query.after_seq`; the sequence to resume after
        (0: none is left), and the newest event when the last read ran to the end."""
        found: list[Event] = []
        after, scanned = query.after_seq, 0
        # Slices start at what the page needs (a dense match is one read) and double up.
        rows = min(SLICE_ROWS, size + 1)
        while True:
            part = await self._store.scan(_scan, replace(query, after_seq=after), rows, size + 1 - len(found))
            found.extend(part.events)
            scanned += rows
            if len(found) > size:
                return found[:size], found[size - 1].seq, 0
            if part.exhausted:
                return found, 0, part.newest
            after = part.last_seq
            if scanned >= LIST_ROWS:
                return found, after, 0
            rows = min(SLICE_ROWS, rows * 2)

    async def watch_events(
        self, request: obs_pb2.WatchEventsRequest, caller: Caller
    ) -> AsyncGenerator[obs_pb2.WatchEventsResponse, None]:
        query = query_of(request, caller)
        if not 0 <= request.after_sequence <= MAX_SEQ:
            raise InvalidArgument("after_sequence must be 0 or a sequence", field="after_sequence")
        # Counted before anything is looked up; subscribed before anything is read: a commit
        # after the reads below is in the feed, one before them in the reads (or both).
        with self._watch_streams.hold(caller.tenant), self._hub.watch_events(query.tenant) as feed:
            await self._check_workspace(query)
            covered = request.after_sequence or await self._store.read(_newest)
            yield obs_pb2.WatchEventsResponse(resume_after_sequence=covered)
            while True:
                # What is stored after `covered`: at the start, and after falling behind.
                while True:
                    async with self._slots.slot(caller.tenant):
                        part = await self._store.scan(_scan, replace(query, after_seq=covered), SLICE_ROWS, SLICE_ROWS)
                    for event in part.events:
                        yield _message(event)
                    # Run to the end: every event of the range up to the snapshot's newest was read.
                    covered = max(covered, part.newest if part.exhausted else part.last_seq)
                    if part.exhausted:
                        break
                # Then each commit's events, in sequence order, as the hub publishes them.
                while True:
                    batch = await feed.get()
                    if batch is Signal.CLOSED:
                        raise Unavailable("the server is shutting down: watch again")
                    if batch is Signal.RESYNC:
                        break
                    for event in batch:
                        if event.seq <= covered:
                            continue  # read from the store already
                        covered = event.seq
                        if query.matches(event):
                            yield _message(event)
