"""Reliability: clients racing on one workspace, a full disk, a data dir that turns read-only.

The kill -9 crash test (with the events-feed check) is in tests/system/test_durability.py. The
disk tests mount their own filesystems (they run as root, like the rest of the suite here)
and always unmount them."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import TERMINAL, Client, S, error_of, meta, state_name
from tests.server import TEST_FLAGS, ServerProcess, free_port
from tests.system.test_durability import STEADY, assert_feeds_have_no_gap, eventually, feed_gaps, list_all

Factory = Callable[..., ServerProcess]
SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED


# -- concurrency: many clients racing on one workspace ------------------------------------------


@dataclass
class Race:
    accepted: dict[str, str] = field(default_factory=dict)  # command ID -> method
    rejected: dict[str, int] = field(default_factory=dict)  # "CODE REASON" -> count
    unexpected: list[str] = field(default_factory=list)


async def racer(
    client: Client, workspace_id: str, rng: random.Random, race: Race, until: float, closer: bool = False
) -> None:
    """Stop, start, force-stop (and late in the race, delete) the one workspace as fast as answered.
    The closer sends a delete in every turn of the race's last second until one is accepted,
    so that the race always ends with a delete in it."""
    while time.monotonic() < until:
        late = until - time.monotonic() < 1.0
        choice = rng.random()
        request: Any
        deleting = closer and "Delete" not in race.accepted.values()
        if late and (choice < 0.05 or deleting):
            method, request = client.ws.DeleteWorkspace, ws.DeleteWorkspaceRequest(metadata=meta())
        elif choice < 0.4:
            method, request = client.ws.StopWorkspace, ws.StopWorkspaceRequest(metadata=meta())
        elif choice < 0.55:
            request = ws.StopWorkspaceRequest(metadata=meta(), mode=ws.STOP_MODE_FORCE)
            method = client.ws.StopWorkspace
        else:
            method, request = client.ws.StartWorkspace, ws.StartWorkspaceRequest(metadata=meta())
        request.workspace_id = workspace_id
        name = type(request).__name__.removesuffix("WorkspaceRequest")
        if name == "Stop" and request.mode == ws.STOP_MODE_FORCE:
            name = "ForceStop"
        try:
            response = await method(request)
        except grpc.aio.AioRpcError as error:
            decoded = error_of(error)
            key = f"{decoded.code.name} {decoded.reason}"
            race.rejected[key] = race.rejected.get(key, 0) + 1
            if decoded.code != grpc.StatusCode.FAILED_PRECONDITION:
                race.unexpected.append(f"{name}: {key} {error.details()}")
            continue
        if response.command.command_id != request.metadata.command_id:
            race.unexpected.append(f"{name}: answered with command {response.command.command_id}")
        race.accepted[request.metadata.command_id] = name


async def test_many_clients_racing_on_one_workspace_end_in_a_state_the_rules_allow(server_factory: Factory) -> None:
    # No settle wait: commands are answered PENDING, so the racers overlap with work in flight.
    server = server_factory("--settle-ms", "0")
    race = Race()
    async with Client.connect(server.address) as setup:
        workspace_id = (await setup.create()).workspace_id
    rng = random.Random(20261107)
    until = time.monotonic() + 4.0
    # 12 racers, each on its own channel (its own client), each with its own command IDs.
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client.connect(server.address)) for _ in range(12)]
        racers = [racer(c, workspace_id, random.Random(rng.random()), race, until, c is clients[0]) for c in clients]
        await asyncio.wait_for(asyncio.gather(*racers), 30)
    assert not race.unexpected, race.unexpected
    kinds = set(race.accepted.values())
    assert {"Stop", "Start", "Delete"} <= kinds, race.accepted
    assert len(race.accepted) > 10 and race.rejected, (len(race.accepted), race.rejected)

    async with Client.connect(server.address) as client:

        async def all_terminal() -> bool:
            return all([(await client.command(c)).state in TERMINAL for c in race.accepted])

        await eventually(all_terminal, within=20, what="accepted commands did not all finish")
        final = await client.wait_steady(workspace_id, within=20)
        assert final.state in STEADY
        commands = {c: await client.command(c) for c in race.accepted}
        events = await client.events(workspace_id)
        assert not feed_gaps(final, events), feed_gaps(final, events)
        # An accepted delete is never superseded: it SUCCEEDED, and the workspace is DELETED.
        deletes = [c for c, kind in race.accepted.items() if kind == "Delete"]
        assert deletes and all(commands[c].state == SUCCEEDED for c in deletes), [commands[c] for c in deletes]
        assert final.state == S.WORKSPACE_STATE_DELETED, state_name(final.state)
        # Once a delete was accepted, nothing started the workspace again.
        accepted_at = {
            e.command_id: e.sequence for e in events if e.type == obs.EVENT_TYPE_COMMAND_ACCEPTED and e.command_id
        }
        first_delete = min(accepted_at[c] for c in deletes)
        later = [e for e in events if e.sequence > first_delete and e.type == obs.EVENT_TYPE_STATE_CHANGED]
        assert all(e.to_state not in (S.WORKSPACE_STATE_STARTING, S.WORKSPACE_STATE_AVAILABLE) for e in later), later
        late_starts = [c for c, kind in race.accepted.items() if kind == "Start" and accepted_at[c] > first_delete]
        assert not late_starts, late_starts
        print(
            f"race: {len(race.accepted)} accepted {sorted(kinds)}, rejected {race.rejected}, "
            f"final {state_name(final.state)}, {len(events)} events"
        )
    assert await asyncio.to_thread(server.stop) == 0


# -- disks that fill up or turn read-only -------------------------------------------------------


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


@contextlib.contextmanager
def mounted(mount_point: Path, *mount_args: str, servers: list[ServerProcess]) -> Iterator[Path]:
    """Mount a filesystem for a test; kill its servers and unmount it whatever happens."""
    mount_point.mkdir(parents=True, exist_ok=True)
    run("mount", *mount_args, str(mount_point))
    try:
        yield mount_point
    finally:
        for server in servers:
            if server.process is not None and server.process.poll() is None:
                server.kill()
        try:
            run("umount", str(mount_point))
        except subprocess.CalledProcessError:
            run("umount", "--lazy", str(mount_point))  # never leave it mounted
            raise


def fill(directory: Path) -> Path:
    """Write a filler file until the filesystem is full."""
    filler = directory / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * 4096
        while True:
            try:
                os.write(descriptor, chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC
                break
        # The last partial page too.
        with contextlib.suppress(OSError):
            while os.write(descriptor, b"\0"):
                pass
    finally:
        os.close(descriptor)
    assert os.statvfs(directory).f_bavail == 0
    return filler


def truncate_wal(db: Path) -> None:
    """Checkpoint and empty the WAL (from another connection, as the server runs)."""
    deadline = time.monotonic() + 10
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        while conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] != 0:
            assert time.monotonic() < deadline, "the WAL was not truncated"
            time.sleep(0.01)


async def unavailable(call: Any) -> str:
    """Await a command that must fail because the store cannot write; its message."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
        return str(error.details())
    raise AssertionError("the command was accepted")


async def test_a_full_disk_answers_unavailable_keeps_reads_and_recovers_when_space_returns(
    server_factory: Factory, tmp_path: Path
) -> None:
    servers: list[ServerProcess] = []
    with mounted(tmp_path / "data", "-t", "tmpfs", "-o", "size=8m", "tmpfs", servers=servers) as data_dir:
        # Slow steps and no settle wait: a stop is still executing when the disk fills up.
        server = server_factory("--sim-step-ms", "100", "--settle-ms", "0", data_dir=data_dir)
        servers.append(server)
        acknowledged: list[str] = []
        failed: list[ws.CreateWorkspaceRequest | ws.StartWorkspaceRequest] = []
        async with Client.connect(server.address) as client:
            running = await client.create()
            stopped = await client.create()
            await client.stop(stopped.workspace_id)
            stopping = await client.ws.StopWorkspace(
                ws.StopWorkspaceRequest(metadata=meta(), workspace_id=running.workspace_id)
            )
            acknowledged.append(stopping.command.command_id)
            assert stopping.command.state not in TERMINAL
            # An empty WAL: from here on every commit needs new space.
            await asyncio.to_thread(truncate_wal, data_dir / "kibo.db")
            filler = fill(data_dir)

            create = ws.CreateWorkspaceRequest(metadata=meta())
            message = await unavailable(client.ws.CreateWorkspace(create))
            assert "the store is unavailable" in message and "full" in message, message
            start = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=stopped.workspace_id)
            await unavailable(client.ws.StartWorkspace(start))
            failed += [create, start]
            # Reads keep working.
            assert (await client.get(stopped.workspace_id)).state == S.WORKSPACE_STATE_STOPPED
            assert len(await list_all(client)) == 2
            assert await client.events(running.workspace_id)
            assert (await client.command(stopping.command.command_id)).command_id == stopping.command.command_id

            # Space returns: the same calls are accepted now, without a restart.
            filler.unlink()
            for request in (create, start):
                method = getattr(client.ws, type(request).__name__.removesuffix("Request"))
                settled = await client.settle(method, request)
                assert settled.command.state == SUCCEEDED, settled.command
                acknowledged.append(request.metadata.command_id)
            # The stop that was executing when the disk filled up finishes too.
            assert (await client.wait_for(running.workspace_id, S.WORKSPACE_STATE_STOPPED)).state
            assert (await client.command(stopping.command.command_id)).state == SUCCEEDED

            # A failed call recorded nothing: fill again, fail a stop, then check after a restart.
            await asyncio.to_thread(truncate_wal, data_dir / "kibo.db")
            filler = fill(data_dir)
            lost = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=stopped.workspace_id)
            await unavailable(client.ws.StopWorkspace(lost))
            filler.unlink()
        assert await asyncio.to_thread(server.stop) == 0
        await asyncio.to_thread(server.start)
        async with Client.connect(server.address) as client:
            for command_id in acknowledged:
                assert (await client.command(command_id)).state == SUCCEEDED
            try:
                await client.command(lost.metadata.command_id)
                raise AssertionError("a command was recorded for a call that failed")
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.NOT_FOUND
            assert (await client.get(stopped.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
            await assert_feeds_have_no_gap(client)
        assert await asyncio.to_thread(server.stop) == 0
        with contextlib.closing(sqlite3.connect(data_dir / "kibo.db")) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def ext4_read_only_on_error(image: Path) -> tuple[str, ...]:
    """Mount arguments for a small ext4 image that turns read-only on its first error."""
    with open(image, "wb") as f:
        f.truncate(16 * 1024 * 1024)
    run("mkfs.ext4", "-q", "-F", str(image))
    return ("-o", "loop,errors=remount-ro", str(image))


def trigger_error(mount_point: Path) -> None:
    """What the kernel does on a filesystem error: the mount turns read-only under the server.
    (`mount -o remount,ro` is refused while the server holds the database open for writing.)"""
    source = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", str(mount_point)], check=True, capture_output=True, text=True
    ).stdout.strip()
    Path(f"/sys/fs/ext4/{Path(source).name}/trigger_fs_error").write_text("kibo test\n")
    try:
        (mount_point / "probe").write_text("")
    except OSError as error:
        assert error.errno == errno.EROFS
    else:
        raise AssertionError("the filesystem is still writable")


def serve(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run `kibo-ctrl serve` on a data dir, expecting it to exit by itself."""
    command = [sys.executable, "-m", "kibo_ctrl", "serve", "--data-dir", str(data_dir), "--insecure-no-auth"]
    command += ["--listen", f"127.0.0.1:{free_port()}", "--http-listen", f"127.0.0.1:{free_port()}", *TEST_FLAGS]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


async def test_a_read_only_data_dir_answers_unavailable_and_a_server_will_not_start_on_one(
    server_factory: Factory, tmp_path: Path
) -> None:
    servers: list[ServerProcess] = []
    mount_args = ext4_read_only_on_error(tmp_path / "ext4.img")
    with mounted(tmp_path / "data", *mount_args, servers=servers) as data_dir:
        server = server_factory(data_dir=data_dir)
        servers.append(server)
        async with Client.connect(server.address) as client:
            ready = await client.create()
            trigger_error(data_dir)
            message = await unavailable(
                client.ws.StopWorkspace(ws.StopWorkspaceRequest(metadata=meta(), workspace_id=ready.workspace_id))
            )
            assert "the store is unavailable" in message, message
            await unavailable(client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta())))
            # Reads and health keep answering.
            assert (await client.get(ready.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
            assert [w.workspace_id for w in await list_all(client)] == [ready.workspace_id]
            assert await client.events(ready.workspace_id)
            assert client.channel is not None
            health = health_pb2_grpc.HealthStub(client.channel)
            reply = await health.Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await asyncio.to_thread(server.kill)
        # Starting on the read-only data dir: a clear message and a non-zero exit, no traceback.
        result = await asyncio.to_thread(serve, data_dir)
        assert result.returncode != 0
        assert "Traceback" not in result.stderr, result.stderr
        assert "kibo-ctrl:" in result.stderr and "read" in result.stderr.lower(), result.stderr

    # An empty data dir on a filesystem mounted read-only.
    with mounted(tmp_path / "empty", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", servers=servers) as empty:
        result = await asyncio.to_thread(serve, empty)
        assert result.returncode != 0
        assert "Traceback" not in result.stderr, result.stderr
        assert "kibo-ctrl:" in result.stderr, result.stderr
