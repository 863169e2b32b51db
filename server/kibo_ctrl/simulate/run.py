"""The driver: runs a plan against the real engine, step by step, and checks the invariants
after each; then lets every fault end, deletes everything, and checks that all settled."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from kibo.sim.v1 import simulator_pb2 as sim_pb2

from ..api.commands import WORKSPACE_COMMANDS
from ..domain.access import Caller, Role
from ..domain.errors import KiboError, StoreError
from ..domain.model import (
    Command,
    CommandKind,
    ExpirationAction,
    ExposureAccess,
    NetworkEgress,
    NetworkPolicy,
    Resources,
    WorkspaceState,
)
from ..engine.service import CommandRequest, CreateSpec, ExposureRequest
from ..runtime.sim.disks import SimDisk
from ..runtime.sim.simulator import Fault, SimBoard
from ..store.base import Changes
from . import invariants
from .cluster import ControlPlane, Shape
from .loop import Deadlock, VirtualClock, VirtualTimeLoop
from .moves import MoveWatch, check_leftovers, check_running
from .store import MemoryDatabase
from .workload import Act, Step, plan, with_exposures, with_moves

SIZES = {1: (1, 512), 2: (2, 2048), 3: (4, 4096), 4: (8, 8192)}
# Virtual seconds the final phase gives the system to settle, per round.
SETTLE_S = 120.0
# Each step checks what its commits changed (as published); this often (and after every
# restart, where a commit may not have been published) everything the store holds.
FULL_CHECK_EVERY = 500
DEFAULT_SHAPE = Shape()


# Each command kind's handler, as the API finds it (the command registry, api/commands.py).
HANDLERS = {kind: command.handle for command in WORKSPACE_COMMANDS for kind in command.kinds}


@dataclass
class Outcome:
    seed: int
    steps: int
    history: list[str]
    digest: str
    violation: str | None
    failed_step: int | None
    virtual_s: float
    # Virtual seconds of idle heartbeat ticks the loop skipped (simulate/loop.py).
    warped_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.violation is None


@dataclass
class _Sent:
    """A request a client sent, and what it was answered (for resends)."""

    request: CommandRequest
    command: Command | None = None


@dataclass
class _State:
    workspaces: list[tuple[str, str]] = field(default_factory=list)  # (tenant, id) as acknowledged
    sent: list[_Sent] = field(default_factory=list)
    acknowledged: dict[tuple[str, str], Command] = field(default_factory=dict)
    counter: int = 0
    # By workspace: the exposure IDs its creates asked for (a delete picks one).
    exposures: dict[str, list[str]] = field(default_factory=dict)


class _ErrorLog(logging.Handler):
    """Engine loops log what they catch; an ERROR that is not a store outage is a bug."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, StoreError) and error.unavailable is not None:
            return
        self.records.append(f"{record.name}: {record.getMessage()} {error!r}")


class Simulation:
    def __init__(
        self,
        seed: int,
        steps: list[Step],
        data_dir: Path,
        shape: Shape = DEFAULT_SHAPE,
        bug: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        warp: bool = True,
    ) -> None:
        self.seed = seed
        self.warp = warp
        self.steps = steps
        self.path = data_dir / "kibo.db"
        self.shape = shape
        self.bug = bug
        # Every choice the engine makes (IDs) from the seed too; the plan had its own draw.
        self.ids = random.Random(f"{seed}/ids")
        self.history: list[str] = []
        self.state = _State()
        self.seen = invariants.Seen()
        self.errors = _ErrorLog()
        self.board = SimBoard()
        # Each node's disk, kept across the control plane's restarts (a data directory), and
        # what the moves between them must keep true.
        self.disks: dict[str, SimDisk] = {}
        self.moves = MoveWatch(self.disks)
        self.loop: VirtualTimeLoop | None = None
        self.plane: ControlPlane | None = None
        self.broken: list[str] = []
        # Calls in flight; a crash drops them (the caller sees its connection fail).
        self.clients: set[asyncio.Task[None]] = set()
        # Workspaces changed and commands acknowledged since the last check.
        self.dirty: set[str] = set()
        self.fresh: dict[tuple[str, str], Command] = {}
        # Command rows written, and the nodes of the instances written, since the last check.
        self.commands_written: set[str] = set()
        self.nodes_touched: set[str] = set()
        self.full_next = True
        self.checks = 0
        # Change sets seen (published, or withheld by a crash), and the nodes and count the
        # silence invariant last held for.
        self.changes_seen = 0
        self.silent_checked: tuple[list[str], int] = ([], -1)
        # By node: since when it is cut off; and since when the store takes writes and this
        # control plane runs (for the silence invariant, `_silent_due`).
        self.cut_off: dict[str, float] = {}
        self.writable_since = 0.0
        # What a watcher of the hub saw of each workspace (consecutive repeats folded).
        self.watched: dict[str, list[WorkspaceState]] = {}

    # -- running -----------------------------------------------------------------------

    def run(self) -> Outcome:
        loop = self.loop = VirtualTimeLoop()
        engine_log = logging.getLogger("kibo_ctrl")
        # The engine's errors reach the checker whatever the root logger's level, and only it
        # (the history says what happened; thousands of retried warnings would not).
        level, propagate = engine_log.level, engine_log.propagate
        engine_log.setLevel(logging.ERROR)
        engine_log.propagate = False
        engine_log.addHandler(self.errors)
        failed_step: int | None = None
        try:
            with (
                contextlib.closing(MemoryDatabase(self.path)),
                self._seeded_ids(),
                _lean_log_records(),
                self.bug() if self.bug else contextlib.nullcontext(),
            ):
                try:
                    failed_step = loop.run_until_complete(self._main())
                except Deadlock as stuck:
                    # Every task waits for something no timer or callback will bring.
                    waiting = sorted(_where(task) for task in asyncio.all_tasks(loop))
                    self.broken.append(f"the simulation deadlocked: {stuck}; waiting: {waiting}")
                    failed_step = getattr(self, "number", 0)
        finally:
            engine_log.removeHandler(self.errors)
            engine_log.setLevel(level)
            engine_log.propagate = propagate
            loop.close()
        digest = hashlib.sha256("\n".join(self.history).encode()).hexdigest()[:16]
        violation = "; ".join(self.broken) if self.broken else None
        return Outcome(
            self.seed, len(self.steps), self.history, digest, violation, failed_step, loop.time(), loop.warped
        )

    @contextlib.contextmanager
    def _seeded_ids(self) -> Iterator[None]:
        def uuid4() -> uuid.UUID:
            return uuid.UUID(int=self.ids.getrandbits(128), version=4)

        with mock.patch.object(uuid, "uuid4", uuid4):
            yield

    async def _main(self) -> int | None:
        loop = self.loop
        assert loop is not None
        await self._boot()
        try:
            for number, step in enumerate(self.steps):
                self.number = number
                self._log(step.describe())
                reachable = self.plane.reachability() if self.plane else ()
                try:
                    await self._do(step)
                except Exception as error:
                    # A fault or a call the engine should have answered, not raised from.
                    self.broken.append(f"step {number} ({step.describe()}) raised {error!r}")
                if self.plane is not None and self.plane.reachability() != reachable:
                    loop.unsettle()
                    self._note_reachability()
                await asyncio.sleep(step.after)
                self._check()
                if self.broken:
                    return number
            self.number = len(self.steps)
            await self._finish()
            return len(self.steps) if self.broken else None
        finally:
            await self._drop_clients()
            if self.plane is not None:
                await self.plane.crash()
            await asyncio.sleep(0)

    async def _drop_clients(self) -> None:
        for task in list(self.clients):
            task.cancel()
        for task in list(self.clients):
            with contextlib.suppress(BaseException):
                await task

    async def _boot(self, withheld: Changes | None = None) -> ControlPlane:
        """Start an incarnation, and watch every workspace from what the store holds now
        (a watcher resuming after the restart). `withheld`: what the crashed incarnation
        committed but never published; the first check reads it, with what changed since the
        last check (nothing else can have changed: a full check, every FULL_CHECK_EVERY
        checks, reads all the same). The first boot checks everything."""
        self.plane = await ControlPlane.boot(self.path, self.shape, self.board, self._clock(), self.warp, self.disks)
        self.plane.hub.listen(self._observe)
        assert self.loop is not None
        self.writable_since = self.loop.time()
        if withheld is None:
            self.full_next = True
        else:
            self._mark_dirty(withheld)
        # The old watch ended with the crash (it may have missed what was never published):
        # the new one starts from the store, as a client's watch resumes.
        self.watched = {}
        self._check()
        self.seen.event_states = {ws: [state] for ws, state in self.seen.last_state.items()}
        self.watched = {ws: [state] for ws, state in self.seen.last_state.items()}
        return self.plane

    def _observe(self, changes: Changes) -> None:
        self._mark_dirty(changes)
        for snapshot in changes.workspace_history:
            invariants.fold(self.watched.setdefault(snapshot.id, []), snapshot.state)

    def _mark_dirty(self, changes: Changes) -> None:
        self.moves.observe(changes)
        self.changes_seen += 1
        self.dirty.update(changes.workspaces)
        self.dirty.update(i.workspace_id for i in changes.instances.values())
        self.dirty.update(e.workspace_id for e in changes.events)
        self.commands_written.update(changes.commands)
        self.nodes_touched.update(i.node_id for i in changes.instances.values() if i.node_id)

    def _clock(self) -> VirtualClock:
        assert self.loop is not None
        return VirtualClock(self.loop)

    def _log(self, text: str) -> None:
        assert self.loop is not None
        self.history.append(f"{getattr(self, 'number', 0):>6} {self.loop.time():12.3f} {text}")

    # -- the actions ---------------------------------------------------------------------

    async def _do(self, step: Step) -> None:
        plane = self.plane
        assert plane is not None
        act = step.act
        if act is Act.CREATE:
            self._send(self._create_request(step))
        elif act is Act.COMMAND:
            target = self._workspace(step.ref)
            if target is not None:
                self._send(self._request(step.kind, target, step.size))
        elif act is Act.DUPLICATE:
            target = self._workspace(step.ref)
            if target is not None:
                request = self._request(step.kind, target, step.size)
                self._send(request)
                self._send(request)
        elif act is Act.RESEND and self.state.sent:
            self._send(self.state.sent[step.ref % len(self.state.sent)].request, resend=True)
        elif act is Act.REUSE and self.state.sent:
            old = self.state.sent[step.ref % len(self.state.sent)].request
            self._send(self._with_fingerprint(old, self._next_id("reused")), reuse=True)
        elif act is Act.STALE:
            target = self._workspace(step.ref)
            if target is not None:
                request = self._request(CommandKind.SET_EXPIRATION, target, 0)
                self._send(self._with_revision(request, 1 + step.ref % 3))
        elif act is Act.FAULT:
            assert step.fault is not None
            await self._fault(step.fault, step.ref)
        elif act in (Act.SILENT, Act.BACK):
            node = plane.runtimes[plane.nodes[step.ref % len(plane.nodes)].id]
            node.inject("", None, Fault.NODE_SILENT if act is Act.SILENT else Fault.NODE_BACK)
        elif act is Act.CRASH:
            if step.ref % 2:
                # Between a commit and its publication: at the next commit, whenever it comes.
                plane.store.crash_after_commit = True
                for _ in range(100):
                    if plane.store.crashed:
                        break
                    await asyncio.sleep(0.01)
            await self._restart()
        elif act in (Act.DISK_FULL, Act.DISK_OK):
            if plane.store.disk_full and act is Act.DISK_OK and self.loop is not None:
                self.writable_since = self.loop.time()
            plane.store.set_disk_full(act is Act.DISK_FULL)
        elif act is Act.SLOW:
            node = plane.runtimes[plane.nodes[step.ref % len(plane.nodes)].id]
            node.step_s = self.shape.step_s * (1, 1, 10, 100, 1000)[step.size]
        elif act is Act.MOVE:
            await self._move(step.ref)
        elif act is Act.EXPOSE:
            target = self._workspace(step.ref)
            if target is not None:
                self._send(self._exposure_request(step, target))

    async def _restart(self) -> None:
        plane = self.plane
        assert plane is not None
        disk_full = plane.store.disk_full
        unpublished = plane.store.crashed or plane.store.published_mark() is None
        await self._drop_clients()
        await plane.crash()
        # The embedded nodes went down with it; their disks are modelled as a power loss's:
        # what a move's receive did not sync is gone.
        for disk in self.disks.values():
            disk.crash()
        restarted = await self._boot(plane.store.withheld)
        if disk_full:
            restarted.store.set_disk_full(True)
        self._log(f"restarted from the store{' (a commit was not yet published)' if unpublished else ''}")

    async def _fault(self, fault: Fault, ref: int) -> None:
        plane = self.plane
        assert plane is not None
        target = self._workspace(ref)
        operator = Caller(target[0] if target else "default", Role.OPERATOR)
        workspace_id = target[1] if target is not None and ref % 7 else ""
        request = sim_pb2.InjectFaultRequest(workspace_id=workspace_id, fault=int(fault))  # type: ignore[arg-type]
        try:
            await plane.sim_api.inject_fault(request, operator)
        except (KiboError, StoreError) as error:
            self._log(f"  fault {fault.name} {workspace_id or '(next created)'}: {type(error).__name__}")
            if isinstance(error, StoreError) and error.unavailable is None:
                self.broken.append(f"fault {fault.name}: the store failed with {error}, not as unavailable")
            return
        self._log(f"  fault {fault.name} {workspace_id or '(next created)'}: armed")

    async def _move(self, ref: int) -> None:
        """An operator's MoveWorkspace: the ref-th of the STOPPED workspaces (of any, when none
        is), to the node the ref's upper bits pick."""
        plane = self.plane
        assert plane is not None
        known = self.state.workspaces
        if not known:
            return
        ids = {workspace_id for _, workspace_id in known}
        stopped = set(
            plane.store.check(
                lambda r: [w.id for i in ids if (w := r.get_workspace(i)) and w.state is WorkspaceState.STOPPED]
            )
        )
        pool = [w for w in known if w[1] in stopped] or known
        tenant, workspace_id = pool[ref % len(pool)]
        target = plane.nodes[(ref >> 8) % len(plane.nodes)].id
        command_id = self._next_id("move")
        fingerprint = f"MOVE {workspace_id} {target}"
        request = CommandRequest(
            CommandKind.MOVE, command_id, fingerprint, workspace_id=workspace_id, tenant=tenant, target_node=target
        )
        self._send(request)

    def _workspace(self, ref: int) -> tuple[str, str] | None:
        known = self.state.workspaces
        return known[ref % len(known)] if known else None

    def _next_id(self, prefix: str) -> str:
        self.state.counter += 1
        return f"{prefix}-{self.state.counter}"

    def _create_request(self, step: Step) -> CommandRequest:
        vcpus, memory = SIZES[step.size]
        expire = None
        if step.ref % 5 == 0:
            expire = self._clock().now() + (step.ref % 40)
        action = ExpirationAction.DELETE if step.ref % 2 else ExpirationAction.STOP
        spec = CreateSpec(
            resources=Resources(vcpus, memory, 4),
            labels={"n": str(step.ref % 3)},
            annotations={},
            bindings=[],
            network_policy=NetworkPolicy(),
            data_volume_gib=1,
            expire_time=expire,
            expire_action=action if expire else ExpirationAction.UNSPECIFIED,
        )
        tenant = invariants.TENANTS[step.ref % 4 == 0]
        command_id = self._next_id("create")
        return CommandRequest(
            kind=CommandKind.CREATE,
            command_id=command_id,
            fingerprint=f"create {vcpus} {memory} {expire} {action.name}",
            create=spec,
            tenant=tenant,
        )

    def _request(self, kind: CommandKind, target: tuple[str, str], size: int) -> CommandRequest:
        tenant, workspace_id = target
        base: dict[str, Any] = {}
        if kind is CommandKind.SET_LABELS:
            base["labels"] = {"n": str(size)}
        elif kind is CommandKind.RESIZE:
            vcpus, memory = SIZES[max(1, size)]
            base["resources"] = Resources(vcpus, memory, 4)
        elif kind is CommandKind.SET_EXPIRATION:
            base["expire_time"] = self._clock().now() + 5 * size
            base["expire_action"] = ExpirationAction.DELETE if size % 2 else ExpirationAction.STOP
        elif kind is CommandKind.SET_NETWORK_POLICY:
            base["network_policy"] = NetworkPolicy(NetworkEgress.DENY_ALL if size % 2 else NetworkEgress.ALLOW_ALL)
        command_id = self._next_id(kind.name.lower())
        fingerprint = f"{kind.name} {workspace_id} {sorted(base.items())!r}"
        return CommandRequest(kind, command_id, fingerprint, workspace_id=workspace_id, tenant=tenant, **base)

    def _exposure_request(self, step: Step, target: tuple[str, str]) -> CommandRequest:
        """A create of port 8000 + size (expiring after 5 x size s when size is odd, public
        when it is 4), or a delete of one of the exposures made on the workspace so far (or of
        one that never existed: NotFound)."""
        tenant, workspace_id = target
        command_id = self._next_id(step.kind.name.lower())
        if step.kind is CommandKind.CREATE_EXPOSURE:
            exposure_id = self._next_id("ex")
            self.state.exposures.setdefault(workspace_id, []).append(exposure_id)
            public = step.size == 4
            exposure = ExposureRequest(
                exposure_id=exposure_id,
                port=8000 + step.size,
                access=ExposureAccess.PUBLIC if public else ExposureAccess.TOKEN,
                expire_in_seconds=5 * step.size if step.size % 2 else 0,
                token_sha256="" if public else f"sha-{exposure_id}",
            )
        else:
            made = self.state.exposures.get(workspace_id) or [f"ex-never-{step.ref}"]
            exposure = ExposureRequest(exposure_id=made[step.ref % len(made)])
        fingerprint = f"{step.kind.name} {workspace_id} {exposure!r}"
        return CommandRequest(
            step.kind, command_id, fingerprint, workspace_id=workspace_id, tenant=tenant, exposure=exposure
        )

    @staticmethod
    def _with_fingerprint(request: CommandRequest, extra: str) -> CommandRequest:
        fields = dict(request.__dict__)
        fields["fingerprint"] = f"{request.fingerprint} {extra}"
        return CommandRequest(**fields)

    @staticmethod
    def _with_revision(request: CommandRequest, revision: int) -> CommandRequest:
        fields = dict(request.__dict__)
        fields["expected_revision"] = revision
        fields["fingerprint"] = f"{request.fingerprint} rev {revision}"
        return CommandRequest(**fields)

    def _send(self, request: CommandRequest, *, resend: bool = False, reuse: bool = False) -> None:
        sent = _Sent(request)
        if not resend and not reuse:
            self.state.sent.append(sent)
        plane = self.plane
        assert plane is not None
        task = asyncio.get_running_loop().create_task(self._call(plane, request, sent, resend, reuse))
        self.clients.add(task)
        task.add_done_callback(self.clients.discard)

    async def _call(self, plane: ControlPlane, request: CommandRequest, sent: _Sent, resend: bool, reuse: bool) -> None:
        label = f"{request.kind.name} {request.tenant}/{request.command_id} {request.workspace_id}".rstrip()
        try:
            handle = HANDLERS[request.kind]
            workspace, command = await plane.store.transact(plane.service.execute, handle, request)
        except asyncio.CancelledError:
            raise
        except (KiboError, StoreError) as error:
            name = type(error).__name__
            self._log(f"  {label}: {name}")
            if isinstance(error, StoreError) and error.unavailable is None:
                self.broken.append(f"{label}: the store failed with {error}, not as unavailable")
            # A store that cannot write now may answer anything unavailable.
            if reuse and name not in ("CommandIdReused", "StoreError") and self._known(request):
                self.broken.append(f"{label}: a reused command ID was answered {name}, not CommandIdReused")
            return
        except Exception as error:
            self.broken.append(f"{label}: the engine raised {error!r}")
            return
        self._log(f"  {label}: {command.kind.name} {command.state.name} {workspace.id} {workspace.state.name}")
        if reuse and self._known(request):
            self.broken.append(f"{label}: a reused command ID with another body was accepted")
        key = (request.tenant, command.id)
        first = self.state.acknowledged.get(key)
        if first is not None and (first.workspace_id, first.kind) != (command.workspace_id, command.kind):
            self.broken.append(f"{label}: a resend returned {command} where the first answer was {first}")
        if first is None:
            self.state.acknowledged[key] = command
            self.fresh[key] = command
        if request.kind is CommandKind.CREATE and (request.tenant, workspace.id) not in self.state.workspaces:
            self.state.workspaces.append((request.tenant, workspace.id))
        sent.command = command

    def _known(self, request: CommandRequest) -> bool:
        return (request.tenant, request.command_id) in self.state.acknowledged

    # -- checking ------------------------------------------------------------------------

    def _check(self) -> None:
        plane = self.plane
        assert plane is not None
        dead = plane.dead_loops()
        if dead:
            self.broken.append(f"engine loops died: {dead}")
        if self.errors.records:
            self.broken.append(f"the engine logged errors: {self.errors.records}")
            self.errors.records = []
        # Cheap steps check what changed; every FULL_CHECK_EVERY steps (and after a restart)
        # everything, and every acknowledged command.
        full = self.full_next or self.checks % FULL_CHECK_EVERY == 0
        self.checks += 1
        only = None if full else set(self.dirty)
        if full:
            acknowledged = self.state.acknowledged
        else:
            # The new ones, and those whose row a commit wrote again (a reused ID must not
            # overwrite it).
            acknowledged = dict(self.fresh)
            for key in self.commands_written:
                tenant, _, command_id = key.partition("\x00")  # domain/model.py command_key
                if (command := self.state.acknowledged.get((tenant, command_id))) is not None:
                    acknowledged[(tenant, command_id)] = command
        # A node's reservations change only with its instances.
        nodes = plane.nodes if full else [node for node in plane.nodes if node.id in self.nodes_touched]
        self.dirty, self.fresh, self.full_next = set(), {}, False
        self.commands_written, self.nodes_touched = set(), set()
        found = plane.store.check(lambda r: invariants.check_store(r, nodes, self.seen, acknowledged, only))
        self.broken.extend(found)
        due = self._silent_due()
        # The store changes only by commits: one checked against the same nodes holds still.
        if due and (due, self.changes_seen) != self.silent_checked:
            self.silent_checked = (due, self.changes_seen)
            self.broken.extend(plane.store.check(lambda r: invariants.check_silent(r, due)))
        if plane.store.published_mark() is not None:
            watched = self.watched if only is None else only & self.watched.keys()
            self.broken.extend(invariants.check_watch(self.seen, self.watched, watched))
        if self.moves.broken:
            self.broken.extend(self.moves.broken)
            self.moves.broken = []
        self.broken.extend(plane.store.check(lambda r: check_running(r, plane.runtimes)))
        running: dict[str, str] = {}
        for node_id, runtime in plane.runtimes.items():
            for vm in runtime.vms.values():
                if vm.alive and running.setdefault(vm.workspace_id, node_id) != node_id:
                    self.broken.append(f"{vm.workspace_id} runs on {running[vm.workspace_id]} and {node_id}")

    def _note_reachability(self) -> None:
        plane = self.plane
        assert plane is not None and self.loop is not None
        for node_id, runtime in plane.runtimes.items():
            if runtime.reachable.is_set():
                self.cut_off.pop(node_id, None)
            else:
                self.cut_off.setdefault(node_id, self.loop.time())

    def _silent_due(self) -> list[str]:
        """The nodes that must be recorded silent by now: cut off for longer than a lease,
        plus a stretch (a stored lease outlasts the last renewal by up to one more; a failed
        write is retried in the next stretch) and two renewal periods, counted from when the
        store took writes and the control plane ran again."""
        plane = self.plane
        assert plane is not None and self.loop is not None
        if plane.store.disk_full or not self.cut_off:
            return []
        registry = plane.registry
        slack = registry.persist_s + registry.lease_seconds / 2
        now, bound = self.loop.time(), registry.lease_seconds + slack
        return sorted(n for n, since in self.cut_off.items() if now - max(since, self.writable_since) > bound)

    async def _calm(self) -> None:
        """Every fault ends: nodes report, the disk has room, stalls end, steps are quick."""
        plane = self.plane
        assert plane is not None
        if plane.store.disk_full and self.loop is not None:
            self.writable_since = self.loop.time()
        plane.store.set_disk_full(False)
        for runtime in plane.runtimes.values():
            runtime.reachable.set()
            runtime.step_s = self.shape.step_s
        assert self.loop is not None
        self.loop.unsettle()
        self.cut_off.clear()
        self.board.armed.clear()
        self.board.next_created.clear()
        for event in list(self.board.unstall.values()):
            event.set()

    async def _finish(self) -> None:
        self._log("faults end")
        await self._calm()
        await self._settle()
        self.full_next = True
        self._check()
        plane = self.plane
        assert plane is not None
        waiting = plane.store.check(lambda r: self._unfinished(r, allow_unschedulable=True))
        self.broken.extend(waiting)
        self.broken.extend(plane.store.check(lambda r: check_leftovers(r, self.disks)))
        if self.broken:
            return
        moves = self.moves
        self._log(f"moves: {moves.succeeded} succeeded ({moves.copied} copied), {moves.failed} failed")
        self._log("delete everything")
        for _ in range(4):
            left = plane.store.check(invariants.all_workspaces)
            for workspace in left:
                if workspace.state not in (WorkspaceState.DELETED, WorkspaceState.DELETING):
                    target = (workspace.tenant, workspace.id)
                    self._send(self._request(CommandKind.DELETE, target, 0))
            await self._settle()
            self.full_next = True
            self._check()
        self.broken.extend(plane.store.check(lambda r: self._unfinished(r, allow_unschedulable=False)))
        self.broken.extend(plane.store.check(self._cleaned))

    async def _settle(self) -> None:
        for _ in range(int(SETTLE_S)):
            await asyncio.sleep(1.0)
            self._check()
            if self.broken:
                return

    def _unfinished(self, reader: Any, allow_unschedulable: bool) -> list[str]:
        broken = []
        for (tenant, command_id), _ in self.state.acknowledged.items():
            command = reader.get_command(tenant, command_id)
            if command is None or command.terminal:
                continue
            workspace = reader.get_workspace(command.workspace_id)
            instance = reader.get_instance(workspace.instance_id) if workspace and workspace.instance_id else None
            if allow_unschedulable and instance is not None and instance.reason.startswith("unschedulable"):
                continue
            broken.append(
                f"command {tenant}/{command_id} ({command.kind.name}) is still {command.state.name} with no "
                f"fault left: workspace {command.workspace_id} is "
                f"{workspace.state.name if workspace else '?'}"
            )
        return broken

    def _cleaned(self, reader: Any) -> list[str]:
        plane = self.plane
        assert plane is not None
        broken = []
        for workspace in invariants.all_workspaces(reader):
            if workspace.state is not WorkspaceState.DELETED:
                broken.append(f"{workspace.id} is {workspace.state.name} after every workspace was deleted")
                continue
            broken.extend(invariants.check_cleaned(reader, workspace))
            for node_id, runtime in plane.runtimes.items():
                if any(vm.workspace_id == workspace.id for vm in runtime.vms.values()):
                    broken.append(f"{workspace.id} is DELETED but {node_id} still has its VM")
        for node in plane.nodes:
            if reader.node_usage(node.id) != (0, 0):
                broken.append(f"{node.id} still reserves {reader.node_usage(node.id)} with every workspace deleted")
        return broken


@contextlib.contextmanager
def _lean_log_records() -> Iterator[None]:
    """Records without the caller's frame, thread or process (logging's documented switches):
    a full disk has the engine log an error per failed retry, and the checker reads only the
    record's logger, message and exception."""
    with mock.patch.multiple(logging, _srcfile=None, logThreads=False, logProcesses=False, logMultiprocessing=False):
        yield


def _where(task: asyncio.Task[Any]) -> str:
    stack = task.get_stack(limit=1)
    frame = stack[-1] if stack else None
    return f"{task.get_name()} at {frame.f_code.co_name}:{frame.f_lineno}" if frame else task.get_name()


def simulate(
    seed: int,
    steps: int,
    shape: Shape = DEFAULT_SHAPE,
    keep: list[int] | None = None,
    bug: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    warp: bool = True,
    moves: bool = True,
) -> Outcome:
    """Run `steps` steps drawn from `seed` (only the step numbers in `keep`, if given), and
    with `moves` the MOVE steps drawn for it between them (`full_plan`).
    `warp=False` runs every idle tick of the periodic loops (the history is the same)."""
    full = full_plan(seed, steps, moves)
    chosen = full if keep is None else [full[i] for i in keep]
    # The database is in memory (simulate/store.py); the directory makes its name unique.
    with tempfile.TemporaryDirectory(prefix=f"kibo-sim-{seed}-") as tmp:
        return Simulation(seed, chosen, Path(tmp), shape, bug, warp).run()


def full_plan(seed: int, steps: int, moves: bool = True) -> list[Step]:
    """The seed's `steps` steps, as they were before moves existed (workload.plan), and with
    `moves` the MOVE steps of the seed's own stream between them."""
    drawn = plan(random.Random(seed), steps)
    if not moves:
        return drawn
    return with_exposures(with_moves(drawn, random.Random(f"{seed}/moves")), random.Random(f"{seed}/exposures"))


def violation_kind(outcome: Outcome) -> str:
    """The first violation with its IDs and numbers left out: what shrinking must keep."""
    first = (outcome.violation or "").split("; ")[0]
    return re.sub(r"[0-9a-f]{6,}|\d+", "#", first)


def shrink(
    seed: int,
    steps: int,
    failed: Outcome,
    shape: Shape = DEFAULT_SHAPE,
    bug: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    budget: int = 200,
    warp: bool = True,
    moves: bool = True,
) -> tuple[list[int], Outcome]:
    """Drop steps while the run still fails the same way (delta debugging over the plan; a
    trial that breaks another invariant is not kept): the steps kept."""
    kind = violation_kind(failed)
    total = len(full_plan(seed, steps, moves))
    last = failed.failed_step if failed.failed_step is not None else total - 1
    keep = list(range(min(total, last + 1)))
    best = failed
    chunk = max(1, len(keep) // 2)
    runs = 0
    while chunk >= 1 and runs < budget:
        changed = False
        start = 0
        while start < len(keep) and runs < budget:
            trial = keep[:start] + keep[start + chunk :]
            runs += 1
            outcome = simulate(seed, steps, shape, trial, bug, warp, moves)
            if not outcome.ok and violation_kind(outcome) == kind:
                keep, best, changed = trial, outcome, True
            else:
                start += chunk
        if not changed:
            chunk //= 2
    return keep, best
