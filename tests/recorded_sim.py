"""`python -m tests.recorded_sim ARGS...`: `kibo-ctrl ARGS...` whose simulated runtime writes a
line to the file $KIBO_TEST_LAUNCHES for each launch it is asked to make and each it finished:

    begin NODE_ID PID INSTANCE_ID WORKSPACE_ID TIME
    done NODE_ID PID INSTANCE_ID WORKSPACE_ID TIME

(TIME: the wall clock, seconds.)
Why: "no instance was launched twice" is a claim about what the nodes did, so the cluster
tests count launches where they happen (SimNode.launch, in each node agent's process), not in
the control plane's account of them. Nothing else changes: the launch itself is SimNode's. A
line is one O_APPEND write, whole even when several nodes share the file and one is killed -9."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable

from kibo_ctrl.domain.model import Phase
from kibo_ctrl.runtime.base import LaunchSpec
from kibo_ctrl.runtime.sim.simulator import SimNode

VARIABLE = "KIBO_TEST_LAUNCHES"
_launch = SimNode.launch


def _record(kind: str, node: SimNode, spec: LaunchSpec) -> None:
    line = f"{kind} {node.node_id} {os.getpid()} {spec.instance.id} {spec.instance.workspace_id} {time.time()}\n"
    fd = os.open(os.environ[VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def _recorded_launch(
    self: SimNode, spec: LaunchSpec, progress: Callable[[Phase, tuple[str, ...]], Awaitable[None]]
) -> tuple[str, ...]:
    _record("begin", self, spec)
    created = await _launch(self, spec, progress)
    _record("done", self, spec)
    return created


def main() -> None:
    assert os.environ.get(VARIABLE), f"set {VARIABLE} to the file the launches are written to"
    SimNode.launch = _recorded_launch  # type: ignore[method-assign]
    from kibo_ctrl.cli import main as kibo_ctrl

    kibo_ctrl()


if __name__ == "__main__":
    main()
