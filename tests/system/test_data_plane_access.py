"""A workspace's processes and files as users reach them: kibotos' workspace_access (blocking and
awaitable) and `kibo workspace start-process|ps|logs|kill|cp|ls|stat|mkdir|mv|rm|watch`, against a
real `kibo-ctrl serve --runtime process` (bubblewrap sandboxes; root, as
tests/system/test_data_plane_client.py). One server and one workspace for the module."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import kibotos
import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo_cli.exit_codes import ExitCode
from kibo_cli.main import app
from typer.testing import CliRunner, Result

from tests.server import ServerProcess
from tests.system.test_data_plane_client import create, delete, kibo_process, poll
from tests.system.test_process_runtime import sandbox_server

KIBO = [sys.executable, "-c", "from kibo_cli.main import main; main()"]
runner = CliRunner()


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory) as started:
        yield started


@pytest.fixture(scope="module")
def workspace(server: ServerProcess) -> Iterator[str]:
    with kibotos.Client(server.address) as client:
        workspace_id = create(client)
        yield workspace_id
        delete(client, workspace_id, server)


@pytest.fixture
def access(server: ServerProcess, workspace: str) -> Iterator[kibotos.WorkspaceAccess]:
    with kibotos.Client(server.address) as client:
        yield client.workspace_access(workspace)


def kibo(server: ServerProcess, *args: str, input: bytes | str | None = None) -> Result:
    return runner.invoke(app, ["--server", server.address, *args], input=input)


def _output(events: Iterator[kibotos.ProcessEvent], until: bytes) -> bytes:
    """Output of `events` up to (and with) the first chunk that makes it contain `until`."""
    seen = b""
    for event in events:
        if isinstance(event, kibotos.ProcessReplayed):  # the end of what was kept, when it connected
            continue
        assert isinstance(event, kibotos.ProcessOutput), (event, seen)
        seen += event.data
        if until in seen:
            return seen
    raise AssertionError(f"{until!r} never came: {seen!r}")


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- processes --------------------------------------------------------------------------------------


def test_a_background_process_by_tag(access: kibotos.WorkspaceAccess) -> None:
    """Started by tag, followed, left, reattached with its output kept, given input, signalled."""
    processes = access.processes
    echo = 'echo ready; while read -r line; do echo "got:$line"; done; echo bye; sleep 60'
    started = processes.start(shell=echo, tag="echo")
    assert started.pid > 0 and started.tag == "echo" and started.background
    with pytest.raises(TypeError):
        iter(started)  # a background handle has no events: connect follows it
    first = processes.connect("echo")
    assert _output(first, b"ready\n") == b"ready\n"
    first.close()  # the client leaves: the process runs on
    listed = {p.tag: p for p in processes.list()}
    assert listed["echo"].running and listed["echo"].pid == started.pid and not listed["echo"].pty
    # A tag is unique among the running ones.
    with pytest.raises(kibotos.ConflictError):
        processes.start(["sleep", "1"], tag="echo")
    processes.send_input("echo", b"one\ntwo\n")
    processes.close_stdin(started)
    again = processes.connect(started.pid, replay=True)  # by pid, with what was kept
    assert _output(again, b"bye\n") == b"ready\ngot:one\ngot:two\nbye\n"
    processes.signal("echo", signal.SIGTERM)
    assert [e for e in again if not isinstance(e, kibotos.ProcessReplayed)] == [
        kibotos.ProcessExit(128 + signal.SIGTERM)
    ]
    ended = {p.tag: p for p in processes.list()}["echo"]
    assert not ended.running and ended.exit_code == 128 + signal.SIGTERM
    # An ended process's output and exit are kept: a late follower gets them at once.
    late = list(processes.connect("echo", replay=True))
    assert late[-1] == kibotos.ProcessExit(143) and b"got:two" in b"".join(
        e.data for e in late if isinstance(e, kibotos.ProcessOutput)
    )
    with pytest.raises(kibotos.NotFoundError):
        processes.signal("no-such-tag")
    with pytest.raises(ValueError):
        processes.signal("echo", 0)


def test_foreground_processes_and_terminals(access: kibotos.WorkspaceAccess) -> None:
    processes = access.processes
    result = processes.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, b"out\n", b"err\n", False)
    assert processes.run(shell='echo "$GREETING" from $(pwd)', env={"GREETING": "hi"}, cwd="/tmp").stdout == (
        b"hi from /tmp\n"
    )
    assert processes.run(["cat"], stdin=b"\x00binary\xff").stdout == b"\x00binary\xff"
    assert processes.run(["id", "-u"], user="65534").stdout == b"65534\n"
    # A terminal: its size, resized while it runs; output as "pty".
    with processes.start(["sh", "-c", "stty size; read x; stty size"], pty=(5, 20), background=False) as shell:
        events = iter(shell)
        assert _output(events, b"\n").strip() == b"5 20"
        processes.resize(shell, 7, 30)
        processes.send_input(shell, b"\n")
        tail = b"".join(e.data for e in events if isinstance(e, kibotos.ProcessOutput))
        assert tail.split()[-2:] == [b"7", b"30"]
    with pytest.raises(kibotos.ConflictError):
        processes.resize(processes.start(["sleep", "5"]), 10, 10)  # no terminal
    # Closing a foreground handle kills its process.
    with processes.start(["sh", "-c", "echo up; sleep 61"], background=False, tag="fg") as foreground:
        assert _output(iter(foreground), b"up\n") == b"up\n"
    poll(lambda: not {p.tag: p for p in processes.list()}["fg"].running)
    with pytest.raises(ValueError):
        processes.start(["true"], shell="true")
    with pytest.raises(TypeError):
        processes.start("ls -l")


def test_the_async_access(server: ServerProcess, workspace: str, tmp_path: Path) -> None:
    async def go() -> None:
        async with kibotos.AsyncClient(server.address) as client:
            access = client.workspace_access(workspace)
            result = await access.processes.run(["sh", "-c", "echo async; exit 4"])
            assert (result.exit_code, result.stdout) == (4, b"async\n")
            started = await access.processes.start(["sh", "-c", "echo bg; sleep 62"], tag="async-bg")
            events = [e async for e in _first_output(access.processes.connect(started))]
            assert events == [kibotos.ProcessOutput("stdout", b"bg\n")]
            await access.processes.kill("async-bg")
            assert await access.files.write("/root/async.txt", b"awaited", parents=True) == 7
            assert await access.files.read("/root/async.txt") == b"awaited"
            (tmp_path / "tree").mkdir()
            (tmp_path / "tree" / "f").write_bytes(b"f" * 5000)
            await access.files.upload_dir("/root/async-tree", tmp_path / "tree")
            await access.files.download_dir("/root/async-tree", tmp_path / "back")
            assert (tmp_path / "back" / "f").read_bytes() == b"f" * 5000

    asyncio.run(go())


async def _first_output(events: AsyncIterator[kibotos.ProcessEvent]) -> AsyncIterator[kibotos.ProcessEvent]:
    async for event in events:
        yield event
        return


def test_cli_logs_stops_at_the_end_of_what_was_kept(server: ServerProcess, workspace: str) -> None:
    """`kibo workspace logs` without --follow prints what the workspace kept and stops there (the
    replay's end the server marks), even while the process writes on without a pause."""
    started = kibo(
        server, "workspace", "start-process", workspace, "--tag", "ticker", "--",
        "sh", "-c", "echo first; while :; do echo tick; done",
    )  # fmt: skip
    assert started.exit_code == 0, started.output
    try:
        poll(lambda: b"tick" in kibo_process(server, "workspace", "logs", workspace, "ticker").stdout)
        for _ in range(3):
            shown = subprocess.run(
                [*KIBO, "--server", server.address, "workspace", "logs", workspace, "ticker"],
                capture_output=True,
                timeout=20,
                check=False,
            )
            assert shown.returncode == 0, shown.stderr
            lines = shown.stdout.splitlines()
            # The last 128 KiB kept, in whole lines but perhaps the first (cut by the ring).
            assert set(lines[1:-1]) <= {b"first", b"tick"} and len(shown.stdout) <= 200 * 1024, lines[:3]
    finally:
        kibo(server, "workspace", "kill", workspace, "ticker", "--signal", "KILL")


def test_cli_processes(server: ServerProcess, workspace: str) -> None:
    started = kibo(
        server, "workspace", "start-process", workspace, "--tag", "web", "--",
        "sh", "-c", "echo line1; echo oops >&2; exec sleep 63",
    )  # fmt: skip
    assert started.exit_code == 0, started.output
    pid, tag = started.stdout.split()
    assert tag == "web" and int(pid) > 0
    shown = kibo(server, "workspace", "ps", workspace)
    assert shown.exit_code == 0 and any(
        line.split()[:3] == [pid, "web", "running"] for line in shown.stdout.splitlines()
    ), shown.stdout
    poll(lambda: kibo(server, "workspace", "logs", workspace, "web").stdout == "line1\n")
    assert kibo(server, "workspace", "logs", workspace, pid).stderr.startswith("oops\n")
    # --follow, in a real process: it waits for more until the process ends.
    follow = subprocess.Popen(
        [*KIBO, "--server", server.address, "workspace", "logs", workspace, "web", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == b"line1\n"
        time.sleep(0.3)
        assert follow.poll() is None
        killed = kibo(server, "workspace", "kill", workspace, "web", "--signal", "INT")
        assert killed.exit_code == 0 and "SIGINT sent to web" in killed.stderr
        _, err = follow.communicate(timeout=20)
        assert follow.returncode == 0 and b"web was killed by SIGINT (exit code 130)" in err
    finally:
        follow.kill()
    assert "killed (SIGINT)" in kibo(server, "workspace", "ps", workspace).stdout
    # Usage errors before any call, and a process that does not exist.
    assert kibo(server, "workspace", "kill", workspace, "web", "--signal", "NOPE").exit_code == ExitCode.USAGE
    assert kibo(server, "workspace", "start-process", workspace).exit_code == ExitCode.USAGE
    assert kibo(server, "workspace", "kill", workspace, "no-such").exit_code == ExitCode.NOT_FOUND
    shell_line = kibo(server, "workspace", "start-process", workspace, "-o", "json", "--shell", "exit 9")
    assert shell_line.exit_code == 0 and '"pid"' in shell_line.stdout


# -- files ----------------------------------------------------------------------------------------


def test_files_by_the_sdk(access: kibotos.WorkspaceAccess, tmp_path: Path) -> None:
    files = access.files
    files.make_dir("/root/sdk/a/b", parents=True)
    files.make_dir("/root/sdk/a/b", parents=True)  # exists: no error with parents
    with pytest.raises(kibotos.KiboError):
        files.make_dir("/root/sdk/a")
    assert files.write("/root/sdk/a/b/note.txt", b"hello", mode=0o600) == 5
    info = files.stat("/root/sdk/a/b/note.txt")
    assert (info.type, info.size, info.mode & 0o777, info.owner) == (dp.FILE_TYPE_FILE, 5, 0o600, "root")
    listing = files.list_dir("/root/sdk", depth=3)
    assert sorted(e.path for e in listing.entries) == ["/root/sdk/a", "/root/sdk/a/b", "/root/sdk/a/b/note.txt"]
    assert not listing.truncated
    files.move("/root/sdk/a/b/note.txt", "/root/sdk/moved.txt")
    assert files.read("/root/sdk/moved.txt") == b"hello"
    with pytest.raises(kibotos.NotFoundError):
        files.stat("/root/sdk/a/b/note.txt")
    with pytest.raises(kibotos.KiboError):
        files.remove("/root/sdk/a")  # not empty
    files.remove("/root/sdk/a", recursive=True)
    assert [e.name for e in files.list_dir("/root/sdk").entries] == ["moved.txt"]
    with pytest.raises(kibotos.InvalidArgumentError) as relative:
        files.stat("relative/path")
    assert relative.value.field == "path"

    # A large file, streamed both ways from and to file objects, with progress.
    big = tmp_path / "big.bin"
    with big.open("wb") as out:
        for _ in range(24):
            out.write(os.urandom(1 << 20))
    calls: list[tuple[int, int | None]] = []
    assert files.upload("/root/sdk/big.bin", big, progress=lambda done, total: calls.append((done, total))) == 24 << 20
    assert len(calls) >= 12 and calls[-1] == (24 << 20, 24 << 20)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    back = tmp_path / "back.bin"
    with back.open("wb") as target:
        assert files.download("/root/sdk/big.bin", target) == 24 << 20
    assert _digest(back) == _digest(big)
    # From an offset (a resumed download), into a path.
    part = tmp_path / "part.bin"
    part.write_bytes(big.read_bytes()[: 5 << 20])
    assert files.download("/root/sdk/big.bin", part, offset=5 << 20) == 19 << 20
    assert _digest(part) == _digest(big)
    # A source that fails half-way: the upload is cancelled, nothing is left in the guest.
    for _ in range(6):  # more than the uploads one workspace may hold at once (4)
        with pytest.raises(OSError, match="the disk broke"):
            files.upload("/root/sdk/broken.bin", io.BufferedReader(_Failing(5 << 20)))
    assert sorted(e.name for e in files.list_dir("/root/sdk").entries) == ["big.bin", "moved.txt"]


class _Failing(io.RawIOBase):
    """A file object that gives `size` bytes, then fails."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self.left <= 0:
            raise OSError("the disk broke")
        count = min(len(buffer), self.left)
        buffer[:count] = b"z" * count
        self.left -= count
        return count


def _tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (root / "src" / "data.bin").write_bytes(os.urandom(3 << 20))
    (root / "src" / "empty").mkdir()
    (root / "src" / "run.sh").write_text("#!/bin/sh\n")
    (root / "src" / "run.sh").chmod(0o755)
    (root / "src" / "link-rel").symlink_to("pkg/mod.py")
    (root / "src" / "link-abs").symlink_to("/etc/hostname")
    (root / "src" / "link-dir").symlink_to("pkg")


def _same_tree(left: Path, right: Path) -> None:
    for path in sorted(left.rglob("*")):
        other = right / path.relative_to(left)
        assert path.is_symlink() == other.is_symlink(), path
        if path.is_symlink():
            assert os.readlink(path) == os.readlink(other), path
        elif path.is_dir():
            assert other.is_dir(), path
        else:
            assert path.read_bytes() == other.read_bytes(), path
            assert path.stat().st_mode & 0o777 == other.stat().st_mode & 0o777, path
    assert len(list(left.rglob("*"))) == len(list(right.rglob("*")))


def test_cli_cp_of_a_tree_with_symlinks_both_ways(
    server: ServerProcess, workspace: str, access: kibotos.WorkspaceAccess, tmp_path: Path
) -> None:
    _tree(tmp_path)
    up = kibo(server, "workspace", "cp", str(tmp_path / "src"), f"{workspace}:/root/tree")
    assert up.exit_code == 0, up.output
    # In the guest the links are links, as written (the absolute one not followed on the host).
    guest = access.processes.run(["sh", "-c", "cd /root/tree && readlink link-rel link-abs link-dir && ls"])
    assert guest.stdout.split() == [
        b"pkg/mod.py", b"/etc/hostname", b"pkg", b"data.bin", b"empty", b"link-abs", b"link-dir", b"link-rel",
        b"pkg", b"run.sh",
    ]  # fmt: skip
    # Into an existing directory it keeps its name.
    assert kibo(server, "workspace", "cp", str(tmp_path / "src"), f"{workspace}:/root/tree").exit_code == 0
    assert access.files.stat("/root/tree/src/pkg/mod.py").size == 12
    # And back: a new local directory, then into an existing one.
    down = kibo(server, "workspace", "cp", f"{workspace}:/root/tree", str(tmp_path / "copy"))
    assert down.exit_code == 0, down.output
    (tmp_path / "copy" / "src").rename(tmp_path / "nested")  # the second upload's, compared below
    _same_tree(tmp_path / "src", tmp_path / "copy")
    _same_tree(tmp_path / "src", tmp_path / "nested")
    into = tmp_path / "into"
    into.mkdir()
    assert kibo(server, "workspace", "cp", f"{workspace}:/root/tree/pkg", str(into)).exit_code == 0
    assert (into / "pkg" / "mod.py").read_text() == "print('hi')\n"
    # A directory to stdout is a tar stream.
    tarred = subprocess.run(
        [*KIBO, "--server", server.address, "workspace", "cp", f"{workspace}:/root/tree/pkg", "-"],
        capture_output=True,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(tarred.stdout)) as archive:
        assert sorted(archive.getnames()) == ["mod.py"]


def test_cli_cp_of_a_large_file_both_ways(server: ServerProcess, workspace: str, tmp_path: Path) -> None:
    big = tmp_path / "large.bin"
    with big.open("wb") as out:
        for _ in range(64):
            out.write(os.urandom(1 << 20))
    big.chmod(0o640)
    up = subprocess.run(
        [*KIBO, "--server", server.address, "workspace", "cp", str(big), f"{workspace}:/root/"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0 and b"/root/large.bin: 67108864 bytes written" in up.stderr, up.stderr
    listed = kibo(server, "workspace", "ls", workspace, "/root", "-l")
    row = next(line for line in listed.stdout.splitlines() if line.endswith("large.bin"))
    assert row.split()[:4] == ["-rw-r-----", "root", "root", "67108864"], row
    down = subprocess.run(
        [*KIBO, "--server", server.address, "workspace", "cp", f"{workspace}:/root/large.bin", str(tmp_path / "got")],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert down.returncode == 0, down.stderr
    assert _digest(tmp_path / "got") == _digest(big)
    assert not list(tmp_path.glob(".*tmp"))


def test_cli_file_commands(server: ServerProcess, workspace: str) -> None:
    ws = ("workspace",)
    assert kibo(server, *ws, "mkdir", workspace, "/root/cli/deep/er", "-p").exit_code == 0
    assert kibo(server, *ws, "cp", "-", f"{workspace}:/root/cli/deep/a.txt", input="from stdin").exit_code == 0
    assert kibo(server, *ws, "cp", f"{workspace}:/root/cli/deep/a.txt", "-").stdout == "from stdin"
    listed = kibo(server, *ws, "ls", workspace, "/root/cli", "--depth", "3")
    assert listed.stdout.split() == ["deep/", "deep/a.txt", "deep/er/"], listed.output
    stat_json = kibo(server, *ws, "stat", workspace, "/root/cli/deep/a.txt", "-o", "json")
    assert '"size": "10"' in stat_json.stdout and '"FILE_TYPE_FILE"' in stat_json.stdout
    assert kibo(server, *ws, "mv", workspace, "/root/cli/deep/a.txt", "/root/cli/b.txt").exit_code == 0
    assert kibo(server, *ws, "rm", workspace, "/root/cli/deep").exit_code != 0  # not empty
    assert kibo(server, *ws, "rm", workspace, "/root/cli/deep", "-r").exit_code == 0
    assert kibo(server, *ws, "ls", workspace, "/root/cli").stdout.split() == ["b.txt"]
    assert kibo(server, *ws, "stat", workspace, "/root/cli/deep").exit_code == ExitCode.NOT_FOUND
    assert kibo(server, *ws, "ls", workspace, "relative").exit_code == ExitCode.USAGE
    assert kibo(server, *ws, "mkdir", workspace, "/root/x", "--mode", "999").exit_code == ExitCode.USAGE


def test_watch_by_the_sdk_and_the_cli(server: ServerProcess, workspace: str, access: kibotos.WorkspaceAccess) -> None:
    files = access.files
    files.make_dir("/root/watched", parents=True)
    events = files.watch_dir("/root/watched", recursive=True)
    assert next(events) == kibotos.WatchReady()
    files.make_dir("/root/watched/sub")
    files.write("/root/watched/sub/f", b"x")
    files.move("/root/watched/sub/f", "/root/watched/g")
    files.remove("/root/watched/g")
    seen: list[tuple[str, str]] = []
    for event in events:
        assert isinstance(event, kibotos.FileChange)
        seen.append((event.kind, event.path))
        if event.kind == "remove" and event.path == "/root/watched/g":
            break
    events.close()
    kinds = [kind for kind, _ in seen]
    assert kinds[0] == "create" and seen[0][1] == "/root/watched/sub"
    assert kinds.index("rename") < kinds.index("remove")
    # The CLI: a line a change, after its "watching" line on stderr.
    watch = subprocess.Popen(
        [*KIBO, "--server", server.address, "workspace", "watch", workspace, "/root/watched"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert watch.stderr is not None and watch.stdout is not None
        assert watch.stderr.readline().startswith(b"watching")
        files.make_dir("/root/watched/new")
        assert watch.stdout.readline() == b"create/ /root/watched/new\n"
    finally:
        watch.send_signal(signal.SIGINT)
        watch.communicate(timeout=10)
