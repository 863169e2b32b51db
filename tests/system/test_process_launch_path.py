"""The faster launch path of the process runtime, on real sandboxes (issue 14): the guest's
first process is forked before the supervisor mounts its images (guest_start.py), new
layers and volumes come formatted from a pool (image_pool.py), supervisors are forked
from a warm interpreter (forkserver.py). What must stay as it was:

- no descriptor of the supervisor (its lock, its socket, the readiness watch, the images'
  loop devices, the seccomp filter, the bwrap options) reaches any process of the guest;
- a workspace created from pooled images has the skeleton and an empty /data, like one
  whose images the supervisor formatted;
- the fork server is the control plane's child and goes with it; supervisors stay;
- every guest has a user namespace of its own (made ahead by the fork server);
- a guest's data-plane jobs come from its job door, in the guest's cgroups; the door is the
  control plane's child, goes with its instance, and a dead door costs only speed.

Needs root and bubblewrap, like tests/system/test_process_runtime.py (whose helpers it uses)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from tests.client import Client
from tests.server import ServerProcess
from tests.system.test_process_runtime import (
    DataPlane,
    _alive,
    _cmdline,
    agent_pid,
    create,
    delete,
    guest_path,
    instance_dir,
    processes,
    sandbox_server,
    supervisors,
    text,
    wait_until,
)


@pytest.fixture(scope="module")
def launch_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory) as server:
        yield server


@pytest.fixture
async def lc(launch_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(launch_server.address) as connected:
        yield connected


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            todo += [int(p) for p in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except OSError:
            continue
    return found


def _fd_targets(pid: int) -> dict[int, str]:
    targets = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
    return targets


# What a guest process may hold: its standard streams (/dev/null, the output pipe), bwrap's
# own signalfd and eventfd, and the agent's script (the shell reads it through an fd).
ALLOWED = ("/dev/null", "pipe:", "anon_inode:[signalfd]", "anon_inode:[eventfd]", "/run/kibo/bin/agent")


async def test_no_descriptor_of_the_supervisor_reaches_the_guest(lc: Client, launch_server: ServerProcess) -> None:
    workspace = await create(lc)
    [supervisor] = supervisors(launch_server, workspace)
    guest = [pid for pid in _descendants(supervisor) if pid != supervisor]
    assert len(guest) >= 3, "bwrap, its child and the agent"
    assert agent_pid(launch_server, workspace) in guest
    held = {pid: _fd_targets(pid) for pid in guest}
    for pid, targets in held.items():
        strays = {fd: t for fd, t in targets.items() if not t.startswith(ALLOWED)}
        assert not strays, f"guest process {pid} ({_cmdline(pid)}) holds {strays}"
    await delete(lc, workspace, launch_server)


async def test_workspaces_from_pooled_images_look_like_freshly_formatted_ones(
    lc: Client, launch_server: ServerProcess
) -> None:
    # The first create asks for these sizes; the pool makes them after it; the later ones take them.
    made = [await create(lc) for _ in range(3)]
    pool = launch_server.data_dir / "runtime" / "pool"
    await wait_until(lambda: any(pool.glob("*.img")), within=60)
    taken = await create(lc)
    for workspace in [*made, taken]:
        root = guest_path(launch_server, workspace, "/")
        assert {"bin", "etc", "proc", "tmp", "usr", "root"} <= {p.name for p in root.iterdir()}
        assert (root / "etc" / "passwd").read_text().startswith("root:x:0:0:")
        data = guest_path(launch_server, workspace, "/data")
        assert list(data.iterdir()) == [], "a new volume is empty (no lost+found)"
        # The guest's root owns its root and its volume, as when the supervisor formats them.
        assert os.stat(root).st_uid == os.stat(data).st_uid == os.stat(root / "etc").st_uid != 0
    for workspace in [*made, taken]:
        await delete(lc, workspace, launch_server)


async def test_every_guest_has_a_user_namespace_of_its_own(lc: Client, launch_server: ServerProcess) -> None:
    """The fork server makes the next supervisor's user namespace ahead of its launch: each
    must still be new, never one another guest (or the host) is in, and map the guests' ids."""
    made = [await create(lc) for _ in range(3)]
    namespaces = [os.stat(f"/proc/{agent_pid(launch_server, w)}/ns/user").st_ino for w in made]
    assert len(set(namespaces)) == len(made), "no two guests share a user namespace"
    assert os.stat("/proc/self/ns/user").st_ino not in namespaces
    for workspace in made:
        uid_map = text(f"/proc/{agent_pid(launch_server, workspace)}/uid_map").split()
        assert uid_map[0] == "0" and uid_map[1] != "0", uid_map  # the guests' range, not host root
    for workspace in made:
        await delete(lc, workspace, launch_server)


async def test_the_fork_server_is_the_control_planes_child_and_goes_with_it(
    server_factory: Callable[..., ServerProcess],
) -> None:
    with sandbox_server(server_factory) as server:
        assert server.process is not None
        async with Client.connect(server.address) as client:
            workspace = await create(client)
            [supervisor] = supervisors(server, workspace)
            forks = [pid for pid in processes("forkserver.py") if f"PPid:\t{server.process.pid}\n" in _status(pid)]
            assert len(forks) == 1
            server.kill()  # kill -9 of the control plane
            await wait_until(lambda: not _alive(forks[0]))
            assert _alive(supervisor), "the supervisor (a child of the fork server) runs on"
            assert processes(f"supervisor.py {server.data_dir}/instances/{workspace.workspace_id}-g")


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def _doors(server: ServerProcess) -> list[int]:
    return _door_processes(f"kibo-job-door {server.data_dir}/instances/")


def _door_processes(needle: str) -> list[int]:
    """The doors whose command line has `needle`, not their spares, which carry the door's
    for a moment after their fork (forkserver.py `_Spare`)."""
    found = processes(needle)
    return [pid for pid in found if _ppid(pid) not in found]


def _ppid(pid: int) -> int:
    return next((int(line.split()[1]) for line in _status(pid).splitlines() if line.startswith("PPid:")), 0)


async def test_a_guests_jobs_come_from_its_door_in_its_cgroups(lc: Client, launch_server: ServerProcess) -> None:
    assert launch_server.process is not None
    workspace = await create(lc)
    door_of = f"kibo-job-door {instance_dir(launch_server, workspace)}"
    [door] = _door_processes(door_of)
    assert f"PPid:\t{launch_server.process.pid}\n" in _status(door), "the control plane's child (reaped there)"
    guest_cgroups = text(f"/proc/{agent_pid(launch_server, workspace)}/cgroup")
    await wait_until(lambda: text(f"/proc/{door}/cgroup") == guest_cgroups)
    for kind in ("pid", "mnt", "user"):  # the guest's cgroups, none of its namespaces
        namespace = os.stat(f"/proc/{agent_pid(launch_server, workspace)}/ns/{kind}").st_ino
        assert os.stat(f"/proc/{door}/ns/{kind}").st_ino != namespace
    data = DataPlane(lc)
    credential = await data.credential(workspace.workspace_id)
    # The job's command, in the guest, sees the guest's cgroups as the guest's own processes do.
    own = await data.exec(credential, "cat", "/proc/self/cgroup")
    assert own == await data.exec(credential, "cat", "/proc/1/cgroup") and own[0] == 0
    # The guest's end kills everything in its cgroups: the door too. Jobs still run.
    os.kill(door, signal.SIGKILL)
    await wait_until(lambda: not Path(f"/proc/{door}").exists())  # reaped, no zombie
    assert await data.exec(credential, "sh", "-c", "echo still") == (0, b"still\n", b"")
    assert await data.exec(credential, "true") == (0, b"", b"")
    await lc.stop(workspace.workspace_id)
    await wait_until(lambda: not processes(door_of))
    await lc.start(workspace.workspace_id)
    started = await lc.get(workspace.workspace_id)
    [door] = _door_processes(f"kibo-job-door {instance_dir(launch_server, started)}")
    await delete(lc, started, launch_server)
    await wait_until(lambda: not _alive(door))
    assert not [pid for pid in _doors(launch_server) if workspace.workspace_id in _cmdline(pid)]


async def test_an_idle_door_closes_and_the_next_command_opens_one(
    server_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIBO_JOB_DOOR_IDLE_S", "1")
    with sandbox_server(server_factory) as server:
        async with Client.connect(server.address) as client:
            workspace = await create(client)
            door_of = f"kibo-job-door {instance_dir(server, workspace)}"
            [first] = _door_processes(door_of)
            await wait_until(lambda: not Path(f"/proc/{first}").exists())  # closed and reaped
            data = DataPlane(client)
            credential = await data.credential(workspace.workspace_id)
            assert await data.exec(credential, "cat", "/proc/self/cgroup") == await data.exec(
                credential, "cat", "/proc/1/cgroup"
            )
            [second] = _door_processes(door_of)
            assert second != first
            await delete(client, workspace, server)
            await wait_until(lambda: not processes(door_of))
