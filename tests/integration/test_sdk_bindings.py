"""The Python SDK's methods for the rest of the API (both clients): volume bind, rebind and
unbind, network policy, data-plane revoke, the instances of a workspace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kibotos
import pytest
from kibo.ctrl.v1 import command_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.server import ServerProcess

SUCCEEDED = command_pb2.COMMAND_STATE_SUCCEEDED


@pytest.fixture
async def sdk(firecracker: ServerProcess) -> AsyncIterator[kibotos.AsyncClient]:
    async with kibotos.AsyncClient(firecracker.address) as client:
        yield client


def _binding(workspace: wp.Workspace, volume_id: str) -> wp.VolumeBinding | None:
    return next((b for b in workspace.spec.volumes if b.volume_id == volume_id), None)


async def test_bind_rebind_unbind_a_volume(sdk: kibotos.AsyncClient) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    volume = await sdk.create_volume(1)
    with pytest.raises(kibotos.ConflictError) as refused:
        await sdk.bind_workspace_volume(workspace_id, volume.volume_id, "/mnt/shared")
    assert refused.value.workspace_state == "AVAILABLE"
    await sdk.stop_workspace(workspace_id)
    bound = await sdk.bind_workspace_volume(workspace_id, volume.volume_id, "/mnt/shared")
    assert bound.command.state == SUCCEEDED
    binding = _binding(bound.workspace, volume.volume_id)
    assert binding is not None and binding.mount_path == "/mnt/shared" and not binding.delete_with_workspace
    assert (await sdk.get_volume(volume.volume_id)).workspace_id == workspace_id
    # Binding it again replaces the binding: a rebind.
    rebound = await sdk.bind_workspace_volume(workspace_id, volume.volume_id, "/mnt/other", delete_with_workspace=True)
    binding = _binding(rebound.workspace, volume.volume_id)
    assert binding is not None and binding.mount_path == "/mnt/other" and binding.delete_with_workspace
    assert sum(b.volume_id == volume.volume_id for b in rebound.workspace.spec.volumes) == 1
    unbound = await sdk.unbind_workspace_volume(workspace_id, volume.volume_id)
    assert _binding(unbound.workspace, volume.volume_id) is None
    assert not (await sdk.get_volume(volume.volume_id)).workspace_id


async def test_network_policy_revoke_and_instances(sdk: kibotos.AsyncClient) -> None:
    workspace_id = (await sdk.create_workspace()).workspace.workspace_id
    (instance,) = await sdk.list_workspace_instances(workspace_id)
    assert instance.phase == obs.INSTANCE_PHASE_RUNNING and instance.holds_execution
    revoked = await sdk.revoke_workspace_data_plane_access(workspace_id)
    assert revoked.command.state == SUCCEEDED
    policy = await sdk.set_workspace_network_policy(workspace_id, wp.NETWORK_EGRESS_ALLOW_LISTED, ["10.0.0.0/8"])
    assert policy.workspace.spec.network_policy.egress == wp.NETWORK_EGRESS_ALLOW_LISTED
    assert list(policy.workspace.spec.network_policy.allowed_cidrs) == ["10.0.0.0/8"]
    with pytest.raises(kibotos.InvalidArgumentError):
        await sdk.set_workspace_network_policy(workspace_id, wp.NETWORK_EGRESS_ALLOW_LISTED, ["not-a-cidr"])
    await sdk.stop_workspace(workspace_id)
    with pytest.raises(kibotos.ConflictError):
        await sdk.revoke_workspace_data_plane_access(workspace_id)


def test_the_blocking_client_has_them_too(firecracker: ServerProcess) -> None:
    with kibotos.Client(firecracker.address) as client:
        workspace_id = client.create_workspace().workspace.workspace_id
        assert len(client.list_workspace_instances(workspace_id)) == 1
        command_id = kibotos.new_command_id("test")
        denied = client.set_workspace_network_policy(workspace_id, wp.NETWORK_EGRESS_DENY_ALL, command_id=command_id)
        assert denied.command.command_id == command_id
        # A resend of the same command ID answers the same command.
        again = client.set_workspace_network_policy(workspace_id, wp.NETWORK_EGRESS_DENY_ALL, command_id=command_id)
        assert again.command.command_id == command_id and again.command.state == SUCCEEDED
