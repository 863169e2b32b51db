"""Mutations of the protections of issue 36 ("small things a new user trips on"): where local
clients take a token from, who the first-start token is, a data dir another runtime ran, and
what `stop --all` and the examples touch."""

from tests.mutations.base import Mutation

_UNIT = "tests/unit/test_new_user_unit.py"
_INTEGRATION = "tests/integration/test_new_user.py"
_SYSTEM = "tests/system/test_new_user.py"

MUTATIONS = [
    Mutation(
        claim="A local client never takes its token from the pointer of a server that is gone (its port may be "
        "another server's now)",
        code="client/kibotos/token_discovery.py",
        find="        gone = _gone(pointer)\n",
        replace="        gone = None\n",
        tests=(
            f"{_UNIT}::test_a_pointer_whose_server_is_gone_is_passed_over_and_pruned",
            f"{_INTEGRATION}::test_a_stopping_server_removes_its_pointer_and_a_killed_ones_is_passed_over",
        ),
    ),
    Mutation(
        claim="A server that stops removes the pointer local clients find its admin token through",
        code="server/kibo_ctrl/app.py",
        find="        tokens.unpoint(self._pointer)",
        replace="        pass",
        tests=(f"{_INTEGRATION}::test_a_stopping_server_removes_its_pointer_and_a_killed_ones_is_passed_over",),
    ),
    Mutation(
        claim="On PostgreSQL the first-start token is a tenant admin, not an operator (minting there needs the "
        "database)",
        code="server/kibo_ctrl/app.py",
        find="return Role.OPERATOR if isinstance(store, SqliteStore) else Role.ADMIN",
        replace="return Role.OPERATOR",
        tests=(f"{_INTEGRATION}::test_a_replicas_first_token_on_postgresql_stays_a_tenant_admin",),
    ),
    Mutation(
        claim="A server does not drive the workspaces another runtime ran on its store without "
        "--allow-runtime-change: it refuses to start and leaves them",
        code="server/kibo_ctrl/app.py",
        find="            if refusal:\n",
        replace="            if refusal and False:\n",
        tests=(f"{_INTEGRATION}::test_a_server_refuses_the_workspaces_of_another_runtime_and_leaves_them",),
    ),
    Mutation(
        claim="kibo workspace stop --all stops only the AVAILABLE workspaces with the labels given",
        code="client/kibo_cli/workspace.py",
        find="""    terms = ["state = AVAILABLE", *(f'labels.{key} = "{value}"' for key, value in labels.items())]""",
        replace="""    terms = ["state = AVAILABLE"]""",
        tests=(f"{_SYSTEM}::test_stop_all_stops_every_available_workspace_with_the_labels_given",),
    ),
    Mutation(
        claim="An example deletes the workspace it made (examples run one after another leave nothing)",
        code="examples/python/stop_with_settle.py",
        find="                client.delete_workspace(created)",
        replace="                pass",
        tests=(
            "tests/system/test_examples.py::test_examples_run_without_a_workspace_given_one_after_another_leave_nothing",
        ),
    ),
]
