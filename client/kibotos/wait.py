"""Waits: follow WatchWorkspace until a command is terminal and its workspace steady.

WatchWorkspace sends the current snapshot, then one message per stored change, and ends
after DELETED. A wait follows it; when the stream breaks (server restart, network) it
reads the workspace once with GetWorkspace and reconnects with backoff; a server without
the stream (UNIMPLEMENTED) is polled instead. Each watch call is bounded
(`stream_timeout`) so a silent stream is re-checked now and then.

Done when the command (if given) is terminal and the workspace is in a steady state
(AVAILABLE, STOPPED, FAILED, DELETED); a command that ended FAILED raises
CommandFailedError. Giving up (WaitTimeoutError) never cancels anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass
from typing import Protocol

import grpc
from kibo.ctrl.v1 import command_pb2, workspace_pb2

from .errors import (
    CommandFailedError,
    DeadlineExceededError,
    KiboError,
    RateLimitedError,
    UnavailableError,
    WaitTimeoutError,
    WrongPortError,
)
from .settle import Backoff
from .states import command_state_name, is_steady, is_terminal, state_name

__all__ = [
    "AsyncWaitTarget",
    "WaitOptions",
    "WaitResult",
    "WaitTarget",
    "wait",
    "wait_async",
]

Workspace = workspace_pb2.Workspace
Command = command_pb2.WorkspaceCommand
OnUpdate = Callable[[Workspace], object]


@dataclass(frozen=True)
class WaitOptions:
    # Overall deadline in seconds; None: wait as long as it takes.
    timeout: float | None = None
    # Follow WatchWorkspace; False polls GetWorkspace only.
    watch: bool = True
    # Backoff between polls and reconnects.
    poll_interval: float = 0.1
    max_poll_interval: float = 3.0
    # Longest single watch call; a reconnect re-reads the snapshot.
    stream_timeout: float = 30.0


@dataclass(frozen=True)
class WaitResult:
    workspace: Workspace
    # The command waited for, terminal; None when waiting for a steady state only.
    command: Command | None


class WaitTarget(Protocol):
    """What a wait needs from a (sync) client."""

    def get_workspace(self, workspace_id: str) -> Workspace: ...

    def get_command(self, command_id: str) -> Command: ...

    def watch_workspace(
        self, workspace_id: str, *, timeout: float | None = None
    ) -> Generator[Workspace, None, None]: ...


class AsyncWaitTarget(Protocol):
    async def get_workspace(self, workspace_id: str) -> Workspace: ...

    async def get_command(self, command_id: str) -> Command: ...

    def watch_workspace(
        self, workspace_id: str, *, timeout: float | None = None
    ) -> AsyncGenerator[Workspace, None]: ...


class _Waiter:
    """The decisions of a wait, shared by the sync and asyncio drivers."""

    def __init__(
        self, workspace_id: str, command_id: str | None, deleted: bool, options: WaitOptions, on_update: OnUpdate | None
    ) -> None:
        self.workspace_id = workspace_id
        self.command_id = command_id or None
        self.deleted = deleted
        self.options = options
        self.on_update = on_update
        self.deadline = None if options.timeout is None else time.monotonic() + options.timeout
        self.backoff = Backoff(options.poll_interval, options.max_poll_interval, jitter=0.1)
        self.watch = options.watch
        self.last: Workspace | None = None
        self.command: Command | None = None
        # The workspace looked done but the command was still executing: re-check soon.
        self.command_pending = False
        # False after an error or a stream that ended on its own: back off before the next round.
        self.reconnect_now = True
        # Set by a RATE_LIMITED answer: wait at least this long before the next call.
        self.retry_delay = 0.0

    def see(self, workspace: Workspace) -> bool:
        """Record a snapshot; True when the workspace side is done (the command is checked next)."""
        if self.on_update is not None and (self.last is None or self.last != workspace):
            self.on_update(workspace)
        self.last = workspace
        if self.deleted and self.command_id is None:
            return workspace.state == workspace_pb2.WORKSPACE_STATE_DELETED
        return is_steady(workspace)

    def command_done(self, command: Command | None) -> bool:
        if command is None:
            return True
        self.command = command
        if not is_terminal(command):
            self.command_pending = True
            return False
        self.command_pending = False
        if command.state == command_pb2.COMMAND_STATE_FAILED:
            raise CommandFailedError(command, self.last)
        assert self.last is not None
        return not self.deleted or self.last.state == workspace_pb2.WORKSPACE_STATE_DELETED

    def result(self) -> WaitResult:
        assert self.last is not None
        return WaitResult(self.last, self.command)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def chunk(self) -> float:
        """How long the next watch call may last."""
        longest = self.options.poll_interval * 4 if self.command_pending else self.options.stream_timeout
        remaining = self.remaining()
        return max(0.01, longest if remaining is None else min(longest, remaining))

    def classify(self, error: KiboError) -> None:
        """Re-raise errors a wait cannot outlast; remember that the stream is unavailable."""
        self.reconnect_now = False
        if error.code == grpc.StatusCode.UNIMPLEMENTED:
            self.watch = False
            return
        if isinstance(error, UnavailableError | DeadlineExceededError) and not isinstance(error, WrongPortError):
            return
        if isinstance(error, RateLimitedError):
            self.retry_delay = error.retry_delay or 0.0
            return
        if error.code == grpc.StatusCode.CANCELLED:
            return  # a stream cut short by a server going away
        raise error

    def pause(self) -> float:
        """How long to sleep before the next round; raises WaitTimeoutError past the deadline.

        No pause after a bounded watch call simply ran its time (reconnect at once), unless
        the command still executes (then poll with backoff)."""
        now = self.reconnect_now and self.watch and not self.command_pending
        self.reconnect_now = True
        delay = 0.0 if now else max(self.backoff.next(), self.retry_delay)
        self.retry_delay = 0.0
        remaining = self.remaining()
        if remaining is not None and remaining <= delay:
            raise self.timeout()
        return delay

    def timeout(self) -> WaitTimeoutError:
        state = state_name(self.last.state) if self.last is not None else "not read yet"
        what = f"command {self.command_id}" if self.command_id else f"workspace {self.workspace_id}"
        command = f", command {command_state_name(self.command.state)}" if self.command is not None else ""
        return WaitTimeoutError(
            f"gave up waiting for {what} after {self.options.timeout:g}s: workspace {state}{command}; "
            "nothing was cancelled",
            command_id=self.command_id or "",
            workspace=self.last,
        )


def wait(
    target: WaitTarget,
    workspace_id: str,
    command_id: str | None = None,
    *,
    deleted: bool = False,
    options: WaitOptions | None = None,
    on_update: OnUpdate | None = None,
) -> WaitResult:
    """Wait until `command_id` (if any) is terminal and the workspace steady (DELETED when
    `deleted`). `on_update` sees every new snapshot (for progress display)."""
    waiter = _Waiter(workspace_id, command_id, deleted, options or WaitOptions(), on_update)

    def done(workspace: Workspace) -> bool:
        if not waiter.see(workspace):
            return False
        command = target.get_command(waiter.command_id) if waiter.command_id else None
        return waiter.command_done(command)

    while True:
        try:
            if waiter.watch:
                with contextlib.closing(target.watch_workspace(workspace_id, timeout=waiter.chunk())) as stream:
                    for workspace in stream:
                        if done(workspace):
                            return waiter.result()
                        waiter.backoff.reset(waiter.options.poll_interval)
        except DeadlineExceededError:
            pass  # the bounded watch call ended: re-check below, then reconnect at once
        except KiboError as error:
            waiter.classify(error)
        else:
            if waiter.watch:  # the stream ended on its own: re-check below, reconnect after a pause
                waiter.reconnect_now = False
        try:
            if done(target.get_workspace(workspace_id)):
                return waiter.result()
        except KiboError as error:
            waiter.classify(error)
        time.sleep(waiter.pause())


async def wait_async(
    target: AsyncWaitTarget,
    workspace_id: str,
    command_id: str | None = None,
    *,
    deleted: bool = False,
    options: WaitOptions | None = None,
    on_update: OnUpdate | None = None,
) -> WaitResult:
    """The asyncio variant of `wait`."""
    waiter = _Waiter(workspace_id, command_id, deleted, options or WaitOptions(), on_update)

    async def done(workspace: Workspace) -> bool:
        if not waiter.see(workspace):
            return False
        command = await target.get_command(waiter.command_id) if waiter.command_id else None
        return waiter.command_done(command)

    while True:
        try:
            if waiter.watch:
                async with contextlib.aclosing(target.watch_workspace(workspace_id, timeout=waiter.chunk())) as stream:
                    async for workspace in stream:
                        if await done(workspace):
                            return waiter.result()
                        waiter.backoff.reset(waiter.options.poll_interval)
        except DeadlineExceededError:
            pass
        except KiboError as error:
            waiter.classify(error)
        else:
            if waiter.watch:
                waiter.reconnect_now = False
        try:
            if await done(await target.get_workspace(workspace_id)):
                return waiter.result()
        except KiboError as error:
            waiter.classify(error)
        await asyncio.sleep(waiter.pause())
