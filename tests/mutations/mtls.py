"""Mutations of the node link's mutual TLS (issue 26 item 4; SECURITY.md: the node link): the
node port's client certificates and their node, the main port's bootstrap-only service, the
join token's proof and single use, the node's pin check, and the guest hop's TLS and peer."""

from tests.mutations.base import Mutation

_T = "tests/system/test_node_mtls.py"
_PORT = f"{_T}::test_the_node_port_takes_only_a_node_certificate_of_the_cluster_ca_for_its_own_node"
_PIN = f"{_T}::test_a_node_refuses_a_control_plane_whose_ca_its_join_token_does_not_pin"
_HOP = f"{_T}::test_the_guest_hop_is_tls_on_the_wire_and_plaintext_only_when_asked"
_PEER = f"{_T}::test_a_nodes_certificate_is_not_taken_as_the_control_planes_on_the_guest_hop"

MUTATIONS = [
    Mutation(
        claim="The node port takes only clients with a certificate of the cluster CA: another CA's, or none, "
        "fails the TLS handshake",
        code="server/kibo_ctrl/app.py",
        find="            require_client_auth=True,\n",
        replace="            require_client_auth=False,\n",
        tests=(_PORT,),
    ),
    Mutation(
        claim="On the node port a call is held to the node its certificate names: another node's certificate "
        "with a node's token is PERMISSION_DENIED",
        code="server/kibo_ctrl/api/node_certs.py",
        find="if caller.role is not Role.NODE or common_names != (caller.tenant,):",
        replace="if caller.role is not Role.NODE:",
        tests=(_PORT,),
    ),
    Mutation(
        claim="On a mutual-TLS cluster the main port serves NodeService's bootstrap only (FAILED_PRECONDITION "
        "naming the node port)",
        code="server/kibo_ctrl/routes.py",
        find='    if port == "main":\n        return _node_bootstrap_only(certificates)\n',
        replace="",
        tests=(_PORT,),
    ),
    Mutation(
        claim="A certificate is issued only for a proof made with one of the node's own active join tokens "
        "(the token never crosses the main port)",
        code="server/kibo_ctrl/engine/cluster_ca.py",
        find="if hmac.compare_digest(pki.join_proof(digest, node_id, csr_pem), proof):",
        replace="if True:",
        tests=(_PORT,),
    ),
    Mutation(
        claim="A join token buys one key's certificate once: the same key again gets the same certificate, "
        "another key is refused",
        code="server/kibo_ctrl/engine/cluster_ca.py",
        find="    used = tx.get_node_issuance(token_id)\n",
        replace="    used = None\n",
        tests=(_PORT,),
    ),
    Mutation(
        claim="A node checks the control plane's CA against its join token's pin before it keeps anything: "
        "a control plane of another CA is refused and the node does not join",
        code="server/kibo_ctrl/transport/node_identity.py",
        find="        if pin != self._pin:\n",
        replace="        if False:\n",
        tests=(_PIN,),
    ),
    Mutation(
        claim="A node serves the guest hop over TLS with its certificate: exec output never crosses it in plaintext",
        code="server/kibo_ctrl/node_host.py",
        find="credentials = None if self.identity is None else self.identity.server_credentials()",
        replace="credentials = None",
        tests=(_HOP,),
    ),
    Mutation(
        claim="A node's guest hop takes the control plane's certificate only: a node's certificate of the same "
        "CA (with the hop's secret) is PERMISSION_DENIED",
        code="server/kibo_ctrl/api/node_certs.py",
        find="    if common_names != (pki.CA_NAME,):\n",
        replace="    if False:\n",
        tests=(_PEER,),
    ),
]
