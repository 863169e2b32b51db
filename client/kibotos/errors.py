"""Exceptions: one root (`KiboError`), one subclass per case a caller acts on differently.

Every rejection from the server carries, in `grpc-status-details-bin`, a
`kibo.ctrl.v1.ErrorDetail` (reason, field, workspace state, hint) and a
`google.rpc.ErrorInfo`; `from_rpc_error` decodes both into the matching subclass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from kibo.ctrl.v1 import command_pb2, error_pb2, workspace_pb2

__all__ = [
    "AbortedError",
    "CommandFailedError",
    "CommandIdReusedError",
    "ConflictError",
    "DeadlineExceededError",
    "InternalError",
    "InvalidArgumentError",
    "KiboError",
    "KiboTimeoutError",
    "NotFoundError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RateLimitedError",
    "ReservedCommandIdError",
    "ResourceExhaustedError",
    "SettleTimeoutError",
    "UnauthenticatedError",
    "UnavailableError",
    "WaitTimeoutError",
    "WrongPortError",
    "from_rpc_error",
    "reason_name",
]

STATUS_DETAILS_KEY = "grpc-status-details-bin"


def reason_name(reason: int) -> str:
    """`ERROR_REASON_CONFLICT` -> `CONFLICT`; 0 -> ``."""
    if not reason:
        return ""
    try:
        return error_pb2.ErrorReason.Name(reason).removeprefix("ERROR_REASON_")
    except ValueError:
        return str(reason)


class KiboError(Exception):
    """The root of every error this SDK raises.

    `code` is the gRPC status code (None for errors found before any call), `reason` the
    ErrorDetail reason without its prefix (``CONFLICT``, ``NOT_FOUND``...), `hint` what the
    caller can do next, `metadata` the ErrorInfo metadata and `trailing_metadata` the raw
    gRPC trailers.
    """

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        detail: error_pb2.ErrorDetail | None = None,
        info: error_details_pb2.ErrorInfo | None = None,
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.detail = detail if detail is not None else error_pb2.ErrorDetail()
        self.info = info if info is not None else error_details_pb2.ErrorInfo()
        self.trailing_metadata = tuple(trailing_metadata)
        # From google.rpc.RetryInfo, when the server says when to retry.
        self.retry_delay = retry_delay

    @property
    def reason(self) -> str:
        return reason_name(self.detail.reason) or self.info.reason

    @property
    def field(self) -> str:
        return self.detail.field

    @property
    def workspace_state(self) -> str:
        return self.detail.workspace_state

    @property
    def hint(self) -> str:
        return self.detail.hint

    @property
    def metadata(self) -> Mapping[str, str]:
        return dict(self.info.metadata)

    def __str__(self) -> str:
        code = f"{self.code.name}: " if self.code is not None else ""
        return f"{code}{self.message}"


class InvalidArgumentError(KiboError):
    """INVALID_ARGUMENT: a malformed request (bad field, bad command ID)."""


class ReservedCommandIdError(InvalidArgumentError):
    """INVALID_ARGUMENT with reason RESERVED_COMMAND_ID: `guest-shutdown/` and `host-memory/` are the server's."""


class NotFoundError(KiboError):
    """NOT_FOUND: no such workspace, command or volume."""


class CommandIdReusedError(KiboError):
    """ALREADY_EXISTS: the command ID was already used for another request."""


class AbortedError(KiboError):
    """ABORTED: `expected_expiration_revision` does not match (REVISION_MISMATCH); nothing changed."""


class ConflictError(KiboError):
    """FAILED_PRECONDITION (CONFLICT): the workspace's state does not allow the operation; it is unchanged."""


class UnavailableError(KiboError):
    """UNAVAILABLE: the server cannot be reached right now. Safe to resend a command with its ID."""


class WrongPortError(UnavailableError):
    """UNAVAILABLE because the address answers HTTP/1.x, not gRPC: it is the server's HTTP port
    (Connect, gRPC-Web, JSON), not its gRPC port. Not retried: resending cannot help."""


# What grpc's transport says when the peer answers HTTP/1.x (its chttp2 handshake).
_HTTP1_PEER = "Trying to connect an http1.x server"
WRONG_PORT_HINT = (
    "that address answers HTTP/1.x, not gRPC: it is the server's HTTP port (--http-listen, 8080 by "
    "default); kibo and kibotos talk to its gRPC port (--listen, 50051 by default)"
)


class UnauthenticatedError(KiboError):
    """UNAUTHENTICATED: the server needs a valid token (`authorization: Bearer TOKEN`).

    `token_discovery` says where the client's token came from, or every place it looked
    (kibotos.token_discovery); it is part of the message."""

    token_discovery: str = ""

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} ({self.token_discovery})" if self.token_discovery else text


class PermissionDeniedError(KiboError):
    """PERMISSION_DENIED: the token's role does not allow the call."""


class ResourceExhaustedError(KiboError):
    """RESOURCE_EXHAUSTED: a limit was hit (a quota, the request rate, the message size)."""


class QuotaExceededError(ResourceExhaustedError):
    """RESOURCE_EXHAUSTED with reason QUOTA_EXCEEDED: a per-tenant quota would be exceeded."""


class RateLimitedError(ResourceExhaustedError):
    """RESOURCE_EXHAUSTED with reason RATE_LIMITED: retry after `retry_delay` (nothing was recorded)."""


class InternalError(KiboError):
    """INTERNAL: a bug in the server. Not retried: the same request would meet it again.
    `error_id` is what the server logged with the details; quote it in a bug report."""

    @property
    def error_id(self) -> str:
        return str(self.info.metadata.get("error_id", ""))


class DeadlineExceededError(KiboError):
    """DEADLINE_EXCEEDED: the call ran out of time; the command may or may not have been recorded."""


class CommandFailedError(KiboError):
    """A command ended COMMAND_STATE_FAILED. `status` is its google.rpc.Status; `cancelled`
    tells a superseded or cancelled command (status code CANCELLED = 1)."""

    def __init__(self, command: command_pb2.WorkspaceCommand, workspace: workspace_pb2.Workspace | None = None) -> None:
        self.command = command
        self.workspace = workspace
        self.status: status_pb2.Status = command.error
        text = command.error.message or "no message"
        super().__init__(f"command {command.command_id} failed: {text}")

    @property
    def command_id(self) -> str:
        return self.command.command_id

    @property
    def status_code(self) -> grpc.StatusCode | None:
        """The command error's code as a grpc.StatusCode (CANCELLED when superseded)."""
        return _code(int(self.status.code))

    @property
    def cancelled(self) -> bool:
        return bool(self.status.code == _number(grpc.StatusCode.CANCELLED))

    def __str__(self) -> str:
        code = self.status_code
        return f"{self.message} ({code.name if code is not None else self.status.code})"


class KiboTimeoutError(KiboError, TimeoutError):
    """The caller's deadline passed on the client side. The command goes on: nothing is cancelled."""

    def __init__(self, message: str, *, command_id: str = "", workspace: workspace_pb2.Workspace | None = None):
        super().__init__(message, code=grpc.StatusCode.DEADLINE_EXCEEDED)
        self.command_id = command_id
        self.workspace = workspace


class SettleTimeoutError(KiboTimeoutError):
    """settle() gave up before the command was terminal. Query it with GetWorkspaceCommand."""


class WaitTimeoutError(KiboTimeoutError):
    """A wait gave up before the command was terminal and the workspace steady."""


_BY_CODE: dict[grpc.StatusCode, type[KiboError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: CommandIdReusedError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.FAILED_PRECONDITION: ConflictError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.INTERNAL: InternalError,
}
# Reasons that pick a finer class than the code does.
_BY_REASON: dict[str, type[KiboError]] = {
    "RESERVED_COMMAND_ID": ReservedCommandIdError,
    "QUOTA_EXCEEDED": QuotaExceededError,
    "RATE_LIMITED": RateLimitedError,
}


def _number(code: grpc.StatusCode) -> int:
    return int(code.value[0])


def _code(number: int) -> grpc.StatusCode | None:
    return next((code for code in grpc.StatusCode if _number(code) == number), None)


def _details(
    trailers: Sequence[tuple[str, str | bytes]],
) -> tuple[error_pb2.ErrorDetail, error_details_pb2.ErrorInfo, float | None]:
    detail, info = error_pb2.ErrorDetail(), error_details_pb2.ErrorInfo()
    retry_delay: float | None = None
    for key, value in trailers:
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            continue
        for packed in status.details:
            if packed.Is(error_pb2.ErrorDetail.DESCRIPTOR):
                packed.Unpack(detail)
            elif packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                packed.Unpack(info)
            elif packed.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                packed.Unpack(retry)
                retry_delay = float(retry.retry_delay.seconds) + float(retry.retry_delay.nanos) / 1e9
    return detail, info, retry_delay


def from_rpc_error(error: grpc.RpcError) -> KiboError:
    """Translate a grpc (sync or asyncio) RpcError into the matching KiboError subclass."""
    code: grpc.StatusCode | None = None
    message = str(error)
    trailers: tuple[tuple[str, str | bytes], ...] = ()
    if isinstance(error, grpc.Call | grpc.aio.AioRpcError):
        code = error.code()
        message = error.details() or (code.name if code is not None else "")
        trailers = tuple((str(k), v) for k, v in (error.trailing_metadata() or ()))
    detail, info, retry_delay = _details(trailers)
    cls = _BY_CODE.get(code, KiboError) if code is not None else KiboError
    if code == grpc.StatusCode.UNAVAILABLE and _HTTP1_PEER in message:
        cls = WrongPortError
        detail.hint = detail.hint or WRONG_PORT_HINT
    reason = reason_name(detail.reason) or str(info.reason)
    finer = _BY_REASON.get(reason)
    if finer is not None and issubclass(finer, cls):
        cls = finer
    return cls(message, code=code, detail=detail, info=info, trailing_metadata=trailers, retry_delay=retry_delay)
