"""Run something inside a running guest: the data plane's hands (standard library only).

    python -I -S guest_exec.py INSTANCE_DIR JOB_JSON

JOB_JSON = {"mode": "exec", "argv": [...], "env": {...}, "cwd": "/"}
         | {"mode": "read", "path": "/data/x"} | {"mode": "write", "path": "/data/x", "file_mode": 420}
         | the modes of guest_files.py (files anywhere in the guest: stat, list, mkdir, move,
           remove, tar-out, untar, watch; read and write with "anywhere": true)

It joins the guest's cgroup (its limits apply, and a stop kills it; forked from the
instance's job door it was born there: forkserver.py), opens the guest's namespaces (user,
IPC, UTS, network, PID, cgroup, mount) through /proc/<guest>/ns, enters its root, becomes the
guest's root (host uid `host_id_base`, see idmap.py; rootless: the server's own uid, its
groups kept), drops every capability and the bounding set, sets no_new_privs, loads the
guest's seccomp filter (like every guest process: see userns.py, seccomp.py), and then
starts the command (posix_spawn: the first process it makes is in the guest's PID
namespace) and waits for it, or forks a child that reads the file to stdout or writes stdin
to the file (atomically). File work is done as that guest uid, inside the guest's root (so
a symlink cannot lead outside it), and paths must lie under one of the guest's volume
mounts (safepath.guest_file_path, the data plane's rule). The command shares this
process's group, which the server kills when the job ends (guest_jobs.py).

Standard streams are the command's. How it ended goes to the job's `status_fd` as one JSON line:
{"status": "ok"|"unavailable"|"invalid"|"os-error"|"error", "code": N, "error": "...", "errno": "ENOSPC"}
("os-error": a read or write failed; "errno" names the error, mapped by the server in guest_errors.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import posixpath
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process import safepath, userns
    from kibo_ctrl.runtime.process.guest_access import guest_files, guest_process
else:
    sys.path.insert(0, str(Path(__file__).parent.parent))  # run as a script: the runtime's modules
    sys.path.insert(0, str(Path(__file__).parent))  # and its siblings (guest_files: files anywhere)
    import guest_files
    import guest_process
    import safepath
    import userns

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_VERSION_3 = 0x20080522
CLONE_NEWUSER = 0x10000000
# The user namespace first: the others belong to it. The cgroup namespace too, entered
# once this process is in the guest's cgroups: the command's /proc/self/cgroup then reads
# `/` (the guest's cgroup is its root), not the host's cgroup paths (issue 27.5).
NAMESPACES = ("user", "ipc", "uts", "net", "pid", "cgroup", "mnt")

_libc = ctypes.CDLL(None, use_errno=True)
# Set in a job door (forkserver.py), which joined the instance's cgroups for its jobs: each
# is born there, and does not move itself (a move costs an RCU grace period on cgroup v1).
IN_CGROUP = False


class Refused(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


STATUS_FD = [-1]


def report(status: str, code: int = 0, error: str = "", errno_name: str = "") -> None:
    line = {"status": status, "code": code, "error": error, "errno": errno_name}
    with contextlib.suppress(OSError):
        os.write(STATUS_FD[0], json.dumps(line).encode() + b"\n")


def report_os_error(error: OSError) -> None:
    """A failed read or write: the errno's name (the server maps it: guest_errors.py) and
    the system's text only (no path: the caller knows which it gave)."""
    name = errno.errorcode.get(error.errno or 0, "")
    report("os-error", error=error.strerror or str(error), errno_name=name)


def _open_guest(pid: int, start: int) -> int:
    """A handle on /proc/PID that cannot come to mean another process: -1 unless `pid`
    runs and is the one that started at `start` (not a reused PID)."""
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return -1
    try:
        stat_fd = os.open("stat", os.O_RDONLY, dir_fd=proc)
        try:
            stat = os.read(stat_fd, 4096).decode()
        finally:
            os.close(stat_fd)
    except OSError:
        os.close(proc)
        return -1
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z" or int(fields[19]) != start:
        os.close(proc)
        return -1
    return proc


def drop_capabilities(last_cap: int) -> None:
    for cap in range(last_cap + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def guest_file(path: str, mounts: list[str]) -> str:
    try:
        return safepath.guest_file_path(path, mounts)
    except safepath.UnsafePath as error:
        raise Refused("invalid", str(error)) from None


def write_atomically(path: str, mode: int) -> None:
    """stdin to `path`, whole or not at all: a short temporary name beside it (so a name
    near the 255-byte limit still works), removed if anything fails (ENOSPC, ...)."""
    tmp = posixpath.join(posixpath.dirname(path), f".kibo-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            while chunk := os.read(0, 1 << 16):
                f.write(chunk)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def main() -> None:
    directory = Path(sys.argv[1])
    job: dict[str, Any] = json.loads(sys.argv[2])
    STATUS_FD[0] = int(job.get("status_fd", -1))
    if STATUS_FD[0] >= 0:
        os.set_inheritable(STATUS_FD[0], False)  # not for the guest's command
    spec = json.loads((directory / "spec.json").read_text())
    state = json.loads((directory / "state.json").read_text())
    guest = int(state.get("guest_pid") or 0)
    proc = _open_guest(guest, int(state.get("guest_start") or 0)) if state.get("state") == "ready" else -1
    if proc < 0:
        raise Refused("unavailable", "the guest is not running (it may be restarting): retry")
    mounts = [guest_path for _, guest_path in spec["mounts"]]
    files = guest_files.handles(job)  # files anywhere in the guest (guest_files.py)
    try:
        found = guest_files.paths(job, spec) if files else {}
    except guest_files.Invalid as error:
        raise Refused("invalid", str(error)) from None
    path = guest_file(str(job.get("path") or ""), mounts) if job["mode"] in ("read", "write") and not files else ""
    for procs in spec["cgroup_procs"] if not IN_CGROUP else ():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
        with contextlib.suppress(OSError):  # the guests' OOM rank (supervisor_os.GUEST_OOM_SCORE_ADJ)
            Path("/proc/self/oom_score_adj").write_text("500")
    last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    # Guests started before they had their own user namespace (no host_id_base) run on as they were.
    own_userns = spec["isolation"] == "bwrap" and "host_id_base" in spec
    program = Path(spec["seccomp_filter"]).read_bytes() if own_userns else b""
    env = {**spec["guest_env"], **job.get("env", {})}
    cwd = str(job.get("cwd") or "/")
    # A process's pid in the guest is read from the host's /proc (guest_process.py).
    host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY) if job["mode"] == "process" else -1
    if spec["isolation"] == "none":
        # No namespaces: guest paths are host paths under its mounts.
        host = {guest_path: host_path for host_path, guest_path in spec["mounts"]}
        for guest_path, host_path in host.items():
            if path.startswith(guest_path.rstrip("/") + "/"):
                path = host_path + path[len(guest_path.rstrip("/")) :]
        cwd = spec["cwd"] if cwd == "/" else cwd
    else:
        names: tuple[str, ...] = NAMESPACES if own_userns else NAMESPACES[1:]
        if spec.get("netns"):
            # A guest network slot (runtime/process/network/) belongs to the host's user
            # namespace, not the guest's: joined first, while this process may.
            names = ("net", *(name for name in names if name != "net"))
        fds = [os.open(f"ns/{name}", os.O_RDONLY, dir_fd=proc) for name in names]
        root = os.open("root", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc)
        # Not dumpable: no guest process may ptrace or open /proc/<this> while it is privileged.
        _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
        for fd in fds:
            if _libc.setns(fd, 0) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            os.close(fd)
        os.fchdir(root)
        os.chroot(".")
        os.close(root)
    if job["mode"] == "process":  # kept by the node: guest_process.py gives up the privileges
        entered = guest_process.Entered(own_userns, bool(spec.get("rootless")), program, host_proc, last_cap)
        sys.exit(guest_process.run(job, env, cwd, entered, spec))
    # From here on this process is the guest's root too (it needs no privilege to wait and report).
    if own_userns:
        # The guest's root (host uid host_id_base), like every guest process.
        userns.become_root(keep_groups=bool(spec.get("rootless")))
        userns.drop_privileges()
        userns.load_seccomp(program)
    else:
        drop_capabilities(last_cap)
    if job["mode"] == "exec":
        code = run_command(job["argv"], env, cwd)
        if code is not None:
            streams_done()
            report("ok", code)
        return
    guest_files.before_fork(job)
    child = os.fork()  # the file work in the guest's PID namespace, as the command would be
    if child == 0:
        try:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            os.chdir(cwd)
            if files:
                os._exit(guest_files.run(job, found))
            elif job["mode"] == "read":
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 16):
                        os.write(1, chunk)
            else:
                write_atomically(path, int(job.get("file_mode") or 0o644))
            os._exit(0)
        except OSError as error:
            report_os_error(error)
            os._exit(126)
        except guest_files.Invalid as error:
            report("invalid", error=str(error))
            os._exit(126)
    guest_files.in_parent(job, child)
    _, status = os.waitpid(child, 0)
    streams_done()
    report("ok", _exit_code(status))


def streams_done() -> None:
    """Close our standard streams before the status line: the server sees the job's output
    end and its status without waiting for this process's exit (freeing a forked
    interpreter took ~1.5-3 ms here). What the command left running may hold them still."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)


def run_command(argv: list[str], env: dict[str, str], cwd: str) -> int | None:
    """Run the command in `cwd` and wait for it: its exit code (127: not found, 126: not
    executable, as a shell says), or None if the cwd failed (reported). posix_spawn, a vfork:
    no copy of this interpreter is made (os.fork cost ~1-2 ms here), and the command is the
    first process made in the guest's PID namespace after setns."""
    try:
        os.chdir(cwd)
    except OSError as error:
        report_os_error(error)
        return None
    try:
        pid = _spawn_in_path(argv, env)
    except OSError as error:
        os.write(2, f"{argv[0]}: {error.strerror}\n".encode())
        return 127 if isinstance(error, FileNotFoundError) else 126
    _, status = os.waitpid(pid, 0)
    return _exit_code(status)


def _spawn_in_path(argv: list[str], env: dict[str, str]) -> int:
    """os.posix_spawn of argv[0] looked up in env's PATH the way os.execvpe looks (the first
    error other than "not there" wins, else the last)."""
    # What Python ignores for itself goes back to the default for the command, as subprocess does.
    defaults = (signal.SIGPIPE, signal.SIGXFSZ)
    if os.sep in argv[0]:
        return os.posix_spawn(argv[0], argv, env, setsigdef=defaults)
    first_other: OSError | None = None
    last: OSError | None = None
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, argv[0])
        try:
            # What is not there is skipped with a stat, not a failed spawn (a vfork each).
            os.stat(path)
            return os.posix_spawn(path, argv, env, setsigdef=defaults)
        except (FileNotFoundError, NotADirectoryError) as error:
            last = error
        except OSError as error:
            last = error
            first_other = first_other or error
    raise first_other or last or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def entry() -> None:
    """The script's entry (also of a child of the fork server: forkserver.py)."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        main()
    except Refused as refused:
        report(refused.status, error=str(refused))
        sys.exit(1)
    except (OSError, ValueError, KeyError) as error:
        report("error", error=f"cannot enter the guest: {error}")
        sys.exit(1)


if __name__ == "__main__":
    entry()
