"""Recover a FAILED workspace, as the lifecycle page says: (1) force stop; (2) start, also
when step 1 was rejected; (3) if both are rejected, read the workspace again and act on
its state. No response field says whether it "holds execution": the order handles both.

    python examples/python/recover_from_failed.py --server 127.0.0.1:50051 --workspace ws-...
"""

from __future__ import annotations

import argparse
import sys

import kibotos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=None, help="HOST:PORT (default: $KIBO_SERVER, else 127.0.0.1:50051)")
    parser.add_argument("--workspace", required=True, help="the FAILED workspace")
    args = parser.parse_args()
    workspace_id = args.workspace
    settle_options = kibotos.SettleOptions(timeout=600)

    with kibotos.Client(args.server, settle_options=settle_options) as client:
        # 1. Force stop: accepted when the workspace still holds execution.
        try:
            stopped = client.stop_workspace(workspace_id, force=True, command_id=kibotos.new_command_id("example"))
            print(f"force stop: {kibotos.state_name(stopped.workspace.state)}")
            force_rejected = False
        except kibotos.ConflictError as error:
            print(f"force stop rejected: {error.hint or error.message}")
            force_rejected = True

        # 2. Start, whether or not step 1 was rejected.
        try:
            started = client.start_workspace(workspace_id, command_id=kibotos.new_command_id("example"))
            workspace = client.wait_workspace(started.workspace, started.command.command_id, timeout=600)
            print(f"start: {kibotos.state_name(workspace.state)}")
            return 0
        except kibotos.ConflictError as error:
            print(f"start rejected: {error.hint or error.message}")
            if not force_rejected:
                raise

        # 3. Both rejected: read the workspace again and act on its state.
        workspace = client.get_workspace(workspace_id)
        print(f"both rejected; the workspace is {kibotos.state_name(workspace.state)}: act on that state")
        return 1


if __name__ == "__main__":
    sys.exit(main())
