"""guest_exec's file modes (guest_files.py, guest_tar.py, guest_watch.py) on real processes, fast:
an instance directory of isolation "none" (what `--sandbox none` does: no namespaces, guest paths
are host paths), its jobs forked from a real fork server, its uploads kept by a real process table.

- With isolation "none" every new file mode keeps the volume-mount rule of ReadWorkspaceFile
  (safepath): nothing outside the workspace's volumes is reached, by any path or mode.
- An upload is put in place at its commit (SIGUSR1 after the end of its input), never at the end
  of its input alone (also what a server that died leaves); killed before, it leaves nothing.
What needs a real guest (its root, its names, symlinks leading out of it) is
tests/system/test_guest_files.py."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import tarfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kibo_ctrl.runtime.base import Exit, GuestRefused, Output, ProcessSpec
from kibo_ctrl.runtime.process.fork_client import ForkServer
from kibo_ctrl.runtime.process.guest_access.jobs import run_guest_exec
from kibo_ctrl.runtime.process.guest_access.processes import ProcessTable

INSTANCE = "ws-files-g1"
UPLOAD = "kibo-upload-0123456789abcdef"


@pytest.fixture(autouse=True)
def _as_root() -> None:
    """Like the process runtime's other tests: they fail, not skip, where they cannot run."""
    assert os.geteuid() == 0, "guest_exec joins cgroups and drops privileges as root: run these tests as root"


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


@pytest.fixture(scope="module")
def forks() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    made = tmp_path / "volume"
    made.mkdir()
    return made


@pytest.fixture
def instance(tmp_path: Path, volume: Path) -> Path:
    """An instance whose "guest" is this host (isolation none), with `volume` at /data."""
    directory = tmp_path / "instance"
    directory.mkdir()
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
    made = ProcessTable(lambda _: (instance, forks), lambda _: True)
    yield made
    made.forget(INSTANCE)
    await asyncio.sleep(0)


async def job(instance: Path, forks: ForkServer, spec: dict[str, Any], stdin: bytes = b"") -> tuple[bytes, int]:
    """A file job's stdout and exit code; GuestRefused as the job reports it."""
    out = bytearray()
    code = -1
    async for item in run_guest_exec(instance, spec, stdin, 10.0, None, forks):
        if isinstance(item, Exit):
            code = item.code
        elif item.stream == "stdout":
            out += item.data
    return bytes(out), code


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


OUTSIDE = ("/etc/passwd", "/data/../etc/passwd", "/tmp", "/datafile", "/")
# Each new mode, aimed at a path: what it would do there.
MODES: dict[str, Any] = {
    "stat": lambda p: {"mode": "stat", "path": p},
    "list": lambda p: {"mode": "list", "path": p, "depth": 2},
    "mkdir": lambda p: {"mode": "mkdir", "path": p + "/new", "parents": True},
    "move-source": lambda p: {"mode": "move", "source": p, "destination": "/data/moved"},
    "move-destination": lambda p: {"mode": "move", "source": "/data/file", "destination": p + "-moved"},
    "remove": lambda p: {"mode": "remove", "path": p + "-gone", "recursive": True},
    "read": lambda p: {"mode": "read", "path": p, "anywhere": True},
    "tar-out": lambda p: {"mode": "tar-out", "path": p},
    "watch": lambda p: {"mode": "watch", "path": p},
    "write": lambda p: {"mode": "write", "path": p + "-written", "anywhere": True},
    "untar": lambda p: {"mode": "untar", "path": p + "-unpacked", "anywhere": True},
}


@pytest.mark.parametrize("mode", MODES, ids=MODES.keys())
async def test_sandbox_none_keeps_the_volume_rule(instance: Path, forks: ForkServer, volume: Path, mode: str) -> None:
    (volume / "file").write_bytes(b"in the volume")
    for path in OUTSIDE:
        with pytest.raises(GuestRefused) as refused:
            await job(instance, forks, MODES[mode](path), _tar({"x": b"x"}) if mode == "untar" else b"x")
        assert refused.value.status == "invalid" and "not under a volume mount" in str(refused.value), path
    assert not _exists("/datafile-written") and not _exists("/tmp-unpacked")
    assert (volume / "file").read_bytes() == b"in the volume"


async def test_sandbox_none_works_in_the_volume(instance: Path, forks: ForkServer, volume: Path) -> None:
    """The same modes inside the volume reach the volume's files (the mount itself too, for the
    modes over a whole directory)."""
    (volume / "file").write_bytes(b"in the volume")
    out, code = await job(instance, forks, {"mode": "stat", "path": "/data/file"})
    assert code == 0 and json.loads(out)["path"] == "/data/file" and json.loads(out)["size"] == 13
    out, code = await job(instance, forks, {"mode": "list", "path": "/data"})
    assert [json.loads(line)["path"] for line in out.splitlines()] == ["/data/file"]
    out, code = await job(instance, forks, {"mode": "read", "path": "/data/file", "anywhere": True, "offset": 3})
    assert out.split(b"\n", 1)[1] == b"the volume"
    await job(instance, forks, {"mode": "mkdir", "path": "/data/a/b", "parents": True})
    await job(instance, forks, {"mode": "move", "source": "/data/file", "destination": "/data/a/b/file"})
    await job(instance, forks, {"mode": "untar", "path": "/data/t", "anywhere": True}, _tar({"x/y": b"z"}))
    assert (volume / "a" / "b" / "file").exists() and (volume / "t" / "x" / "y").read_bytes() == b"z"
    out, code = await job(instance, forks, {"mode": "tar-out", "path": "/data"})
    with tarfile.open(fileobj=io.BytesIO(out.split(b"\n", 1)[1])) as tar:
        assert {"a/b/file", "t/x/y"} <= set(tar.getnames())
    await job(instance, forks, {"mode": "remove", "path": "/data/a", "recursive": True})
    assert sorted(os.listdir(volume)) == ["t"]


def _exists(path: str) -> bool:
    return os.path.lexists(path)


async def _follow(table: ProcessTable, selector: str) -> list[Any]:
    items = []
    async for item in table.follow(INSTANCE, selector, replay=True):
        items.append(item)
    return items


@pytest.mark.parametrize("archive", [False, True], ids=["file", "archive"])
async def test_an_upload_is_put_in_place_at_its_commit_only(table: ProcessTable, volume: Path, archive: bool) -> None:
    data = _tar({"inner": os.urandom(100_000)}) if archive else os.urandom(3 << 20)
    spec = {"mode": "untar" if archive else "write", "path": "/data/up", "anywhere": True, "commit": True}
    info = await table.start(INSTANCE, ProcessSpec(job=spec, tag=UPLOAD))
    assert await table.send(INSTANCE, UPLOAD, data, close=True, offset=0) == len(data)
    await asyncio.sleep(0.5)  # all of it read: a job without the commit would have put it in place by now
    assert not _placed(volume), "in place before its commit"
    await table.signal(INSTANCE, UPLOAD, signal.SIGUSR1)
    assert (await _follow(table, UPLOAD))[-1] == Exit(0)
    assert (volume / "up" / "inner").exists() if archive else (volume / "up").read_bytes() == data
    assert not [n for n in os.listdir(volume) if n.startswith(".kibo")], info


@pytest.mark.parametrize("archive", [False, True], ids=["file", "archive"])
async def test_an_upload_whose_server_is_gone_is_not_put_in_place(
    table: ProcessTable, volume: Path, archive: bool
) -> None:
    """Its input ended without a commit, then its control pipe ended (what a server that died
    leaves): nothing is in place, and a file upload leaves not even a temporary file."""
    data = _tar({"inner": b"x" * 100_000}) if archive else os.urandom(1 << 20)
    spec = {"mode": "untar" if archive else "write", "path": "/data/up", "anywhere": True, "commit": True}
    await table.start(INSTANCE, ProcessSpec(job=spec, tag=UPLOAD))
    await table.send(INSTANCE, UPLOAD, data, close=True, offset=0)
    await asyncio.sleep(0.2)
    # The control pipe's end, as a server that died leaves it: its keeper kills the upload. (An
    # end asked for, a revoke's, sends SIGTERM first: the upload then removes what it staged.)
    process = table._find(INSTANCE, UPLOAD)
    os.close(process.control)
    process.control = -1
    items = await _follow(table, UPLOAD)
    assert isinstance(items[-1], Exit) and items[-1].code == 128 + signal.SIGKILL, items
    assert not _placed(volume)
    if not archive:
        assert os.listdir(volume) == [], os.listdir(volume)  # O_TMPFILE: not even a temporary name
    # (A killed archive upload leaves its staging directory, .kibo-untar-*, inside the target:
    # a SIGKILL gives no chance to remove it; a cancel's SIGTERM does, see the system tests.)


async def test_a_killed_file_upload_leaves_nothing(table: ProcessTable, volume: Path) -> None:
    """Killed mid-input (a revoke's end): the file being written had no name (O_TMPFILE)."""
    spec = {"mode": "write", "path": "/data/big", "anywhere": True, "commit": True}
    await table.start(INSTANCE, ProcessSpec(job=spec, tag=UPLOAD))
    await table.send(INSTANCE, UPLOAD, os.urandom(2 << 20), offset=0)
    await _until(lambda: _writing(volume))
    await table.end(INSTANCE)
    await _follow(table, UPLOAD)
    assert os.listdir(volume) == []


async def _until(check: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _placed(volume: Path) -> list[str]:
    """What of an upload to /data/up is in place (its staging directory is not)."""
    up = volume / "up"
    if not up.is_dir():
        return [up.name] if os.path.lexists(up) else []
    return [name for name in os.listdir(up) if not name.startswith(".kibo-untar-")]


def _writing(volume: Path) -> bool:
    """Some process has a file of the volume open for writing (the upload's, named or not)."""
    for fd in Path("/proc/self/fd").parent.parent.glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd).startswith(str(volume)):
                return True
        except OSError:
            continue
    return False


async def test_an_upload_reports_its_error_on_stderr(table: ProcessTable) -> None:
    """Its status goes through the table as an exit code: the error itself comes on stderr."""
    spec = {"mode": "write", "path": "/data/no/such/dir/f", "anywhere": True, "commit": True}
    await table.start(INSTANCE, ProcessSpec(job=spec, tag=UPLOAD))
    items = await _follow(table, UPLOAD)
    errors = b"".join(i.data for i in items if isinstance(i, Output) and i.stream == "stderr")
    report = json.loads(errors.splitlines()[-1])
    assert report["status"] == "os-error" and report["errno"] == "ENOENT", report
    assert items[-1] != Exit(0)
