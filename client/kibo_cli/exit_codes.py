"""Exit codes of `kibo`: one table, shown in `kibo --help` and the README."""

from __future__ import annotations

from enum import IntEnum

import kibotos


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    INVALID_ARGUMENT = 5
    COMMAND_ID_REUSED = 6
    REVISION_MISMATCH = 7
    UNAVAILABLE = 8
    COMMAND_FAILED = 9
    WAIT_TIMEOUT = 10
    NOT_CONFIRMED = 11
    NOT_ALLOWED = 12
    LIMITED = 13
    CLEANUP_PARTIAL = 17
    CLEANUP_UNKNOWN = 18
    INTERRUPTED = 130


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.ERROR: "any other error",
    ExitCode.USAGE: "usage error (bad option or value; --yes missing where no terminal can confirm)",
    ExitCode.NOT_FOUND: "no such workspace, command or volume (NOT_FOUND)",
    ExitCode.CONFLICT: "the workspace's state does not allow it (FAILED_PRECONDITION, CONFLICT); see the hint",
    ExitCode.INVALID_ARGUMENT: "invalid request (INVALID_ARGUMENT, including a reserved command-ID prefix)",
    ExitCode.COMMAND_ID_REUSED: "command ID already used for another request (ALREADY_EXISTS)",
    ExitCode.REVISION_MISMATCH: "expiration revision mismatch (ABORTED); nothing changed",
    ExitCode.UNAVAILABLE: "server unreachable or a call timed out (UNAVAILABLE, DEADLINE_EXCEEDED)",
    ExitCode.COMMAND_FAILED: "the command ended FAILED (or the workspace waited for is FAILED)",
    ExitCode.WAIT_TIMEOUT: "gave up waiting (--timeout); the command goes on, nothing is cancelled",
    ExitCode.NOT_CONFIRMED: "not confirmed at the prompt; nothing was sent",
    ExitCode.NOT_ALLOWED: "no valid token, or the token may not do this (UNAUTHENTICATED, PERMISSION_DENIED)",
    ExitCode.LIMITED: "a quota would be exceeded, or over the request rate (QUOTA_EXCEEDED, RATE_LIMITED)",
    ExitCode.CLEANUP_PARTIAL: "cleanup-status: the observation is PARTIAL (unknown parts are not released)",
    ExitCode.CLEANUP_UNKNOWN: "cleanup-status: the observation is UNKNOWN",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C); a command already sent goes on",
}


# `kibo workspace exec` exits with the command's own exit code once the command ran.
EXEC_NOTE = (
    "kibo workspace exec exits with the command's own exit code; the codes above then mean kibo "
    "itself failed (it says so on stderr), 8 also when the connection broke while the command ran."
)


def table() -> str:
    rows = "\n".join(f"  {int(code):>3}  {MEANINGS[code]}" for code in ExitCode)
    return f"{rows}\n\n{EXEC_NOTE}"


def of(error: kibotos.KiboError) -> ExitCode:
    """The exit code for an SDK error."""
    if isinstance(error, kibotos.CommandFailedError):
        return ExitCode.COMMAND_FAILED
    if isinstance(error, kibotos.KiboTimeoutError):
        return ExitCode.WAIT_TIMEOUT
    by_class: tuple[tuple[type[kibotos.KiboError], ExitCode], ...] = (
        (kibotos.NotFoundError, ExitCode.NOT_FOUND),
        (kibotos.ConflictError, ExitCode.CONFLICT),
        (kibotos.InvalidArgumentError, ExitCode.INVALID_ARGUMENT),
        (kibotos.CommandIdReusedError, ExitCode.COMMAND_ID_REUSED),
        (kibotos.AbortedError, ExitCode.REVISION_MISMATCH),
        (kibotos.UnavailableError, ExitCode.UNAVAILABLE),
        (kibotos.DeadlineExceededError, ExitCode.UNAVAILABLE),
        (kibotos.UnauthenticatedError, ExitCode.NOT_ALLOWED),
        (kibotos.PermissionDeniedError, ExitCode.NOT_ALLOWED),
        (kibotos.QuotaExceededError, ExitCode.LIMITED),
        (kibotos.RateLimitedError, ExitCode.LIMITED),
    )
    return next((code for cls, code in by_class if isinstance(error, cls)), ExitCode.ERROR)
