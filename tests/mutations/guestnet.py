"""Mutations of guest networking (issue 28, runtime/process/network/): the host's own ports
out of a guest's reach (the input chain), the destinations no policy opens (the always-blocked
set), a guest's one source address (anti-spoof), each guest under its own policy (the per-guest
chain), a policy's default drop, and a live change cutting what it forbids (the ct mark gen)."""

from tests.mutations.base import Mutation

_T = "tests/system/test_guest_network.py::"
_RULES = "server/kibo_ctrl/runtime/process/network/rules.py"
_POLICIES = ("allow_all", "deny_all", "listed_all")

MUTATIONS = [
    Mutation(
        claim=(
            "A guest reaches none of the host's own listeners (PostgreSQL, the node port, anything on 0.0.0.0) "
            "by its gateway or the host's addresses, under every policy: the input chain drops all but the resolver"
        ),
        code=_RULES,
        find='        f"{rule} guest_input drop",\n',
        replace='        f"{rule} guest_input accept",\n',
        tests=tuple(f"{_T}test_never_reached[{p}-{t}]" for p in _POLICIES for t in ("host_veth", "host_primary")),
    ),
    Mutation(
        claim=(
            "169.254.0.0/16 (a cloud's metadata service), loopback, multicast and the operator's --guest-deny "
            "stay closed under every policy, ALLOW_ALL and an allow-list of 0.0.0.0/0 included"
        ),
        code=_RULES,
        find='        f"{rule} forward {guest} ip daddr @blocked meta l4proto tcp reject with tcp reset",\n'
        '        f"{rule} forward {guest} ip daddr @blocked reject with icmpx type admin-prohibited",\n',
        replace="",
        tests=(f"{_T}test_never_reached[allow_all-metadata]", f"{_T}test_never_reached[listed_all-metadata]"),
    ),
    Mutation(
        claim="A guest's packets with any source address but its own are dropped by the host (anti-spoof)",
        code=_RULES,
        find='        f"{rule} pre_raw {guest} iifname . ip saddr != @guest_addrs drop",\n',
        replace="",
        tests=(f"{_T}test_a_guest_packet_with_another_source_address_is_dropped",),
    ),
    Mutation(
        claim="Each guest's traffic is judged by its own policy's chain (the interface -> chain map)",
        code=_RULES,
        find='        f"{rule} forward {guest} iifname vmap @guests",\n',
        replace='        f"{rule} forward {guest} accept",\n',
        tests=(
            f"{_T}test_deny_all_blocks_the_target",
            f"{_T}test_allow_listed_admits_only_the_listed_address_and_port",
        ),
    ),
    Mutation(
        claim=(
            "What a policy does not allow is refused (DENY_ALL, and under ALLOW_LISTED every address and port "
            "not listed)"
        ),
        code=_RULES,
        find="    lines += reject\n",
        replace='    lines.append(f"{rule} accept")\n',
        tests=(
            f"{_T}test_deny_all_blocks_the_target",
            f"{_T}test_allow_listed_admits_only_the_listed_address_and_port",
        ),
    ),
    Mutation(
        claim=(
            "A policy changed while AVAILABLE applies at once, without a restart, and cuts the open connections it "
            "no longer allows"
        ),
        code=_RULES,
        find='    lines.append(f"{rule} ct state established,related ct mark {gen} accept")\n',
        replace='    lines.append(f"{rule} ct state established,related accept")\n',
        tests=(f"{_T}test_a_live_policy_change_applies_without_a_restart_and_cuts_what_it_forbids",),
    ),
    Mutation(
        claim=(
            "A domain rule admits the addresses the node's resolver answers for the name, and follows the name "
            "to a new address (ALLOW_LISTED: nothing else is reached)"
        ),
        code="server/kibo_ctrl/runtime/process/network/__init__.py",
        find="        if held is None or not addresses:\n            return\n",
        replace="        return\n",
        tests=(f"{_T}test_a_domain_rule_follows_its_name_to_a_new_address",),
    ),
    Mutation(
        claim="Under ALLOW_LISTED a guest reaches an allowed domain's addresses only through its policy's set",
        code=_RULES,
        find='    lines.append(f"{rule} ip daddr @{chain}_dyn{port} {admit}")\n',
        replace="",
        tests=(f"{_T}test_a_domain_rule_follows_its_name_to_a_new_address",),
    ),
    Mutation(
        claim=(
            "The cleanup status's network part is read from the machine: a guest whose VMM died still holds its "
            "network (namespace, veth, rules) until the instance is released"
        ),
        code="server/kibo_ctrl/runtime/process/observation.py",
        find="        seen[Component.NETWORK] = guest_alive or host.networks.present(instance_id)\n",
        replace="        seen[Component.NETWORK] = guest_alive\n",
        tests=("tests/system/test_cleanup_os.py::test_a_killed_supervisor_shows_released_at_once",),
    ),
    Mutation(
        claim=(
            "After a control-plane restart the runtime finds its guests' network slots on the machine: the guest "
            "keeps its network and takes a new policy live"
        ),
        code="server/kibo_ctrl/runtime/process/runtime.py",
        find="            self.networks.adopt(frozenset(i.id for i in instances))\n",
        replace="            pass\n",
        tests=(f"{_T}test_after_a_control_plane_kill_the_guest_keeps_its_network_and_takes_a_new_policy",),
    ),
    Mutation(
        claim=(
            "A guest's network slot being released is never made again meanwhile by the filler thread (which "
            "removes a leftover of the same name first): every ready slot keeps its namespace"
        ),
        code="server/kibo_ctrl/runtime/process/network/__init__.py",
        find="                self._making.add(held.slot.index)\n",
        replace="                pass\n",
        tests=("tests/system/test_guest_network_slots.py::test_a_released_slot_is_not_made_again_while_it_goes",),
    ),
]
