"""Stop a workspace and settle the command (Go: `Settle` in examples/go).

    python examples/python/stop_with_settle.py --server 127.0.0.1:50051 [--workspace ws-...]

Without --workspace, a new workspace is created first, and deleted at the end: an example
leaves nothing behind (a workspace given with --workspace is the caller's, and stays).
"""

from __future__ import annotations

import argparse

import kibotos
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=None, help="HOST:PORT (default: $KIBO_SERVER, else 127.0.0.1:50051)")
    parser.add_argument("--workspace", default=None, help="the workspace to stop (default: create one)")
    args = parser.parse_args()
    settle_options = kibotos.SettleOptions(timeout=60)

    with kibotos.Client(args.server) as client:
        created = None if args.workspace else client.create_workspace().workspace.workspace_id
        workspace_id = args.workspace or created
        try:
            current = client.workspaces.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=workspace_id))
            request = ws.StopWorkspaceRequest(
                metadata=wp.CommandMetadata(command_id=kibotos.new_command_id("example")),
                workspace_id=workspace_id,
                expected_expiration_revision=current.workspace.expiration.revision,
            )
            # Resends the identical request (same command ID) until the stop is terminal.
            stopped = kibotos.settle(lambda: client.workspaces.StopWorkspace(request), settle_options)

            durability = wp.StopDurability.Name(stopped.command.result.durability)
            print(f"{workspace_id} {kibotos.state_name(stopped.workspace.state)} {durability}")
        finally:
            if created is not None:  # what this example made, it deletes
                client.delete_workspace(created)


if __name__ == "__main__":
    main()
