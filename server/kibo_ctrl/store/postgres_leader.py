"""Leader election through PostgreSQL, for the loops that must run once across replicas
(scheduler, expiry, node liveness, the in-process node agents).

One lease row (`kibo_leader`): a replica becomes leader by taking an expired lease, which
adds one to its fencing token, and stays leader by renewing it every LEASE_S / 4. The loops
it then starts run with that token in their context (`FENCE`); the store checks it inside
each of their transactions, under the write lock (postgres.py), so once another replica
has taken the lease a deposed leader's late writes are refused, whatever it believes. A
leader that finds its lease taken, or cannot reach the database for LEASE_S, stops its loops
and the process (a supervisor restarts it as a follower); one that shuts down hands the
lease over at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from contextvars import ContextVar
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import psycopg

from ..domain.errors import StoreError, Unavailable

log = logging.getLogger("kibo.leader")

T = TypeVar("T")
P = ParamSpec("P")

LEASE_S = 3.0
# The fencing token of the leader-only loop running this code; None outside them.
FENCE: ContextVar[int | None] = ContextVar("kibo_leader_fence", default=None)


def deposed(token: int) -> Unavailable:
    return Unavailable(f"this replica is no longer the leader (its fencing token {token} is stale); retry later")


def acquire(conn: psycopg.Connection[Any], holder: str, lease_s: float) -> int | None:
    """The new fencing token if the lease was free (expired or handed over), else None."""
    row = conn.execute(
        "UPDATE kibo_leader SET holder = %s, token = token + 1, expires_at = now() + make_interval(secs => %s) "
        "WHERE id = 1 AND expires_at < now() RETURNING token",
        (holder, lease_s),
    ).fetchone()
    return None if row is None else int(row[0])


def renew(conn: psycopg.Connection[Any], holder: str, token: int, lease_s: float) -> bool:
    row = conn.execute(
        "UPDATE kibo_leader SET expires_at = now() + make_interval(secs => %s) "
        "WHERE id = 1 AND holder = %s AND token = %s RETURNING token",
        (lease_s, holder, token),
    ).fetchone()
    return row is not None


def release(conn: psycopg.Connection[Any], holder: str, token: int) -> None:
    conn.execute(
        "UPDATE kibo_leader SET expires_at = '-infinity' WHERE id = 1 AND holder = %s AND token = %s", (holder, token)
    )


def current(conn: psycopg.Connection[Any]) -> int:
    """The token of the latest leader (read under the write lock: no takeover meanwhile)."""
    row = conn.execute("SELECT token FROM kibo_leader WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


class LeaseStore(Protocol):
    replica: str

    async def locked(
        self, fn: Callable[Concatenate[psycopg.Connection[Any], P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...


async def _fenced(token: int, coroutine: Coroutine[Any, Any, None]) -> None:
    FENCE.set(token)  # this task's own context, and the tasks it starts
    await coroutine


async def lead(
    store: LeaseStore,
    loops: Callable[[], Iterable[Coroutine[Any, Any, None]]],
    on_deposed: Callable[[], None],
    lease_s: float = LEASE_S,
) -> None:
    """Campaign until elected; run `loops()` fenced while the lease holds; `on_deposed()` once
    it is lost."""
    token = None
    while token is None:
        with contextlib.suppress(StoreError):
            token = await store.locked(acquire, store.replica, lease_s)
        if token is None:
            await asyncio.sleep(lease_s / 4)
    log.warning("this replica leads the control plane (fencing token %d)", token)
    tasks = [asyncio.create_task(_fenced(token, coroutine)) for coroutine in loops()]
    loop = asyncio.get_running_loop()
    renewed = loop.time()
    try:
        while True:
            await asyncio.sleep(lease_s / 4)
            try:
                # A renewal that is merely slow (a busy writer) is waited for: it succeeds if
                # no other replica took the lease meanwhile, and only a takeover ends the lease.
                if not await store.locked(renew, store.replica, token, lease_s):
                    break  # another replica took the lease
                renewed = loop.time()
            except StoreError as error:
                log.warning("cannot renew the leader lease: %s", error)
                # The database cannot be asked for a lease-time: assume another replica took over.
                if loop.time() - renewed >= lease_s:
                    break
    except asyncio.CancelledError:
        # Shutting down: hand the lease over now rather than after it expires.
        with contextlib.suppress(StoreError):
            await store.locked(release, store.replica, token)
        raise
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    log.error("lost the leader lease (token %d): stopping; restart this replica to rejoin as a follower", token)
    on_deposed()
