"""Mutations of the protections of issue 26: listeners (item 6), disks kept with their node (item 3),
one first token for replicas (item 4)."""

from tests.mutations.base import Mutation

_LISTENERS = "tests/system/test_node_listeners.py"

MUTATIONS = [
    Mutation(
        claim="A second server or node agent on a taken gRPC port fails at its start, naming the address",
        code="server/kibo_ctrl/transport/grpc.py",
        find='EXCLUSIVE_PORT = ("grpc.so_reuseport", 0)',
        replace='EXCLUSIVE_PORT = ("grpc.so_reuseport", 1)',
        tests=(
            f"{_LISTENERS}::test_a_second_server_on_a_taken_grpc_port_fails_naming_it",
            f"{_LISTENERS}::test_two_node_agents_on_one_host_each_serve_their_own_guests",
        ),
    ),
    Mutation(
        claim="A node's guest hop listens on its address towards the control plane, not on every interface",
        code="server/kibo_ctrl/node_host.py",
        find="_join(_route_host(self.config), DATA_PLANE_PORT)",
        replace='_join("0.0.0.0", DATA_PLANE_PORT)',
        tests=(f"{_LISTENERS}::test_the_guest_hop_binds_the_route_to_the_control_plane_by_default",),
    ),
    Mutation(
        claim="A workspace starts only on the node that holds its disks (layer, volumes), waiting with that node named",
        code="server/kibo_ctrl/engine/placement.py",
        find=" and wants.pin in (None, node.id)]",
        replace="]",
        tests=("tests/integration/test_scheduler.py::test_a_workspace_starts_only_on_the_node_that_holds_its_disks",),
    ),
    Mutation(
        claim="Replicas starting together on a fresh database make one first token between them",
        code="server/kibo_ctrl/tokens.py",
        find="        if tx.list_tokens():\n            return None\n",
        replace="",
        tests=("tests/unit/test_first_token.py::test_the_first_token_is_made_once_whoever_asks",),
    ),
]
