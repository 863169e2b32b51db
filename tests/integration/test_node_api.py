"""The node API (kibo.node.v1) against hostile callers, over gRPC: a node token acts as its
own node only, a tenant token is refused, bad input gets the right code with details, and a
refused call changes nothing. Another node's instance, storage or volume answers NOT_FOUND,
byte for byte the answer for an ID that does not exist (issue 27 item 6). The "nodes" here
are raw gRPC callers (no agent runs), so each call is the test's own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import msgspec
import pytest
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.node.v1 import node_admin_service_pb2 as adm
from kibo.node.v1 import node_admin_service_pb2_grpc as adm_grpc
from kibo.node.v1 import node_service_pb2 as nd
from kibo.node.v1 import node_service_pb2_grpc as nd_grpc

from tests.client import Client, S, answer_of, error_of, missing_like
from tests.integration.test_auth import make_token
from tests.server import ServerProcess
from tests.system.test_durability import eventually

Factory = Callable[..., ServerProcess]
# Long leases: the raw "nodes" of these tests never renew. The node API's checks are the same on
# either port: these raw callers use the plaintext link (tests/system/test_node_mtls.py: mTLS).
FLAGS = ("--no-local-node", "--node-timeout-ms", "600000", "--insecure-node-link")


def join_token(server: ServerProcess, node_id: str) -> str:
    """What `kibo-ctrl token create --node` prints: TOKEN.CA_SHA256 (kibo-ctrl node --token)."""
    command = [sys.executable, "-m", "kibo_ctrl", "token", "create", "--node", node_id]
    result = subprocess.run(
        [*command, "--data-dir", str(server.data_dir)], capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


def node_token(server: ServerProcess, node_id: str) -> str:
    """A node token to send as a bearer (a join token without its CA pin)."""
    return join_token(server, node_id).rpartition(".")[0]


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    message: str
    field: str


async def refused(call: Any) -> Refusal:
    """Await a call that must be refused: its code, message and the field named."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return Refusal(error.code(), error.details() or "", error_of(error).detail.field)
    raise AssertionError("the call was accepted")


class RawNode:
    """NodeService calls with one token."""

    def __init__(self, channel: grpc.aio.Channel, token: str) -> None:
        self.stub = nd_grpc.NodeServiceStub(channel)  # type: ignore[no-untyped-call]
        self.admin = adm_grpc.NodeAdminServiceStub(channel)  # type: ignore[no-untyped-call]
        self.metadata = (("authorization", f"Bearer {token}"),)

    def call(self, rpc: str, request: Any) -> Any:
        return getattr(self.stub, rpc)(request, metadata=self.metadata)

    def join(self, node_id: str, vcpus: int = 16) -> Any:
        return self.call("Join", nd.JoinRequest(node_id=node_id, vcpus=vcpus, memory_mib=65536, storage_pool="local"))

    async def first_batch(self, node_id: str) -> nd.WatchStepsResponse:
        stream = self.stub.WatchSteps(nd.WatchStepsRequest(node_id=node_id), metadata=self.metadata)
        try:
            async for response in stream:
                return response  # type: ignore[no-any-return]
        finally:
            stream.cancel()
        raise AssertionError("the feed ended")


@pytest.fixture(scope="module")
def secured_cluster(server_factory: Factory) -> ServerProcess:
    return server_factory(*FLAGS, auth=True)


@pytest.fixture
async def channel(secured_cluster: ServerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(secured_cluster.address) as opened:
        yield opened


async def test_a_tenant_token_is_refused_by_the_node_api(
    secured_cluster: ServerProcess, channel: grpc.aio.Channel
) -> None:
    for token in (secured_cluster.admin_token, make_token(secured_cluster, "default", "operator")):
        error = await refused(RawNode(channel, token).join("node-x"))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        assert "node token" in error.message
    operator = RawNode(channel, make_token(secured_cluster, "default", "operator"))
    nodes = await operator.admin.ListNodes(adm.ListNodesRequest(), metadata=operator.metadata)
    assert "node-x" not in {n.id for n in nodes.nodes}


async def test_a_node_token_is_refused_by_the_tenant_and_admin_apis(
    secured_cluster: ServerProcess, channel: grpc.aio.Channel
) -> None:
    token = node_token(secured_cluster, "node-t")
    async with Client.connect(secured_cluster.address, token) as client:
        error = await refused(client.ws.ListWorkspaces(ws.ListWorkspacesRequest()))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        assert "node API" in error.message
    node = RawNode(channel, token)
    error = await refused(node.admin.ListNodes(adm.ListNodesRequest(), metadata=node.metadata))
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    # A tenant admin is not an operator either.
    tenant = RawNode(channel, make_token(secured_cluster, "default", "admin"))
    error = await refused(tenant.admin.CordonNode(adm.CordonNodeRequest(node_id="node-t"), metadata=tenant.metadata))
    assert error.code == grpc.StatusCode.PERMISSION_DENIED


async def test_a_node_token_acts_as_its_own_node_only(
    secured_cluster: ServerProcess, channel: grpc.aio.Channel
) -> None:
    owner = RawNode(channel, node_token(secured_cluster, "node-b"))
    intruder = RawNode(channel, node_token(secured_cluster, "node-a"))
    operator = RawNode(channel, make_token(secured_cluster, "default", "operator"))
    # node-a may not join as node-b: refused, and no node-b appears.
    error = await refused(intruder.join("node-b"))
    assert error.code == grpc.StatusCode.PERMISSION_DENIED and error.field == "node_id"
    listed = await operator.admin.ListNodes(adm.ListNodesRequest(), metadata=operator.metadata)
    assert "node-b" not in {n.id for n in listed.nodes}
    # Calls before joining: FAILED_PRECONDITION, nothing recorded.
    error = await refused(owner.call("RenewLease", nd.RenewLeaseRequest(node_id="node-b")))
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION

    # node-b joins alone, so the workspace is placed on it; node-a joins after.
    await owner.join("node-b")
    async with Client.connect(secured_cluster.address, secured_cluster.admin_token) as client:
        response = await client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=_meta()))
        workspace_id = response.workspace.workspace_id

        async def placed() -> Any:
            return (await client.get(workspace_id)).node_id == "node-b"

        await eventually(placed, what="placed on node-b")
        await intruder.join("node-a", vcpus=1)
        batch = await owner.first_batch("node-b")
        (item,) = [i.instance for i in batch.items if i.WhichOneof("item") == "instance"]
        instance_id, step = item.instance_id, item.step

        # node-a reads node-b's feed: its token is not node-b's.
        stream = intruder.stub.WatchSteps(nd.WatchStepsRequest(node_id="node-b"), metadata=intruder.metadata)
        error = await refused(stream.read())
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        # node-a asks for node-b's launch spec and reports on node-b's instance: NOT_FOUND, byte
        # for byte the answer for an instance that does not exist (nothing of node-b's leaks).
        missing = missing_like(instance_id)
        calls: list[tuple[str, Callable[[str], Any]]] = [
            ("GetLaunchSpec", lambda i: nd.GetLaunchSpecRequest(node_id="node-a", instance_id=i, step=step)),
            ("Report", lambda i: _report("node-a", i, step, "Launched", {"instance_id": i, "step": step})),
            ("ReportBatch", lambda i: nd.ReportBatchRequest(node_id="node-a", reports=[_launched(i, step)])),
        ]
        for rpc, request_for in calls:
            foreign = await answer_of(intruder.call(rpc, request_for(instance_id)))
            assert foreign.code == grpc.StatusCode.NOT_FOUND, (rpc, foreign)
            assert foreign.naming(instance_id, missing) == await answer_of(intruder.call(rpc, request_for(missing)))
        assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_CREATING

        # Bad input from the owner: the right code, the field named, nothing changed.
        bad = [
            (_report("node-b", instance_id, step, "Exploded", {}), "kind"),
            (_report("node-b", instance_id, step, "Launched", {"instance_id": instance_id, "step": "x"}), "body"),
            (_report("node-b", instance_id, step, "Launched", {"instance_id": "other", "step": step}), "body"),
            (
                nd.ReportRequest(node_id="node-b", instance_id=instance_id, step=step, kind="Launched", body=b"{"),
                "body",
            ),
            (
                _report("node-b", instance_id, step + 5, "Launched", {"instance_id": instance_id, "step": step + 5}),
                "step",
            ),
        ]
        for request, field in bad:
            error = await refused(owner.call("Report", request))
            assert error.code == grpc.StatusCode.INVALID_ARGUMENT, (field, error)
            assert error.field == field
        error = await refused(owner.join("NODE B!"))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED  # a node token names its node
        lost = nd.ReportStorageReleasedRequest(node_id="node-b", workspace_id=workspace_id, volume_ids=[""] * 2)
        error = await refused(owner.call("ReportStorageReleased", lost))
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.field == "volume_ids"
        assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_CREATING

        # Batches: refused as a whole, and a refused one changes nothing, not even the reports
        # in it that were fine (they are folded in one transaction).
        def batch(*reports: nd.ReportRequest, node: str = "node-b") -> nd.ReportBatchRequest:
            return nd.ReportBatchRequest(node_id=node, reports=reports)

        progress = _report("", instance_id, step, "Progress", {"instance_id": instance_id, "step": step, "phase": 4})
        error = await refused(intruder.call("ReportBatch", batch(progress, node="node-a")))
        assert error.code == grpc.StatusCode.NOT_FOUND and error.field == "instance_id"
        events = len(await client.events(workspace_id))
        too_far = _report("", instance_id, step, "Launched", {"instance_id": instance_id, "step": step + 5})
        too_far.step = step + 5
        bad_batches = [
            (batch(), "reports"),
            (batch(*[progress] * 65), "reports"),
            (batch(progress, _report("node-a", instance_id, step, "Launched", {})), "reports.node_id"),
            (batch(progress, _report("", instance_id, step, "Exploded", {})), "kind"),
            (batch(progress, too_far), "step"),
        ]
        for request, field in bad_batches:
            error = await refused(owner.call("ReportBatch", request))
            assert error.code == grpc.StatusCode.INVALID_ARGUMENT, (field, error)
            assert error.field == field
        assert len(await client.events(workspace_id)) == events, "a refused batch changed something"
        assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_CREATING

        # The owner's own report lands, once: a repeat is harmless.
        spec_response = await owner.call("GetLaunchSpec", nd.GetLaunchSpecRequest(instance_id=instance_id, step=step))
        assert msgspec.json.decode(spec_response.spec)["instance"]["id"] == instance_id
        ok = _report("node-b", instance_id, step, "Launched", {"instance_id": instance_id, "step": step})
        await owner.call("ReportBatch", batch(progress, ok))
        assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        messages = [e.message for e in await client.events(workspace_id)]
        assert any(": launching on node-b" in m for m in messages), messages
        events = len(messages)
        await owner.call("Report", ok)
        assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        assert len(await client.events(workspace_id)) == events


def _meta() -> Any:
    from tests.client import meta

    return meta()


def _launched(instance_id: str, step: int) -> nd.ReportRequest:
    return _report("", instance_id, step, "Launched", {"instance_id": instance_id, "step": step})


def _report(node_id: str, instance_id: str, step: int, kind: str, body: dict[str, Any]) -> nd.ReportRequest:
    return nd.ReportRequest(
        node_id=node_id, instance_id=instance_id, step=step, kind=kind, body=msgspec.json.encode(body)
    )


def _ids_in(batch: nd.WatchStepsResponse) -> set[str]:
    """The storage and volume releases a feed's batch hands its node."""
    found = set()
    for item in batch.items:
        if item.WhichOneof("item") == "storage":
            found.add(item.storage.workspace_id)
        elif item.WhichOneof("item") == "volume":
            found.add(item.volume.volume_id)
    return found


async def test_a_node_reports_released_only_the_storage_routed_to_it(server_factory: Factory) -> None:
    """Issue 27 item 6: with n1 paused, n2 (same default pool) reports n1's volume and n1's
    workspace storage released. Both answer NOT_FOUND exactly like IDs that do not exist, and
    nothing changes: n1's feed still hands it both releases, the cleanup is still pending."""
    server = server_factory("--no-local-node", "--node-timeout-ms", "1500", "--insecure-node-link", auth=True)
    operator_token = make_token(server, "default", "operator")
    async with (
        grpc.aio.insecure_channel(server.address) as channel,
        Client.connect(server.address, server.admin_token) as client,
    ):
        n1, n2 = RawNode(channel, node_token(server, "n1")), RawNode(channel, node_token(server, "n2"))
        operator = RawNode(channel, operator_token)

        async def state_of(node: str) -> int:
            listed = await operator.admin.ListNodes(adm.ListNodesRequest(), metadata=operator.metadata)
            return {n.id: n.state for n in listed.nodes}[node]

        await n1.join("n1")
        renewing = asyncio.create_task(_renew_until_cancelled(n1, "n1"))
        try:
            # A workspace runs on n1 (alone) and is deleted: its layer and volume wait for n1.
            created = await client.ws.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=_meta()))
            workspace_id = created.workspace.workspace_id
            (instance,) = [i.instance for i in (await n1.first_batch("n1")).items if i.WhichOneof("item") == "instance"]
            await n1.call("Report", _launched(instance.instance_id, instance.step))
            await client.wait_for(workspace_id, S.WORKSPACE_STATE_AVAILABLE)
            await client.ws.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=_meta(), workspace_id=workspace_id))
            destroy = next(
                i.instance
                for i in (await n1.first_batch("n1")).items
                if i.WhichOneof("item") == "instance" and i.instance.step > instance.step
            )
            body = {"instance_id": destroy.instance_id, "step": destroy.step}
            await n1.call("Report", _report("n1", destroy.instance_id, destroy.step, "Destroyed", body))
            await client.wait_for(workspace_id, S.WORKSPACE_STATE_DELETED)
            # A volume deleted before it was ever mounted: its release goes to the pool's first node, n1.
            volume_id = (await client.create_volume()).volume_id
            await client.vol.DeleteVolume(vol.DeleteVolumeRequest(metadata=_meta(), volume_id=volume_id))
            await n2.join("n2")  # pool "local" too: the control plane's, which nodes share
            assert _ids_in(await n1.first_batch("n1")) >= {workspace_id, volume_id}
        finally:
            renewing.cancel()
        await eventually(lambda: _is(state_of("n1"), adm.NODE_STATE_SILENT), within=15, what="n1 paused (SILENT)")

        cleanup = await client.cleanup(workspace_id)
        volume = await client.vol.GetVolume(vol.GetVolumeRequest(volume_id=volume_id))
        assert cleanup.state == obs.CLEANUP_STATE_PROCESSING
        claims = [
            (volume_id, lambda i: ("ReportVolumeReleased", nd.ReportVolumeReleasedRequest(node_id="n2", volume_id=i))),
            (
                workspace_id,
                lambda i: ("ReportStorageReleased", nd.ReportStorageReleasedRequest(node_id="n2", workspace_id=i)),
            ),
        ]
        for owned, request_for in claims:
            missing = missing_like(owned)
            foreign = await answer_of(n2.call(*request_for(owned)))
            assert foreign.code == grpc.StatusCode.NOT_FOUND, foreign
            assert foreign.naming(owned, missing) == await answer_of(n2.call(*request_for(missing)))
        # Nothing changed: the records, the cleanup, and n1's work, which its feed still holds.
        assert await client.vol.GetVolume(vol.GetVolumeRequest(volume_id=volume_id)) == volume
        assert await client.cleanup(workspace_id) == cleanup
        await n1.call("RenewLease", nd.RenewLeaseRequest(node_id="n1"))
        assert _ids_in(await n1.first_batch("n1")) >= {workspace_id, volume_id}
        assert not _ids_in(await n2.first_batch("n2"))

        # n1's own reports land (and a repeat is harmless); its feed is done with both.
        for _ in range(2):
            await n1.call("ReportVolumeReleased", nd.ReportVolumeReleasedRequest(volume_id=volume_id))
            await n1.call("ReportStorageReleased", nd.ReportStorageReleasedRequest(workspace_id=workspace_id))
        assert (await client.cleanup(workspace_id)).state == obs.CLEANUP_STATE_COMPLETE
        assert not _ids_in(await n1.first_batch("n1")) & {workspace_id, volume_id}


async def _renew_until_cancelled(node: RawNode, node_id: str) -> None:
    while True:
        await node.call("RenewLease", nd.RenewLeaseRequest(node_id=node_id))
        await asyncio.sleep(0.25)


async def _is(value: Awaitable[int], wanted: int) -> bool:
    return bool(await value == wanted)
