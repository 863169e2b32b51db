"""The per-instance supervisor: the process runtime's "VMM".

Run as `python -I -S supervisor.py INSTANCE_DIR` (standard library only, so it starts fast
and does not depend on the control plane's environment), or forked as that from the
control plane's fork server (forkserver.py: the same process, without the interpreter's
start-up; it may add `--userns-fd=N`, a user namespace it made ahead with the guests'
mapping, used instead of making one here). It runs in a new session, so a kill -9 of the
control plane leaves it running; it is re-adopted.

It holds an exclusive flock on INSTANCE_DIR/lock for its whole life (a second supervisor
for the same instance exits at once: no double start), reads INSTANCE_DIR/spec.json,
starts the guest (the sandbox command) in the instance's cgroup with PR_SET_PDEATHSIG,
waits for the guest's ready file (woken by inotify), and then serves a line-JSON protocol on an abstract
unix socket (only for clients of its own uid):

    supervisor -> client: {"state": "starting"|"ready"|"stopping"|"idle", "why": ..., ...}
                          {"reply": "stop", "ok": bool, "synced": bool, "error": str}
    client -> supervisor: {"op": "stop", "force": bool}

When it exits it leaves INSTANCE_DIR/exit.json = {"reason", "code", "signal", "synced",
"error"}; a supervisor that vanished without it was killed from outside. Reasons:
`stopped` (a stop finished), `reboot` / `poweroff` (the guest exited with the reserved
code), `oom` (the host ran out of memory and the kernel killed in the guest: the whole
guest is killed, as the host's OOM killer would kill a VM),
`exit` (the guest's init exited otherwise: a guest "kernel panic"), `not-ready` and
`spawn-failed` (during launch). On the firecracker personality a power-off leaves the
supervisor running and idle (`{"state": "idle", "why": "poweroff"}`), like a VMM whose
guest halted. A graceful stop whose sync fails also leaves it idle (`why: sync-failed`).

INSTANCE_DIR/state.json records the supervisor's and the guest's PIDs.

With a node supervisor named in its spec (`--supervisor node`, the default where it works),
the guest is started without the death signal, and once it is ready this process hands the
instance to the node supervisor and exits (supervisor_handover.py, node_supervisor.py),
which then serves it with this same class (`Parked`).

With bubblewrap isolation (`prepare_guest`, `_start_guest`: supervisor_guest.py) the guest
runs in its own user namespace mapped to the node's unprivileged id range (spec
`host_id_base`, `host_id_count`):
bwrap is started as that namespace's root with an empty bounding set (userns.py), gets its
options through a file descriptor (no host path in the guest's /proc/1/cmdline) and the
seccomp filter (seccomp.py) through another. The stage (`stage_dir`) is a small tmpfs of the supervisor's
own mount namespace where the guest's trees (layer or overlay root, volumes, run directory)
are bound, since the guest's uid cannot traverse the data directory, and where the agent
scripts are copied (the guest's mount table shows no host path for them).

This file is the entry point (`main`), the supervisor's state, its main loop (`run`), the
guest's exit and the supervisor's own. `Supervisor`'s other methods are in two mixins beside
it, one job each: starting the guest and seeing it ready (supervisor_guest.py) and the
client protocol (supervisor_protocol.py)."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process import guest_start, userns
    from kibo_ctrl.runtime.process.supervisor_guest import GuestLaunch
    from kibo_ctrl.runtime.process.supervisor_guest import _load_storage as _load_storage
    from kibo_ctrl.runtime.process.supervisor_handover import HandOver
    from kibo_ctrl.runtime.process.supervisor_os import (
        kill_cgroups,
        limit_hits,
        logged_oom_kills,
        oom_kills,
        reap_answered,
        start_time,
        sync_all,
        watch_kernel_log,
        write_json,
    )
    from kibo_ctrl.runtime.process.supervisor_protocol import Clients
else:
    sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its sibling modules
    import guest_start
    import userns  # also the fork server's (forkserver.py), which reads it here
    from supervisor_guest import GuestLaunch
    from supervisor_guest import _load_storage as _load_storage  # forkserver.py calls it here
    from supervisor_handover import HandOver
    from supervisor_os import (
        kill_cgroups,
        limit_hits,
        logged_oom_kills,
        oom_kills,
        reap_answered,
        start_time,
        sync_all,
        watch_kernel_log,
        write_json,
    )
    from supervisor_protocol import Clients

TICK = 0.25
# How often readiness is looked for without inotify (with it: at once, and every TICK).
READY_POLL = 0.01
EXIT_BUSY = 75
# What of the guest's own stdout/stderr goes into supervisor.log (per supervisor): the rest is
# dropped, or a guest could fill the host's disk by writing to its init's stdout (/proc/1/fd/1).
GUEST_OUTPUT_LIMIT = 1 << 20


class Supervisor(GuestLaunch, Clients, HandOver):
    def __init__(self, directory: Path, started: float = 0.0, userns_fd: int = -1) -> None:
        self.dir = directory
        # The guest's user namespace, made ahead by the fork server (-1: make it here).
        self.userns_fd = userns_fd
        # (step, wall-clock time it ended): written to timings.json once the guest is ready
        # when the spec asks (`"timings": true`: the benchmark's breakdown of a launch).
        self.marks: list[tuple[str, float]] = [("main", started or time.time())]
        self.spec: dict[str, Any] = json.loads((directory / "spec.json").read_text())
        self.state = "starting"
        self.why = ""
        self.guest: subprocess.Popen[bytes] | guest_start.Started | None = None
        # The guest's first process, forked early to join its cgroup meanwhile (guest_start.py).
        self.early: guest_start.EarlyGuest | None = None
        self.guest_pid = 0  # the guest's entry process (host PID)
        self.guest_start = 0  # its start time, to tell it from a later process with the same PID
        self.pidfd = -1
        self.clients: dict[int, socket.socket] = {}
        self.buffers: dict[int, bytes] = {}
        self.selector = selectors.DefaultSelector()
        self.oom_base = 0
        # The guest's own limit's count when OOM kills were last looked at (supervisor_os
        # limit_hits), and whether the host (not the guest's own limit) ran out: then the whole
        # guest goes, as a VM the host's OOM killer chose.
        self.limit_base = 0
        self.host_oom = False
        watch_kernel_log()
        # A stop in progress: (force, deadline for the guest to exit) and who asked.
        self.stop_force: bool | None = None
        self.stop_deadline = 0.0
        self.stop_waiters: list[socket.socket] = []
        self.sync_error = ""
        self.exit_status: int | None = None
        self.namespace: userns.GuestNamespace | None = None
        self.output_fd = -1
        self.output_logged = 0
        self.ready_watch = -1  # inotify on the run directory until the guest is ready
        self.ready_watch_id = -1
        self.lock_fd = -1  # INSTANCE_DIR/lock, flocked (main)
        self.server: socket.socket | None = None  # the protocol's listening socket
        # bwrap's --json-status-fd (read end), which says how the guest ended to a node
        # supervisor that is not bwrap's parent (supervisor_handover.py); -1: none.
        self.status_fd = -1
        self.status_number = -1  # its write end's number in bwrap (a node supervisor re-opens it)
        self.sandbox_start = 0  # bwrap's start time, to tell it from a later process with its PID
        # Whether this process is the node supervisor holding the instance (node_supervisor.py).
        self.parked = False

    # -- setup ------------------------------------------------------------------------

    def mark(self, step: str) -> None:
        self.marks.append((step, time.time()))

    def log(self, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} supervisor {os.getpid()}: {message}", flush=True)

    # -- the guest's output, the state file ---------------------------------------------

    def guest_output(self) -> int:
        """The write end of a pipe for the guest's stdout and stderr, drained into our log
        up to GUEST_OUTPUT_LIMIT bytes (`drain_output`)."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        self.output_fd = read
        self.selector.register(read, selectors.EVENT_READ, "output")
        return write

    def drain_output(self) -> None:
        # One select() batch can hold the guest's exit and its output: the exit drains the
        # pipe to its end and closes it, and the output event that follows finds it gone.
        if self.output_fd < 0:
            return
        try:
            chunk = os.read(self.output_fd, 65536)
        except BlockingIOError:
            return
        if not chunk:  # every writer is gone
            self.selector.unregister(self.output_fd)
            os.close(self.output_fd)
            self.output_fd = -1
            return
        room = GUEST_OUTPUT_LIMIT - self.output_logged
        if room > 0:
            self.write_output(chunk[:room])
            if len(chunk) >= room:
                self.write_output(b"\n[the guest's further output is dropped]\n")
        self.output_logged += len(chunk)

    def write_output(self, chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    def save_state(self) -> None:
        write_json(
            self.dir / "state.json",
            {
                "supervisor_pid": os.getpid(),
                "supervisor_start": start_time(os.getpid()),
                "sandbox_pid": self.guest.pid if self.guest else 0,
                "sandbox_start": self.sandbox_start,
                "status_fd": self.status_number,
                "oom_base": self.oom_base,
                "guest_pid": self.guest_pid,
                "guest_start": self.guest_start,
                "state": self.state,
                "why": self.why,
                "parked": self.parked,
            },
        )

    # -- lifecycle --------------------------------------------------------------------

    def guest_alive(self) -> bool:
        return self.guest is not None and self.exit_status is None

    def force_kill(self) -> None:
        # One short sync: whatever the guest's kernel-side writes reach disk in time.
        paths = list(self.spec["sync_paths"])
        worker = threading.Thread(target=sync_all, args=(paths,), daemon=True)
        worker.start()
        worker.join(float(self.spec["force_sync_s"]))
        self.kill_guest()

    def kill_guest(self) -> None:
        if self.early is not None:
            self.early.cancel()
            self.early = None
        if self.guest is not None and self.exit_status is None:
            self.signal_sandbox(signal.SIGKILL)
        kill_cgroups(list(self.spec["cgroup_procs"]))

    def signal_sandbox(self, signum: int) -> None:
        """Signal bwrap (our child here: its PID is not reused before we wait for it)."""
        assert self.guest is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.guest.pid, signum)

    def signal_entry(self, signum: int) -> None:
        """Signal the guest's entry process (a graceful stop's SIGTERM)."""
        target = self.guest_pid or (self.guest.pid if self.guest else 0)
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signum)

    def release(self) -> None:
        """At the exit, before the clients hear it: what lets a new supervisor have the
        instance. Nothing here (the process's exit releases all); the node supervisor's
        `Parked` closes the instance's lock and files."""

    def finish_stop(self) -> None:
        """The guest is gone and a stop was asked: sync, then exit (or stay, if the sync failed)."""
        if self.stop_force:
            self.exit("stopped", synced=False)
        self.synced(sync_all(list(self.spec["sync_paths"])))

    def synced(self, error: str) -> None:
        """A graceful stop's sync ended ("" or what failed): exit, or stay idle."""
        if self.stop_force is not False:
            return  # a force stop came meanwhile, and ended it
        if error:
            self.log(f"graceful stop: sync failed: {error}")
            for client in list(self.stop_waiters):
                self.send(client, {"reply": "stop", "ok": False, "synced": False, "error": error})
            self.stop_waiters.clear()
            self.stop_force = None
            self.set_state("idle", "sync-failed", error=error)
            return
        self.exit("stopped", synced=True)

    def on_guest_exit(self) -> None:
        assert self.guest is not None
        status = self.guest.wait()
        self.exit_status = status
        self.stop_watching_ready()
        self.selector.unregister(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = -1
        # Whatever the guest left behind in its cgroup (the unisolated mode) goes with it.
        self.kill_guest()
        # Its last words (a guest "kernel panic" message) before the exit is reported.
        for _ in range(64):
            if self.output_fd < 0 or self.output_logged >= GUEST_OUTPUT_LIMIT:
                break
            before = self.output_logged
            self.drain_output()
            if self.output_logged == before:
                break
        code = status if status >= 0 else None
        killed = -status if status < 0 else None
        self.log(f"the guest exited: code {code} signal {killed}")
        if self.stop_force is not None:
            self.finish_stop()
            return
        self.check_oom()
        if self.host_oom:
            self.exit("oom", code=code, signal=killed)
        if self.state == "starting":
            self.exit("not-ready", code=code, signal=killed, error="the guest exited before it was ready")
        if code == self.spec["reboot_code"]:
            self.exit("reboot", code=code)
        if code == self.spec["poweroff_code"]:
            if self.spec["personality"] == "firecracker":
                # The VMM keeps running with a halted guest: idle until stopped.
                self.set_state("idle", "poweroff")
                return
            self.exit("poweroff", code=code)
        self.exit("exit", code=code, signal=killed)

    def exit(self, reason: str, *, code: int | None = None, signal: int | None = None, **extra: Any) -> None:
        if self.early is not None:  # a launch that failed before its guest started
            self.early.cancel()
            self.early = None
        info = {"reason": reason, "code": code, "signal": signal, "synced": False, "error": "", **extra}
        write_json(self.dir / "exit.json", info)
        self.state, self.why = "exited", reason
        with contextlib.suppress(OSError):
            self.save_state()
        self.log(f"exiting: {info}")
        self.release()
        if reason == "stopped":
            for client in list(self.stop_waiters):
                self.send(client, {"reply": "stop", "ok": True, "synced": info["synced"], "error": ""})
        self.broadcast({"exit": info})
        for client in list(self.clients.values()):
            self.drop(client)
        sys.exit(0)

    def run(self) -> None:
        self.mark("spec-read")
        self.create_namespace()
        self.mark("userns")
        mounting = self.start_mounts()  # by a child: what follows here runs beside it
        self.fork_early_guest()
        self.mark("early-guest")
        self.server = self.listen()
        self.mark("listen")
        failed = self.finish_mounts(mounting)
        if failed:
            self.exit("spawn-failed", error=f"cannot start the guest: {failed}")
        try:
            self.spawn()
            self.mark("bwrap-spawned")
        except OSError as error:
            self.exit("spawn-failed", error=f"cannot start the guest: {error}")
        reap_answered()  # the mount child, gone meanwhile
        ready_deadline = time.monotonic() + float(self.spec["ready_timeout_s"])
        while True:
            polling = self.state == "starting" and self.ready_watch_id < 0
            self.serve(READY_POLL if polling else TICK)
            now = time.monotonic()
            if self.state == "starting" and self.guest_alive():
                self.check_ready()
                if self.state == "starting" and now > ready_deadline:
                    self.kill_guest()
                    self.exit("not-ready", error=f"the guest did not answer within {self.spec['ready_timeout_s']}s")
            self.watch(now)
            if self.state == "ready" and self.can_hand_over():
                self.hand_over()  # to the node supervisor: does not return if it took the instance

    def serve(self, timeout: float) -> None:
        """Handle what is ready on our descriptors within `timeout` seconds."""
        for key, _ in self.selector.select(timeout):
            if key.data == "listen":
                self.accept(key.fileobj)  # type: ignore[arg-type]
            elif key.data == "client":
                self.read(key.fileobj)  # type: ignore[arg-type]
            elif key.data == "guest":
                self.on_guest_exit()
            elif key.data == "ready-watch":
                self.on_run_dir_event()
            elif key.data == "output":
                self.drain_output()
            else:
                self.dispatch_other(key.data)

    def dispatch_other(self, data: Any) -> None:
        """An event of a descriptor only a subclass registers (node_supervisor.py's Parked)."""

    def watch(self, now: float) -> None:
        """Every TICK: the OOM killer's kills, and a graceful stop's grace period."""
        if self.guest_alive() and self.stop_force is None and oom_kills(self.spec["oom_file"]) > self.oom_base:
            self.check_oom()
            if self.host_oom:
                # The host (or the node's share of it) ran out: the whole "VM" goes, as the
                # host's OOM killer would kill a VM.
                self.log("the kernel killed in the guest for lack of the host's memory: killing the guest")
                self.kill_guest()
        if self.stop_force is False and self.guest_alive() and now > self.stop_deadline:
            self.log("graceful stop: the grace period is over: SIGKILL")
            self.kill_guest()

    def check_oom(self) -> None:
        """New OOM kills in the guest's cgroup: whose memory ran out? The guest's own limit (its
        memory is its guest's: the kernel killed one process in it, as a guest kernel's OOM
        killer would; the guest runs on, and its clients hear of it: {"oom": {...}}), or the
        host's, or a limit above the guest's (the node's share): `host_oom`. Told by the
        kernel's log record of each kill (oom_memcg is the guest's own cgroup, or not); where the
        log cannot be read, by the guest's own limit's counter (supervisor_os.limit_hits)."""
        oom_file = self.spec["oom_file"]
        kills = oom_kills(oom_file)
        if kills <= self.oom_base:
            return
        count, self.oom_base = kills - self.oom_base, kills
        hits = limit_hits(oom_file)
        logged = logged_oom_kills(oom_file)
        own = all(kill.own_limit for kill in logged) if logged else hits > self.limit_base
        self.limit_base = hits
        with contextlib.suppress(OSError):
            self.save_state()  # the new base: a re-adopting node supervisor does not count them again
        if not own:
            self.host_oom = True
            return
        victim = logged[-1] if logged else None
        who = f"PID {victim.pid} ({victim.command})" if victim else "a process"
        self.log(f"the guest went over its memory: the kernel killed {who} in it ({count} kill(s)); it runs on")
        self.broadcast(
            {"oom": {"pid": victim.pid if victim else 0, "command": victim.command if victim else "", "count": count}}
        )


def main() -> None:
    started = time.time()
    directory = Path(sys.argv[1])
    lock = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    import fcntl

    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("another supervisor runs this instance", file=sys.stderr)
        sys.exit(EXIT_BUSY)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    with contextlib.suppress(FileNotFoundError):
        (directory / "exit.json").unlink()
    given = [a.removeprefix("--userns-fd=") for a in sys.argv[2:] if a.startswith("--userns-fd=")]
    supervisor = Supervisor(directory, started, int(given[0]) if given else -1)
    supervisor.lock_fd = lock
    try:
        supervisor.run()
    except SystemExit:
        raise
    except BaseException as error:
        supervisor.log(f"failed: {error!r}")
        supervisor.kill_guest()
        write_json(directory / "exit.json", {"reason": "spawn-failed", "error": f"supervisor failed: {error}"})
        raise


# The entry of a child of the fork server (forkserver.py): the same as the script's.
entry = main

if __name__ == "__main__":
    main()
