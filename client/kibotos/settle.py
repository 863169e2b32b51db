"""settle: resend the identical command request until the command is terminal.

A command RPC may answer while its command is still PENDING or RUNNING. Resending the
same request (same command ID) never executes it twice: the server answers with the
command's current state, after waiting briefly for it to finish. So settling is a loop of
resends with capped exponential backoff under an overall deadline; UNAVAILABLE and
DEADLINE_EXCEEDED are retried too, since the command ID makes the resend safe.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc
from kibo.ctrl.v1 import command_pb2, workspace_pb2

from .errors import (
    CommandFailedError,
    DeadlineExceededError,
    KiboError,
    RateLimitedError,
    SettleTimeoutError,
    UnavailableError,
    WrongPortError,
    from_rpc_error,
)
from .states import command_state_name, is_terminal

__all__ = ["Backoff", "CommandResponse", "SettleOptions", "settle", "settle_async"]


class CommandResponse(Protocol):
    """What every command RPC answers: the workspace and the command."""

    @property
    def workspace(self) -> workspace_pb2.Workspace: ...

    @property
    def command(self) -> command_pb2.WorkspaceCommand: ...


R = TypeVar("R", bound=CommandResponse)


@dataclass(frozen=True)
class SettleOptions:
    # Overall deadline in seconds for all resends together; None: no deadline.
    timeout: float | None = 600.0
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    # Each delay is randomised by up to this fraction, so many clients do not resend in step.
    jitter: float = 0.2
    # Retry UNAVAILABLE and DEADLINE_EXCEEDED (safe: the command ID makes a resend idempotent),
    # and RATE_LIMITED after the delay the server asks for.
    retry_transport_errors: bool = True
    # Raise CommandFailedError when the command ends FAILED (else return the response).
    raise_on_failure: bool = True


class Backoff:
    """Capped exponential delays: initial, initial*multiplier, ... up to max_backoff."""

    def __init__(self, initial: float, maximum: float, multiplier: float = 2.0, jitter: float = 0.0) -> None:
        self._next = initial
        self._maximum = maximum
        self._multiplier = multiplier
        self._jitter = jitter

    @classmethod
    def of(cls, options: SettleOptions) -> Backoff:
        return cls(options.initial_backoff, options.max_backoff, options.multiplier, options.jitter)

    def next(self) -> float:
        delay = min(self._next, self._maximum)
        self._next = min(self._next * self._multiplier, self._maximum)
        if self._jitter:
            delay *= 1 + random.uniform(-self._jitter, self._jitter)
        return max(delay, 0.0)

    def reset(self, initial: float) -> None:
        self._next = initial


TRANSIENT = (UnavailableError, DeadlineExceededError, RateLimitedError)


def _transient(error: KiboError, options: SettleOptions) -> bool:
    # A wrong port stays wrong: said at once rather than retried until the deadline.
    return options.retry_transport_errors and isinstance(error, TRANSIENT) and not isinstance(error, WrongPortError)


class _Loop:
    """The decisions settle makes, shared by the sync and the asyncio variant."""

    def __init__(self, options: SettleOptions | None) -> None:
        self.options = options or SettleOptions()
        self.backoff = Backoff.of(self.options)
        timeout = self.options.timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.command_id = ""
        self.last_state = ""
        self.last_error: KiboError | None = None

    def error(self, raised: BaseException) -> KiboError:
        """Translate; re-raise unless it is a transport error worth retrying."""
        error = from_rpc_error(raised) if isinstance(raised, grpc.RpcError) else raised
        assert isinstance(error, KiboError)
        if not _transient(error, self.options):
            raise error from None
        self.last_error = error
        return error

    def answered(self, response: R) -> bool:
        """True when done (terminal); raises CommandFailedError when configured to."""
        command = response.command
        self.command_id = command.command_id or self.command_id
        self.last_state = command_state_name(command.state)
        self.last_error = None
        if not is_terminal(command):
            return False
        if command.state == command_pb2.COMMAND_STATE_FAILED and self.options.raise_on_failure:
            raise CommandFailedError(command, response.workspace)
        return True

    def delay(self) -> float:
        delay = self.backoff.next()
        if self.last_error is not None and self.last_error.retry_delay:
            delay = max(delay, self.last_error.retry_delay)
        if self.deadline is not None and time.monotonic() + delay > self.deadline:
            what = f"command {self.command_id}" if self.command_id else "the command"
            state = f"still {self.last_state}" if self.last_state else f"not answered ({self.last_error})"
            raise SettleTimeoutError(
                f"gave up settling {what}: {state} after {self.options.timeout:g}s; it goes on, "
                "query it with GetWorkspaceCommand",
                command_id=self.command_id,
            )
        return delay


def settle(
    call: Callable[[], R],
    options: SettleOptions | None = None,
    *,
    on_answer: Callable[[R], object] | None = None,
) -> R:
    """Call `call` (which must send the identical request each time) until the command is
    terminal; return the terminal response. `on_answer` sees every answer (for progress).

    Raises CommandFailedError when the command ended FAILED, SettleTimeoutError past the
    deadline, and the matching KiboError for a rejection."""
    loop = _Loop(options)
    while True:
        try:
            response = call()
        except (grpc.RpcError, *TRANSIENT) as raised:
            loop.error(raised)
        else:
            if on_answer is not None:
                on_answer(response)
            if loop.answered(response):
                return response
        time.sleep(loop.delay())


async def settle_async(
    call: Callable[[], Awaitable[R]],
    options: SettleOptions | None = None,
    *,
    on_answer: Callable[[R], object] | None = None,
) -> R:
    """The asyncio variant of settle: `call` returns an awaitable (e.g. a grpc.aio stub call)."""
    loop = _Loop(options)
    while True:
        try:
            response = await call()
        except (grpc.RpcError, *TRANSIENT) as raised:
            loop.error(raised)
        else:
            if on_answer is not None:
                on_answer(response)
            if loop.answered(response):
                return response
        await asyncio.sleep(loop.delay())
