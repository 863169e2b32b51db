"""What the typed command and wait methods of both clients take, shared by AsyncClient (aio.py)
and the Client generated from it (client.py): how to settle, the progress callbacks, and the
call shapes that kibotos._generate turns from awaitable into blocking (AsyncCall -> SyncCall)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from kibo.ctrl.v1 import command_pb2, workspace_pb2

from .errors import CommandFailedError
from .settle import CommandResponse, SettleOptions
from .wait import WaitOptions

__all__ = [
    "AsyncCall",
    "OnAnswer",
    "OnUpdate",
    "SettleArg",
    "SyncCall",
    "raise_if_failed",
    "settle_options",
    "wait_options",
]

R = TypeVar("R", bound=CommandResponse)
# True: settle with the client's options; False: send once; or the options to settle with.
SettleArg = bool | SettleOptions
OnAnswer = Callable[[CommandResponse], object]
OnUpdate = Callable[[workspace_pb2.Workspace], object]
# One send of a command request: awaitable in AsyncClient, blocking in Client.
AsyncCall = Callable[[], Awaitable[R]]
SyncCall = Callable[[], R]


def settle_options(arg: SettleArg, default: SettleOptions) -> SettleOptions | None:
    if isinstance(arg, SettleOptions):
        return arg
    return default if arg else None


def raise_if_failed(response: R) -> R:
    if response.command.state == command_pb2.COMMAND_STATE_FAILED:
        raise CommandFailedError(response.command, response.workspace)
    return response


def wait_options(options: WaitOptions | None, timeout: float | None) -> WaitOptions:
    options = options or WaitOptions()
    if timeout is not None:
        options = WaitOptions(
            timeout=timeout,
            watch=options.watch,
            poll_interval=options.poll_interval,
            max_poll_interval=options.max_poll_interval,
            stream_timeout=options.stream_timeout,
        )
    return options
