"""Files anywhere in a guest: the file modes of guest_exec.py (standard library only).

guest_exec.py enters the guest (its cgroup, its namespaces, its root, its root user with no
capability, its seccomp filter), forks, and the child runs one of these with the job's paths.
Every path is opened there, inside the guest's root: a symlink, `..` or an absolute name can
only lead to another place in the guest's own tree, never to the host's. With `--sandbox none`
(no namespaces: guest paths are host paths) the volume-mount rule of today's ReadWorkspaceFile
stays (safepath.guest_file_path, `paths`), so nothing outside the workspace's volumes is reached.

The modes, each writing on stdout (the status line says how it ended; an OSError is reported as
"os-error" with its errno, `Invalid` as "invalid"):

- "stat": one JSON line describing the path (lstat: a symlink is described, not followed);
- "list": a JSON line per entry, breadth first, `depth` levels down, never into a symlinked
  directory; at most MAX_ENTRIES entries and MAX_LIST_BYTES of lines, then {"truncated": true};
- "mkdir", "move", "remove": nothing on stdout;
- "read" with "anywhere": a JSON line describing the file opened, then its bytes from `offset`
  (described and read through the same descriptor: what is described is what is sent);
- "tar-out": a JSON line describing the directory, then the directory as a POSIX pax tar
  stream (guest_tar.py: symlinks stored as links, hard links as links, special files skipped);
- "write" with "anywhere" (an upload): stdin into a new file beside the target, renamed over it
  at the end (whole or not at all);
- "untar": a tar stream on stdin unpacked under a directory (guest_tar.py: entries checked
  before they are made, in a staging directory merged in at the end: a refusal leaves nothing);
- "watch": inotify (guest_watch.py): {"ready": true}, then a JSON line per change; it runs
  until killed.

An upload ("write" and "untar") is put in place once stdin has ended and, with "commit", once
SIGUSR1 came (the server's finish: the end of stdin alone is also what a server that died
leaves). SIGTERM (a cancel) ends it with what it made removed, exit code 128 + 15. Its errors
are also written to stderr as a status line: an upload's status goes through the process
table, which keeps its output."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import posixpath
import shutil
import signal
import stat
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process import safepath
else:
    import safepath  # guest_exec.py put runtime/process/ on sys.path

# Everything is imported before guest_exec.py enters the guest's root (where the host's
# files, this interpreter's library among them, are not): no import may wait until a use.

# The modes of this module; "read" and "write" are its own only with "anywhere" (else the
# mount-only read and write of ReadWorkspaceFile and WriteWorkspaceFile, in guest_exec.py).
MODES = ("stat", "list", "mkdir", "move", "remove", "tar-out", "untar", "watch")
ANYWHERE_MODES = ("read", "write")
# Uploads: they end cleanly on SIGTERM.
UPLOADS = ("write", "untar")
# A listing's bounds: entries, and the bytes of its lines (the answer must fit a 4 MiB message).
MAX_ENTRIES = 10_000
MAX_LIST_BYTES = 3 << 20
MAX_DEPTH = 32
# One read or write of file data (a pipe of this size is asked for: fewer wake-ups each way).
CHUNK = 1 << 20
# Of /etc/passwd and /etc/group, at most this much is read (names are a convenience).
MAX_NAMES_BYTES = 1 << 20
F_SETPIPE_SZ = 1031
AT_FDCWD = -100
RENAME_EXCHANGE = 2
F_GETPIPE_SZ = 1032
EXIT_CANCELLED = 128 + signal.SIGTERM
# An upload with "commit" is put in place when this signal comes after the end of stdin.
COMMIT = signal.SIGUSR1

_libc = ctypes.CDLL(None, use_errno=True)


class Invalid(Exception):
    """A request the guest's tree cannot take as given (reported "invalid")."""


class Cancelled(BaseException):
    """SIGTERM: the upload is abandoned."""


def handles(job: dict[str, Any]) -> bool:
    mode = job.get("mode")
    return mode in MODES or (mode in ANYWHERE_MODES and bool(job.get("anywhere")))


def path_keys(job: dict[str, Any]) -> tuple[str, ...]:
    return ("source", "destination") if job.get("mode") == "move" else ("path",)


def paths(job: dict[str, Any], spec: dict[str, Any]) -> dict[str, str]:
    """The job's paths as the child opens them. In a guest's namespaces: as given (absolute, no
    NUL), resolved by the kernel inside the guest's root. With isolation "none": only under a
    volume mount (a directory-wide mode may name the mount itself), mapped to its host path."""
    found: dict[str, str] = {}
    mounts = {guest: host for host, guest in spec["mounts"]}
    for key in path_keys(job):
        path = str(job.get(key) or "")
        if not path.startswith("/") or "\0" in path:
            raise Invalid(f"{key}: {path!r} is not an absolute path")
        if spec["isolation"] != "none":
            found[key] = path
            continue
        clean = posixpath.normpath(path)
        whole = job.get("mode") in ("stat", "list", "tar-out", "untar", "watch")
        mount = next((m for m in mounts if whole and clean == m.rstrip("/")), None)
        if mount is None:
            try:
                clean = safepath.guest_file_path(path, list(mounts))
            except safepath.UnsafePath as error:
                raise Invalid(f"{key}: {error}") from None
            mount = next(m for m in mounts if clean.startswith(m.rstrip("/") + "/"))
        found[key] = mounts[mount] + clean[len(mount.rstrip("/")) :]
    return found


# -- the child's side -----------------------------------------------------------------------------


def before_fork(job: dict[str, Any]) -> None:
    """An upload's SIGTERM (and its commit) is held until the child has its handler (none is
    lost, and none kills it by default)."""
    if job.get("mode") in UPLOADS:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, COMMIT})


def in_parent(job: dict[str, Any], child: int) -> None:
    """guest_exec's side of an upload: a SIGTERM is passed to the child, which cleans up and
    ends (its exit code is the job's); guest_exec waits for it."""
    if job.get("mode") in UPLOADS:
        for signum in (signal.SIGTERM, COMMIT):
            signal.signal(signum, lambda received, _: os.kill(child, received))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, COMMIT})


def run(job: dict[str, Any], found: dict[str, str]) -> int:
    """The child's work (in the guest); its exit code. Raises OSError or Invalid (a job's value
    of the wrong type too: the child must end through guest_exec's reports, never unwind)."""
    try:
        return _run(job, found)
    except (ValueError, TypeError, KeyError) as error:
        raise Invalid(f"the job cannot be done: {error}") from None


def _run(job: dict[str, Any], found: dict[str, str]) -> int:
    os.umask(0o022)
    mode = job["mode"]
    path = found.get("path", "")
    given = str(job.get("path") or "")
    if mode == "stat":
        st = os.lstat(path)
        _write_line(describe(given, st, _target(path, st), Names()))
    elif mode == "list":
        list_directory(path, given, _bounded(job.get("depth"), 1, MAX_DEPTH))
    elif mode == "mkdir":
        make_directory(path, bool(job.get("parents")), int(job.get("file_mode") or 0o755) & 0o7777)
    elif mode == "move":
        move(found["source"], found["destination"])
    elif mode == "remove":
        remove(path, bool(job.get("recursive")))
    elif mode == "read":
        read_file(path, given, max(0, int(job.get("offset") or 0)))
    elif mode == "tar-out":
        guest_tar.tar_out(path, given)
    elif mode == "watch":
        guest_watch.watch(path, given, bool(job.get("recursive")))
    elif mode in UPLOADS:
        return _upload(job, path)
    return 0


def _upload(job: dict[str, Any], path: str) -> int:
    fired: list[bool] = []

    def cancel(*_: object) -> None:
        if not fired:  # once: a second SIGTERM must not break the cleanup of the first
            fired.append(True)
            raise Cancelled()

    signal.signal(signal.SIGTERM, cancel)
    # SIGUSR1 (the commit) stays blocked: taken by sigwait once stdin has ended.
    signal.pthread_sigmask(signal.SIG_BLOCK, {COMMIT})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    commit = _await_commit if job.get("commit") else _no_wait
    try:
        if job["mode"] == "write":
            write_file(path, int(job.get("file_mode") or 0o644) & 0o7777, bool(job.get("parents")), commit)
        else:
            guest_tar.untar(path, bool(job.get("parents")), commit)
        return 0
    except Cancelled:
        return EXIT_CANCELLED
    except OSError as error:
        _say_error("os-error", error.strerror or str(error), errno.errorcode.get(error.errno or 0, ""))
        raise
    except Invalid as error:
        _say_error("invalid", str(error))
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _await_commit() -> None:
    """The end of stdin alone is not the client's finish (it is also what a server that died
    leaves): the upload is put in place at SIGUSR1, which the server sends after the last
    part. SIGTERM meanwhile (a cancel) raises Cancelled (taken here: glibc's sigwait would not
    return for a signal with a handler); a server gone kills this process."""
    if signal.sigwait({COMMIT, signal.SIGTERM}) == signal.SIGTERM:
        raise Cancelled()


def _no_wait() -> None:
    return None


def _say_error(status: str, message: str, errno_name: str = "") -> None:
    line = {"status": status, "error": message, "errno": errno_name}
    with contextlib.suppress(OSError):
        os.write(2, json.dumps(line).encode() + b"\n")


# -- describing -----------------------------------------------------------------------------------


class Names:
    """User and group names from the guest's /etc/passwd and /etc/group, read as files (never
    through NSS: no library of the guest is loaded here)."""

    def __init__(self) -> None:
        self._users: dict[int, str] | None = None
        self._groups: dict[int, str] | None = None

    @staticmethod
    def _read(path: str) -> dict[int, str]:
        names: dict[int, str] = {}
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_NAMES_BYTES)
        except OSError:
            return names
        for line in data.splitlines():
            fields = line.split(b":")
            if len(fields) >= 3 and fields[2].isdigit():
                names.setdefault(int(fields[2]), _text(os.fsdecode(fields[0])))
        return names

    def user(self, uid: int) -> str:
        if self._users is None:
            self._users = self._read("/etc/passwd")
        return self._users.get(uid, "")

    def group(self, gid: int) -> str:
        if self._groups is None:
            self._groups = self._read("/etc/group")
        return self._groups.get(gid, "")


def _text(name: str) -> str:
    """A name as valid UTF-8 text (bytes that are not are replaced): what the API can carry."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _target(path: str, st: os.stat_result) -> str:
    if not stat.S_ISLNK(st.st_mode):
        return ""
    try:
        return os.readlink(path)
    except OSError:
        return ""


def describe(path: str, st: os.stat_result, target: str, names: Names) -> dict[str, Any]:
    clean = posixpath.normpath(path)
    return {
        "path": _text(clean),
        "name": _text(posixpath.basename(clean) or "/"),
        "type": _kind(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "owner": names.user(st.st_uid),
        "group": names.group(st.st_gid),
        "mtime_ns": st.st_mtime_ns,
        "target": _text(target),
    }


def _write_line(item: dict[str, Any]) -> int:
    return _write_all(1, json.dumps(item).encode() + b"\n")


def _write_all(fd: int, data: bytes | memoryview) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def _bounded(value: Any, low: int, high: int) -> int:
    return min(high, max(low, int(value or low)))


# -- stat, list, mkdir, move, remove ----------------------------------------------------------------


def list_directory(path: str, given: str, depth: int) -> None:
    """Breadth first (shallow entries first when the listing is cut), lstat only."""
    names = Names()
    if not stat.S_ISDIR(os.stat(path).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    pending: deque[tuple[str, str, int]] = deque([(path, posixpath.normpath(given), 1)])
    count = written = 0
    out = os.fdopen(1, "wb", buffering=1 << 16, closefd=False)
    with out:
        while pending:
            directory, shown, level = pending.popleft()
            try:
                entries = os.scandir(directory)
            except OSError:
                if level == 1:
                    raise
                continue  # a subdirectory it may not read, or gone meanwhile
            with entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone meanwhile
                    line = json.dumps(
                        describe(posixpath.join(shown, entry.name), st, _target(entry.path, st), names)
                    ).encode()
                    count, written = count + 1, written + len(line) + 1
                    if count > MAX_ENTRIES or written > MAX_LIST_BYTES:
                        out.write(b'{"truncated": true}\n')
                        return
                    out.write(line + b"\n")
                    if stat.S_ISDIR(st.st_mode) and level < depth:
                        pending.append((entry.path, posixpath.join(shown, entry.name), level + 1))


def make_directory(path: str, parents: bool, mode: int) -> None:
    if parents:
        existed = os.path.isdir(path)
        os.makedirs(path, mode, exist_ok=True)
        if existed:
            return
    else:
        os.mkdir(path, mode)
    os.chmod(path, mode)  # exactly the mode asked, whatever the umask


def move(source: str, destination: str) -> None:
    """rename(2); across file systems (the writable layer and a volume), a copy beside the
    destination renamed into place, then the source removed."""
    try:
        os.rename(source, destination)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        _copy_then_remove(source, destination)


def _copy_then_remove(source: str, destination: str) -> None:
    st = os.lstat(source)
    temp = _temp_name(destination)
    try:
        if stat.S_ISDIR(st.st_mode):
            if os.path.lexists(destination):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))
            shutil.copytree(source, temp, symlinks=True)
        else:
            shutil.copy2(source, temp, follow_symlinks=False)
        os.rename(temp, destination)
    except BaseException:
        with contextlib.suppress(OSError):
            if os.path.isdir(temp) and not os.path.islink(temp):
                shutil.rmtree(temp)
            else:
                os.unlink(temp)
        raise
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(source)
    else:
        os.unlink(source)


def remove(path: str, recursive: bool) -> None:
    """A symlink is removed, never what it points to; rmtree walks by file descriptors
    (shutil's fd-based variant: a symlink planted meanwhile is not followed)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
    elif recursive:
        shutil.rmtree(path)
    else:
        os.rmdir(path)


def _temp_name(path: str) -> str:
    """A short name beside `path` (a name near the 255-byte limit still has room beside it)."""
    return posixpath.join(posixpath.dirname(path) or "/", f".kibo-{os.getpid()}-{os.urandom(4).hex()}.tmp")


# -- downloads --------------------------------------------------------------------------------------


def _big_pipe(fd: int) -> None:
    """A pipe of CHUNK, if it is smaller (never shrunk: the server may have made it larger)."""
    with contextlib.suppress(OSError):
        if fcntl.fcntl(fd, F_GETPIPE_SZ) < CHUNK:
            fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)


def read_file(path: str, given: str, offset: int) -> None:
    """Described and sent through one descriptor: a file replaced meanwhile (by a symlink, say)
    is either the old file whole or not opened. O_NONBLOCK: a FIFO must not hang the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(st.st_mode):
            raise Invalid(f"{given} is not a regular file (a device, FIFO or socket)")
        os.set_blocking(fd, True)
        _big_pipe(1)
        _write_line(describe(given, st, "", Names()))
        _send(fd, offset)
    finally:
        os.close(fd)


def _send(fd: int, offset: int, count: int | None = None) -> int:
    """`count` bytes (all, when None) of `fd` from `offset` to stdout; what was sent. sendfile:
    the pages go to the pipe without a copy in this process."""
    sent = 0
    while count is None or sent < count:
        want = CHUNK if count is None else min(CHUNK, count - sent)
        try:
            n = os.sendfile(1, fd, offset + sent, want)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.ENOSYS) or sent:
                raise
            return _copy_out(fd, offset, count)  # a file system without sendfile
        if n == 0:
            break
        sent += n
    return sent


def _copy_out(fd: int, offset: int, count: int | None) -> int:
    sent = 0
    while count is None or sent < count:
        data = os.pread(fd, CHUNK if count is None else min(CHUNK, count - sent), offset + sent)
        if not data:
            break
        sent += _write_all(1, data)
    return sent


# -- uploads ----------------------------------------------------------------------------------------


def _receive(fd: int) -> None:
    """stdin to `fd` until its end: splice moves the pipe's pages into the file without a copy
    here (a read and a write where the file system has no splice)."""
    while True:
        try:
            n = os.splice(0, fd, CHUNK)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            while data := os.read(0, CHUNK):
                _write_all(fd, data)
            return
        if n == 0:
            return


def write_file(path: str, mode: int, parents: bool, commit: Callable[[], None]) -> None:
    """stdin to `path`, whole or not at all: into a new file beside it (unnamed, O_TMPFILE,
    where the file system can: even a SIGKILL leaves nothing), put in place by a rename once
    stdin has ended and `commit` returned; on any failure and on SIGTERM nothing is left."""
    directory = posixpath.dirname(path) or "/"
    if parents:
        os.makedirs(directory, exist_ok=True)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    _big_pipe(0)
    temp = _temp_name(path)
    named = False
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        named = True
    try:
        try:
            _receive(fd)
            os.fchmod(fd, mode)
            commit()
            if not named:
                _name(fd, temp, mode)
                named = True
        finally:
            os.close(fd)
        _replace(temp, path)
    except BaseException:
        if named:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        raise


def _replace(temp: str, path: str) -> None:
    """`temp` put in place of `path`, atomically. A rename over an existing file makes ext4
    (auto_da_alloc) start writing the new file's data back inside the rename (measured: 270-535
    ms for 256 MiB on a guest image's loop device, in the upload's finish): the two are exchanged
    instead (renameat2 RENAME_EXCHANGE, as atomic, without that flush), and the old file, now at
    the temporary name, removed. Nothing there, or a file system without exchange: a rename.
    (An upload is not synced to disk, as no write in the guest is: a host crash may lose it.)"""
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None or renameat2(AT_FDCWD, os.fsencode(temp), AT_FDCWD, os.fsencode(path), RENAME_EXCHANGE):
        os.rename(temp, path)
        return
    if stat.S_ISDIR(os.lstat(temp).st_mode):  # a directory put there meanwhile: swapped back
        renameat2(AT_FDCWD, os.fsencode(temp), AT_FDCWD, os.fsencode(path), RENAME_EXCHANGE)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    with contextlib.suppress(OSError):  # in place already: a failure here must not undo it
        os.unlink(temp)


def _name(fd: int, temp: str, mode: int) -> None:
    """An unnamed file given the name `temp` (through /proc/self/fd: linkat with AT_EMPTY_PATH
    would need a capability); without a /proc, its bytes are copied to a new file of that name."""
    try:
        # With dir fds os.link is linkat(2), which follows the magic link (link(2) would not).
        fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.link(str(fd), temp, src_dir_fd=fds, dst_dir_fd=fds, follow_symlinks=True)
        finally:
            os.close(fds)
        return
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR):
            raise
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        size, at = os.fstat(fd).st_size, 0
        while at < size and (n := os.sendfile(out, fd, at, min(CHUNK, size - at))):
            at += n
        os.fchmod(out, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    finally:
        os.close(out)


# The modes that use the definitions above, imported last (they import this module).
if TYPE_CHECKING:
    from kibo_ctrl.runtime.process.guest_access import guest_tar, guest_watch
else:
    import guest_tar
    import guest_watch
