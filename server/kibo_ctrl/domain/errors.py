"""Domain errors: a small hierarchy, mapped to wire codes in one place (transport/errors.py)."""

from __future__ import annotations

from enum import IntEnum


class Reason(IntEnum):
    """Numbers equal kibo.ctrl.v1.ErrorReason."""

    CONFLICT = 1
    NOT_FOUND = 2
    INVALID_ARGUMENT = 3
    RESERVED_COMMAND_ID = 4
    COMMAND_ID_REUSED = 5
    REVISION_MISMATCH = 6
    UNAVAILABLE = 7
    UNAUTHENTICATED = 8
    PERMISSION_DENIED = 9
    QUOTA_EXCEEDED = 10
    RATE_LIMITED = 11
    UNIMPLEMENTED = 12
    GUEST_ERROR = 13
    NO_CAPACITY = 14


class KiboError(Exception):
    reason: Reason = Reason.INVALID_ARGUMENT

    def __init__(self, message: str, *, field: str = "", state: str = "", hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.state = state
        self.hint = hint


class InvalidArgument(KiboError):
    reason = Reason.INVALID_ARGUMENT


class ReservedCommandId(InvalidArgument):
    reason = Reason.RESERVED_COMMAND_ID


class NotFound(KiboError):
    reason = Reason.NOT_FOUND


class CommandIdReused(KiboError):
    reason = Reason.COMMAND_ID_REUSED


class RevisionMismatch(KiboError):
    reason = Reason.REVISION_MISMATCH


class Conflict(KiboError):
    reason = Reason.CONFLICT


class Unavailable(KiboError):
    """Retry later: e.g. the server is shutting down."""

    reason = Reason.UNAVAILABLE


class StoreError(Exception):
    """A store could not read or write. Store adapters raise this in place of their driver's
    errors, so that no layer above a store knows which database it is.

    `unavailable` is the answer when the condition passes (disk full, locked, read-only:
    UNAVAILABLE, retry later); None when it does not, which is a bug (INTERNAL)."""

    def __init__(self, message: str, unavailable: Unavailable | None = None) -> None:
        super().__init__(message)
        self.unavailable = unavailable


class Unauthenticated(KiboError):
    reason = Reason.UNAUTHENTICATED


class PermissionDenied(KiboError):
    reason = Reason.PERMISSION_DENIED


class QuotaExceeded(KiboError):
    """A per-tenant quota would be exceeded; `quota` says which, with its limit and use."""

    reason = Reason.QUOTA_EXCEEDED

    def __init__(self, message: str, *, quota: str, limit: int, used: int, requested: int) -> None:
        super().__init__(message, hint=f"the {quota} quota is {limit}; {used} in use, {requested} requested")
        self.quota = quota
        self.limit = limit
        self.used = used
        self.requested = requested


class NoCapacity(KiboError):
    """No node could ever hold what was asked (more than any node offers in all): refused up
    front rather than accepted and left waiting or failed (RESOURCE_EXHAUSTED)."""

    reason = Reason.NO_CAPACITY


class RateLimited(KiboError):
    reason = Reason.RATE_LIMITED

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, hint=f"retry after {retry_after:.2f} s")
        self.retry_after = retry_after


class Unimplemented(KiboError):
    """The server cannot do this at all (e.g. the simulated runtime has no data plane)."""

    reason = Reason.UNIMPLEMENTED


class GuestError(KiboError):
    """The guest could not do what was asked (e.g. a file it cannot write)."""

    reason = Reason.GUEST_ERROR


class GuestExhausted(GuestError):
    """The guest ran out of something (space on its file system, open files): RESOURCE_EXHAUSTED."""


class GuestPermissionDenied(GuestError):
    """The guest's own permissions refused (a file's mode), not the caller's: PERMISSION_DENIED."""
