"""The cluster CA in the store, and the rules of issuing node certificates (SECURITY.md: the
node link).

`ensure` makes the CA once per store: the check and the insert are one transaction (an
insert if absent), so replicas starting together on a fresh database, or a `kibo-ctrl token
create --node` racing a first `serve`, agree on one CA. `issue` spends a join token: the first
certificate issued for a token is recorded with its public key in the same transaction, a
retry with that key (a node that crashed before saving its answer) gets the same certificate,
and any other key is refused, so a join token that leaked after its use joins nobody.
`renew` is for a node that already holds a certificate (it called over mutual TLS with it)."""

from __future__ import annotations

import hmac

from ..domain.certificates import ClusterCa, NodeIssuance
from ..domain.errors import Conflict, Unauthenticated
from ..domain.nodes import node_id as check_node_id
from ..store.base import Reader, Store, Tx
from . import pki


async def ensure(store: Store) -> ClusterCa:
    """The store's cluster CA, made now if it has none."""
    existing = await store.read(_get)
    if existing is not None:
        return existing
    cert_pem, key_pem = pki.make_ca()

    def add(tx: Tx) -> ClusterCa:
        tx.add_cluster_ca(ClusterCa(cert_pem, key_pem, tx.now))
        # Whoever won the insert, every caller reads and serves the stored one.
        stored = tx.get_cluster_ca()
        assert stored is not None
        return stored

    return await store.transact(add)


def _get(reader: Reader) -> ClusterCa | None:
    return reader.get_cluster_ca()


def issue(tx: Tx, ca: ClusterCa, node_id: str, csr_pem: str, proof: str) -> str:
    """The certificate for a join token's node: made once per token (in `tx`), for one key.
    The token is the node's active node token whose digest makes `proof` for this CSR (the
    token never crosses the main port); none: UNAUTHENTICATED, nothing written."""
    key, key_sha256 = pki.csr_key(csr_pem)
    check_node_id(node_id)
    token_id = proven(tx, node_id, csr_pem, proof)
    used = tx.get_node_issuance(token_id)
    if used is not None:
        if used.key_sha256 == key_sha256 and used.node_id == node_id:
            return used.cert_pem
        raise Conflict(
            "this join token was used already (by another key): it joins one node, once",
            hint=f"make a new join token: kibo-ctrl token create --node {node_id}",
        )
    cert_pem = pki.sign_node(ca.cert_pem, ca.key_pem, key, node_id)
    tx.add_node_issuance(NodeIssuance(token_id, node_id, key_sha256, cert_pem, tx.now))
    return cert_pem


def proven(reader: Reader, node_id: str, csr_pem: str, proof: str) -> str:
    """The ID of the node's active token whose proof this is."""
    if pki.PROOF.fullmatch(proof):
        for record, digest in reader.node_token_digests(node_id):
            if hmac.compare_digest(pki.join_proof(digest, node_id, csr_pem), proof):
                return record.id
    raise Unauthenticated(
        f"no active join token of node {node_id} made this join proof",
        hint=f"make a join token: kibo-ctrl token create --node {node_id}",
    )


def renew(ca: ClusterCa, node_id: str, csr_pem: str) -> str:
    """A new certificate for a node that proved it holds one (mutual TLS): no token spent."""
    key, _ = pki.csr_key(csr_pem)
    return pki.sign_node(ca.cert_pem, ca.key_pem, key, check_node_id(node_id))
