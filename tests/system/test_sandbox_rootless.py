"""The rootless sandbox: `kibo-ctrl serve` run by an unprivileged user (the README's first
command without root) runs real, hardened guests.

The server runs as uid/gid 65534 (nobody, no supplementary groups: `setpriv`) from a venv
of the system's /usr/bin/python3 (a python that user may execute), whose site path is this
test run's installed packages and the repository (so the code under test is this checkout's,
and nothing is downloaded). What the tests check happens in real guests through the data
plane, as a tenant's code would see it. Needs root (to become nobody) and bubblewrap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S
from tests.server import ServerProcess, free_port
from tests.system.test_process_runtime import (
    DataPlane,
    create,
    instance_dir,
    processes,
    text,
    tiny_image,
    wait_until,
    wait_workspace,
)

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
STATUS_ZERO = "0000000000000000"


def _require() -> None:
    assert os.geteuid() == 0, "these tests become an unprivileged user (setpriv): run them as root"
    assert shutil.which("bwrap"), "bubblewrap is missing: apt-get install -y bubblewrap"
    assert shutil.which("setpriv"), "setpriv (util-linux) is missing"
    assert os.access(SYSTEM_PYTHON, os.X_OK), f"{SYSTEM_PYTHON} is missing"


def _venv_for_nobody(directory: Path) -> Path:
    """A venv of the system python whose site path adds this run's packages (readable by
    anyone) and the repository's server code: the cheapest python that uid 65534 can run
    with exactly the code under test."""
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=60)
    [site] = list(directory.glob("lib/python3*/site-packages"))
    ours = Path(sysconfig.get_paths()["purelib"])
    repo_server = Path(__file__).resolve().parents[2] / "server"
    # A .pth line that starts with `import` is run: addsitedir also processes that directory's
    # own .pth files (the editable install's paths); this checkout's server code goes first.
    (site / "kibo-under-test.pth").write_text(
        f"import site, sys; site.addsitedir({str(ours)!r}); sys.path.insert(0, {str(repo_server)!r})\n"
    )
    python = directory / "bin" / "python"
    probe = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    check = subprocess.run(
        [*probe, str(python), "-c", "import kibo_ctrl.cli, grpc; print(kibo_ctrl.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, f"uid {NOBODY} cannot run the code under test: {check.stderr[-2000:]}"
    assert check.stdout.startswith(str(repo_server)), check.stdout
    return python


@dataclass
class RootlessServer(ServerProcess):
    """`kibo-ctrl serve` as uid/gid 65534 without supplementary groups."""

    python: Path = Path(SYSTEM_PYTHON)
    home: Path = Path("/nonexistent")
    path_env: str = "/usr/local/bin:/usr/bin:/bin"
    runtime_dir: Path | None = None  # $XDG_RUNTIME_DIR (None: unset)
    # How the server becomes that user (the command in front of the server's).
    become: tuple[str, ...] = ()

    def start(self, timeout: float = 30.0) -> RootlessServer:
        self.log_path = self.data_dir.parent / "server.log"
        setpriv = shutil.which("setpriv") or "setpriv"
        command = [
            *(self.become or (setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--")),
            str(self.python),
            "-m",
            "kibo_ctrl",
            "serve",
            "--listen",
            self.address,
            "--http-listen",
            self.http_address,
            "--data-dir",
            str(self.data_dir),
            "--insecure-no-auth",
            "--log-level",
            "info",
            *self.flags,
        ]
        # The environment of a fresh login of that user: no root's paths (without
        # XDG_RUNTIME_DIR the stage directory goes into the data directory).
        env = {
            "PATH": self.path_env,
            "HOME": str(self.home),
            "XDG_STATE_HOME": str(self.home / "state"),
            "GRPC_ENABLE_FORK_SUPPORT": "false",
        }
        if self.runtime_dir is not None:
            env["XDG_RUNTIME_DIR"] = str(self.runtime_dir)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.home)
        self._wait_serving(timeout)
        return self


@pytest.fixture(scope="module")
def nobody_root() -> Iterator[tuple[Path, Path]]:
    """A directory of uid 65534's (its home and data directory) and the venv it runs."""
    _require()
    top = Path(tempfile.mkdtemp(prefix="kibo-rootless-"))
    top.chmod(0o755)
    try:
        python = _venv_for_nobody(top / "venv")
        home = top / "home"
        home.mkdir()
        os.chown(home, NOBODY, NOBODY)
        yield home, python
    finally:
        for pid in processes(str(top)):
            os.kill(pid, 9)
        shutil.rmtree(top, ignore_errors=True)


FLAGS = ("--runtime", "process", "--settle-ms", "3000", "--stop-grace-ms", "2000")


@pytest.fixture(scope="module")
def rootless_server(nobody_root: tuple[Path, Path]) -> Iterator[RootlessServer]:
    home, python = nobody_root
    server = RootlessServer(home / "data", FLAGS, port=free_port(), python=python, home=home)
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.kill()


@pytest.fixture
async def rc(rootless_server: RootlessServer) -> AsyncIterator[Client]:
    async with Client.connect(rootless_server.address) as connected:
        yield connected


def guest_processes(server: ServerProcess, workspace: wp.Workspace) -> list[tuple[int, int]]:
    """(PID, start time) of the guest's sandbox (bwrap) and entry process, from state.json."""
    found = json.loads((instance_dir(server, workspace) / "state.json").read_text())
    guest = (int(found["guest_pid"]), int(found["guest_start"]))
    return [guest, (int(found["sandbox_pid"]), start_time(int(found["sandbox_pid"])))]


def running(pid: int, start: int) -> bool:
    try:
        return start_time(pid) == start
    except (OSError, ValueError):
        return False


def start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def status_fields(status: bytes) -> dict[str, str]:
    lines = status.decode().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


async def test_a_rootless_server_runs_hardened_guests(rc: Client, rootless_server: RootlessServer) -> None:
    server = rootless_server
    capabilities = set((await rc.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities)
    assert {"runtime.process.isolation.bwrap-rootless", "runtime.process.storage.unlimited"} <= capabilities
    assert "runtime.process.limits.rlimit" in capabilities
    assert "runtime.process.isolation.bwrap" not in capabilities  # not the root sandbox's boundary
    assert "runtime.process.unisolated" not in capabilities
    assert "a guest that escapes the sandbox gets that user's files" in server.log()

    workspace = await create(rc)
    guests = guest_processes(server, workspace)
    data = DataPlane(rc)
    credential = await data.credential(workspace.workspace_id)

    # The guest's processes, data-plane commands included: no capability, no_new_privs, the
    # seccomp filter; the guest's root is the server's uid and nothing else.
    code, out, err = await data.exec(credential, "cat", "/proc/self/status")
    assert code == 0, err
    status = status_fields(out)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[name] == STATUS_ZERO, (name, status[name])
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    assert status["Uid"].split() == ["0"] * 4
    code, out, _ = await data.exec(credential, "cat", "/proc/self/uid_map", "/proc/self/gid_map")
    assert code == 0 and [line.split() for line in out.decode().splitlines()] == [["0", "65534", "1"]] * 2
    # The guest's init too (bwrap is PID 1, the agent PID 2).
    code, out, _ = await data.exec(credential, "cat", "/proc/2/status")
    init = status_fields(out)
    assert code == 0 and init["CapEff"] == init["CapBnd"] == STATUS_ZERO and init["Seccomp"] == "2"
    # Kernel tunables stay read-only (a pipe in core_pattern would run as host root).
    before = text("/proc/sys/kernel/core_pattern")
    code, _, err = await data.exec(credential, "sh", "-c", "echo '|/tmp/evil' > /proc/sys/kernel/core_pattern")
    assert code != 0 and b"Read-only" in err, err
    assert text("/proc/sys/kernel/core_pattern") == before
    # /run/kibo is a small tmpfs of its own, not a directory of the data dir.
    assert await data.exec(credential, "stat", "-f", "-c", "%T", "/run/kibo") == (0, b"tmpfs\n", b"")
    # No nested user namespace (it would give back a full capability set): the seccomp filter
    # refuses the call (EPERM: not a missing command's 127), and the guest's user namespace
    # allows none anyway (user.max_user_namespaces is 0 there: ENOSPC without the filter).
    assert (await data.exec(credential, "sh", "-c", "command -v unshare"))[0] == 0
    code, _, err = await data.exec(credential, "unshare", "-U", "true")
    assert code == 1 and b"Operation not permitted" in err, (code, err)
    assert await data.exec(credential, "cat", "/proc/sys/user/max_user_namespaces") == (0, b"0\n", b"")

    # /data survives a stop and a start; what the guest writes there is the server user's.
    await data.write(credential, "/data/kept.txt", b"across a stop")
    volume = server.data_dir / "volumes" / next(b.volume_id for b in workspace.spec.volumes if b.mount_path == "/data")
    assert (volume / "kept.txt").stat().st_uid == NOBODY
    await rc.stop(workspace.workspace_id)
    await wait_workspace(rc, workspace.workspace_id, lambda w: w.state == S.WORKSPACE_STATE_STOPPED, within=20)
    assert not processes(f"instances/{workspace.workspace_id}-g")
    await rc.start(workspace.workspace_id)
    await wait_workspace(rc, workspace.workspace_id, lambda w: w.state == S.WORKSPACE_STATE_AVAILABLE, within=30)
    again = await rc.get(workspace.workspace_id)
    guests += guest_processes(server, again)
    fresh = await data.credential(workspace.workspace_id)
    assert await data.read(fresh, "/data/kept.txt") == b"across a stop"

    # Delete leaves nothing: no layer, volume, instance or process, even where the guest made
    # its directories unreadable and unwritable (the server's user has no CAP_DAC_OVERRIDE).
    locks = "for d in /root/locked /data/locked /run/kibo/locked; do "
    locks += "mkdir -p $d/in && touch $d/in/f && chmod 0 $d/in $d; done"
    assert (await data.exec(fresh, "sh", "-c", locks))[0] == 0
    assert (volume / "locked").stat().st_mode & 0o777 == 0
    deleted = await rc.delete(workspace.workspace_id)
    assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
    layer = server.data_dir / "layers" / workspace.workspace_id
    await wait_until(lambda: not layer.exists() and not volume.exists(), within=20)
    await wait_until(lambda: not list((server.data_dir / "instances").iterdir()), within=20)
    assert not processes(str(server.data_dir / "instances"))

    # The server stops cleanly and leaves no process behind (the guests' command lines name
    # no host path: they are checked by PID and start time).
    assert server.stop() == 0
    assert not processes(str(server.data_dir))
    assert not [pid for pid, start in guests if running(pid, start)]


async def test_without_bwrap_it_starts_and_each_launch_names_the_fix(nobody_root: tuple[Path, Path]) -> None:
    """A newcomer's machine without a working sandbox: the server starts (the README's first
    command works), says why at start-up, and every launch FAILS with the reason and the fix;
    no guest ever runs unisolated."""
    home, python = nobody_root
    bare = home / "bin"  # a PATH without bwrap
    bare.mkdir(exist_ok=True)
    server = RootlessServer(home / "data-nobwrap", FLAGS, port=free_port(), python=python, home=home)
    server.path_env = str(bare)
    server.start()
    try:
        assert "NO WORKSPACE CAN START ON THIS NODE" in server.log()
        assert "apt-get install bubblewrap" in server.log()
        async with Client.connect(server.address) as client:
            capabilities = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
            assert "runtime.process.isolation.unavailable" in capabilities
            assert not {"runtime.process.isolation.bwrap-rootless", "runtime.process.unisolated"} & set(capabilities)
            workspace = await client.create()
            assert workspace.state == S.WORKSPACE_STATE_FAILED, workspace
            reason = str(workspace)
            assert "bubblewrap is not installed (apt-get install bubblewrap)" in reason, reason
        assert server.stop() == 0
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()
    assert not processes(str(server.data_dir))


def test_the_user_namespace_blocker_names_its_sysctl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where unprivileged user namespaces are switched off, the error names the switch and
    the command that turns it on (the switches are data: userns.USERNS_SWITCHES)."""
    from kibo_ctrl.runtime.process import userns

    switch = tmp_path / "unprivileged_userns_clone"
    switch.write_text("0\n")
    fix = "sysctl -w kernel.unprivileged_userns_clone=1"
    monkeypatch.setattr(userns, "USERNS_SWITCHES", ((str(switch), "0", fix),))
    assert f"run `{fix}` as root" in userns.userns_blocker()
    switch.write_text("1\n")
    assert "user namespaces do not work here" in userns.userns_blocker()


async def test_a_rootless_guest_over_a_base_image(nobody_root: tuple[Path, Path]) -> None:
    """An overlaid base image, mounted by the unprivileged supervisor in its own user and
    mount namespaces. An image of the server user's own is the guest root's: a change goes
    into the workspace's layer, the image is untouched. (The stage directory is under
    $XDG_RUNTIME_DIR here.)"""
    home, python = nobody_root
    image = tiny_image(home / "image")
    for entry in [image, *image.rglob("*")]:
        os.chown(entry, NOBODY, NOBODY, follow_symlinks=False)
    flags = (*FLAGS, "--base-image", str(image))
    server = RootlessServer(home / "data-image", flags, port=free_port(), python=python, home=home)
    # A login's runtime directory (like /run/user/UID): the stage directory goes there.
    server.runtime_dir = home / "xdg-runtime"
    server.runtime_dir.mkdir(mode=0o700)
    os.chown(server.runtime_dir, NOBODY, NOBODY)
    server.start()
    try:
        assert (server.runtime_dir / "kibo-stage").is_dir()
        assert not (server.data_dir / "runtime" / "stage").exists()
        async with Client.connect(server.address) as client:
            workspace = await create(client)
            data = DataPlane(client)
            credential = await data.credential(workspace.workspace_id)
            assert await data.exec(credential, "cat", "/etc/image-release") == (0, b"tiny\n", b"")
            code, _, err = await data.exec(credential, "sh", "-c", "echo changed > /etc/image-release")
            assert code == 0, err
            assert await data.exec(credential, "cat", "/etc/image-release") == (0, b"changed\n", b"")
            assert (image / "etc" / "image-release").read_text() == "tiny\n"
            code, out, _ = await data.exec(credential, "cat", "/proc/self/status")
            assert code == 0 and status_fields(out)["CapEff"] == STATUS_ZERO
            deleted = await client.delete(workspace.workspace_id)
            assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
            layer = server.data_dir / "layers" / workspace.workspace_id
            await wait_until(lambda: not layer.exists(), within=20)
        assert server.stop() == 0
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()
    assert not processes(str(server.data_dir))


async def test_with_user_namespaces_switched_off_each_launch_names_the_sysctl(nobody_root: tuple[Path, Path]) -> None:
    """`user.max_user_namespaces = 0` (a per-user-namespace sysctl: set to 0 in a namespace of
    the test's own, so the host's stays as it is), the server as uid 65534 there: it starts,
    and every launch FAILS naming the sysctl and the command that fixes it."""
    home, python = nobody_root
    top = home.parent / "no-userns"  # host root's: the server's uid in that namespace
    top.mkdir(mode=0o755)
    drop = 'echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --inh-caps=-all --ambient-caps=-all -- "$@"'
    server = RootlessServer(top / "data", FLAGS, port=free_port(), python=python, home=top)
    unshare = shutil.which("unshare") or "unshare"
    server.become = (unshare, "--user", f"--map-user={NOBODY}", f"--map-group={NOBODY}", "--keep-caps")
    server.become += ("--", "sh", "-c", drop, "sh")
    server.start()
    try:
        fix = "sysctl -w user.max_user_namespaces=15000"
        assert "NO WORKSPACE CAN START ON THIS NODE" in server.log() and fix in server.log()
        async with Client.connect(server.address) as client:
            capabilities = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
            assert "runtime.process.isolation.unavailable" in capabilities
            workspace = await client.create()
            assert workspace.state == S.WORKSPACE_STATE_FAILED, workspace
            assert "user.max_user_namespaces = 0" in str(workspace) and fix in str(workspace), workspace
        assert server.stop() == 0
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()
    assert not processes(str(server.data_dir))
