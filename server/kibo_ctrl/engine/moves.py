"""Moving a STOPPED workspace's disks to another node (kibo.ctrl.v1.WorkspaceService
MoveWorkspace, an operator's command; `kibo node drain --move-stopped` starts one per
workspace).

State in the store, work on the leader. `begin` records the MOVE command as the
workspace's active one (RUNNING: no start, no rebinding meanwhile; a delete cancels it).
The leader's `Mover` copies each file of it (the layer, then the volumes) from the source
node to the target over the node link, block by block without holes, resuming a file
where the target's synced copy ends; the target checks each file against the source's
digest and puts it in place; then one transaction switches the workspace and its volumes
to the target and ends the command, and only then is the source's copy deleted. A crash of
either node or of the control plane at any point resumes from what the target has synced;
the source keeps its copy until the switch is committed."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from ..domain import rules
from ..domain.errors import Conflict, NotFound, StoreError
from ..domain.model import Command, CommandError, CommandKind, CommandState, ErrorCode, StaleCopy, Volume, Workspace
from ..domain.moves import MOVE_CAPABILITY, MoveRefused, NodeUnreachable, StoredFile
from ..domain.rules import DRAIN_MOVE_PREFIX
from ..store.base import Changes, Reader, Store, Tx
from . import steps
from .hub import Wakeup
from .steps import save

log = logging.getLogger("kibo.moves")

# Blocks per WriteStorage call (the node takes messages of up to 4 MiB).
BLOCKS_PER_WRITE = 3
# How often a running move's progress is written to its command.
PROGRESS_EVERY_S = 1.0
# After a failed attempt (a node unreachable), the next one is this much later, doubling.
RETRY_S = (1.0, 30.0)
# A move whose copies come out different this many times in a row fails.
MAX_MISMATCHES = 3


class StorageLink(Protocol):
    """One node's disks, as the mover asks them (transport/node_storage_client.py)."""

    async def list_files(self, workspace_id: str, volume_ids: Sequence[str]) -> list[StoredFile]: ...
    def read(self, workspace_id: str, name: str, offset: int) -> AsyncIterator[tuple[int, bytes]]: ...
    async def received(self, workspace_id: str, file: StoredFile) -> int: ...
    async def write(self, workspace_id: str, file: StoredFile, blocks: Sequence[tuple[int, bytes]]) -> int: ...
    async def finish(self, workspace_id: str, files: Sequence[StoredFile]) -> None: ...
    async def drop(self, workspace_id: str, volume_ids: Sequence[str], received_only: bool) -> None: ...


Links = Callable[[str], StorageLink | None]


def _volumes(tx: Reader, workspace: Workspace) -> list[Volume]:
    found = (tx.get_volume(b.volume_id) for b in workspace.bindings)
    return [v for v in found if v is not None]


def begin(tx: Tx, workspace: Workspace, command_id: str, fingerprint: str, target: str) -> Command:
    """Record the move (the rules were checked). A workspace with nothing on a disk yet, or
    already there, is pinned to the target at once."""
    node = tx.get_node(target)
    if node is None:
        raise NotFound(f"no node {target}", field="target_node_id")
    source = workspace.storage_node
    volumes = _volumes(tx, workspace)
    if source is None or source == target:
        workspace.storage_node = target
        for volume in volumes:
            if volume.storage_node in (None, source):
                volume.storage_node = target
                tx.put_volume(volume)
        message = f"its disks are on node {target} already" if source else f"its disks will be made on node {target}"
        command = steps.immediate_command(tx, workspace, command_id, CommandKind.MOVE, fingerprint, message)
        command.target_node = target
        tx.put_command(command)
        save(tx, workspace, None)
        return command
    if node.silent or node.cordoned:
        why = "silent (its lease ran out)" if node.silent else "cordoned"
        raise Conflict(f"node {target} is {why}: it takes no disks", field="target_node_id")
    for where in (source, target):
        record = tx.get_node(where)
        if record is None or MOVE_CAPABILITY not in record.capabilities:
            raise Conflict(
                f"node {where} cannot move disks (it does not declare {MOVE_CAPABILITY}: its layers and "
                "volumes are not images, or it is a simulated node of another process)",
                field="target_node_id",
            )
    for volume in volumes:
        if volume.storage_node not in (None, source):
            raise Conflict(f"volume {volume.id} is on node {volume.storage_node}, not with the workspace on {source}")
    command = steps.new_command(tx, workspace, command_id, CommandKind.MOVE, fingerprint)
    command.state = CommandState.RUNNING
    command.target_node = target
    command.detail = f"to copy from node {source}"
    tx.put_command(command)
    save(tx, workspace, None, command_id=command_id)
    return command


class Mover:
    """The leader's loop: one task per workspace whose MOVE command runs."""

    def __init__(self, store: Store, links: Links) -> None:
        self._store = store
        self._links = links
        self._wakeup = Wakeup()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._recheck: set[str] = set()

    def on_changes(self, changes: Changes) -> None:
        moving = frozenset(
            w.id for w in changes.workspaces.values() if w.active_kind is CommandKind.MOVE or w.stale_copies
        )
        if moving:
            self._wakeup.set(moving)

    async def run(self) -> None:
        try:
            # A new leader: the moves that were running (maybe half copied) go on.
            # And the copies moves left on other nodes, still to delete.
            stopped = await self._store.read(lambda r: r.stopped_workspaces() + r.storage_pending())
            ids = frozenset(w.id for w in stopped if w.active_kind is CommandKind.MOVE or w.stale_copies)
            while True:
                for workspace_id in ids:
                    task = self._tasks.get(workspace_id)
                    if task is None or task.done():
                        self._tasks[workspace_id] = asyncio.create_task(
                            self._move(workspace_id), name=f"move {workspace_id}"
                        )
                    elif workspace_id not in self._recheck:
                        # It may have read "nothing to do" before this change: once it ends,
                        # this workspace is looked at again.
                        self._recheck.add(workspace_id)
                        task.add_done_callback(functools.partial(self._look_again, workspace_id))
                ids = await self._wakeup.wait()
        finally:
            for task in self._tasks.values():
                task.cancel()
            for task in self._tasks.values():
                with contextlib.suppress(BaseException):
                    await task

    def _look_again(self, workspace_id: str, _: object = None) -> None:
        self._recheck.discard(workspace_id)
        self._wakeup.set(frozenset({workspace_id}))

    async def _state(self, workspace_id: str) -> tuple[Workspace, Command | None, list[str]] | None:
        """The workspace, its running MOVE (None: only stale copies to delete), its volumes."""

        def read(reader: Reader) -> tuple[Workspace, Command | None, list[str]] | None:
            workspace = reader.get_workspace(workspace_id)
            if workspace is None:
                return None
            command = None
            if workspace.active_kind is CommandKind.MOVE and workspace.active_command is not None:
                command = reader.get_command(workspace.tenant, workspace.active_command)
                command = None if command is None or command.terminal else command
            if command is None and not workspace.stale_copies:
                return None
            return workspace, command, [b.volume_id for b in workspace.bindings]

        return await self._store.read(read)

    async def _move(self, workspace_id: str) -> None:
        delay, mismatches = RETRY_S[0], 0
        while True:
            try:
                state = await self._state(workspace_id)
                if state is None:
                    return
                workspace, command, volume_ids = state
                try:
                    target = command.target_node if command is not None else None
                    gone = await self._drop_stale(workspace, target)
                    if command is None:
                        if gone:
                            continue  # read again: a move may have started meanwhile
                        raise NodeUnreachable("a node that holds a stale copy")
                    await self._attempt(workspace, command, volume_ids)
                    delay = RETRY_S[0]
                    continue  # the source's copy is stale now: deleted next
                except NodeUnreachable as waiting:
                    if command is not None:
                        await self._progress(workspace_id, command.id, None, None, f"waiting: {waiting}")
                except MoveRefused as refused:
                    assert command is not None
                    if "arrived different" in str(refused) and mismatches + 1 < MAX_MISMATCHES:
                        mismatches += 1
                        continue
                    await self._store.transact(self._fail, workspace_id, command.id, str(refused))
                    log.warning("moving %s failed: %s", workspace_id, refused)
                    continue  # what its target received is stale now: deleted next
            except StoreError as error:
                # The store took no step now (a full disk, a database away): the move waits
                # and reads where it is again (this task ending left it RUNNING for good).
                log.warning("moving %s: the store failed (%s): trying again", workspace_id, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_S[1])

    async def _attempt(self, workspace: Workspace, command: Command, volume_ids: list[str]) -> None:
        source_id, target_id = workspace.storage_node or "", command.target_node
        source, target = self._links(source_id), self._links(target_id)
        for node, link in ((source_id, source), (target_id, target)):
            if link is None:
                raise NodeUnreachable(f"node {node} has not declared its data plane (not joined now?)")
        assert source is not None and target is not None
        files = await source.list_files(workspace.id, volume_ids)
        total = sum(f.data_bytes for f in files)
        done = 0
        for file in files:
            copied = await self._copy(source, target, workspace, command.id, file, done, total)
            done += copied
        await self._progress(workspace.id, command.id, total, total, f"checking the copy on node {target_id}")
        await target.finish(workspace.id, files)
        # The switch records the source's copy as stale (a cancel meanwhile: the target's),
        # and the next round deletes it, however long that node is away and across crashes.
        if await self._store.transact(self._switch, workspace.id, command.id, source_id, target_id):
            log.info("moved %s to node %s (%d MiB of data)", workspace.id, target_id, total >> 20)

    async def _drop_stale(self, workspace: Workspace, target: str | None) -> bool:
        """Delete the copies moves left of the workspace on other nodes, each forgotten once
        deleted; True when none is left. One on `target` (where a move copies to now) must
        go first: NodeUnreachable while it cannot."""
        left = False
        for copy in list(workspace.stale_copies):
            link = self._links(copy.node) if copy.node != workspace.storage_node else None
            if link is not None:
                try:
                    await link.drop(workspace.id, copy.volume_ids, received_only=False)
                except (MoveRefused, NodeUnreachable) as error:
                    log.warning("deleting the stale copy of %s on node %s: %s (later)", workspace.id, copy.node, error)
                    if copy.node == target:
                        raise NodeUnreachable(f"node {copy.node} still holds an old copy: {error}") from None
                    left = True
                    continue
            elif copy.node != workspace.storage_node:
                left = True
                continue
            await self._store.transact(self._forget_stale, workspace.id, copy)
        return not left

    @staticmethod
    def _forget_stale(tx: Tx, workspace_id: str, copy: StaleCopy) -> None:
        workspace = tx.get_workspace(workspace_id)
        if workspace is not None and copy in workspace.stale_copies:
            workspace.stale_copies.remove(copy)
            save(tx, workspace, None)

    async def _copy(
        self,
        source: StorageLink,
        target: StorageLink,
        workspace: Workspace,
        command_id: str,
        file: StoredFile,
        before: int,
        total: int,
    ) -> int:
        """One file, from where the target's synced copy ends; the data bytes it counts."""
        start = await target.received(workspace.id, file)
        if start >= file.size:
            return file.data_bytes
        detail = f"copying {file.name} to node {getattr(target, 'node_id', '')}"
        sent = min(start, file.data_bytes)  # an estimate for a resumed file
        # The loop's clock: monotonic here, virtual in the simulation (a replay writes the same).
        clock = asyncio.get_running_loop().time
        last = clock()
        batch: list[tuple[int, bytes]] = []
        pending: asyncio.Task[int] | None = None
        await self._progress(workspace.id, command_id, before + sent, total, detail)
        blocks = source.read(workspace.id, file.name, start)
        try:
            async for offset, data in blocks:
                batch.append((offset, data))
                sent += len(data)
                if len(batch) >= BLOCKS_PER_WRITE:
                    # One write in flight while the next blocks are read.
                    if pending is not None:
                        await pending
                    pending = asyncio.create_task(target.write(workspace.id, file, batch))
                    batch = []
                if clock() - last >= PROGRESS_EVERY_S:
                    last = clock()
                    await self._progress(workspace.id, command_id, before + sent, total, detail)
            if pending is not None:
                await pending
                pending = None
            batch.append((file.size, b""))
            await target.write(workspace.id, file, batch)
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
        return file.data_bytes

    async def _progress(
        self, workspace_id: str, command_id: str, done: int | None, total: int | None, detail: str
    ) -> None:
        def write(tx: Tx) -> None:
            workspace = tx.get_workspace(workspace_id)
            if workspace is None:
                return
            command = tx.get_command(workspace.tenant, command_id)
            if command is None or command.terminal:
                return
            if done is not None:
                command.done_bytes = done
            if total is not None:
                command.total_bytes = total
            command.detail = detail[:300]
            command.update_time = tx.now
            tx.put_command(command)

        with contextlib.suppress(Exception):
            await self._store.transact(write)

    @staticmethod
    def _switch(tx: Tx, workspace_id: str, command_id: str, source: str, target: str) -> bool:
        """The target holds a checked copy: the workspace and its volumes are on it from now."""
        workspace = tx.get_workspace(workspace_id)
        if workspace is None:
            return False
        if workspace.active_command != command_id or workspace.deleted:
            # Cancelled meanwhile (a delete, which recorded the target's copy as stale too).
            steps.leave_stale_copy(workspace, target)
            save(tx, workspace, None)
            return False
        workspace.storage_node = target
        steps.leave_stale_copy(workspace, source)
        for volume in _volumes(tx, workspace):
            if volume.storage_node in (None, source):
                volume.storage_node = target
                tx.put_volume(volume)
        command = tx.get_command(workspace.tenant, command_id)
        if command is not None:
            command.done_bytes = command.total_bytes
            command.detail = f"on node {target}"
            tx.put_command(command)
        steps.finish_command(tx, workspace)
        save(tx, workspace, None, command_id=command_id)
        return True

    @staticmethod
    def _fail(tx: Tx, workspace_id: str, command_id: str, message: str) -> None:
        workspace = tx.get_workspace(workspace_id)
        if workspace is None or workspace.active_command != command_id:
            return
        command = tx.get_command(workspace.tenant, command_id)
        if command is not None:
            # What its target received goes.
            steps.leave_stale_copy(workspace, command.target_node)
        steps.finish_command(tx, workspace, error=CommandError(ErrorCode.FAILED_PRECONDITION, message[:500]))
        save(tx, workspace, None, command_id=command_id)


def drain(tx: Tx, node_id: str, fingerprint: str) -> tuple[list[Command], list[str]]:
    """An operator's drain that moves: a MOVE for each STOPPED workspace whose disks are on
    the node (and no command runs), each to the ready node that can take disks (storage.move)
    with the most free disk; and the ones that could not start, with why. (A scan of the STOPPED rows.)"""
    targets = sorted(
        (
            n
            for n in tx.list_nodes()
            if n.id != node_id and n.ready and MOVE_CAPABILITY in n.capabilities and not n.disk.pressure
        ),
        key=lambda n: n.disk.free_bytes - n.disk.reserve_bytes,
        reverse=True,
    )
    moving: list[Command] = []
    unmoved: list[str] = []
    for workspace in tx.stopped_workspaces():
        if workspace.storage_node != node_id or workspace.deleted:
            continue
        if workspace.active_command is not None:
            unmoved.append(
                f"{workspace.id}: a {workspace.active_kind.name if workspace.active_kind else ''} command runs"
            )
            continue
        if not targets:
            unmoved.append(f"{workspace.id}: no ready node that can take disks (storage.move) with room to move it to")
            continue
        command_id = f"{DRAIN_MOVE_PREFIX}{node_id}/{uuid.uuid4().hex[:12]}"
        try:
            rules.check(CommandKind.MOVE, steps.rule_facts(workspace))
            moving.append(begin(tx, workspace, command_id, fingerprint, targets[0].id))
        except (Conflict, NotFound) as refused:
            unmoved.append(f"{workspace.id}: {refused.message}")
    return moving, unmoved
