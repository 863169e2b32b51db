"""The events feed, WatchWorkspace, volumes and bindings, labels and network policy by state.

Rules: lifecycle.md "The objects" (Volume), "Delete", "What each state allows", "How status is
derived" (events feed); api-contract.md WatchWorkspace and ListWorkspaceEvents."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import grpc
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.client import Client, S, assert_conflict, meta, rejected

SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED


async def get_volume(client: Client, volume_id: str) -> vol.Volume:
    volume: vol.Volume = (await client.vol.GetVolume(vol.GetVolumeRequest(volume_id=volume_id))).volume
    return volume


async def wait_volume(client: Client, volume_id: str, check: Callable[[vol.Volume], bool]) -> vol.Volume:
    deadline = time.monotonic() + 10
    while True:
        volume = await get_volume(client, volume_id)
        if check(volume):
            return volume
        if time.monotonic() > deadline:
            raise TimeoutError(f"volume condition not met; last seen:\n{volume}")
        await asyncio.sleep(0.02)


def own_volume(workspace: wp.Workspace) -> wp.VolumeBinding:
    [binding] = [b for b in workspace.spec.volumes if b.mount_path == "/data"]
    return binding


# -- the events feed -----------------------------------------------------------------------


async def test_events_record_every_transition(any_client: Client) -> None:
    client = any_client
    create = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec())
    wid = (await client.settle(client.ws.CreateWorkspace, create)).workspace.workspace_id
    await client.wait_for(wid, S.WORKSPACE_STATE_AVAILABLE)
    stop = await client.stop(wid)
    start = await client.start(wid)
    delete = await client.delete(wid)
    assert delete.workspace.state == S.WORKSPACE_STATE_DELETED

    events = await client.events(wid)
    changes = [e for e in events if e.type == obs.EVENT_TYPE_STATE_CHANGED]
    ids = {
        "create": create.metadata.command_id,
        "stop": stop.command.command_id,
        "start": start.command.command_id,
        "delete": delete.command.command_id,
    }
    expected = [
        (S.WORKSPACE_STATE_CREATING, ids["create"]),
        (S.WORKSPACE_STATE_AVAILABLE, ids["create"]),
        (S.WORKSPACE_STATE_STOPPING, ids["stop"]),
        (S.WORKSPACE_STATE_STOPPED, ids["stop"]),
        (S.WORKSPACE_STATE_STARTING, ids["start"]),
        (S.WORKSPACE_STATE_AVAILABLE, ids["start"]),
        (S.WORKSPACE_STATE_DELETING, ids["delete"]),
        (S.WORKSPACE_STATE_DELETED, ids["delete"]),
    ]
    assert [(e.to_state, e.command_id) for e in changes] == expected
    # A chain: each transition starts where the previous one ended.
    for previous, event in itertools.pairwise(changes):
        assert event.from_state == previous.to_state
    assert changes[0].from_state in (S.WORKSPACE_STATE_UNSPECIFIED, S.WORKSPACE_STATE_CREATING)
    # Every event has a time; times and sequences never go back.
    assert all(e.HasField("event_time") for e in events)
    times = [e.event_time.ToNanoseconds() for e in events]
    assert times == sorted(times)
    sequences = [e.sequence for e in events]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    # The commands are in the feed too.
    accepted = {e.command_id for e in events if e.type == obs.EVENT_TYPE_COMMAND_ACCEPTED}
    assert set(ids.values()) <= accepted
    assert {e.execution_generation for e in changes if e.to_state == S.WORKSPACE_STATE_STARTING} == {2}


async def test_events_paging(client: Client) -> None:
    wid = (await client.create()).workspace_id
    for _ in range(2):
        await client.stop(wid)
        await client.start(wid)
    everything = await client.events(wid)
    assert len(everything) > 6
    paged: list[obs.WorkspaceEvent] = []
    token = ""
    pages = 0
    while True:
        request = obs.ListWorkspaceEventsRequest(workspace_id=wid, page_size=3, page_token=token)
        response = await client.obs.ListWorkspaceEvents(request)
        assert len(response.events) <= 3
        paged.extend(response.events)
        pages += 1
        token = response.next_page_token
        if not token:
            break
        assert len(response.events) == 3
    assert pages >= 3
    assert [e.sequence for e in paged] == [e.sequence for e in everything]
    assert paged == everything
    # A token is bound to its query.
    first = await client.obs.ListWorkspaceEvents(obs.ListWorkspaceEventsRequest(workspace_id=wid, page_size=1))
    other = (await client.create()).workspace_id
    error = await rejected(
        client.obs.ListWorkspaceEvents(
            obs.ListWorkspaceEventsRequest(workspace_id=other, page_size=1, page_token=first.next_page_token)
        )
    )
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    error = await rejected(
        client.obs.ListWorkspaceEvents(obs.ListWorkspaceEventsRequest(workspace_id=wid, page_token="not-a-token"))
    )
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    for workspace_id in (wid, other):
        await client.delete(workspace_id)


# -- WatchWorkspace ------------------------------------------------------------------------


async def test_watch_snapshot_then_each_change_ends_after_deleted(any_client: Client) -> None:
    client = any_client
    wid = (await client.create()).workspace_id
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=wid))
    first = await call.read()
    assert isinstance(first, ws.WatchWorkspaceResponse)
    current = await client.get(wid)
    assert first.workspace == current  # the current snapshot, nothing happened since
    before = {e.sequence for e in await client.events(wid)}

    async def drive() -> None:
        await client.stop(wid)
        await client.start(wid)
        await client.delete(wid)

    driver = asyncio.create_task(drive())
    snapshots: list[wp.Workspace] = []

    async def collect() -> None:
        while (message := await call.read()) != grpc.aio.EOF:
            assert isinstance(message, ws.WatchWorkspaceResponse)
            snapshots.append(message.workspace)

    await asyncio.wait_for(collect(), 15)
    await driver
    assert await call.code() == grpc.StatusCode.OK
    assert snapshots, "no change was sent"
    assert snapshots[-1].state == S.WORKSPACE_STATE_DELETED
    assert all(s.state != S.WORKSPACE_STATE_DELETED for s in snapshots[:-1])
    # One message per change: no snapshot repeats one already sent.
    etags = [first.workspace.etag] + [s.etag for s in snapshots]
    assert len(set(etags)) == len(etags)
    # Every transition the feed recorded meanwhile was seen by the watcher, in order.
    events = [e for e in await client.events(wid) if e.sequence not in before]
    transitions = [e.to_state for e in events if e.type == obs.EVENT_TYPE_STATE_CHANGED]
    seen = [s.state for s in snapshots]
    deduplicated = [state for i, state in enumerate(seen) if i == 0 or seen[i - 1] != state]
    assert deduplicated == transitions


async def test_watch_deleted_workspace_sends_snapshot_and_ends(client: Client) -> None:
    wid = (await client.create()).workspace_id
    await client.delete(wid)
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=wid))
    messages = [m.workspace async for m in call]
    assert await call.code() == grpc.StatusCode.OK
    assert [m.state for m in messages] == [S.WORKSPACE_STATE_DELETED]
    # The snapshot is the stored workspace; its files may still be released afterwards, which
    # stores it once more (the watch has ended by then), so compare all but that change.
    current = await client.get(wid)
    assert messages[0].workspace_id == current.workspace_id and messages[0].delete_time == current.delete_time
    assert int(messages[0].etag) <= int(current.etag)


async def test_watch_unknown_workspace_not_found(client: Client) -> None:
    call = client.ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id="ws-00000000000000000000"))
    error = await rejected(call.read())
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


# -- volumes -------------------------------------------------------------------------------


async def test_default_volume_created_and_deleted_with_workspace(any_client: Client) -> None:
    client = any_client
    workspace = await client.create()
    wid = workspace.workspace_id
    binding = own_volume(workspace)
    assert binding.delete_with_workspace
    assert binding.storage_pool
    volume = await get_volume(client, binding.volume_id)
    assert volume.state == vol.VOLUME_STATE_READY
    assert volume.workspace_id == wid
    # Kept across stop and start.
    await client.stop(wid)
    started = await client.start(wid)
    assert own_volume(started.workspace).volume_id == binding.volume_id
    assert (await get_volume(client, binding.volume_id)).state == vol.VOLUME_STATE_READY
    await client.delete(wid)
    await wait_volume(client, binding.volume_id, lambda v: v.state == vol.VOLUME_STATE_DELETED)


async def test_existing_volume_kept_on_delete_and_unbound(any_client: Client) -> None:
    client = any_client
    existing = await client.create_volume(2)
    assert existing.state == vol.VOLUME_STATE_READY and not existing.workspace_id
    spec = {"volumes": [wp.VolumeBinding(volume_id=existing.volume_id, mount_path="/mnt/shared")]}
    workspace = await client.create(**spec)
    wid = workspace.workspace_id
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE
    [bound] = [b for b in workspace.spec.volumes if b.volume_id == existing.volume_id]
    assert (bound.mount_path, bound.delete_with_workspace) == ("/mnt/shared", False)
    assert own_volume(workspace).volume_id != existing.volume_id
    assert (await get_volume(client, existing.volume_id)).workspace_id == wid
    own = own_volume(workspace).volume_id
    await client.delete(wid)
    await wait_volume(client, own, lambda v: v.state == vol.VOLUME_STATE_DELETED)
    kept = await get_volume(client, existing.volume_id)
    assert kept.state == vol.VOLUME_STATE_READY
    assert kept.workspace_id == ""
    # Unbound, it can be bound again elsewhere.
    again = await client.create(volumes=[wp.VolumeBinding(volume_id=existing.volume_id, mount_path="/mnt/x")])
    assert (await get_volume(client, existing.volume_id)).workspace_id == again.workspace_id
    await client.delete(again.workspace_id)


async def test_binding_delete_with_workspace_makes_the_volume_go(any_client: Client) -> None:
    client = any_client
    existing = await client.create_volume()
    binding = wp.VolumeBinding(volume_id=existing.volume_id, mount_path="/mnt/scratch", delete_with_workspace=True)
    workspace = await client.create(volumes=[binding])
    await client.delete(workspace.workspace_id)
    await wait_volume(client, existing.volume_id, lambda v: v.state == vol.VOLUME_STATE_DELETED)


def bind_request(workspace_id: str, volume_id: str, path: str, with_workspace: bool = False) -> Any:
    binding = wp.VolumeBinding(volume_id=volume_id, mount_path=path, delete_with_workspace=with_workspace)
    return ws.BindWorkspaceVolumeRequest(metadata=meta(), workspace_id=workspace_id, binding=binding)


def unbind_request(workspace_id: str, volume_id: str) -> Any:
    return ws.UnbindWorkspaceVolumeRequest(metadata=meta(), workspace_id=workspace_id, volume_id=volume_id)


async def test_bind_unbind_rebind_only_when_stopped(any_client: Client) -> None:
    client = any_client
    volume = await client.create_volume()
    vid = volume.volume_id
    workspace = await client.create()
    wid = workspace.workspace_id
    # AVAILABLE: no binding changes.
    await assert_conflict(client.ws.BindWorkspaceVolume(bind_request(wid, vid, "/mnt/a")))
    assert not (await get_volume(client, vid)).workspace_id
    await client.stop(wid)
    bound = await client.ws.BindWorkspaceVolume(bind_request(wid, vid, "/mnt/a"))
    assert bound.command.state == SUCCEEDED
    assert [(b.mount_path, b.delete_with_workspace) for b in bound.workspace.spec.volumes if b.volume_id == vid] == [
        ("/mnt/a", False)
    ]
    assert (await get_volume(client, vid)).workspace_id == wid
    # Rebind: the existing binding of the volume is replaced.
    rebound = await client.ws.BindWorkspaceVolume(bind_request(wid, vid, "/mnt/b", with_workspace=True))
    assert [(b.mount_path, b.delete_with_workspace) for b in rebound.workspace.spec.volumes if b.volume_id == vid] == [
        ("/mnt/b", True)
    ]
    unbound = await client.ws.UnbindWorkspaceVolume(unbind_request(wid, vid))
    assert all(b.volume_id != vid for b in unbound.workspace.spec.volumes)
    kept = await get_volume(client, vid)
    assert (kept.state, kept.workspace_id) == (vol.VOLUME_STATE_READY, "")
    await client.ws.BindWorkspaceVolume(bind_request(wid, vid, "/mnt/c", with_workspace=True))
    started = await client.start(wid)
    assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
    assert any(b.volume_id == vid and b.mount_path == "/mnt/c" for b in started.workspace.spec.volumes)
    # AVAILABLE and FAILED: neither unbind nor rebind.
    await assert_conflict(client.ws.UnbindWorkspaceVolume(unbind_request(wid, vid)))
    await assert_conflict(client.ws.BindWorkspaceVolume(bind_request(wid, vid, "/mnt/d")))
    await client.inject(wid, sim.FAULT_VMM_CRASH)
    await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    await assert_conflict(client.ws.UnbindWorkspaceVolume(unbind_request(wid, vid)))
    await assert_conflict(client.ws.BindWorkspaceVolume(bind_request(wid, vid, "/mnt/d")))
    # The binding's setting decides: this one goes with the workspace.
    await client.delete(wid)
    await wait_volume(client, vid, lambda v: v.state == vol.VOLUME_STATE_DELETED)
    await assert_conflict(client.ws.BindWorkspaceVolume(bind_request(wid, vid, "/mnt/e")))


# -- labels and network policy by state ----------------------------------------------------


def labels_request(workspace_id: str, tag: str) -> ws.SetWorkspaceLabelsRequest:
    return ws.SetWorkspaceLabelsRequest(
        metadata=meta(), workspace_id=workspace_id, labels={"state": tag}, annotations={"note": f"in {tag}"}
    )


def policy_request(workspace_id: str) -> ws.SetWorkspaceNetworkPolicyRequest:
    policy = wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_cidrs=["10.0.0.0/8"])
    return ws.SetWorkspaceNetworkPolicyRequest(metadata=meta(), workspace_id=workspace_id, network_policy=policy)


async def check_labels(client: Client, workspace_id: str, tag: str) -> None:
    response = await client.ws.SetWorkspaceLabels(labels_request(workspace_id, tag))
    assert response.command.state == SUCCEEDED
    assert dict(response.workspace.labels) == {"state": tag}
    assert dict(response.workspace.annotations) == {"note": f"in {tag}"}
    assert dict((await client.get(workspace_id)).labels) == {"state": tag}


async def test_labels_every_state_but_deleted_policy_only_available_and_stopped(any_client: Client) -> None:
    client = any_client
    # CREATING
    await client.inject("", sim.FAULT_STALL)
    create = ws.CreateWorkspaceRequest(
        metadata=meta(), spec=wp.WorkspaceSpec(labels={"old": "x"}, annotations={"old": "y"})
    )
    wid = (await client.ws.CreateWorkspace(create)).workspace.workspace_id
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_CREATING
    await check_labels(client, wid, "creating")
    await assert_conflict(client.ws.SetWorkspaceNetworkPolicy(policy_request(wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    await client.settle(client.ws.CreateWorkspace, create)
    # AVAILABLE: both; the policy is effective now.
    assert (await client.get(wid)).state == S.WORKSPACE_STATE_AVAILABLE
    await check_labels(client, wid, "available")
    policy = await client.ws.SetWorkspaceNetworkPolicy(policy_request(wid))
    assert policy.command.state == SUCCEEDED
    assert policy.workspace.spec.network_policy.egress == wp.NETWORK_EGRESS_ALLOW_LISTED
    assert list(policy.workspace.spec.network_policy.allowed_cidrs) == ["10.0.0.0/8"]
    # STOPPING
    await client.inject(wid, sim.FAULT_STALL)
    stop = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=wid)
    assert (await client.ws.StopWorkspace(stop)).workspace.state == S.WORKSPACE_STATE_STOPPING
    await check_labels(client, wid, "stopping")
    await assert_conflict(client.ws.SetWorkspaceNetworkPolicy(policy_request(wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    await client.settle(client.ws.StopWorkspace, stop)
    # STOPPED: both (the policy is effective at the next start).
    await check_labels(client, wid, "stopped")
    deny = ws.SetWorkspaceNetworkPolicyRequest(
        metadata=meta(), workspace_id=wid, network_policy=wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_DENY_ALL)
    )
    denied = await client.ws.SetWorkspaceNetworkPolicy(deny)
    assert denied.workspace.spec.network_policy.egress == wp.NETWORK_EGRESS_DENY_ALL
    # STARTING
    await client.inject(wid, sim.FAULT_STALL)
    start = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=wid)
    assert (await client.ws.StartWorkspace(start)).workspace.state == S.WORKSPACE_STATE_STARTING
    await check_labels(client, wid, "starting")
    await assert_conflict(client.ws.SetWorkspaceNetworkPolicy(policy_request(wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    started = await client.settle(client.ws.StartWorkspace, start)
    assert started.workspace.spec.network_policy.egress == wp.NETWORK_EGRESS_DENY_ALL
    # FAILED
    await client.inject(wid, sim.FAULT_VMM_CRASH)
    await client.wait_for(wid, S.WORKSPACE_STATE_FAILED)
    await check_labels(client, wid, "failed")
    await assert_conflict(client.ws.SetWorkspaceNetworkPolicy(policy_request(wid)))
    # DELETING
    await client.inject(wid, sim.FAULT_STALL)
    delete = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=wid)
    assert (await client.ws.DeleteWorkspace(delete)).workspace.state == S.WORKSPACE_STATE_DELETING
    await check_labels(client, wid, "deleting")
    await assert_conflict(client.ws.SetWorkspaceNetworkPolicy(policy_request(wid)))
    await client.inject(wid, sim.FAULT_UNSTALL)
    assert (await client.settle(client.ws.DeleteWorkspace, delete)).workspace.state == S.WORKSPACE_STATE_DELETED
    # DELETED: neither; nothing changes.
    await assert_conflict(client.ws.SetWorkspaceLabels(labels_request(wid, "deleted")))
    await assert_conflict(client.ws.SetWorkspaceNetworkPolicy(policy_request(wid)))
    deleted = await client.get(wid)
    assert dict(deleted.labels) == {"state": "deleting"}
    assert deleted.spec.network_policy.egress == wp.NETWORK_EGRESS_DENY_ALL
