"""The guest's seccomp filter: an allow list of the system calls workspaces use.

The filter is built with libseccomp (the system's `libseccomp.so.2`, through ctypes: the
library every container runtime uses; it knows each architecture's call numbers and emits
the BPF) and exported as a BPF program file that the supervisor hands to bubblewrap
(`--seccomp FD`) and that guest_exec.py loads itself (`PR_SET_SECCOMP`) before it becomes
a guest process.

What it allows and refuses, and why, is data: seccomp_calls.py, which this module turns
into rules and nothing more. In short: Docker's default profile's calls, less the groups
seccomp_calls.py names, are allowed; the privileged calls workloads do try are refused with
EPERM (io_uring among them); `socket` and `socketpair` only for the families workspaces use
(else EAFNOSUPPORT, or EPROTONOSUPPORT for a netlink protocol); `clone` and `unshare` only
without namespace flags (else EPERM); `personality` with Docker's values only; any other
call (`clone3` included) gets ENOSYS, what a kernel without it answers, so libc falls back.
A call of another ABI (i386 through `int 0x80`, x32) kills the whole process
(SECCOMP_RET_KILL_PROCESS: a killed thread alone would leave its process running on).

A call allowed whatever its arguments costs nothing more than under the deny list this
replaced: since Linux 5.11 the kernel caches such calls in a bitmap and skips the BPF.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .seccomp_calls import (
    AF_NETLINK,
    ALLOWED,
    NAMESPACE_FLAGS,
    NETLINK_PROTOCOLS,
    PERSONALITIES,
    SOCKET_FAMILIES,
    SOCKETPAIR_FAMILIES,
    UNIMPLEMENTED,
    refused_names,
)

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ERRNO_BASE = 0x00050000
# What a call in no rule gets: ENOSYS, as from a kernel that lacks it.
DEFAULT_ACTION = SCMP_ACT_ERRNO_BASE | errno.ENOSYS
# What a call of another ABI (i386, x32) gets.
BAD_ARCH_ACTION = SCMP_ACT_KILL_PROCESS
SCMP_FLTATR_ACT_BADARCH = 2
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
SCMP_CMP_EQ = 4
SCMP_CMP_GT = 6
SCMP_CMP_MASKED_EQ = 7


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class SeccompUnavailable(RuntimeError):
    """libseccomp is not installed: the sandbox cannot have its filter."""


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise SeccompUnavailable("libseccomp is missing: apt-get install libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def resolve(name: str) -> int:
    """This machine's number of a call, or a negative number if its architecture has no such
    call (or the system's libseccomp does not know it)."""
    number: int = _library().seccomp_syscall_resolve_name(name.encode())
    return number


def known(name: str) -> bool:
    """Whether `name` is a call of x86-64 or aarch64, the architectures kibo runs on (the
    build skips a name this machine lacks, so a misspelt one would pass unnoticed)."""
    lib = _library()
    return any(
        lib.seccomp_syscall_resolve_name_arch(arch, name.encode()) >= 0
        for arch in (AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64)
    )


def _errno(code: int) -> int:
    return SCMP_ACT_ERRNO_BASE | code


def _eq(arg: int, value: int) -> _ArgCmp:
    return _ArgCmp(arg, SCMP_CMP_EQ, value, 0)


Add = Callable[..., None]


def _only(add: Add, name: str, arg: int, values: Iterable[int], refusal: int, *given: _ArgCmp) -> None:
    """Refuse `name` with `refusal` for every value of argument `arg` but `values` (where
    `given` holds). A rule compares an argument once: the values between the allowed ones
    one by one, those above them with one comparison."""
    allowed = set(values)
    for value in range(max(allowed)):
        if value not in allowed:
            add(name, _errno(refusal), *given, _eq(arg, value))
    add(name, _errno(refusal), *given, _ArgCmp(arg, SCMP_CMP_GT, max(allowed), 0))


def _rules(add: Add) -> None:
    """Every rule of the filter, from seccomp_calls.py's tables."""
    refused = refused_names()
    overlap = (set(ALLOWED) & set(refused)) | (set(UNIMPLEMENTED) & (set(ALLOWED) | set(refused)))
    if overlap:
        raise ValueError(f"seccomp: calls both allowed and refused: {sorted(overlap)}")
    for name in ALLOWED:
        add(name, SCMP_ACT_ALLOW)
    for name in refused:
        add(name, _errno(errno.EPERM))
    # UNIMPLEMENTED: no rule; the default refuses them.
    for family in SOCKET_FAMILIES:
        if family != AF_NETLINK:
            add("socket", SCMP_ACT_ALLOW, _eq(0, family))
    _only(add, "socket", 0, SOCKET_FAMILIES, errno.EAFNOSUPPORT)
    if AF_NETLINK in SOCKET_FAMILIES:
        for protocol in NETLINK_PROTOCOLS:
            add("socket", SCMP_ACT_ALLOW, _eq(0, AF_NETLINK), _eq(2, protocol))
        _only(add, "socket", 2, NETLINK_PROTOCOLS, errno.EPROTONOSUPPORT, _eq(0, AF_NETLINK))
    for family in SOCKETPAIR_FAMILIES:
        add("socketpair", SCMP_ACT_ALLOW, _eq(0, family))
    _only(add, "socketpair", 0, SOCKETPAIR_FAMILIES, errno.EAFNOSUPPORT)
    for name, mask in NAMESPACE_FLAGS:
        add(name, SCMP_ACT_ALLOW, _ArgCmp(0, SCMP_CMP_MASKED_EQ, mask, 0))
        for bit in (1 << i for i in range(mask.bit_length()) if mask >> i & 1):
            add(name, _errno(errno.EPERM), _ArgCmp(0, SCMP_CMP_MASKED_EQ, bit, bit))
    for persona in PERSONALITIES:
        add("personality", SCMP_ACT_ALLOW, _eq(0, persona))


def build() -> bytes:
    """The filter as a classic BPF program (struct sock_filter[]), for this machine's architecture."""
    lib = _library()
    ctx = lib.seccomp_init(DEFAULT_ACTION)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        result = lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, BAD_ARCH_ACTION)
        if result < 0:
            raise OSError(-result, f"seccomp bad-architecture action: {os.strerror(-result)}")

        def add(name: str, action: int, *conditions: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0 or action == DEFAULT_ACTION:
                # Not a call of this architecture (e.g. open on aarch64), or a rule that says
                # what the default says (which libseccomp refuses: EACCES).
                return
            array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
            result = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), array)
            if result < 0:
                raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")

        _rules(add)
        read, write = os.pipe()
        try:
            result = lib.seccomp_export_bpf(ctx, write)
            os.close(write)
            write = -1
            if result < 0:
                raise OSError(-result, f"seccomp_export_bpf: {os.strerror(-result)}")
            program = b""
            while chunk := os.read(read, 65536):
                program += chunk
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
        return program
    finally:
        lib.seccomp_release(ctx)


def write_filter(path: Path) -> Path:
    """Build the filter and store it at `path` (root-owned, read-only), for supervisors and jobs."""
    program = build()
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(program)
    tmp.chmod(0o444)
    os.replace(tmp, path)
    return path
