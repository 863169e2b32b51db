"""The guest's user namespace: which unprivileged host uids/gids a guest's ids map to.

Every guest runs in its own user namespace whose ids 0..count-1 are the host's
base..base+count-1 (a subordinate range of this node, like /etc/subuid; default 100000 +
65536, `--guest-id-base`). The guest's root is host uid `base`: no host file is its own,
and no capability it holds in its namespace counts on the host. The range is recorded in
each instance's spec.json (`host_id_base`, `host_id_count`) for the supervisor, the data
plane's jobs and the storage code (which makes the root of a volume's image owned by
`base`). Standard library only: supervisor.py imports it by path.

A layer or volume made before the guests had their own ids (owned by real root) is shifted
once into the range (`shift_tree`, by the supervisor before the guest starts, on the
mounted image or the plain directory): lchown through directory fds, never following a
symlink, and a file with hard links outside the tree is left alone (the guest might have
linked a host file in). A `trusted.` extended attribute on the tree's root (which only host
root can set: not the guest) says which range it is in; where the filesystem has no such
attributes, a marker file next to the tree does."""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_BASE = 100000
DEFAULT_COUNT = 65536
NOBODY = 65534


@dataclass(frozen=True)
class IdRange:
    base: int = DEFAULT_BASE
    count: int = DEFAULT_COUNT

    def __post_init__(self) -> None:
        if self.base < 1 or self.count < 1 or self.base + self.count > 2**32 - 1:
            raise ValueError(f"guest id range {self.base}+{self.count}: the base must be above 0 (root)")
        if self.count <= NOBODY:
            raise ValueError(f"guest id range {self.base}+{self.count}: at least {NOBODY + 1} ids (nobody)")

    @property
    def root(self) -> tuple[int, int]:
        """The host uid and gid of the guest's root."""
        return self.base, self.base

    def map_line(self) -> str:
        """The uid_map / gid_map line: guest 0..count-1 -> host base..base+count-1."""
        return f"0 {self.base} {self.count}\n"

    def shift(self, host_id: int) -> int:
        """The in-range host id of a file owned by `host_id` (already in range: itself)."""
        if self.base <= host_id < self.base + self.count:
            return host_id
        return self.base + (host_id if host_id < self.count else NOBODY)


MARK = "trusted.kibo.idmap"


def _marker(tree: Path) -> Path:
    return tree.parent / f".{tree.name}.idmap"


def _mark_value(ids: IdRange) -> bytes:
    return f"{ids.base}:{ids.count}".encode()


def shifted(tree: Path, ids: IdRange) -> bool:
    try:
        return os.getxattr(tree, MARK, follow_symlinks=False) == _mark_value(ids)
    except OSError:
        pass
    try:
        return bool(json.loads(_marker(tree).read_text()) == {"base": ids.base, "count": ids.count})
    except (OSError, ValueError):
        return False


def _mark(tree: Path, ids: IdRange) -> None:
    try:
        os.setxattr(tree, MARK, _mark_value(ids), follow_symlinks=False)
    except OSError:
        _mark(tree, ids)


def shift_tree(tree: Path, ids: IdRange) -> None:
    """Chown every entry of `tree` into `ids` once (see the module docstring). The guest of
    this tree must not run. Blocking."""
    if shifted(tree, ids):
        return
    linked: dict[tuple[int, int], list[tuple[int, str]]] = {}
    root_fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        _shift_entry(root_fd, ".", ids, linked)
        for _dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root_fd, follow_symlinks=False):
            for name in dirnames + filenames:
                _shift_entry(dir_fd, name, ids, linked)
        # Hard links: shift a file only if every one of its links is in this tree.
        for entries in linked.values():
            first_dir, first_name = entries[0]
            try:
                info = os.stat(first_name, dir_fd=first_dir, follow_symlinks=False)
            except OSError:
                continue
            if info.st_nlink == len(entries):
                os.chown(
                    first_name, ids.shift(info.st_uid), ids.shift(info.st_gid), dir_fd=first_dir, follow_symlinks=False
                )
            else:
                log.warning("%s: a file with links outside the tree keeps its owner", tree)
        for entries in linked.values():
            for dir_fd, _ in entries:
                os.close(dir_fd)
    finally:
        os.close(root_fd)
    _mark(tree, ids)


def _shift_entry(dir_fd: int, name: str, ids: IdRange, linked: dict[tuple[int, int], list[tuple[int, str]]]) -> None:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1:
        # Decided once all links are counted; keep the directory open until then.
        linked.setdefault((info.st_dev, info.st_ino), []).append((os.dup(dir_fd), name))
        return
    uid, gid = ids.shift(info.st_uid), ids.shift(info.st_gid)
    if (uid, gid) != (info.st_uid, info.st_gid):
        # chown clears set-uid/set-gid bits: a guest's setuid file stays one only for its owner.
        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
