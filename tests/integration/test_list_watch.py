"""ListWorkspaces (paging, include_deleted, filters), GetCapabilities and WatchWorkspace."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S, error_of, meta, rejected


def run_label() -> str:
    return f"r{uuid.uuid4().hex[:16]}"


async def create_many(client: Client, count: int, **labels: str) -> list[str]:
    """Create `count` workspaces concurrently (in groups), return their IDs in creation order."""
    ids: list[str] = []
    for start in range(0, count, 16):
        requests = [
            ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(labels=labels))
            for _ in range(start, min(count, start + 16))
        ]
        # One at a time to fix the order, without waiting for each to finish.
        for request in requests:
            ids.append((await client.ws.CreateWorkspace(request)).workspace.workspace_id)
    await asyncio.gather(*(client.wait_for(i, S.WORKSPACE_STATE_AVAILABLE) for i in ids))
    return ids


async def list_all(client: Client, flt: str = "", include_deleted: bool = False, page_size: int = 1000) -> list[str]:
    found: list[str] = []
    token = ""
    while True:
        request = ws.ListWorkspacesRequest(
            page_size=page_size, page_token=token, filter=flt, include_deleted=include_deleted
        )
        response = await client.ws.ListWorkspaces(request)
        assert len(response.workspaces) <= page_size
        found.extend(w.workspace_id for w in response.workspaces)
        token = response.next_page_token
        if not token:
            return found


async def test_page_size_defaults_to_50_and_pages_cover_everything_once(client: Client) -> None:
    run = run_label()
    ids = await create_many(client, 53, run=run)
    flt = f'labels.run = "{run}"'
    first = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt))
    assert len(first.workspaces) == 50
    assert first.next_page_token
    rest = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt, page_token=first.next_page_token))
    assert len(rest.workspaces) == 3
    assert rest.next_page_token == ""
    listed = [w.workspace_id for w in (*first.workspaces, *rest.workspaces)]
    assert sorted(listed) == sorted(ids)
    for page_size in (1, 7, 50, 53, 1000):
        paged = await list_all(client, flt, page_size=page_size)
        assert len(paged) == len(set(paged)) == 53
        assert set(paged) == set(ids)
    exact = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt, page_size=53))
    assert len(exact.workspaces) == 53 and exact.next_page_token == ""


async def test_page_size_and_page_token_are_checked(client: Client) -> None:
    for page_size in (1001, -1, 2**31 - 1):
        error = await rejected(client.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=page_size)))
        assert (error.code, error.reason, error.detail.field) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            "page_size",
        )
    assert len((await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=1000))).workspaces) <= 1000
    run = run_label()
    await create_many(client, 3, run=run)
    page = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=f'labels.run = "{run}"', page_size=1))
    assert page.next_page_token
    for request in (
        ws.ListWorkspacesRequest(page_token="not a token"),
        ws.ListWorkspacesRequest(page_token="eyJ4IjogMX0="),  # base64 of {"x": 1}
        # a token is bound to its query: another filter or include_deleted cannot use it
        ws.ListWorkspacesRequest(page_token=page.next_page_token, filter=f'labels.run = "{run}x"', page_size=1),
        ws.ListWorkspacesRequest(
            page_token=page.next_page_token, filter=f'labels.run = "{run}"', page_size=1, include_deleted=True
        ),
    ):
        error = await rejected(client.ws.ListWorkspaces(request))
        assert (error.code, error.detail.field) == (grpc.StatusCode.INVALID_ARGUMENT, "page_token"), request


async def test_deleted_workspaces_are_listed_only_with_include_deleted(client: Client) -> None:
    run = run_label()
    kept, gone = await create_many(client, 2, run=run)
    assert (await client.delete(gone)).workspace.state == S.WORKSPACE_STATE_DELETED
    flt = f'labels.run = "{run}"'
    assert await list_all(client, flt) == [kept]
    assert sorted(await list_all(client, flt, include_deleted=True)) == sorted([kept, gone])
    response = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt, include_deleted=True))
    states = {w.workspace_id: w.state for w in response.workspaces}
    assert states == {kept: S.WORKSPACE_STATE_AVAILABLE, gone: S.WORKSPACE_STATE_DELETED}
    assert await list_all(client, f"{flt} AND state = DELETED", include_deleted=True) == [gone]
    assert await list_all(client, f"{flt} AND state = DELETED") == []


async def test_filters(client: Client) -> None:
    run = run_label()
    a_up, a_stopped = await create_many(client, 2, run=run, team="a")
    (b_up,) = await create_many(client, 1, run=run, team="b")
    await client.stop(a_stopped)
    mine = {a_up, a_stopped, b_up}

    available = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter="state = AVAILABLE", page_size=1000))
    assert all(w.state == S.WORKSPACE_STATE_AVAILABLE for w in available.workspaces)
    listed = await list_all(client, "state = AVAILABLE")
    assert {a_up, b_up} <= set(listed) and a_stopped not in listed

    response = await client.ws.ListWorkspaces(
        ws.ListWorkspacesRequest(filter='labels.team = "a" AND state != STOPPED', page_size=1000)
    )
    assert all(w.labels["team"] == "a" and w.state != S.WORKSPACE_STATE_STOPPED for w in response.workspaces)
    listed = await list_all(client, 'labels.team = "a" AND state != STOPPED')
    assert set(listed) & mine == {a_up}

    expected = {
        f'labels.run = "{run}"': mine,
        f"labels.run = {run}": mine,
        f'labels.run = "{run}" AND labels.team = "a"': {a_up, a_stopped},
        f'labels.run = "{run}" AND labels.team != "a"': {b_up},
        f'labels.run = "{run}" AND state = STOPPED': {a_stopped},
        f'labels.run = "{run}" AND state = WORKSPACE_STATE_STOPPED': {a_stopped},
        f'labels.run = "{run}" AND state != STOPPED AND labels.team = "b"': {b_up},
        f'labels.run = "{run}" AND labels.missing = "x"': set(),
        f'labels.run = "{run}" AND state = AVAILABLE AND state = STOPPED': set(),
    }
    for flt, wanted in expected.items():
        assert set(await list_all(client, flt)) == wanted, flt


@pytest.mark.parametrize(
    "flt",
    [
        "foo = 1",
        "state = NOPE",
        "state = UNSPECIFIED",
        "state ~ AVAILABLE",
        "state",
        'labels.team = "a" OR state = AVAILABLE',
        'labels.team = "a" AND',
        "AND state = AVAILABLE",
        "state = AVAILABLE AND (state = STOPPED)",
        '"unterminated',
        "labels. = x",
    ],
)
async def test_a_bad_filter_is_invalid_argument_naming_filter(client: Client, flt: str) -> None:
    error = await rejected(client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt)))
    assert (error.code, error.reason, error.detail.field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        "filter",
    ), flt
    assert error.info.reason == "INVALID_ARGUMENT"


async def test_capabilities(client: Client, kibovm_client: Client) -> None:
    firecracker = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
    kibovm = (await kibovm_client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
    assert "workspace.stop.force" in firecracker
    assert "workspace.stop.guest_shutdown" not in firecracker
    assert "workspace.stop.force" in kibovm
    assert "workspace.stop.guest_shutdown" in kibovm


async def test_watch_starts_with_a_snapshot_follows_changes_and_ends_after_deleted(client: Client) -> None:
    workspace = await client.create()
    workspace_id = workspace.workspace_id
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
    first = (await call.read()).workspace
    assert first == await client.get(workspace_id)
    assert first.state == S.WORKSPACE_STATE_AVAILABLE

    await client.stop(workspace_id)
    await client.start(workspace_id)
    await client.delete(workspace_id)
    seen = [first]
    while (message := await call.read()) is not grpc.aio.EOF:
        assert isinstance(message, ws.WatchWorkspaceResponse)
        seen.append(message.workspace)
    assert await call.code() == grpc.StatusCode.OK
    assert seen[-1].state == S.WORKSPACE_STATE_DELETED
    assert all(w.state != S.WORKSPACE_STATE_DELETED for w in seen[:-1])
    states = [w.state for w in seen]
    for state in (S.WORKSPACE_STATE_STOPPING, S.WORKSPACE_STATE_STOPPED, S.WORKSPACE_STATE_STARTING):
        assert state in states
    # One message per stored change: every message differs from the one before.
    etags = [w.etag for w in seen]
    assert len(etags) == len(set(etags))
    assert [w.update_time.ToNanoseconds() for w in seen] == sorted(w.update_time.ToNanoseconds() for w in seen)

    # On a deleted workspace: the snapshot, then the end.
    again = [m.workspace async for m in client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))]
    assert [w.state for w in again] == [S.WORKSPACE_STATE_DELETED]


async def test_watch_of_an_unknown_workspace_is_not_found(client: Client) -> None:
    for workspace_id, code in (
        ("ws-00000000000000000000", grpc.StatusCode.NOT_FOUND),
        ("", grpc.StatusCode.INVALID_ARGUMENT),
        ("not an id", grpc.StatusCode.INVALID_ARGUMENT),
    ):
        call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
        with pytest.raises(grpc.aio.AioRpcError) as excinfo:
            await call.read()
        error = error_of(excinfo.value)
        assert error.code == code
        assert error.reason == code.name
