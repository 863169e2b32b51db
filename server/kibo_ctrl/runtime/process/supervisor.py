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
code), `oom` (the OOM killer killed in the guest's cgroup: the whole guest is killed),
`exit` (the guest's init exited otherwise: a guest "kernel panic"), `not-ready` and
`spawn-failed` (during launch). On the firecracker personality a power-off leaves the
supervisor running and idle (`{"state": "idle", "why": "poweroff"}`), like a VMM whose
guest halted. A graceful stop whose sync fails also leaves it idle (`why: sync-failed`).

INSTANCE_DIR/state.json records the supervisor's and the guest's PIDs.

With bubblewrap isolation (`prepare_guest`, `_start_guest`) the guest runs in its own user
namespace mapped to the node's unprivileged id range (spec `host_id_base`, `host_id_count`):
bwrap is started as that namespace's root with an empty bounding set (userns.py), gets its
options through a file descriptor (no host path in the guest's /proc/1/cmdline) and the
seccomp filter (seccomp.py) through another. The stage (`stage_dir`) is a small tmpfs of the supervisor's
own mount namespace where the guest's trees (layer or overlay root, volumes, run directory)
are bound, since the guest's uid cannot traverse the data directory, and where the agent
scripts are copied (the guest's mount table shows no host path for them)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process import guest_start, idmap, userns
    from kibo_ctrl.runtime.process.supervisor_os import check as _check
    from kibo_ctrl.runtime.process.supervisor_os import children, oom_kills, start_time, sync_all, write_json
else:
    sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its sibling modules
    import guest_start
    import idmap
    import userns
    from supervisor_os import check as _check
    from supervisor_os import children, oom_kills, start_time, sync_all, write_json

PR_SET_PDEATHSIG = 1
CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
TICK = 0.25
# How often readiness is looked for without inotify (with it: at once, and every TICK).
READY_POLL = 0.01
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
# The ready file written in place, created, or renamed into the run directory.
IN_READY_EVENTS = 0x00000008 | 0x00000080 | 0x00000100  # IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
EXIT_BUSY = 75
# What of the guest's own stdout/stderr goes into supervisor.log (per supervisor): the rest is
# dropped, or a guest could fill the host's disk by writing to its init's stdout (/proc/1/fd/1).
GUEST_OUTPUT_LIMIT = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)


class Supervisor:
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

    # -- setup ------------------------------------------------------------------------

    def mark(self, step: str) -> None:
        self.marks.append((step, time.time()))

    def log(self, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} supervisor {os.getpid()}: {message}", flush=True)

    def mount_overlay(self) -> None:
        overlay = self.spec.get("overlay")
        if not overlay:
            return
        # Our own mount namespace: the overlay disappears with us, no mount is left behind.
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        lower, upper, work = overlay["lower"], overlay["upper"], overlay["work"]
        if self.namespace is not None:
            lower, upper, work = self._overlay_layers(lower, upper, work)
        options = f"lowerdir={lower},upperdir={upper},workdir={work}"
        _check(
            _libc.mount(b"overlay", overlay["merged"].encode(), b"overlay", 0, options.encode()),
            "mount overlay",
        )
        os.chdir("/")

    def _overlay_layers(self, lower: str, upper: str, work: str) -> tuple[str, str, str]:
        """The base image idmapped to the guest's ids (its root's files are the guest root's,
        so the guest may change them: copied up into its layer), and relative names for the
        layers, so that the guest's mount table shows no host path. Leaves the cwd in the
        instance directory, for the relative names."""
        os.chdir(self.dir)
        assert self.namespace is not None
        for name in ("lower", "layer"):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700)
        try:
            idmapped = userns.idmapped_clone(lower, self.namespace.fd)
        except OSError as error:
            self.log(f"base image not idmapped ({error}): its files are nobody's in the guest")
            _check(_libc.mount(lower.encode(), b"lower", None, MS_BIND | MS_REC, None), "bind the base image")
        else:
            userns.move_mount(idmapped, "lower")
        layer = os.path.dirname(upper)
        _check(_libc.mount(layer.encode(), b"layer", None, MS_BIND, None), "bind the layer")
        return "lower", f"layer/{os.path.basename(upper)}", f"layer/{os.path.basename(work)}"

    def prepare_storage(self) -> None:
        """Format new layer/volume images and mount them all (storage.py), in a mount namespace
        of our own: they are unmounted when we and the guest are gone, whatever kills us."""
        entries = self.spec.get("storage") or []
        # Rootless: no images, but /run/kibo is a tmpfs still (not a directory of the data dir).
        rootless = bool(self.spec.get("rootless"))
        if not entries and not rootless:
            return
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        storage = _load_storage()
        self.mark("storage-module")
        # The guest's uid 0 on the host (its user namespace's base; 0 without one); rootless,
        # we mount in that namespace, where tmpfs's uid= is the namespace's own (0).
        owner = 0 if rootless else int(self.spec.get("host_id_base", 0))
        if entries:
            # A previous supervisor's namespace may still be going (a guest reset): same image.
            # (Only an image mounted before can be: new ones, pooled or not, are skipped.)
            used = [e for e in entries if os.path.exists(e["image"]) and storage.mount_count(e["image"]) > 0]
            storage.wait_detached(storage.image_files(used), 5.0)
            self.mark("images-detached")
            storage.prepare(entries, owner, self.marks)
            self.mark("images-mounted")
        storage.mount_run_dir(self.spec["run_dir"], owner)

    def listen(self) -> socket.socket:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind("\0" + self.spec["socket"])
        server.listen(16)
        server.setblocking(False)
        self.selector.register(server, selectors.EVENT_READ, "listen")
        return server

    def _enter_cgroup(self) -> None:
        # In the child, between fork and exec (the supervisor is single-threaded here).
        pid = str(os.getpid())
        for procs in self.spec["cgroup_procs"]:
            with open(procs, "w") as f:
                f.write(pid)
        for name, value in self.spec.get("rlimits", []):
            limit = getattr(resource, name)
            resource.setrlimit(limit, (value, value))
        if self.namespace is not None:
            self.namespace.enter()
        # After the credential change, which would clear it.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def spawn(self) -> None:
        for stale in ("ready", "agent.pid", "ready.tmp"):
            with contextlib.suppress(FileNotFoundError):
                (Path(self.spec["run_dir"]) / stale).unlink()
        self.watch_ready()
        self.oom_base = oom_kills(self.spec["oom_file"])
        self.mark("bwrap-fork")
        self.guest = self._start_guest()
        self.mark("bwrap-exec")
        self.pidfd = os.pidfd_open(self.guest.pid)
        self.selector.register(self.pidfd, selectors.EVENT_READ, "guest")
        self.save_state()

    def watch_ready(self) -> None:
        """Be woken when a file appears in the run directory (inotify), so readiness is seen
        when the guest writes its ready file rather than at the next poll. Without inotify
        the loop polls (READY_POLL). Closed once ready: later files there wake no one."""
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self.log(f"no inotify ({os.strerror(ctypes.get_errno())}): polling for readiness")
            return
        watch = _libc.inotify_add_watch(fd, self.spec["run_dir"].encode(), IN_READY_EVENTS)
        if watch < 0:
            self.log(f"no inotify watch ({os.strerror(ctypes.get_errno())}): polling for readiness")
            os.close(fd)
            return
        self.ready_watch, self.ready_watch_id = fd, watch
        self.selector.register(fd, selectors.EVENT_READ, "ready-watch")

    def on_run_dir_event(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.ready_watch, 65536):
                pass  # only that something happened counts: check_ready looks
        if self.state == "starting" and self.guest_alive():
            self.check_ready()

    def stop_watching_ready(self) -> None:
        """Remove the watch (no more events: the kernel frees it in the background) but keep
        the descriptor until we exit: closing an inotify instance waits for an SRCU grace
        period (~20 ms measured here), which would delay the ready message."""
        if self.ready_watch >= 0 and self.ready_watch_id >= 0:
            self.selector.unregister(self.ready_watch)
            _libc.inotify_rm_watch(self.ready_watch, self.ready_watch_id)
            self.ready_watch_id = -1

    # -- the guest's isolation (bubblewrap) ---------------------------------------------

    def create_namespace(self) -> None:
        """The guest's user namespace (bubblewrap isolation only), held by this process."""
        if self.spec["isolation"] != "bwrap":
            return
        base, count = int(self.spec["host_id_base"]), int(self.spec["host_id_count"])
        self.namespace = userns.GuestNamespace(base, count, self.spec.get("host_gid_base"))
        if self.userns_fd >= 0 and userns.is_user_namespace(self.userns_fd):
            # Made ahead by the fork server with this mapping, entered by no one so far.
            os.set_inheritable(self.userns_fd, False)
            self.namespace.fd = self.userns_fd
        else:
            self.namespace.create()
        if self.spec.get("rootless"):
            # Unprivileged: mounts (the stage, an overlay) only in a namespace of our own.
            self.namespace.join()

    def prepare_guest(self) -> None:
        """The guest's user namespace, and its trees staged where its uid can reach them
        (bubblewrap isolation only; see the module docstring)."""
        if self.namespace is None:
            return
        # The guest's writable trees (plain directories or mounted images) are its ids' (once:
        # trees from before the guests had their own ids are real root's). The guest is not running.
        # Rootless: everything is this user's, who is the guest's root: nothing to shift.
        if not self.spec.get("rootless"):
            ids = idmap.IdRange(self.namespace.base, self.namespace.count)
            for tree in self.spec["sync_paths"]:
                idmap.shift_tree(Path(tree), ids)
            self.mark("idmap-shift")
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        # A fresh tmpfs over the stage directory: nothing in it the guest could have planted.
        stage = self.spec["stage_dir"]
        options = b"size=1m,nr_inodes=1024,mode=0755"
        _check(_libc.mount(b"kibo-stage", stage.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount tmpfs")
        # The agent scripts, host root's (nobody's in the guest: it cannot change its agent).
        scripts = f"{stage}/bin"
        os.mkdir(scripts, 0o755)
        for name in sorted(os.listdir(self.spec["bin_dir"])):
            with open(os.path.join(self.spec["bin_dir"], name), "rb") as source:
                script = source.read()
            fd = os.open(f"{scripts}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
            with os.fdopen(fd, "wb") as copy:
                copy.write(script)
        staged = {os.path.join(self.spec["run_dir"], "bin"): scripts}
        for i, source in enumerate(self.spec["staged"]):
            target = f"{stage}/t{i}"
            os.mkdir(target, 0o700)
            _check(_libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {source}")
            staged[source] = target
        argv = list(self.spec["argv"])
        for i, arg in enumerate(argv[:-1]):
            if arg in ("--bind", "--ro-bind") and argv[i + 1] in staged:
                argv[i + 1] = staged[argv[i + 1]]
        self.spec["argv"] = argv

    def _start_guest(self) -> subprocess.Popen[bytes] | guest_start.Started:
        argv, fds = list(self.spec["argv"]), []
        if self.early is not None:
            split = argv.index("--")
            early, self.early = self.early, None
            try:
                return early.start(
                    argv[0],
                    argv[1:split],
                    argv[split:],
                    self.spec["env"],
                    self.spec["cwd"],
                    self.spec["seccomp_filter"],
                )
            except BaseException:
                early.cancel()
                raise
        if self.namespace is not None:
            # bwrap OPTIONS -- ENTRY: the options (host paths) go through a memfd.
            split = argv.index("--")
            program = os.open(self.spec["seccomp_filter"], os.O_RDONLY)
            options = os.memfd_create("bwrap-args", 0)
            fds = [program, options]
            bwrap_options = [*argv[1:split], "--seccomp", str(program)]
            os.write(options, b"".join(arg.encode() + b"\0" for arg in bwrap_options))
            os.lseek(options, 0, os.SEEK_SET)
            argv = [argv[0], "--args", str(options), *argv[split:]]
        try:
            return subprocess.Popen(
                argv,
                env=self.spec["env"],
                cwd=self.spec["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=(output := self.guest_output()),
                stderr=output,
                pass_fds=fds,
                preexec_fn=self._enter_cgroup,
            )
        finally:
            os.close(output)
            for fd in fds:
                os.close(fd)

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
            sys.stdout.buffer.write(chunk[:room])
            if len(chunk) >= room:
                sys.stdout.buffer.write(b"\n[the guest's further output is dropped]\n")
            sys.stdout.buffer.flush()
        self.output_logged += len(chunk)

    def save_state(self) -> None:
        write_json(
            self.dir / "state.json",
            {
                "supervisor_pid": os.getpid(),
                "supervisor_start": start_time(os.getpid()),
                "sandbox_pid": self.guest.pid if self.guest else 0,
                "guest_pid": self.guest_pid,
                "guest_start": self.guest_start,
                "state": self.state,
                "why": self.why,
            },
        )

    # -- the protocol ---------------------------------------------------------------------

    def send(self, client: socket.socket, message: dict[str, Any]) -> None:
        try:
            client.setblocking(True)
            client.settimeout(1.0)
            client.sendall(json.dumps(message).encode() + b"\n")
            client.setblocking(False)
        except OSError:
            self.drop(client)

    def broadcast(self, message: dict[str, Any]) -> None:
        for client in list(self.clients.values()):
            self.send(client, message)

    def set_state(self, state: str, why: str = "", **extra: Any) -> None:
        self.state, self.why = state, why
        self.save_state()
        self.broadcast({"state": state, "why": why, "guest_pid": self.guest_pid, **extra})

    def accept(self, server: socket.socket) -> None:
        client, _ = server.accept()
        creds = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            client.close()
            return
        client.setblocking(False)
        self.clients[client.fileno()] = client
        self.buffers[client.fileno()] = b""
        self.selector.register(client, selectors.EVENT_READ, "client")
        self.send(client, {"state": self.state, "why": self.why, "guest_pid": self.guest_pid})

    def drop(self, client: socket.socket) -> None:
        fd = client.fileno()
        if fd in self.clients:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(client)
            del self.clients[fd]
            del self.buffers[fd]
        if client in self.stop_waiters:
            self.stop_waiters.remove(client)
        client.close()

    def read(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.drop(client)
            return
        fd = client.fileno()
        self.buffers[fd] += data
        while b"\n" in self.buffers.get(fd, b""):
            line, self.buffers[fd] = self.buffers[fd].split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if request.get("op") == "stop":
                self.request_stop(client, bool(request.get("force")))

    # -- lifecycle --------------------------------------------------------------------

    def guest_alive(self) -> bool:
        return self.guest is not None and self.exit_status is None

    def request_stop(self, client: socket.socket, force: bool) -> None:
        self.stop_waiters.append(client)
        if self.stop_force is None or (force and not self.stop_force):
            self.stop_force = force
            self.set_state("stopping", "force" if force else "graceful")
            if not self.guest_alive():
                self.finish_stop()
            elif force:
                self.force_kill()
            else:
                self.stop_deadline = time.monotonic() + float(self.spec["grace_s"])
                target = self.guest_pid or (self.guest.pid if self.guest else 0)
                self.log(f"graceful stop: SIGTERM to the guest ({target})")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signal.SIGTERM)

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
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.guest.pid, signal.SIGKILL)
        for procs in self.spec["cgroup_procs"]:
            with contextlib.suppress(OSError, ValueError):
                for pid in Path(procs).read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)

    def finish_stop(self) -> None:
        """The guest is gone and a stop was asked: sync, then exit (or stay, if the sync failed)."""
        if self.stop_force:
            self.exit("stopped", synced=False)
        error = sync_all(list(self.spec["sync_paths"]))
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
        if oom_kills(self.spec["oom_file"]) > self.oom_base:
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
        if reason == "stopped":
            for client in list(self.stop_waiters):
                self.send(client, {"reply": "stop", "ok": True, "synced": info["synced"], "error": ""})
        self.broadcast({"exit": info})
        for client in list(self.clients.values()):
            self.drop(client)
        sys.exit(0)

    def check_ready(self) -> None:
        if (Path(self.spec["run_dir"]) / "ready").exists():
            self.guest_pid = self._entry_pid()
            with contextlib.suppress(OSError, ValueError):
                self.guest_start = start_time(self.guest_pid)
            self.mark("ready-seen")
            self.stop_watching_ready()
            if self.spec.get("timings"):
                # Before the ready message: whoever reads it after the launch finds it.
                write_json(self.dir / "timings.json", {"marks": self.marks})
            self.set_state("ready")
            self.log(f"the guest is ready (entry PID {self.guest_pid})")

    def _entry_pid(self) -> int:
        assert self.guest is not None
        pid = self.guest.pid
        for _ in range(int(self.spec["entry_depth"])):
            found = children(pid)
            if not found:
                break
            pid = found[0]
        return pid

    def fork_early_guest(self) -> None:
        """With bubblewrap as root and cgroups: the guest's first process now (see guest_start.py)."""
        if self.namespace is None or self.spec.get("rootless") or not self.spec["cgroup_procs"]:
            return
        self.early = guest_start.EarlyGuest(
            list(self.spec["cgroup_procs"]), list(self.spec.get("rlimits", [])), self.namespace, self.guest_output()
        )

    def run(self) -> None:
        self.mark("spec-read")
        self.create_namespace()
        self.fork_early_guest()
        self.mark("userns")
        self.prepare_storage()
        self.mark("storage")
        self.mount_overlay()
        self.listen()
        self.mark("listen")
        try:
            self.prepare_guest()
            self.mark("stage")
            self.spawn()
            self.mark("bwrap-spawned")
        except OSError as error:
            self.exit("spawn-failed", error=f"cannot start the guest: {error}")
        ready_deadline = time.monotonic() + float(self.spec["ready_timeout_s"])
        while True:
            polling = self.state == "starting" and self.ready_watch_id < 0
            timeout = READY_POLL if polling else TICK
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
            now = time.monotonic()
            if self.state == "starting" and self.guest_alive():
                self.check_ready()
                if self.state == "starting" and now > ready_deadline:
                    self.kill_guest()
                    self.exit("not-ready", error=f"the guest did not answer within {self.spec['ready_timeout_s']}s")
            if self.guest_alive() and self.stop_force is None and oom_kills(self.spec["oom_file"]) > self.oom_base:
                # The kernel killed in this guest: the whole "VM" goes, as on a real host.
                self.log("the OOM killer killed in the guest's cgroup: killing the guest")
                self.kill_guest()
            if self.stop_force is False and self.guest_alive() and now > self.stop_deadline:
                self.log("graceful stop: the grace period is over: SIGKILL")
                self.kill_guest()


_STORAGE: list[Any] = []


def _load_storage() -> Any:
    """storage.py, beside this file (run with -I: the package is not on sys.path); loaded
    once (the fork server loads it before it forks supervisors: forkserver.py)."""
    if _STORAGE:
        return _STORAGE[0]
    import importlib.util

    spec = importlib.util.spec_from_file_location("kibo_runtime_storage", Path(__file__).with_name("storage.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _STORAGE.append(module)
    return module


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
