"""Where output goes: results on stdout (text or `-o json`), progress and errors on stderr."""

from __future__ import annotations

import datetime
import enum
import json
import sys
import unicodedata
from typing import Any

import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console, RenderableType
from rich.style import StyleType
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
    """A line for the person at the terminal (stderr, so stdout stays parseable); what the
    server or a guest wrote in it shows its control characters escaped."""
    print(printable(text), file=sys.stderr, flush=True)


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


# Characters a terminal acts on instead of showing, beyond the control codes (categories Cc,
# Zl, Zp): the bidirectional overrides and isolates, which reorder what follows them.
_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """`text` as text output shows what a server or a guest wrote (annotations, messages):
    every control character escaped as Python writes it (ESC as \\x1b, a newline as \\n), so
    none reaches the terminal as itself (an annotation holding ESC[31m turned the terminal
    red). `-o json` needs none of this: JSON escapes control characters itself."""
    if text.isprintable():
        return text
    return "".join(repr(c)[1:-1] if c in _BIDI or unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)


def kv(mapping: Any) -> str:
    items = sorted(dict(mapping).items())
    return ", ".join(f"{printable(k)}={printable(v)}" for k, v in items) if items else "-"


def _shown(line: Text) -> Text:
    """A line of a value with its control characters escaped (printable)."""
    if line.plain.isprintable():
        return line
    return Text(printable(line.plain), style=line.style)


def grid(rows: list[tuple[str, str | Text]]) -> Text:
    """Two columns: a bold name and its value; a value's further lines are indented under it.
    Values are never read as markup, and show control characters escaped."""
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
            result.append_text(_shown(line))
    return result


class _Table(Table):
    """A table whose text cells show control characters escaped (printable)."""

    def add_row(
        self, *renderables: RenderableType | None, style: StyleType | None = None, end_section: bool = False
    ) -> None:
        cells = [
            printable(cell) if isinstance(cell, str) else _shown(cell) if isinstance(cell, Text) else cell
            for cell in renderables
        ]
        super().add_row(*cells, style=style, end_section=end_section)


def table(*columns: str) -> Table:
    result = _Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        result.add_column(column, overflow="fold")
    return result
