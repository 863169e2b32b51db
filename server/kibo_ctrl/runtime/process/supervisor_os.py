"""Small operating-system helpers of the supervisor (standard library only: supervisor.py
imports this file by path): checked libc calls, syncfs, the OOM counter, /proc facts,
atomic JSON files, and work done in a short-lived child (`InChild`)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


class ChildFailed(Exception):
    """What an `InChild`'s work raised, as text (`oserror`: it was an OSError)."""

    def __init__(self, message: str, oserror: bool) -> None:
        super().__init__(message)
        self.oserror = oserror


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


# The OOM counter's file, open for the supervisor's life: read every TICK, it is reread with
# one pread. (Path.read_text there made an idle supervisor's private memory grow ~0.45 MiB a
# minute: its buffers and wrappers, allocated and freed four times a second, kept landing in
# new pages of the arenas it shares with the fork server.)
_OOM_FDS: dict[str, int] = {}
OOM_KILL = b"oom_kill "


def oom_kills(path: str) -> int:
    """The OOM killer's kills counted in `path` (cgroup v2 memory.events, v1 memory.oom_control:
    its `oom_kill N` line); 0 if there is no such file or line."""
    if not path:
        return 0
    try:
        fd = _OOM_FDS.get(path)
        if fd is None:
            fd = _OOM_FDS[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        data = os.pread(fd, 4096, 0)
    except OSError:
        return 0
    if data.startswith(OOM_KILL):
        at = 0
    else:
        at = data.find(b"\n" + OOM_KILL) + 1
        if at == 0:
            return 0
    end = data.find(b"\n", at)
    try:
        return int(data[at + len(OOM_KILL) : end if end >= 0 else len(data)])
    except ValueError:
        return 0


def forget_oom(path: str) -> None:
    """Close `path`'s kept file (the node supervisor holds many instances, one after another)."""
    fd = _OOM_FDS.pop(path, None)
    if fd is not None:
        os.close(fd)


def kill_cgroups(procs_files: list[str]) -> None:
    """SIGKILL every process listed in these cgroup.procs files (a guest's, whole)."""
    for procs in procs_files:
        with contextlib.suppress(OSError, ValueError):
            for pid in Path(procs).read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def pidfd_if(pid: int, started: int) -> int:
    """A pidfd of `pid` if it runs and (`started` non-zero) started then; else -1."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, ValueError):
        return -1
    try:
        same = not started or start_time(pid) == started
    except (OSError, ValueError):
        same = False
    if not same:
        os.close(fd)
        return -1
    return fd


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


# InChild children that answered and are not reaped yet.
_ANSWERED: list[int] = []


def reap_answered() -> None:
    """Wait for the InChild children that answered (they are gone or nearly)."""
    while _ANSWERED:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(_ANSWERED.pop(), 0)


class InChild:
    """`work` run in a forked child: its answer (JSON) is `answer()`, or ChildFailed with what
    it raised. The child shares this process's namespaces, so what it mounts is ours; its
    memory is not, and that is the point: the pages it writes (those it copies away from the
    fork server's, and its allocations) go with it instead of staying in a supervisor for the
    workspace's whole life. The child dies with us. Between the start and `answer()` the
    caller may do other work."""

    def __init__(self, work: Callable[[], dict[str, Any]]) -> None:
        parent = os.getpid()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read)
            outcome: dict[str, Any]
            try:
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() != parent:
                    os._exit(1)
                outcome = {"done": work()}
            except BaseException as error:  # every one: reported to the parent, which decides
                outcome = {"error": str(error) or repr(error), "oserror": isinstance(error, OSError)}
            try:
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(json.dumps(outcome).encode())
                sys.stdout.flush()
            finally:
                os._exit(0)
        os.close(write)
        self.pid, self._read = pid, read

    def answer(self) -> dict[str, Any]:
        with os.fdopen(self._read, "rb") as pipe:
            reply = pipe.read()
        try:
            outcome = json.loads(reply)
        except ValueError:
            _, status = os.waitpid(self.pid, 0)
            raise ChildFailed(f"the child died without an answer (wait status {status})", False) from None
        # It has answered and is exiting (~0.6 ms to tear down its copy of our memory): reaped
        # later (`reap_answered`), off the launch's path.
        _ANSWERED.append(self.pid)
        if "error" in outcome:
            raise ChildFailed(str(outcome["error"]), bool(outcome["oserror"]))
        done: dict[str, Any] = outcome["done"]
        return done
