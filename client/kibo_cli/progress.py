"""Progress of a wait: a live spinner with the state and elapsed time on a terminal, plain
lines (one per change) otherwise. Always on stderr."""

from __future__ import annotations

import time
from types import TracebackType

import kibotos
from kibo.ctrl.v1 import workspace_pb2
from rich.console import Console
from rich.status import Status
from rich.text import Text

from . import output


class Progress:
    def __init__(self, label: str, console: Console | None = None) -> None:
        self.label = label
        self.console = console or output.stderr()
        self.started = time.monotonic()
        self.state = "sending"
        self._status: Status | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __rich__(self) -> Text:
        return Text(f"{self.label}: {self.state} ({self.elapsed():.1f}s)")

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self._status = Status(self, console=self.console, spinner="dots")
            self._status.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def show(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        if self._status is None:
            output.note(f"{self.label}: {state} ({self.elapsed():.1f}s)")

    # Callbacks for the SDK.
    def on_answer(self, response: kibotos.CommandResponse) -> None:
        """A command answer (settle): the workspace state and the command's."""
        workspace = kibotos.state_name(response.workspace.state)
        if kibotos.is_terminal(response.command):
            self.show(workspace)
        else:
            self.show(f"{workspace}, command {kibotos.command_state_name(response.command.state)}")

    def on_update(self, workspace: workspace_pb2.Workspace) -> None:
        """A snapshot from WatchWorkspace (wait)."""
        self.show(kibotos.state_name(workspace.state))
