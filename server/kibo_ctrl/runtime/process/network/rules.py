"""What nftables is told: the runtime's table and each guest's chain, as nft text.

Everything interpolated here is rendered from parsed values (ipaddress objects, ints, names
made by slots.py), never from a client's text: a policy is parsed again here (`parse`), so no
field can reach nft's parser as syntax.

One table `inet kibo_<tag>` per runtime (see the package docstring for the whole path):

- prerouting (raw): from a guest interface, IPv6 and a source that is not that interface's
  guest address (`@guest_addrs`: ifname . address) are dropped (anti-spoof);
- prerouting (nat): a guest's udp/tcp 53, to any address, goes to the resolver's port;
- input: from a guest interface only the resolver's port and replies; everything else of
  the host (the API, the node port, PostgreSQL, anything on loopback) is out of reach;
- forward: toward a guest only replies; from a guest, the always-blocked destinations
  (`@blocked`) are rejected, then `iifname vmap @guests` jumps to that guest's chain; a
  guest interface without a chain is dropped; if kibo turned ip_forward on, forwarded
  traffic that involves no guest interface is dropped (the host is no router for others);
- postrouting (nat): the pool's traffic leaving by any non-guest interface is masqueraded.

A guest chain `g<n>` (evaluated per packet, in order): connections admitted under the current
policy generation (`ct mark == gen`) pass; denied CIDRs are rejected; then the egress: ALLOW_ALL
marks and accepts, DENY_ALL rejects, ALLOW_LISTED marks and accepts what is in the allowed
CIDRs or the domain set (`g<n>_dyn`, filled by the resolver), on an allowed port if any are
listed, and rejects the rest. A policy change bumps gen: old connections are checked again,
packet by packet, and cut (a TCP reset) when no longer allowed."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from ....domain.model import NetworkEgress, NetworkPolicy

# Under every policy, whatever a guest aims at (checked before the policy). The pool itself
# (other guests) and the operator's extras are added per runtime.
ALWAYS_BLOCKED = (
    "0.0.0.0/8",  # "this network"
    "127.0.0.0/8",  # loopback (a martian when routed, but never trust that)
    "169.254.0.0/16",  # link-local: cloud metadata services (169.254.169.254)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the limited broadcast 255.255.255.255
)
# Every kibo runtime's guest interfaces start with this (slots.py): the forward drop of
# traffic that involves no guest must not drop another runtime's guests.
ALL_GUESTS = "kb*"
MARK_MAX = 0xFFFFFFFF


@dataclass(frozen=True)
class Parsed:
    """A policy as nftables needs it (IPv4 only: guests have no IPv6)."""

    egress: NetworkEgress
    allowed: tuple[ipaddress.IPv4Network, ...]
    denied: tuple[ipaddress.IPv4Network, ...]
    ports: tuple[int, ...]
    allowed_domains: tuple[str, ...]
    denied_domains: tuple[str, ...]


def _networks(texts: Iterable[str]) -> tuple[ipaddress.IPv4Network, ...]:
    found = []
    for text in texts:
        network = ipaddress.ip_network(str(text), strict=False)
        if isinstance(network, ipaddress.IPv4Network):
            found.append(network)
    return tuple(found)


def parse(policy: NetworkPolicy) -> Parsed:
    """The policy's enforceable parts (ValueError for what no valid policy holds)."""
    egress = NetworkEgress(policy.egress)
    if egress is NetworkEgress.UNSPECIFIED:
        egress = NetworkEgress.ALLOW_ALL
    ports = tuple(sorted({int(p) for p in getattr(policy, "allowed_ports", [])}))
    if any(not 0 < p < 65536 for p in ports):
        raise ValueError("a port is out of 1-65535")
    return Parsed(
        egress=egress,
        allowed=_networks(policy.allowed_cidrs),
        denied=_networks(getattr(policy, "denied_cidrs", [])),
        ports=ports,
        allowed_domains=tuple(getattr(policy, "allowed_domains", [])),
        denied_domains=tuple(getattr(policy, "denied_domains", [])),
    )


def _elements(networks: Iterable[ipaddress.IPv4Network]) -> str:
    return ", ".join(str(n) for n in networks)


def table(
    name: str,
    prefix: str,
    pool: ipaddress.IPv4Network,
    blocked: Iterable[ipaddress.IPv4Network],
    resolver_port: int,
    forward_guard: bool,
) -> str:
    """The runtime's table, created or brought up to date in one transaction: its base chains
    are flushed and refilled; guests' chains, sets and map entries are kept (live guests
    after a control-plane restart)."""
    guest = f'iifname "{prefix}*"'
    lines = [
        f"add table inet {name}",
        f"add set inet {name} blocked {{ type ipv4_addr; flags interval; auto-merge; }}",
        f"flush set inet {name} blocked",
        f"add element inet {name} blocked {{ {_elements([*blocked, pool])} }}",
        f"add set inet {name} guest_addrs {{ type ifname . ipv4_addr; }}",
        f"add map inet {name} guests {{ type ifname : verdict; }}",
    ]
    chains = {
        "pre_raw": "type filter hook prerouting priority raw; policy accept;",
        "pre_nat": "type nat hook prerouting priority dstnat; policy accept;",
        "input": "type filter hook input priority filter; policy accept;",
        "forward": "type filter hook forward priority filter; policy accept;",
        "post_nat": "type nat hook postrouting priority srcnat; policy accept;",
        "guest_input": "",
    }
    for chain, hook in chains.items():
        lines.append(f"add chain inet {name} {chain} {{ {hook} }}" if hook else f"add chain inet {name} {chain}")
        lines.append(f"flush chain inet {name} {chain}")
    rule = f"add rule inet {name}"
    lines += [
        # Anti-spoof: a guest's packets carry its own address, or are dropped (and no IPv6).
        f"{rule} pre_raw {guest} meta nfproto ipv6 drop",
        f"{rule} pre_raw {guest} iifname . ip saddr != @guest_addrs drop",
        f"{rule} pre_nat {guest} meta l4proto {{ tcp, udp }} th dport 53 redirect to :{resolver_port}",
        # The host itself: only the resolver, and replies to what the host sent.
        f"{rule} input {guest} jump guest_input",
        f"{rule} guest_input ct state established,related accept",
        f"{rule} guest_input meta l4proto {{ tcp, udp }} th dport {resolver_port} accept",
        f"{rule} guest_input drop",
        # Toward a guest: replies only (other guests, this runtime's or another's, and the world).
        f'{rule} forward oifname "{prefix}*" ct state established,related accept',
        f'{rule} forward oifname "{prefix}*" drop',
        f"{rule} forward {guest} ip daddr @blocked meta l4proto tcp reject with tcp reset",
        f"{rule} forward {guest} ip daddr @blocked reject with icmpx type admin-prohibited",
        f"{rule} forward {guest} iifname vmap @guests",
        f"{rule} forward {guest} drop",
        f'{rule} post_nat ip saddr {pool} oifname != "{prefix}*" masquerade',
    ]
    if forward_guard:
        lines.append(f'{rule} forward iifname != "{ALL_GUESTS}" oifname != "{ALL_GUESTS}" drop')
    return "\n".join(lines) + "\n"


def guest_chain(name: str, chain: str, policy: Parsed, gen: int, keep_domains: bool) -> str:
    """Flush and refill one guest's chain and sets (one transaction with the caller's other
    lines). `keep_domains`: the domain set survives (the domain rules did not change)."""
    rule = f"add rule inet {name} {chain}"
    reject = [
        f"{rule} meta l4proto tcp reject with tcp reset",
        f"{rule} reject with icmpx type admin-prohibited",
    ]
    lines = [f"add chain inet {name} {chain}", f"flush chain inet {name} {chain}"]
    for suffix, kind in (
        ("allow", "type ipv4_addr; flags interval; auto-merge;"),
        ("deny", "type ipv4_addr; flags interval; auto-merge;"),
        ("ports", "type inet_service;"),
        ("dyn", "type ipv4_addr; flags timeout;"),
    ):
        lines.append(f"add set inet {name} {chain}_{suffix} {{ {kind} }}")
        if suffix != "dyn" or not keep_domains:
            lines.append(f"flush set inet {name} {chain}_{suffix}")
    if policy.allowed:
        lines.append(f"add element inet {name} {chain}_allow {{ {_elements(policy.allowed)} }}")
    if policy.denied:
        lines.append(f"add element inet {name} {chain}_deny {{ {_elements(policy.denied)} }}")
    if policy.ports:
        lines.append(f"add element inet {name} {chain}_ports {{ {', '.join(map(str, policy.ports))} }}")
    # Admitted under this very policy: on, without another look.
    lines.append(f"{rule} ct state established,related ct mark {gen} accept")
    lines.append(f"{rule} ip daddr @{chain}_deny meta l4proto tcp reject with tcp reset")
    lines.append(f"{rule} ip daddr @{chain}_deny reject with icmpx type admin-prohibited")
    admit = f"ct mark set {gen} accept"
    if policy.egress is NetworkEgress.ALLOW_ALL:
        lines.append(f"{rule} {admit}")
    elif policy.egress is NetworkEgress.ALLOW_LISTED:
        port = f" th dport @{chain}_ports" if policy.ports else ""
        lines.append(f"{rule} ip daddr @{chain}_allow{port} {admit}")
        lines.append(f"{rule} ip daddr @{chain}_dyn{port} {admit}")
    lines += reject
    return "\n".join(lines) + "\n"


def guest_entry(name: str, veth: str, address: ipaddress.IPv4Address, chain: str) -> str:
    """The guest's interface -> its chain, and its one source address."""
    return (
        f'add element inet {name} guests {{ "{veth}" : jump {chain} }}\n'
        f'add element inet {name} guest_addrs {{ "{veth}" . {address} }}\n'
    )


def drop_guest(name: str, veth: str, address: ipaddress.IPv4Address, chain: str) -> str:
    """The guest's entries, chain and sets go (its interface leads nowhere: dropped)."""
    lines = [
        f'delete element inet {name} guests {{ "{veth}" }}',
        f'delete element inet {name} guest_addrs {{ "{veth}" . {address} }}',
        f"delete chain inet {name} {chain}",
    ]
    lines += [f"delete set inet {name} {chain}_{suffix}" for suffix in ("allow", "deny", "ports", "dyn")]
    return "\n".join(lines) + "\n"
