"""WatchEvents across three `kibo-ctrl serve` replicas on one PostgreSQL database (issue 26
item 7): a tenant's watch on one replica sees every event of a workload driven through all
three, in sequence order; cut off mid-way and resumed on another replica after the last
sequence it saw, it misses none and repeats none; and it never shows another tenant's event,
while that tenant works on the same replicas at the same time."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Callable

import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs

from tests.client import Client
from tests.integration.test_fleet_events import listed, seqs
from tests.postgres import Databases
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]


def token(url: str, tenant: str) -> str:
    command = [sys.executable, "-m", "kibo_ctrl", "token", "create", "--tenant", tenant, "--store", url]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


@contextlib.asynccontextmanager
async def connected(replicas: list[ServerProcess], secret: str) -> AsyncIterator[list[Client]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Client.connect(r.address, secret)) for r in replicas]


class Watch:
    """One WatchEvents call and what it received: (resume_after_sequence, event or None)."""

    def __init__(self, client: Client, after: int) -> None:
        self.call = client.obs.WatchEvents(obs.WatchEventsRequest(after_sequence=after))
        self.events: list[obs.WorkspaceEvent] = []
        self.resume = after
        self.opened = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.call:
            self.opened.set()
            self.resume = message.resume_after_sequence
            if message.HasField("event"):
                self.events.append(message.event)

    async def until(self, count: int, within: float = 20) -> None:
        for _ in range(int(within / 0.02)):
            if len(self.events) >= count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{len(self.events)} events of {count}")

    async def cut(self) -> int:
        """Disconnect; the sequence to resume after."""
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        return self.resume


async def caught_up(client: Client, start: int, seen: Callable[[], list[obs.WorkspaceEvent]]) -> list[int]:
    """The stored events after `start`, once what the watch has seen is all of them (events
    may still come after a workload's last answer: storage released after a delete)."""
    stored: list[int] = []
    for _ in range(100):
        stored = seqs([e for e in await listed(client) if e.sequence > start])
        if seqs(seen()) == stored:
            await asyncio.sleep(0.5)  # and nothing more comes
            stored = seqs([e for e in await listed(client) if e.sequence > start])
            if seqs(seen()) == stored:
                return stored
        await asyncio.sleep(0.2)
    return stored


async def workload(clients: list[Client], rounds: int) -> set[str]:
    """Workspaces made, stopped, started and deleted through every replica, concurrently."""
    made = await asyncio.gather(*(clients[i % 3].create() for i in range(3)))
    ids = [w.workspace_id for w in made]
    for step in range(rounds):
        await asyncio.gather(*(clients[(i + step + 1) % 3].stop(w) for i, w in enumerate(ids)))
        await asyncio.gather(*(clients[(i + step + 2) % 3].start(w) for i, w in enumerate(ids)))
    await asyncio.gather(*(clients[(i + 1) % 3].delete(w) for i, w in enumerate(ids)))
    return set(ids)


@pytest.mark.timeout(180)
async def test_a_watch_across_three_replicas_sees_every_event_in_order_and_resumes_on_another(
    server_factory: Factory, postgres_databases: Databases
) -> None:
    url = postgres_databases.create()
    replicas = [server_factory(store=url, auth=True) for _ in range(3)]
    mine, theirs = token(url, "fleet-a"), token(url, "fleet-b")
    async with connected(replicas, mine) as clients, connected(replicas, theirs) as others:
        watch = Watch(clients[0], 0)
        await asyncio.wait_for(watch.opened.wait(), 10)  # its first message: where it starts
        start = watch.resume
        # Tenant A's workload on all three replicas, tenant B's beside it on the same ones.
        noise = asyncio.create_task(workload(others, 3))
        running = asyncio.create_task(workload(clients, 2))
        # Cut off mid-way, while commands run through all three replicas.
        await watch.until(15)
        resume = await watch.cut()
        before = list(watch.events)
        assert resume == before[-1].sequence
        assert not running.done()
        # Commands go on while nobody watches; then the watch resumes on replica 3.
        first = await running
        second = await workload(clients, 1)
        theirs_ids = await noise
        again = Watch(clients[2], resume)
        stored = await caught_up(clients[1], start, lambda: before + again.events)
        seen = before + again.events
        # Exactly the stored events of A since the start: none missed, none twice, in order.
        assert seqs(seen) == stored, (seqs(seen), stored)
        assert seqs(seen) == sorted(set(seqs(seen))) and len(seen) > 40
        assert {e.workspace_id for e in seen} == first | second
        assert not {e.workspace_id for e in seen} & theirs_ids
        # Every replica lists the same events.
        for client in clients:
            assert seqs([e for e in await listed(client) if e.sequence > start]) == stored
        await again.cut()
