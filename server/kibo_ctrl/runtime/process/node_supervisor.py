"""The node supervisor (`--supervisor node`): one process that holds every ready guest of a
data directory, in place of one supervisor process per workspace.

Why: see supervisor_handover.py. Each instance is still launched by a supervisor of its own
(supervisor.py: mounts, bwrap, readiness); once its guest is ready that supervisor hands
the instance over and exits, and from then on the instance costs this process a few
descriptors and one Python object (`Parked`), not an interpreter.

`Parked` is a `Supervisor` (the same protocol, stop, sync, OOM and guest-exit rules, the
same exit.json and state.json: one code for both) built from the hand-over instead of a
launch, with its own selector (an epoll descriptor, watched here), so each instance is
served exactly as its supervisor served it. What differs: bwrap is not our child (its
exit code comes from its --json-status-fd pipe, signals go through its pidfd), the synced
trees are the directories handed over (the images are mounted in the guest's namespace, not
ours), the log is the instance's supervisor.log, and an instance's exit (`Supervisor.exit`,
SystemExit) ends that instance, not this process: its lock and files are closed before its
clients hear of it, so a restart finds the instance free.

Run as `python -I -S node_supervisor.py DATA_DIR NAME` by the runtime (runtime.py,
node_supervision.py), in a session of its own: it outlives a kill -9 of the control plane,
as supervisors do, and a restarted control plane re-attaches to its instances through their
own sockets. It holds DATA_DIR/runtime/node-supervisor.lock (a second one exits at once),
listens on the abstract unix socket NAME (SOCK_SEQPACKET, own uid only) for hand-overs and
for the runtime's connection, and exits when it holds no instance and no runtime is
connected (after a START_GRACE_S start). If it dies, its guests run on (nothing ties them to
it) and the runtime starts another at once (node_supervision.py), which re-adopts them
before it listens (`readopt_all`, node_holdings.py); the instances' handles wait for that
(supervisor_handle.py READOPT_S). A guest that ended meanwhile gets its exit.json ("exit":
the control plane reports a crash).

Standard library only, like supervisor.py (it imports supervisor.py by path)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kibo_ctrl.runtime.process.guest_start import Started
    from kibo_ctrl.runtime.process.node_holdings import Gone, Held, handed_over, read_state, readopt, release
    from kibo_ctrl.runtime.process.supervisor import TICK, Supervisor
    from kibo_ctrl.runtime.process.supervisor_handover import MAX_FDS, MESSAGE
    from kibo_ctrl.runtime.process.supervisor_os import forget_oom, limit_hits, pidfd_if, sync_all, write_json
else:
    sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its sibling modules
    from guest_start import Started
    from node_holdings import Gone, Held, handed_over, read_state, readopt, release
    from supervisor import TICK, Supervisor
    from supervisor_handover import MAX_FDS, MESSAGE
    from supervisor_os import forget_oom, limit_hits, pidfd_if, sync_all, write_json

EXIT_BUSY = 75
# How long a new node supervisor waits for its first instance or runtime before it exits.
START_GRACE_S = 10.0
# How long a supervisor that said "go" has to be gone.
GONE_S = 5.0


class ParkedGuest(Started):
    """bwrap, which is not our child: followed through its pidfd and status pipe."""

    def __init__(self, pid: int, pidfd: int, status_fd: int) -> None:
        super().__init__(pid)
        self.pidfd = pidfd
        self.status_fd = status_fd

    def wait(self) -> int:
        """How it ended (called once its pidfd is readable: it has exited). As a wait status
        would say: bwrap's exit code; -9 if it was killed before it could write one."""
        if self.returncode is None:
            data = b""
            with contextlib.suppress(OSError):
                os.set_blocking(self.status_fd, False)
                while chunk := os.read(self.status_fd, 65536):
                    data += chunk
            self.returncode = -signal.SIGKILL
            for line in data.splitlines():
                with contextlib.suppress(ValueError, AttributeError):
                    code = json.loads(line).get("exit-code")
                    if isinstance(code, int):
                        self.returncode = code
        return self.returncode


class Parked(Supervisor):
    """One handed-over instance (see the module docstring)."""

    def __init__(self, directory: Path, held: Held, readopted: bool = False) -> None:
        super().__init__(directory)
        self.parked = True
        self.readopted = readopted  # after a restart of ours: no synced trees (node_holdings.py)
        self.syncing = False  # a graceful stop's sync runs (`finish_stop`)
        self.force_deadline = 0.0  # a force stop's kill is due then (0: none)
        self.sync_outcomes: dict[int, list[str]] = {}  # by the done pipe of each sync running
        # Its own epoll, which the node supervisor watches (readable: something to serve).
        self.selector.close()
        self.epoll = selectors.EpollSelector()
        self.selector = self.epoll
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self.log_fd = os.open(directory / "supervisor.log", flags, 0o600)
        self.lock_fd, self.server, self.pidfd = held.lock_fd, held.server, held.pidfd
        self.status_fd, self.status_number, self.output_fd = held.status_fd, held.status_number, held.output_fd
        self.sync_dirs = held.sync_dirs
        # The trees as this process reaches them: through the directories handed over.
        self.spec["sync_paths"] = [f"/proc/self/fd/{fd}" for fd in self.sync_dirs]
        self.guest = ParkedGuest(held.sandbox_pid, self.pidfd, self.status_fd)
        self.sandbox_start = held.sandbox_start
        self.guest_pid, self.guest_start = held.guest_pid, held.guest_start
        self.entry_fd = self._entry_pidfd()
        self.oom_base = held.oom_base
        self.limit_base = limit_hits(self.spec["oom_file"])
        self.state, self.why = held.state, held.why
        self.output_logged = held.output_logged
        self.server.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ, "listen")
        self.selector.register(self.pidfd, selectors.EVENT_READ, "guest")
        if self.output_fd >= 0:
            self.selector.register(self.output_fd, selectors.EVENT_READ, "output")
        for client, pending in held.clients:
            client.setblocking(False)
            self.clients[client.fileno()] = client
            self.buffers[client.fileno()] = pending
            self.selector.register(client, selectors.EVENT_READ, "client")

    def _entry_pidfd(self) -> int:
        """A pidfd of the guest's entry process, if it is still the one recorded."""
        return pidfd_if(self.guest_pid, self.guest_start)

    def log(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} node supervisor {os.getpid()}: {message}\n"
        with contextlib.suppress(OSError):
            os.write(self.log_fd, line.encode())

    def write_output(self, chunk: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(self.log_fd, chunk)

    def signal_sandbox(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signum)

    def signal_entry(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            if self.entry_fd >= 0:
                signal.pidfd_send_signal(self.entry_fd, signum)
            else:
                signal.pidfd_send_signal(self.pidfd, signum)

    # -- syncs in a thread: one instance's sync does not hold up the others -------------

    def force_kill(self) -> None:
        # As Supervisor.force_kill (one short sync, then SIGKILL), without waiting here:
        # the kill comes when the sync ends or at the deadline (`watch`).
        self.force_deadline = time.monotonic() + float(self.spec["force_sync_s"])
        self._sync_beside("force-synced")

    def finish_stop(self) -> None:
        if self.stop_force:
            super().finish_stop()  # exits, without a sync
        elif self.readopted:
            # Nothing of the trees to sync here: the runtime syncs the images (module docstring).
            self.exit("stopped", synced=False)
        elif not self.syncing:
            self._sync_beside("synced")

    def _sync_beside(self, event: str) -> None:
        done_r, done_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.selector.register(done_r, selectors.EVENT_READ, (event, done_r))
        self.syncing = event == "synced"
        paths = list(self.spec["sync_paths"])
        outcome: list[str] = []
        self.sync_outcomes[done_r] = outcome

        def work() -> None:
            outcome.append(sync_all(paths))
            with contextlib.suppress(OSError):
                os.write(done_w, b".")
            os.close(done_w)

        threading.Thread(target=work, daemon=True, name=f"sync {self.dir.name}").start()

    def dispatch_other(self, data: Any) -> None:
        event, done_r = data
        self.selector.unregister(done_r)
        os.close(done_r)
        error = (self.sync_outcomes.pop(done_r, None) or [""])[0]
        if event == "force-synced":
            self.force_deadline = 0.0
            self.kill_guest()
        elif event == "synced":
            self.syncing = False
            self.synced(error)

    def watch(self, now: float) -> None:
        if self.force_deadline and now > self.force_deadline:
            self.force_deadline = 0.0
            self.kill_guest()
        super().watch(now)

    def release(self) -> None:
        # Before the clients hear of the exit: a new supervisor may have the instance then,
        # and its images are unmounted once the guest's namespace and these are gone.
        for fd in self.sync_dirs:
            os.close(fd)
        self.sync_dirs = []
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def close(self) -> None:
        """After the exit (or if the hand-over is dropped): every descriptor of the instance."""
        self.release()
        for client in list(self.clients.values()):
            self.drop(client)
        if self.server is not None:
            self.server.close()
        for fd in (self.pidfd, self.status_fd, self.output_fd, self.entry_fd, self.ready_watch, self.log_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.pidfd = self.status_fd = self.output_fd = self.entry_fd = self.ready_watch = self.log_fd = -1
        forget_oom(self.spec["oom_file"])
        for done_r in self.sync_outcomes:  # syncs still running: their threads' writes fail
            os.close(done_r)
        self.sync_outcomes.clear()
        self.selector.close()


class Pending:
    """A hand-over answered but not final: waits for the supervisor's "go" and its exit."""

    def __init__(self, parked: Parked, supervisor_pidfd: int) -> None:
        self.parked = parked
        self.supervisor_pidfd = supervisor_pidfd
        self.deadline = 0.0  # set by "go"


class NodeSupervisor:
    def __init__(self, data_dir: Path, listener: socket.socket) -> None:
        self.instances_dir = data_dir / "instances"
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, ("listen", None))
        self.instances: dict[int, Parked] = {}  # by their selector's fd
        self.peers: dict[int, socket.socket] = {}  # connections, by fd
        self.handing: dict[int, Pending] = {}  # answered hand-overs, by their connection's fd
        self.going: list[Pending] = []  # hand-overs said "go": their supervisors exit
        self.runtimes: set[int] = set()  # connections of runtimes (their fds)
        self.started = time.monotonic()

    def log(self, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} node supervisor {os.getpid()}: {message}", flush=True)

    def readopt_all(self) -> None:
        """After a restart of ours: the guests a previous node supervisor held, found again
        (node_holdings.py); those that ended meanwhile get their exit.json."""
        for directory in sorted(self.instances_dir.iterdir()) if self.instances_dir.is_dir() else ():
            state = read_state(directory)
            if not state.get("parked") or state.get("state") not in ("ready", "idle", "stopping"):
                continue
            if (directory / "exit.json").exists():
                continue
            try:
                spec = json.loads((directory / "spec.json").read_text())
                held = readopt(directory, state, str(spec["socket"]))
                if held is None:
                    continue  # someone holds it
                try:
                    parked = Parked(directory, held, readopted=True)
                except BaseException:
                    release(held)
                    raise
            except Gone as gone:
                self.log(f"{directory.name}: {gone}")
                with contextlib.suppress(OSError):
                    why = f"the guest ended while no supervisor held it ({gone})"
                    write_json(
                        directory / "exit.json",
                        {"reason": "exit", "code": None, "signal": None, "synced": False, "error": why},
                    )
                continue
            except (OSError, ValueError, KeyError) as error:
                self.log(f"{directory.name}: not re-adopted: {error}")
                continue
            self.hold(parked)
            parked.log(f"re-adopted after a restart of the node supervisor (guest {parked.guest_pid})")

    def hold(self, parked: Parked) -> None:
        self.instances[parked.epoll.fileno()] = parked
        self.selector.register(parked.epoll.fileno(), selectors.EVENT_READ, ("instance", parked))
        parked.save_state()

    def run(self) -> None:
        self.log(f"serving {self.listener.getsockname()!r}")
        while True:
            for key, _ in self.selector.select(TICK):
                kind, thing = key.data
                if kind == "listen":
                    self.accept()
                elif kind == "peer":
                    self.on_peer(thing)
                elif kind == "instance":
                    self.step(thing, lambda p: p.serve(0))
                elif kind == "gone":
                    self.activate(thing)
            now = time.monotonic()
            for parked in list(self.instances.values()):
                self.step(parked, lambda p, now=now: p.watch(now))
            for pending in [p for p in self.going if now > p.deadline]:
                self.log(f"{pending.parked.dir.name}: its supervisor did not exit: dropped")
                self.drop(pending)
            busy = self.instances or self.handing or self.going or self.runtimes
            if not busy and now - self.started > START_GRACE_S:
                self.log("no instance and no runtime: exiting")
                return

    # -- instances ----------------------------------------------------------------------

    def step(self, parked: Parked, action: Any) -> None:
        try:
            action(parked)
        except SystemExit:  # Supervisor.exit: this instance is over
            self.retire(parked)
        except Exception as error:  # one instance's failure is not the node's
            parked.log(f"failed: {error!r}")
            parked.kill_guest()
            with contextlib.suppress(OSError):
                write_json(parked.dir / "exit.json", {"reason": "spawn-failed", "error": f"node supervisor: {error}"})
            self.retire(parked)

    def retire(self, parked: Parked) -> None:
        key = parked.epoll.fileno()
        if self.instances.pop(key, None) is not None:
            self.selector.unregister(key)
        parked.close()
        self.log(f"{parked.dir.name}: done ({len(self.instances)} held)")

    # -- peers: supervisors handing over, runtimes --------------------------------------

    def accept(self) -> None:
        try:
            peer, _ = self.listener.accept()
        except BlockingIOError:
            return
        _, uid, _ = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            peer.close()
            return
        peer.setblocking(False)
        self.peers[peer.fileno()] = peer
        self.selector.register(peer, selectors.EVENT_READ, ("peer", peer))

    def close_peer(self, peer: socket.socket) -> None:
        fd = peer.fileno()
        self.selector.unregister(peer)
        self.peers.pop(fd, None)
        self.runtimes.discard(fd)
        pending = self.handing.pop(fd, None)
        if pending is not None:
            self.drop(pending)  # answered, never told to go: not ours
        peer.close()

    def on_peer(self, peer: socket.socket) -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(peer, MESSAGE, MAX_FDS)
        except BlockingIOError:
            return
        except OSError:
            data, fds, flags = b"", [], 0
        if not data:
            for extra in fds:
                os.close(extra)
            self.close_peer(peer)
            return
        fd = peer.fileno()
        try:
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
                raise ValueError("message or descriptors truncated")
            request = json.loads(data)
            if not isinstance(request, dict):
                raise ValueError("not an object")
            if "handover" in request and fd not in self.handing:
                taken, fds = fds, []
                self.handing[fd] = self.take(peer, request["handover"], taken)
                peer.send(b'{"ok": true}')
            elif request.get("go") and fd in self.handing:
                pending = self.handing.pop(fd)
                pending.deadline = time.monotonic() + GONE_S
                self.going.append(pending)
                self.selector.register(pending.supervisor_pidfd, selectors.EVENT_READ, ("gone", pending))
            elif request.get("runtime"):
                self.runtimes.add(fd)
            else:
                raise ValueError("unexpected message")
        except (OSError, ValueError, KeyError, TypeError, StopIteration) as error:
            for extra in fds:
                os.close(extra)
            with contextlib.suppress(OSError):
                peer.send(json.dumps({"error": str(error)}).encode())
            self.close_peer(peer)

    def take(self, peer: socket.socket, message: dict[str, Any], fds: list[int]) -> Pending:
        """A hand-over: the instance, not served until its supervisor said "go" and exited."""
        try:
            pid, _, _ = struct.unpack(
                "3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            )
            # The instance is the sending supervisor's (its argument), under our data directory.
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            script = next(i for i, w in enumerate(words) if w.endswith(b"supervisor.py"))
            directory = Path(os.fsdecode(words[script + 1]))
            if directory.parent != self.instances_dir:
                raise ValueError(f"{directory} is not an instance of {self.instances_dir}")
            supervisor = os.pidfd_open(pid)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        try:
            held = handed_over(message, fds)
        except BaseException:
            os.close(supervisor)
            for fd in fds:
                os.close(fd)
            raise
        try:
            return Pending(Parked(directory, held), supervisor)
        except BaseException:
            os.close(supervisor)
            release(held)
            raise

    def activate(self, pending: Pending) -> None:
        """The supervisor that handed it over is gone: the instance is ours to serve."""
        self.going.remove(pending)
        self.selector.unregister(pending.supervisor_pidfd)
        os.close(pending.supervisor_pidfd)
        parked = pending.parked
        self.hold(parked)
        parked.log(f"holds the instance (guest {parked.guest_pid})")
        self.log(f"{parked.dir.name}: taken ({len(self.instances)} held)")
        # Whatever happened while it was handed over (a request, the guest's exit): now.
        self.step(parked, lambda p: p.serve(0))

    def drop(self, pending: Pending) -> None:
        """A hand-over that did not complete: our copies go, the supervisor keeps its own."""
        if pending in self.going:
            self.going.remove(pending)
            self.selector.unregister(pending.supervisor_pidfd)
        os.close(pending.supervisor_pidfd)
        pending.parked.close()


def main() -> None:
    data_dir, name = Path(sys.argv[1]), sys.argv[2]
    lock = os.open(data_dir / "runtime" / "node-supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("another node supervisor serves this data directory", file=sys.stderr)
        sys.exit(EXIT_BUSY)
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)
    # ~12 descriptors per instance held: as many as the hard limit allows (a hand-over that
    # does not fit is refused, and that supervisor keeps its instance).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)
    listener.setblocking(False)
    node = NodeSupervisor(data_dir.resolve(), listener)
    node.readopt_all()  # before the runtime can connect: it then finds them held
    listener.listen(64)
    node.run()


if __name__ == "__main__":
    main()
