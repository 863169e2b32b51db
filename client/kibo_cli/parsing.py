"""Parsing command-line values: durations, KEY=VALUE pairs, sizes, times."""

from __future__ import annotations

import datetime
import re

import typer

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"(\d+)\s*(|m|mi|mib|mb|g|gi|gib|gb)", re.IGNORECASE)


def duration(text: str) -> float:
    """`90`, `90s`, `5m`, `1h30m`, `2d`, `250ms` -> seconds."""
    value = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    total, position = 0.0, 0
    for match in _DURATION.finditer(value):
        if match.start() != position:
            break
        total += float(match[1]) * _UNITS[match[2]]
        position = match.end()
    if position != len(value) or not value:
        raise typer.BadParameter(f"{text!r} is not a duration (like 90s, 5m, 1h30m, 2d)")
    return total


def memory_mib(text: str) -> int:
    """`2048`, `2048Mi`, `2Gi`, `2GiB` -> MiB."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise typer.BadParameter(f"{text!r} is not a size (like 2048, 512Mi, 2Gi)")
    number, unit = int(match[1]), match[2].lower()
    return number * 1024 if unit.startswith("g") else number


def pair(text: str, what: str = "label") -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{what} {text!r} must look like KEY=VALUE")
    return key, value


def pairs(values: list[str] | None, what: str = "label") -> dict[str, str]:
    return dict(pair(v, what) for v in values or [])


def time_or_duration(text: str) -> datetime.datetime:
    """An RFC 3339 time (`2030-01-02T03:04:05Z`) or a duration from now (`2h`)."""
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=duration(text))
    if when.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no time zone; end it with Z or +HH:MM")
    return when
