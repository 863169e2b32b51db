"""Making, listing and revoking tokens in the store (for `kibo-ctrl token` and first start)."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from kibotos.token_discovery import prune_pointers, remove_pointer, write_pointer

from .api.auth import new_token, token_hash
from .domain.access import Role, TokenRecord, tenant_name
from .engine import cluster_ca, pki
from .store.base import Store, Tx

ADMIN_TOKEN_FILE = "admin.token"

log = logging.getLogger(__name__)


async def create(store: Store, tenant: str, role: Role) -> tuple[TokenRecord, str]:
    """A new token; the plain token is returned once and never stored."""
    tenant_name(tenant)
    token = new_token()

    def add(tx: Tx) -> TokenRecord:
        record = TokenRecord(id=f"tok-{uuid.uuid4().hex[:12]}", tenant=tenant, role=role, create_time=tx.now)
        tx.add_token(record, token_hash(token))
        return record

    return await store.transact(add), token


async def create_join(store: Store, node_id: str) -> tuple[TokenRecord, str]:
    """A node's join token: a node token (it acts as `node_id` only), '.', and the pin of the
    store's cluster CA (made now if it has none), which the node checks before it trusts the
    control plane (engine/pki.py join_token)."""
    ca = await cluster_ca.ensure(store)
    record, token = await create(store, node_id, Role.NODE)
    return record, pki.join_token(token, ca.cert_pem)


async def create_first(store: Store, tenant: str, role: Role) -> tuple[TokenRecord, str] | None:
    """The store's first token, made only if it holds none yet: the check and the insert are
    one transaction, so replicas starting together on a fresh database agree on one token
    (each used to find none, and each made its own); None when another made it first."""
    tenant_name(tenant)
    token = new_token()

    def add(tx: Tx) -> TokenRecord | None:
        if tx.list_tokens():
            return None
        record = TokenRecord(id=f"tok-{uuid.uuid4().hex[:12]}", tenant=tenant, role=role, create_time=tx.now)
        tx.add_token(record, token_hash(token))
        return record

    record = await store.transact(add)
    return None if record is None else (record, token)


async def revoke(store: Store, token_id: str) -> bool:
    return await store.transact(lambda tx: tx.revoke_token(token_id))


def write_private(path: Path, text: str) -> None:
    """Write a secret readable by its owner only (0600), replacing any old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text + "\n")
    os.replace(temporary, path)


def point_clients_at(listen: str, token_file: Path) -> Path | None:
    """Tell this user's clients (`kibo`, kibotos) where the admin token of the server on `listen`
    is, whatever its --data-dir: a pointer file the SDK's token discovery reads, naming this
    process (the pointer is removed when it stops: `unpoint`). Pointers of servers that are
    gone are removed first. Best effort: a server that cannot write it still serves (clients
    then need --token or KIBO_TOKEN); None then."""
    if not token_file.exists():
        return None
    try:
        for stale in prune_pointers():
            log.info("removed %s: its server is gone", stale)
        pointer = write_pointer(listen, token_file)
    except OSError as error:
        log.warning("could not record where the admin token is for local clients (%s): %s", listen, error)
        return None
    log.info("local clients find the admin token %s through %s", token_file, pointer)
    return pointer


def unpoint(pointer: Path | None) -> None:
    """A stopping server's pointer goes with it (unless another process wrote it since)."""
    if pointer is None:
        return
    try:
        remove_pointer(pointer)
    except OSError as error:
        log.warning("could not remove %s: %s", pointer, error)
