"""The one map from exceptions to wire status: code, ErrorDetail and ErrorInfo (AIP-193).

Both transports use it (`status_of`, for every exception a handler raises, unary or
streaming): gRPC puts the Status in grpc-status-details-bin, Connect in its error details.
A domain error keeps its code and words. A store that cannot work now is UNAVAILABLE, in
our words. Anything else is a bug: INTERNAL with a generic message and an error ID, which
the log holds with the traceback; no exception text, class or SQL reaches the client."""

from __future__ import annotations

import logging
import uuid

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from kibo.ctrl.v1 import error_pb2

from ..domain.errors import (
    GuestExhausted,
    GuestPermissionDenied,
    KiboError,
    QuotaExceeded,
    RateLimited,
    Reason,
    StoreError,
)

log = logging.getLogger("kibo.errors")

DOMAIN = "kibo.dev"

CODES: dict[Reason, grpc.StatusCode] = {
    Reason.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.RESERVED_COMMAND_ID: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.COMMAND_ID_REUSED: grpc.StatusCode.ALREADY_EXISTS,
    Reason.REVISION_MISMATCH: grpc.StatusCode.ABORTED,
    Reason.CONFLICT: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reason.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Reason.QUOTA_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.RATE_LIMITED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.NO_CAPACITY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    Reason.GUEST_ERROR: grpc.StatusCode.FAILED_PRECONDITION,
}

# Guest errors whose cause has a canonical code of its own; their reason stays GUEST_ERROR.
CLASS_CODES: dict[type[KiboError], grpc.StatusCode] = {
    GuestExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    GuestPermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}


def details(error: KiboError) -> list[Message]:
    """ErrorDetail and ErrorInfo always; QuotaFailure or RetryInfo where they apply."""
    detail = error_pb2.ErrorDetail(
        reason=int(error.reason), field=error.field, workspace_state=error.state, hint=error.hint
    )
    metadata = {k: v for k, v in (("field", error.field), ("state", error.state), ("hint", error.hint)) if v}
    extra: list[Message] = []
    if isinstance(error, QuotaExceeded):
        metadata.update(quota=error.quota, limit=str(error.limit), used=str(error.used), requested=str(error.requested))
        violation = error_details_pb2.QuotaFailure.Violation(subject=error.quota, description=error.hint)
        extra.append(error_details_pb2.QuotaFailure(violations=[violation]))
    if isinstance(error, RateLimited):
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(error.retry_after * 1e9))
        extra.append(error_details_pb2.RetryInfo(retry_delay=delay))
    info = error_details_pb2.ErrorInfo(reason=error.reason.name, domain=DOMAIN, metadata=metadata)
    return [detail, info, *extra]


# The most of a message a status carries, in UTF-8 bytes. gRPC sends it twice in the trailing
# metadata (grpc-message, percent-encoded: up to 3 bytes a byte; and in grpc-status-details-bin,
# base64), which a client takes only up to 8 KiB: a message quoting a 4 KiB path or filter
# reached the client as RESOURCE_EXHAUSTED instead (issue 27). Messages quote request values
# short (validation.quote); this bounds any that does not.
MAX_MESSAGE_BYTES = 1024


def _bounded(message: str) -> str:
    encoded = message.encode()
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    return encoded[:MAX_MESSAGE_BYTES].decode(errors="ignore") + "…"


def to_status(error: KiboError) -> tuple[grpc.StatusCode, status_pb2.Status]:
    code = CLASS_CODES.get(type(error)) or CODES[error.reason]
    status = status_pb2.Status(code=code.value[0], message=_bounded(error.message))
    for message in details(error):
        packed = any_pb2.Any()
        packed.Pack(message)
        status.details.append(packed)
    return code, status


def internal_status(error: BaseException) -> tuple[grpc.StatusCode, status_pb2.Status]:
    """INTERNAL with an error ID; the log has the ID with the traceback."""
    error_id = uuid.uuid4().hex[:16]
    log.error("internal error %s", error_id, exc_info=error)
    code = grpc.StatusCode.INTERNAL
    message = f"internal error (error ID {error_id}); the server log has the details"
    status = status_pb2.Status(code=code.value[0], message=message)
    info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=DOMAIN, metadata={"error_id": error_id})
    for detail in (info, error_details_pb2.RequestInfo(request_id=error_id)):
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    return code, status


def status_of(error: Exception) -> tuple[grpc.StatusCode, status_pb2.Status]:
    """The wire status for any exception a handler raised."""
    if isinstance(error, StoreError) and error.unavailable is not None:
        log.error("store error (answered UNAVAILABLE): %s", error)
        return to_status(error.unavailable)
    if isinstance(error, KiboError):
        return to_status(error)
    return internal_status(error)
