"""The token cache (api/auth.py), keyed by the Authorization header: one store lookup per
header per CACHE_SECONDS, never another header's caller, a revocation seen once it expires."""

from __future__ import annotations

import pytest
from kibo_ctrl.api import auth
from kibo_ctrl.api.auth import Authenticator, token_hash
from kibo_ctrl.domain.access import Role, TokenRecord
from kibo_ctrl.domain.errors import Unauthenticated


class Tokens:
    def __init__(self) -> None:
        self.records: dict[str, TokenRecord] = {}
        self.lookups = 0

    def add(self, token: str, tenant: str) -> None:
        self.records[token_hash(token)] = TokenRecord(f"tok-{tenant}", tenant, Role.ADMIN, 0.0, False)

    def revoke(self, token: str) -> None:
        record = self.records[token_hash(token)]
        self.records[token_hash(token)] = TokenRecord(record.id, record.tenant, record.role, 0.0, True)

    async def lookup(self, digest: str) -> TokenRecord | None:
        self.lookups += 1
        return self.records.get(digest)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(auth.time, "monotonic", clock)
    return clock


async def test_each_header_is_its_own_caller_and_looked_up_once(clock: Clock) -> None:
    tokens = Tokens()
    tokens.add("kibo_a", "alice")
    tokens.add("kibo_b", "bob")
    authenticator = Authenticator(tokens.lookup)
    for _ in range(3):
        assert (await authenticator.identify("Bearer kibo_a")).tenant == "alice"
        assert (await authenticator.identify("Bearer kibo_b")).tenant == "bob"
    assert tokens.lookups == 2


async def test_a_revoked_token_is_refused_once_its_entry_expires(clock: Clock) -> None:
    tokens = Tokens()
    tokens.add("kibo_a", "alice")
    authenticator = Authenticator(tokens.lookup)
    await authenticator.identify("Bearer kibo_a")
    tokens.revoke("kibo_a")
    clock.now += auth.CACHE_SECONDS
    with pytest.raises(Unauthenticated):
        await authenticator.identify("Bearer kibo_a")
    # The refusal is remembered as long, then asked again.
    with pytest.raises(Unauthenticated):
        await authenticator.identify("Bearer kibo_a")
    assert tokens.lookups == 2


@pytest.mark.parametrize("header", ["", "Basic kibo_a", "Bearer ", "kibo_a"])
async def test_a_malformed_header_is_refused_every_time(clock: Clock, header: str) -> None:
    tokens = Tokens()
    tokens.add("kibo_a", "alice")
    authenticator = Authenticator(tokens.lookup)
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            await authenticator.identify(header)
    assert tokens.lookups == 0
