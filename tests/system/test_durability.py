"""Durability: clean shutdown on signals, restarts that lose nothing, kill -9 under load.

Each test runs its own server on its own data dir (restarts must not disturb the shared ones)."""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import TERMINAL, Client, S, meta, state_name
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]
SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED
RUNNING_STATES = (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
TRANSITIONAL = (
    S.WORKSPACE_STATE_CREATING,
    S.WORKSPACE_STATE_STARTING,
    S.WORKSPACE_STATE_STOPPING,
    S.WORKSPACE_STATE_DELETING,
)
STEADY = (S.WORKSPACE_STATE_AVAILABLE, S.WORKSPACE_STATE_STOPPED, S.WORKSPACE_STATE_FAILED, S.WORKSPACE_STATE_DELETED)


async def start(server: ServerProcess) -> None:
    await asyncio.to_thread(server.start)


async def kill(server: ServerProcess) -> None:
    await asyncio.to_thread(server.kill)


async def stop(server: ServerProcess) -> int:
    return await asyncio.to_thread(server.stop)


async def eventually(check: Callable[[], Any], within: float = 10.0, what: str = "") -> Any:
    """Poll an async check until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(what or "condition not met")
        await asyncio.sleep(0.02)


async def list_all(client: Client) -> list[wp.Workspace]:
    found: list[wp.Workspace] = []
    token = ""
    while True:
        request = ws.ListWorkspacesRequest(page_size=1000, page_token=token, include_deleted=True)
        response = await client.ws.ListWorkspaces(request)
        found.extend(response.workspaces)
        token = response.next_page_token
        if not token:
            return found


STATE_CHANGED = obs.EVENT_TYPE_STATE_CHANGED


def feed_gaps(workspace: wp.Workspace, events: list[obs.WorkspaceEvent]) -> list[str]:
    """What is wrong with a workspace's events feed: sequences must strictly increase, each
    STATE_CHANGED must start where the previous one ended (the first from nothing), and the
    last must end in the workspace's current state. Empty when the feed has no gap."""
    problems: list[str] = []
    where = workspace.workspace_id
    previous_seq, previous_to = 0, S.WORKSPACE_STATE_UNSPECIFIED
    for event in events:
        if event.sequence <= previous_seq:
            problems.append(f"{where}: sequence {event.sequence} after {previous_seq}")
        previous_seq = event.sequence
        if event.type != STATE_CHANGED:
            continue
        if event.from_state != previous_to:
            problems.append(
                f"{where}: event {event.sequence} {state_name(event.from_state)}->{state_name(event.to_state)} "
                f"after a change to {state_name(previous_to)}"
            )
        previous_to = event.to_state
    if previous_to != workspace.state:
        problems.append(
            f"{where}: the feed ends in {state_name(previous_to)}, the workspace is {state_name(workspace.state)}"
        )
    return problems


async def assert_feeds_have_no_gap(client: Client) -> int:
    """Check every workspace's feed; the number of events checked."""
    checked = 0
    problems: list[str] = []
    for workspace in await list_all(client):
        events = await client.events(workspace.workspace_id)
        checked += len(events)
        problems += feed_gaps(workspace, events)
    assert not problems, problems
    return checked


def integrity(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def integrity_of_copy(data_dir: Path) -> str:
    """Check the files a crash left behind, on a copy (opening them recovers the WAL)."""
    with tempfile.TemporaryDirectory() as scratch:
        for suffix in ("", "-wal"):
            source = data_dir / f"kibo.db{suffix}"
            if source.exists():
                shutil.copy(source, Path(scratch) / source.name)
        with sqlite3.connect(Path(scratch) / "kibo.db") as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


# -- signals --------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_finishes_in_flight_calls_and_exits_0(server_factory: Factory, signum: int) -> None:
    server = server_factory("--settle-ms", "1500")
    request = ws.CreateWorkspaceRequest(metadata=meta())
    async with Client.connect(server.address) as client:
        ready = await client.create()
        watch = None
        if signum == signal.SIGINT:
            # An open watch (a call that never ends by itself) must not keep the server from exiting.
            watch = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=ready.workspace_id))
            assert (await watch.read()).workspace.state == S.WORKSPACE_STATE_AVAILABLE
        # A stalled create: its call waits out the 1.5 s settle window inside the server.
        await client.inject("", sim.FAULT_STALL)
        call = asyncio.ensure_future(client.ws.CreateWorkspace(request))

        async def recorded() -> bool:
            try:
                await client.command(request.metadata.command_id)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.NOT_FOUND
                return False
            return True

        await eventually(recorded, what="the create was not recorded")
        assert not call.done()
        assert server.process is not None
        server.process.send_signal(signum)
        response = await call  # answered normally, not cut off
        assert response.command.command_id == request.metadata.command_id
        assert response.command.state in RUNNING_STATES
        code = await asyncio.to_thread(server.process.wait, 10)  # the contract: exits within 10 s
        assert code == 0, server.log()
        if watch is not None:
            watch.cancel()

    await start(server)
    async with Client.connect(server.address) as client:
        # The create that was stalled at shutdown resumes after the restart.
        settled = await client.settle(client.ws.CreateWorkspace, request)
        assert settled.command.state == SUCCEEDED
        assert settled.workspace.workspace_id == response.workspace.workspace_id
        assert settled.workspace.state == S.WORKSPACE_STATE_AVAILABLE
        assert (await client.get(ready.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
    assert await stop(server) == 0


# -- restarts lose nothing --------------------------------------------------------------------


@dataclass
class Snapshot:
    workspaces: dict[str, wp.Workspace] = field(default_factory=dict)
    events: dict[str, list[obs.WorkspaceEvent]] = field(default_factory=dict)
    commands: dict[str, command_pb2.WorkspaceCommand] = field(default_factory=dict)
    instances: dict[str, list[obs.Instance]] = field(default_factory=dict)


async def snapshot(client: Client, command_ids: list[str]) -> Snapshot:
    taken = Snapshot()
    for workspace in await list_all(client):
        workspace_id = workspace.workspace_id
        taken.workspaces[workspace_id] = workspace
        taken.events[workspace_id] = await client.events(workspace_id)
        request = obs.ListWorkspaceInstancesRequest(workspace_id=workspace_id)
        taken.instances[workspace_id] = list((await client.obs.ListWorkspaceInstances(request)).instances)
    for command_id in command_ids:
        taken.commands[command_id] = await client.command(command_id)
    return taken


async def test_a_restart_loses_nothing(server_factory: Factory) -> None:
    server = server_factory()
    commands: list[str] = []
    async with Client.connect(server.address) as client:
        up = await client.create(labels={"team": "a"}, annotations={"note": "kept"})
        in_an_hour = Timestamp(seconds=int(time.time()) + 3600)
        for request in (
            ws.SetWorkspaceExpirationRequest(
                metadata=meta(), workspace_id=up.workspace_id, expire_time=in_an_hour, action=wp.EXPIRATION_ACTION_STOP
            ),
            ws.ClearWorkspaceExpirationRequest(metadata=meta(), workspace_id=up.workspace_id),
            ws.SetWorkspaceExpirationRequest(
                metadata=meta(),
                workspace_id=up.workspace_id,
                expected_expiration_revision=3,
                expire_time=in_an_hour,
                action=wp.EXPIRATION_ACTION_DELETE,
            ),
        ):
            method = getattr(client.ws, type(request).__name__.removesuffix("Request"))
            response = await method(request)
            commands.append(response.command.command_id)
        assert (await client.get(up.workspace_id)).expiration.revision == 4
        stopped = await client.create()
        commands.append((await client.stop(stopped.workspace_id)).command.command_id)
        restarted = await client.create()
        commands.append((await client.stop(restarted.workspace_id)).command.command_id)
        commands.append((await client.start(restarted.workspace_id)).command.command_id)
        deleted = await client.create()
        commands.append((await client.delete(deleted.workspace_id)).command.command_id)
        failed = await client.create()
        await client.inject(failed.workspace_id, sim.FAULT_VMM_CRASH)
        await client.wait_for(failed.workspace_id, S.WORKSPACE_STATE_FAILED)

        async def storage_released() -> bool:
            return (await client.cleanup(deleted.workspace_id)).state == obs.CLEANUP_STATE_COMPLETE

        await eventually(storage_released, what="the deleted workspace's files were not released")
        before = await snapshot(client, commands)
    assert len(before.workspaces) == 5

    assert await stop(server) == 0
    await start(server)
    async with Client.connect(server.address) as client:
        after = await snapshot(client, commands)
        assert after.workspaces == before.workspaces
        assert after.commands == before.commands
        assert after.instances == before.instances
        for workspace_id, events in before.events.items():
            assert after.events[workspace_id][: len(events)] == events
        # The stored expiration revision is what the checks compare against.
        assert (await client.get(up.workspace_id)).expiration.revision == 4
        stale = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=up.workspace_id, expected_expiration_revision=3)
        with pytest.raises(grpc.aio.AioRpcError) as excinfo:
            await client.ws.StopWorkspace(stale)
        assert excinfo.value.code() == grpc.StatusCode.ABORTED
        current = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=up.workspace_id, expected_expiration_revision=4)
        assert (await client.settle(client.ws.StopWorkspace, current)).workspace.state == S.WORKSPACE_STATE_STOPPED
        # FAILED still holds execution after the restart: force stop is accepted, then start.
        assert (await client.stop(failed.workspace_id, force=True)).workspace.state == S.WORKSPACE_STATE_STOPPED
        assert (await client.start(failed.workspace_id)).workspace.state == S.WORKSPACE_STATE_AVAILABLE
        # Resends of commands from before the restart are still resends.
        resent = await client.ws.StopWorkspace(
            ws.StopWorkspaceRequest(
                metadata=meta(commands[3]), workspace_id=stopped.workspace_id, mode=ws.STOP_MODE_GRACEFUL
            )
        )
        assert resent.command == before.commands[commands[3]]
    assert await stop(server) == 0
    assert integrity(server.data_dir / "kibo.db") == "ok"


async def test_sim_workspaces_survive_kill_9_in_the_state_they_had(server_factory: Factory) -> None:
    server = server_factory()
    async with Client.connect(server.address) as client:
        first = await client.create()
        second = await client.create()
        await client.stop(second.workspace_id)
        await client.start(second.workspace_id)
        stopped = await client.create()
        await client.stop(stopped.workspace_id)
        crashed = await client.create()
        await client.inject(crashed.workspace_id, sim.FAULT_VMM_CRASH)
        await client.wait_for(crashed.workspace_id, S.WORKSPACE_STATE_FAILED)
        ids = [first.workspace_id, second.workspace_id, stopped.workspace_id, crashed.workspace_id]
        before = {i: await client.get(i) for i in ids}
    assert [before[i].state for i in ids] == [
        S.WORKSPACE_STATE_AVAILABLE,
        S.WORKSPACE_STATE_AVAILABLE,
        S.WORKSPACE_STATE_STOPPED,
        S.WORKSPACE_STATE_FAILED,
    ]
    assert before[second.workspace_id].execution_generation == 2

    await kill(server)
    await start(server)
    async with Client.connect(server.address) as client:
        for workspace_id, old in before.items():
            new = await client.get(workspace_id)
            assert (new.state, new.execution_generation) == (old.state, old.execution_generation), workspace_id
        # The restarted simulated node re-adopted the running instances: they can crash, and stop.
        await client.inject(first.workspace_id, sim.FAULT_VMM_CRASH)
        assert (await client.wait_for(first.workspace_id, S.WORKSPACE_STATE_FAILED)).execution_generation == 1
        graceful = await client.stop(second.workspace_id)
        assert (graceful.command.state, graceful.workspace.state) == (SUCCEEDED, S.WORKSPACE_STATE_STOPPED)
        assert graceful.command.result.durability == wp.STOP_DURABILITY_CONFIRMED
        forced = await client.stop(crashed.workspace_id, force=True)
        assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED
        started = await client.start(stopped.workspace_id)
        assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
        assert started.workspace.execution_generation == 2
    assert await stop(server) == 0


async def test_work_stalled_at_kill_time_resumes_after_restart(server_factory: Factory) -> None:
    server = server_factory()
    async with Client.connect(server.address) as client:
        to_stop = await client.create()
        to_start = await client.create()
        await client.stop(to_start.workspace_id)
        to_delete = await client.create()
        for workspace in (to_stop, to_start, to_delete):
            await client.inject(workspace.workspace_id, sim.FAULT_STALL)
        await client.inject("", sim.FAULT_STALL)
        requests: list[tuple[str, Any, int]] = [
            ("CreateWorkspace", ws.CreateWorkspaceRequest(metadata=meta()), S.WORKSPACE_STATE_AVAILABLE),
            (
                "StopWorkspace",
                ws.StopWorkspaceRequest(metadata=meta(), workspace_id=to_stop.workspace_id),
                S.WORKSPACE_STATE_STOPPED,
            ),
            (
                "StartWorkspace",
                ws.StartWorkspaceRequest(metadata=meta(), workspace_id=to_start.workspace_id),
                S.WORKSPACE_STATE_AVAILABLE,
            ),
            (
                "DeleteWorkspace",
                ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=to_delete.workspace_id),
                S.WORKSPACE_STATE_DELETED,
            ),
        ]
        pending = {}
        for method, request, _ in requests:
            response = await getattr(client.ws, method)(request)
            assert response.command.state in RUNNING_STATES, method
            assert response.workspace.state in TRANSITIONAL, method
            pending[method] = response

    await kill(server)
    await start(server)
    async with Client.connect(server.address) as client:
        for method, request, wanted in requests:
            settled = await client.settle(getattr(client.ws, method), request)
            assert settled.command.state == SUCCEEDED, (method, settled.command)
            assert settled.workspace.workspace_id == pending[method].workspace.workspace_id
            assert settled.workspace.state == wanted, (method, state_name(settled.workspace.state))
        stop_id = requests[1][1].metadata.command_id
        assert (await client.command(stop_id)).result.durability == wp.STOP_DURABILITY_CONFIRMED
    assert await stop(server) == 0


# -- kill -9 under load ------------------------------------------------------------------------


@dataclass
class Load:
    acknowledged: dict[str, str] = field(default_factory=dict)  # command ID -> workspace ID
    # Acknowledged while still PENDING or RUNNING: work a kill may interrupt.
    unfinished: int = 0
    workspaces: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


async def worker(client: Client, rng: random.Random, load: Load) -> None:
    """Send random lifecycle commands until the server goes away."""
    while True:
        workspace_id = rng.choice(load.workspaces) if load.workspaces else ""
        choice = rng.random() if workspace_id else 0.0
        request: Any
        if choice < 0.2 or len(load.workspaces) < 4:
            method, request = client.ws.CreateWorkspace, ws.CreateWorkspaceRequest(metadata=meta())
        elif choice < 0.45:
            mode = ws.STOP_MODE_FORCE if rng.random() < 0.3 else ws.STOP_MODE_GRACEFUL
            request = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id, mode=mode)
            method = client.ws.StopWorkspace
        elif choice < 0.8:
            request = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
            method = client.ws.StartWorkspace
        elif choice < 0.9:
            method = client.ws.DeleteWorkspace
            request = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
        else:
            method = client.ws.SetWorkspaceLabels
            request = ws.SetWorkspaceLabelsRequest(
                metadata=meta(), workspace_id=workspace_id, labels={"n": str(rng.randrange(100))}
            )
        try:
            response = await method(request)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                return  # killed
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                load.unexpected.append(f"{type(request).__name__}: {error.code()} {error.details()}")
            continue
        load.acknowledged[request.metadata.command_id] = response.workspace.workspace_id
        load.unfinished += response.command.state not in TERMINAL
        if isinstance(request, ws.CreateWorkspaceRequest):
            load.workspaces.append(response.workspace.workspace_id)


async def test_kill_9_under_load_loses_no_acknowledged_command(server_factory: Factory) -> None:
    rng = random.Random(20261107)
    load = Load()
    # Slow steps and no settle wait: commands are answered PENDING and are still executing when killed.
    server = server_factory("--sim-step-ms", "30", "--settle-ms", "0")
    for _ in range(5):
        async with Client.connect(server.address) as client:
            workers = [asyncio.create_task(worker(client, random.Random(rng.random()), load)) for _ in range(4)]
            # Let the load run for a while (this only decides when to pull the plug).
            await asyncio.sleep(rng.uniform(0.2, 0.8))
            await kill(server)
            await asyncio.wait_for(asyncio.gather(*workers), 10)
        assert integrity_of_copy(server.data_dir) == "ok"
        await start(server)
    assert not load.unexpected, load.unexpected
    assert len(load.acknowledged) > 20
    assert load.unfinished > 10

    async with Client.connect(server.address) as client:
        for command_id, workspace_id in load.acknowledged.items():
            command = await client.command(command_id)
            assert command.workspace_id == workspace_id

        async def all_terminal() -> bool:
            for command_id in load.acknowledged:
                if (await client.command(command_id)).state not in TERMINAL:
                    return False
            return True

        await eventually(all_terminal, within=15, what="acknowledged commands did not all finish")

        async def all_steady() -> bool:
            return all(w.state in STEADY for w in await list_all(client))

        await eventually(all_steady, within=15, what="workspaces stayed in a transitional state")
        workspaces = await list_all(client)
        assert {w.workspace_id for w in workspaces} >= set(load.workspaces)
        for workspace in workspaces:
            assert workspace.state not in TRANSITIONAL
        # Every workspace still works: a steady one accepts what its state allows.
        for workspace in workspaces:
            if workspace.state == S.WORKSPACE_STATE_STOPPED:
                started = await client.start(workspace.workspace_id)
                assert started.command.state == SUCCEEDED, started
        await eventually(all_steady, within=15, what="workspaces stayed in a transitional state")
        # The events feed of every workspace survived the kills without a gap.
        events = await assert_feeds_have_no_gap(client)
        assert events > len(load.acknowledged)
        print(f"kill -9: 5 kills, {len(load.acknowledged)} acknowledged, 0 lost, {events} events checked")
    assert await stop(server) == 0
    assert integrity(server.data_dir / "kibo.db") == "ok"
