"""Mutations of `kibo node forget` (issue 26): a node's disks are given up only when asked,
and a forgotten node never comes back under its ID."""

from tests.mutations.base import Mutation

_TEST = (
    "tests/system/test_nodes.py::test_a_silent_node_is_forgotten_only_when_asked_and_its_disks_only_with_abandon_disks"
)

MUTATIONS = [
    Mutation(
        claim="A node holding workspaces' disks is forgotten only with --abandon-disks; refused, nothing changes",
        code="server/kibo_ctrl/engine/lost_nodes.py",
        find="if (workspaces or volumes) and not abandon_disks:",
        replace="if False:",
        tests=(_TEST,),
    ),
    Mutation(
        claim="Only a SILENT node can be forgotten (a live one is drained)",
        code="server/kibo_ctrl/engine/lost_nodes.py",
        find="    if not record.silent:\n        raise Conflict(",
        replace="    if False:\n        raise Conflict(",
        tests=(_TEST,),
    ),
    Mutation(
        claim="A forgotten node may not join again under its ID",
        code="server/kibo_ctrl/engine/node_registry.py",
        find="    if record is not None and record.forgotten:",
        replace="    if False:",
        tests=(_TEST,),
    ),
]
