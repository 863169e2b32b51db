"""Start a stopped workspace and wait for it (Go: `WaitWorkspace` in examples/go).

    python examples/python/start_and_wait.py --server 127.0.0.1:50051 [--workspace ws-...]

Without --workspace, a new workspace is created and stopped first, and deleted at the end: an
example leaves nothing behind (a workspace given with --workspace is the caller's, and stays).
"""

from __future__ import annotations

import argparse

import kibotos
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=None, help="HOST:PORT (default: $KIBO_SERVER, else 127.0.0.1:50051)")
    parser.add_argument("--workspace", default=None, help="a STOPPED workspace (default: create and stop one)")
    args = parser.parse_args()

    with kibotos.Client(args.server) as client:
        created = None if args.workspace else client.create_workspace().workspace.workspace_id
        try:
            if created is None:
                stopped = client.get_workspace(args.workspace)
            else:
                stopped = client.stop_workspace(created).workspace

            command_id = kibotos.new_command_id("example")
            started = client.workspaces.StartWorkspace(
                ws.StartWorkspaceRequest(
                    metadata=wp.CommandMetadata(command_id=command_id),
                    workspace_id=stopped.workspace_id,
                    expected_expiration_revision=stopped.expiration.revision,
                )
            )
            # Follows WatchWorkspace until the start is terminal and the workspace steady.
            workspace = client.wait_workspace(started.workspace, command_id, timeout=60)
            print(f"{workspace.workspace_id} {kibotos.state_name(workspace.state)} {workspace.execution_generation}")
        finally:
            if created is not None:  # what this example made, it deletes
                client.delete_workspace(created)


if __name__ == "__main__":
    main()
