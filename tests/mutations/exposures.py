"""Mutations of the exposures' server side (issue 28: api/exposures.py, the Exposure record's
validity in domain/model.py, its end in engine/steps.py, its rules): each way an exposure ends,
its token, its tenant, and the simulation's invariant that no exposure outlives its execution."""

from tests.mutations.base import Mutation

_API = "server/kibo_ctrl/api/exposures.py"
_MODEL = "server/kibo_ctrl/domain/model.py"
_STEPS = "server/kibo_ctrl/engine/steps.py"
_RULES = "server/kibo_ctrl/domain/rules.py"
_T = "tests/system/test_exposures.py"
_ENDED = f"{_T}::test_an_ended_exposure_cuts_its_open_websocket"
_UNIT = "tests/unit/test_exposures_unit.py"

MUTATIONS = [
    Mutation(
        claim="A stop, force stop, revoke or delete ends every exposure of the workspace in its own commit "
        "(no stopped or deleted workspace keeps one: the deterministic simulation's invariant)",
        code=_STEPS,
        find="    workspace.data_plane_revision += 1\n    workspace.exposures = []\n",
        replace="    workspace.data_plane_revision += 1\n",
        tests=(
            "tests/system/test_simulation.py::test_fixed_seed_holds_every_invariant[100]",
            "tests/system/test_simulation.py::test_fixed_seed_holds_every_invariant[101]",
        ),
    ),
    Mutation(
        claim="An exposure is valid only in the execution and data-plane revision it was made in: after a "
        "revoke or a new start its URL answers 404, and open connections are cut",
        code=_MODEL,
        find="            if e.generation == self.generation\n            and e.revision == self.data_plane_revision\n",
        replace="            if True\n",
        tests=(f"{_UNIT}::test_one_of_another_execution_or_revision_is_not",),
    ),
    Mutation(
        claim="An exposure answers only while its workspace is AVAILABLE: a stopped, failed (the guest's crash) "
        "or deleted workspace's URL answers 410 and its open connections are cut",
        code=_MODEL,
        find="        if self.state is not WorkspaceState.AVAILABLE or self.deletion_started or self.deleted:\n"
        "            return []\n",
        replace="",
        tests=(f"{_UNIT}::test_none_is_valid_unless_the_workspace_is_available_and_not_being_deleted",),
    ),
    Mutation(
        claim="A commit that ends an exposure cuts the connections open through it at once (WebSocket "
        "included), not when they next send",
        code=_API,
        find="                if exposure_id not in valid:\n                    event.set()\n",
        replace="                pass\n",
        tests=(f"{_ENDED}[unexpose]",),
    ),
    Mutation(
        claim="A token exposure needs its own token: none is 401, another exposure's or an API token is 403",
        code=_API,
        find="            if not hmac.compare_digest(exposure.token_sha256, token_digest(token)):",
        replace="            if False:",
        tests=(
            f"{_T}::test_a_token_opens_only_its_exposure_and_another_tenant_sees_none",
            f"{_T}::test_an_exposure_serves_http_a_stream_and_a_websocket",
        ),
    ),
    Mutation(
        claim="Another tenant's workspace has no exposures for a caller: listing them is NOT_FOUND",
        code=_API,
        find="        if workspace is None or workspace.tenant != caller.tenant:\n"
        '            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")\n'
        "        return ws_pb2.ListWorkspaceExposuresResponse(",
        replace="        if workspace is None:\n"
        '            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")\n'
        "        return ws_pb2.ListWorkspaceExposuresResponse(",
        tests=(f"{_T}::test_a_token_opens_only_its_exposure_and_another_tenant_sees_none",),
    ),
    Mutation(
        claim="Exposures are made only while the workspace is AVAILABLE (the rules table, every state x "
        "operation pair checked)",
        code=_RULES,
        find="        Op.SET_LABELS: Guard.ALWAYS,\n        Op.MOVE: Guard.IDLE,\n",
        replace="        Op.SET_LABELS: Guard.ALWAYS,\n        Op.MOVE: Guard.IDLE,\n"
        "        Op.CREATE_EXPOSURE: Guard.ALWAYS,\n",
        tests=(
            "tests/unit/test_rules_unit.py::test_state_operation_table[STOPPED-CREATE_EXPOSURE]",
            "tests/unit/test_rules_unit.py::test_operation_over_every_reachable_situation[CREATE_EXPOSURE]",
        ),
    ),
]
