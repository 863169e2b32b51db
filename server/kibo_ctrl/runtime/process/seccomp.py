"""The guest's seccomp filter: system calls no workspace needs and that reach past its sandbox.

The filter is built with libseccomp (the system's `libseccomp.so.2`, through ctypes: the
library every container runtime uses; it knows each architecture's call numbers, blocks
the x32 and i386 ABIs on x86-64 and emits the BPF) and exported as a BPF program file that
the supervisor hands to bubblewrap (`--seccomp FD`) and that guest_exec.py loads itself
(`PR_SET_SECCOMP`) before it becomes a guest process. Everything else is allowed; a
refused call fails with EPERM (ENOSYS for clone3, so that libc falls back to clone, whose
flags the filter can see).

Refused, and why (the guest runs as root of its own user namespace with no capabilities,
so most of these fail anyway: the filter is the second wall, and it shrinks the kernel
surface a hostile guest can poke at):

- `open_by_handle_at`, `name_to_handle_at`: file handles bypass the mount namespace (the
  "shocker" escape: a handle of an inode opens it wherever it is on that filesystem).
- `kexec_load`, `kexec_file_load`, `reboot`: replace or stop the host's kernel.
- `init_module`, `finit_module`, `delete_module`, `create_module`, `query_module`,
  `get_kernel_syms`: load or unload kernel code.
- `bpf`, `perf_event_open`, `userfaultfd`: kernel programs, host-wide profiling, and a
  primitive that most kernel exploits use to win races.
- `ptrace`, `process_vm_readv`, `process_vm_writev`, `kcmp`: inspect or change other
  processes (a guest cannot see outside processes in its PID namespace; data-plane jobs
  enter the guest from outside, and these calls would be the way to reach them).
- `mount`, `umount2`, `pivot_root`, `fsopen`, `fsconfig`, `fsmount`, `fspick`,
  `move_mount`, `open_tree`, `mount_setattr`: mounting new filesystems or moving mounts
  (each filesystem's mount code is kernel surface; the guest's mounts are set up for it).
- `unshare` and `clone` with CLONE_NEWUSER, `clone3` (ENOSYS), `setns`: new user
  namespaces give back a full capability set over new namespaces (the root of many kernel
  privilege escalations); entering namespaces is the data plane's job, from outside.
- `swapon`, `swapoff`, `acct`, `quotactl`, `quotactl_fd`, `nfsservctl`, `syslog`,
  `lookup_dcookie`, `vhangup`, `uselib`, `_sysctl`, `iopl`, `ioperm`: host administration,
  the kernel log, raw I/O ports.
- `settimeofday`, `clock_settime`, `clock_adjtime`, `adjtimex`: the host's clock.
- `add_key`, `request_key`, `keyctl`: the kernel keyring is not namespaced.
- `personality` is left alone (libc and some tools set it); 32-bit ABIs are refused as a
  whole (libseccomp kills a process that uses another architecture's calls).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

# Calls refused with EPERM (see the module docstring for why each).
REFUSED = (
    "open_by_handle_at",
    "name_to_handle_at",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "setns",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "syslog",
    "lookup_dcookie",
    "vhangup",
    "uselib",
    "_sysctl",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "add_key",
    "request_key",
    "keyctl",
)
# Calls refused only with this flag in their first argument (the flags of unshare and clone).
REFUSED_WITH_FLAG = (("unshare", 0x10000000), ("clone", 0x10000000))  # CLONE_NEWUSER
# Calls refused with ENOSYS: libc then falls back to a call the filter can inspect.
UNIMPLEMENTED = ("clone3",)

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO_BASE = 0x00050000
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
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def build() -> bytes:
    """The filter as a classic BPF program (struct sock_filter[]), for this machine's architecture."""
    lib = _library()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:

        def add(name: str, action: int, *conditions: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return  # not a call of this architecture (e.g. create_module on newer ABIs)
            array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
            result = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), array)
            if result < 0:
                raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")

        for name in REFUSED:
            add(name, SCMP_ACT_ERRNO_BASE | errno.EPERM)
        for name, flag in REFUSED_WITH_FLAG:
            add(name, SCMP_ACT_ERRNO_BASE | errno.EPERM, _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
        for name in UNIMPLEMENTED:
            add(name, SCMP_ACT_ERRNO_BASE | errno.ENOSYS)
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
