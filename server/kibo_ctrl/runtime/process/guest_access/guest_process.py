"""A process in a running guest, kept by its node: guest_exec.py's "process" mode (standard
library only; the server's side is processes.py).

    JOB_JSON = {"mode": "process", "argv": [...], "env": {...}, "cwd": "/", "user": "",
                "pty": false, "job": null, "status_fd": 3, "control_fd": 4}

guest_exec.py enters the guest as for an exec (its cgroup, namespaces and root) and hands
over here before it gives up its privileges. The command is started in a session of its own
(its process group is what a signal, an end or the server's departure reaches):

- as the guest's root, without a terminal: posix_spawn (a vfork, as an exec's command);
- with a terminal (`pty`: fds 0, 1 and 2 are the slave of a PTY the server opened on the
  host and keeps the master of): a fork that makes the terminal its controlling one
  (setsid, TIOCSCTTY), so "\\x03" written to the master interrupts its foreground group;
- as another user (`user`: a name in the guest's /etc/passwd, read as a file, never
  through NSS, or a number): a fork that empties its bounding set, takes the user's groups
  (/etc/group), gid and uid, then gives up the rest as every guest process does;
- an upload (`job`: a "write" or "untar" file job of guest_files.py, reading stdin): a fork
  that runs it (a SIGTERM makes it remove what it made).

Status lines on `status_fd`: first {"status": "started", "pid": P, "host_pid": H, "start": T}
(P in the guest's PID namespace; H and its start time T let the server end the process
group itself should this process die), or a refusal ("invalid": an unknown user, or a
user the guest cannot map; "os-error": the working directory, with its errno); then, once
the command has exited, {"status": "ok", "code": N}.

`control_fd` carries JSON lines from the server: {"signal": N} is sent to the command's
process group. Its end (the server closed it, or is gone: a node agent killed) kills the
group. When the command exits, what is left of its group is killed too: a process's end is
its group's (one that made a session of its own is the guest's, until the guest's end).

This process waits as the guest's root with no capability (CAP_KILL alone, in the guest's
user namespace, when the command runs as another user: to signal it), no new privileges and
the guest's seccomp filter."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import select
import signal
import stat
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process import userns
    from kibo_ctrl.runtime.process.guest_access import guest_files
else:  # guest_exec.py put runtime/process/ and this directory on sys.path
    import guest_files
    import userns

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_VERSION_3 = 0x20080522
CAP_KILL = 5
# What of /etc/passwd and /etc/group is read (the guest writes them: a bound, and regular
# files only, so a FIFO or /dev/zero there cannot hold this process).
MAX_NAMES_BYTES = 1 << 20
# One read of the control pipe (its lines are a few bytes).
CONTROL_READ = 4096
# Python ignores these for itself; a command gets them back at their default (as subprocess does).
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)

_libc = ctypes.CDLL(None, use_errno=True)


class Refusal(Exception):
    """The process cannot start (reported as the first status line)."""

    def __init__(self, status: str, message: str, errno_name: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.errno_name = errno_name


@dataclass(frozen=True)
class Entered:
    """What guest_exec.py knows once inside the guest's namespaces and root."""

    # The guest has a user namespace of its own: become its root, load its seccomp filter.
    own_userns: bool
    # Rootless: setgroups is denied in the guest's namespace (the server user's groups stay).
    keep_groups: bool
    seccomp: bytes
    # The host's /proc, opened before the namespaces were entered (a child's pid in the guest).
    host_proc: int
    last_cap: int


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    home: str
    shell: str


def _report(fd: int, line: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, json.dumps(line).encode() + b"\n")


def run(job: dict[str, Any], env: dict[str, str], cwd: str, entered: Entered, spec: dict[str, Any]) -> int:
    """The process's life in guest_exec.py (inside the guest, still privileged); its exit status."""
    status_fd, control = int(job["status_fd"]), int(job["control_fd"])
    os.set_inheritable(control, False)
    if entered.own_userns:
        userns.become_root(keep_groups=entered.keep_groups)  # the guest's root, as every guest process
    try:
        user = lookup_user(str(job.get("user") or ""))
        if user is not None:
            env = {"HOME": user.home, "USER": user.name, "LOGNAME": user.name, **env}
        if job.get("pty") and "TERM" not in env:
            env["TERM"] = "xterm-256color"
        inner = job.get("job")
        work = _file_job(inner, spec) if isinstance(inner, dict) else None
        host_pid = _start(list(job.get("argv") or []), env, cwd, entered, user, bool(job.get("pty")), work, inner)
    except Refusal as refused:
        _report(status_fd, {"status": refused.status, "error": str(refused), "errno": refused.errno_name})
        return 1
    except OSError as error:
        name = errno.errorcode.get(error.errno or 0, "")
        _report(status_fd, {"status": "os-error", "error": error.strerror or str(error), "errno": name})
        return 1
    # Our standard streams are the command's: closed here, so the server sees them end with it.
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    pidfd = os.pidfd_open(host_pid)
    guest_pid, start = _guest_pid(entered.host_proc, host_pid)
    os.close(entered.host_proc)
    _report(status_fd, {"status": "started", "pid": guest_pid, "host_pid": host_pid, "start": start})
    _give_up_privileges(entered, keep_kill=user is not None)
    code = _supervise(host_pid, pidfd, control)
    _report(status_fd, {"status": "ok", "code": code})
    return 0


def _file_job(inner: dict[str, Any], spec: dict[str, Any]) -> Callable[[], int]:
    """An upload's work (guest_files.py), its paths checked now: run in the child."""
    if inner.get("mode") not in guest_files.UPLOADS or not guest_files.handles(inner):
        raise Refusal("invalid", f"a process runs an upload's file job only, not {inner.get('mode')!r}")
    try:
        found = guest_files.paths(inner, spec)
    except guest_files.Invalid as error:
        raise Refusal("invalid", str(error)) from None
    return lambda: guest_files.run(inner, found)


# -- users ------------------------------------------------------------------------------------------


def _read_names(path: str) -> list[list[str]]:
    """The lines of a guest's /etc/passwd or /etc/group, split at ':' (bounded, regular files only)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = b""
        while len(data) < MAX_NAMES_BYTES and (chunk := os.read(fd, MAX_NAMES_BYTES - len(data))):
            data += chunk
    except OSError:
        return []
    finally:
        os.close(fd)
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines()]


def lookup_user(given: str) -> User | None:
    """The guest user `given` names (None: root, the default). A name must be in the guest's
    /etc/passwd; a number may be (else its gid is its uid, its home /)."""
    if given in ("", "0", "root"):
        return None
    entries = [fields for fields in _read_names("/etc/passwd") if len(fields) >= 7 and fields[2].isdecimal()]
    if given.isdecimal():
        uid = int(given)
        entry = next((fields for fields in entries if int(fields[2]) == uid), None)
    else:
        entry = next((fields for fields in entries if fields[0] == given), None)
        if entry is None:
            raise Refusal("invalid", f"user {given!r} is not in the guest's /etc/passwd")
        uid = int(entry[2])
    if uid == 0:
        return None
    if entry is None:
        return User(uid, uid, (uid,), given, "/", "/bin/sh")
    gid = int(entry[3]) if entry[3].isdecimal() else uid
    name = entry[0]
    groups = {gid}
    for fields in _read_names("/etc/group"):
        if len(fields) >= 4 and fields[2].isdecimal() and name in fields[3].split(","):
            groups.add(int(fields[2]))
    return User(uid, gid, tuple(sorted(groups)), name, entry[5] or "/", entry[6] or "/bin/sh")


# -- starting -----------------------------------------------------------------------------------------


def _start(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    entered: Entered,
    user: User | None,
    pty: bool,
    work: Callable[[], int] | None,
    inner: dict[str, Any] | None,
) -> int:
    """Start the command (or the upload); its pid in this process's (the host's) PID namespace."""
    if user is None:
        # As the guest's root: privileges go first, the child inherits their absence.
        _give_up_privileges(entered, keep_kill=False)
        os.chdir(cwd)
        if work is None and not pty:
            return _spawn(argv, env)
    elif work is not None:
        raise Refusal("invalid", "an upload runs as the guest's root")
    if inner is not None:
        guest_files.before_fork(inner)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        _child(argv, env, cwd, entered, user, pty, work, ready_w)
    os.close(ready_w)
    try:
        failed = b""
        while chunk := os.read(ready_r, 4096):
            failed += chunk
    finally:
        os.close(ready_r)
    if inner is not None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if failed:
        os.waitpid(pid, 0)
        refusal = json.loads(failed)
        raise Refusal(str(refusal["status"]), str(refusal["error"]), str(refusal.get("errno") or ""))
    return pid


def _child(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    entered: Entered,
    user: User | None,
    pty: bool,
    work: Callable[[], int] | None,
    ready: int,
) -> None:
    """The forked child: its session (and terminal), its user, then the command or the upload.
    A failure before the command is written to `ready` (closed at the exec: then it started)."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()
        if pty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if user is not None:
            _become(user, entered)
            try:
                os.chdir(cwd)
            except OSError as error:
                name = errno.errorcode.get(error.errno or 0, "")
                _refuse(ready, "os-error", error.strerror or str(error), name)
        if work is not None:
            os.close(ready)
            os._exit(_run_work(work))
        for signum in DEFAULT_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        _exec(argv, env)
    except Refusal as refused:
        with contextlib.suppress(BaseException):
            _refuse(ready, refused.status, str(refused), refused.errno_name)
    except BaseException as error:
        with contextlib.suppress(BaseException):
            _refuse(ready, "error", f"the process could not start: {error}")
    finally:
        os._exit(127)  # never back into guest_exec's code


def _refuse(ready: int, status: str, message: str, errno_name: str = "") -> None:
    os.write(ready, json.dumps({"status": status, "error": message, "errno": errno_name}).encode())
    os._exit(127)


def _run_work(work: Callable[[], int]) -> int:
    """The upload, in the child: its exit code (its errors were written to stderr by guest_files)."""
    try:
        return work()
    except (OSError, guest_files.Invalid):
        return 1


def _become(user: User, entered: Entered) -> None:
    """The child becomes `user`: no capability can come back (bounding set emptied while it
    may), its groups, gid, uid (which clears the rest), no new privileges, the seccomp filter."""
    for cap in range(entered.last_cap + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    try:
        if not entered.keep_groups:
            os.setgroups(list(user.groups))
        os.setresgid(user.gid, user.gid, user.gid)
        os.setresuid(user.uid, user.uid, user.uid)
    except OSError as error:
        # Ids the guest's namespace does not map (rootless maps its root only).
        message = f"user {user.name!r} (uid {user.uid}) cannot be used in this guest: {error.strerror}"
        raise Refusal("invalid", message) from None
    _give_up_privileges(entered, keep_kill=False)


def _exec(argv: list[str], env: dict[str, str]) -> None:
    """execve argv[0] as looked up in env's PATH (as guest_exec's exec does); on failure the
    shell's answer: a message on stderr, 127 (not found) or 126."""
    error: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    candidates = [argv[0]] if os.sep in argv[0] else [os.path.join(d, argv[0]) for d in os.get_exec_path(env)]
    for path in candidates:
        try:
            os.execve(path, argv, env)
        except (FileNotFoundError, NotADirectoryError) as missing:
            error = error if not isinstance(error, FileNotFoundError) else missing
        except OSError as other:
            error = other if isinstance(error, FileNotFoundError) else error
    with contextlib.suppress(OSError):
        os.write(2, f"{argv[0]}: {error.strerror}\n".encode())
    os._exit(127 if isinstance(error, FileNotFoundError) else 126)


def _spawn(argv: list[str], env: dict[str, str]) -> int:
    """posix_spawn in a new session, argv[0] looked up in env's PATH; on failure a child that
    says so and exits 127 or 126 (as a shell would), so the process starts either way."""
    candidates = [argv[0]] if os.sep in argv[0] else [os.path.join(d, argv[0]) for d in os.get_exec_path(env)]
    first_other: OSError | None = None
    last: OSError | None = None
    for path in candidates:
        try:
            os.stat(path)  # what is not there is skipped with a stat, not a failed spawn
            return os.posix_spawn(path, argv, env, setsid=True, setsigdef=DEFAULT_SIGNALS)
        except (FileNotFoundError, NotADirectoryError) as error:
            last = error
        except OSError as error:
            last = error
            first_other = first_other or error
    failed = first_other or last or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    pid = os.fork()
    if pid == 0:
        os.setsid()
        with contextlib.suppress(OSError):
            os.write(2, f"{argv[0]}: {failed.strerror}\n".encode())
        os._exit(127 if isinstance(failed, FileNotFoundError) else 126)
    return pid


def _guest_pid(host_proc: int, host_pid: int) -> tuple[int, int]:
    """The child's pid in the guest's PID namespace (the last of NSpid) and its start time,
    read from the host's /proc (the guest's is not ours to read: it is the guest's mount)."""
    fd = os.open(f"{host_pid}/status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=host_proc)
    try:
        status = os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)
    line = next(line for line in status.splitlines() if line.startswith("NSpid:"))
    fd = os.open(f"{host_pid}/stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=host_proc)
    try:
        stat_line = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    start = int(stat_line[stat_line.rindex(")") + 2 :].split()[19])
    return int(line.split()[-1]), start


def _give_up_privileges(entered: Entered, keep_kill: bool) -> None:
    """As every guest process (userns.drop_privileges, the seccomp filter), except that with
    `keep_kill` CAP_KILL stays (in the guest's user namespace): the command runs as another
    user, and this process signals it. Idempotent."""
    for cap in range(entered.last_cap + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if keep_kill:
        data[0] = data[1] = 1 << CAP_KILL  # effective, permitted
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if entered.own_userns and not _SECCOMP_LOADED:
        userns.load_seccomp(entered.seccomp)
        _SECCOMP_LOADED.append(True)


_SECCOMP_LOADED: list[bool] = []


# -- waiting ------------------------------------------------------------------------------------------


def _supervise(pid: int, pidfd: int, control: int) -> int:
    """Until the command exits: the server's signals to its group; the group killed when the
    control pipe ends. Then what is left of the group is killed, the command reaped."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(control, select.POLLIN)
    pending = b""
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        if any(fd == pidfd for fd, _ in events):
            break
        try:
            data = os.read(control, CONTROL_READ)
        except OSError:
            data = b""
        if not data:
            _signal_group(pid, signal.SIGKILL)  # the server is gone: nothing runs unsupervised
            poller.unregister(control)
            continue
        pending = (pending + data)[-CONTROL_READ:]
        *lines, pending = pending.split(b"\n")
        for line in lines:
            signum = _signal_of(line)
            if signum:
                _signal_group(pid, signum)
    # The command has exited (a zombie until reaped: its group's ID cannot be reused before).
    _signal_group(pid, signal.SIGKILL)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _signal_of(line: bytes) -> int:
    try:
        asked = json.loads(line)
        signum = int(asked["signal"])
    except (ValueError, KeyError, TypeError):
        return 0
    return signum if 1 <= signum <= 64 else 0


def _signal_group(pid: int, signum: int) -> None:
    """To the command's process group (its pid: it leads its session), else to it alone."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
    except OSError:
        pass
