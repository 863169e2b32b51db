"""A warm Python that forks the runtime's helper processes: supervisors and guest jobs.

Why: every supervisor (supervisor.py) and every data-plane job (guest_exec.py) used to be
a fresh `python -I -S` interpreter, and its start-up and imports were the largest part of
a launch (~25 ms idle, ~70 ms on a loaded machine: bench/process_runtime.py --breakdown)
and of a first command. The fork server is that interpreter started once, with both
scripts imported; a child forked from it is ready at once, and shares the interpreter's
pages with its siblings (copy-on-write), which is most of a supervisor's memory.

What a child is: exactly what the exec'd script was. It is forked from a process that
only ever imported the two scripts and their standard-library siblings (no control-plane
code, no token, no store), then: a new session (like `start_new_session=True`), the fds it
was sent at 0, 1, 2 (and 3, 4, ... for the extra ones), every other fd closed, cwd `/`,
the signal dispositions of a fresh interpreter, its /proc/PID/cmdline rewritten to the
command line it would have had (`python -I -S supervisor.py INSTANCE_DIR`: what `ps`,
the tests and the bench look for), then the script's main. The server keeps no state of
a child: the child does not need it (a supervisor outlives the server and the control
plane as before: it is in its own session and holds its instance's flock).

Who may ask: only the control plane, through the socketpair it made when it started the
server (no socket name anyone else could connect to). Protocol (SOCK_SEQPACKET, one
message each way): request JSON {"program": "supervisor"|"guest_exec", "argv": [...]} with
the fds (stdin, stdout, stderr, extras...) as SCM_RIGHTS; reply {"pid": N} with a pidfd of
the child, or {"error": "..."}. The server exits when the control plane's end closes
(a kill -9 of the control plane included); the children run on. Children are reaped by
the kernel (SIGCHLD ignored here); the caller follows a child through its pidfd.

A guest's job door ("door": `ForkServer.door` in fork_client.py): a child of this server
that moved itself into one instance's cgroups once, then forks that instance's guest jobs,
which are born there. Why: on cgroup v1 moving a process into a cgroup waits for an RCU grace period
(~16 ms on this machine: bench/process_runtime.py), and every job used to move itself, so
each command in a guest paid it. A door is opened beside the launch (its move overlaps the
guest's own) and serves only jobs of its instance, checking before each that the
instance's cgroups are still the ones it joined. It is the control plane's child (reaped
there), exits when its channel closes, and dies with its guest's cgroup (the supervisor and
the runtime kill everything in it): it never outlives the instance nor the control plane.
It keeps its next job forked ahead (`_Spare`, `kibo-job-spare` in `ps`: a fork and the
child's first steps were ~2 ms of each command here), which exits when the door does. A
door's jobs are its children (the kernel reaps them), followed by the caller through their
pidfds. Its share of the guest's limits: two processes, and the pages they dirty.

The server keeps its next supervisor forked ahead too (`kibo-supervisor-spare` in `ps`),
forked a while after each launch, not beside it; it exits when the server does.

Run as `python -I -S forkserver.py FD PADDING` (standard library only, like the scripts);
PADDING is room in the argv area for the children's command lines. The control plane's
side (`ForkServer`, `Door`, `Child`) is fork_client.py."""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from .guest_start import set_cmdline
else:  # run as a script (python forkserver.py): its sibling modules
    sys.path.insert(0, str(Path(__file__).parent))
    from guest_start import set_cmdline

HERE = Path(__file__).parent
SCRIPTS = {"supervisor": HERE / "supervisor.py", "guest_exec": HERE / "guest_access" / "guest_exec.py"}
# The most fds one request carries (stdin, stdout, stderr and a status pipe, with room).
MAX_FDS = 8
MESSAGE = 1 << 16
# Room for a child's command line: the interpreter, the script and its arguments.
TITLE_ROOM = 4096
# Above any fd a child could have inherited (closerange uses close_range(2): cheap).
MAX_FD = 1 << 20


# -- the server (the warm interpreter) ------------------------------------------------------


def _load(name: str) -> Any:
    """supervisor.py or guest_exec.py as modules (they add their directory to sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"kibo_forked_{name}", SCRIPTS[name])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _become_child(fds: list[int], words: list[str]) -> None:
    """In the forked child, before the script's main: see the module docstring."""
    _detach()
    _place(fds, words)


def _detach() -> None:
    """A child's first steps: a session of its own, a fresh interpreter's signals, cwd `/`."""
    os.setsid()
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # what a fresh interpreter has
    os.chdir("/")


def _place(fds: list[int], words: list[str]) -> None:
    """The fds at their places (0, 1, 2, 3, ...), via numbers above them so none is
    clobbered; everything else (the server's channel, the received originals, the copies)
    closed; the command line the exec'd script would have had."""
    high = [os.dup(fd) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target, inheritable=target < 3)
    os.closerange(len(high), MAX_FD)
    set_cmdline(words)


def _child(module: Any, program: str, argv: list[str], fds: list[int], detached: bool = False) -> None:
    code = 0
    try:
        if not detached:
            _detach()
        _place(fds, [sys.executable, "-I", "-S", str(SCRIPTS[program]), *argv])
        sys.argv = [str(SCRIPTS[program]), *argv]
        module.entry()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _make_namespace(userns: Any, key: tuple[int, int, int]) -> int:
    """A new user namespace with the guests' mapping (userns.GuestNamespace), for the next
    supervisor: never entered by anyone until that supervisor's guest. Its helper process
    is waited for here, so SIGCHLD is not ignored meanwhile (then zombies are reaped)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        namespace = userns.GuestNamespace(*key)
        return int(namespace.create())
    finally:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass


def serve(channel: int) -> None:
    modules = {name: _load(name) for name in SCRIPTS}
    userns = modules["supervisor"].userns
    # Pre-made user namespaces per mapping (base, count, gid base): one ready for the next
    # supervisor, so its launch does not wait for one to be made (see supervisor.py).
    namespaces: dict[tuple[int, int, int], int] = {}
    modules["supervisor"]._load_storage()  # what every supervisor loads: once, here
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sock = socket.socket(fileno=channel)
    # Everything imported stays as it is: no collection walks (and dirties) it in children.
    gc.collect()
    gc.freeze()

    def next_supervisor() -> _Spare | None:
        # Forked ahead (as a door's next job: `_Spare`): the fork and the child's first steps
        # are then off the launch's path.
        return _Spare.make(modules["supervisor"], "supervisor", [SUPERVISOR_SPARE])

    spare = next_supervisor()
    spare_due: float | None = None  # when to fork the next one (not beside the launch it follows)
    while True:
        if spare_due is not None:
            ready, _, _ = select.select([sock], [], [], max(0.0, spare_due - time.monotonic()))
            if not ready:
                spare, spare_due = next_supervisor(), None
                continue
        try:
            message, ancillary, _, _ = sock.recvmsg(MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
        except OSError:
            return
        if not message:
            return  # the control plane is gone: so are we (the children run on)
        fds = fds_of(ancillary)
        try:
            request = json.loads(message)
            program, argv = str(request["program"]), [str(a) for a in request["argv"]]
            if program == DOOR:
                pid, pidfd = fork_sibling() if SIBLINGS[0] else (os.fork(), -1)
                if pid == 0:
                    _door(modules["guest_exec"], argv, fds)
                _reply(sock, pid, pidfd, sibling=pidfd >= 0)
                continue
            if program not in SCRIPTS:
                raise ValueError(f"unknown program {program!r}")
            wanted = request.get("userns")
            key = (int(wanted[0]), int(wanted[1]), int(wanted[2])) if program == "supervisor" and wanted else None
            given = namespaces.pop(key, -1) if key is not None else -1
            if given >= 0:
                fds.append(given)  # at 3 in the child (the request brought stdin, stdout, stderr)
                argv.append(f"--userns-fd={len(fds) - 1}")
            # A guest job is the control plane's own child, as when it was exec'd from there
            # (reaped there: its PID stays its own until then); a supervisor is ours.
            sibling = program == "guest_exec" and SIBLINGS[0]
            handed = None
            if program == "supervisor" and spare is not None:
                handed = _handed(spare, argv, fds)  # None if it was gone: forked now, then
                spare = None
            if handed is not None:
                _reply(sock, *handed, sibling=False)
            else:
                pid, pidfd = fork_sibling() if sibling else (os.fork(), -1)
                if pid == 0:
                    _child(modules[program], program, argv, fds)
                _reply(sock, pid, pidfd, sibling=pidfd >= 0)
            if spare is None and spare_due is None:
                spare_due = time.monotonic() + SUPERVISOR_SPARE_AFTER_S
            if key is not None and key not in namespaces:
                # After the reply: the next supervisor's namespace, off this launch's path.
                with contextlib.suppress(OSError):
                    namespaces[key] = _make_namespace(userns, key)
        except (OSError, ValueError, KeyError, TypeError) as error:
            with contextlib.suppress(OSError):
                sock.sendmsg([json.dumps({"error": str(error)}).encode()])
        finally:
            for fd in fds:
                os.close(fd)


def _reply(sock: socket.socket, pid: int, pidfd: int, *, sibling: bool) -> None:
    """The child's PID and a pidfd of it (closed here; made here if -1); `sibling`: it is the
    control plane's own child (fork_sibling gave the pidfd), so the control plane reaps it."""
    if pidfd < 0:
        pidfd = os.pidfd_open(pid)
    try:
        sock.sendmsg([json.dumps({"pid": pid, "sibling": sibling}).encode()], [rights([pidfd])])
    finally:
        os.close(pidfd)


# -- a guest's job door (see the module docstring) ----------------------------------------------

DOOR = "door"
# A door's spare's command line, until its job makes it guest_exec's.
SPARE = "kibo-job-spare"
# The fork server's spare's, until its launch makes it supervisor.py's.
SUPERVISOR_SPARE = "kibo-supervisor-spare"
# How long after a launch the fork server forks its next spare (a fork beside the launch would
# compete with it for the CPU of a small machine; a launch takes ~50 ms here).
SUPERVISOR_SPARE_AFTER_S = 0.1
# How long a door waits for its last job to end before forking the next spare.
SPARE_AFTER_S = 0.05
# What the door makes its children's guest_exec skip: the move into the cgroups (it made it).
IN_CGROUP = "IN_CGROUP"


def _cgroup_procs(directory: str) -> list[str]:
    spec = json.loads(Path(directory, "spec.json").read_text())
    return [str(procs) for procs in spec.get("cgroup_procs") or []]


def _door(module: Any, argv: list[str], fds: list[int]) -> None:
    """The door's life, in the forked child: fds (stdin, stdout, stderr, channel) at 0-3."""
    code = 0
    try:
        _become_child(fds, ["kibo-job-door", *argv[:1]])
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children only if clone3 is refused
        directory = argv[0]
        joined = _cgroup_procs(directory)
        if not joined:
            raise ValueError("the instance has no cgroup: its jobs need no door")
        for procs in joined:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        # The guests' OOM rank (supervisor_os.GUEST_OOM_SCORE_ADJ), which its jobs inherit.
        with contextlib.suppress(OSError):
            Path("/proc/self/oom_score_adj").write_text("500")
        setattr(module, IN_CGROUP, True)
        _serve_door(socket.socket(fileno=3), module, directory, joined)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


def _serve_door(sock: socket.socket, module: Any, directory: str, joined: list[str]) -> None:
    spare = _Spare.make(module, "guest_exec", [SPARE, directory])
    running = -1  # a pidfd of the job just handed out
    while True:
        try:
            message, ancillary, _, _ = sock.recvmsg(MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
        except OSError:
            return
        if not message:
            return  # the control plane closed the door, or is gone (the spare goes too)
        fds = fds_of(ancillary)
        try:
            request = json.loads(message)
            argv = [str(a) for a in request["argv"]]
            if request.get("program") != "guest_exec" or not argv or argv[0] != directory:
                raise ValueError("a door runs the guest jobs of its own instance only")
            if _cgroup_procs(directory) != joined:
                raise ValueError("the instance's cgroups are not the ones this door joined")
            handed = _handed(spare, argv, fds) if spare is not None else None
            spare = None
            if handed is None:  # none, or gone before its job (killed in its cgroup): nothing ran
                handed = _handed(_Spare(module, "guest_exec", [SPARE, directory]), argv, fds)
                if handed is None:
                    raise OSError("its spare ended before its job")
            pid, pidfd = handed
            running = os.dup(pidfd)
            _reply(sock, pid, pidfd, sibling=False)
        except (OSError, ValueError, KeyError, TypeError) as error:
            with contextlib.suppress(OSError):
                sock.sendmsg([json.dumps({"error": str(error)}).encode()])
        finally:
            for fd in fds:
                os.close(fd)
        if spare is None:
            # The next job's: once this one has ended, or a while, or at the next request
            # (a fork beside the job would compete with it for the CPU of a small machine).
            if running >= 0:
                select.select([sock.fileno(), running], [], [], SPARE_AFTER_S)
                os.close(running)
                running = -1
            spare = _Spare.make(module, "guest_exec", [SPARE, directory])


class _Spare:
    """A child forked ahead of its request: a fork of this interpreter takes ~1.3 ms here and
    the child's first steps ~1 ms more (copy-on-write faults), which were a quarter of an
    `exec` of `true` (bench/process_runtime.py). A door keeps its next guest job so, born in
    the instance's cgroups; the fork server keeps its next supervisor. It waits on a
    socketpair for its argv and fds, then is what `_child` makes of `program`. Reaped by the
    kernel (SIGCHLD is ignored in a door and in the fork server), so the caller follows it
    through its pidfd (`sibling: false`). An unused spare exits when its parent does (the end
    of the socketpair); `title` is its command line until then."""

    def __init__(self, module: Any, program: str, title: list[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            ours.close()
            _spare(module, theirs, program, title)
        theirs.close()
        self.pid = pid
        self.sock = ours
        try:
            self.pidfd = os.pidfd_open(pid)  # now: a job may end (and be reaped) at once
        except OSError:
            ours.close()
            raise

    @classmethod
    def make(cls, module: Any, program: str, title: list[str]) -> _Spare | None:
        try:
            return cls(module, program, title)
        except OSError as error:  # the cgroup's pids.max, say: the next one is forked then
            print(f"{program}: no spare ({error})", file=sys.stderr, flush=True)
            return None

    def hand(self, argv: list[str], fds: list[int]) -> bool:
        """Give it its job; False if it is gone (then the job never ran)."""
        try:
            self.sock.sendmsg([json.dumps(argv).encode()], [rights(fds)])
        except OSError:
            return False
        return True

    def take_pidfd(self) -> int:
        pidfd, self.pidfd = self.pidfd, -1
        return pidfd

    def close(self) -> None:
        self.sock.close()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _handed(spare: _Spare, argv: list[str], fds: list[int]) -> tuple[int, int] | None:
    """Hand `spare` its argv and fds: its (pid, pidfd), or None if it was gone (nothing ran)."""
    try:
        if not spare.hand(argv, fds):
            return None
        return spare.pid, spare.take_pidfd()
    finally:
        spare.close()


def _spare(module: Any, sock: socket.socket, program: str, title: list[str]) -> None:
    """A spare's life, in the forked child: a child's first steps, then its job, or an exit
    if its parent ends first."""
    try:
        _detach()
        keep = sock.fileno()
        os.closerange(3, keep)  # the parent's channel and fds, other spares' ends; 0-2 until the job
        os.closerange(keep + 1, MAX_FD)
        set_cmdline(title)
        message, ancillary, _, _ = sock.recvmsg(MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
        fds = fds_of(ancillary)
        argv = [str(a) for a in json.loads(message)] if message else []
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    if not argv:
        os._exit(0)
    _child(module, program, argv, fds, detached=True)


class _CloneArgs(ctypes.Structure):
    """struct clone_args of clone3(2)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "flags",
            "pidfd",
            "child_tid",
            "parent_tid",
            "exit_signal",
            "stack",
            "stack_size",
            "tls",
            "set_tid",
            "set_tid_size",
            "cgroup",
        )
    ]


SYS_CLONE3 = 435  # the same number on every architecture
CLONE_PIDFD = 0x1000
CLONE_PARENT = 0x8000
# Whether clone3(CLONE_PARENT) works here (it is switched off at its first failure).
SIBLINGS = [True]
# The GIL stays held across the call, as in os.fork (a PyDLL function does not release it).
_pylibc = ctypes.PyDLL(None, use_errno=True)
_pylibc.syscall.restype = ctypes.c_long


def fork_sibling() -> tuple[int, int]:
    """os.fork, except that the child's parent is ours (the control plane), which reaps it:
    clone3(CLONE_PARENT | CLONE_PIDFD) between Python's own before- and after-fork steps
    (the at-fork hooks included), like os.fork. Returns (pid, pidfd) in the parent and
    (0, -1) in the child; falls back to os.fork where clone3 is refused (pidfd -1)."""
    pidfd = ctypes.c_int(-1)
    # CLONE_PARENT takes the exit signal of this process (SIGCHLD) and wants 0 here.
    args = _CloneArgs(flags=CLONE_PARENT | CLONE_PIDFD, pidfd=ctypes.addressof(pidfd))
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = int(_pylibc.syscall(ctypes.c_long(SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args))))
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0, -1
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        SIBLINGS[0] = False
        return os.fork(), -1
    return pid, pidfd.value


# The fds of a message (SCM_RIGHTS), both ways; fork_client.py uses them too.
def rights(fds: list[int]) -> tuple[int, int, bytes]:
    return (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())


def fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += array.array("i", data[:usable]).tolist()
    return fds


if __name__ == "__main__":
    serve(int(sys.argv[1]))
