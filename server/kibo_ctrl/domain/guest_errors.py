"""How the data plane's file API answers an OS error met in the guest: one table, by errno.

guest_exec.py reports a failed read or write as {"status": "os-error", "errno": "ENOSPC", ...};
this is the one place that says what each errno means for the caller. The rule of thumb
(gRPC's code guidance): a request that could never succeed as written is INVALID_ARGUMENT
(a name too long); a request that would succeed were the guest's file system in another
state is FAILED_PRECONDITION (GUEST_ERROR: read-only, a directory where a file is wanted);
an exhausted resource is RESOURCE_EXHAUSTED (the file system is full); the guest's own file
permissions refusing is PERMISSION_DENIED (reason GUEST_ERROR: the credential was fine)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import (
    GuestError,
    GuestExhausted,
    GuestPermissionDenied,
    InvalidArgument,
    KiboError,
    NotFound,
)


@dataclass(frozen=True)
class ErrnoRule:
    error: type[KiboError]
    says: str  # what went wrong, for the message
    hint: str = ""


NAME_LIMITS = "a name is at most 255 bytes and a path at most 4095"
FULL = "free space in the workspace, or give it a larger volume"

ERRNO_RULES: dict[str, ErrnoRule] = {
    "ENOENT": ErrnoRule(NotFound, "not found", "a missing file, or a missing directory on its path"),
    "ENAMETOOLONG": ErrnoRule(InvalidArgument, "the path or a name in it is too long", NAME_LIMITS),
    "EINVAL": ErrnoRule(InvalidArgument, "not a valid file name in the guest's file system"),
    "EROFS": ErrnoRule(GuestError, "the file system is read-only", "write under a writable volume mount"),
    "EISDIR": ErrnoRule(GuestError, "is a directory", "give the path of a file"),
    "ENOTDIR": ErrnoRule(GuestError, "a component of the path is not a directory"),
    "ELOOP": ErrnoRule(GuestError, "too many levels of symbolic links"),
    "ETXTBSY": ErrnoRule(GuestError, "the file is a program that is running"),
    "EBUSY": ErrnoRule(GuestError, "the file or its directory is busy (a mount point?)"),
    "EIO": ErrnoRule(GuestError, "an I/O error in the guest's file system"),
    "EEXIST": ErrnoRule(GuestError, "it already exists", "remove it first (a directory: or make it with parents)"),
    "ENOTEMPTY": ErrnoRule(GuestError, "the directory is not empty", "remove it with recursive"),
    "EACCES": ErrnoRule(GuestPermissionDenied, "permission denied by the file's mode in the guest"),
    "EPERM": ErrnoRule(GuestPermissionDenied, "the operation is not permitted in the guest"),
    "ENOSPC": ErrnoRule(GuestExhausted, "no space left on the guest's file system", FULL),
    "EDQUOT": ErrnoRule(GuestExhausted, "the disk quota of the guest's file system is exhausted", FULL),
    "EFBIG": ErrnoRule(GuestExhausted, "the file would exceed the file system's size limit"),
    "EMFILE": ErrnoRule(GuestExhausted, "the guest has too many open files"),
    "ENFILE": ErrnoRule(GuestExhausted, "the guest has too many open files"),
    "ENOMEM": ErrnoRule(GuestExhausted, "the guest is out of memory"),
}
# Any other errno: the guest could not do it, with the system's own words.
DEFAULT = ErrnoRule(GuestError, "the guest could not do it")


def file_error(errno_name: str, path: str, detail: str, field: str = "path") -> KiboError:
    """The error for an OS error `errno_name` (e.g. "ENOSPC") on `path`, the request's `field`;
    `detail`: the OS's own text."""
    rule = ERRNO_RULES.get(errno_name, DEFAULT)
    says = rule.says if rule is not DEFAULT else f"{rule.says}: {detail}"
    message = f"{path}: {says} ({errno_name or 'unknown errno'})"
    return rule.error(message, field=field, hint=rule.hint)
