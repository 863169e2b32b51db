"""Wakes whoever cares about a commit: watchers of a workspace, callers waiting for a
command to finish, and the engine's loops. A wake-up is a hint; readers re-read the
store, so a missed or duplicated one is harmless."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

from ..domain.model import Command, Event, Workspace
from ..store.base import Changes

WATCH_QUEUE = 1024
# Commands last published terminal, remembered: a caller that starts waiting for one just
# after its publication (its create's answer and the engine's next commit raced) finds it.
RECENTLY_FINISHED = 4096


class Signal(Enum):
    # The watcher fell behind: re-read the workspace from the store.
    RESYNC = "resync"
    # The server is shutting down: end the stream.
    CLOSED = "closed"


@dataclass(frozen=True)
class Finished:
    """A command published in a terminal state, and its workspace as the same commit left it
    (None when that commit did not change the workspace)."""

    command: Command
    workspace: Workspace | None


class Hub:
    def __init__(self) -> None:
        self._watchers: dict[str, set[asyncio.Queue[Workspace | Signal]]] = defaultdict(set)
        self._waiters: dict[str, list[asyncio.Future[Finished]]] = defaultdict(list)
        self._listeners: list[Callable[[Changes], None]] = []
        self._finished: OrderedDict[str, Finished] = OrderedDict()
        # Fleet-wide event watchers (WatchEvents), by tenant (None: every tenant's events).
        self._event_watchers: dict[str | None, set[asyncio.Queue[list[Event] | Signal]]] = defaultdict(set)
        self._closed = False

    def close(self) -> None:
        """Tell every watcher the server is shutting down, and every later one at once."""
        self._closed = True
        for watchers in self._watchers.values():
            for watcher in watchers:
                _drain(watcher)
                watcher.put_nowait(Signal.CLOSED)
        for event_watchers in self._event_watchers.values():
            for event_watcher in event_watchers:
                _drain(event_watcher)
                event_watcher.put_nowait(Signal.CLOSED)

    def listen(self, listener: Callable[[Changes], None]) -> None:
        self._listeners.append(listener)

    def publish(self, changes: Changes) -> None:
        for snapshot in changes.workspace_history:
            for watcher in self._watchers.get(snapshot.id, ()):
                try:
                    watcher.put_nowait(snapshot)
                except asyncio.QueueFull:
                    # Too slow a reader: tell it to resynchronise from the store.
                    _drain(watcher)
                    watcher.put_nowait(Signal.RESYNC)
        if changes.events and self._event_watchers:
            self._publish_events(changes.events)
        for command in changes.commands.values():
            if command.terminal:
                finished = Finished(command, changes.workspaces.get(command.workspace_id))
                # Without its workspace (records may be large): a late waiter reads that.
                self._finished[command.key] = Finished(command, None)
                self._finished.move_to_end(command.key)
                if len(self._finished) > RECENTLY_FINISHED:
                    self._finished.popitem(last=False)
                for waiter in self._waiters.pop(command.key, ()):
                    if not waiter.done():
                        waiter.set_result(finished)
        for listener in self._listeners:
            listener(changes)

    @contextlib.contextmanager
    def watch(self, workspace_id: str) -> Iterator[asyncio.Queue[Workspace | Signal]]:
        """Snapshots of each stored change of the workspace, or a Signal."""
        queue: asyncio.Queue[Workspace | Signal] = asyncio.Queue(WATCH_QUEUE)
        if self._closed:
            # A watch that starts during the shutdown (a client's queued stream, sent when an
            # earlier one ended) would wait for a change that never comes, and hold the HTTP
            # listener's shutdown with it: hypercorn waited on such streams past 30 s.
            queue.put_nowait(Signal.CLOSED)
        self._watchers[workspace_id].add(queue)
        try:
            yield queue
        finally:
            watchers = self._watchers.get(workspace_id)
            if watchers is not None:
                watchers.discard(queue)
                if not watchers:
                    del self._watchers[workspace_id]

    def _publish_events(self, events: list[Event]) -> None:
        """Each commit's events, in sequence order (the store publishes commits in commit
        order, which is sequence order), to the watchers of their tenant and of every tenant."""
        by_tenant: dict[str, list[Event]] = defaultdict(list)
        for event in events:
            by_tenant[event.tenant].append(event)
        for tenant, watchers in self._event_watchers.items():
            batch = events if tenant is None else by_tenant.get(tenant)
            if not batch:
                continue
            for watcher in watchers:
                try:
                    watcher.put_nowait(batch)
                except asyncio.QueueFull:
                    # Too slow a reader: it reads on from the store, after what it has sent.
                    _drain(watcher)
                    watcher.put_nowait(Signal.RESYNC)

    @contextlib.contextmanager
    def watch_events(self, tenant: str | None) -> Iterator[asyncio.Queue[list[Event] | Signal]]:
        """Each commit's events of `tenant` (None: of every tenant), or a Signal."""
        queue: asyncio.Queue[list[Event] | Signal] = asyncio.Queue(WATCH_QUEUE)
        if self._closed:  # started during the shutdown: ends at once, as in watch()
            queue.put_nowait(Signal.CLOSED)
        self._event_watchers[tenant].add(queue)
        try:
            yield queue
        finally:
            watchers = self._event_watchers.get(tenant)
            if watchers is not None:
                watchers.discard(queue)
                if not watchers:
                    del self._event_watchers[tenant]

    @property
    def watcher_count(self) -> int:
        return sum(len(w) for w in self._watchers.values())

    def command_done(self, command_key: str) -> asyncio.Future[Finished]:
        """A future resolved when the command is published in a terminal state (at once if it
        was, recently)."""
        future: asyncio.Future[Finished] = asyncio.get_running_loop().create_future()
        finished = self._finished.get(command_key)
        if finished is not None:
            future.set_result(finished)
            return future
        self._waiters[command_key].append(future)
        return future

    def forget(self, command_key: str, future: asyncio.Future[Finished]) -> None:
        waiters = self._waiters.get(command_key)
        if waiters and future in waiters:
            waiters.remove(future)
            if not waiters:
                del self._waiters[command_key]


def _drain(queue: asyncio.Queue[Workspace | Signal] | asyncio.Queue[list[Event] | Signal]) -> None:
    while not queue.empty():
        queue.get_nowait()


class Wakeup:
    """A level-triggered wake-up for a loop, with the IDs that changed since last time."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.ids: set[str] = set()

    def set(self, ids: frozenset[str] | None = None) -> None:
        if ids:
            self.ids |= ids
        self._event.set()

    async def wait(self, within: float | None = None) -> frozenset[str]:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # arrives as the event is set, and the loop runs on past its cancel (a shutdown that
        # waits for it hangs; found by the simulator, seed 3007).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._event.wait()
        self._event.clear()
        ids, self.ids = frozenset(self.ids), set()
        return ids
