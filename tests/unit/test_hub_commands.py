"""Waiting for a command (engine/hub.py): a waiter is told when the command is published
terminal, with the workspace of the same commit; one that starts waiting just after (its
answer and the engine's next commit raced) is told at once, without the workspace."""

from __future__ import annotations

import pytest
from kibo_ctrl.domain.model import Command, CommandKind, CommandState, Resources, Workspace, WorkspaceState
from kibo_ctrl.engine import hub as hub_module
from kibo_ctrl.engine.hub import Hub
from kibo_ctrl.store.base import Changes


def _command(number: int, state: CommandState) -> Command:
    return Command(f"c-{number}", f"ws-{number}", CommandKind.CREATE, "", state, 1.0, 2.0)


def _workspace(number: int) -> Workspace:
    return Workspace(f"ws-{number}", number, WorkspaceState.AVAILABLE, Resources(1, 512, 1), [], 1.0, 2.0, "local")


def _published(hub: Hub, command: Command, workspace: Workspace | None = None) -> None:
    changes = Changes()
    changes.commands[command.key] = command
    if workspace is not None:
        changes.workspaces[workspace.id] = workspace
    hub.publish(changes)


async def test_a_waiter_gets_the_command_and_the_workspace_of_its_commit() -> None:
    hub = Hub()
    done = hub.command_done(_command(1, CommandState.PENDING).key)
    _published(hub, _command(1, CommandState.RUNNING))
    assert not done.done()
    workspace = _workspace(1)
    _published(hub, _command(1, CommandState.SUCCEEDED), workspace)
    assert done.done()
    assert (done.result().command.state, done.result().workspace) == (CommandState.SUCCEEDED, workspace)


async def test_a_waiter_after_the_publication_is_told_at_once_and_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hub_module, "RECENTLY_FINISHED", 3)
    hub = Hub()
    for number in range(5):
        _published(hub, _command(number, CommandState.SUCCEEDED), _workspace(number))
    late = hub.command_done(_command(4, CommandState.PENDING).key)
    assert late.done() and late.result().command.id == "c-4" and late.result().workspace is None
    # The oldest fell out: waiting for it waits (the caller's read of the store covers that).
    assert not hub.command_done(_command(0, CommandState.PENDING).key).done()
