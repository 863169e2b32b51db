"""The data plane's errors, shared by its handlers (data_plane.py, data_plane_processes.py,
data_plane_files.py): a running call's end at a revoke, and the caller's error for a guest job
or process the runtime refused (GuestRefused: its status, then its errno for OS errors)."""

from __future__ import annotations

import logging
import secrets

from ..domain.errors import (
    Conflict,
    GuestError,
    InvalidArgument,
    KiboError,
    NotFound,
    QuotaExceeded,
    Unauthenticated,
    Unavailable,
)
from ..domain.guest_errors import file_error
from ..runtime.base import MAX_GUEST_PROCESSES, MAX_UPLOADS, GuestRefused
from .data_plane_sessions import Session

log = logging.getLogger(__name__)

# A refusal's status -> the error about the request's field it concerns.
ABOUT_THE_FIELD: dict[str, type[KiboError]] = {
    "invalid": InvalidArgument,
    "not-found": NotFound,
    "conflict": Conflict,
}


def revoked(session: Session) -> Unauthenticated:
    """A running call's end when its credential is revoked (revoke, stop, force stop, delete)."""
    return Unauthenticated(
        f"the credential was revoked while the call ran ({session.why}): its command was killed",
        field="credential",
        hint="request a new credential (IssueDataPlaneCredential) while the workspace is AVAILABLE",
    )


def refused(refused: GuestRefused, path: str, field: str) -> KiboError:
    """The error for a job that could not run; `path` and `field`: what an OS error is about
    (the file of a read or write, the working directory of an exec)."""
    if refused.status == "unavailable":
        return Unavailable(str(refused))
    if refused.status in ABOUT_THE_FIELD:
        return ABOUT_THE_FIELD[refused.status](str(refused), field=field)
    if refused.status == "os-error":
        return file_error(refused.errno, path, str(refused), field)
    if refused.status == "limit":
        # The guest processes' table names its cap in `errno`: "processes" or "uploads".
        quota, limit = ("uploads", MAX_UPLOADS) if refused.errno == "uploads" else ("processes", MAX_GUEST_PROCESSES)
        return QuotaExceeded(str(refused), quota=f"workspace_{quota}", limit=limit, used=limit, requested=1)
    # Entering the guest failed, or the job died (e.g. killed by the guest's memory limit):
    # the detail names host paths, so it goes to the log, not to the caller.
    incident = secrets.token_hex(6)
    log.warning("data-plane job failed (incident %s): %s: %s", incident, refused.status, refused)
    return GuestError(
        f"the job in the guest failed or was killed (incident {incident})",
        hint="retry; if it persists, the server log has the cause under this incident ID",
    )
