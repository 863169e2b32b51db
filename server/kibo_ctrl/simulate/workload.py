"""The workload and the faults, as a plan drawn from the seed before the run: each step an
action with abstract references ("the 3rd workspace created", mod how many exist), so a
step can be dropped (shrinking) and the rest of the plan still means the same."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from ..domain.model import CommandKind
from ..runtime.sim.simulator import Fault


class Act(Enum):
    CREATE = "create"
    COMMAND = "command"  # a new command of `kind` on a workspace
    RESEND = "resend"  # an earlier request again, same command ID and body
    REUSE = "reuse"  # an earlier command ID with another body
    DUPLICATE = "duplicate"  # the same new request twice at once
    STALE = "stale"  # set expiration with a stale revision
    FAULT = "fault"  # a fault of the simulator API on a workspace
    SILENT = "silent"  # a node stops reporting
    BACK = "back"  # it reports again
    CRASH = "crash"  # the control plane dies and restarts from the store
    DISK_FULL = "disk-full"
    DISK_OK = "disk-ok"
    SLOW = "slow"  # a node's runtime steps take longer (or normal again)
    WAIT = "wait"  # time passes
    MOVE = "move"  # an operator's MoveWorkspace: a workspace (STOPPED ones first) to a node
    EXPOSE = "expose"  # CreateWorkspaceExposure or DeleteWorkspaceExposure (`kind`) on a workspace


@dataclass(frozen=True)
class Step:
    act: Act
    # What the action needs, resolved when it runs: a workspace or request index (mod how
    # many exist), a command kind, a fault, a size, a node.
    ref: int = 0
    kind: CommandKind = CommandKind.UNSPECIFIED
    fault: Fault | None = None
    size: int = 0
    # Virtual seconds that pass after the action, before the invariants are checked.
    after: float = 0.0

    def describe(self) -> str:
        parts = [self.act.value, f"ref={self.ref}"]
        if self.kind is not CommandKind.UNSPECIFIED:
            parts.append(self.kind.name)
        if self.fault is not None:
            parts.append(self.fault.name)
        if self.size:
            parts.append(f"size={self.size}")
        return " ".join(parts) + f" +{self.after:g}s"


COMMAND_KINDS = (
    CommandKind.STOP,
    CommandKind.STOP,
    CommandKind.FORCE_STOP,
    CommandKind.START,
    CommandKind.START,
    CommandKind.DELETE,
    CommandKind.SET_LABELS,
    CommandKind.RESIZE,
    CommandKind.SET_EXPIRATION,
    CommandKind.CLEAR_EXPIRATION,
    CommandKind.SET_NETWORK_POLICY,
    CommandKind.REVOKE_DATA_PLANE_ACCESS,
)
# (GUEST_OOM changes no state the invariants watch, only adds an event: left out, so that
# every seed's plan stays what it was.)
FAULTS = tuple(f for f in Fault if f not in (Fault.NODE_SILENT, Fault.NODE_BACK, Fault.GUEST_OOM))
# (weight, action): commands dominate; faults are rarer; a crash rarer still.
WEIGHTS: tuple[tuple[int, Act], ...] = (
    (12, Act.CREATE),
    (40, Act.COMMAND),
    (6, Act.RESEND),
    (3, Act.REUSE),
    (4, Act.DUPLICATE),
    (2, Act.STALE),
    (12, Act.FAULT),
    (2, Act.SILENT),
    (3, Act.BACK),
    (1, Act.CRASH),
    (1, Act.DISK_FULL),
    # A full disk lasts ~17 steps (minutes of virtual time, past every retry's backoff cap).
    # At 2 it lasted ~50 and covered a third of the virtual time, half of the run's cost (the
    # liveness check retries a failing write at every heartbeat while the disk is full).
    (6, Act.DISK_OK),
    (2, Act.SLOW),
    (10, Act.WAIT),
)
# Mostly no time or a runtime step's worth, sometimes past a liveness timeout or a settle.
AFTER = (0.0, 0.0, 0.001, 0.005, 0.02, 0.02, 0.05, 0.1, 0.5, 1.0, 4.0)


# MOVE steps come from a stream of their own, put between the steps `plan` draws (which stay
# every seed's as they were before moves): after each step, one with this chance.
MOVE_CHANCE = 1 / 12


def plan(rng: random.Random, steps: int) -> list[Step]:
    acts = [act for _, act in WEIGHTS]
    weights = [weight for weight, _ in WEIGHTS]
    out = []
    for _ in range(steps):
        act = rng.choices(acts, weights)[0]
        ref = rng.randrange(1 << 16)
        after = rng.choice(AFTER)
        if act is Act.WAIT:
            after = rng.choice((1.0, 3.5, 10.0, 60.0, 700.0))
        kind = rng.choice(COMMAND_KINDS) if act in (Act.COMMAND, Act.DUPLICATE) else CommandKind.UNSPECIFIED
        fault = rng.choice(FAULTS) if act is Act.FAULT else None
        size = rng.randrange(1, 5) if act in (Act.CREATE, Act.SLOW, Act.COMMAND) else 0
        out.append(Step(act, ref, kind, fault, size, after))
    return out


def with_moves(steps: list[Step], rng: random.Random) -> list[Step]:
    """`steps` with MOVE steps drawn from `rng` put between them: the others unchanged and in
    their order. Its `ref` picks the workspace (among the STOPPED ones when any) and, by its
    upper bits, the target node."""
    out: list[Step] = []
    for step in steps:
        out.append(step)
        if rng.random() < MOVE_CHANCE:
            out.append(Step(Act.MOVE, rng.randrange(1 << 16), CommandKind.MOVE, after=rng.choice(AFTER)))
    return out


# Exposures (issue 28): made and deleted between the steps, drawn from the seed's own stream
# (as moves are), so every seed's other steps stay what they were.
EXPOSE_CHANCE = 0.06


def with_exposures(steps: list[Step], rng: random.Random) -> list[Step]:
    """`steps` with EXPOSE steps drawn from `rng` put between them (the others unchanged and
    in their order): two creates for each delete; `size` picks the port and the expiry."""
    out: list[Step] = []
    for step in steps:
        out.append(step)
        if rng.random() < EXPOSE_CHANCE:
            kind = rng.choice((CommandKind.CREATE_EXPOSURE, CommandKind.CREATE_EXPOSURE, CommandKind.DELETE_EXPOSURE))
            size, after = rng.randrange(1, 5), rng.choice(AFTER)
            out.append(Step(Act.EXPOSE, rng.randrange(1 << 16), kind, size=size, after=after))
    return out
