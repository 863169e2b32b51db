"""Seed the store directly, with the server stopped: clone real workspaces (made through the
API) under new IDs, through the server's own store code (SqliteStore, Tx, model records), in
large transactions. Creating 100,000 workspaces through the API would take too long here."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kibo_ctrl.domain.model import Command, Event, Instance, Volume, Workspace
from kibo_ctrl.store.base import Reader, Tx
from kibo_ctrl.store.sqlite import SqliteStore

CHUNK = 5000
_ENCODE = msgspec.json.Encoder()


@dataclass(frozen=True)
class Template:
    """A workspace made through the API, and the IDs of the commands that made it what it is."""

    workspace_id: str
    command_ids: tuple[str, ...]


@dataclass
class _Rows:
    workspace: bytes
    instances: list[bytes]
    volumes: list[bytes]
    commands: list[bytes]
    events: list[bytes]
    ids: list[str]  # IDs to replace in every row: workspace, volumes, commands


def _load(tx: Reader, template: Template) -> _Rows:
    workspace = tx.get_workspace(template.workspace_id)
    if workspace is None:
        raise LookupError(f"template {template.workspace_id} not found")
    instances = tx.list_instances(workspace.id)
    volumes = [v for b in workspace.bindings if (v := tx.get_volume(b.volume_id)) is not None]
    commands = [c for i in template.command_ids if (c := tx.get_command(workspace.tenant, i)) is not None]
    events = tx.list_events(workspace.id, 0, 10_000)
    return _Rows(
        workspace=_ENCODE.encode(workspace),
        instances=[_ENCODE.encode(i) for i in instances],
        volumes=[_ENCODE.encode(v) for v in volumes],
        commands=[_ENCODE.encode(c) for c in commands],
        events=[_ENCODE.encode(e) for e in events],
        ids=[workspace.id, *(v.id for v in volumes), *(c.id for c in commands)],
    )


def _new_id(old: str) -> str:
    if old.startswith("ws-"):
        return f"ws-{uuid.uuid4().hex[:20]}"
    if old.startswith("vol-"):
        return f"vol-{uuid.uuid4().hex[:20]}"
    return f"bench-seed/{uuid.uuid4()}"


def _clone(tx: Tx, rows: _Rows, seq: int) -> None:
    mapping = [(old.encode(), _new_id(old).encode()) for old in rows.ids]

    def renamed(data: bytes) -> bytes:
        for old, new in mapping:
            data = data.replace(old, new)
        return data

    workspace = msgspec.json.decode(renamed(rows.workspace), type=Workspace)
    workspace.seq = seq
    for data in rows.volumes:
        tx.put_volume(msgspec.json.decode(renamed(data), type=Volume))
    for data in rows.commands:
        tx.put_command(msgspec.json.decode(renamed(data), type=Command))
    for data in rows.instances:
        tx.put_instance(msgspec.json.decode(renamed(data), type=Instance))
    tx.put_workspace(workspace)
    for data in rows.events:
        tx.add_event(msgspec.json.decode(renamed(data), type=Event))


async def _seed(path: Path, templates: list[Template], count: int) -> int:
    store = await SqliteStore.open(path)
    try:
        loaded = await store.read(lambda r: [_load(r, t) for t in templates])
        done = 0
        while done < count:
            n = min(CHUNK, count - done)

            def chunk(tx: Tx, n: int = n, start: int = done) -> None:
                seq = tx.next_workspace_seq()
                for i in range(n):
                    _clone(tx, loaded[(start + i) % len(loaded)], seq + i)
                tx.changes = type(tx.changes)()  # nobody listens: keep memory flat

            await store.transact(chunk)
            done += n
        return await store.read(lambda r: r.count_workspaces())
    finally:
        await store.close()


def seed(data_dir: Path, templates: list[Template], count: int) -> tuple[int, float]:
    """Add `count` clones of the templates (round robin); returns (workspaces stored, seconds)."""
    began = time.monotonic()
    total = asyncio.run(_seed(data_dir / "kibo.db", templates, count))
    return total, time.monotonic() - began
