"""`kibo events`: the events of every workspace the token sees (an operator's: every
tenant's), filtered by workspace, node, type and time; `--follow` goes on with each new one
as it is stored (the SDK's watch_events, which resumes after a broken stream)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from typing import Annotated

import kibotos
import typer
from kibo.ctrl.v1 import observation_service_pb2 as obs_pb2
from rich.table import Table
from rich.text import Text

from . import output, parsing
from .exit_codes import ExitCode
from .output import Format
from .session import OutputOpt, connect, fail, handle

TYPES = [v.name.removeprefix("EVENT_TYPE_") for v in obs_pb2.EventType.DESCRIPTOR.values if v.number != 0]


def event_type(name: str) -> int:
    """STATE_CHANGED, state_changed or EVENT_TYPE_STATE_CHANGED -> its EventType value."""
    key = name.strip().upper().removeprefix("EVENT_TYPE_")
    if key not in TYPES:
        raise typer.BadParameter(f"{name!r} is not an event type ({', '.join(TYPES)})")
    return int(obs_pb2.EventType.Value(f"EVENT_TYPE_{key}"))


def time_or_ago(text: str) -> datetime.datetime:
    """An RFC 3339 time (`2030-01-02T03:04:05Z`) or a duration before now (`10m`)."""
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=parsing.duration(text))
    if when.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no time zone; end it with Z or +HH:MM")
    return when


def _change(event: obs_pb2.WorkspaceEvent) -> str:
    if not (event.from_state or event.to_state):
        return ""
    return f"{kibotos.state_name(event.from_state)} -> {kibotos.state_name(event.to_state)}"


def table(items: Iterable[obs_pb2.WorkspaceEvent]) -> Table:
    result = output.table("TIME", "SEQUENCE", "WORKSPACE", "NODE", "EVENT", "CHANGE", "COMMAND", "MESSAGE")
    for event in items:
        result.add_row(
            output.when(event.event_time, event, "event_time"),
            str(event.sequence),
            Text(event.workspace_id),
            Text(event.node_id or "-"),
            output.enum_name(obs_pb2.EventType, event.type, "EVENT_TYPE_"),
            _change(event),
            Text(event.command_id or "-"),
            Text(event.message),
        )
    return result


def _line(event: obs_pb2.WorkspaceEvent) -> Text:
    """One event as a line (--follow's text output: a table cannot grow)."""
    change = f" {_change(event)}" if event.from_state or event.to_state else ""
    kind = output.enum_name(obs_pb2.EventType, event.type, "EVENT_TYPE_")
    node = f" on {event.node_id}" if event.node_id else ""
    command = f" [{event.command_id}]" if event.command_id else ""
    text = f"{output.when(event.event_time, event, 'event_time')} #{event.sequence} {event.workspace_id}{node} "
    return Text(output.printable(f"{text}{kind}{change}{command}: {event.message}"))


@handle
def events(
    workspace: Annotated[str, typer.Option("--workspace", "-w", help="Only this workspace's events.")] = "",
    node: Annotated[str, typer.Option("--node", help="Only the events that concern this node.")] = "",
    types: Annotated[
        list[str] | None,
        typer.Option("--type", "-t", help=f"Only this type (repeat for more): {', '.join(TYPES)}."),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="From this time (RFC 3339) or this long ago (10m, 2h).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Before this time (RFC 3339) or this long ago (10m, 2h).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Then each new event as it is stored, until interrupted.")
    ] = False,
    fmt: OutputOpt = Format.text,
) -> None:
    """Events of every workspace the token sees (an operator token: every tenant's), oldest
    first: state changes, commands, scheduling, resets, silent nodes. With --follow, one line
    (or, with -o json, one JSON object) per event, as each is stored."""
    try:
        kinds = [event_type(name) for name in types or []]
        start = time_or_ago(since) if since else None
        end = time_or_ago(until) if until else None
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    with connect() as client:
        if not follow:
            items = list(
                client.list_events(
                    types=kinds, workspace_id=workspace, node_id=node, start_time=start, end_time=end, page_size=1000
                )
            )
            if fmt is Format.json:
                output.emit_json({"events": [output.to_dict(e) for e in items]})
            else:
                output.stdout().print(table(items))
            return
        watch = client.watch_events(
            types=kinds, workspace_id=workspace, node_id=node, start_time=start, end_time=end, history=True
        )
        try:
            for event in watch:
                if fmt is Format.json:
                    typer.echo(json.dumps(output.to_dict(event)))
                else:
                    output.stdout().print(_line(event))
        except KeyboardInterrupt:
            return  # --follow ends here: nothing was sent that goes on
