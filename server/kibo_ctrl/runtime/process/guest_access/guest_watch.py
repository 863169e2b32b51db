"""Watching a directory in a guest: guest_files.py's "watch" (standard library only; run in
guest_exec.py's child, inside the guest's root, as its root user).

inotify through ctypes. {"ready": true} once the watches are in place, then a JSON line per
change: {"type": create|write|remove|rename|chmod, "path", "new_path", "dir"}. A rename's two
halves are paired by their cookie (a half left alone: moved out of the watch, "new_path" empty;
moved in: a create). Recursive: every directory below is watched (never through a symlink), and
a new one as it comes, its entries made before its watch was in place told as created (one may
then be told twice). Consecutive writes to a file in one read of events are told once. When the
kernel's queue overflowed (a client that does not read holds this process back, and the queue
fills), {"overflow": true}. It runs until killed, or until the watched directory is gone."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import posixpath
import select
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process.guest_access import guest_files
else:
    import guest_files  # guest_exec.py put this directory on sys.path

_text = guest_files._text
_write_all = guest_files._write_all
# How long a rename's first half waits for its second (they come together, but may straddle a read).
RENAME_PAIR_S = 0.01

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_CLOEXEC = 0o2000000
WATCHED = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
EVENT = struct.Struct("iIII")
# One read of events: the kernel's queue (16,384 by default) overflows rather than this process.
EVENTS_READ = 1 << 16

_libc = ctypes.CDLL(None, use_errno=True)


class _Watcher:
    """inotify through ctypes: watch descriptors by path, the changes as JSON lines."""

    def __init__(self, root: str, shown: str, recursive: bool) -> None:
        fd = _libc.inotify_init1(IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.fd = int(fd)
        self.recursive = recursive
        # The host-side path prefix (with isolation "none") and the one shown.
        self.root, self.shown = root, posixpath.normpath(shown)
        self.paths: dict[int, str] = {}  # wd -> shown path
        self.root_wd = self._add(self.shown, IN_ONLYDIR)
        self.out: list[bytes] = []

    def _opened(self, shown: str) -> str:
        return self.root + shown[len(self.shown) :]

    def _add(self, shown: str, flags: int = IN_ONLYDIR | IN_DONT_FOLLOW) -> int:
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(self._opened(shown)), WATCHED | IN_EXCL_UNLINK | flags)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch: {os.strerror(ctypes.get_errno())}")
        self.paths[int(wd)] = shown
        return int(wd)

    def add_tree(self, shown: str, announce: bool) -> None:
        """Watches on the directories below `shown` (never through a symlink); `announce`: a
        directory new to the watch, whose entries made before its watch are told as created."""
        pending = [shown]
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(self._opened(directory)) as scan:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in scan]
            except OSError:
                continue
            for name, is_dir in entries:
                below = posixpath.join(directory, name)
                if announce:
                    self.emit("create", below, "", is_dir)
                if is_dir:
                    try:
                        self._add(below)
                    except OSError as error:
                        if error.errno in (errno.ENOSPC, errno.ENOMEM):
                            raise
                        continue  # gone meanwhile, or not a directory any more
                    pending.append(below)

    def emit(self, kind: str, path: str, new_path: str, is_dir: bool) -> None:
        line = json.dumps({"type": kind, "path": _text(path), "new_path": _text(new_path), "dir": is_dir})
        self.out.append(line.encode() + b"\n")

    def flush(self) -> None:
        if self.out:
            _write_all(1, b"".join(self.out))
            self.out.clear()

    def events(self, data: bytes) -> Iterator[tuple[int, int, int, str]]:
        at = 0
        while at + EVENT.size <= len(data):
            wd, mask, cookie, length = EVENT.unpack_from(data, at)
            raw = data[at + EVENT.size : at + EVENT.size + length].split(b"\0", 1)[0]
            at += EVENT.size + length
            yield wd, mask, cookie, os.fsdecode(raw)

    def moved(self, old: str, new: str) -> None:
        """A directory renamed inside the watch: its watches' paths follow."""
        for wd, path in list(self.paths.items()):
            if path == old or path.startswith(old + "/"):
                self.paths[wd] = new + path[len(old) :]

    def forget(self, old: str) -> None:
        """A directory moved out of the watch: its watches go."""
        for wd, path in list(self.paths.items()):
            if wd != self.root_wd and (path == old or path.startswith(old + "/")):
                _libc.inotify_rm_watch(self.fd, wd)
                self.paths.pop(wd, None)

    def run(self) -> None:
        pending: tuple[int, str, bool] | None = None  # a rename's first half: cookie, path, dir
        while True:
            if pending is not None and not select.select([self.fd], [], [], RENAME_PAIR_S)[0]:
                self._moved_out(*pending)
                pending = None
                self.flush()
                continue
            try:
                data = os.read(self.fd, EVENTS_READ)
            except InterruptedError:
                continue
            for wd, mask, cookie, name in self.events(data):
                if mask & IN_Q_OVERFLOW:
                    self.out.append(b'{"overflow": true}\n')
                    continue
                base = self.paths.get(wd)
                if mask & IN_IGNORED:
                    self.paths.pop(wd, None)
                    if wd == self.root_wd:
                        if pending is not None:
                            self._moved_out(*pending)
                        self.flush()
                        return  # the watched directory is gone: so is the watch
                    continue
                if base is None or mask & IN_DELETE_SELF:
                    continue
                path = posixpath.join(base, name) if name else base
                is_dir = bool(mask & IN_ISDIR)
                if pending is not None and not (mask & IN_MOVED_TO and cookie == pending[0]):
                    self._moved_out(*pending)
                    pending = None
                if mask & IN_MOVED_FROM:
                    pending = (cookie, path, is_dir)
                elif mask & IN_MOVED_TO:
                    if pending is not None:
                        self.emit("rename", pending[1], path, is_dir)
                        if is_dir:
                            self.moved(pending[1], path)
                        pending = None
                    else:
                        self.emit("create", path, "", is_dir)  # moved in from outside
                        if is_dir and self.recursive:
                            self._new_directory(path)
                elif mask & IN_CREATE:
                    self.emit("create", path, "", is_dir)
                    if is_dir and self.recursive:
                        self._new_directory(path)
                elif mask & IN_DELETE:
                    self.emit("remove", path, "", is_dir)
                elif mask & IN_MODIFY:
                    if not self.out or self.out[-1] != self._line("write", path, is_dir):
                        self.emit("write", path, "", is_dir)  # one per burst of writes
                elif mask & IN_ATTRIB:
                    self.emit("chmod", path, "", is_dir)
            self.flush()

    def _line(self, kind: str, path: str, is_dir: bool) -> bytes:
        return json.dumps({"type": kind, "path": _text(path), "new_path": "", "dir": is_dir}).encode() + b"\n"

    def _moved_out(self, cookie: int, path: str, is_dir: bool) -> None:
        self.emit("rename", path, "", is_dir)
        if is_dir:
            self.forget(path)

    def _new_directory(self, path: str) -> None:
        try:
            self._add(path)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.ENOMEM):
                raise
            return
        self.add_tree(path, announce=True)


def watch(path: str, given: str, recursive: bool) -> None:
    watcher = _Watcher(path, given, recursive)
    if recursive:
        watcher.add_tree(watcher.shown, announce=False)
    _write_all(1, b'{"ready": true}\n')
    watcher.run()
