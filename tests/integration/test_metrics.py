"""GET /metrics on a real server: the counters and histograms move as commands run, the
labels stay bounded (no workspace or command ID), and the endpoint's access follows
--metrics (issue 15)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim
from prometheus_client.parser import text_string_to_metric_families

from tests.client import Client, S
from tests.conftest import _client
from tests.integration.test_auth import make_token
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
WORKSPACES = "kibo.ctrl.v1.WorkspaceService"


def fetch(server: ServerProcess, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{server.http_address}/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


async def scrape(server: ServerProcess, token: str | None = None) -> Samples:
    status, text = await asyncio.to_thread(fetch, server, token)
    assert status == 200, text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def metered(server_factory: Factory) -> ServerProcess:
    return server_factory("--metrics", "open", "--node-vcpus", "64")


@pytest.mark.parametrize("transport", ["grpc", "connect"])
async def test_a_create_and_a_stop_move_the_command_rpc_store_and_runtime_metrics(
    metered: ServerProcess, transport: str
) -> None:
    before = await scrape(metered)
    async with _client(metered, transport) as client:
        workspace = await client.create(resources=wp.Resources(vcpus=2, memory_mib=512))
        after_create = await scrape(metered)
        await client.stop(workspace.workspace_id)
        await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_STOPPED)
    after = await scrape(metered)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for kind in ("create", "stop"):
        assert delta("kibo_commands_finished_total", kind=kind, outcome="succeeded") == 1
        assert delta("kibo_command_duration_seconds_count", kind=kind, outcome="succeeded") == 1
        assert delta("kibo_command_duration_seconds_sum", kind=kind, outcome="succeeded") > 0
    rpc = {"transport": transport, "service": WORKSPACES, "method": "CreateWorkspace"}
    assert delta("kibo_rpc_handled_total", code="OK", **rpc) >= 1
    assert delta("kibo_rpc_duration_seconds_count", **rpc) == delta("kibo_rpc_handled_total", code="OK", **rpc)
    other = "connect" if transport == "grpc" else "grpc"
    assert delta("kibo_rpc_handled_total", code="OK", **{**rpc, "transport": other}) == 0
    assert delta("kibo_store_commit_duration_seconds_count") >= 2
    assert delta("kibo_store_commit_transactions_sum") >= delta("kibo_store_commit_transactions_count") >= 2
    for operation in ("launch", "stop"):
        assert delta("kibo_runtime_operation_duration_seconds_count", node="node-1", operation=operation) == 1
    assert delta("kibo_runtime_stops_total", node="node-1", durability="confirmed") == 1
    # Capacity as configured; the running workspace's reservation while it ran, none once stopped.
    assert value(after, "kibo_node_capacity_vcpus", node="node-1") == 64
    assert (
        value(after_create, "kibo_node_reserved_vcpus", node="node-1")
        - value(before, "kibo_node_reserved_vcpus", node="node-1")
        == 2
    )
    assert value(after_create, "kibo_node_reserved_memory_bytes", node="node-1") >= 512 * 1024 * 1024
    assert value(after, "kibo_node_reachable", node="node-1") == 1
    # The node reports (its heartbeat): a lease age, not NaN, and not older than the test.
    assert 0 <= value(after, "kibo_node_last_report_age_seconds", node="node-1") < 120
    # The workspace moved from available to stopped in the per-tenant counts.
    assert (
        value(after_create, "kibo_workspaces", tenant="default", state="available")
        - value(before, "kibo_workspaces", tenant="default", state="available")
        == 1
    )
    assert delta("kibo_workspaces", tenant="default", state="stopped") == 1
    assert value(after, "kibo_data_plane_sessions") == 0


async def test_an_error_is_counted_under_its_code(metered: ServerProcess) -> None:
    before = await scrape(metered)
    async with Client.connect(metered.address) as client:
        with pytest.raises(Exception, match=r"NOT_FOUND|not found"):
            await client.ws.GetWorkspace(ws.GetWorkspaceRequest(workspace_id="ws-nosuch"))
    after = await scrape(metered)
    labels = {"transport": "grpc", "service": WORKSPACES, "method": "GetWorkspace", "code": "NOT_FOUND"}
    assert value(after, "kibo_rpc_handled_total", **labels) - value(before, "kibo_rpc_handled_total", **labels) == 1


async def test_a_failed_sync_is_a_runtime_failure_with_its_reason(metered: ServerProcess) -> None:
    before = await scrape(metered)
    async with Client.connect(metered.address) as client:
        workspace = await client.create()
        await client.inject(workspace.workspace_id, sim.FAULT_SYNC_FAIL)
        await client.stop(workspace.workspace_id)
        await client.wait_steady(workspace.workspace_id)
    after = await scrape(metered)
    labels = {"node": "node-1", "operation": "stop", "reason": "sync_error"}
    name = "kibo_runtime_operation_failures_total"
    assert value(after, name, **labels) - value(before, name, **labels) >= 1


async def test_open_watch_streams_are_a_gauge_that_falls_back(metered: ServerProcess) -> None:
    async with Client.connect(metered.address) as client:
        workspace = await client.create()
        baseline = value(await scrape(metered), "kibo_watch_streams_open")
        call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace.workspace_id))
        await call.read()  # the stream is open: its first snapshot arrived
        open_now = await scrape(metered)
        assert value(open_now, "kibo_watch_streams_open") == baseline + 1
        stream = {"transport": "grpc", "service": WORKSPACES, "method": "WatchWorkspace"}
        assert value(open_now, "kibo_rpc_streams_open", **stream) >= 1
        call.cancel()
        for _ in range(200):
            if value(await scrape(metered), "kibo_watch_streams_open") == baseline:
                break
            await asyncio.sleep(0.02)
        assert value(await scrape(metered), "kibo_watch_streams_open") == baseline


async def test_no_workspace_or_command_id_appears_in_the_metrics(metered: ServerProcess) -> None:
    async with Client.connect(metered.address) as client:
        workspace = await client.create()
        response = await client.stop(workspace.workspace_id)
    status, text = await asyncio.to_thread(fetch, metered)
    assert status == 200
    assert workspace.workspace_id not in text
    assert response.command.command_id not in text
    # Every label value is from a bounded set: no "ws-" or "cmd-" style identifier at all.
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, label in sample.labels.items():
                assert not label.startswith(("ws-", "cmd-", "inst-", "vol-")), (sample.name, key, label)


async def test_by_default_metrics_need_an_operator_token(server_factory: Factory) -> None:
    server = server_factory(auth=True)
    # The guard refuses a request without a valid token before it reaches /metrics.
    assert (await asyncio.to_thread(fetch, server))[0] == 401
    assert (await asyncio.to_thread(fetch, server, "kibo_not-a-token"))[0] == 401
    # A tenant's admin token must not read the other tenants' numbers.
    status, text = await asyncio.to_thread(fetch, server, make_token(server, "default", "admin"))
    assert status == 403, text
    assert "kibo_" not in text.replace("kibo-ctrl", "")
    operator = make_token(server, "default", "operator")
    assert value(await scrape(server, operator), "kibo_node_capacity_vcpus", node="node-1") > 0


async def test_open_metrics_need_no_token_and_off_serves_none(server_factory: Factory) -> None:
    opened = server_factory("--metrics", "open", auth=True)
    status, text = await asyncio.to_thread(fetch, opened)
    assert status == 200 and "kibo_workspaces" in text
    off = server_factory("--metrics", "off", auth=True)
    operator = make_token(off, "default", "operator")
    assert (await asyncio.to_thread(fetch, off, operator))[0] == 404
