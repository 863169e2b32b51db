"""NodeService.IssueNodeCertificate, and who may use the mutual-TLS node link (SECURITY.md:
the node link).

The control plane serves NodeService twice: on its main port only this bootstrap (a node's
join token buys its certificate once; every other method answers FAILED_PRECONDITION naming
the node port), and on the node port everything, to clients whose certificate the cluster CA
signed. There `certified_node` holds each call to the node its certificate names: the
certificate's CN must be the node token's node (the token stays as defense in depth), and the
node API then refuses any other node's ID. With `--insecure-node-link` (and
`--insecure-no-auth`) NodeService is plaintext on the main port, as before, and this
bootstrap refuses, so a node that expects mutual TLS says so instead of joining in the clear."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from kibo.node.v1 import node_service_pb2 as node_pb2

from ..domain.access import Caller, Role
from ..domain.certificates import ClusterCa
from ..domain.errors import Conflict, PermissionDenied
from ..domain.nodes import node_id
from ..engine import cluster_ca, pki
from ..store.base import Store
from .node_api import node_of

NODE_PORT_ONLY = (
    "this control plane serves the node API over mutual TLS on its node port: a node joins with a "
    "join token (kibo-ctrl token create --node ID), which carries the CA's pin"
)


def certified_node(caller: Caller, common_names: tuple[str, ...]) -> Caller:
    """The node port's rule: the client certificate (verified by grpc against the cluster CA)
    is the certificate of the node whose token came with the call."""
    if caller.role is not Role.NODE or common_names != (caller.tenant,):
        raise PermissionDenied(
            "the node port takes a node's own certificate with its own node token",
            hint="a node gets its certificate with its join token: kibo-ctrl node --token JOIN_TOKEN",
        )
    return caller


def control_plane_peer(caller: Caller, common_names: tuple[str, ...]) -> Caller:
    """A node's guest hop: the client certificate must be the control plane's (the cluster
    CA's own, whose name no node's certificate can carry), never a node's."""
    if common_names != (pki.CA_NAME,):
        raise PermissionDenied("the guest hop takes the control plane's certificate only")
    return caller


class NodeCertificates:
    """IssueNodeCertificate on either port. `ca` None: --insecure-node-link (refused)."""

    def __init__(self, store: Store, ca: ClusterCa | None, node_port: int, auth: bool) -> None:
        self._store = store
        self._ca = ca
        self.node_port = node_port
        self._auth = auth

    def _answer(self, cert_pem: str = "") -> node_pb2.IssueNodeCertificateResponse:
        assert self._ca is not None
        return node_pb2.IssueNodeCertificateResponse(
            certificate_pem=cert_pem, ca_certificate_pem=self._ca.cert_pem, node_port=self.node_port
        )

    def _ca_or_refuse(self) -> ClusterCa:
        if self._ca is None:
            raise Conflict(
                "this control plane runs with --insecure-node-link (or --insecure-no-auth): its node link "
                "is plaintext, and it issues no certificates",
                hint="start the node with --insecure-node-link, or the control plane without it",
            )
        return self._ca

    async def bootstrap(
        self, request: node_pb2.IssueNodeCertificateRequest, caller: Caller
    ) -> node_pb2.IssueNodeCertificateResponse:
        """On the main port, with no bearer token: the join token's one certificate, for the
        proof its token made (or, with no CSR, the node port and the CA, public both)."""
        ca = self._ca_or_refuse()
        if not request.csr_pem:
            return self._answer()
        node = node_id(request.node_id)
        pki.csr_key(request.csr_pem)  # refused before any store work: size, kind, signature
        # Checked in a read first: a flood of bad proofs never takes the store's writer.
        await self._store.read(cluster_ca.proven, node, request.csr_pem, request.join_proof)
        cert_pem = await self._store.transact(cluster_ca.issue, ca, node, request.csr_pem, request.join_proof)
        return self._answer(cert_pem)

    async def renew(
        self, request: node_pb2.IssueNodeCertificateRequest, caller: Caller
    ) -> node_pb2.IssueNodeCertificateResponse:
        """On the node port (the caller's certificate checked by `certified_node`): a new one."""
        node = node_of(caller, request.node_id, self._auth)
        ca = self._ca_or_refuse()
        if not request.csr_pem:
            return self._answer()
        return self._answer(cluster_ca.renew(ca, node, request.csr_pem))


async def node_port_only(request: Any, caller: Caller) -> Any:
    """Every other NodeService method on the main port of a mutual-TLS cluster."""
    raise Conflict(NODE_PORT_ONLY, hint="a node started with --insecure-node-link needs a control plane with it too")


async def node_port_only_stream(request: Any, caller: Caller) -> AsyncGenerator[Any, None]:
    raise Conflict(NODE_PORT_ONLY, hint="a node started with --insecure-node-link needs a control plane with it too")
    yield  # an async generator, as the table's streaming methods are
