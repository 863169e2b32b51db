"""Delete a workspace and wait until it is DELETED (Go: `WaitWorkspaceDeleted` in examples/go).

    python examples/python/delete_and_wait.py --server 127.0.0.1:50051 [--workspace ws-...]

Without --workspace, a new workspace is created first (and deleted even if the example
fails before its own delete: an example leaves nothing behind).
"""

from __future__ import annotations

import argparse

import kibotos
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=None, help="HOST:PORT (default: $KIBO_SERVER, else 127.0.0.1:50051)")
    parser.add_argument("--workspace", default=None, help="the workspace to delete (default: create one)")
    args = parser.parse_args()
    settle_options = kibotos.SettleOptions(timeout=3600)

    with kibotos.Client(args.server) as client:
        created = None if args.workspace else client.create_workspace().workspace.workspace_id
        workspace_id = args.workspace or created
        try:
            workspace = client.get_workspace(workspace_id)

            command_id = kibotos.new_command_id("example")
            request = ws.DeleteWorkspaceRequest(
                metadata=wp.CommandMetadata(command_id=command_id),
                workspace_id=workspace_id,
                expected_expiration_revision=workspace.expiration.revision,
            )
            kibotos.settle(lambda: client.workspaces.DeleteWorkspace(request), settle_options)
            deleted = client.wait_workspace_deleted(workspace_id, command_id, timeout=3600)
            print(f"{workspace_id} {kibotos.state_name(deleted.state)}")
        finally:
            # What this example made is gone whatever happened above (a delete of a deleted
            # workspace is refused, so only when it is not DELETED yet).
            if created is not None and client.get_workspace(created).state != wp.WORKSPACE_STATE_DELETED:
                client.delete_workspace(created)


if __name__ == "__main__":
    main()
