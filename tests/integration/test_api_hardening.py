"""The API under a hostile tenant (issue 10, findings 7, 11 and 12): fault injection stays
inside the caller's tenant, heavy reads are bounded, bad input is INVALID_ARGUMENT, pages fit
in a message, and a bug answers INTERNAL with an error ID instead of its own text.

Each test replays the attack through a real server, over gRPC and Connect where both apply."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import kibotos
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim
from kibo_ctrl.api.fairness import TenantSlots

from tests.client import Client, S, error_of, meta, rejected
from tests.conftest import TRANSPORTS
from tests.integration.test_auth import make_token
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]


@asynccontextmanager
async def connected(server: ServerProcess, transport: str, token: str | None = None) -> AsyncIterator[Client]:
    if transport == "grpc":
        async with Client.connect(server.address, token) as client:
            yield client
    else:
        async with Client.connect_http(server.http_address, token) as client:
            yield client


def inject(workspace_id: str, fault: int) -> sim.InjectFaultRequest:
    return sim.InjectFaultRequest(workspace_id=workspace_id, fault=fault)


# -- finding 7: fault injection ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tenants(server_factory: Factory) -> ServerProcess:
    """A simulator with tokens: `default` (the first-start admin token), tenants a and b."""
    return server_factory(auth=True)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tenant_cannot_arm_a_fault_for_the_next_workspace_created(
    tenants: ServerProcess, transport: str
) -> None:
    """The attack: tenant b arms CREATE_FAIL with no workspace; tenant a's next create FAILED."""
    victim, attacker = make_token(tenants, "a"), make_token(tenants, "b")
    async with connected(tenants, transport, attacker) as b, connected(tenants, transport, victim) as a:
        for fault in (sim.FAULT_CREATE_FAIL, sim.FAULT_CREATE_FAIL_HOLDING, sim.FAULT_STALL):
            error = await rejected(b.sim.InjectFault(inject("", fault)))
            assert (error.code, error.reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
            assert "operator" in error.detail.hint
        workspace = await a.create()
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tenant_cannot_silence_the_node_or_lose_its_pool(tenants: ServerProcess, transport: str) -> None:
    """The attack: tenant b's NODE_SILENT on its own workspace turned tenant a's UNKNOWN."""
    victim, attacker = make_token(tenants, "a"), make_token(tenants, "b")
    async with connected(tenants, transport, attacker) as b, connected(tenants, transport, victim) as a:
        theirs = await a.create()
        own = await b.create()
        for fault in (sim.FAULT_NODE_SILENT, sim.FAULT_NODE_BACK, sim.FAULT_STORAGE_POOL_LOST):
            error = await rejected(b.sim.InjectFault(inject(own.workspace_id, fault)))
            assert (error.code, error.reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
        # Past the node timeout (1 s in tests): had the node gone silent, both would be UNKNOWN.
        await asyncio.sleep(1.5)
        assert (await a.get(theirs.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        assert (await b.get(own.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE


async def test_an_admin_token_is_a_tenant_admin_not_an_operator(tenants: ServerProcess) -> None:
    # (The first-start token of this embedded server is its owner's operator token: issue 36.)
    async with Client.connect(tenants.address, make_token(tenants, "default", "admin")) as admin:
        own = await admin.create()
        error = await rejected(admin.sim.InjectFault(inject(own.workspace_id, sim.FAULT_NODE_SILENT)))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        # Workspace-scoped faults on its own workspaces stay open to a tenant admin.
        await admin.sim.InjectFault(inject(own.workspace_id, sim.FAULT_GUEST_REBOOT))
        assert (await admin.wait_steady(own.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_another_tenants_workspace_is_not_found_for_every_fault(tenants: ServerProcess, transport: str) -> None:
    victim, attacker = make_token(tenants, "a"), make_token(tenants, "b")
    async with connected(tenants, transport, attacker) as b, connected(tenants, transport, victim) as a:
        theirs = await a.create()
        missing = "ws-" + uuid.uuid4().hex[:12]
        for fault in (sim.FAULT_GUEST_REBOOT, sim.FAULT_VMM_CRASH, sim.FAULT_SYNC_FAIL, sim.FAULT_STALL):
            existing = await rejected(b.sim.InjectFault(inject(theirs.workspace_id, fault)))
            absent = await rejected(b.sim.InjectFault(inject(missing, fault)))
            # Existence is never revealed: the same answer as for an ID that does not exist.
            assert (
                (existing.code, existing.reason)
                == (absent.code, absent.reason)
                == (
                    grpc.StatusCode.NOT_FOUND,
                    "NOT_FOUND",
                )
            )
        assert (await a.get(theirs.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
    async with connected(tenants, transport, make_token(tenants, "a", "reader")) as reader:
        error = await rejected(reader.sim.InjectFault(inject(theirs.workspace_id, sim.FAULT_GUEST_REBOOT)))
        assert error.code == grpc.StatusCode.PERMISSION_DENIED


async def test_an_operator_token_injects_node_wide_faults(server_factory: Factory) -> None:
    """`kibo-ctrl token create --role operator`: what the simulator's own tests and demos use."""
    server = server_factory(auth=True)
    operator = make_token(server, "ops", "operator")
    async with Client.connect(server.address, operator) as client:
        await client.sim.InjectFault(inject("", sim.FAULT_CREATE_FAIL))
        failed = await client.create()
        assert failed.state == S.WORKSPACE_STATE_FAILED
        ready = await client.create()
        await client.inject(ready.workspace_id, sim.FAULT_NODE_SILENT)
        assert (await client.wait_for(ready.workspace_id, S.WORKSPACE_STATE_UNKNOWN)).state
        await client.inject(ready.workspace_id, sim.FAULT_NODE_BACK)
        await client.wait_for(ready.workspace_id, S.WORKSPACE_STATE_AVAILABLE)


async def _service_names(address: str) -> list[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        async for reply in stub.ServerReflectionInfo(ask()):
            return [service.name for service in reply.list_services_response.service]
    raise AssertionError("no reflection answer")


async def test_the_simulator_service_exists_only_on_the_simulated_runtime(
    server_factory: Factory, tenants: ServerProcess
) -> None:
    """The attack: a `--runtime process` server answered kibo.sim.v1.SimulatorService."""
    real = server_factory("--runtime", "process", "--sandbox", "bwrap")
    for transport in TRANSPORTS:
        async with connected(real, transport) as client:
            error = await rejected(client.sim.InjectFault(inject("", sim.FAULT_CREATE_FAIL)))
            assert error.code == grpc.StatusCode.UNIMPLEMENTED, transport
    assert "kibo.sim.v1.SimulatorService" not in await _service_names(real.address)
    assert "kibo.ctrl.v1.WorkspaceService" in await _service_names(real.address)
    assert "kibo.sim.v1.SimulatorService" in await _service_names(tenants.address)


# -- finding 11: heavy reads ------------------------------------------------------------------


def _terms(count: int) -> str:
    return " AND ".join(f'labels.k{i} != "x"' for i in range(count))


@pytest.mark.parametrize("filter_text", [_terms(33), 'labels.k = "' + "v" * 5000 + '"'], ids=["terms", "chars"])
async def test_a_filter_over_its_cost_limit_is_invalid_argument(client: Client, filter_text: str) -> None:
    """The attack: 990-term filters over 3,000 workspaces slowed every other tenant's reads."""
    error = await rejected(client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=filter_text)))
    assert (error.code, error.reason, error.detail.field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        "filter",
    )
    # The limit itself is accepted.
    await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=_terms(32)))


async def test_one_list_request_scans_a_bounded_number_of_rows(server_factory: Factory) -> None:
    """A 32-term filter that matches nothing, over 7,000 workspaces: a page ends short with a
    page token once the request's scan budget is spent, instead of scanning every row in one
    read; following the tokens still finds the one workspace that matches."""
    server = server_factory("--sim-step-ms", "0", "--settle-ms", "0")
    async with Client.connect(server.address) as client:
        semaphore = asyncio.Semaphore(64)
        tag = uuid.uuid4().hex[:8]

        async def create(i: int) -> None:
            labels = {"batch": tag, **({"needle": "yes"} if i == 6999 else {})}
            request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(labels=labels))
            async with semaphore:
                await client.ws.CreateWorkspace(request)

        await asyncio.gather(*(create(i) for i in range(7000)))
        text = " AND ".join([_terms(31), 'labels.needle = "yes"'])
        first = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=text))
        assert not first.workspaces and first.next_page_token
        found, token, pages = [], first.next_page_token, 1
        while token:
            page = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=text, page_token=token))
            found += [w.labels["needle"] for w in page.workspaces]
            token, pages = page.next_page_token, pages + 1
        assert found == ["yes"] and pages >= 2


async def test_a_tenants_lists_wait_for_its_own_slots_only() -> None:
    slots = TenantSlots(2)
    entered: list[str] = []
    release = asyncio.Event()

    async def hold(tenant: str, name: str) -> None:
        async with slots.slot(tenant):
            entered.append(name)
            await release.wait()

    tasks = [asyncio.create_task(hold("heavy", f"heavy-{i}")) for i in range(5)]
    tasks.append(asyncio.create_task(hold("light", "light")))
    for _ in range(10):
        await asyncio.sleep(0)
    assert sorted(entered) == ["heavy-0", "heavy-1", "light"]
    assert slots.in_use("heavy") == 5
    release.set()
    await asyncio.gather(*tasks)
    assert len(entered) == 6 and slots.in_use("heavy") == slots.in_use("light") == 0


# Serial: the flood must outrun 1,000 calls/s, which it cannot while other tests share the CPU.
@pytest.mark.serial
async def test_a_tenant_has_a_rate_limit_by_default(server_factory: Factory) -> None:
    """No --rate-limit-rps: a tenant flooding the server is limited (1,000/s, burst 2,000)."""
    server = server_factory(auth=True)
    token = make_token(server, "flood")
    async with Client.connect(server.address, token) as client:
        outcomes: list[Any] = []
        for _ in range(12):
            outcomes += await asyncio.gather(
                *(client.ws.GetCapabilities(ws.GetCapabilitiesRequest()) for _ in range(400)), return_exceptions=True
            )
            if any(isinstance(o, grpc.aio.AioRpcError) for o in outcomes):
                break
    limited = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert limited, f"{len(outcomes)} calls, none limited"
    assert {(e.code(), _reason(e)) for e in limited} == {(grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED")}
    # Another tenant is not limited by the first one's flood.
    async with Client.connect(server.address, server.admin_token) as other:
        await other.ws.GetCapabilities(ws.GetCapabilitiesRequest())


def _reason(error: grpc.aio.AioRpcError) -> str:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for packed in status_pb2.Status.FromString(value).details:
                if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    packed.Unpack(info)
                    return info.reason
    return ""


# -- finding 12: smaller ones -----------------------------------------------------------------


def _post_json(server: ServerProcess, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://{server.http_address}/kibo.ctrl.v1.WorkspaceService/{method}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    "extra", [{"mode": "STOP_MODE_NUKE"}, {"mode": "STOP_MODE_GRACEFUL", "forse": True}], ids=["enum", "field"]
)
async def test_connect_json_with_an_unknown_name_is_invalid_argument(
    firecracker: ServerProcess, client: Client, extra: dict[str, Any]
) -> None:
    """The attack: `"mode":"STOP_MODE_NUKE"` was accepted and ran a graceful stop."""
    ready = await client.create()
    body = {"metadata": {"commandId": f"nuke-{uuid.uuid4().hex}"}, "workspaceId": ready.workspace_id, **extra}
    status, error = await asyncio.to_thread(_post_json, firecracker, "StopWorkspace", body)
    assert status == 400 and error.get("code") == "invalid_argument", (status, error)
    await asyncio.sleep(0.2)
    assert (await client.get(ready.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE


async def test_a_connect_json_error_says_the_next_step_in_its_message(
    firecracker: ServerProcess, client: Client
) -> None:
    """Issue 11, item 9: a Connect JSON client (curl) read the hint only inside base64 details."""
    ready = await client.create()
    body = {"metadata": {"commandId": f"again-{uuid.uuid4().hex}"}, "workspaceId": ready.workspace_id}
    status, error = await asyncio.to_thread(_post_json, firecracker, "StartWorkspace", body)
    assert status == 400 and error.get("code") == "failed_precondition", (status, error)
    assert error["message"].endswith("(next: the workspace is already running)"), error


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_pages_of_large_workspaces_fit_in_a_message(firecracker: ServerProcess, transport: str) -> None:
    """The attack: a default-size list of 60 workspaces with 64 KiB annotations each was
    RESOURCE_EXHAUSTED over gRPC (4 MiB message limit)."""
    tag = uuid.uuid4().hex[:12]
    annotations = {"blob": "a" * (64 * 1024 - len("blob"))}
    async with connected(firecracker, transport) as client:
        created = await asyncio.gather(
            *(
                client.ws.CreateWorkspace(
                    ws.CreateWorkspaceRequest(
                        metadata=meta(), spec=wp.WorkspaceSpec(labels={"big": tag}, annotations=annotations)
                    )
                )
                for _ in range(60)
            )
        )
        wanted = {c.workspace.workspace_id for c in created}
        seen: list[str] = []
        token, pages = "", 0
        while True:
            request = ws.ListWorkspacesRequest(filter=f'labels.big = "{tag}"', page_token=token)
            page = await client.ws.ListWorkspaces(request)
            assert page.ByteSize() <= 4 * 1024 * 1024
            seen += [w.workspace_id for w in page.workspaces]
            assert all(w.annotations["blob"] == annotations["blob"] for w in page.workspaces)
            token, pages = page.next_page_token, pages + 1
            if not token:
                break
        assert sorted(seen) == sorted(wanted) and len(seen) == 60 and pages >= 2


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_50000_term_filter_is_invalid_argument(firecracker: ServerProcess, transport: str) -> None:
    """The attack: SQLite's "Expression tree is too large" came back as UNAVAILABLE, which
    clients retry."""
    text = _terms(50_000)
    async with connected(firecracker, transport) as client:
        error = await rejected(client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=text)))
    assert (error.code, error.detail.field) == (grpc.StatusCode.INVALID_ARGUMENT, "filter")
    assert "Expression tree" not in error.detail.hint


async def test_the_sdk_raises_a_50000_term_filter_at_once(firecracker: ServerProcess) -> None:
    async with kibotos.AsyncClient(firecracker.address) as sdk:
        calls = 0
        original = sdk.workspaces.ListWorkspaces

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return original(*args, **kwargs)

        sdk.workspaces.ListWorkspaces = counting
        with pytest.raises(kibotos.InvalidArgumentError) as caught:
            async for _ in sdk.list_workspaces(filter=_terms(50_000)):
                pass
        assert caught.value.field == "filter" and calls == 1
        # settle resends on UNAVAILABLE; an INVALID_ARGUMENT it raises at once.
        request = ws.ListWorkspacesRequest(filter=_terms(50_000))
        with pytest.raises(kibotos.InvalidArgumentError):
            await sdk.settle(lambda: sdk.workspaces.ListWorkspaces(request), kibotos.SettleOptions(timeout=3))
        assert calls == 2


def _corrupt_row(server: ServerProcess) -> str:
    """A stored workspace whose record is not valid JSON, as a bug or a bad disk would leave it."""
    workspace_id = "ws-" + uuid.uuid4().hex[:12]
    conn = sqlite3.connect(server.data_dir / "kibo.db", timeout=10)
    try:
        seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1000 FROM workspaces").fetchone()[0]
        conn.execute(
            "INSERT INTO workspaces (id, seq, state, deleted, expire_at, storage_pending, data, tenant, vcpus, "
            "memory_mib) VALUES (?, ?, 3, 0, NULL, 0, ?, 'default', 1, 16)",
            (workspace_id, seq, b'{"id": "broken'),
        )
        conn.commit()
    finally:
        conn.close()
    return workspace_id


ERROR_ID = re.compile(r"error ID ([0-9a-f]{16})")


async def failure(call: Any) -> grpc.aio.AioRpcError:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError("the call was accepted")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_bug_answers_internal_with_an_error_id_the_log_explains(
    server_factory: Factory, transport: str
) -> None:
    """The attack: an unexpected exception reached the client as UNKNOWN "Unexpected <class
    ...>: ..." and SQLite's own error text was passed through."""
    server = server_factory()
    broken = _corrupt_row(server)
    async with connected(server, transport) as client:
        calls: list[tuple[str, Any]] = [
            ("unary", client.ws.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=broken))),
            ("list", client.ws.ListWorkspaces(ws.ListWorkspacesRequest())),
            # SQLite's json_extract meets the bad record: "malformed JSON".
            ("sqlite", client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter='labels.a = "b"'))),
        ]
        for name, call in calls:
            await _assert_internal(server, await failure(call), name)

        async def watch() -> None:
            async for _ in client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=broken)):
                pass

        await _assert_internal(server, await failure(watch()), "stream")


async def _assert_internal(server: ServerProcess, error: grpc.aio.AioRpcError, name: str) -> None:
    info = error_of(error)
    assert info.code == grpc.StatusCode.INTERNAL, (name, info.code, error.details())
    assert info.info.reason == "INTERNAL" and info.info.domain == "kibo.dev"
    error_id = info.info.metadata["error_id"]
    assert ERROR_ID.search(error.details() or "")[1] == error_id  # type: ignore[index]
    await asyncio.sleep(0.2)
    assert server.log_path is not None
    log = server.log_path.read_text(errors="replace")
    # The log has the ID with the traceback; the client has neither the exception nor SQL text.
    assert f"internal error {error_id}" in log and "Traceback" in log, (name, log[-3000:])
    message = error.details() or ""
    for leak in ("Unexpected", "class", "JSON", "msgspec", "Decode", "sqlite", "SELECT"):
        assert leak not in message, (name, message)


async def test_the_sdk_raises_internal_error_with_its_error_id(server_factory: Factory) -> None:
    server = server_factory()
    broken = _corrupt_row(server)
    async with kibotos.AsyncClient(server.address) as sdk:
        with pytest.raises(kibotos.InternalError) as caught:
            await sdk.get_workspace(broken)
        assert re.fullmatch(r"[0-9a-f]{16}", caught.value.error_id)
        assert caught.value.error_id in caught.value.message
