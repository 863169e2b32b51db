"""How a node agent sends an instance's reports (engine/node_agent.py `_send`): in order,
without holding up the runtime, those queued while one is under way in one batch, and one by
one when a batch is refused. The link here records what it is sent and answers slowly."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kibo_ctrl.domain.errors import InvalidArgument
from kibo_ctrl.domain.model import Backend, Instance, NetworkPolicy, Node, Phase, Resources
from kibo_ctrl.domain.reports import Launched, Progress, Report
from kibo_ctrl.engine.node_agent import NodeAgent
from kibo_ctrl.runtime.base import LaunchSpec
from kibo_ctrl.runtime.sim.simulator import SimBoard, SimNode

INSTANCE = Instance("ws-1-g1", "ws-1", 1, 1, 512, 0.0, node_id="node-1")


class RecordingLink:
    """What a ControlPlaneLink is sent, call by call; each call takes a little while."""

    def __init__(self, refuse_batches: bool = False) -> None:
        self.calls: list[list[Report]] = []
        self.refuse_batches = refuse_batches

    async def launch_spec(self, instance_id: str, step: int) -> LaunchSpec:
        return LaunchSpec(INSTANCE, Resources(1, 512, 1), (), (), NetworkPolicy())

    async def report(self, report: Report) -> None:
        self.calls.append([report])
        await asyncio.sleep(0.01)

    async def report_batch(self, reports: Sequence[Report]) -> None:
        await asyncio.sleep(0.01)
        if self.refuse_batches:
            raise InvalidArgument("refused", field="reports")
        self.calls.append(list(reports))


def _sent(link: RecordingLink) -> list[list[str]]:
    def name(report: Report) -> str:
        return report.phase.name if isinstance(report, Progress) else type(report).__name__

    return [[name(report) for report in call] for call in link.calls]


async def _launch(link: RecordingLink) -> None:
    runtime = SimNode("node-1", Backend.FIRECRACKER, 0.0, SimBoard())
    agent = NodeAgent(Node("node-1", 4, 8192, "local"), runtime, link)  # type: ignore[arg-type]
    await asyncio.wait_for(agent._act(INSTANCE), 5)


async def test_a_launch_sends_its_progress_first_and_the_rest_as_one_batch() -> None:
    link = RecordingLink()
    await _launch(link)
    # PROVISIONING went alone; LAUNCHING and Launched queued behind it and went together.
    assert _sent(link) == [["PROVISIONING"], ["LAUNCHING", "Launched"]]
    progress = link.calls[0][0]
    assert isinstance(progress, Progress) and progress.step == INSTANCE.step
    assert isinstance(link.calls[1][1], Launched) and link.calls[1][1].step == INSTANCE.step


async def test_a_refused_batch_is_sent_again_one_by_one_in_order() -> None:
    link = RecordingLink(refuse_batches=True)
    await _launch(link)
    assert _sent(link) == [["PROVISIONING"], ["LAUNCHING"], ["Launched"]]
    assert all(isinstance(call[0], Progress) for call in link.calls[:2])
    assert link.calls[0][0].phase is Phase.PROVISIONING  # type: ignore[union-attr]
