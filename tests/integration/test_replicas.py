"""Three `kibo-ctrl serve` replicas on one PostgreSQL database, as separate processes: each
serves the whole API (a command sent to a follower settles, watched from any replica), every
replica's watch sees the same changes in the same order, and when the leader is killed with
-9 another takes over its loops."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import grpc
import psycopg
import pytest
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S
from tests.postgres import Databases
from tests.server import ServerProcess


async def _watch(client: Client, workspace_id: str) -> list[str]:
    """Every message of a watch until it ends (after DELETED): the etags, in order."""
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
    etags = []
    while (message := await call.read()) is not grpc.aio.EOF:
        etags.append(f"{message.workspace.etag}:{message.workspace.state}")
    return etags


def _leader_pid(url: str) -> int:
    """The leader's process (its replica name is host/pid/nonce)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT holder FROM kibo_leader WHERE expires_at > now()").fetchone()
    assert row is not None, "no leader"
    return int(str(row[0]).split("/")[1])


@contextlib.asynccontextmanager
async def _clients(replicas: list[ServerProcess]) -> AsyncIterator[list[Client]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Client.connect(r.address)) for r in replicas]


@pytest.mark.timeout(180)
async def test_three_replicas_serve_one_control_plane_and_survive_the_leaders_kill_9(
    server_factory: Callable[..., ServerProcess], postgres_databases: Databases
) -> None:
    url = postgres_databases.create()
    replicas = [server_factory(store=url) for _ in range(3)]
    async with _clients(replicas) as clients:
        # Commands sent to each replica settle, whichever replica leads.
        made = [(await c.create()).workspace_id for c in clients]
        for client in clients:
            for workspace_id in made:
                assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE

        # One workspace, its changes made through the three replicas, watched on all three.
        subject = made[0]
        watches = [asyncio.create_task(_watch(c, subject)) for c in clients]
        await asyncio.sleep(0.3)  # every watch has its snapshot
        await clients[1].stop(subject)
        await clients[2].start(subject)
        await clients[0].stop(subject)
        await clients[1].delete(subject)
        seen = await asyncio.wait_for(asyncio.gather(*watches), 30)
        assert seen[0] == seen[1] == seen[2], seen
        # Every change once, in order: each version is the one before it plus one (no gap, no
        # repeat), from the snapshot to the DELETED change, through 4 commands' worth of changes.
        versions = [int(etag.split(":")[0]) for etag in seen[0]]
        assert versions == list(range(versions[0], versions[0] + len(versions))), seen[0]
        assert len(versions) >= 8, seen[0]
        assert seen[0][-1].endswith(f":{S.WORKSPACE_STATE_DELETED}")

        # kill -9 the leader: a survivor takes the lease and the loops with it.
        leader = _leader_pid(url)
        dead = next(r for r in replicas if r.process is not None and r.process.pid == leader)
        survivors = [c for r, c in zip(replicas, clients, strict=True) if r is not dead]
        dead.kill()
        killed = time.monotonic()
        after = await survivors[0].create()
        failover_s = time.monotonic() - killed
        assert after.state == S.WORKSPACE_STATE_AVAILABLE
        assert _leader_pid(url) != leader
        # What the dead leader acknowledged is there, read through either survivor.
        for client in survivors:
            assert {w for w in made[1:]} <= {
                w.workspace_id for w in (await client.ws.ListWorkspaces(ws.ListWorkspacesRequest())).workspaces
            }
            assert (await client.get(after.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        # The new leader works for commands sent to the other survivor too.
        second = await survivors[1].create()
        assert second.state == S.WORKSPACE_STATE_AVAILABLE
        print(f"failover: kill -9 of the leader to the next create AVAILABLE in {failover_s:.2f}s")
