"""Bearer tokens: making them, and turning an Authorization header into a Caller.

Only token hashes are stored; a token is shown once, when it is made. Transports call
`Authenticator.authenticate` with the Authorization header and pass the resulting Caller
(domain/access.py: tenant and role) to the API."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable

from ..domain.access import LOCAL_OPERATOR, Caller, Role, TokenRecord
from ..domain.errors import PermissionDenied, RateLimited, Unauthenticated

TOKEN_PREFIX = "kibo_"
# How long a token lookup is trusted: a revoked token stops working within this time.
CACHE_SECONDS = 2.0


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


Lookup = Callable[[str], Awaitable[TokenRecord | None]]
# What a listener with client certificates also checks: the caller and the common names of the
# peer's verified certificate (the transport's), to the caller it accepts; raises to refuse.
PeerRule = Callable[[Caller, tuple[str, ...]], Caller]


class Authenticator:
    """Turns an Authorization header into a Caller; applies the per-tenant rate limit."""

    def __init__(
        self,
        lookup: Lookup | None,
        rate_per_second: float = 0.0,
        burst: float = 0.0,
        nodes: bool = False,
        peer: PeerRule | None = None,
    ) -> None:
        # lookup None: authentication is off and every caller is the local admin.
        self._lookup = lookup
        # Whether node tokens are accepted: only by the node API's authenticator (api/node_api.py).
        self._nodes = nodes
        # On a mutual-TLS listener (the node port, a node's guest hop): the certificate's rule.
        self.peer = peer
        self._cache: dict[str, tuple[float, Caller | None]] = {}
        self._limiter = RateLimiter(rate_per_second, burst or 2 * rate_per_second)

    @property
    def enabled(self) -> bool:
        return self._lookup is not None

    async def authenticate(self, authorization: str | None) -> Caller:
        caller = await self.identify(authorization)
        self._limiter.take(caller.tenant)
        return caller

    async def identify(self, authorization: str | None) -> Caller:
        """Who sent this header, without taking from the rate limit: the HTTP listener's
        guard asks before it reads a request's body, the handler asks again (cached)."""
        if self._lookup is None:
            return LOCAL_OPERATOR
        if not authorization:
            raise Unauthenticated("this server needs a token: send 'Authorization: Bearer TOKEN'")
        # Remembered by the header itself: a client sends the same one on every call, and the
        # answer (or the refusal) holds for CACHE_SECONDS either way.
        now = time.monotonic()
        cached = self._cache.get(authorization)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            caller = cached[1]
        else:
            caller = await self._caller_of(authorization)
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[authorization] = (now, caller)
        if caller is None:
            raise Unauthenticated("the token is not valid (unknown or revoked)")
        if caller.role is Role.NODE and not self._nodes:
            raise PermissionDenied("a node token may call only the node API (kibo.node.v1.NodeService)")
        return caller

    async def _caller_of(self, authorization: str) -> Caller | None:
        """The caller a header names; None for a token unknown or revoked."""
        assert self._lookup is not None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the Authorization header must be 'Bearer TOKEN'")
        record = await self._lookup(token_hash(token.strip()))
        return None if record is None or record.revoked else Caller(record.tenant, record.role)

    def for_nodes(self, peer: PeerRule | None = None) -> Authenticator:
        """The same tokens and rate limit, for the node API: node tokens accepted (and on the
        node port, `peer`: the client certificate must be the token's node's)."""
        gate = Authenticator(self._lookup, nodes=True, peer=peer)
        gate._cache, gate._limiter = self._cache, self._limiter
        return gate


class RateLimiter:
    """A token bucket per tenant. rate 0 means no limit."""

    def __init__(self, rate_per_second: float, burst: float) -> None:
        self.rate = rate_per_second
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, tenant: str) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        tokens, last = self._buckets.get(tenant, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens < 1:
            self._buckets[tenant] = (tokens, now)
            raise RateLimited(
                f"tenant {tenant} is over its request rate ({self.rate:g}/s)",
                retry_after=(1 - tokens) / self.rate,
            )
        self._buckets[tenant] = (tokens - 1, now)


# For methods that carry their own authorization (a data-plane credential).
OPEN = Authenticator(None)
