"""The node API (kibo.node.v1) against hostile callers, over gRPC: a node token acts as its
own node only, a tenant token is refused, bad input gets the right code with details, and a
refused call changes nothing. The "nodes" here are raw gRPC callers (no agent runs), so each
call is the test's own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import msgspec
import pytest
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.node.v1 import node_admin_service_pb2 as adm
from kibo.node.v1 import node_admin_service_pb2_grpc as adm_grpc
from kibo.node.v1 import node_service_pb2 as nd
from kibo.node.v1 import node_service_pb2_grpc as nd_grpc

from tests.client import Client, S, error_of
from tests.integration.test_auth import make_token
from tests.server import ServerProcess
from tests.system.test_durability import eventually

Factory = Callable[..., ServerProcess]
# Long leases: the raw "nodes" of these tests never renew.
FLAGS = ("--no-local-node", "--node-timeout-ms", "600000")


def node_token(server: ServerProcess, node_id: str) -> str:
    command = [sys.executable, "-m", "kibo_ctrl", "token", "create", "--node", node_id]
    result = subprocess.run(
        [*command, "--data-dir", str(server.data_dir)], capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


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
    tenant = RawNode(channel, secured_cluster.admin_token)
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

        # node-a reads node-b's feed, launch spec, and reports on node-b's instance: refused.
        stream = intruder.stub.WatchSteps(nd.WatchStepsRequest(node_id="node-b"), metadata=intruder.metadata)
        error = await refused(stream.read())
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        spec = nd.GetLaunchSpecRequest(node_id="node-a", instance_id=instance_id, step=step)
        error = await refused(intruder.call("GetLaunchSpec", spec))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED and error.field == "instance_id"
        launched = _report("node-a", instance_id, step, "Launched", {"instance_id": instance_id, "step": step})
        error = await refused(intruder.call("Report", launched))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
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
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
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


def _report(node_id: str, instance_id: str, step: int, kind: str, body: dict[str, Any]) -> nd.ReportRequest:
    return nd.ReportRequest(
        node_id=node_id, instance_id=instance_id, step=step, kind=kind, body=msgspec.json.encode(body)
    )
