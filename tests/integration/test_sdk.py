"""The Python SDK (kibotos) against a real server: errors, command IDs, settle, waits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import kibotos
import pytest
from kibo.ctrl.v1 import command_pb2, error_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

from tests.server import ServerProcess

S = wp.WorkspaceState
SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED


@pytest.fixture
async def sdk(firecracker: ServerProcess) -> AsyncIterator[kibotos.AsyncClient]:
    async with kibotos.AsyncClient(firecracker.address) as client:
        yield client


@pytest.fixture
def sync_sdk(firecracker: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(firecracker.address) as client:
        yield client


@pytest.fixture(scope="module")
def own_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    """A server of this module's own, to restart."""
    server = server_factory()
    yield server
    server.stop()


async def until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)


async def accepted_count(client: kibotos.AsyncClient, workspace_id: str, command_id: str) -> int:
    events = [e async for e in client.list_workspace_events(workspace_id)]
    return sum(1 for e in events if e.type == obs.EVENT_TYPE_COMMAND_ACCEPTED and e.command_id == command_id)


# -- command IDs -----------------------------------------------------------------------


def test_new_command_id_is_prefix_plus_uuid() -> None:
    first, second = kibotos.new_command_id("example"), kibotos.new_command_id("example")
    assert first.startswith("example/") and len(first) == len("example/") + 36
    assert first != second
    assert kibotos.check_command_id(first) == first


@pytest.mark.parametrize("prefix", ["guest-shutdown", "host-memory", "host-memory/"])
def test_new_command_id_refuses_reserved_prefixes(prefix: str) -> None:
    with pytest.raises(kibotos.ReservedCommandIdError) as caught:
        kibotos.new_command_id(prefix)
    assert isinstance(caught.value, kibotos.InvalidArgumentError)
    assert caught.value.reason == "RESERVED_COMMAND_ID"
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("prefix", ["has space", "x" * 100, "ünïcode"])
def test_new_command_id_refuses_what_the_server_would(prefix: str) -> None:
    with pytest.raises(kibotos.InvalidArgumentError) as caught:
        kibotos.new_command_id(prefix)
    assert caught.value.reason == "INVALID_ARGUMENT"


# -- errors ----------------------------------------------------------------------------


async def test_rejections_map_to_one_class_each(sdk: kibotos.AsyncClient) -> None:
    created = await sdk.create_workspace()
    workspace_id = created.workspace.workspace_id

    with pytest.raises(kibotos.NotFoundError) as not_found:
        await sdk.get_workspace("ws-00000000000000000000")
    assert not_found.value.code == grpc.StatusCode.NOT_FOUND and not_found.value.reason == "NOT_FOUND"

    with pytest.raises(kibotos.InvalidArgumentError) as invalid:
        await sdk.get_workspace("not-a-workspace-id")
    assert invalid.value.reason == "INVALID_ARGUMENT" and invalid.value.field == "workspace_id"

    stopped = await sdk.stop_workspace(workspace_id)
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
    with pytest.raises(kibotos.ConflictError) as conflict:
        await sdk.stop_workspace(workspace_id)
    error = conflict.value
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "CONFLICT" and error.workspace_state == "STOPPED"
    assert error.hint and error.metadata["state"] == "STOPPED"
    assert error.info.reason == "CONFLICT"

    # The same command ID for another request.
    reused = kibotos.new_command_id("test")
    await sdk.start_workspace(workspace_id, command_id=reused)
    with pytest.raises(kibotos.CommandIdReusedError) as again:
        await sdk.stop_workspace(workspace_id, command_id=reused)
    assert again.value.code == grpc.StatusCode.ALREADY_EXISTS and again.value.reason == "COMMAND_ID_REUSED"

    with pytest.raises(kibotos.AbortedError) as aborted:
        await sdk.stop_workspace(workspace_id, expected_expiration_revision=99)
    assert aborted.value.code == grpc.StatusCode.ABORTED and aborted.value.reason == "REVISION_MISMATCH"
    assert (await sdk.get_workspace(workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE


async def test_reserved_command_id_from_the_server(sdk: kibotos.AsyncClient) -> None:
    """The raw stub bypasses the client-side check: the server's answer decodes the same."""
    created = await sdk.create_workspace()
    request = ws.StopWorkspaceRequest(
        metadata=wp.CommandMetadata(command_id="guest-shutdown/mine"), workspace_id=created.workspace.workspace_id
    )
    with pytest.raises(kibotos.ReservedCommandIdError) as caught:
        await kibotos.settle_async(lambda: sdk.workspaces.StopWorkspace(request))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.detail.reason == error_pb2.ERROR_REASON_RESERVED_COMMAND_ID
    assert caught.value.field == "metadata.command_id"


async def test_unreachable_server_is_unavailable() -> None:
    async with kibotos.AsyncClient("127.0.0.1:1", timeout=5) as client:
        with pytest.raises(kibotos.UnavailableError) as caught:
            await client.get_capabilities()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE


# -- settle ----------------------------------------------------------------------------


async def test_settle_resends_a_stalled_stop_until_terminal(sdk: kibotos.AsyncClient) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    await sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    answers: list[kibotos.CommandResponse] = []

    async def unstall_after_a_resend() -> None:
        await until(lambda: len(answers) >= 2)
        await sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)

    helper = asyncio.create_task(unstall_after_a_resend())
    stopped = await sdk.stop_workspace(workspace_id, on_answer=answers.append)
    await helper

    assert not kibotos.is_terminal(answers[0].command)  # the stall held the first answer
    assert len({a.command.command_id for a in answers}) == 1
    assert stopped.command.state == SUCCEEDED
    assert stopped.command.result.durability == wp.STOP_DURABILITY_CONFIRMED
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
    # Resending never executed it twice.
    assert await accepted_count(sdk, workspace_id, stopped.command.command_id) == 1


def test_settle_with_the_raw_sync_stub_like_the_go_snippet(sync_sdk: kibotos.Client) -> None:
    workspace_id = sync_sdk.create_workspace().workspace.workspace_id
    sync_sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    current = sync_sdk.workspaces.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=workspace_id))
    request = ws.StopWorkspaceRequest(
        metadata=wp.CommandMetadata(command_id=kibotos.new_command_id("example")),
        workspace_id=workspace_id,
        expected_expiration_revision=current.workspace.expiration.revision,
    )
    states: list[int] = []

    def call() -> ws.StopWorkspaceResponse:
        response: ws.StopWorkspaceResponse = sync_sdk.workspaces.StopWorkspace(request)
        states.append(response.command.state)
        if len(states) == 2:
            sync_sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
        return response

    stopped = kibotos.settle(call, kibotos.SettleOptions(timeout=20))
    assert states[0] in (command_pb2.COMMAND_STATE_PENDING, command_pb2.COMMAND_STATE_RUNNING)
    assert states[-1] == SUCCEEDED and len(states) >= 3
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED


async def test_settle_gives_up_at_its_deadline_and_cancels_nothing(sdk: kibotos.AsyncClient) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    await sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    command_id = kibotos.new_command_id("test")
    with pytest.raises(kibotos.SettleTimeoutError) as caught:
        await sdk.stop_workspace(workspace_id, command_id=command_id, settle=kibotos.SettleOptions(timeout=0.5))
    assert caught.value.command_id == command_id and isinstance(caught.value, TimeoutError)
    assert not kibotos.is_terminal(await sdk.get_command(command_id))
    await sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
    # Settling it again later (same request) returns its result.
    stopped = await sdk.stop_workspace(workspace_id, command_id=command_id)
    assert stopped.command.state == SUCCEEDED


async def test_a_superseded_stop_raises_command_failed_with_cancelled(sdk: kibotos.AsyncClient) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    await sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    graceful = await sdk.stop_workspace(workspace_id, settle=False)
    assert not kibotos.is_terminal(graceful.command)
    forced = await sdk.stop_workspace(workspace_id, force=True)
    assert forced.command.result.durability == wp.STOP_DURABILITY_UNCONFIRMED
    with pytest.raises(kibotos.CommandFailedError) as caught:
        await sdk.stop_workspace(workspace_id, command_id=graceful.command.command_id)
    error = caught.value
    assert error.cancelled and error.status_code == grpc.StatusCode.CANCELLED
    assert error.command.command_id == graceful.command.command_id
    assert error.workspace is not None and error.workspace.state == S.WORKSPACE_STATE_STOPPED


async def test_a_failed_create_raises_command_failed(sdk: kibotos.AsyncClient) -> None:
    await sdk.inject_fault("", sim.FAULT_CREATE_FAIL)
    with pytest.raises(kibotos.CommandFailedError) as caught:
        await sdk.create_workspace()
    assert caught.value.workspace is not None
    assert caught.value.workspace.state == S.WORKSPACE_STATE_FAILED
    assert not caught.value.cancelled


# -- waits -----------------------------------------------------------------------------


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "polling"])
async def test_wait_workspace_follows_a_start(sdk: kibotos.AsyncClient, watch: bool) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    await sdk.stop_workspace(workspace_id)
    await sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    started = await sdk.start_workspace(workspace_id, settle=False)
    assert not kibotos.is_terminal(started.command)
    seen: list[int] = []
    waiting = asyncio.create_task(
        sdk.wait_workspace(
            started.workspace,
            started.command.command_id,
            timeout=20,
            options=kibotos.WaitOptions(watch=watch),
            on_update=lambda w: seen.append(w.state),
        )
    )
    await until(lambda: bool(seen))
    assert not waiting.done()
    await sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
    workspace = await waiting
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE and workspace.execution_generation == 2
    assert seen[0] == S.WORKSPACE_STATE_STARTING and seen[-1] == S.WORKSPACE_STATE_AVAILABLE


async def test_wait_raises_the_commands_error(sdk: kibotos.AsyncClient) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    await sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    await sdk.inject_fault(workspace_id, sim.FAULT_SYNC_FAIL)
    stop = await sdk.stop_workspace(workspace_id, settle=False)
    waiting = asyncio.create_task(sdk.wait_workspace(workspace_id, stop.command.command_id, timeout=20))
    await sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
    with pytest.raises(kibotos.CommandFailedError) as caught:
        await waiting
    assert caught.value.command_id == stop.command.command_id
    assert caught.value.workspace is not None and caught.value.workspace.state == S.WORKSPACE_STATE_FAILED
    # It still holds execution: force stop is accepted.
    forced = await sdk.stop_workspace(workspace_id, force=True)
    assert forced.workspace.state == S.WORKSPACE_STATE_STOPPED


async def test_wait_timeout_cancels_nothing(sdk: kibotos.AsyncClient) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    await sdk.inject_fault(workspace_id, sim.FAULT_STALL)
    deleting = await sdk.delete_workspace(workspace_id, settle=False)
    command_id = deleting.command.command_id
    with pytest.raises(kibotos.WaitTimeoutError) as caught:
        await sdk.wait_workspace_deleted(workspace_id, command_id, timeout=0.4)
    assert caught.value.command_id == command_id
    assert caught.value.workspace is not None and caught.value.workspace.state == S.WORKSPACE_STATE_DELETING
    await sdk.inject_fault(workspace_id, sim.FAULT_UNSTALL)
    deleted = await sdk.wait_workspace_deleted(workspace_id, command_id, timeout=20)
    assert deleted.state == S.WORKSPACE_STATE_DELETED


def test_sync_wait_workspace_deleted(sync_sdk: kibotos.Client) -> None:
    workspace_id = sync_sdk.create_workspace().workspace.workspace_id
    deleting = sync_sdk.delete_workspace(workspace_id, settle=False)
    seen: list[int] = []
    deleted = sync_sdk.wait_workspace_deleted(
        workspace_id, deleting.command.command_id, timeout=20, on_update=lambda w: seen.append(w.state)
    )
    assert deleted.state == S.WORKSPACE_STATE_DELETED and seen[-1] == S.WORKSPACE_STATE_DELETED
    assert deleted.deletion_started


async def test_wait_and_settle_across_a_server_restart(own_server: ServerProcess) -> None:
    async with kibotos.AsyncClient(own_server.address, timeout=5) as client:
        waited_id = (await client.create_workspace()).workspace.workspace_id
        settled_id = (await client.create_workspace()).workspace.workspace_id
        for workspace_id in (waited_id, settled_id):
            await client.inject_fault(workspace_id, sim.FAULT_STALL)
        stop = await client.stop_workspace(waited_id, settle=False)
        assert not kibotos.is_terminal(stop.command)
        seen: list[int] = []
        waiting = asyncio.create_task(
            client.wait_workspace(
                waited_id, stop.command.command_id, timeout=60, on_update=lambda w: seen.append(w.state)
            )
        )
        answers: list[kibotos.CommandResponse] = []
        settling = asyncio.create_task(
            client.stop_workspace(settled_id, settle=kibotos.SettleOptions(timeout=60), on_answer=answers.append)
        )
        await until(lambda: bool(seen) and bool(answers))

        await asyncio.to_thread(own_server.restart)  # the stalled steps are re-driven after the restart

        workspace = await waiting
        stopped = await settling
    assert seen[0] == S.WORKSPACE_STATE_STOPPING
    assert workspace.state == S.WORKSPACE_STATE_STOPPED
    assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED and stopped.command.state == SUCCEEDED
    assert {a.command.command_id for a in answers} == {stopped.command.command_id}


async def test_settle_and_wait_ride_out_the_rate_limit(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory("--rate-limit-rps", "5")
    try:
        async with kibotos.AsyncClient(server.address) as client:
            workspace_id = (await client.create_workspace()).workspace.workspace_id
            limited: list[kibotos.RateLimitedError] = []
            for _ in range(40):  # drain the bucket
                try:
                    await client.get_workspace(workspace_id)
                except kibotos.RateLimitedError as error:
                    limited.append(error)
                    break
            assert limited and limited[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert limited[0].reason == "RATE_LIMITED" and (limited[0].retry_delay or 0) > 0
            # The bucket is empty: settle retries after the delay the server asks for.
            stopped = await client.stop_workspace(workspace_id, settle=kibotos.SettleOptions(timeout=30))
            assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
            for _ in range(12):
                with contextlib.suppress(kibotos.RateLimitedError):
                    await client.get_workspace(workspace_id)
            workspace = await client.wait_workspace(workspace_id, stopped.command.command_id, timeout=30)
            assert workspace.state == S.WORKSPACE_STATE_STOPPED
    finally:
        server.stop()


# -- reads and the rest of the surface ---------------------------------------------------


async def test_reads_lists_volumes_and_labels(sdk: kibotos.AsyncClient) -> None:
    assert "workspace.stop.force" in await sdk.get_capabilities()
    volume = await sdk.create_volume(2)
    spec = wp.WorkspaceSpec(
        labels={"sdk-test": "reads"},
        volumes=[wp.VolumeBinding(volume_id=volume.volume_id, mount_path="/mnt/extra")],
    )
    created = await sdk.create_workspace(spec, expire_time=time.time() + 3600)
    workspace = created.workspace
    assert workspace.expiration.action == wp.EXPIRATION_ACTION_STOP
    listed = [w.workspace_id async for w in sdk.list_workspaces(filter='labels.sdk-test = "reads"', page_size=1)]
    assert workspace.workspace_id in listed
    relabeled = await sdk.set_workspace_labels(workspace.workspace_id, {"sdk-test": "changed"}, {"note": "x"})
    assert dict(relabeled.workspace.labels) == {"sdk-test": "changed"}
    assert (await sdk.get_volume(volume.volume_id)).workspace_id == workspace.workspace_id
    cleared = await sdk.clear_workspace_expiration(workspace.workspace_id)
    assert not cleared.workspace.expiration.HasField("expire_time")
    await sdk.stop_workspace(workspace.workspace_id)
    resized = await sdk.resize_workspace(workspace.workspace_id, vcpus=4)
    assert resized.workspace.spec.resources.vcpus == 4
    cleanup = await sdk.get_workspace_cleanup(workspace.workspace_id)
    assert cleanup.completeness == obs.CLEANUP_COMPLETENESS_COMPLETE
    deleting = await sdk.delete_workspace(workspace.workspace_id)
    await sdk.wait_workspace_deleted(workspace.workspace_id, deleting.command.command_id, timeout=20)
    # Kept on delete (bound with --volume, delete_with_workspace unset): unbound, deletable.
    assert (await sdk.get_volume(volume.volume_id)).workspace_id == ""
    deleted = await sdk.delete_volume(volume.volume_id)
    assert deleted.state == vol.VOLUME_STATE_DELETED


def test_address_comes_from_kibo_server(monkeypatch: pytest.MonkeyPatch, firecracker: ServerProcess) -> None:
    monkeypatch.setenv("KIBO_SERVER", firecracker.address)
    with kibotos.Client() as client:
        assert client.address == firecracker.address
        assert "workspace.stop.force" in client.get_capabilities()
    monkeypatch.delenv("KIBO_SERVER")
    assert kibotos.resolve_address() == "127.0.0.1:50051"


def test_token_goes_in_the_authorization_header() -> None:
    connection = kibotos.Connection.of("127.0.0.1:1", token="secret")
    assert connection.metadata() == (("authorization", "Bearer secret"),)
    assert kibotos.Connection.of("127.0.0.1:1", tls=True, token="secret").metadata() == ()


def test_the_sdk_finds_a_local_servers_token_and_raw_stubs_send_it(
    server_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 11 items 3 and 4: no token given, no $KIBO_TOKEN, the server on a --data-dir of
    its own: the SDK finds the admin token (the server's pointer), for typed and raw calls."""
    monkeypatch.delenv("KIBO_TOKEN", raising=False)
    server = server_factory(data_dir=tmp_path / "data", auth=True)
    try:
        with kibotos.Client(server.address) as client:
            assert client.connection.token == server.admin_token
            assert client.connection.discovery is not None
            assert str(tmp_path / "data" / "admin.token") in client.connection.discovery.source
            workspace_id = client.create_workspace().workspace.workspace_id
            raw = client.workspaces.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=workspace_id))
            assert raw.workspace.workspace_id == workspace_id
            watch = client.workspaces.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
            assert next(iter(watch)).workspace.workspace_id == workspace_id
            watch.cancel()
    finally:
        server.stop()


async def test_the_async_sdk_raw_stubs_send_the_token(
    server_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KIBO_TOKEN", raising=False)
    server = server_factory(auth=True)
    try:
        async with kibotos.AsyncClient(server.address) as client:
            created = await client.create_workspace()
            raw = await client.workspaces.GetWorkspace(
                ws.GetWorkspaceRequest(workspace_id=created.workspace.workspace_id)
            )
            assert raw.workspace.workspace_id == created.workspace.workspace_id
    finally:
        server.stop()


def test_an_unauthenticated_error_says_where_the_sdk_looked(
    server_factory: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = server_factory(auth=True)
    try:
        monkeypatch.delenv("KIBO_TOKEN", raising=False)
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
        with kibotos.Client(server.address) as client, pytest.raises(kibotos.UnauthenticatedError) as caught:
            client.get_capabilities()
        text = str(caught.value)
        assert "$KIBO_TOKEN (not set)" in text and f"127.0.0.1_{server.port} (no pointer)" in text, text
        assert str(tmp_path / "data" / "kibo" / "admin.token") in text
    finally:
        server.stop()


def test_local_token_files_are_read_for_loopback_servers_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kibotos import token_discovery

    monkeypatch.delenv("KIBO_TOKEN", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    (tmp_path / "kibo").mkdir()
    (tmp_path / "kibo" / "admin.token").write_text("local-admin\n")
    assert token_discovery.discover("127.0.0.1:50051").token == "local-admin"
    assert token_discovery.discover("localhost:50051").token == "local-admin"
    remote = token_discovery.discover("10.1.2.3:50051")
    assert remote.token is None and "not a loopback address" in remote.describe()
    # A server listening on every interface is found at 127.0.0.1 too.
    token_file = tmp_path / "other.token"
    token_file.write_text("wildcard\n")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    token_discovery.write_pointer("0.0.0.0:50999", token_file)
    assert token_discovery.discover("127.0.0.1:50999").token == "wildcard"
    monkeypatch.setenv("KIBO_TOKEN", "from-env")
    assert token_discovery.discover("127.0.0.1:50999").token == "from-env"
    assert token_discovery.discover("127.0.0.1:50999", "given").token == "given"
