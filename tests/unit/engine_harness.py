"""The engine in process on a real SQLite store in a temp dir: commands run through their
registry entries (api/commands.py) and reports through controller.apply, in milliseconds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.api import commands
from kibo_ctrl.domain.model import Command, Workspace
from kibo_ctrl.engine.service import Service, Settings
from kibo_ctrl.store.sqlite import SqliteStore

COMMANDS = {entry.rpc: entry for entry in commands.WORKSPACE_COMMANDS}
VOLUME_COMMANDS = {entry.rpc: entry for entry in commands.VOLUME_COMMANDS}


class Engine:
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.service = Service(Settings())

    async def command(self, rpc: str, message: Any, tenant: str = "default") -> tuple[Workspace, Command]:
        """What Api.workspace_command does, minus the role check and the settle wait."""
        entry = COMMANDS[rpc]
        request = replace(entry.parse(message), tenant=tenant)
        return await self.store.transact(self.service.execute, entry.handle, request)

    async def create(self, command_id: str = "create-1") -> tuple[Workspace, Command]:
        message = ws.CreateWorkspaceRequest()
        message.metadata.command_id = command_id
        return await self.command("CreateWorkspace", message)

    async def workspace(self, workspace_id: str) -> Workspace:
        found = await self.store.read(lambda r: r.get_workspace(workspace_id))
        assert found is not None
        return found

    async def command_record(self, command: Command) -> Command:
        found = await self.store.read(lambda r: r.get_command(command.tenant, command.id))
        assert found is not None
        return found


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    store = await SqliteStore.open(tmp_path / "kibo.db")
    try:
        yield Engine(store)
    finally:
        await store.close()
