"""Log lines escape control characters (issue 27, item 7): what a request or a guest wrote
(an event's message, a command's error, an exception's text) can neither start a line of
its own in the text log nor reach an operator's terminal as a control sequence."""

from __future__ import annotations

import json
import logging
import sys

from kibo_ctrl.telemetry.logs import JsonFormatter, TextFormatter

HOSTILE = "boom\x1b[2J\x1b[31m\nFAKE 2026-01-01 00:00:00,000 ERROR kibo: forged\r\x07\x9b\u2028"


def record(exc_info: bool = False) -> logging.LogRecord:
    info = None
    if exc_info:
        try:
            raise ValueError(f"bad {HOSTILE}")
        except ValueError:
            info = sys.exc_info()
    made = logging.LogRecord("kibo.events", logging.WARNING, __file__, 1, "command_failed: %s", (HOSTILE,), info)
    made.command_id = "cmd-1"
    made.node_id = HOSTILE  # any context field a line carries
    return made


def controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c == "\u2028"]


def test_a_text_line_is_one_line_with_its_control_characters_escaped() -> None:
    line = TextFormatter().format(record())
    assert "\n" not in line and not controls(line), line
    assert "boom\\x1b[2J\\x1b[31m\\nFAKE" in line
    assert "node_id=boom\\x1b[2J" in line and "command_id=cmd-1" in line


def test_a_traceback_keeps_its_lines_and_escapes_the_rest() -> None:
    text = TextFormatter().format(record(exc_info=True))
    first, _, traceback = text.partition("\n")
    assert "\\x1b[2J" in first and "[command_id=cmd-1" in first
    assert traceback.startswith("Traceback (most recent call last):")
    assert "ValueError: bad boom\\x1b[2J" in traceback
    assert not controls(text), text


def test_a_json_line_escapes_them_by_json_rules() -> None:
    line = JsonFormatter().format(record(exc_info=True))
    assert "\n" not in line and not controls(line)
    parsed = json.loads(line)
    assert parsed["message"] == f"command_failed: {HOSTILE}" and parsed["node_id"] == HOSTILE
