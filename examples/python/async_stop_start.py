"""The asyncio client: stop a workspace, then start it and wait, concurrently-friendly.

    python examples/python/async_stop_start.py --server 127.0.0.1:50051 [--workspace ws-...]

Without --workspace, a new workspace is created first, and deleted at the end: an example
leaves nothing behind (a workspace given with --workspace is the caller's, and stays).
"""

from __future__ import annotations

import argparse
import asyncio

import kibotos


async def run(server: str | None, workspace_id: str | None) -> None:
    async with kibotos.AsyncClient(server) as client:
        created = None if workspace_id else (await client.create_workspace()).workspace.workspace_id
        workspace_id = workspace_id or created
        assert workspace_id is not None
        try:
            stopped = await client.stop_workspace(workspace_id)  # settled: the stop is terminal
            print(f"{workspace_id} {kibotos.state_name(stopped.workspace.state)}")
            started = await client.start_workspace(workspace_id, settle=False)  # send once, then follow
            workspace = await client.wait_workspace(started.workspace, started.command.command_id, timeout=60)
            print(f"{workspace_id} {kibotos.state_name(workspace.state)} {workspace.execution_generation}")
        finally:
            if created is not None:  # what this example made, it deletes
                await client.delete_workspace(created)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=None, help="HOST:PORT (default: $KIBO_SERVER, else 127.0.0.1:50051)")
    parser.add_argument("--workspace", default=None, help="an AVAILABLE workspace (default: create one)")
    args = parser.parse_args()
    asyncio.run(run(args.server, args.workspace))


if __name__ == "__main__":
    main()
