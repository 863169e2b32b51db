"""The store's first token is made only by the transaction that finds none (issue 26): the
check and the insert are one transaction, so of replicas starting together on a fresh
database one makes it (tests/integration/test_postgres_server.py starts four at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kibo_ctrl import tokens
from kibo_ctrl.domain.access import Role
from kibo_ctrl.store.sqlite import SqliteStore


async def test_the_first_token_is_made_once_whoever_asks(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "kibo.db")
    try:
        made = await asyncio.gather(*(tokens.create_first(store, "default", Role.ADMIN) for _ in range(4)))
        assert sum(result is not None for result in made) == 1
        assert len(await store.read(lambda r: r.list_tokens())) == 1
        # Later starts find it and make none.
        assert await tokens.create_first(store, "default", Role.ADMIN) is None
        assert len(await store.read(lambda r: r.list_tokens())) == 1
    finally:
        await store.close()
