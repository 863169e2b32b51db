"""The process runtime on real sandboxes: bubblewrap namespaces, cgroups, supervisors.

Each test drives a real `kibo-ctrl serve --runtime process` over gRPC and checks what it
did on the machine: processes, namespaces, cgroups and files. Needs root and bubblewrap
(`apt-get install -y bubblewrap`); it fails with that message when bwrap is missing.

What a process in the guest would do is done from the host through /proc/PID/root (the
guest's filesystem view), and guest-side requests (reboot, power-off) are the signals the
guest's own /run/kibo/bin/reboot and /run/kibo/bin/poweroff send to its agent."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S, error_of, meta
from tests.server import ServerProcess

SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED
CONFIRMED = wp.STOP_DURABILITY_CONFIRMED
UNCONFIRMED = wp.STOP_DURABILITY_UNCONFIRMED
# Sandboxes take real time to start and stop; the default settle window is for the simulator.
# (Several default-size workspaces at once, 10 GiB layer + 10 GiB volume, sparse, fit: a node
# counts real free space, and its declared capacities against 10 x its disk: storage.py.)
FLAGS = (
    "--runtime",
    "process",
    "--sandbox",
    "bwrap",
    "--settle-ms",
    "3000",
    "--stop-grace-ms",
    "2000",
    # These tests are of supervisors of their own (their processes, their mount namespaces);
    # the node supervisor's are test_process_node_supervisor.py.
    "--supervisor",
    "instance",
)
SMALL = wp.Resources(vcpus=1, memory_mib=128)


def _require_sandbox() -> None:
    assert shutil.which("bwrap"), "bubblewrap is missing: apt-get install -y bubblewrap (the process runtime needs it)"
    assert os.geteuid() == 0, "the process runtime tests run sandboxes with cgroups: run them as root"


# -- what is on the machine -------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def text(path: str | Path) -> str:
    return Path(path).read_text()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def processes(needle: str) -> list[int]:
    """Live processes whose command line contains `needle`."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [pid for pid in pids if needle in _cmdline(pid) and _alive(pid)]


def supervisor_processes(needle: str) -> list[int]:
    """The supervisors among processes(needle): not their children, which carry the same
    command line between a fork and an exec (the guest-to-be, mount, mkfs...)."""
    found = set(processes(needle))
    return sorted(pid for pid in found if _parent(pid) not in found)


def instance_dir(server: ServerProcess, workspace: wp.Workspace) -> Path:
    return server.data_dir / "instances" / f"{workspace.workspace_id}-g{workspace.execution_generation}"


def state(server: ServerProcess, workspace: wp.Workspace) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((instance_dir(server, workspace) / "state.json").read_text())
    return data


def agent_pid(server: ServerProcess, workspace: wp.Workspace) -> int:
    pid = int(state(server, workspace)["guest_pid"])
    assert pid > 0 and _alive(pid)
    return pid


def supervisors(server: ServerProcess, workspace: wp.Workspace) -> list[int]:
    return supervisor_processes(f"supervisor.py {instance_dir(server, workspace)}")


def guest_path(server: ServerProcess, workspace: wp.Workspace, path: str) -> Path:
    """A path as the guest sees it (through its root, from the host)."""
    return Path(f"/proc/{agent_pid(server, workspace)}/root") / path.lstrip("/")


def volume_dir(server: ServerProcess, workspace: wp.Workspace) -> Path:
    data = next(b for b in workspace.spec.volumes if b.mount_path == "/data")
    return server.data_dir / "volumes" / data.volume_id


def on_volume(server: ServerProcess, workspace: wp.Workspace) -> Path:
    """The /data volume's files from the host: in its image, mounted in the supervisor's
    mount namespace (seen through /proc/PID/root); a plain directory without images."""
    volume = volume_dir(server, workspace)
    if not (volume / "volume.img").exists():
        return volume
    [supervisor] = supervisors(server, workspace)
    return Path(f"/proc/{supervisor}/root") / str(volume / "mnt").lstrip("/")


def reap(data_dir: Path) -> None:
    """Teardown: no supervisor, guest process or cgroup of this data directory outlives the tests."""
    for pid in processes(f"supervisor.py {data_dir}"):  # the node supervisor's command line too
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while processes(f"{data_dir}/instances") and time.monotonic() < deadline:
        time.sleep(0.02)
    # The runtime's cgroups: kibo-<tag> under this process's cgroup (v1) or at the root.
    tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]
    candidates = {Path("/sys/fs/cgroup") / f"kibo-{tag}"}
    for line in text("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else []:
            hierarchy = Path("/sys/fs/cgroup") / controller.removeprefix("name=")
            candidates |= {hierarchy / f"kibo-{tag}", hierarchy / path.lstrip("/") / f"kibo-{tag}"}
    for parent in (c for c in candidates if c.is_dir()):
        for child in (c for c in parent.iterdir() if c.is_dir()):
            with contextlib.suppress(OSError):
                for stray in (child / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(stray), signal.SIGKILL)
            deadline = time.monotonic() + 2
            while child.exists() and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    child.rmdir()
                time.sleep(0.01)
        with contextlib.suppress(OSError):
            parent.rmdir()
    # Its guests' network slots, nftables table and address claim (runtime/process/network/).
    from kibo_ctrl.runtime.process import network

    network.reap(data_dir)


@contextlib.contextmanager
def sandbox_server(server_factory: Callable[..., ServerProcess], *flags: str) -> Iterator[ServerProcess]:
    """A process-runtime server (FLAGS + `flags`) for a module's tests: it needs the sandbox,
    and after its stop no supervisor, guest or cgroup of its data dir is left (reap)."""
    _require_sandbox()
    server = server_factory(*FLAGS, *flags)
    try:
        yield server
        server.stop()
    finally:
        reap(server.data_dir)


def cgroups_left(data_dir: Path) -> list[str]:
    """The instance cgroups of this data directory that still exist."""
    found = []
    for spec in data_dir.glob("instances/*/spec.json"):
        found += [d for d in json.loads(spec.read_text()).get("cgroup_dirs", []) if Path(d).exists()]
    return found


async def wait_until(check: Callable[[], bool], within: float = 10.0) -> None:
    import asyncio

    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def wait_workspace(
    client: Client, workspace_id: str, check: Callable[[wp.Workspace], bool], within: float = 10.0
) -> wp.Workspace:
    """Poll the workspace until `check` holds."""
    import asyncio

    deadline = time.monotonic() + within
    while not check(current := await client.get(workspace_id)):
        assert time.monotonic() < deadline, f"timed out; the workspace is {current}"
        await asyncio.sleep(0.02)
    return current


async def command_of(client: Client, response: Any) -> command_pb2.WorkspaceCommand:
    """The command of a response, once terminal."""
    import asyncio

    command: command_pb2.WorkspaceCommand = response.command
    deadline = time.monotonic() + 15
    while command.state not in (SUCCEEDED, command_pb2.COMMAND_STATE_FAILED):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
        command = await client.command(command.command_id)
    return command


class DataPlane:
    """The data plane as a client uses it: a credential, then commands and files."""

    def __init__(self, client: Client) -> None:
        assert client.channel is not None
        self.stub = dp_grpc.DataPlaneServiceStub(client.channel)  # type: ignore[no-untyped-call]

    async def credential(self, workspace_id: str) -> str:
        request = dp.IssueDataPlaneCredentialRequest(workspace_id=workspace_id)
        return str((await self.stub.IssueDataPlaneCredential(request)).credential)

    async def exec(self, credential: str, *argv: str, stdin: bytes = b"", limit: int = 0) -> tuple[int, bytes, bytes]:
        request = dp.ExecWorkspaceCommandRequest(
            credential=credential, argv=list(argv), stdin=stdin, timeout_seconds=limit
        )
        out, err, code = b"", b"", -1
        async for response in self.stub.ExecWorkspaceCommand(request):
            kind = response.WhichOneof("output")
            if kind == "stdout":
                out += response.stdout
            elif kind == "stderr":
                err += response.stderr
            else:
                code = response.exit_code
        return code, out, err

    async def read(self, credential: str, path: str) -> bytes:
        request = dp.ReadWorkspaceFileRequest(credential=credential, path=path)
        return bytes((await self.stub.ReadWorkspaceFile(request)).content)

    async def write(self, credential: str, path: str, content: bytes) -> None:
        await self.stub.WriteWorkspaceFile(
            dp.WriteWorkspaceFileRequest(credential=credential, path=path, content=content)
        )


async def refused(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    code: grpc.StatusCode = error.value.code()
    return code


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def process_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory, "--backend", "firecracker") as server:
        yield server


@pytest.fixture(scope="module")
def kibovm_process_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory, "--backend", "kibovm") as server:
        yield server


@pytest.fixture
async def pc(process_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(process_server.address) as connected:
        yield connected


@pytest.fixture
async def kc(kibovm_process_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(kibovm_process_server.address) as connected:
        yield connected


async def create(client: Client) -> wp.Workspace:
    workspace = await client.create(resources=SMALL)
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
    return workspace


async def delete(client: Client, workspace: wp.Workspace, server: ServerProcess) -> None:
    deleted = await client.delete(workspace.workspace_id)
    assert deleted.workspace.state == S.WORKSPACE_STATE_DELETED
    # The retained layer and the workspace's own volume are deleted with it (asynchronously).
    layer, volume = server.data_dir / "layers" / workspace.workspace_id, volume_dir(server, workspace)
    await wait_until(lambda: not layer.exists() and not volume.exists())
    assert not processes(f"instances/{workspace.workspace_id}-g")


# -- tests ------------------------------------------------------------------------------------


async def test_sandbox_data_survives_stop_and_start(pc: Client, process_server: ServerProcess) -> None:
    capabilities = (await pc.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
    assert "runtime.process.isolation.bwrap" in capabilities
    assert "workspace.stop.force" in capabilities
    assert any(c.startswith("runtime.process.limits.cgroup") for c in capabilities)

    workspace = await create(pc)
    # AVAILABLE means the guest answered: its agent runs and wrote the ready file.
    pid = agent_pid(process_server, workspace)
    # (in the supervisor's mount namespace: a small tmpfs over the instance's run directory)
    [supervisor_pid] = supervisors(process_server, workspace)
    run_dir = instance_dir(process_server, workspace) / "run"
    assert (Path(f"/proc/{supervisor_pid}/root") / str(run_dir).lstrip("/") / "ready").exists()
    # Its own namespaces: PID, mount, UTS, network; its own root with the volume at /data.
    for ns in ("pid", "mnt", "uts", "net"):
        assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
    assert text(f"/proc/{pid}/status").count("NSpid") == 1
    assert "\t2\n" in next(line for line in text(f"/proc/{pid}/status").splitlines(True) if "NSpid" in line)
    # The memory limit of the workspace is on its cgroup.
    memory = next(line for line in text(f"/proc/{pid}/cgroup").splitlines() if ":memory:" in line)
    limit_file = Path("/sys/fs/cgroup/memory") / memory.split(":", 2)[2].lstrip("/") / "memory.limit_in_bytes"
    assert int(limit_file.read_text()) == SMALL.memory_mib << 20

    # What the guest writes to /data and to its root is real files under --data-dir.
    guest_path(process_server, workspace, "/data/notes.txt").write_text("written in the guest\n")
    guest_path(process_server, workspace, "/etc/motd").write_text("layer\n")
    assert (on_volume(process_server, workspace) / "notes.txt").read_text() == "written in the guest\n"
    (on_volume(process_server, workspace) / "from-host.txt").write_text("put on the volume\n")
    assert guest_path(process_server, workspace, "/data/from-host.txt").read_text() == "put on the volume\n"
    supervisor = supervisors(process_server, workspace)
    assert len(supervisor) == 1

    stopped = await pc.stop(workspace.workspace_id)
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert (await command_of(pc, stopped)).result.durability == CONFIRMED
    assert not _alive(supervisor[0]) and not _alive(pid)
    assert not limit_file.parent.exists()  # the cgroup is released

    started = await pc.start(workspace.workspace_id)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert started.workspace.execution_generation == 2
    again = started.workspace
    assert agent_pid(process_server, again) != pid
    assert guest_path(process_server, again, "/data/notes.txt").read_text() == "written in the guest\n"
    assert guest_path(process_server, again, "/data/from-host.txt").read_text() == "put on the volume\n"
    assert guest_path(process_server, again, "/etc/motd").read_text() == "layer\n"
    await delete(pc, again, process_server)


async def test_supervisor_killed_from_outside(pc: Client, process_server: ServerProcess) -> None:
    workspace = await create(pc)
    guest = agent_pid(process_server, workspace)
    [supervisor] = supervisors(process_server, workspace)
    os.kill(supervisor, signal.SIGKILL)
    failed = await pc.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_FAILED)
    assert failed.failure.message and not failed.failure.stage
    # The guest went with its VMM; the instance still holds its parts: start is refused.
    await wait_until(lambda: not _alive(guest))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await pc.ws.StartWorkspace(ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace.workspace_id))
    assert error_of(refused.value).reason == "CONFLICT"
    forced = await pc.stop(workspace.workspace_id, force=True)
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert (await command_of(pc, forced)).result.durability == UNCONFIRMED
    started = await pc.start(workspace.workspace_id)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert len(supervisors(process_server, started.workspace)) == 1
    await delete(pc, started.workspace, process_server)


async def test_graceful_stop_whose_sync_fails_keeps_the_instance(pc: Client, process_server: ServerProcess) -> None:
    workspace = await create(pc)
    [supervisor] = supervisors(process_server, workspace)
    volume = volume_dir(process_server, workspace)
    # The volume's directory vanishes under the sandbox: its writes cannot be confirmed.
    aside = volume.with_name(volume.name + ".aside")
    volume.rename(aside)
    try:
        response = await pc.stop(workspace.workspace_id)
        command = await command_of(pc, response)
        assert command.state == command_pb2.COMMAND_STATE_FAILED
        assert "sync" in command.error.message
        failed = await pc.wait_steady(workspace.workspace_id)
        assert failed.state == S.WORKSPACE_STATE_FAILED and failed.failure.stage == "STOP"
        assert _alive(supervisor)  # never force-destroyed: the instance is still held
    finally:
        aside.rename(volume)
    forced = await pc.stop(workspace.workspace_id, force=True)
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert (await command_of(pc, forced)).result.durability == UNCONFIRMED
    assert not _alive(supervisor)
    await delete(pc, forced.workspace, process_server)


async def test_firecracker_guest_reboot_restarts_in_the_same_instance(
    pc: Client, process_server: ServerProcess
) -> None:
    workspace = await create(pc)
    guest_path(process_server, workspace, "/data/kept").write_text("across the reset")
    [first] = supervisors(process_server, workspace)
    os.kill(agent_pid(process_server, workspace), signal.SIGUSR1)  # /run/kibo/bin/reboot in the guest
    await wait_until(lambda: not _alive(first))

    def restarted() -> bool:
        found = supervisors(process_server, workspace)
        return bool(found) and found != [first] and state(process_server, workspace)["state"] == "ready"

    await wait_until(restarted)
    current = await wait_workspace(
        pc, workspace.workspace_id, lambda w: w.guest.reset_count == 1 and w.guest.responding
    )
    assert current.state == S.WORKSPACE_STATE_AVAILABLE
    assert current.execution_generation == workspace.execution_generation
    assert guest_path(process_server, current, "/data/kept").read_text() == "across the reset"
    await delete(pc, current, process_server)


async def test_firecracker_guest_poweroff_leaves_the_supervisor_idle(pc: Client, process_server: ServerProcess) -> None:
    workspace = await create(pc)
    guest = agent_pid(process_server, workspace)
    [supervisor] = supervisors(process_server, workspace)
    os.kill(guest, signal.SIGUSR2)  # /run/kibo/bin/poweroff in the guest
    await wait_until(lambda: not _alive(guest))

    current = await wait_workspace(pc, workspace.workspace_id, lambda w: not w.guest.responding)
    assert current.state == S.WORKSPACE_STATE_AVAILABLE
    assert _alive(supervisor) and state(process_server, workspace)["why"] == "poweroff"
    forced = await pc.stop(workspace.workspace_id, force=True)
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert not _alive(supervisor)
    await delete(pc, forced.workspace, process_server)


async def test_kibovm_guest_poweroff_stops_and_reboot_fails(kc: Client, kibovm_process_server: ServerProcess) -> None:
    server = kibovm_process_server
    capabilities = (await kc.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
    assert "workspace.stop.guest_shutdown" in capabilities
    off, reset = await create(kc), await create(kc)
    os.kill(agent_pid(server, off), signal.SIGUSR2)
    os.kill(agent_pid(server, reset), signal.SIGUSR1)
    stopped = await kc.wait_for(off.workspace_id, S.WORKSPACE_STATE_STOPPED)
    assert stopped.last_stop.cause == wp.STOP_CAUSE_GUEST_SHUTDOWN
    assert stopped.last_stop.durability == UNCONFIRMED
    failed = await kc.wait_for(reset.workspace_id, S.WORKSPACE_STATE_FAILED)
    assert "reset" in failed.failure.message
    assert not supervisors(server, reset)
    forced = await kc.stop(reset.workspace_id, force=True)
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
    for workspace in (stopped, forced.workspace):
        started = await kc.start(workspace.workspace_id)
        assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
        await delete(kc, started.workspace, server)


# A process over the workspace's memory, and the host running out: tests/system/test_resource_model.py
# (issue 26: the first is killed in the guest, which runs on; only the second stops the workspace).


async def test_control_plane_kill9_readopts_without_orphans(server_factory: Callable[..., ServerProcess]) -> None:
    _require_sandbox()
    server = server_factory(*FLAGS)
    try:
        async with Client.connect(server.address) as client:
            kept, crashed, stopped = await create(client), await create(client), await create(client)
            await client.stop(stopped.workspace_id)
            [kept_supervisor] = supervisors(server, kept)
            kept_guest = agent_pid(server, kept)
            [crashed_supervisor] = supervisors(server, crashed)
        server.kill()
        # While the control plane is down: one sandbox runs on, one VMM dies.
        os.kill(crashed_supervisor, signal.SIGKILL)
        assert _alive(kept_supervisor) and _alive(kept_guest)
        server.start()
        async with Client.connect(server.address) as client:
            again = await client.get(kept.workspace_id)
            assert again.state == S.WORKSPACE_STATE_AVAILABLE
            assert again.execution_generation == kept.execution_generation
            failed = await client.wait_for(crashed.workspace_id, S.WORKSPACE_STATE_FAILED)
            assert failed.failure.message
            assert (await client.get(stopped.workspace_id)).state == S.WORKSPACE_STATE_STOPPED
            # Nothing started twice, nothing orphaned: one supervisor, the same processes.
            assert supervisors(server, kept) == [kept_supervisor]
            assert agent_pid(server, kept) == kept_guest
            assert not supervisors(server, crashed) and not supervisors(server, stopped)
            assert len(supervisor_processes(f"supervisor.py {server.data_dir}")) == 1
            # The re-adopted sandbox is fully controllable: a graceful stop syncs and confirms.
            response = await client.stop(kept.workspace_id)
            assert response.workspace.state == S.WORKSPACE_STATE_STOPPED
            assert (await command_of(client, response)).result.durability == CONFIRMED
            assert not _alive(kept_supervisor) and not _alive(kept_guest)
            forced = await client.stop(crashed.workspace_id, force=True)
            assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
            assert not processes(f"{server.data_dir}/instances")
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)


def tiny_image(root: Path) -> Path:
    """A minimal base image: a shell and the few tools the guest agent uses, with their libraries."""
    for tool in ("sh", "sleep", "mv", "cat"):
        source = Path(shutil.which(tool) or f"/bin/{tool}").resolve()
        (root / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, root / "bin" / tool)
        for line in subprocess.run(
            ["ldd", str(source)], capture_output=True, text=True, check=True
        ).stdout.splitlines():
            library = next((part for part in line.split() if part.startswith("/")), None)
            if library:
                target = root / library.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(library, target)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "image-release").write_text("tiny\n")
    return root


@pytest.mark.parametrize("sandbox", ["bwrap"])  # unshare was removed: not a security boundary
async def test_other_isolation_and_a_base_image(
    sandbox: str, server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Bubblewrap over an overlaid base image."""
    _require_sandbox()
    image = tiny_image(tmp_path / "image") if sandbox == "bwrap" else None
    flags = [*FLAGS[:2], "--sandbox", sandbox, *FLAGS[4:]] + (["--base-image", str(image)] if image else [])
    server = server_factory(*flags)
    try:
        async with Client.connect(server.address) as client:
            capabilities = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
            assert f"runtime.process.isolation.{sandbox}" in capabilities
            workspace = await create(client)
            pid = agent_pid(server, workspace)
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
            assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
            guest_path(server, workspace, "/data/file").write_text("volume")
            guest_path(server, workspace, "/root/file").write_text("layer")
            if image is not None:
                assert guest_path(server, workspace, "/etc/image-release").read_text() == "tiny\n"
                assert not guest_path(server, workspace, "/usr/bin/python3").exists()  # not the host's /usr
                guest_path(server, workspace, "/etc/image-release").write_text("changed in the guest\n")
            started = await client.start((await client.stop(workspace.workspace_id)).workspace.workspace_id)
            again = started.workspace
            assert again.state == S.WORKSPACE_STATE_AVAILABLE
            assert guest_path(server, again, "/data/file").read_text() == "volume"
            assert guest_path(server, again, "/root/file").read_text() == "layer"
            if image is not None:
                # The change is in the workspace's layer; the base image is untouched.
                assert guest_path(server, again, "/etc/image-release").read_text() == "changed in the guest\n"
                assert (image / "etc" / "image-release").read_text() == "tiny\n"
            await delete(client, again, server)
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)


async def test_data_plane_commands_files_and_credentials(pc: Client, process_server: ServerProcess) -> None:
    workspace = await create(pc)
    data = DataPlane(pc)
    credential = await data.credential(workspace.workspace_id)
    # A command in the guest: its output streams, its exit code, its stdin; the guest's view.
    assert await data.exec(credential, "sh", "-c", "echo out; echo err >&2; exit 3") == (3, b"out\n", b"err\n")
    assert await data.exec(credential, "cat", stdin=b"fed to stdin") == (0, b"fed to stdin", b"")
    assert (await data.exec(credential, "hostname"))[1].decode().strip() == workspace.workspace_id
    # Nothing the server's Python ignores is ignored in the command (a pipe's reader gone kills it).
    ignored = int((await data.exec(credential, "grep", "SigIgn", "/proc/self/status"))[1].split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)), hex(ignored)
    code, out, _ = await data.exec(credential, "sh", "-c", "ls /proc | grep -c '^[0-9]'")
    assert code == 0 and int(out) < 10  # its own PID namespace: a handful of processes
    assert (await data.exec(credential, "no-such-command"))[0] == 127
    assert (await data.exec(credential, "sleep", "30", limit=1))[0] == 124
    # Files under /data, as the guest sees them; nothing outside the volumes.
    await data.write(credential, "/data/dir-less.txt", b"through the data plane")
    assert (on_volume(process_server, workspace) / "dir-less.txt").read_bytes() == b"through the data plane"
    assert await data.exec(credential, "cat", "/data/dir-less.txt") == (0, b"through the data plane", b"")
    assert await data.read(credential, "/data/dir-less.txt") == b"through the data plane"
    assert await refused(data.read(credential, "/etc/passwd")) == grpc.StatusCode.INVALID_ARGUMENT
    assert await refused(data.read(credential, "/data/../etc/passwd")) == grpc.StatusCode.INVALID_ARGUMENT
    assert await refused(data.read(credential, "/data/missing")) == grpc.StatusCode.NOT_FOUND
    # A symlink resolves inside the guest: the guest's own /etc/passwd, never the host's.
    await data.exec(credential, "ln", "-s", "/etc/passwd", "/data/link")
    assert (
        await data.read(credential, "/data/link") == guest_path(process_server, workspace, "/etc/passwd").read_bytes()
    )
    assert await data.read(credential, "/data/link") != text("/etc/passwd").encode()
    assert await refused(data.exec("kdp1.forged.credential", "true")) == grpc.StatusCode.UNAUTHENTICATED

    # A firecracker guest reboot keeps the credential.
    [first] = supervisors(process_server, workspace)
    os.kill(agent_pid(process_server, workspace), signal.SIGUSR1)
    await wait_until(lambda: not _alive(first))
    await wait_workspace(pc, workspace.workspace_id, lambda w: w.guest.reset_count == 1 and w.guest.responding)
    assert await data.read(credential, "/data/dir-less.txt") == b"through the data plane"

    # A stop invalidates it; after a start a new one is needed, and the data is there.
    await pc.stop(workspace.workspace_id)
    assert await refused(data.exec(credential, "true")) == grpc.StatusCode.UNAUTHENTICATED
    await pc.start(workspace.workspace_id)
    assert await refused(data.read(credential, "/data/dir-less.txt")) == grpc.StatusCode.UNAUTHENTICATED
    fresh = await data.credential(workspace.workspace_id)
    assert await data.read(fresh, "/data/dir-less.txt") == b"through the data plane"
    # Revoking invalidates it too.
    revoke = ws.RevokeWorkspaceDataPlaneAccessRequest(metadata=meta(), workspace_id=workspace.workspace_id)
    await pc.ws.RevokeWorkspaceDataPlaneAccess(revoke)
    assert await refused(data.read(fresh, "/data/dir-less.txt")) == grpc.StatusCode.UNAUTHENTICATED
    await delete(pc, await pc.get(workspace.workspace_id), process_server)
