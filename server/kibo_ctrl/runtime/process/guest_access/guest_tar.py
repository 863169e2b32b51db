"""Directories as tar streams in a guest: guest_files.py's "tar-out" and "untar" (standard
library only; run in guest_exec.py's child, inside the guest's root, as its root user).

- "tar-out" writes a directory as a POSIX pax stream itself (tarfile makes the headers): each
  regular file is opened O_NOFOLLOW and described by fstat of that descriptor, its data sent with
  sendfile, so what a header says is what follows; a file that shrank meanwhile ends the stream
  with an error (a truncated archive, never another file's bytes). Symlinks are stored as links
  and never followed, hard links as links, devices, FIFOs and sockets skipped.
- "untar" unpacks a stream into a staging directory inside the target, each entry checked before
  it is made: an absolute name or `..` refuses the upload, as does a hard link to what the
  archive did not make, a device or a FIFO; every directory on an entry's way is opened
  O_NOFOLLOW, so nothing is ever written through a symlink (one the archive made, or one the
  guest planted). Symlinks are made as written: they are the guest's, resolved in its tree. Once
  the whole stream is in and accepted (and committed), the staging directory is merged into the
  target; whatever happens it is removed (a refusal leaves nothing)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, BinaryIO, cast

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process.guest_access import guest_files
    from kibo_ctrl.runtime.process.guest_access.guest_files import CHUNK, Invalid, Names
else:
    import guest_files  # guest_exec.py put this directory on sys.path
    from guest_files import CHUNK, Invalid, Names

TAR_BLOCK = 512
TAR_RECORD = 20 * TAR_BLOCK
_text = guest_files._text
_write_all = guest_files._write_all


def tar_out(path: str, given: str) -> None:
    """The directory as a pax tar stream on stdout, written here (tarfile makes the headers):
    each regular file is opened O_NOFOLLOW and described by fstat of that descriptor, its data
    sent with sendfile; a file that shrank meanwhile ends the stream with an error (a truncated
    archive, never another file's bytes)."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    names = Names()
    guest_files._big_pipe(1)
    guest_files._write_line(guest_files.describe(given, st, "", names))
    written = 0
    links: dict[tuple[int, int], str] = {}
    pending: list[tuple[str, str]] = [(path, "")]
    while pending:
        directory, prefix = pending.pop()
        try:
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError:
            if not prefix:
                raise
            continue
        below: list[tuple[str, str]] = []
        for entry in entries:
            name = prefix + entry.name
            try:
                written += _tar_entry(entry, name, names, links)
            except FileNotFoundError:
                continue  # gone meanwhile
            if entry.is_dir(follow_symlinks=False):
                below.append((entry.path, name + "/"))
        pending.extend(reversed(below))
    end = b"\0" * (2 * TAR_BLOCK)
    written += len(end)
    _write_all(1, end + b"\0" * (-written % TAR_RECORD))


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _tar_entry(entry: os.DirEntry[str], name: str, names: Names, links: dict[tuple[int, int], str]) -> int:
    """One entry's header (and data); the bytes written. Special files are skipped."""
    st = entry.stat(follow_symlinks=False)
    info = tarfile.TarInfo(name)
    info.mtime = st.st_mtime
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname, info.gname = names.user(st.st_uid), names.group(st.st_gid)
    info.mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        return _write_all(1, _header(info))
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(entry.path)
        return _write_all(1, _header(info))
    if not stat.S_ISREG(st.st_mode):
        return 0
    try:
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO, errno.EACCES):
            return 0  # replaced by a symlink or a FIFO meanwhile, or not readable by the guest's root
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0
        os.set_blocking(fd, True)
        info.mode, info.mtime = stat.S_IMODE(st.st_mode), st.st_mtime
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in links:
            info.type, info.linkname = tarfile.LNKTYPE, links[key]
            return _write_all(1, _header(info))
        if st.st_nlink > 1:
            links[key] = name
        info.size = st.st_size
        written = _write_all(1, _header(info))
        sent = guest_files._send(fd, 0, st.st_size)
        if sent != st.st_size:
            raise OSError(errno.EIO, f"{name} shrank while it was archived")
        padding = -sent % TAR_BLOCK
        return written + sent + _write_all(1, b"\0" * padding)
    finally:
        os.close(fd)


def _parts(name: str, what: str) -> list[str]:
    """An archive name's components beneath the target: refused when absolute or with `..`."""
    if name.startswith("/"):
        raise Invalid(f"the archive's {what} {_text(name)!r} is an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise Invalid(f"the archive's {what} {_text(name)!r} leads out of the directory ('..')")
    return parts


def _open_dir(base: int, parts: list[str], make: bool) -> int:
    """The directory `parts` below `base`, each step opened O_NOFOLLOW (a symlink on the way
    is refused: nothing is written through one); made when missing if `make`."""
    fd = os.dup(base)
    try:
        for part in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Invalid(f"the archive writes through {_text(part)!r}, which is not a directory") from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _clear(parent: int, name: str, directory: bool) -> bool:
    """Make room for an entry: an earlier non-directory entry of that name goes (a later entry
    wins, as in tar); True when a directory is already there (kept for a directory)."""
    try:
        st = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        if not directory:
            raise Invalid(f"the archive puts a file over its directory {_text(name)!r}")
        return True
    os.unlink(name, dir_fd=parent)
    return False


def _extract(source: BinaryIO, stage: int) -> None:
    """Every entry of the stream beneath the staging directory, checked before it is made."""
    directories: list[tuple[list[str], int, float]] = []
    with tarfile.open(fileobj=source, mode="r|", bufsize=CHUNK, errors="surrogateescape") as tar:
        for member in tar:
            parts = _parts(member.name, "entry")
            if not parts:
                if member.isdir():
                    continue  # the target itself
                raise Invalid(f"the archive's entry {_text(member.name)!r} names no file")
            if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
                raise Invalid(f"the archive's {_text(member.name)!r} is a device or FIFO: not accepted")
            parent = _open_dir(stage, parts[:-1], make=True)
            name = parts[-1]
            try:
                exists = _clear(parent, name, member.isdir())
                if member.isdir():
                    if not exists:
                        os.mkdir(name, 0o700, dir_fd=parent)
                    directories.append((parts, member.mode & 0o777, member.mtime))
                elif member.issym():
                    os.symlink(member.linkname, name, dir_fd=parent)
                elif member.islnk():
                    _hard_link(stage, member.linkname, parent, name)
                else:
                    _extract_file(tar, member, parent, name)
            finally:
                os.close(parent)
    for parts, mode, mtime in reversed(directories):  # deepest last made first: contents are in
        fd = _open_dir(stage, parts, make=False)
        try:
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


def _hard_link(stage: int, linkname: str, parent: int, name: str) -> None:
    """A hard link to an earlier entry of the archive only (resolved beneath the staging
    directory without following a symlink)."""
    source = _parts(linkname, "hard link")
    if not source:
        raise Invalid(f"the archive's hard link {_text(name)!r} names no file")
    try:
        at = _open_dir(stage, source[:-1], make=False)
    except FileNotFoundError:
        raise Invalid(f"the archive's hard link to {_text(linkname)!r} is not to an earlier entry") from None
    try:
        os.link(source[-1], name, src_dir_fd=at, dst_dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise Invalid(f"the archive's hard link to {_text(linkname)!r} is not to an earlier entry") from None
    finally:
        os.close(at)


def _extract_file(tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    try:
        data = tar.extractfile(member)
        if data is not None:
            with data:
                while chunk := data.read(CHUNK):
                    _write_all(fd, chunk)
        os.fchmod(fd, member.mode & 0o777)  # no setuid, setgid or sticky bit from an upload
        os.utime(fd, (member.mtime, member.mtime))
    finally:
        os.close(fd)


def _conflicts(stage: int, target: int) -> None:
    """Before anything is moved in: a non-directory of the archive over a directory of the
    target is refused (EISDIR), so a merge that starts also ends."""
    for name in os.listdir(stage):
        staged = os.lstat(name, dir_fd=stage)
        try:
            there = os.lstat(name, dir_fd=target)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(there.st_mode) and not stat.S_ISDIR(staged.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"{os.strerror(errno.EISDIR)}: {_text(name)}")
        if stat.S_ISDIR(there.st_mode):
            with _dirs(stage, target, name) as (below_stage, below_target):
                _conflicts(below_stage, below_target)


@contextlib.contextmanager
def _dirs(stage: int, target: int, name: str) -> Iterator[tuple[int, int]]:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    below_stage = os.open(name, flags, dir_fd=stage)
    try:
        below_target = os.open(name, flags, dir_fd=target)
        try:
            yield below_stage, below_target
        finally:
            os.close(below_target)
    finally:
        os.close(below_stage)


def _merge(stage: int, target: int) -> None:
    """The staged entries moved into the target: renamed (replacing a file or symlink), a
    directory that exists on both sides merged into (its own mode kept)."""
    for name in os.listdir(stage):
        staged = os.lstat(name, dir_fd=stage)
        try:
            there: os.stat_result | None = os.lstat(name, dir_fd=target)
        except FileNotFoundError:
            there = None
        if there is not None and stat.S_ISDIR(there.st_mode) and stat.S_ISDIR(staged.st_mode):
            with _dirs(stage, target, name) as (below_stage, below_target):
                _merge(below_stage, below_target)
            continue
        if there is not None and stat.S_ISDIR(staged.st_mode):
            os.unlink(name, dir_fd=target)  # a file where the archive has a directory
        os.rename(name, name, src_dir_fd=stage, dst_dir_fd=target)


def untar(path: str, parents: bool, commit: Callable[[], None]) -> None:
    """stdin (a tar stream) unpacked under `path` (made if missing): into a staging directory
    inside it first, merged in once the whole stream is in and accepted; the staging directory
    goes whatever happens (a refusal, an error, SIGTERM)."""
    made = not os.path.lexists(path)
    if parents:
        os.makedirs(path, exist_ok=True)
    else:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    target = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    staging = f".kibo-untar-{os.getpid()}-{os.urandom(4).hex()}"
    done = False
    try:
        os.mkdir(staging, 0o700, dir_fd=target)
        try:
            stage = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target)
            try:
                guest_files._big_pipe(0)
                with os.fdopen(0, "rb", buffering=0, closefd=False) as source:
                    try:
                        _extract(cast(BinaryIO, source), stage)
                    except (tarfile.TarError, ValueError, UnicodeError) as error:
                        raise Invalid(f"not a valid tar stream: {error}") from None
                    while source.read(CHUNK):
                        pass  # what follows the archive's end (its padding): the writer must not block
                commit()
                _conflicts(stage, target)
                _merge(stage, target)
                done = True
            finally:
                os.close(stage)
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(staging, dir_fd=target)
    finally:
        os.close(target)
        if made and not done:
            with contextlib.suppress(OSError):
                os.rmdir(path)  # the directory it made for the upload (empty again)
