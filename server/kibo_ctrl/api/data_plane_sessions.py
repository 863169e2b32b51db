"""The data-plane calls running now, by the credential they were authorized by.

A credential names (workspace, execution generation, credential revision). Revoke, stop,
force stop and delete bump the revision (a start makes a new generation); every commit is
published to the hub, and `on_changes` ends each running call whose credential the
workspace no longer honours: its `stop` event is set, which kills its job in the guest at
once (guest_jobs.py) and ends its stream with UNAUTHENTICATED.

A call is registered before it reads the workspace from the store, so a revoke committed
between that read and the start of the job is not missed: either the read sees the new
revision (refused), or the commit's publication finds the call here."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..domain.model import Workspace
from ..store.base import Changes


@dataclass(eq=False)
class Session:
    workspace_id: str
    generation: int
    revision: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""

    def end(self, why: str) -> None:
        if not self.stop.is_set():
            self.why = why
            self.stop.set()


def _revoked_because(workspace: Workspace, session: Session) -> str:
    """Why `workspace` no longer honours the session's credential; "" if it still does."""
    if workspace.deleted or workspace.deletion_started:
        return "the workspace is being deleted"
    if workspace.generation != session.generation:
        return "the workspace was started again"
    if workspace.data_plane_revision != session.revision:
        return "data-plane access was revoked: a revoke, a stop or a failure of the guest"
    return ""


class Sessions:
    def __init__(self) -> None:
        self._running: dict[str, set[Session]] = defaultdict(set)

    @contextlib.contextmanager
    def track(self, workspace_id: str, generation: int, revision: int) -> Iterator[Session]:
        session = Session(workspace_id, generation, revision)
        self._running[workspace_id].add(session)
        try:
            yield session
        finally:
            running = self._running.get(workspace_id)
            if running is not None:
                running.discard(session)
                if not running:
                    del self._running[workspace_id]

    @property
    def count(self) -> int:
        """Data-plane calls running now (metrics)."""
        return sum(len(running) for running in self._running.values())

    def on_changes(self, changes: Changes) -> None:
        """A hub listener: called after every commit, in the event loop."""
        for workspace in changes.workspaces.values():
            for session in tuple(self._running.get(workspace.id, ())):
                why = _revoked_because(workspace, session)
                if why:
                    session.end(why)
