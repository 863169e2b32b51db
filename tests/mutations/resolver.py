"""Mutations of the guests' DNS resolver (issue 28: runtime/process/network/resolver.py) and of
the domain rules it decides with (domain/domains.py): each refusal, the drop of a source that is
no guest, an allowed name's addresses admitted before its answer leaves, and the bounds."""

from tests.mutations.base import Mutation

_RESOLVER = "server/kibo_ctrl/runtime/process/network/resolver.py"
_DOMAINS = "server/kibo_ctrl/domain/domains.py"
_T = "tests/unit/test_guest_resolver.py"
_RULES = "tests/unit/test_domain_rules.py"

MUTATIONS = [
    Mutation(
        claim="A denied domain is refused by the guests' resolver even when an allowed rule also matches it "
        "(deny beats allow), under ALLOW_LISTED and ALLOW_ALL",
        code=_DOMAINS,
        find='        if self._matches(name, self._denied_exact, self._denied_under):\n            return "deny"\n',
        replace="",
        tests=(
            f"{_T}::test_deny_beats_allow_under_allow_listed_and_allow_all",
            f"{_RULES}::test_deny_beats_allow_and_unlisted_names_are_neither",
        ),
    ),
    Mutation(
        claim="Under ALLOW_LISTED the guests' resolver refuses a name no allowed rule matches, and asks no "
        "upstream for it",
        code=_RESOLVER,
        find='if listed and decision != "allow":',
        replace='if listed and decision == "deny":',
        tests=(
            f"{_T}::test_allow_listed_refuses_an_unlisted_name_saying_so",
            f"{_T}::test_a_wildcard_holds_names_under_its_domain_not_the_domain",
        ),
    ),
    Mutation(
        claim="A wildcard rule *.d holds the names under d, never d itself nor a name that merely ends in d",
        code=_DOMAINS,
        find="if name[dot + 1 :] in under:",
        replace="if name[dot + 1 :] in under or name.endswith(tuple(under)):",
        tests=(
            f"{_T}::test_a_wildcard_holds_names_under_its_domain_not_the_domain",
            f"{_RULES}::test_a_wildcard_holds_every_depth_under_its_domain_and_not_the_domain",
        ),
    ),
    Mutation(
        claim="A '.' or other odd byte inside a DNS label can neither fake an allowed suffix nor hide a name "
        "from a denied one",
        code=_RESOLVER,
        find='lower.decode("ascii") if all(byte in _LABEL_BYTES for byte in lower) else "\\x00"',
        replace='lower.decode("latin-1")',
        tests=(
            f"{_T}::test_a_name_with_odd_bytes_in_a_label_is_still_under_its_real_parent",
            f"{_T}::test_a_wildcard_holds_names_under_its_domain_not_the_domain",
        ),
    ),
    Mutation(
        claim="Under DENY_ALL the guests' resolver refuses every name and asks no upstream",
        code=_RESOLVER,
        find="if guest.egress is NetworkEgress.DENY_ALL:",
        replace="if guest.egress is NetworkEgress.UNSPECIFIED:",
        tests=(f"{_T}::test_deny_all_refuses_every_name_with_a_blocked_error_and_asks_no_upstream",),
    ),
    Mutation(
        claim="A source address that is no guest's gets no answer at all from the guests' resolver (UDP or TCP): "
        "it is no open resolver and no reflector",
        code=_RESOLVER,
        find="        return self._guests(source)\n",
        replace="        open_to_all = GuestDns(NetworkEgress.ALLOW_ALL, DomainRules(), lambda a, t: None)\n"
        "        return self._guests(source) or open_to_all\n",
        tests=(f"{_T}::test_a_source_that_is_no_guest_gets_no_answer_at_all",),
    ),
    Mutation(
        claim="An allowed name's A records are admitted (the guest's nftables set) before its answer leaves, so "
        "the guest's connect that follows is not dropped",
        code=_RESOLVER,
        find="guest.allow_addresses(addresses, max(ttl, MIN_ALLOWANCE_S))",
        replace="asyncio.get_running_loop().call_soon(guest.allow_addresses, addresses, max(ttl, MIN_ALLOWANCE_S))",
        tests=(f"{_T}::test_the_addresses_are_admitted_before_the_answer_leaves",),
    ),
    Mutation(
        claim="An answer whose addresses could not be admitted is a SERVFAIL: the guest never holds an address "
        "its connect would be dropped for",
        code=_RESOLVER,
        find="                guest.allow_addresses(addresses, max(ttl, MIN_ALLOWANCE_S))\n",
        replace="                with contextlib.suppress(Exception):\n"
        "                    guest.allow_addresses(addresses, max(ttl, MIN_ALLOWANCE_S))\n",
        tests=(f"{_T}::test_an_answer_whose_addresses_could_not_be_admitted_is_servfail",),
    ),
    Mutation(
        claim="An allowed name's A records, through its CNAME chain, are admitted for the chain's least TTL "
        "(at least 60 s)",
        code=_RESOLVER,
        find="        ttl = cname.ttl if ttl is None else min(ttl, cname.ttl)\n",
        replace="",
        tests=(f"{_T}::test_cname_targets_addresses_are_admitted_with_the_chains_least_ttl",),
    ),
    Mutation(
        claim="An allowed name's A records are admitted for at least 60 s (a short TTL does not cut the "
        "connection that follows)",
        code=_RESOLVER,
        find="max(ttl, MIN_ALLOWANCE_S)",
        replace="ttl",
        tests=(f"{_T}::test_an_allowed_answer_admits_its_a_records_with_a_ttl_floor",),
    ),
    Mutation(
        claim="Only the A records of the asked name's CNAME chain are admitted, not other records an upstream "
        "adds to its answer",
        code=_RESOLVER,
        find="rrset.rdtype == rdtype and rrset.rdclass == dns.rdataclass.IN and rrset.name == owner",
        replace="rrset.rdtype == rdtype",
        tests=(f"{_T}::test_cname_targets_addresses_are_admitted_with_the_chains_least_ttl",),
    ),
    Mutation(
        claim="The guests' resolver holds at most MAX_IN_FLIGHT (256) queries at once; more are dropped",
        code=_RESOLVER,
        find="        if self._in_flight >= MAX_IN_FLIGHT:\n            return  # overloaded",
        replace="        if False:\n            return  # overloaded",
        tests=(f"{_T}::test_at_most_max_in_flight_queries_are_held_the_rest_dropped",),
    ),
    Mutation(
        claim="A TCP connection to the guests' resolver that goes idle is closed",
        code=_RESOLVER,
        find="            async with asyncio.timeout(TCP_IDLE_S):\n",
        replace="            async with asyncio.timeout(None):\n",
        tests=(f"{_T}::test_several_queries_on_one_tcp_connection_and_an_idle_one_is_closed",),
    ),
]
