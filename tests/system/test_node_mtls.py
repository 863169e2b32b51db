"""Mutual TLS on the node link (issue 26 item 4; SECURITY.md: the node link), with real
`kibo-ctrl serve` and `kibo-ctrl node` processes: a node joins with its join token and runs
a workspace whose exec crosses the guest hop in TLS (checked on the wire, through a relay that
records the bytes; with --insecure-node-link the same output shows in the clear); a client
without a certificate of the cluster CA cannot use the node port, and one node's certificate
cannot act as another node; a join token buys one key's certificate once; a control plane of
another CA is refused by the node before it joins; a node's certificate is not taken as the
control plane's on the guest hop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
from cryptography import x509
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2
from kibo.node.v1 import node_guest_service_pb2_grpc as guest_grpc
from kibo.node.v1 import node_service_pb2 as nd
from kibo.node.v1 import node_service_pb2_grpc as nd_grpc
from kibo_ctrl.api.auth import token_hash
from kibo_ctrl.engine import pki

from tests.client import Client, S
from tests.integration.test_node_api import join_token
from tests.nodes import NodeProcess, list_nodes
from tests.server import ServerProcess, free_port
from tests.system.test_durability import eventually
from tests.system.test_node_process_runtime import NODE_FLAGS
from tests.system.test_process_runtime import SMALL, DataPlane, _require_sandbox, reap

Factory = Callable[..., ServerProcess]
SERVER_FLAGS = ("--no-local-node", "--node-timeout-ms", "3000", "--settle-ms", "3000")
MARKER = b"kibo-plaintext-marker-7c1f"


class Relay:
    """A TCP relay that records every byte it passes (the guest hop, seen on the wire)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.seen = bytearray()
        self._server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                self.seen += data
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):  # the relay closing ends its pipes
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Relay]:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        try:
            yield self
        finally:
            self._server.close()


def _credentials(ca_pem: bytes, key_pem: bytes, cert_pem: bytes) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)


async def _guest_hop_over(relay: Relay, server: ServerProcess, node: NodeProcess) -> None:
    """A workspace on the node, and an exec whose output must cross the relay."""
    async with Client.connect(server.address, server.admin_token if server.auth else None) as client:

        async def placed() -> object:
            workspace = await client.create(resources=SMALL)
            return workspace if workspace.state == S.WORKSPACE_STATE_AVAILABLE else None

        kept = await eventually(placed, within=40, what="a workspace AVAILABLE on the process node")
        plane = DataPlane(client)
        credential = await plane.credential(kept.workspace_id)  # type: ignore[attr-defined]
        code, out, _ = await plane.exec(credential, "sh", "-c", f"printf '%s' {MARKER.decode()}")
        assert code == 0 and out == MARKER, out
        await client.delete(kept.workspace_id)  # type: ignore[attr-defined]
        await client.wait_steady(kept.workspace_id, within=30)  # type: ignore[attr-defined]


async def _process_node_through_relay(
    server: ServerProcess, tmp_path: Path, name: str, extra: tuple[str, ...]
) -> tuple[Relay, NodeProcess]:
    hop = free_port()
    relay = Relay(hop)
    flags = (*NODE_FLAGS, "--data-plane-listen", f"127.0.0.1:{hop}", "--data-plane-address", f"127.0.0.1:{relay.port}")
    node = NodeProcess(server.address, tmp_path / name, name, (*flags, *extra), runtime="process")
    return relay, node


async def test_the_guest_hop_is_tls_on_the_wire_and_plaintext_only_when_asked(
    server_factory: Factory, tmp_path: Path
) -> None:
    _require_sandbox()
    # Default: mutual TLS. The exec's output crosses the relay encrypted.
    server = server_factory(*SERVER_FLAGS, auth=True)
    relay, node = await _process_node_through_relay(
        server, tmp_path, "node-m", ("--token", join_token(server, "node-m"))
    )
    try:
        async with relay.running():
            node.start()
            await _guest_hop_over(relay, server, node)
        seen = bytes(relay.seen)
        assert seen, "nothing crossed the relay"
        assert seen[0] == 0x16 and seen[1] == 0x03, seen[:8]  # a TLS handshake record
        assert MARKER not in seen
        assert b"/kibo.node.v1.NodeGuestService/RunGuestJob" not in seen
        # The node's key is its own (0600), beside its certificate and the CA it pinned.
        assert (node.data_dir / "node-link" / "key.pem").stat().st_mode & 0o777 == 0o600
        assert node.stop() == 0, node.log()
    finally:
        node.kill()
        reap(node.data_dir)

    # --insecure-node-link on both ends: the same output shows in the clear (the check bites).
    plain = server_factory(*SERVER_FLAGS, "--insecure-node-link", auth=True)
    token = join_token(plain, "node-p")
    relay, node = await _process_node_through_relay(
        plain, tmp_path, "node-p", ("--token", token, "--insecure-node-link")
    )
    try:
        async with relay.running():
            node.start()
            await _guest_hop_over(relay, plain, node)
        assert MARKER in bytes(relay.seen)
        assert node.stop() == 0, node.log()
    finally:
        node.kill()
        reap(node.data_dir)


def _join_request(token: str, node_id: str, key_pem: str) -> nd.IssueNodeCertificateRequest:
    csr = pki.make_csr(key_pem)
    return nd.IssueNodeCertificateRequest(
        node_id=node_id, csr_pem=csr, join_proof=pki.join_proof(token_hash(token), node_id, csr)
    )


async def _refusal(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        return error.code()
    raise AssertionError("accepted")


async def test_the_node_port_takes_only_a_node_certificate_of_the_cluster_ca_for_its_own_node(
    server_factory: Factory,
) -> None:
    server = server_factory(*SERVER_FLAGS, auth=True)
    tokens = {n: join_token(server, n).rpartition(".")[0] for n in ("node-a", "node-b")}
    keys = {n: pki.new_key() for n in tokens}
    async with grpc.aio.insecure_channel(server.address) as channel:
        main = nd_grpc.NodeServiceStub(channel)  # type: ignore[no-untyped-call]
        # The main port serves only the bootstrap: everything else names the node port.
        joined = main.Join(
            nd.JoinRequest(node_id="node-a"), metadata=(("authorization", f"Bearer {tokens['node-a']}"),)
        )
        assert await _refusal(joined) == grpc.StatusCode.FAILED_PRECONDITION
        # A proof made with another node's token, or a wrong one: no certificate.
        stolen = _join_request(tokens["node-b"], "node-a", keys["node-a"])
        assert await _refusal(main.IssueNodeCertificate(stolen)) == grpc.StatusCode.UNAUTHENTICATED
        answers = {n: await main.IssueNodeCertificate(_join_request(tokens[n], n, keys[n])) for n in tokens}
        # The token is spent: the same key gets the same certificate, another key nothing.
        again = await main.IssueNodeCertificate(_join_request(tokens["node-a"], "node-a", keys["node-a"]))
        assert again.certificate_pem == answers["node-a"].certificate_pem
        other_key = _join_request(tokens["node-a"], "node-a", pki.new_key())
        assert await _refusal(main.IssueNodeCertificate(other_key)) == grpc.StatusCode.FAILED_PRECONDITION
    ca = answers["node-a"].ca_certificate_pem.encode()
    cert = x509.load_pem_x509_certificate(answers["node-a"].certificate_pem.encode())
    assert cert.subject.rfc4514_string() == "CN=node-a"
    node_port = f"127.0.0.1:{answers['node-a'].node_port}"
    options = [("grpc.ssl_target_name_override", pki.CONTROL_PLANE_NAME)]

    async def renew(key: str, cert_pem: str, token: str, node_id: str, as_node: str) -> grpc.StatusCode | str:
        credentials = _credentials(ca, key.encode(), cert_pem.encode())
        async with grpc.aio.secure_channel(node_port, credentials, options=options) as channel:
            stub = nd_grpc.NodeServiceStub(channel)  # type: ignore[no-untyped-call]
            request = nd.IssueNodeCertificateRequest(node_id=as_node, csr_pem=pki.make_csr(key))
            try:
                response = await stub.IssueNodeCertificate(
                    request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
                )
            except grpc.aio.AioRpcError as error:
                return error.code()
            return str(response.certificate_pem)

    a_key, a_cert = keys["node-a"], answers["node-a"].certificate_pem
    b_key, b_cert = keys["node-b"], answers["node-b"].certificate_pem
    # Its own certificate and token: a renewal (a new certificate of the same node).
    renewed = await renew(a_key, a_cert, tokens["node-a"], "node-a", "node-a")
    assert isinstance(renewed, str) and pki.common_name(renewed) == "node-a" and renewed != a_cert
    # node-b's certificate with node-a's token (and the other way): the CN is not the token's node.
    assert await renew(b_key, b_cert, tokens["node-a"], "node-a", "node-a") == grpc.StatusCode.PERMISSION_DENIED
    assert await renew(a_key, a_cert, tokens["node-b"], "node-b", "node-b") == grpc.StatusCode.PERMISSION_DENIED
    # A certificate of another CA, for the same name: the handshake fails (no call at all).
    other_ca, other_ca_key = pki.make_ca()
    forged = pki.sign_node(other_ca, other_ca_key, pki.csr_key(pki.make_csr(a_key))[0], "node-a")
    assert await renew(a_key, forged, tokens["node-a"], "node-a", "node-a") == grpc.StatusCode.UNAVAILABLE
    # No client certificate at all: the same.
    async with grpc.aio.secure_channel(
        node_port, grpc.ssl_channel_credentials(root_certificates=ca), options=options
    ) as channel:
        stub = nd_grpc.NodeServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.RenewLease(
            nd.RenewLeaseRequest(node_id="node-a"),
            metadata=(("authorization", f"Bearer {tokens['node-a']}"),),
            timeout=10,
        )
        assert await _refusal(call) == grpc.StatusCode.UNAVAILABLE


async def test_a_node_refuses_a_control_plane_whose_ca_its_join_token_does_not_pin(
    server_factory: Factory, tmp_path: Path
) -> None:
    ours = server_factory(*SERVER_FLAGS, auth=True)
    theirs = server_factory(*SERVER_FLAGS, auth=True)
    token = join_token(ours, "node-x")
    # Pointed at a control plane of another cluster: no join. Twice: with our token (theirs
    # would refuse its proof), and with one theirs takes (as a machine in between would), so
    # that it answers with a certificate of its CA: the pin refuses both, nothing is kept.
    pin = token.rpartition(".")[2]
    spliced = f"{join_token(theirs, 'node-x').rpartition('.')[0]}.{pin}"
    for attempt, used in enumerate((token, spliced)):
        (tmp_path / f"try{attempt}").mkdir()  # a log of its own for each attempt
        node = NodeProcess(theirs.address, tmp_path / f"try{attempt}" / "node-x", "node-x", ("--token", used)).start()
        try:
            assert node.process is not None
            assert node.process.wait(30) == 2, node.log()
            assert "its join token pins" in node.log() and "not joined" in node.log()
            assert not (node.data_dir / "node-link" / "cert.pem").exists()
            assert "node-x" not in await list_nodes(theirs.address, theirs.admin_token)
        finally:
            node.kill()
    # A token without a pin is refused unless the link is plaintext by choice.
    bare = token.rpartition(".")[0]
    node = NodeProcess(ours.address, tmp_path / "node-y", "node-y", ("--token", bare)).start()
    try:
        assert node.process is not None
        assert node.process.wait(30) == 2, node.log()
        assert "has no CA pin" in node.log()
    finally:
        node.kill()


async def test_a_nodes_certificate_is_not_taken_as_the_control_planes_on_the_guest_hop(
    server_factory: Factory, tmp_path: Path
) -> None:
    _require_sandbox()
    server = server_factory(*SERVER_FLAGS, auth=True)
    hop = free_port()
    flags = (*NODE_FLAGS, "--data-plane-listen", f"127.0.0.1:{hop}", "--token", join_token(server, "node-g"))
    node = NodeProcess(server.address, tmp_path / "node-g", "node-g", flags, runtime="process").start()
    try:

        async def joined() -> bool:
            return "node-g" in await list_nodes(server.address, server.admin_token)

        await eventually(joined, within=30, what="node-g joined")
        link = node.data_dir / "node-link"
        ca, key, cert = ((link / n).read_bytes() for n in ("ca.pem", "key.pem", "cert.pem"))
        # The hop's secret, as the control plane holds it: the certificate is what is tested.
        with contextlib.closing(sqlite3.connect(server.data_dir / "kibo.db")) as db:
            record = json.loads(db.execute("SELECT data FROM nodes WHERE id = 'node-g'").fetchone()[0])
        secret = record["data_plane_token"]
        options = [("grpc.ssl_target_name_override", pki.node_name("node-g"))]

        async def run_job(credentials: grpc.ChannelCredentials) -> grpc.StatusCode:
            async with grpc.aio.secure_channel(f"127.0.0.1:{hop}", credentials, options=options) as channel:
                stub = guest_grpc.NodeGuestServiceStub(channel)  # type: ignore[no-untyped-call]
                request = guest_pb2.RunGuestJobRequest(instance_id="none", job=b'{"argv": ["id"]}')
                try:
                    async for _ in stub.RunGuestJob(request, metadata=(("authorization", f"Bearer {secret}"),)):
                        pass
                except grpc.aio.AioRpcError as error:
                    return error.code()
            return grpc.StatusCode.OK

        # The node's own certificate (signed by the cluster CA) as the client: refused.
        assert await run_job(_credentials(ca, key, cert)) == grpc.StatusCode.PERMISSION_DENIED
        # The control plane's (the CA's own certificate and key, from the store): taken (the
        # job itself finds no such instance, and says so in its answer, not as a refusal).
        with contextlib.closing(sqlite3.connect(server.data_dir / "kibo.db")) as db:
            ca_cert, ca_key = db.execute("SELECT cert_pem, key_pem FROM cluster_ca").fetchone()
        assert await run_job(_credentials(ca, ca_key.encode(), ca_cert.encode())) == grpc.StatusCode.OK
        assert node.stop() == 0, node.log()
    finally:
        node.kill()
        reap(node.data_dir)
