"""The one map from domain errors to wire status: code, ErrorDetail and ErrorInfo (AIP-193).

Both transports use it: gRPC puts the Status in grpc-status-details-bin, Connect in its
error details."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from kibo.ctrl.v1 import error_pb2

from ..errors import GuestExhausted, GuestPermissionDenied, KiboError, QuotaExceeded, RateLimited, Reason

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


def to_status(error: KiboError) -> tuple[grpc.StatusCode, status_pb2.Status]:
    code = CLASS_CODES.get(type(error)) or CODES[error.reason]
    status = status_pb2.Status(code=code.value[0], message=error.message)
    for message in details(error):
        packed = any_pb2.Any()
        packed.Pack(message)
        status.details.append(packed)
    return code, status
