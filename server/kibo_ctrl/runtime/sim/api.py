"""kibo.sim.v1.SimulatorService, beside the simulator it drives: faults a real node would
report. Built and served only with --runtime sim (app.py); a real runtime does not serve it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from kibo.sim.v1 import simulator_pb2 as sim_pb2

from ...domain import validation
from ...domain.access import Caller
from ...domain.errors import Conflict, InvalidArgument, NotFound
from ...domain.model import Workspace
from .simulator import FOR_NEXT_CREATED, NODE_WIDE, ONE_SHOT, Fault, SimBoard, SimError, SimNode


class SimulatorApi:
    """kibo.sim.v1.SimulatorService: inject the faults a real node would report."""

    def __init__(
        self,
        find_workspace: Callable[[str], Awaitable[Workspace | None]],
        board: SimBoard,
        nodes: Mapping[str, SimNode],
        pool_lost: Callable[[str], Awaitable[None]],
    ) -> None:
        """`find_workspace` reads a workspace from the store; `pool_lost` reports a lost
        storage pool (both come from app.py, which wires the simulator)."""
        self._find_workspace = find_workspace
        self._board = board
        self._nodes = nodes
        self._pool_lost = pool_lost

    async def inject_fault(self, request: sim_pb2.InjectFaultRequest, caller: Caller) -> sim_pb2.InjectFaultResponse:
        caller.require_admin("InjectFault")
        try:
            fault = Fault(request.fault)
        except ValueError:
            raise InvalidArgument(f"unknown fault {request.fault}", field="fault") from None
        # Permission before existence: a fault that reaches other tenants' workspaces needs
        # an operator, whatever workspace it names.
        if not request.workspace_id:
            caller.require_operator(f"InjectFault {fault.name} with an empty workspace_id (the next workspace created)")
            if fault not in FOR_NEXT_CREATED:
                raise InvalidArgument(f"{fault.name} needs a workspace_id", field="workspace_id")
            self._board.arm("", fault)
            return sim_pb2.InjectFaultResponse()
        if fault in NODE_WIDE:
            caller.require_operator(f"InjectFault {fault.name}")
        workspace_id = validation.resource_id(request.workspace_id, "workspace_id", "ws-")
        workspace = await self._find_workspace(workspace_id)
        # Another tenant's workspace does not exist for this caller, operator or not.
        if workspace is None or workspace.tenant != caller.tenant:
            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")
        if fault in ONE_SHOT:
            self._board.arm(workspace_id, fault)
        elif fault is Fault.UNSTALL:
            self._board.armed.get(workspace_id, set()).discard(Fault.STALL)
            event = self._board.unstall.get(workspace_id)
            if event is not None:
                event.set()
        elif fault is Fault.STORAGE_POOL_LOST:
            await self._pool_lost(workspace.storage_pool)
        else:
            node = self._nodes.get(workspace.node_id or "")
            if node is None:
                raise Conflict(f"workspace {workspace_id} is not on any node", state=workspace.state.name)
            try:
                node.inject(workspace_id, workspace.instance_id, fault)
            except SimError as error:
                raise Conflict(str(error), state=workspace.state.name) from None
        return sim_pb2.InjectFaultResponse()
