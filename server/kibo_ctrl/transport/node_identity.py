"""A node's side of the mutual-TLS node link (SECURITY.md: the node link): its key, its
certificate and the cluster CA, kept in its data dir, got once with its join token and
renewed over the link.

The join (`join`): the node makes its key (kept first, so a retry after a crash asks with the
same key and gets the same certificate), sends a CSR and the token's proof to a control
plane's main port (never the token), and checks the answer's CA against the pin in its join
token before it keeps anything: a control plane of another cluster, or a machine in between,
is refused there. Then `dial` reaches each replica's node port (learned from its main port,
and checked against the same CA) with the node's certificate, and trusts only the cluster CA
for the control plane's name. `server_credentials` serve the guest hop with the node's
certificate (the current one at each handshake: a renewal needs no restart) and take only
clients with a certificate of the cluster CA."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from kibo.node.v1 import node_service_pb2 as node_pb2
from kibo.node.v1 import node_service_pb2_grpc as node_grpc

from ..api.auth import token_hash
from ..domain.errors import KiboError
from ..engine import pki

DIRECTORY = "node-link"
# Renewed when less than this share of its lifetime is left (10 of 30 days), checked hourly.
RENEW_WHEN_LEFT = 1 / 3
RENEW_CHECK_S = 3600.0
RETRY_S = 1.0
CALL_TIMEOUT_S = 30.0

log = logging.getLogger("kibo.node")


class PinMismatch(KiboError):
    """The control plane's CA is not the one the join token pins: nothing was trusted."""


class NodeIdentity:
    def __init__(
        self, data_dir: Path, node_id: str, token: str, pin: str, bootstrap: grpc.ChannelCredentials | None = None
    ) -> None:
        self.directory = data_dir / DIRECTORY
        self.node_id = node_id
        self._token = token
        self._pin = pin
        # How the main port is reached (plaintext, or TLS with --tls-ca).
        self._bootstrap = bootstrap
        self.key_pem = ""
        self.cert_pem = ""
        self.ca_pem = ""

    # -- files ------------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return self.directory / name

    def _write(self, name: str, text: str, mode: int = 0o644) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self._path(name + ".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.replace(temporary, self._path(name))

    def load(self) -> bool:
        """Take the kept key, certificate and CA if they are this node's, for this join token's
        CA, and not expired; False: the node must join (again)."""
        try:
            key, cert, ca = (self._path(n).read_text() for n in ("key.pem", "cert.pem", "ca.pem"))
            usable = (
                pki.pin_of(ca) == self._pin
                and pki.common_name(cert) == self.node_id
                and pki.public_key_sha256(cert) == pki.key_sha256(key)
                and pki.lifetime(cert)[1] > time.time()
            )
        except (OSError, ValueError):
            return False
        if usable:
            self.key_pem, self.cert_pem, self.ca_pem = key, cert, ca
        return usable

    # -- the join ---------------------------------------------------------------------------
    async def join(self, targets: list[str]) -> None:
        """Get the node's certificate through the first main port that answers (retried while
        none does); a refusal or a CA that is not the pinned one raises."""
        if self.load():
            log.info("node link: certificate of %s in %s, valid until %s", self.node_id, self.directory, self._until())
            return
        try:
            key = self._path("key.pem").read_text()
            pki.key_sha256(key)
        except (OSError, ValueError):
            key = pki.new_key()
            self._write("key.pem", key, 0o600)  # kept first: a retry asks with the same key
        csr = pki.make_csr(key)
        request = node_pb2.IssueNodeCertificateRequest(
            node_id=self.node_id, csr_pem=csr, join_proof=pki.join_proof(token_hash(self._token), self.node_id, csr)
        )
        while True:
            for target in targets:
                try:
                    # The CA first (public, no proof sent): a control plane of another cluster is
                    # named as such, whatever it would have said to the proof.
                    first = await self._main_port_call(
                        target, node_pb2.IssueNodeCertificateRequest(node_id=self.node_id)
                    )
                    self._check_ca(first.ca_certificate_pem, target)
                    response = await self._main_port_call(target, request)
                except grpc.aio.AioRpcError as error:
                    if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        log.warning("node link: %s did not answer the join (%s); trying on", target, error.code().name)
                        continue
                    raise KiboError(f"the control plane at {target} refused the join: {error.details()}") from None
                self.key_pem = key
                self._accept(response, target)
                log.info("node link: joined through %s; certificate valid until %s", target, self._until())
                return
            await asyncio.sleep(RETRY_S)

    async def _main_port_call(self, target: str, request: node_pb2.IssueNodeCertificateRequest) -> Any:
        if self._bootstrap is None:
            channel = grpc.aio.insecure_channel(target)
        else:
            channel = grpc.aio.secure_channel(target, self._bootstrap)
        async with channel:
            stub = node_grpc.NodeServiceStub(channel)  # type: ignore[no-untyped-call]
            return await stub.IssueNodeCertificate(request, timeout=CALL_TIMEOUT_S)

    def _check_ca(self, ca_pem: str, target: str) -> None:
        """The pin, before anything the answer says is used."""
        try:
            pin = pki.pin_of(ca_pem)
        except ValueError:
            pin = "(not a certificate)"
        if pin != self._pin:
            raise PinMismatch(
                f"the control plane at {target} presented a cluster CA with sha256 {pin[:64]}, not the "
                f"{self._pin} its join token pins: not joined (a control plane of another cluster, or a "
                "machine in between)"
            )

    def _accept(self, response: node_pb2.IssueNodeCertificateResponse, target: str) -> None:
        self._check_ca(response.ca_certificate_pem, target)
        cert_pem = response.certificate_pem
        try:
            cert = x509.load_pem_x509_certificate(cert_pem.encode())
            ca = x509.load_pem_x509_certificate(response.ca_certificate_pem.encode())
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            raise KiboError(f"the control plane at {target} answered a certificate its CA did not sign") from None
        if pki.common_name(cert_pem) != self.node_id or pki.public_key_sha256(cert_pem) != pki.key_sha256(self.key_pem):
            raise KiboError(f"the control plane at {target} answered a certificate for another node or key")
        self._write("ca.pem", response.ca_certificate_pem)
        self._write("cert.pem", cert_pem)
        self.ca_pem, self.cert_pem = response.ca_certificate_pem, cert_pem

    def _until(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(pki.lifetime(self.cert_pem)[1]))

    # -- the link ---------------------------------------------------------------------------
    async def dial(self, target: str) -> grpc.aio.Channel:
        """A channel to `target`'s node port (its main port says which), with this node's
        certificate, trusting only the cluster CA for the control plane's name."""
        answer = await self._main_port_call(target, node_pb2.IssueNodeCertificateRequest(node_id=self.node_id))
        self._check_ca(answer.ca_certificate_pem, target)
        if answer.ca_certificate_pem != self.ca_pem:
            raise PinMismatch(f"the control plane at {target} presented another certificate of the pinned CA")
        host = target.rpartition(":")[0]
        return grpc.aio.secure_channel(
            f"{host}:{answer.node_port}",
            self.channel_credentials(),
            options=[
                ("grpc.ssl_target_name_override", pki.CONTROL_PLANE_NAME),
                ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                ("grpc.keepalive_time_ms", 10_000),
            ],
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem.encode(),
            private_key=self.key_pem.encode(),
            certificate_chain=self.cert_pem.encode(),
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        """The guest hop: this node's certificate (the current one at each handshake), and only
        clients with a certificate of the cluster CA (api/node_certs.py control_plane_peer
        then takes the control plane's alone)."""

        def current() -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration(
                [(self.key_pem.encode(), self.cert_pem.encode())], root_certificates=self.ca_pem.encode()
            )

        return grpc.dynamic_ssl_server_credentials(current(), current, require_client_authentication=True)

    # -- renewal ----------------------------------------------------------------------------
    def renewal_due(self, now: float | None = None) -> bool:
        start, end = pki.lifetime(self.cert_pem)
        return (end - (time.time() if now is None else now)) < (end - start) * RENEW_WHEN_LEFT

    async def renew(self, channel: grpc.aio.Channel) -> None:
        """A new certificate for the same key, over the node port (this certificate and the
        node token vouch for it)."""
        stub = node_grpc.NodeServiceStub(channel)  # type: ignore[no-untyped-call]
        request = node_pb2.IssueNodeCertificateRequest(node_id=self.node_id, csr_pem=pki.make_csr(self.key_pem))
        metadata = (("authorization", f"Bearer {self._token}"),)
        response = await stub.IssueNodeCertificate(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
        self._accept(response, "the node port")
        log.info("node link: certificate renewed, valid until %s", self._until())
