"""Mutations of guest ports (issue 28: an exposure's last hop): a connection is made inside
the guest's own network namespace, never the host's; a reused pid is never entered; a port
is 1 to 65535; the node's hop takes only the control plane's secret; a close cuts the
connection."""

from tests.mutations.base import Mutation

_HOP = "tests/system/test_guest_ports.py::test_guest_ports_in_process_and_through_a_nodes_hop"
_FAKE = "tests/system/test_guest_ports.py::test_a_reused_pid_or_a_guest_without_its_own_network_is_never_entered"

MUTATIONS = [
    Mutation(
        claim=(
            "A guest port is connected to inside the guest's network namespace: the host's own ports on the "
            "same number are never reached"
        ),
        code="server/kibo_ctrl/runtime/process/guest_access/ports.py",
        find="            _setns(netns)\n",
        replace="            pass\n",
        tests=(_HOP,),
    ),
    Mutation(
        claim=(
            "A guest's pid reused by another process after the guest ended is never entered (its start time "
            "is checked through the same /proc handle)"
        ),
        code="server/kibo_ctrl/runtime/process/guest_access/ports.py",
        find=" or int(fields[19]) != start:",
        replace=":",
        tests=(_FAKE,),
    ),
    Mutation(
        claim=(
            "A guest without a network namespace of its own (--sandbox none) has no exposed ports: the host's "
            "are never reached"
        ),
        code="server/kibo_ctrl/runtime/process/guest_access/ports.py",
        find='    if spec.get("isolation") != "bwrap":',
        replace="    if False:",
        tests=(_FAKE,),
    ),
    Mutation(
        claim="A guest port outside 1-65535 is refused as invalid, in process and through a node's hop",
        code="server/kibo_ctrl/runtime/process/guest_access/ports.py",
        find="    if not 1 <= port <= 65535:",
        replace="    if False:",
        tests=(_HOP,),
    ),
    Mutation(
        claim="A node's OpenGuestPort takes only the control plane's secret",
        code="server/kibo_ctrl/transport/grpc.py",
        find="            caller = await _caller(auth, context)  # before a request is read",
        replace="            caller: Any = None",
        tests=(_HOP,),
    ),
    Mutation(
        claim="Closing a connection to a remote guest's port cuts the guest's side at once (a revoked exposure)",
        code="server/kibo_ctrl/transport/node_guest_client.py",
        find="        self._eof = self._sent_eof = True\n        self._call.cancel()",
        replace="        self._eof = self._sent_eof = True",
        tests=(_HOP,),
    ),
]
