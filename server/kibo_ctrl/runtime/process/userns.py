"""Kernel mechanics of the guest's user namespace and of giving up privileges (standard library only).

`GuestNamespace(base, count)` makes a new user namespace whose ids 0..count-1 are the
host's base..base+count-1 (a helper process unshares, this one writes its uid_map and
gid_map as host root, the helper exits, a file descriptor keeps the namespace).
Rootless (the control plane is not root): `GuestNamespace(uid, 1, gid)` maps only this
user's own uid and gid to the guest's 0, which the kernel allows an unprivileged user once
setgroups(2) is denied in the namespace (so the guest keeps this user's supplementary
groups: `become_root(keep_groups=True)`).

`GuestNamespace.enter`, run in the child between fork and exec of bubblewrap: join the
namespace, become its root (host uid `base`), keep the capabilities bwrap needs for its
mounts only *inside* that namespace, and empty the bounding set first, so that no process
started from there can ever hold a capability again. The namespace's
`user.max_user_namespaces` is set to 0: no nested user namespace.

`drop_privileges` and `load_seccomp` are what a data-plane job does before it becomes a
guest process (guest_exec.py): no capabilities, no_new_privs, the guest's seccomp filter.

supervisor.py and guest_exec.py import this file by path (they run with `python -I -S`)."""

from __future__ import annotations

import ctypes
import os
import struct
from types import TracebackType

CLONE_NEWUSER = 0x10000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def last_cap() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())


class GuestNamespace:
    def __init__(self, base: int, count: int, gid_base: int | None = None) -> None:
        self.base, self.count = base, count
        self.gid_base = base if gid_base is None else gid_base
        # Not root: only our own ids can be mapped, and only with setgroups denied.
        self.rootless = os.geteuid() != 0
        self.fd = -1

    def __enter__(self) -> GuestNamespace:
        self.create()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def create(self) -> int:
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                os.close(done_w)
                _check(_libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
                os.write(ready_w, b"u")
                os.read(done_r, 1)  # until the parent holds the namespace
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(done_r)
        try:
            if os.read(ready_r, 1) != b"u":
                raise OSError(f"unshare(CLONE_NEWUSER) failed: {userns_blocker()}")
            if self.rootless:
                with open(f"/proc/{pid}/setgroups", "w") as f:
                    f.write("deny")
            for name, base in (("uid_map", self.base), ("gid_map", self.gid_base)):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(f"0 {base} {self.count}\n")
            self.fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(ready_r)
            os.close(done_w)
            os.waitpid(pid, 0)
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def enter(self) -> None:
        """In a forked child, before exec of bwrap (see the module docstring)."""
        if not self.joined():  # a rootless supervisor is in it already (join)
            _check(_libc.setns(self.fd, CLONE_NEWUSER), "setns(user)")
        become_root(keep_groups=self.rootless)
        # Permitted -> inheritable, so that the exec of bwrap as this namespace's root gets
        # them back (root's exec: inheritable & all); the empty bounding set then keeps
        # every later exec, the guest's, from ever gaining one.
        header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()
        _check(_libc.capget(header, data), "capget")
        data[2], data[5] = data[1], data[4]
        _check(_libc.capset(header, data), "capset")
        for cap in range(last_cap() + 1):
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "PR_CAPBSET_DROP")
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")

    def joined(self) -> bool:
        """Whether this process is in the namespace."""
        return os.fstat(self.fd).st_ino == os.stat("/proc/self/ns/user").st_ino

    def join(self) -> None:
        """Enter the namespace for good, keeping our uid (its root) and gaining its
        capabilities (none on the host): what a rootless supervisor does before it mounts its
        stage tmpfs, since an unprivileged user may mount only in a namespace of its own."""
        _check(_libc.setns(self.fd, CLONE_NEWUSER), "setns(user)")


# Where the kernel (or a security module) switches off unprivileged user namespaces, and
# how to switch them on: (file, value that blocks, the fix).
USERNS_SWITCHES = (
    ("/proc/sys/kernel/unprivileged_userns_clone", "0", "sysctl -w kernel.unprivileged_userns_clone=1"),
    ("/proc/sys/user/max_user_namespaces", "0", "sysctl -w user.max_user_namespaces=15000"),
    (
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
        "1",
        "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile allowing userns for python3)",
    ),
)


def userns_blocker() -> str:
    """Why this user cannot make a user namespace, and the fix (a sentence)."""
    return userns_switched_off() or (
        "user namespaces do not work here (a container without CLONE_NEWUSER, or a seccomp or LSM policy)"
    )


def userns_switched_off() -> str:
    """Which switch of USERNS_SWITCHES is off, and the fix; "" if none is."""
    for path, blocking, fix in USERNS_SWITCHES:
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value == blocking:
            name = path.removeprefix("/proc/sys/").replace("/", ".")
            return (
                f"unprivileged user namespaces are disabled ({name} = {value}): "
                f"run `{fix}` as root, or run kibo-ctrl as root"
            )
    return ""


SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
AT_EMPTY_PATH = 0x1000
MOUNT_ATTR_IDMAP = 0x00100000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _syscall(number: int, *args: object) -> int:
    result = int(_libc.syscall(number, *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def idmapped_clone(path: str, userns_fd: int) -> int:
    """A detached copy of the mount at `path` whose files' ids are shifted by the user
    namespace's mapping (host 0 appears as the namespace's root): an idmapped mount."""
    tree = _syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(path), OPEN_TREE_CLONE | os.O_CLOEXEC)
    attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    try:
        _syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr))
    except OSError:
        os.close(tree)
        raise
    return tree


def move_mount(tree: int, target: str) -> None:
    """Attach a detached mount (from idmapped_clone) at `target`; closes `tree`."""
    try:
        _syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(tree)


NS_GET_NSTYPE = 0xB703


def is_user_namespace(fd: int) -> bool:
    """Whether `fd` is a namespace file descriptor of a user namespace."""
    import fcntl

    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWUSER
    except OSError:
        return False


def become_root(keep_groups: bool = False) -> None:
    """Become uid/gid 0 of the user namespace just joined (host: its base id), no groups
    (rootless, `keep_groups`: setgroups is denied there, the groups stay the user's)."""
    if not keep_groups:
        os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)


def drop_privileges() -> None:
    """No capability in any set, an empty bounding set, no_new_privs."""
    for cap in range(last_cap() + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


def load_seccomp(program: bytes) -> None:
    """Install a classic BPF seccomp filter (struct sock_filter[], as seccomp.py exports it)."""
    count = len(program) // 8
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxP", count, ctypes.addressof(buffer))
    prog = ctypes.create_string_buffer(fprog)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0), "PR_SET_SECCOMP")
