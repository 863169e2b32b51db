"""Log lines as text or as one JSON object a line (`--log-format json`).

A line's context rides in `extra=`: `workspace_id`, `command_id`, `node_id`, `instance_id`,
`kind`, `outcome`, ... (CONTEXT); the JSON formatter writes each one present as a field,
the text formatter appends them as key=value, with control characters escaped (\\x1b, \\n):
what a request or a guest wrote (a filter, a command's error, a traceback's exception text)
can neither start a line of its own nor reach an operator's terminal as a control sequence;
JSON escapes them itself. A token never reaches a line: the
Authenticator logs nothing, tokens.py logs a token's ID only, and tests/integration/test_auth.py
checks the server's whole output for the token."""

from __future__ import annotations

import json
import logging
import unicodedata
from datetime import UTC, datetime
from typing import Any

# The context fields a line may carry, in the order they are written.
CONTEXT = (
    "workspace_id",
    "command_id",
    "node_id",
    "instance_id",
    "tenant",
    "trace_id",
    "kind",
    "outcome",
    "state",
    "from_state",
    "code",
    "seconds",
)


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key in CONTEXT if (value := getattr(record, key, None)) not in (None, "")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_context(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def escaped(text: str) -> str:
    """`text` with its control characters (categories Cc, Zl, Zp) written as Python escapes."""
    if text.isprintable():
        return text
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # The message escaped, so the first line is the whole message; then the traceback's
        # lines, each escaped, on lines of their own.
        escaped_record = logging.makeLogRecord({**record.__dict__, "msg": escaped(record.getMessage()), "args": None})
        first, newline, rest = super().format(escaped_record).partition("\n")
        rest = "\n".join(escaped(line) for line in rest.split("\n"))
        context = _context(record)
        if not context:
            return f"{first}{newline}{rest}"
        # The context before any traceback: one greppable first line per event.
        pairs = " ".join(f"{key}={escaped(str(value))}" for key, value in context.items())
        return f"{first} [{pairs}]{newline}{rest}"


FORMATS = ("text", "json")


def configure(level: str, log_format: str) -> None:
    """The root logger's one handler (stderr), in `log_format`."""
    if log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; choose text or json")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
