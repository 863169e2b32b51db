"""`--supervisor node`: ready guests held by one node supervisor, not a supervisor each.

Real sandboxes, as test_process_runtime.py (whose helpers these tests use): each instance's
supervisor launches its guest and hands it to the node supervisor once it is ready
(supervisor_handover.py, node_supervisor.py); these tests check that what a workspace does
is the same (data kept across stop and start, the data plane, guest reboot, power-off, OOM,
a control-plane kill -9) with no per-instance supervisor process left, and what the node
supervisor's own end does."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.client import Client, S
from tests.server import ServerProcess
from tests.system.test_process_launch_path import ALLOWED, _descendants, _fd_targets
from tests.system.test_process_runtime import (
    CONFIRMED,
    FLAGS,
    SMALL,
    UNCONFIRMED,
    DataPlane,
    _alive,
    _require_sandbox,
    agent_pid,
    cgroups_left,
    command_of,
    create,
    delete,
    guest_path,
    instance_dir,
    processes,
    reap,
    sandbox_server,
    state,
    supervisors,
    wait_until,
    wait_workspace,
)

NODE = ("--supervisor", "node")


def node_supervisors(data_dir: Path) -> list[int]:
    return processes(f"node_supervisor.py {data_dir}")


def reap_all(data_dir: Path) -> None:
    for pid in node_supervisors(data_dir):
        os.kill(pid, signal.SIGKILL)
    reap(data_dir)


@pytest.fixture(scope="module")
def node_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory, "--backend", "firecracker", *NODE) as server:
        try:
            yield server
        finally:
            reap_all(server.data_dir)


@pytest.fixture
async def nc(node_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(node_server.address) as connected:
        yield connected


async def handed_over(server: ServerProcess, workspace: wp.Workspace) -> int:
    """Wait until the node supervisor holds the workspace's guest; its PID."""
    await wait_until(lambda: bool(state(server, workspace).get("parked")) and not supervisors(server, workspace))
    [node] = node_supervisors(server.data_dir)
    assert state(server, workspace)["supervisor_pid"] == node
    return node


async def test_ready_guests_are_held_by_one_node_supervisor(nc: Client, node_server: ServerProcess) -> None:
    first, second = await create(nc), await create(nc)
    node = await handed_over(node_server, first)
    assert await handed_over(node_server, second) == node
    guests = [agent_pid(node_server, w) for w in (first, second)]
    # What the guest writes, on its volume and its layer, is kept across a graceful stop: the
    # node supervisor syncs the images mounted in the supervisor's namespace, which is gone.
    guest_path(node_server, first, "/data/notes.txt").write_text("written in the guest\n")
    guest_path(node_server, first, "/etc/motd").write_text("layer\n")
    data = DataPlane(nc)
    credential = await data.credential(first.workspace_id)
    assert await data.exec(credential, "cat", "/data/notes.txt") == (0, b"written in the guest\n", b"")

    stopped = await nc.stop(first.workspace_id)
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert (await command_of(nc, stopped)).result.durability == CONFIRMED
    assert not _alive(guests[0]) and _alive(guests[1]) and _alive(node)
    exit_info = json.loads((instance_dir(node_server, first) / "exit.json").read_text())
    assert exit_info["reason"] == "stopped" and exit_info["synced"] is True
    started = await nc.start(first.workspace_id)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    again = started.workspace
    assert await handed_over(node_server, again) == node
    assert guest_path(node_server, again, "/data/notes.txt").read_text() == "written in the guest\n"
    assert guest_path(node_server, again, "/etc/motd").read_text() == "layer\n"

    forced = await nc.stop(second.workspace_id, force=True)
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
    assert (await command_of(nc, forced)).result.durability == UNCONFIRMED
    assert not _alive(guests[1])
    await delete(nc, again, node_server)
    await delete(nc, forced.workspace, node_server)
    assert not cgroups_left(node_server.data_dir)


async def test_no_descriptor_of_a_supervisor_reaches_the_guest(nc: Client, node_server: ServerProcess) -> None:
    """bwrap holds the write end of its status pipe for the node supervisor (its
    --json-status-fd); nothing inside the sandbox holds it, nor anything else of ours."""
    workspace = await create(nc)
    await handed_over(node_server, workspace)
    sandbox = int(state(node_server, workspace)["sandbox_pid"])
    status = _fd_targets(sandbox)[int(state(node_server, workspace)["status_fd"])]
    assert status.startswith("pipe:")
    inside = [pid for pid in _descendants(sandbox) if pid != sandbox]
    assert agent_pid(node_server, workspace) in inside
    for pid in inside:
        held = _fd_targets(pid)
        strays = {fd: t for fd, t in held.items() if not t.startswith(ALLOWED) or t == status}
        assert not strays, f"guest process {pid} holds {strays}"
    await delete(nc, workspace, node_server)


async def test_guest_exits_take_the_same_paths(nc: Client, node_server: ServerProcess) -> None:
    rebooted, halted, hungry = await create(nc), await create(nc), await create(nc)
    for workspace in (rebooted, halted, hungry):
        await handed_over(node_server, workspace)
    # Reboot (firecracker): a new supervisor for the same instance, handed over again.
    os.kill(agent_pid(node_server, rebooted), signal.SIGUSR1)
    current = await wait_workspace(nc, rebooted.workspace_id, lambda w: w.guest.reset_count == 1 and w.guest.responding)
    assert current.execution_generation == rebooted.execution_generation
    await handed_over(node_server, current)
    # Power-off (firecracker): the instance stays, idle, until a force stop.
    guest = agent_pid(node_server, halted)
    os.kill(guest, signal.SIGUSR2)
    await wait_until(lambda: not _alive(guest))
    idle = await wait_workspace(nc, halted.workspace_id, lambda w: not w.guest.responding)
    assert idle.state == S.WORKSPACE_STATE_AVAILABLE
    assert state(node_server, halted)["why"] == "poweroff"
    assert (await nc.stop(halted.workspace_id, force=True)).workspace.state == S.WORKSPACE_STATE_STOPPED
    # A process over the workspace's memory: the kernel kills it in the guest, which runs on,
    # held by the node supervisor (issue 26; the host running out: test_resource_model.py).
    data = DataPlane(nc)
    credential = await data.credential(hungry.workspace_id)
    size = 2 * SMALL.memory_mib << 20
    code, _, _ = await data.exec(credential, "sh", "-c", f"head -c {size} /dev/zero | tail -c {size} > /dev/null")
    assert code != 0

    async def killed() -> bool:
        events = await nc.events(hungry.workspace_id)
        return any(e.type == obs.EVENT_TYPE_GUEST_OOM_KILL for e in events)

    for _ in range(500):
        if await killed():
            break
        await asyncio.sleep(0.02)
    assert await killed(), "no OOM kill event"
    oom = await nc.get(hungry.workspace_id)
    assert oom.state == S.WORKSPACE_STATE_AVAILABLE and state(node_server, hungry)["parked"]
    for workspace in (current, idle, oom):
        await nc.delete(workspace.workspace_id)
    await wait_until(lambda: not processes(f"{node_server.data_dir}/instances"))


async def test_control_plane_kill9_readopts_held_guests(server_factory: Callable[..., ServerProcess]) -> None:
    _require_sandbox()
    server = server_factory(*FLAGS, *NODE)
    try:
        async with Client.connect(server.address) as client:
            kept = await create(client)
            node = await handed_over(server, kept)
            guest = agent_pid(server, kept)
        server.kill()
        await asyncio.sleep(0.5)
        assert _alive(node) and _alive(guest)  # the node supervisor outlives the control plane
        server.start()
        async with Client.connect(server.address) as client:
            again = await client.get(kept.workspace_id)
            assert again.state == S.WORKSPACE_STATE_AVAILABLE
            assert node_supervisors(server.data_dir) == [node] and agent_pid(server, kept) == guest
            response = await client.stop(kept.workspace_id)
            assert (await command_of(client, response)).result.durability == CONFIRMED
            assert not _alive(guest)
        server.stop()
        # Nothing held and no runtime connected: the node supervisor exits.
        await wait_until(lambda: not _alive(node), within=15)
    finally:
        server.kill()
        reap_all(server.data_dir)


async def test_a_killed_node_supervisor_is_replaced_and_readopts(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """kill -9 of the node supervisor: the runtime starts another, which finds the guests
    again (node_holdings.py); no workspace fails, and each is as controllable as before,
    its guest's reboot included (its exit code is read from bwrap's status pipe, re-opened)."""
    _require_sandbox()
    server = server_factory(*FLAGS, *NODE)
    try:
        async with Client.connect(server.address) as client:
            kept, rebooted = await create(client), await create(client)
            node = await handed_over(server, kept)
            await handed_over(server, rebooted)
            guests = [agent_pid(server, w) for w in (kept, rebooted)]
            guest_path(server, kept, "/data/kept.txt").write_text("across the node supervisor's death\n")
            os.kill(node, signal.SIGKILL)

            def replaced() -> bool:
                found = node_supervisors(server.data_dir)
                return (
                    len(found) == 1
                    and found[0] != node
                    and all(state(server, w)["supervisor_pid"] == found[0] for w in (kept, rebooted))
                )

            await wait_until(replaced, within=20)
            assert [agent_pid(server, w) for w in (kept, rebooted)] == guests  # the same guests
            for workspace in (kept, rebooted):
                current = await client.get(workspace.workspace_id)
                assert current.state == S.WORKSPACE_STATE_AVAILABLE and current.guest.responding
                events = await client.events(workspace.workspace_id)
                assert not any(e.to_state == S.WORKSPACE_STATE_FAILED for e in events)
            data = DataPlane(client)
            credential = await data.credential(kept.workspace_id)
            assert await data.exec(credential, "cat", "/data/kept.txt") == (
                0,
                b"across the node supervisor's death\n",
                b"",
            )
            # A reboot of a re-adopted guest is still a reboot (firecracker: the same instance again).
            os.kill(guests[1], signal.SIGUSR1)
            current = await wait_workspace(
                client, rebooted.workspace_id, lambda w: w.guest.reset_count == 1 and w.guest.responding
            )
            await handed_over(server, current)
            # A graceful stop of a re-adopted guest confirms (the runtime syncs its images).
            response = await client.stop(kept.workspace_id)
            assert (await command_of(client, response)).result.durability == CONFIRMED
            assert not _alive(guests[0])
            started = await client.start(kept.workspace_id)
            assert guest_path(server, started.workspace, "/data/kept.txt").read_text().startswith("across")
            await delete(client, started.workspace, server)
            await delete(client, current, server)
        server.stop()
        await wait_until(lambda: not node_supervisors(server.data_dir), within=15)
    finally:
        server.kill()
        reap_all(server.data_dir)
