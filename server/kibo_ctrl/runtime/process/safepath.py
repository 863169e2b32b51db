"""File operations inside a guest's tree that cannot be led out of it (standard library only).

A guest owns its writable layer and its volumes: any name in them may be a symlink the
guest planted (`/etc/hosts -> /host/path`, `/var -> /`). Whatever the control plane or the
supervisor does in such a tree (as host root) goes through here:

- `open_beneath`: openat2(2) with RESOLVE_IN_ROOT (every absolute symlink and `..` is
  resolved as if the tree were `/`, so nothing resolves outside it) and
  RESOLVE_NO_MAGICLINKS (no /proc/PID/fd-style jumps); Python has no os.openat2, so it is
  the raw system call through ctypes.
- `make_dirs`, `create_file`, `create_symlink`: create what is missing, never replacing and
  never following what the guest put at the last component (O_EXCL|O_NOFOLLOW, mkdirat,
  symlinkat on a directory fd resolved beneath the root), owned by the guest's mapped ids.
- `guest_file_path`: the data plane's rule for file API paths (absolute, no NUL, no `..`
  escaping, under a volume mount), shared by data_plane.py and guest_exec.py.

guest_exec.py imports this file by path (it runs with `python -I -S`), hence no imports
from the package here."""

from __future__ import annotations

import ctypes
import os
import posixpath

SYS_OPENAT2 = 437  # x86-64, aarch64 and every other architecture since Linux 5.6
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class UnsafePath(ValueError):
    """A path that is not acceptable (see `guest_file_path`)."""


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = RESOLVE_IN_ROOT) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    fd = int(_libc.syscall(SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def open_beneath(root_fd: int, path: str, flags: int, mode: int = 0, *, no_symlinks: bool = False) -> int:
    """Open `path` (relative to, and never outside, the tree of `root_fd`)."""
    resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | (RESOLVE_NO_SYMLINKS if no_symlinks else 0)
    return openat2(root_fd, path.lstrip("/") or ".", flags, mode, resolve)


def open_root(path: str) -> int:
    """A directory fd on a tree's root (the root itself is ours: a symlink there is refused)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _parent(root_fd: int, path: str) -> tuple[int, str]:
    parent, name = posixpath.split(posixpath.normpath("/" + path.lstrip("/")))
    if not name or name in (".", ".."):
        raise UnsafePath(f"{path!r} names no entry")
    return open_beneath(root_fd, parent, os.O_RDONLY | os.O_DIRECTORY), name


def make_dirs(root_fd: int, path: str, mode: int = 0o755, owner: tuple[int, int] | None = None) -> bool:
    """mkdir -p beneath the root; a component the guest made a symlink is resolved in its
    tree. False (nothing more made) where the guest put something that leads nowhere: its
    tree, its choice."""
    done = ""
    for part in [p for p in path.split("/") if p]:
        if part == "..":
            raise UnsafePath(f"{path!r}: '..' is not allowed here")
        try:
            dir_fd, name = _parent(root_fd, f"{done}/{part}")
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
        else:
            if owner is not None:
                os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(dir_fd)
        done = f"{done}/{part}"
    return True


def create_file(root_fd: int, path: str, content: bytes, owner: tuple[int, int] | None = None) -> bool:
    """Create `path` with `content` unless something (even a dangling symlink) is there
    already, or its directory is not there (the guest's choice)."""
    try:
        dir_fd, name = _parent(root_fd, path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        try:
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
            )
        except FileExistsError:
            return False
        try:
            os.write(fd, content)
            if owner is not None:
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
        return True
    finally:
        os.close(dir_fd)


def create_symlink(root_fd: int, path: str, target: str, owner: tuple[int, int] | None = None) -> bool:
    """Create the symlink `path -> target` unless `path` exists (a symlink is never followed)."""
    try:
        dir_fd, name = _parent(root_fd, path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        try:
            os.symlink(target, name, dir_fd=dir_fd)
        except FileExistsError:
            return False
        if owner is not None:
            os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)
        return True
    finally:
        os.close(dir_fd)


def guest_file_path(path: str, mounts: list[str]) -> str:
    """The data plane's file API rule: an absolute guest path, without NUL, that stays under
    one of `mounts` once `.` and `..` are resolved. Returns the normalised path."""
    if not path.startswith("/") or "\0" in path:
        raise UnsafePath(f"path {path!r} is not under a volume mount ({', '.join(mounts)})")
    clean = posixpath.normpath(path)
    if not any(clean.startswith(m.rstrip("/") + "/") for m in mounts):
        raise UnsafePath(f"path {path!r} is not under a volume mount ({', '.join(mounts)})")
    return clean
