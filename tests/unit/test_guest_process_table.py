"""The process table (runtime/process/guest_access/processes.py) and guest_exec's "process"
mode (guest_process.py) on real processes, fast: an instance directory of isolation "none"
(guest_exec runs the command on this host, no namespaces: what `--sandbox none` does), forked
from a real fork server. What needs a real guest (namespaces, its users, a stop, a revoke
through the API) is tests/system/test_guest_processes.py.

Each rule of the contract (runtime/base.py GuestProcesses) on its own: output and its ring,
replay and Dropped, hold (back-pressure), input with offsets and back-pressure, signals to
the group, a PTY (its size, Ctrl-C, exit code), the caps and the tag, ends by owner and by
the instance's end, guest_exec killed under its command, an upload cancelled when idle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kibo_ctrl.runtime.base import (
    MAX_ENDED_PROCESSES,
    MAX_GUEST_PROCESSES,
    MAX_UPLOADS,
    PROCESS_REPLAY_BYTES,
    Dropped,
    Exit,
    GuestRefused,
    JobStopped,
    Output,
    ProcessSpec,
    Replayed,
)
from kibo_ctrl.runtime.process.fork_client import ForkServer
from kibo_ctrl.runtime.process.guest_access.processes import CHUNK, LISTED_ARGV_BYTES, ProcessTable

INSTANCE = "ws-table-g1"


@pytest.fixture(autouse=True)
def _as_root() -> None:
    """Like the process runtime's other tests: they fail, not skip, where they cannot run."""
    assert os.geteuid() == 0, "guest_exec switches users and joins cgroups as root: run these tests as root"


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


@pytest.fixture(scope="module")
def forks() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture
def instance(tmp_path: Path) -> Path:
    """An instance directory whose "guest" is this host (isolation none), with a volume at /data."""
    directory = tmp_path / "instance"
    volume = tmp_path / "volume"
    directory.mkdir()
    volume.mkdir()
    spec = {
        "isolation": "none",
        "mounts": [[str(volume), "/data"]],
        "guest_env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C"},
        "cwd": str(tmp_path),
        "cgroup_procs": [],
    }
    (directory / "spec.json").write_text(json.dumps(spec))
    state = {"state": "ready", "guest_pid": os.getpid(), "guest_start": _start_time(os.getpid())}
    (directory / "state.json").write_text(json.dumps(state))
    return directory


@pytest.fixture
async def table(instance: Path, forks: ForkServer) -> AsyncIterator[ProcessTable]:
    made = ProcessTable(lambda _: (instance, forks), lambda _: True, upload_idle_s=0.5)
    yield made
    made.forget(INSTANCE)
    await asyncio.sleep(0)


async def collect(
    table: ProcessTable, selector: int | str, replay: bool = True, within: float = 10.0
) -> list[Output | Dropped | Replayed | Exit]:
    items: list[Output | Dropped | Replayed | Exit] = []

    async def run() -> None:
        async for item in table.follow(INSTANCE, selector, replay=replay):
            items.append(item)

    await asyncio.wait_for(run(), within)
    return items


def joined(items: list[Output | Dropped | Replayed | Exit], stream: str) -> bytes:
    return b"".join(item.data for item in items if isinstance(item, Output) and item.stream == stream)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] not in "ZX"
    except OSError:
        return False


async def until(check: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_output_input_and_exit(table: ProcessTable) -> None:
    script = 'echo hello; read line; echo "got $line"; echo oops >&2; exit 3'
    info = await table.start(INSTANCE, ProcessSpec(argv=("sh", "-c", script), tag="greeter"))
    assert info.running and info.pid > 0 and info.tag == "greeter" and not info.pty
    assert await table.send(INSTANCE, "greeter", b"world\n") == len(b"world\n")
    items = await collect(table, info.pid)
    assert joined(items, "stdout") == b"hello\ngot world\n"
    assert joined(items, "stderr") == b"oops\n"
    assert items[-1] == Exit(3)
    [listed] = await table.list(INSTANCE)
    assert not listed.running and listed.exit_code == 3 and listed.received == 6
    # An ended process: its output is still there (replay), input and signals are refused.
    assert joined(await collect(table, "greeter"), "stdout") == b"hello\ngot world\n"
    for refused in (table.send(INSTANCE, "greeter", b"x"), table.signal(INSTANCE, "greeter", 15)):
        with pytest.raises(GuestRefused) as error:
            await refused
        assert error.value.status == "conflict"


async def test_stdin_given_at_start_and_closed(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("cat",), stdin=b"given\n", close_stdin=True))
    items = await collect(table, info.pid)
    assert joined(items, "stdout") == b"given\n" and items[-1] == Exit(0)


async def test_offsets_and_closed_stdin(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("cat",)))
    assert await table.send(INSTANCE, info.pid, b"abc", offset=0) == 3
    with pytest.raises(GuestRefused) as sent_twice:
        await table.send(INSTANCE, info.pid, b"abc", offset=0)
    assert sent_twice.value.status == "conflict" and "3 bytes" in str(sent_twice.value)
    assert await table.send(INSTANCE, info.pid, b"def", offset=3, close=True) == 6
    with pytest.raises(GuestRefused) as closed:
        await table.send(INSTANCE, info.pid, b"more")
    assert closed.value.status == "conflict"
    items = await collect(table, info.pid)
    assert joined(items, "stdout") == b"abcdef" and items[-1] == Exit(0)


async def test_input_waits_while_the_process_does_not_read(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("sh", "-c", "sleep 1; cat >/dev/null; echo done")))
    started = time.monotonic()
    # More than a pipe holds: the call returns once the command has read it.
    assert await table.send(INSTANCE, info.pid, b"x" * (1 << 20), close=True) == 1 << 20
    assert time.monotonic() - started > 0.5
    items = await collect(table, info.pid)
    assert joined(items, "stdout") == b"done\n"


async def test_signals_reach_the_group_and_unknown_ones_are_not_found(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("sh", "-c", "sleep 61 & sleep 61; echo never")))
    await until(lambda: len(_pids("sleep 61")) == 2)
    await table.signal(INSTANCE, info.pid, signal.SIGTERM)
    items = await collect(table, info.pid)
    assert items[-1] == Exit(128 + signal.SIGTERM) and joined(items, "stdout") == b""
    await until(lambda: not _pids("sleep 61"))
    for missing in (info.pid + 100000, "no-such-tag"):
        with pytest.raises(GuestRefused) as error:
            await table.signal(INSTANCE, missing, 15)
        assert error.value.status == "not-found"


def _pids(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").strip()
            if command == needle.encode() and alive(int(entry)):
                found.append(int(entry))
    return found


async def test_a_terminal_its_size_ctrl_c_and_exit_code(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("sh",), pty=(24, 80), tag="tty"))
    assert info.pty
    seen = bytearray()
    follower = table.follow(INSTANCE, "tty", replay=True)

    async def until_seen(text: bytes) -> None:
        while text not in seen:
            item = await asyncio.wait_for(follower.__anext__(), 10)
            if item == Replayed():  # (the replay of nothing, at once)
                continue
            assert isinstance(item, Output) and item.stream == "pty", item
            seen.extend(item.data)

    await table.send(INSTANCE, "tty", b"stty size\n")
    await until_seen(b"24 80")
    await table.resize(INSTANCE, "tty", 30, 100)
    await table.send(INSTANCE, "tty", b"stty size\n")
    await until_seen(b"30 100")
    await table.send(INSTANCE, "tty", b"sleep 62; echo slept\n")
    await until(lambda: bool(_pids("sleep 62")))
    await table.send(INSTANCE, "tty", b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground group
    await until(lambda: not _pids("sleep 62"), within=5)
    await table.send(INSTANCE, "tty", b"exit 3\n")
    rest = [item async for item in follower]
    assert rest[-1] == Exit(3)
    assert b"\nslept" not in seen + joined(rest, "pty")  # its echo of the line only
    # No terminal: a resize is refused.
    plain = await table.start(INSTANCE, ProcessSpec(argv=("true",)))
    with pytest.raises(GuestRefused) as error:
        await table.resize(INSTANCE, plain.pid, 10, 10)
    assert error.value.status == "conflict"


async def test_output_beyond_the_ring_is_dropped_not_kept(table: ProcessTable) -> None:
    size = 4 << 20
    info = await table.start(INSTANCE, ProcessSpec(argv=("head", "-c", str(size), "/dev/zero")))
    items = await collect(table, info.pid, replay=False, within=20)  # from now: no Dropped for what came before
    assert items[-1] == Exit(0)
    process = table._find(INSTANCE, info.pid)
    kept = process.ring.end - process.ring.start
    assert process.ring.end == size and kept <= PROCESS_REPLAY_BYTES + CHUNK
    replayed = await collect(table, info.pid)
    assert replayed[0] == Dropped(process.ring.start)
    assert sum(len(i.data) for i in replayed if isinstance(i, Output)) == kept


async def test_a_hold_follower_holds_the_writer_and_memory_stays_bounded(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("head", "-c", "1G", "/dev/zero")))
    follower = table.follow(INSTANCE, info.pid, replay=True, hold=True)
    first = await follower.__anext__()
    if first == Replayed():  # nothing was kept yet
        first = await follower.__anext__()
    assert isinstance(first, Output)
    [writer] = await _wait_for_pids("head -c 1G /dev/zero")
    await asyncio.sleep(0.5)  # the follower reads no more: the writer is held
    held = _written(writer)
    await asyncio.sleep(0.5)
    assert _written(writer) == held < 4 << 20, held
    process = table._find(INSTANCE, info.pid)
    assert process.ring.end - process.ring.start <= PROCESS_REPLAY_BYTES + CHUNK
    # Everything it wrote comes to the hold follower, none dropped.
    received = len(first.data) if isinstance(first, Output) else 0
    async for item in follower:
        assert not isinstance(item, Dropped)
        if isinstance(item, Output):
            received += len(item.data)
            if received >= 8 << 20:
                break
    await follower.aclose()
    # Without it, the writer is no longer held (a background process is never blocked).
    await asyncio.sleep(0.2)
    assert _written(writer) > held + (8 << 20) or not alive(writer)
    await table.signal(INSTANCE, info.pid, signal.SIGKILL)


async def _wait_for_pids(needle: str) -> list[int]:
    await until(lambda: bool(_pids(needle)))
    return _pids(needle)


def _written(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("wchar:"))


async def test_a_background_process_is_not_held_by_no_follower(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("head", "-c", "64M", "/dev/zero")))
    items = await collect(table, info.pid, replay=False, within=20)
    assert items[-1] == Exit(0)


async def test_caps_and_tags(table: ProcessTable) -> None:
    started = [
        await table.start(INSTANCE, ProcessSpec(argv=("sleep", "63"), tag=f"t{i}")) for i in range(MAX_GUEST_PROCESSES)
    ]
    with pytest.raises(GuestRefused) as past:
        await table.start(INSTANCE, ProcessSpec(argv=("sleep", "63")))
    assert past.value.status == "limit" and past.value.errno == "processes"
    # (A started process's keeper may still be on its way to exec its command.)
    await until(lambda: len(_pids("sleep 63")) == MAX_GUEST_PROCESSES)
    await asyncio.sleep(0.2)
    assert len(_pids("sleep 63")) == MAX_GUEST_PROCESSES  # and none beyond
    await table.signal(INSTANCE, "t0", signal.SIGKILL)
    await collect(table, "t0")
    with pytest.raises(GuestRefused) as taken:
        await table.start(INSTANCE, ProcessSpec(argv=("sleep", "63"), tag="t1"))
    assert taken.value.status == "conflict"
    # An ended process's tag is free again.
    again = await table.start(INSTANCE, ProcessSpec(argv=("sleep", "63"), tag="t0"))
    assert again.pid != started[0].pid
    await table.end(INSTANCE)
    await until(lambda: not _pids("sleep 63"))
    deadline = time.monotonic() + 10
    while any(p.running for p in await table.list(INSTANCE)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    listed = await table.list(INSTANCE)
    assert len(listed) == MAX_ENDED_PROCESSES and {p.exit_code for p in listed} == {128 + signal.SIGKILL}


async def test_end_by_owner_keeps_the_current_ones(table: ProcessTable) -> None:
    old = await table.start(INSTANCE, ProcessSpec(argv=("sleep", "64"), owner=1))
    new = await table.start(INSTANCE, ProcessSpec(argv=("sleep", "64.5"), owner=2))
    await table.end(INSTANCE, keep_owner=2)
    assert (await collect(table, old.pid))[-1] == Exit(128 + signal.SIGKILL)
    [running] = [p for p in await table.list(INSTANCE) if p.running]
    assert running.pid == new.pid and _pids("sleep 64.5") and not _pids("sleep 64")
    await table.end(INSTANCE, keep_owner=None)
    assert (await collect(table, new.pid))[-1] == Exit(128 + signal.SIGKILL)


async def test_forget_kills_and_ends_followers(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("sleep", "65")))
    stop = asyncio.Event()
    follower = table.follow(INSTANCE, info.pid, stop=stop)
    waiting = asyncio.ensure_future(follower.__anext__())
    await asyncio.sleep(0.05)
    table.forget(INSTANCE)
    assert await asyncio.wait_for(waiting, 5) == Exit(128 + signal.SIGKILL)
    await until(lambda: not _pids("sleep 65"))
    with pytest.raises(GuestRefused):
        await table.signal(INSTANCE, info.pid, 15)


async def test_stop_ends_a_follower_not_the_process(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("sleep", "66")))
    stop = asyncio.Event()
    follower = table.follow(INSTANCE, info.pid, stop=stop)
    waiting = asyncio.ensure_future(follower.__anext__())
    await asyncio.sleep(0.05)
    stop.set()
    with pytest.raises(JobStopped):
        await asyncio.wait_for(waiting, 5)
    assert [p.running for p in await table.list(INSTANCE)] == [True]
    await table.end(INSTANCE)


async def test_a_keeper_killed_under_its_command_takes_the_command(table: ProcessTable) -> None:
    info = await table.start(INSTANCE, ProcessSpec(argv=("sh", "-c", "sleep 67 & sleep 67")))
    [*sleeps] = await _wait_for_pids("sleep 67")
    process = table._find(INSTANCE, info.pid)
    os.kill(process.handle.pid, signal.SIGKILL)  # guest_exec, as the guest's memory limit would
    with pytest.raises(GuestRefused) as error:
        await collect(table, info.pid)
    assert error.value.status == "error"
    await until(lambda: not any(alive(pid) for pid in sleeps))


async def test_the_servers_departure_kills_the_group(table: ProcessTable) -> None:
    """The control pipe's end (this server gone: a node agent killed) and nothing else: the
    keeper in the guest kills its command's group, nothing runs on unsupervised."""
    info = await table.start(INSTANCE, ProcessSpec(argv=("sh", "-c", "sleep 69 & sleep 69")))
    sleeps = await _wait_for_pids("sleep 69")
    process = table._find(INSTANCE, info.pid)
    os.close(process.control)
    process.control = -1
    await until(lambda: not any(alive(pid) for pid in sleeps))
    assert (await collect(table, info.pid))[-1] == Exit(128 + signal.SIGKILL)


async def test_unknown_user_and_working_directory_are_refused(table: ProcessTable) -> None:
    with pytest.raises(GuestRefused) as user:
        await table.start(INSTANCE, ProcessSpec(argv=("true",), user="no-such-user-here"))
    assert user.value.status == "invalid"
    with pytest.raises(GuestRefused) as cwd:
        await table.start(INSTANCE, ProcessSpec(argv=("true",), cwd="/no/such/dir"))
    assert (cwd.value.status, cwd.value.errno) == ("os-error", "ENOENT")
    missing = await table.start(INSTANCE, ProcessSpec(argv=("no-such-command-here",)))
    items = await collect(table, missing.pid)
    assert items[-1] == Exit(127) and b"No such file" in joined(items, "stderr")
    assert not [p for p in await table.list(INSTANCE) if p.running]


async def test_another_user(table: ProcessTable) -> None:
    info = await table.start(
        INSTANCE, ProcessSpec(argv=("sh", "-c", "id -u; id -g; echo $HOME"), user="nobody", cwd="/tmp")
    )
    items = await collect(table, info.pid)
    out = joined(items, "stdout").decode().split()
    assert out[0] == "65534" and items[-1] == Exit(0), items
    numeric = await table.start(INSTANCE, ProcessSpec(argv=("sh", "-c", "sleep 68; id -u"), user="4321", cwd="/tmp"))
    await table.signal(INSTANCE, numeric.pid, signal.SIGTERM)  # the keeper may signal another user
    assert (await collect(table, numeric.pid))[-1] == Exit(128 + signal.SIGTERM)


async def test_an_idle_upload_is_cancelled(table: ProcessTable, instance: Path, tmp_path: Path) -> None:
    job = {"mode": "write", "anywhere": True, "path": "/data/upload.bin"}
    info = await table.start(INSTANCE, ProcessSpec(job=job, tag="kibo-upload-0123456789abcdef"))
    assert info.upload and info.argv == ()
    assert await table.send(INSTANCE, info.pid, b"part", offset=0) == 4
    items = await collect(table, info.pid)  # not written again for upload_idle_s: SIGTERM
    assert items[-1] == Exit(128 + signal.SIGTERM)
    assert os.listdir(tmp_path / "volume") == []  # nothing of it is left
    uploads = [await table.start(INSTANCE, ProcessSpec(job=job, tag=f"kibo-upload-{i}")) for i in range(MAX_UPLOADS)]
    with pytest.raises(GuestRefused) as past:
        await table.start(INSTANCE, ProcessSpec(job=job))
    assert past.value.status == "limit" and past.value.errno == "uploads"
    done = await table.start(INSTANCE, ProcessSpec(argv=("true",)))  # a process still may
    assert (await collect(table, done.pid))[-1] == Exit(0)
    for upload in uploads:
        await table.signal(INSTANCE, upload.pid, signal.SIGTERM)


async def test_finished_upload_lands_whole(table: ProcessTable, tmp_path: Path) -> None:
    job = {"mode": "write", "anywhere": True, "path": "/data/whole.bin"}
    info = await table.start(INSTANCE, ProcessSpec(job=job))
    data = os.urandom(3 << 20)
    assert await table.send(INSTANCE, info.pid, data, close=True, offset=0) == len(data)
    assert (await collect(table, info.pid))[-1] == Exit(0)
    assert (tmp_path / "volume" / "whole.bin").read_bytes() == data


async def test_the_ended_ones_kept_are_the_last_ones(table: ProcessTable) -> None:
    started = []
    for i in range(MAX_ENDED_PROCESSES + 4):
        started.append(await table.start(INSTANCE, ProcessSpec(argv=("echo", str(i)))))
        await collect(table, started[-1].pid)
    listed = await table.list(INSTANCE)
    assert [p.pid for p in listed] == [p.pid for p in started[-MAX_ENDED_PROCESSES:]]
    with pytest.raises(GuestRefused) as gone:
        await table.follow(INSTANCE, started[0].pid).__anext__()
    assert gone.value.status == "not-found"


async def test_a_long_command_is_listed_short(table: ProcessTable) -> None:
    """Listed, each process's command is cut to 4 KiB, so a list of every kept process stays far
    under the 4 MiB message limit, however long the commands were."""
    long = ("x" * 20_000,) * 3
    started = await table.start(INSTANCE, ProcessSpec(argv=("true", *long)))
    await collect(table, started.pid)
    [listed] = [p for p in await table.list(INSTANCE) if p.pid == started.pid]
    assert listed.argv[0] == "true" and listed.argv[-1].endswith("...")
    assert sum(len(word.encode()) for word in listed.argv) <= LISTED_ARGV_BYTES + 3


async def test_a_replay_says_where_the_kept_output_ends(table: ProcessTable) -> None:
    """Replayed comes once, after what was kept when the follow began and before what comes
    live (`kibo workspace logs` without --follow stops there); without replay, or for a process
    that has ended (its Exit ends the replay), it never comes."""
    info = await table.start(INSTANCE, ProcessSpec(argv=("sh", "-c", "echo kept; read line; echo $line"), tag="r"))
    while True:  # until "kept" is kept: an empty replay is Replayed at once
        follower = table.follow(INSTANCE, "r", replay=True)
        first = await anext(follower)
        if first != Replayed():
            break
        await follower.aclose()
        await asyncio.sleep(0.01)
    assert first == Output("stdout", b"kept\n")
    assert await anext(follower) == Replayed()
    await table.send(INSTANCE, "r", b"later\n")
    assert await anext(follower) == Output("stdout", b"later\n")
    assert await anext(follower) == Exit(0)
    assert await collect(table, info.pid, replay=False) == [Exit(0)]
    ended = await collect(table, info.pid)
    assert ended == [Output("stdout", b"kept\n"), Output("stdout", b"later\n"), Exit(0)], ended  # no Replayed
