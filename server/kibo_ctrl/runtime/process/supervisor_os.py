"""Small operating-system helpers of the supervisor (standard library only: supervisor.py
imports this file by path): checked libc calls, syncfs, the OOM counter, /proc facts, and
atomic JSON files."""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def syncfs(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        check(_libc.syncfs(fd), f"syncfs {path}")
    finally:
        os.close(fd)


def sync_all(paths: list[str]) -> str:
    """syncfs every path; returns "" or what failed."""
    errors = []
    for path in paths:
        try:
            syncfs(path)
        except OSError as error:
            errors.append(f"{path}: {error.strerror or error}")
    return "; ".join(errors)


def oom_kills(path: str) -> int:
    if not path:
        return 0
    try:
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def start_time(pid: int) -> int:
    """The kernel's start time of a process (field 22 of /proc/PID/stat), to tell PIDs apart."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
