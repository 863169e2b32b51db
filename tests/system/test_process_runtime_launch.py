"""The process runtime's launch edge cases on real sandboxes: a guest that never answers,
no isolation, a control-plane kill -9 during a launch, authentication (split from
test_process_runtime.py, whose helpers it uses)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, S, meta
from tests.server import ServerProcess
from tests.system.test_process_runtime import (
    CONFIRMED,
    FLAGS,
    SMALL,
    DataPlane,
    _require_sandbox,
    cgroups_left,
    command_of,
    create,
    delete,
    processes,
    reap,
    refused,
    supervisor_processes,
    volume_dir,
    wait_until,
)


async def test_a_guest_that_never_answers_fails_the_launch(server_factory: Callable[..., ServerProcess]) -> None:
    _require_sandbox()
    server = server_factory(*FLAGS, "--guest-command", "sh -c 'echo the guest is broken >&2; exit 7'")
    try:
        async with Client.connect(server.address) as client:
            workspace = await client.create(resources=SMALL)
            assert workspace.state == S.WORKSPACE_STATE_FAILED
            assert workspace.failure.stage == "CREATE"
            assert "the guest is broken" in workspace.failure.message
            # Nothing is left running or held: start is allowed (and fails the same way).
            assert not processes(f"{server.data_dir}/instances")
            assert not cgroups_left(server.data_dir)
            started = await client.start(workspace.workspace_id)
            assert started.workspace.state == S.WORKSPACE_STATE_FAILED
            await client.delete(workspace.workspace_id)
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)


async def test_without_isolation_it_says_so_and_still_works(server_factory: Callable[..., ServerProcess]) -> None:
    _require_sandbox()
    flags = [*FLAGS[:2], "--sandbox", "none", *FLAGS[4:]]
    server = server_factory(*flags)
    try:
        assert "NO ISOLATION" in server.log()
        async with Client.connect(server.address) as client:
            capabilities = (await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())).capabilities
            assert {"runtime.process.isolation.none", "runtime.process.unisolated"} <= set(capabilities)
            workspace = await create(client)
            data = DataPlane(client)
            credential = await data.credential(workspace.workspace_id)
            await data.write(credential, "/data/plain.txt", b"no namespaces")
            assert (volume_dir(server, workspace) / "plain.txt").read_bytes() == b"no namespaces"
            code, out, _ = await data.exec(credential, "sh", "-c", 'cat "$KIBO_DATA/plain.txt"')
            assert (code, out) == (0, b"no namespaces")
            stopped = await client.stop(workspace.workspace_id)
            assert (await command_of(client, stopped)).result.durability == CONFIRMED
            assert not processes(f"{server.data_dir}/instances")
            await delete(client, stopped.workspace, server)
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)


async def test_control_plane_kill9_during_a_launch_starts_nothing_twice(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """A guest that takes a second to answer: the control plane dies while it is CREATING."""
    _require_sandbox()
    slow = "sh -c 'sleep 1.5; exec sh /run/kibo/bin/agent'"
    server = server_factory(*FLAGS, "--settle-ms", "0", "--guest-command", slow)
    try:
        async with Client.connect(server.address) as client:
            request = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(resources=SMALL))
            created = (await client.ws.CreateWorkspace(request)).workspace
            assert created.state == S.WORKSPACE_STATE_CREATING
            needle = f"supervisor.py {server.data_dir}/instances/{created.workspace_id}-g1"
            await wait_until(lambda: len(supervisor_processes(needle)) == 1)
            [supervisor] = supervisor_processes(needle)
        server.kill()
        server.start()
        async with Client.connect(server.address) as client:
            available = await client.wait_for(created.workspace_id, S.WORKSPACE_STATE_AVAILABLE)
            assert available.execution_generation == 1
            # The launch was re-driven: it attached to the sandbox that was starting.
            assert supervisor_processes(needle) == [supervisor]
            await delete(client, available, server)
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)


async def test_with_authentication_issuing_needs_an_admin_token(server_factory: Callable[..., ServerProcess]) -> None:
    """Issuing is a control-plane call (token of the workspace's tenant); using needs only the credential."""
    _require_sandbox()
    server = server_factory(*FLAGS, auth=True)
    try:
        token = server.admin_token
        async with Client.connect(server.address, token) as admin, Client.connect(server.address) as anyone:
            workspace = await create(admin)
            request = dp.IssueDataPlaneCredentialRequest(workspace_id=workspace.workspace_id)
            assert await refused(DataPlane(anyone).stub.IssueDataPlaneCredential(request)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
            credential = await DataPlane(admin).credential(workspace.workspace_id)
            assert await DataPlane(anyone).exec(credential, "echo", "hello") == (0, b"hello\n", b"")
            await delete(admin, workspace, server)
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)
