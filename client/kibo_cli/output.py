"""Where output goes: results on stdout (text or `-o json`), progress and errors on stderr."""

from __future__ import annotations

import datetime
import enum
import json
import sys
from typing import Any

import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console
from rich.table import Table
from rich.text import Text


class Format(enum.StrEnum):
    text = "text"
    json = "json"


# Wide enough that nothing wraps when output goes to a file or a pipe.
_PLAIN_WIDTH = 1000


def stdout() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=_PLAIN_WIDTH, no_color=True)
    return console


def stderr() -> Console:
    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, width=_PLAIN_WIDTH, no_color=True)
    return console


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def emit_json(value: Message | dict[str, Any] | list[Any]) -> None:
    data = to_dict(value) if isinstance(value, Message) else value
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


def note(text: str) -> None:
    """A line for the person at the terminal (stderr, so stdout stays parseable)."""
    print(text, file=sys.stderr, flush=True)


def when(stamp: Timestamp, parent: Message | None = None, field: str = "") -> str:
    """RFC 3339 UTC to the second, or `-` when unset."""
    if parent is not None and field and not parent.HasField(field):
        return "-"
    if stamp.seconds == 0 and stamp.nanos == 0:
        return "-"
    moment = stamp.ToDatetime(tzinfo=datetime.UTC)
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def enum_name(enum_type: Any, value: int, prefix: str) -> str:
    try:
        return str(enum_type.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def kv(mapping: Any) -> str:
    items = sorted(dict(mapping).items())
    return ", ".join(f"{k}={v}" for k, v in items) if items else "-"


def grid(rows: list[tuple[str, str | Text]]) -> Text:
    """Two columns: a bold name and its value; a value's further lines are indented under it.
    Values are never read as markup."""
    width = max((len(name) for name, _ in rows), default=0) + 2
    result = Text()
    for index, (name, value) in enumerate(rows):
        if index:
            result.append("\n")
        result.append(name, style="bold")
        result.append(" " * (width - len(name)))
        lines = (value if isinstance(value, Text) else Text(value)).split("\n")
        for number, line in enumerate(lines):
            if number:
                result.append("\n" + " " * width)
            result.append_text(line)
    return result


def table(*columns: str) -> Table:
    result = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        result.add_column(column, overflow="fold")
    return result
