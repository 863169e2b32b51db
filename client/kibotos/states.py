"""Names and the two predicates waits need: is a command terminal, is a workspace steady."""

from __future__ import annotations

from kibo.ctrl.v1 import command_pb2, workspace_pb2

__all__ = [
    "STEADY_STATES",
    "TERMINAL_COMMAND_STATES",
    "command_state_name",
    "is_steady",
    "is_terminal",
    "state_name",
]

WS = workspace_pb2.WorkspaceState

# States a workspace stays in until someone (or something) acts.
STEADY_STATES = frozenset(
    {WS.WORKSPACE_STATE_AVAILABLE, WS.WORKSPACE_STATE_STOPPED, WS.WORKSPACE_STATE_FAILED, WS.WORKSPACE_STATE_DELETED}
)
TERMINAL_COMMAND_STATES = frozenset({command_pb2.COMMAND_STATE_SUCCEEDED, command_pb2.COMMAND_STATE_FAILED})


def state_name(state: int) -> str:
    """WORKSPACE_STATE_STOPPED -> STOPPED."""
    try:
        return WS.Name(state).removeprefix("WORKSPACE_STATE_")
    except ValueError:
        return str(state)


def command_state_name(state: int) -> str:
    try:
        return command_pb2.CommandState.Name(state).removeprefix("COMMAND_STATE_")
    except ValueError:
        return str(state)


def is_terminal(command: command_pb2.WorkspaceCommand) -> bool:
    """SUCCEEDED or FAILED; PENDING and RUNNING mean the command is still executing."""
    return command.state in TERMINAL_COMMAND_STATES


def is_steady(workspace: workspace_pb2.Workspace) -> bool:
    return workspace.state in STEADY_STATES
