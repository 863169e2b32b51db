"""`kibo workspace bind-volume|rebind-volume|unbind-volume|network-policy|revoke-access|instances`
against a real server (split from test_cli.py, whose helpers it uses)."""

from __future__ import annotations

import json

import kibotos
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo_cli.exit_codes import ExitCode

from tests.server import ServerProcess
from tests.system.test_cli import kibo, new_workspace, ok

S = wp.WorkspaceState


# -- bind-volume, rebind-volume, unbind-volume, network-policy, revoke-access, instances ----


def test_bind_rebind_unbind_volume(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    volume_id = ok(kibo(firecracker, "volume", "create", "-q")).stdout.strip()
    # Bindings change only while STOPPED: exit 4 with the state it met.
    refused = kibo(firecracker, "workspace", "bind-volume", workspace_id, volume_id, "--mount-path", "/mnt/shared")
    assert refused.exit_code == ExitCode.CONFLICT, refused.output
    assert "AVAILABLE" in refused.stderr
    ok(kibo(firecracker, "workspace", "stop", workspace_id))
    bound = ok(
        kibo(
            firecracker,
            "workspace",
            "bind-volume",
            workspace_id,
            volume_id,
            "--mount-path",
            "/mnt/shared",
            "-o",
            "json",
        )
    )
    document = json.loads(bound.stdout)
    assert document["command"]["state"] == "COMMAND_STATE_SUCCEEDED"
    (binding,) = [b for b in document["workspace"]["spec"]["volumes"] if b["volumeId"] == volume_id]
    assert binding["mountPath"] == "/mnt/shared" and not binding.get("deleteWithWorkspace", False)
    # rebind keeps what is not given.
    rebound = ok(kibo(firecracker, "workspace", "rebind-volume", workspace_id, volume_id, "--delete-with-workspace"))
    assert f"{volume_id} at /mnt/shared, deleted with the workspace" in rebound.stdout
    moved = ok(kibo(firecracker, "workspace", "rebind-volume", workspace_id, volume_id, "--mount-path", "/mnt/moved"))
    assert f"{volume_id} at /mnt/moved, deleted with the workspace" in moved.stdout
    nothing = kibo(firecracker, "workspace", "rebind-volume", workspace_id, volume_id)
    assert nothing.exit_code == ExitCode.USAGE, nothing.output
    unbound_volume = ok(kibo(firecracker, "volume", "create", "-q")).stdout.strip()
    not_bound = kibo(firecracker, "workspace", "rebind-volume", workspace_id, unbound_volume, "--mount-path", "/a")
    assert not_bound.exit_code == ExitCode.NOT_FOUND and "bind-volume" in not_bound.stderr, not_bound.output
    ok(kibo(firecracker, "workspace", "unbind-volume", workspace_id, volume_id))
    with kibotos.Client(firecracker.address) as client:
        assert all(b.volume_id != volume_id for b in client.get_workspace(workspace_id).spec.volumes)
        assert not client.get_volume(volume_id).workspace_id  # the volume stays, unbound


def test_bind_volume_with_delete_with_workspace(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    volume_id = ok(kibo(firecracker, "volume", "create", "-q")).stdout.strip()
    ok(kibo(firecracker, "workspace", "stop", workspace_id))
    bound = ok(
        kibo(
            firecracker,
            "workspace",
            "bind-volume",
            workspace_id,
            volume_id,
            "--mount-path",
            "/mnt/scratch",
            "--delete-with-workspace",
        )
    )
    assert "deleted with the workspace" in bound.stdout
    with kibotos.Client(firecracker.address) as client:
        (binding,) = [b for b in client.get_workspace(workspace_id).spec.volumes if b.volume_id == volume_id]
        assert binding.delete_with_workspace


def test_network_policy(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    shown = ok(kibo(firecracker, "workspace", "network-policy", workspace_id, "-o", "json"))
    assert json.loads(shown.stdout).get("egress", "NETWORK_EGRESS_UNSPECIFIED") != "NETWORK_EGRESS_DENY_ALL"
    listed = ok(kibo(firecracker, "workspace", "network-policy", workspace_id, "--allow", "10.0.0.0/8"))
    assert "ALLOW_LISTED (10.0.0.0/8)" in listed.stdout
    denied = ok(kibo(firecracker, "workspace", "network-policy", workspace_id, "--egress", "deny-all", "-o", "json"))
    assert json.loads(denied.stdout)["workspace"]["spec"]["networkPolicy"]["egress"] == "NETWORK_EGRESS_DENY_ALL"
    usage = kibo(
        firecracker, "workspace", "network-policy", workspace_id, "--egress", "deny-all", "--allow", "1.2.3.0/24"
    )
    assert usage.exit_code == ExitCode.USAGE, usage.output
    bad = kibo(firecracker, "workspace", "network-policy", workspace_id, "--allow", "not-a-cidr")
    assert bad.exit_code == ExitCode.INVALID_ARGUMENT, bad.output


def test_revoke_access_and_instances(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    listed = ok(kibo(firecracker, "workspace", "instances", workspace_id, "-o", "json"))
    (instance,) = json.loads(listed.stdout)["instances"]
    assert instance["phase"] == "INSTANCE_PHASE_RUNNING" and instance["holdsExecution"]
    assert instance["instanceId"] in ok(kibo(firecracker, "workspace", "instances", workspace_id)).stdout
    revoked = ok(kibo(firecracker, "workspace", "revoke-access", workspace_id, "-o", "json"))
    assert json.loads(revoked.stdout)["command"]["state"] == "COMMAND_STATE_SUCCEEDED"
    ok(kibo(firecracker, "workspace", "stop", workspace_id))
    refused = kibo(firecracker, "workspace", "revoke-access", workspace_id)
    assert refused.exit_code == ExitCode.CONFLICT, refused.output
    missing = kibo(firecracker, "workspace", "instances", "ws-doesnotexist")
    assert missing.exit_code == ExitCode.NOT_FOUND, missing.output
