"""Log lines as text or as one JSON object a line (`--log-format json`).

A line's context rides in `extra=`: `workspace_id`, `command_id`, `node_id`, `instance_id`,
`kind`, `outcome`, ... (CONTEXT); the JSON formatter writes each one present as a field,
the text formatter appends them as key=value. A token never reaches a line: the
Authenticator logs nothing, tokens.py logs a token's ID only, and tests/integration/test_auth.py
checks the server's whole output for the token."""

from __future__ import annotations

import json
import logging
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


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = _context(record)
        if not context:
            return text
        # The context before any traceback: one greppable first line per event.
        first, newline, rest = text.partition("\n")
        pairs = " ".join(f"{key}={value}" for key, value in context.items())
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
