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


def limit_hits(path: str) -> int:
    """How often the guest's own memory limit was reached, from its OOM counter's file
    `path`: cgroup v2 memory.events' `oom` (its limit was reached and an allocation was about
    to fail there: not counted when a parent's limit or the host ran out); cgroup v1 the
    memory cgroup's failcnt and memsw.failcnt (charges its own limit refused, reclaimed or
    not: a coarser sign). 0 where there is none."""
    if not path:
        return 0
    if os.path.basename(path) == "memory.events":
        with contextlib.suppress(OSError, ValueError):
            for line in Path(path).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom":
                    return int(value)
        return 0
    total = 0
    for name in ("memory.failcnt", "memory.memsw.failcnt"):
        with contextlib.suppress(OSError, ValueError):
            total += int(Path(os.path.dirname(path), name).read_text())
    return total


class OomKill:
    """One OOM kill as the kernel logged it ("oom-kill:constraint=...,oom_memcg=...,
    task_memcg=...,task=...,pid=..."): the process, its cgroup, and the cgroup whose limit
    was reached (`oom_memcg`; none when the host ran out: CONSTRAINT_NONE)."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.pid = int(fields.get("pid") or 0)
        self.command = fields.get("task", "")[:64]
        self.task_memcg = fields.get("task_memcg", "")
        self.oom_memcg = fields.get("oom_memcg", "")
        self.constraint = fields.get("constraint", "")

    @property
    def own_limit(self) -> bool:
        """The guest went over its own memory: its cgroup's limit, nobody else's."""
        return self.constraint == "CONSTRAINT_MEMCG" and bool(self.task_memcg) and self.oom_memcg == self.task_memcg


# The kernel's log, read from the moment this process started watching it (`watch_kernel_log`)
# for its OOM kill records: which process was killed, in which cgroup, and whose limit was
# reached. Opened in each supervisor process after its fork (a shared read position would
# hand one process's records to another); the records not claimed yet, newest last.
_KMSG = [-1]
_OOM_LOG: list[OomKill] = []
OOM_LOG_KEPT = 256
KERNEL_FACILITY_LEVELS = 8  # a record's prefix below this: the kernel's own (not written from user space)


def watch_kernel_log() -> None:
    """Start reading the kernel's log from now (once per process; without /dev/kmsg, or
    without the right to read it, OOM kills are told from the cgroup's counters alone)."""
    if _KMSG[0] >= 0:
        return
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        os.close(fd)
        return
    _KMSG[0] = fd


def logged_oom_kills(oom_file: str) -> list[OomKill] | None:
    """The OOM kills of processes in the guest's cgroup (the directory of its counter file
    `oom_file`) that the kernel logged since the last call; None: the log cannot be read."""
    fd = _KMSG[0]
    if fd < 0:
        return None
    while True:
        try:
            record = os.read(fd, 8192)
        except BlockingIOError:
            break
        except BrokenPipeError:
            continue  # records were overwritten before we read them: go on with the next
        except OSError:
            return None
        if not record:
            break
        _take_record(record)
    directory = os.path.dirname(oom_file)
    mine = "/" + os.path.basename(os.path.dirname(directory)) + "/" + os.path.basename(directory)
    found = [kill for kill in _OOM_LOG if kill.task_memcg.endswith(mine)]
    _OOM_LOG[:] = [kill for kill in _OOM_LOG if not kill.task_memcg.endswith(mine)]
    return found


def _take_record(record: bytes) -> None:
    prefix, _, rest = record.partition(b";")
    try:
        level = int(prefix.split(b",", 1)[0])
    except ValueError:
        return
    message = rest.split(b"\n", 1)[0].decode(errors="replace")
    if level >= KERNEL_FACILITY_LEVELS or not message.startswith("oom-kill:"):
        return
    fields = dict(part.partition("=")[::2] for part in message.removeprefix("oom-kill:").split(","))
    try:
        _OOM_LOG.append(OomKill(fields))
    except ValueError:
        return
    del _OOM_LOG[:-OOM_LOG_KEPT]


# Every process of a guest is born with this oom_score_adj (the guest's first process, a
# job door, a job: set on itself as it joins the guest's cgroup; children inherit it), so
# that the OOM killer chooses any of them before the guest's init (put back to 0 once the
# guest is ready: `spare_from_oom`), which a guest kernel would not kill either; and before
# the host's own processes (the control plane, sshd) when the host runs out, as the kubelet
# ranks its pods' containers above the node's daemons. Raising one's own score needs no
# privilege; lowering a score below 0 needs CAP_SYS_RESOURCE, which a node may not have
# (the container this was built in has not): back to 0 needs none.
GUEST_OOM_SCORE_ADJ = 500


def join_guest_oom_rank() -> None:
    """This process (about to be a guest's, or a job's) takes the guests' OOM rank."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text(str(GUEST_OOM_SCORE_ADJ))


def spare_from_oom(pids: list[int]) -> None:
    """Put these processes back to the default oom_score_adj (0), below every other process
    of their guest: the guest's init and what runs it. Only processes that start nothing more
    but `sleep` (children inherit it). Best effort: a process gone meanwhile is left."""
    for pid in pids:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/oom_score_adj").write_text("0")


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
