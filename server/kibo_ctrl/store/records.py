"""How domain records are stored, shared by every store adapter: each record is one msgspec
JSON document, plus the columns derived from it that queries filter on. Both stores write the
same bytes, so a record means the same thing whichever database holds it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from ..domain.model import Command, Event, Instance, Phase, Volume, Workspace
from ..domain.nodes import NodeRecord
from .base import EventQuery, EventSlice, ListedWorkspace

ENCODER = msgspec.json.Encoder()
WORKSPACE = msgspec.json.Decoder(Workspace)
COMMAND = msgspec.json.Decoder(Command)
INSTANCE = msgspec.json.Decoder(Instance)
EVENT = msgspec.json.Decoder(Event)
VOLUME = msgspec.json.Decoder(Volume)
NODE = msgspec.json.Decoder(NodeRecord)


class WorkspaceKey(msgspec.Struct):
    """The part of a stored workspace a list reads first (msgspec skips the rest unparsed)."""

    id: str
    version: int = 0


WORKSPACE_KEY = msgspec.json.Decoder(WorkspaceKey)


def listed_workspace(seq: int, data: bytes) -> ListedWorkspace:
    key = WORKSPACE_KEY.decode(data)
    return ListedWorkspace(seq, key.id, key.version, data, WORKSPACE.decode)


def instance_active(instance: Instance) -> bool:
    """A node still has to act on the instance, or still holds parts of it (node_instances)."""
    return instance.active


def instance_unscheduled(instance: Instance) -> bool:
    """Waiting for the scheduler to place it."""
    return instance.node_id is None and instance.phase is Phase.PENDING


def workspace_storage_pending(workspace: Workspace) -> bool:
    """The workspace's files (a layer or volumes) may still be on a node, or copies of them
    a move left (read by the leader's mover at its start)."""
    return bool(workspace.storage.layer or workspace.storage.volume_ids or workspace.stale_copies)


# -- events: the columns a fleet-wide list filters on (tenant, workspace_id, node_id,
# event_type, event_time) beside the record ----------------------------------------------------


def event_columns(event: Event) -> tuple[str, str, str, int, float]:
    """The queried columns of an event's row, after seq: what event_scan filters on."""
    return (event.workspace_id, event.tenant, event.node_id, int(event.type), event.time)


def event_scan(query: EventQuery, max_rows: int, mark: str) -> tuple[str, list[Any]]:
    """One bounded slice of the query (Reader.scan_events) as SQL with `mark` for its
    placeholders ("?" SQLite, "%s" PostgreSQL): the next `max_rows` rows of the narrowest
    range an index holds (the workspace's, else the tenant's, else every event), each with
    its record only when it matches the filter. Its cost is the slice's, whatever the filter."""
    where: list[str] = []
    args: list[Any] = []
    if query.tenant is not None:
        where.append(f"tenant = {mark}")
        args.append(query.tenant)
    if query.node_id:
        where.append(f"node_id = {mark}")
        args.append(query.node_id)
    if query.types:
        where.append(f"event_type IN ({', '.join(mark for _ in query.types)})")
        args.extend(sorted(int(t) for t in query.types))
    if query.start_time is not None:
        where.append(f"event_time >= {mark}")
        args.append(query.start_time)
    if query.end_time is not None:
        where.append(f"event_time < {mark}")
        args.append(query.end_time)
    if query.workspace_id:
        key, key_args = f"workspace_id = {mark} AND ", [query.workspace_id]
    elif query.tenant is not None:
        key, key_args = f"tenant = {mark} AND ", [query.tenant]
    else:
        key, key_args = "", []
    sql = (
        f"SELECT seq, tenant, node_id, CASE WHEN {' AND '.join(where) or '1 = 1'} THEN data END FROM "
        "(SELECT seq, workspace_id, tenant, node_id, event_type, event_time, data FROM events "
        f"WHERE {key}seq > {mark} ORDER BY seq LIMIT {mark}) AS page ORDER BY seq"
    )
    return sql, [*args, *key_args, query.after_seq, max_rows]


def event_slice(rows: Iterable[tuple[Any, ...]], max_rows: int, want: int, newest: int) -> EventSlice:
    """The matching events of a slice's rows (seq, tenant, node_id, data or None), up to `want`."""
    events: list[Event] = []
    last = count = 0
    for seq, tenant, node_id, data in rows:
        count += 1
        last = int(seq)
        if data is None:
            continue
        event = EVENT.decode(bytes(data))
        # The columns hold what records from before these fields lack (the migration's).
        event.seq, event.tenant, event.node_id = last, str(tenant), str(node_id)
        events.append(event)
        if len(events) == want:
            # The rest of the slice is left for the next call: it stops where this one ends.
            return EventSlice(events, last, False, newest)
    return EventSlice(events, last, count < max_rows, newest)
