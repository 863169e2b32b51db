"""`kibo workspace shell` and `exec --tty` as a person uses them: the real `kibo` in a real terminal
(a tmux pane of a fixed size, its own tmux server), driven by keys (send-keys) and read off the
screen (capture-pane), against a real `kibo-ctrl serve --runtime process`. Needs tmux, root and
bubblewrap (as tests/system/test_data_plane_client.py)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kibotos
import pytest
from kibo_cli.exit_codes import ExitCode
from kibo_cli.main import app
from typer.testing import CliRunner

from tests.server import ServerProcess
from tests.system.test_data_plane_client import create, delete, poll
from tests.system.test_process_runtime import sandbox_server

KIBO = [sys.executable, "-c", "from kibo_cli.main import main; main()"]


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


class Pane:
    """One tmux pane of its own tmux server (its own socket), running `command` at `size`; the
    pane stays after the command ends (remain-on-exit), so its exit status can be read."""

    def __init__(
        self, tmp_path: Path, command: str, size: tuple[int, int] = (30, 100), status_file: Path | None = None
    ) -> None:
        assert shutil.which("tmux"), "tmux is missing: apt-get install -y tmux"
        self.status_file = status_file
        self.socket = f"kibo-test-{os.getpid()}-{secrets.token_hex(4)}"
        # tmux makes tmux-<uid>/ under TMUX_TMPDIR (/tmp by default) and leaves it: one of ours.
        self.tmpdir = tempfile.mkdtemp(prefix="kibo-tmux-")
        self.env = {**os.environ, "TMUX_TMPDIR": self.tmpdir}
        config = tmp_path / f"{self.socket}.conf"
        config.write_text("set -g remain-on-exit on\nset -g history-limit 5000\n")
        rows, cols = size
        self.tmux("-f", str(config), "new-session", "-d", "-s", "t", "-x", str(cols), "-y", str(rows), command)

    def tmux(self, *arguments: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *arguments],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            env=self.env,
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")

    def wait_for(self, pattern: str, within: float = 15.0) -> re.Match[str]:
        deadline = time.monotonic() + within
        while True:
            found = re.search(pattern, self.screen())
            if found is not None:
                return found
            assert time.monotonic() < deadline, f"{pattern!r} not on the screen:\n{self.screen()}"
            time.sleep(0.05)

    def type(self, text: str, enter: bool = True) -> None:
        self.tmux("send-keys", "-t", "t", "-l", text)
        if enter:
            self.tmux("send-keys", "-t", "t", "Enter")

    def key(self, name: str) -> None:
        self.tmux("send-keys", "-t", "t", name)

    def dead_status(self, within: float = 15.0) -> int:
        """The pane's command's exit status, once it ended: tmux's #{pane_dead_status}, or what the
        command wrote to `status_file` (tmux 3.3 now and then leaves a pane's dead command
        unreaped, a zombie with no status, when it ends right after a child it waited for)."""
        deadline = time.monotonic() + within
        while True:
            shown = self.tmux("display-message", "-p", "-t", "t", "#{pane_dead} #{pane_dead_status}").split()
            if shown[0] == "1" and len(shown) == 2:  # (a live pane has no status)
                return int(shown[1])
            if shown[0] == "1" and self.status_file is not None and self.status_file.exists():
                return int(self.status_file.read_text())
            assert time.monotonic() < deadline, f"the pane's command did not end:\n{self.screen()}"
            time.sleep(0.05)

    def pid(self) -> int:
        return int(self.tmux("display-message", "-p", "-t", "t", "#{pane_pid}"))

    def kill(self) -> None:
        """End its tmux server, and remove its socket's directory (kill-server leaves the file)."""
        subprocess.run(
            ["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10, check=False, env=self.env
        )
        shutil.rmtree(self.tmpdir, ignore_errors=True)


@pytest.fixture
def panes(tmp_path: Path) -> Iterator[Callable[..., Pane]]:
    made: list[Pane] = []
    # tmux's default directory appears during these tests although every tmux call here names
    # its own (TMUX_TMPDIR): removed after, when it was not there before and is empty.
    default = Path(f"/tmp/tmux-{os.getuid()}")
    there_before = default.exists()

    def make(command: str, size: tuple[int, int] = (30, 100)) -> Pane:
        made.append(Pane(tmp_path, command, size, status_file=tmp_path / "status"))
        return made[-1]

    yield make
    for pane in made:
        pane.kill()
    # Nothing left behind: each tmux server is gone, and its socket.
    for pane in made:
        assert (
            subprocess.run(["tmux", "-L", pane.socket, "has-session"], capture_output=True, env=pane.env).returncode
            != 0
        )
        assert not Path(pane.tmpdir).exists(), pane.tmpdir
    if not there_before:
        with contextlib.suppress(OSError):
            default.rmdir()


def _kibo_line(server: ServerProcess, *arguments: str, tmp_path: Path) -> str:
    """A pane's command: kibo between two snapshots of the terminal's settings (stty -g), so the
    test sees whether kibo left the terminal as it found it; exits with kibo's exit status (and
    writes it to tmp_path/status)."""
    kibo = shlex.join([*KIBO, "--server", server.address, *arguments])
    before, after, status = tmp_path / "stty.before", tmp_path / "stty.after", tmp_path / "status"
    for stale in (before, after, status):
        stale.unlink(missing_ok=True)
    script = f"stty -g >{before}; {kibo}; status=$?; stty -g >{after}; echo $status >{status}; exit $status"
    return shlex.join(["sh", "-c", script])


def _settings_kept(tmp_path: Path) -> bool:
    return (tmp_path / "stty.before").read_text() == (tmp_path / "stty.after").read_text()


def _guest_processes(server: ServerProcess, workspace: str) -> list[int]:
    with kibotos.Client(server.address) as client:
        return [p.pid for p in client.workspace_access(workspace).processes.list() if p.running]


def test_a_shell_in_a_terminal(
    server: ServerProcess, workspace: str, tmp_path: Path, panes: Callable[..., Pane]
) -> None:
    pane = panes(_kibo_line(server, "workspace", "shell", workspace, tmp_path=tmp_path), size=(30, 100))
    # Its prompt, then a command's answer.
    pane.wait_for(r"[#$] $|[#$] \n")
    pane.type("echo marker-$((6 * 7))")
    pane.wait_for(r"marker-42")
    # Its terminal has the pane's size, and follows the pane's resize (SIGWINCH -> Resize).
    pane.type("stty size")
    pane.wait_for(r"\n30 100\s")
    pane.tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
    deadline = time.monotonic() + 10
    while "40 120" not in pane.screen():
        assert time.monotonic() < deadline, pane.screen()
        pane.type("stty size")
        time.sleep(0.2)
    # Ctrl-C goes to the guest: it interrupts `sleep 30`, and the shell answers again at once.
    pane.type("sleep 30; echo not-interrupted")
    time.sleep(0.5)
    started = time.monotonic()
    pane.key("C-c")
    pane.type("echo after-$((1 + 1))")
    pane.wait_for(r"after-2")
    assert time.monotonic() - started < 10
    assert not re.search(r"^not-interrupted", pane.screen(), re.MULTILINE)  # (only its command line)
    # `exit 3`: kibo exits 3, with the terminal's settings as it found them.
    pane.type("exit 3")
    assert pane.dead_status() == 3
    assert _settings_kept(tmp_path)
    assert not _guest_processes(server, workspace)


def test_exec_tty_and_a_shell_ended_by_sigterm(
    server: ServerProcess, workspace: str, tmp_path: Path, panes: Callable[..., Pane]
) -> None:
    # exec --tty: the command on a terminal of the pane's size; its exit code passes through.
    line = _kibo_line(
        server,
        "workspace",
        "exec",
        "--tty",
        workspace,
        "--",
        "sh",
        "-c",
        "test -t 0 && test -t 1 && echo on-a-terminal; stty size; exit 5",
        tmp_path=tmp_path,
    )
    pane = panes(line, size=(20, 70))
    assert pane.dead_status() == 5
    assert re.search(r"on-a-terminal\s+20 70", pane.screen()), pane.screen()
    assert _settings_kept(tmp_path)
    # Its --timeout: the command is killed then, and kibo exits 124 (as exec without a terminal).
    started = time.monotonic()
    line = _kibo_line(
        server, "workspace", "exec", "-t", "--timeout", "1s", workspace, "--", "sleep", "30", tmp_path=tmp_path
    )
    assert panes(line).dead_status() == 124
    assert time.monotonic() - started < 10 and _settings_kept(tmp_path)

    # A SIGTERM to kibo: the terminal restored, exit 128 + 15, the guest's shell killed.
    pane = panes(_kibo_line(server, "workspace", "shell", workspace, tmp_path=tmp_path))
    pane.wait_for(r"[#$] $|[#$] \n")
    (kibo_pid,) = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(pane.pid())]).split()]
    assert _guest_processes(server, workspace)
    os.kill(kibo_pid, signal.SIGTERM)
    assert pane.dead_status() == 128 + signal.SIGTERM
    assert _settings_kept(tmp_path)
    poll(lambda: not _guest_processes(server, workspace))


def test_a_shell_needs_a_terminal(server: ServerProcess, workspace: str) -> None:
    for arguments in (["shell", workspace], ["exec", "--tty", workspace, "--", "true"]):
        refused = CliRunner().invoke(app, ["--server", server.address, "workspace", *arguments], input="ls\n")
        assert refused.exit_code == ExitCode.USAGE, refused.output
        assert "needs a terminal" in refused.stderr


def test_cp_shows_its_progress_on_a_terminal(
    server: ServerProcess, workspace: str, tmp_path: Path, panes: Callable[..., Pane]
) -> None:
    """The progress line while the upload waits for more input (stdin pauses after 6 MiB), and
    the last line when done."""
    kibo = shlex.join([*KIBO, "--server", server.address, "workspace", "cp", "-", f"{workspace}:/root/progress.bin"])
    feed = "head -c 6291456 /dev/zero; sleep 3; head -c 1048576 /dev/zero"
    status = tmp_path / "status"
    pane = panes(shlex.join(["sh", "-c", f"({feed}) | {kibo}; s=$?; echo $s >{status}; exit $s"]))
    shown = pane.wait_for(r"progress\.bin: (\d+\.\d) MiB, [\d.]+ MiB/s")
    assert float(shown.group(1)) >= 2.0
    assert pane.dead_status() == 0
    pane.wait_for(r"7340032 bytes written \(7\.0 MiB in")
