"""The records of the node link's certificates (SECURITY.md: the node link): the cluster CA
the store keeps (one per store), and what each join token was used for. Records only; the
cryptography is engine/pki.py's, the one-time rule engine/cluster_ca.py's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterCa:
    """The cluster CA: PEM certificate and PKCS#8 private key. Every replica of one store
    serves with the same one (the first to start made it; the others found it)."""

    cert_pem: str
    key_pem: str
    create_time: float


@dataclass(frozen=True)
class NodeIssuance:
    """A join token's one use: the certificate issued for it, and for which public key (a
    retry with that key gets the same certificate; another key is refused)."""

    token_id: str
    node_id: str
    key_sha256: str
    cert_pem: str
    issue_time: float
