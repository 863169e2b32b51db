"""Who may do what: tokens, roles, tenants, quotas, the rate limit and TLS (issue 7)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kibo.ctrl.v1 import (
    observation_service_pb2 as obs,
)
from kibo.ctrl.v1 import (
    workspace_pb2 as wp,
)
from kibo.ctrl.v1 import (
    workspace_service_pb2 as ws,
)

from tests.client import Client, S, error_of, meta, new_id
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]


def make_token(server: ServerProcess, tenant: str, role: str = "admin") -> str:
    """`kibo-ctrl token create` against the running server's data dir, as an operator would."""
    command = [sys.executable, "-m", "kibo_ctrl", "token", "create", "--data-dir", str(server.data_dir)]
    result = subprocess.run(
        [*command, "--tenant", tenant, "--role", role], capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


def token_cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kibo_ctrl", "token", *args, "--data-dir", str(server.data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def secured(server_factory: Factory) -> ServerProcess:
    return server_factory(auth=True)


async def test_first_start_writes_a_private_admin_token(secured: ServerProcess) -> None:
    path = secured.data_dir / "admin.token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    token = secured.admin_token
    assert token.startswith("kibo_")
    async with Client.connect(secured.address, token) as client:
        workspace = await client.create()
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE
    # Stored as a hash only, and never logged.
    assert token.encode() not in (secured.data_dir / "kibo.db").read_bytes()
    assert token not in secured.log()


@pytest.mark.parametrize("authorization", [None, "Bearer kibo_not-a-token", "Basic abc", "Bearer "])
async def test_calls_without_a_valid_token_are_unauthenticated(
    secured: ServerProcess, authorization: str | None
) -> None:
    metadata = () if authorization is None else (("authorization", authorization),)
    async with Client.connect(secured.address) as client:
        for call in (
            client.ws.GetCapabilities(ws.GetCapabilitiesRequest(), metadata=metadata),
            client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta()), metadata=metadata),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            info = error_of(caught.value)
            assert info.code == grpc.StatusCode.UNAUTHENTICATED
            assert info.reason == "UNAUTHENTICATED"
            assert info.info.reason == "UNAUTHENTICATED"


async def test_health_and_reflection_stay_open(secured: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(secured.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    listing = await asyncio.to_thread(
        subprocess.run,
        ["node_modules/.bin/buf", "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--list-services",
         f"http://{secured.address}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    assert "kibo.ctrl.v1.WorkspaceService" in listing.stdout


async def test_connect_transport_needs_the_token_too(secured: ServerProcess) -> None:
    async with Client.connect_http(secured.http_address) as anonymous:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await anonymous.ws.GetCapabilities(ws.GetCapabilitiesRequest())
        assert error_of(caught.value).reason == "UNAUTHENTICATED"
    async with Client.connect_http(secured.http_address, secured.admin_token) as client:
        reply = await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())
        assert "workspace.stop.force" in reply.capabilities


async def test_a_reader_reads_but_may_not_change_anything(secured: ServerProcess) -> None:
    reader = make_token(secured, "default", "reader")
    async with Client.connect(secured.address, secured.admin_token) as admin:
        workspace = await admin.create()
    async with Client.connect(secured.address, reader) as client:
        assert (await client.get(workspace.workspace_id)).workspace_id == workspace.workspace_id
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest())
        assert workspace.workspace_id in {w.workspace_id for w in listed.workspaces}
        # Permission before existence: an unknown ID is PERMISSION_DENIED too, not NOT_FOUND.
        for workspace_id in (workspace.workspace_id, "ws-00000000000000000000"):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await client.ws.StopWorkspace(ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id))
            assert error_of(caught.value).code == grpc.StatusCode.PERMISSION_DENIED
            assert error_of(caught.value).reason == "PERMISSION_DENIED"
    async with Client.connect(secured.address, secured.admin_token) as admin:
        assert (await admin.get(workspace.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE


async def test_tenants_cannot_see_each_other(secured: ServerProcess) -> None:
    alpha, beta = make_token(secured, "alpha"), make_token(secured, "beta")
    shared_command = new_id("shared")
    async with Client.connect(secured.address, alpha) as client:
        created = await client.ws.CreateWorkspace(
            ws.CreateWorkspaceRequest(metadata=meta(shared_command), spec=wp.WorkspaceSpec(labels={"team": "a"}))
        )
        mine = created.workspace.workspace_id
        await client.wait_steady(mine)
    async with Client.connect(secured.address, beta) as client:
        calls = [
            client.ws.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=mine)),
            client.ws.StopWorkspace(ws.StopWorkspaceRequest(metadata=meta(), workspace_id=mine)),
            client.ws.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=mine)),
            client.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=shared_command)),
            client.obs.ListWorkspaceEvents(obs.ListWorkspaceEventsRequest(workspace_id=mine)),
            client.obs.GetWorkspaceCleanup(obs.GetWorkspaceCleanupRequest(workspace_id=mine)),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert error_of(caught.value).code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=mine)):
                pass
        assert error_of(caught.value).code == grpc.StatusCode.NOT_FOUND
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(include_deleted=True))
        assert mine not in {w.workspace_id for w in listed.workspaces}
        # Command IDs are scoped per tenant: the same ID is a new command here.
        theirs = await client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta(shared_command)))
        assert theirs.workspace.workspace_id != mine
    async with Client.connect(secured.address, alpha) as client:
        assert (await client.get(mine)).state == S.WORKSPACE_STATE_AVAILABLE
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest())
        assert theirs.workspace.workspace_id not in {w.workspace_id for w in listed.workspaces}


async def test_a_revoked_token_stops_working(secured: ServerProcess) -> None:
    token = make_token(secured, "gamma")
    async with Client.connect(secured.address, token) as client:
        await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())
        listing = token_cli(secured, "list")
        token_id = next(line.split("\t")[0] for line in listing.stdout.splitlines() if "\tgamma\t" in line)
        assert token_cli(secured, "revoke", token_id).returncode == 0
        assert "revoked" in token_cli(secured, "list").stdout
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED
                break
            assert asyncio.get_running_loop().time() < deadline, "the revoked token still works"
            await asyncio.sleep(0.2)
    assert token_cli(secured, "revoke", token_id).returncode == 1


def test_token_create_rejects_a_bad_tenant(secured: ServerProcess) -> None:
    result = token_cli(secured, "create", "--tenant", "Not A Tenant")
    assert result.returncode != 0
    assert "tenant" in result.stderr.lower()


async def test_quotas_reject_with_resource_exhausted(server_factory: Factory) -> None:
    server = server_factory("--quota-workspaces", "2", "--quota-vcpus", "6", auth=True)
    async with Client.connect(server.address, server.admin_token) as client:
        too_big = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=wp.Resources(vcpus=8)))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.ws.CreateWorkspace(too_big)
        info = error_of(caught.value)
        assert info.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.reason == "QUOTA_EXCEEDED"
        assert info.info.metadata["quota"] == "vcpus"
        assert info.info.metadata["limit"] == "6"
        await client.create()
        await client.create()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta()))
        info = error_of(caught.value)
        assert info.reason == "QUOTA_EXCEEDED" and info.info.metadata["quota"] == "workspaces"
        quota = _detail(caught.value, error_details_pb2.QuotaFailure)
        assert quota.violations[0].subject == "workspaces"
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest())
        assert len(listed.workspaces) == 2


async def test_the_rate_limit_answers_resource_exhausted_with_a_retry_delay(server_factory: Factory) -> None:
    server = server_factory("--rate-limit-rps", "5", auth=True)
    async with Client.connect(server.address, server.admin_token) as client:
        outcomes = await asyncio.gather(
            *(client.ws.GetCapabilities(ws.GetCapabilitiesRequest()) for _ in range(40)), return_exceptions=True
        )
    limited = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert 0 < len(limited) < 40
    for error in limited:
        info = error_of(error)
        assert info.code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.reason == "RATE_LIMITED"
        assert _detail(error, error_details_pb2.RetryInfo).retry_delay.ToNanoseconds() > 0


def _detail(
    error: grpc.aio.AioRpcError, kind: type[error_details_pb2.QuotaFailure] | type[error_details_pb2.RetryInfo]
):  # type: ignore[no-untyped-def]
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for packed in status_pb2.Status.FromString(value).details:
                if packed.Is(kind.DESCRIPTOR):
                    message = kind()
                    packed.Unpack(message)
                    return message
    raise AssertionError(f"no {kind.__name__} in the error details")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    directory = tmp_path_factory.mktemp("pki")
    subject = ("-subj",)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", "ca.key", "-out", "ca.pem",
             *subject, "/CN=kibo test CA", cwd=directory)  # fmt: skip
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 *subject, f"/CN={name}", cwd=directory)  # fmt: skip
        extra = ["-extfile", f"{name}.ext"] if extension else []
        if extension:
            (directory / f"{name}.ext").write_text(extension + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "1", "-out", f"{name}.pem", *extra, cwd=directory)  # fmt: skip
    return directory


async def test_tls_on_both_listeners(server_factory: Factory, pki: Path) -> None:
    ca = (pki / "ca.pem").read_bytes()
    credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    server = server_factory(
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"), credentials=credentials
    )
    async with Client.connect(server.address, root_certificates=ca) as client:
        workspace = await client.create()
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE
    async with grpc.aio.insecure_channel(server.address) as plain:
        with pytest.raises(grpc.aio.AioRpcError):
            await health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=3)
    https = await asyncio.to_thread(
        subprocess.run,
        ["curl", "-sS", "--cacert", str(pki / "ca.pem"), "-H", "Content-Type: application/json", "-d", "{}",
         f"https://{server.http_address}/kibo.ctrl.v1.WorkspaceService/GetCapabilities"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert https.returncode == 0, https.stderr
    assert "workspace.stop.force" in https.stdout


async def test_mutual_tls_requires_a_client_certificate(server_factory: Factory, pki: Path) -> None:
    ca = (pki / "ca.pem").read_bytes()
    client_key, client_cert = (pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes()
    with_cert = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=client_key, certificate_chain=client_cert
    )
    server = server_factory(
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"), credentials=with_cert,
    )  # fmt: skip
    async with grpc.aio.secure_channel(server.address, with_cert) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    without = grpc.ssl_channel_credentials(root_certificates=ca)
    async with grpc.aio.secure_channel(server.address, without) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)


def test_tls_flags_are_checked_at_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kibo_ctrl", "serve", "--data-dir", str(tmp_path)]
    result = subprocess.run(
        [*command, "--tls-cert", str(tmp_path / "no.pem")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "--tls-key" in result.stderr
