"""The supervisor's guest side: everything between its spec and a running, ready guest.

A mixin of `Supervisor` (supervisor.py, which holds the state these methods use and runs
them in order: see `Supervisor.run`): the guest's user namespace (`create_namespace`),
its storage and overlay mounted in a mount namespace of the supervisor's own
(`prepare_storage`, `mount_overlay`) and its trees staged where its uid can reach them
(`prepare_guest`), all three by a short-lived child (`start_mounts`), bubblewrap
started in its cgroup (`fork_early_guest`, `spawn`, `_start_guest`, `_enter_cgroup`), and
its ready file watched for with inotify (`watch_ready`, `check_ready`). Why a file of its
own: supervisor.py is the entry point, the main loop and the exit; the socket protocol is
supervisor_protocol.py.

Standard library only, like supervisor.py, which imports it by path (it runs as
`python -I -S`) at its top: the fork server (forkserver.py) has it loaded before it forks
supervisors, which then share its pages."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process import guest_start, idmap, userns
    from kibo_ctrl.runtime.process.supervisor_os import (
        PR_SET_PDEATHSIG,
        ChildFailed,
        InChild,
        children,
        join_guest_oom_rank,
        limit_hits,
        oom_kills,
        spare_from_oom,
        start_time,
        write_json,
    )
    from kibo_ctrl.runtime.process.supervisor_os import check as _check
else:
    sys.path.insert(0, str(Path(__file__).parent))  # as supervisor.py (a script): its sibling modules
    import guest_start
    import idmap
    import userns
    from supervisor_os import (
        PR_SET_PDEATHSIG,
        ChildFailed,
        InChild,
        children,
        join_guest_oom_rank,
        limit_hits,
        oom_kills,
        spare_from_oom,
        start_time,
        write_json,
    )
    from supervisor_os import check as _check

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
# The ready file written in place, created, or renamed into the run directory.
IN_READY_EVENTS = 0x00000008 | 0x00000080 | 0x00000100  # IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE

_libc = ctypes.CDLL(None, use_errno=True)


class GuestLaunch:
    """Supervisor's methods that start the guest and see it ready (a mixin: see the module docstring)."""

    if TYPE_CHECKING:
        # What these methods use of the Supervisor (supervisor.py sets it up).
        dir: Path
        userns_fd: int
        marks: list[tuple[str, float]]
        spec: dict[str, Any]
        state: str
        guest: subprocess.Popen[bytes] | guest_start.Started | None
        early: guest_start.EarlyGuest | None
        guest_pid: int
        # (and guest_start, the entry's start time: an int, not declared here, where the name
        # would hide the guest_start module from the annotations below)
        pidfd: int
        status_number: int
        sandbox_start: int
        selector: selectors.BaseSelector
        oom_base: int
        limit_base: int
        namespace: userns.GuestNamespace | None
        ready_watch: int
        ready_watch_id: int
        netns_fd: int  # the guest's network namespace (in_guest_netns), once opened

        def mark(self, step: str) -> None: ...
        def log(self, message: str) -> None: ...
        def guest_output(self) -> int: ...
        def save_state(self) -> None: ...
        def guest_alive(self) -> bool: ...
        def set_state(self, state: str, why: str = "", **extra: Any) -> None: ...

    # -- storage ----------------------------------------------------------------------

    def mount_overlay(self) -> None:
        overlay = self.spec.get("overlay")
        if not overlay:
            return
        # In our own mount namespace (start_mounts): it disappears with us, no mount is left behind.
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

    def start_mounts(self) -> InChild | None:
        """The guest's storage, overlay and stage (`prepare_storage`, `mount_overlay`,
        `prepare_guest`) in a mount namespace of our own, made here: they are unmounted when we
        and the guest are gone, whatever kills us. Started here; `finish_mounts` waits for them
        (None: nothing to mount).

        They are done by a short-lived child (supervisor_os.InChild): it shares the namespace,
        so its mounts are ours, but not its memory. Run here, the Python behind them (storage.py,
        the id shift, the stage) left the pages it wrote copied in this process for the
        workspace's whole life: ~0.75 MiB of an idle supervisor's 3.6 MiB of private memory
        (bench/process_runtime.py's density run)."""
        overlay, entries = self.spec.get("overlay"), self.spec.get("storage") or []
        if not (entries or overlay or self.spec.get("rootless") or self.namespace is not None):
            return None
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        self.mark("mount-ns")
        known = len(self.marks)

        def mount() -> dict[str, Any]:
            self.mark("forked")
            self.prepare_storage()
            self.mark("storage")
            self.mount_overlay()
            try:
                self.prepare_guest()
            except OSError as error:
                return {"stage_error": str(error), "marks": self.marks[known:]}
            self.mark("stage")
            return {"argv": self.spec["argv"], "marks": self.marks[known:]}

        return InChild(mount)

    def finish_mounts(self, mounting: InChild | None) -> str:
        """Wait for `start_mounts`' child: "" or why the stage failed (an OSError there is a
        launch that failed: "cannot start the guest"); anything else that failed raises."""
        if mounting is None:
            return ""
        try:
            done = mounting.answer()
        except ChildFailed as failure:  # as it was raised (main() logs it and writes exit.json)
            raise (OSError if failure.oserror else RuntimeError)(str(failure)) from None
        self.marks += [(str(step), float(when)) for step, when in done["marks"]]
        self.mark("mounted")
        if "stage_error" in done:
            return str(done["stage_error"])
        self.spec["argv"] = list(done["argv"])
        return ""

    def prepare_storage(self) -> None:
        """Format new layer/volume images and mount them all (storage.py), in our mount
        namespace (`start_mounts`)."""
        entries = self.spec.get("storage") or []
        # Rootless: no images, but /run/kibo is a tmpfs still (not a directory of the data dir).
        rootless = bool(self.spec.get("rootless"))
        if not entries and not rootless:
            return
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
        (bubblewrap isolation only; see supervisor.py's docstring)."""
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
        if self.spec.get("resolv_conf"):
            # The guest's /etc/resolv.conf (sandbox.RESOLV_CONF): its gateway, where its resolver is.
            fd = os.open(f"{scripts}/resolv.conf", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as resolv:
                resolv.write(self.spec["resolv_conf"])
        staged = {os.path.join(self.spec["run_dir"], "bin"): scripts}
        # Each file too: the masked /proc files are bound from one (sandbox.EMPTY).
        staged.update(
            (os.path.join(self.spec["run_dir"], "bin", name), f"{scripts}/{name}") for name in os.listdir(scripts)
        )
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

    # -- starting it ------------------------------------------------------------------

    def fork_early_guest(self) -> None:
        """With bubblewrap as root and cgroups: the guest's first process now (see guest_start.py)."""
        if self.namespace is None or self.spec.get("rootless") or not self.spec["cgroup_procs"]:
            return
        status = -1
        if self.spec.get("node_supervisor"):
            # How the guest ends, for the node supervisor (supervisor_handover.py).
            self.status_fd, status = os.pipe2(os.O_CLOEXEC)
        with self.in_guest_netns():
            self.early = guest_start.EarlyGuest(
                list(self.spec["cgroup_procs"]),
                list(self.spec.get("rlimits", [])),
                self.namespace,
                self.guest_output(),
                status,
            )

    @contextlib.contextmanager
    def in_guest_netns(self) -> Iterator[None]:
        """This (single-threaded) process in the guest's network namespace (spec "netns",
        runtime/process/network/) while it forks the guest, which keeps it; then back in its
        own, where the control plane reaches its socket. The fork is in the host's user
        namespace still (it enters the guest's after): setns(CLONE_NEWNET) needs CAP_SYS_ADMIN
        over the namespace's owner, the host's, which the guest never has."""
        path = self.spec.get("netns") or ""
        if not path:
            yield
            return
        if getattr(self, "netns_fd", -1) < 0:
            # Opened once, at the first fork (the path is a mount in the host's mount namespace).
            self.netns_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(self.netns_fd, CLONE_NEWNET), f"setns({path})")
            try:
                yield
            finally:
                _check(_libc.setns(own, CLONE_NEWNET), "setns(back to our network namespace)")
        finally:
            os.close(own)

    def _enter_cgroup(self) -> None:
        # In the child, between fork and exec (the supervisor is single-threaded here).
        pid = str(os.getpid())
        for procs in self.spec["cgroup_procs"]:
            with open(procs, "w") as f:
                f.write(pid)
        join_guest_oom_rank()
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
        self.limit_base = limit_hits(self.spec["oom_file"])
        self.mark("bwrap-fork")
        with self.in_guest_netns():  # (an early guest is in it already)
            self.guest = self._start_guest()
        self.mark("bwrap-exec")
        with contextlib.suppress(OSError, ValueError):
            self.sandbox_start = start_time(self.guest.pid)
        self.pidfd = os.pidfd_open(self.guest.pid)
        self.selector.register(self.pidfd, selectors.EVENT_READ, "guest")
        self.save_state()

    def _start_guest(self) -> subprocess.Popen[bytes] | guest_start.Started:
        argv, fds = list(self.spec["argv"]), []
        if self.early is not None:
            split = argv.index("--")
            early, self.early = self.early, None
            given = argv[1:split]
            if early.status >= 0:
                # The guest is to outlive us (held by the node supervisor): not bwrap's
                # --die-with-parent, and how it ends goes through the status pipe.
                given = [o for o in given if o != "--die-with-parent"]
                given += ["--json-status-fd", str(early.status)]
                self.status_number = early.status
            try:
                return early.start(
                    argv[0],
                    given,
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

    # -- readiness --------------------------------------------------------------------

    def watch_ready(self) -> None:
        """Be woken when a file appears in the run directory (inotify), so readiness is seen
        when the guest writes its ready file rather than at the next poll. Without inotify
        the loop polls (READY_POLL, supervisor.py). Closed once ready: later files there wake no one."""
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

    def check_ready(self) -> None:
        if (Path(self.spec["run_dir"]) / "ready").exists():
            self.guest_pid = self._entry_pid()
            with contextlib.suppress(OSError, ValueError):
                self.guest_start = start_time(self.guest_pid)
            self.mark("ready-seen")
            self.stop_watching_ready()
            # What runs the guest is the OOM killer's last choice in it (a guest kernel does not
            # kill its init): the sandbox's processes down to the entry, and the entry itself
            # when it is kibo's agent (it starts nothing but `sleep`; a custom entry's children
            # would inherit the rank, so it keeps the guests' and its death is a crash).
            chain = self._entry_chain()
            spare_from_oom(chain if self.spec.get("oom_protect_entry") else chain[:-1])
            if self.spec.get("timings"):
                # Before the ready message: whoever reads it after the launch finds it.
                write_json(self.dir / "timings.json", {"marks": self.marks})
            self.set_state("ready")
            self.log(f"the guest is ready (entry PID {self.guest_pid})")

    def _entry_pid(self) -> int:
        return self._entry_chain()[-1]

    def _entry_chain(self) -> list[int]:
        """The sandbox's process (bwrap) and those below it down to the guest's entry process."""
        assert self.guest is not None
        chain = [self.guest.pid]
        for _ in range(int(self.spec["entry_depth"])):
            found = children(chain[-1])
            if not found:
                break
            chain.append(found[0])
        return chain


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
