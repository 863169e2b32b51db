"""Mutations of tenancy: what a node may report (issue 27 item 6), and another tenant's IDs
answering exactly like missing ones (issue 35 item 3)."""

from tests.mutations.base import Mutation

_REGISTRY = "server/kibo_ctrl/engine/node_registry.py"
_NODE_API = "tests/integration/test_node_api.py"
_NODE_REGISTRY = "tests/integration/test_node_registry.py"
_CROSS = "tests/integration/test_cross_tenant.py"
_CROSS_BOTH = (
    f"{_CROSS}::test_another_tenants_ids_answer_exactly_like_missing_ones[grpc]",
    f"{_CROSS}::test_another_tenants_ids_answer_exactly_like_missing_ones[connect]",
)

MUTATIONS = [
    Mutation(
        claim="A node reports released only the volumes whose files it holds; another node's volume answers "
        "NOT_FOUND like a missing one and stays pending",
        code=_REGISTRY,
        find="if volume is None or _storage_holder(tx, volume.storage_pool, volume.storage_node) != node:",
        replace="if volume is None:",
        tests=(
            f"{_NODE_API}::test_a_node_reports_released_only_the_storage_routed_to_it",
            f"{_NODE_REGISTRY}::test_a_node_releases_only_the_volumes_routed_to_it",
        ),
    ),
    Mutation(
        claim="A node reports released only the workspace storage on its disk; another node's answers NOT_FOUND "
        "like a missing one and stays pending",
        code=_REGISTRY,
        find="if workspace is None or _storage_holder(tx, workspace.storage_pool, _files_on(workspace)) != node:",
        replace="if workspace is None:",
        tests=(f"{_NODE_API}::test_a_node_reports_released_only_the_storage_routed_to_it",),
    ),
    Mutation(
        claim="A deleted volume's files are destroyed by the node whose disk holds them: its release is routed "
        "to that node, and only that node's report is taken",
        code=_REGISTRY,
        find="owner = self._storage_owner(volume.storage_pool, volume.storage_node)",
        replace="owner = self._storage_owner(volume.storage_pool, None)",
        tests=(f"{_NODE_REGISTRY}::test_a_volume_on_a_nodes_disk_is_released_by_that_node_only",),
    ),
    Mutation(
        claim="A deleted volume's files are destroyed by the node whose disk holds them: its release is routed "
        "to that node, and only that node's report is taken",
        code=_REGISTRY,
        find="if volume is None or _storage_holder(tx, volume.storage_pool, volume.storage_node) != node:",
        replace="if volume is None or _storage_holder(tx, volume.storage_pool, None) != node:",
        tests=(f"{_NODE_REGISTRY}::test_a_volume_on_a_nodes_disk_is_released_by_that_node_only",),
    ),
    Mutation(
        claim="A deleted volume's files are destroyed by the node whose disk holds them: its release is routed "
        "to that node, and only that node's report is taken",
        code=_REGISTRY,
        find="if self._storage_owner(volume.storage_pool, volume.storage_node) == node:",
        replace="if self._storage_owner(volume.storage_pool, None) == node:",
        tests=(f"{_NODE_REGISTRY}::test_a_volume_on_a_nodes_disk_is_released_by_that_node_only",),
    ),
    Mutation(
        claim="A node reports on and reads the launch spec of its own instances only; another node's answers "
        "NOT_FOUND like a missing one",
        code=_REGISTRY,
        find="if instance is None or instance.node_id != node:",
        replace="if instance is None:",
        tests=(f"{_NODE_API}::test_a_node_token_acts_as_its_own_node_only",),
    ),
    Mutation(
        claim="A node reports released only the volumes whose files it holds; another node's volume answers "
        "NOT_FOUND like a missing one and stays pending",
        code=_REGISTRY,
        find='raise NotFound(f"node {node} holds no volume {volume_id}", field="volume_id")',
        replace='raise NotFound(f"node {node} holds no volume {volume_id}" + ("" if volume is None else "!"), '
        'field="volume_id")',
        tests=(
            f"{_NODE_API}::test_a_node_reports_released_only_the_storage_routed_to_it",
            f"{_NODE_REGISTRY}::test_a_node_releases_only_the_volumes_routed_to_it",
        ),
    ),
    Mutation(
        claim="A node keeps the storage pool of its first join, and a pool not shared by the operator is one node's",
        code=_REGISTRY,
        find="if pool not in self.policy.shared_pools and any(",
        replace="if False and any(",
        tests=(f"{_NODE_REGISTRY}::test_a_pool_is_bound_to_its_node_unless_shared",),
    ),
    Mutation(
        claim="A node keeps the storage pool of its first join, and a pool not shared by the operator is one node's",
        code=_REGISTRY,
        find="if known.storage_pool != node.storage_pool:",
        replace="if False:",
        tests=(f"{_NODE_REGISTRY}::test_a_pool_is_bound_to_its_node_unless_shared",),
    ),
    Mutation(
        claim="A join claiming more vCPUs or memory than the operator's policy allows is refused",
        code=_REGISTRY,
        find="        self.policy.check_capacity(node)\n",
        replace="",
        tests=(f"{_NODE_REGISTRY}::test_a_join_claiming_more_than_the_policy_allows_is_refused",),
    ),
    Mutation(
        claim="Another tenant cannot issue a data-plane credential on a workspace (it would exec as root there); "
        "its ID answers like a missing one",
        code="server/kibo_ctrl/api/data_plane.py",
        find="if workspace is None or workspace.deleted or workspace.tenant != caller.tenant:",
        replace="if workspace is None or workspace.deleted:",
        tests=(*_CROSS_BOTH, f"{_CROSS}::test_a_credential_reaches_its_own_workspace_only"),
    ),
    Mutation(
        claim="Another tenant's workspace, volume, command, events and cleanup status answer exactly like a "
        "missing ID's: code, message and details",
        code="server/kibo_ctrl/api/control_plane.py",
        find='raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")\n        return workspace',
        replace='raise NotFound(f"workspace {workspace_id} not found", field="workspace_id" if workspace is None '
        'else "workspace")\n        return workspace',
        tests=_CROSS_BOTH,
    ),
    Mutation(
        claim="Another tenant's workspace, volume, command, events and cleanup status answer exactly like a "
        "missing ID's: code, message and details",
        code="server/kibo_ctrl/api/control_plane.py",
        find='raise NotFound(f"volume {volume_id} not found", field="volume_id")\n        return vol_pb2',
        replace='raise NotFound(f"volume {volume_id} not found" + ("" if volume is None else " here"), '
        'field="volume_id")\n        return vol_pb2',
        tests=_CROSS_BOTH,
    ),
    Mutation(
        claim="Another tenant's workspace, volume, command, events and cleanup status answer exactly like a "
        "missing ID's: code, message and details",
        code="server/kibo_ctrl/engine/service.py",
        find="if workspace is None or workspace.tenant != request.tenant:",
        replace="if workspace is None:",
        tests=_CROSS_BOTH,
    ),
]
