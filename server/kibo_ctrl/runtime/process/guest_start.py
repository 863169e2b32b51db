"""The guest's first process, forked early: it joins its cgroup while the supervisor
prepares storage, then becomes bubblewrap (standard library only: supervisor.py imports it).

Why: moving a process into a cgroup v1 hierarchy (a write to cgroup.procs) waits for an RCU
grace period when no other migration happened just before: 10-20 ms measured here, which
was most of "start bwrap" in a launch (bench/process_runtime.py --breakdown). The wait is
the kernel's; only its place can change. So the supervisor forks the guest-to-be right
after it made the guest's user namespace: the child enters the cgroups (and the rlimits)
at once, in parallel with the mounts, then waits for `start`.

`start` hands it the final bubblewrap command line (the staged paths are known only then)
over a pipe; the child then joins the supervisor's *current* mount namespace (made after
the fork: the images and the stage are mounted there), opens the seccomp filter, writes the
options to a memfd, keeps exactly stdin (/dev/null), stdout and stderr (the guest output
pipe) and those two descriptors, enters the guest's user namespace the same way as before
(userns.GuestNamespace.enter: its root, no capability in the bounding set, no nested user
namespace), sets PR_SET_PDEATHSIG and execs bwrap: the same process state as the Popen
with a preexec function it replaces, one step reordered (the cgroup first, which changes
nothing: the child runs nothing but this code until the exec). An exec that fails is
reported through a close-on-exec pipe, as subprocess does; if the supervisor dies first,
the child dies with it (PR_SET_PDEATHSIG from its first instruction on)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
from pathlib import Path
from typing import Any, NoReturn

PR_SET_PDEATHSIG = 1
CLONE_NEWNS = 0x00020000
# Above any descriptor the supervisor could hold (close_range(2) makes this cheap).
MAX_FD = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)


def _argv_area() -> tuple[int, int]:
    """Where the kernel reads this process's /proc/PID/cmdline from: [arg_start, arg_end)."""
    stat = Path("/proc/self/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # Fields 48 and 49 of proc(5) (1-based), counted here from field 3.
    return int(fields[45]), int(fields[46])


def set_cmdline(words: list[str]) -> None:
    """Rewrite this process's command line in place (the argv area the kernel shows as
    /proc/PID/cmdline): what setproctitle does. Longer titles are cut to the area."""
    start, end = _argv_area()
    title = b"".join(os.fsencode(word) + b"\0" for word in words)[: end - start - 1]
    ctypes.memmove(start, title + b"\0" * (end - start - len(title)), end - start)


def _supervisor_args() -> list[str]:
    """The supervisor's arguments after its script (its instance directory first)."""
    words = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    script = next((i for i, w in enumerate(words) if w.endswith(b"supervisor.py")), len(words) - 1)
    return [os.fsdecode(w) for w in words[script + 1 :] if w]


class Started:
    """The bwrap process (the supervisor's child), like the Popen it replaces."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class EarlyGuest:
    def __init__(
        self, cgroup_procs: list[str], rlimits: list[list[Any]], namespace: Any, output: int, status: int = -1
    ) -> None:
        """Fork now (single-threaded caller). `namespace`: a userns.GuestNamespace;
        `output`: the write end of the guest's output pipe (closed here, kept by the child).
        `status` (-1: none): the write end of a pipe for bwrap's --json-status-fd, kept by
        the child under the same number (`self.status`, for the option) and closed here. With
        it the guest is not killed when this supervisor dies: it is to outlive it, held by the
        node supervisor (supervisor_handover.py), which learns how it ended from that pipe."""
        go_r, self.go_w = os.pipe2(os.O_CLOEXEC)
        self.err_r, err_w = os.pipe2(os.O_CLOEXEC)
        self.status = status
        supervisor = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.go_w)
            os.close(self.err_r)
            self._child(supervisor, go_r, err_w, output, cgroup_procs, rlimits, namespace, status)
        os.close(go_r)
        os.close(err_w)
        os.close(output)
        if status >= 0:
            os.close(status)

    @staticmethod
    def _child(
        supervisor: int,
        go: int,
        err: int,
        output: int,
        cgroup_procs: list[str],
        rlimits: list[list[Any]],
        namespace: Any,
        status: int,
    ) -> NoReturn:
        try:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != supervisor:
                os._exit(1)  # it died before the death signal was set
            # Not the supervisor: ps, pkill -f and the tests find supervisors by their command
            # line, so the guest-to-be says what it is until it becomes bwrap.
            set_cmdline(["kibo-guest-start", *_supervisor_args()])
            pid = str(os.getpid())
            for procs in cgroup_procs:  # the slow part, beside the supervisor's mounts
                with open(procs, "w") as f:
                    f.write(pid)
            # The guests' OOM rank (supervisor_os.GUEST_OOM_SCORE_ADJ): its init is put back.
            with contextlib.suppress(OSError):
                Path("/proc/self/oom_score_adj").write_text("500")
            for name, value in rlimits:
                limit = getattr(resource, name)
                resource.setrlimit(limit, (value, value))
            chunks = []
            while chunk := os.read(go, 65536):
                chunks.append(chunk)
            if not chunks:
                os._exit(1)  # the supervisor gave up (its end closed without a command)
            request = json.loads(b"".join(chunks))
            # The supervisor's mount namespace now: its images and stage are mounted there.
            mnt = os.open(f"/proc/{supervisor}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            if _libc.setns(mnt, CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "setns(mnt)")
            os.close(mnt)
            os.chdir(request["cwd"])
            program = os.open(request["seccomp_filter"], os.O_RDONLY)
            options = os.memfd_create("bwrap-args", 0)
            os.write(options, b"".join(a.encode() + b"\0" for a in [*request["options"], "--seccomp", str(program)]))
            os.lseek(options, 0, os.SEEK_SET)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(output, 1)
            os.dup2(output, 2)
            # The user namespace's descriptor too, for `enter` (close-on-exec: gone in bwrap).
            keep = sorted({program, options, err, namespace.fd} | ({status} if status >= 0 else set()))
            low = 3
            for fd in keep:
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, MAX_FD)
            os.set_inheritable(program, True)
            os.set_inheritable(options, True)
            if status >= 0:
                os.set_inheritable(status, True)
            # What subprocess resets for an exec (restore_signals); the rest is inherited as it was.
            for name in ("SIGPIPE", "SIGXFSZ"):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
            namespace.enter()
            if status < 0:
                # After the credential change, which would clear it (as it clears the one above:
                # a guest handed to the node supervisor outlives this one).
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            argv = [request["program"], "--args", str(options), *request["entry"]]
            os.execvpe(argv[0], argv, request["env"])
        except BaseException as error:
            with contextlib.suppress(BaseException):
                os.write(err, f"{type(error).__name__}: {error}".encode()[:4000])
        os._exit(127)

    def start(
        self, program: str, options: list[str], entry: list[str], env: dict[str, str], cwd: str, seccomp_filter: str
    ) -> Started:
        """Hand over the command line; returns once bwrap runs (OSError: it could not)."""
        request = {"program": program, "options": options, "entry": entry, "env": env, "cwd": cwd}
        request["seccomp_filter"] = seccomp_filter
        data = json.dumps(request).encode()
        try:
            while data:
                data = data[os.write(self.go_w, data) :]
        finally:
            os.close(self.go_w)
            self.go_w = -1
        failure = b""
        try:
            while chunk := os.read(self.err_r, 4096):
                failure += chunk
        finally:
            os.close(self.err_r)
            self.err_r = -1
        started = Started(self.pid)
        if failure:
            started.wait()
            raise OSError(f"bwrap did not start: {failure.decode(errors='replace')}")
        return started

    def cancel(self) -> None:
        """The launch failed before `start`: the waiting child goes."""
        for fd in (self.go_w, self.err_r):
            if fd >= 0:
                os.close(fd)
        self.go_w = self.err_r = -1
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
