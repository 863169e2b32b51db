"""Guest networking of the process runtime (as root with bubblewrap): per guest a network
namespace, its veth and nftables chain, and the resolver that enforces domain rules.

`GuestNetworks` is what the runtime calls:

- `attach(instance_id, policy)` at a launch: a slot (slots.py; made ahead, a few kept ready
  by a background thread) gets the guest's chain and entries in the runtime's table
  (rules.py) in one nft transaction; the supervisor setns()s the guest into the slot's
  namespace (the plan's `netns`), the guest's /etc/resolv.conf names its gateway;
- `set_policy(instance_id, policy)`: a live change, one transaction (chain and sets refilled,
  the generation bumped: connections the new policy forbids are cut);
- `release(instance_id)` at a stop, force stop, destroy or failed launch: chain, sets, veth and
  namespace deleted. Not reset and pooled: a released namespace may still hold a socket of the
  old guest (a process that outlived it in another namespace, a conntrack entry), and a new
  one costs ~15 ms in the background, so a fresh one is the simpler guarantee;
- `adopt(live)` after a control-plane restart: slots are found from /run/netns and each
  slot's record (`<data dir>/runtime/network/<index>.json`: owner, policy, generation); a slot
  whose owner no longer runs is released;
- `close()`: the ready slots go; with no guest left, the table, the address claim and kibo's
  ip_forward flip go too (live guests keep theirs: supervisors outlive the control plane).

Rootless and `--sandbox none` have no guest network (the runtime does not build this)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
from pyroute2 import IPRoute

from ....domain.domains import DomainRules
from ....domain.model import NetworkPolicy
from . import pool, rules, slots
from .nft import Nft, NftError
from .resolver import GuestDns, GuestResolver, host_upstreams, parse_upstream

log = logging.getLogger(__name__)

READY_SLOTS = 4  # made ahead, so a create does not wait for a namespace and a veth
# The ready slots are made up only this long after the last was taken (or at once when none is
# left): bench/guest_network.py, create -> AVAILABLE p50 +7-8 ms with networking when made
# at once, beside the launch that took one.
REFILL_QUIET_S = 0.5


# The longest an allowed name's address stays admitted after an answer (its TTL, floored at
# the resolver's 60 s, capped here).
MAX_ALLOWANCE_S = 3600


@dataclass(frozen=True)
class NetworkOptions:
    """`--guest-network CIDR|off`, `--guest-deny CIDR` (repeatable), `--guest-dns ADDR[:PORT]`."""

    network: str = ""  # "": the first free /20 of 10.200.0.0/14; "off": no guest network
    deny: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()  # empty: the host's /etc/resolv.conf nameservers
    ready_slots: int = READY_SLOTS


@dataclass
class Held:
    instance_id: str
    slot: slots.Slot
    policy: rules.Parsed
    gen: int
    dns: GuestDns
    domains: dict[str, float]  # address -> when its allowance ends (monotonic)


def tag_of(data_dir: Path) -> str:
    """The runtime's tag: the cgroups' (sha256 of the data dir)."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]


def _gen() -> int:
    """A new policy generation (a connection's ct mark): unique on the host for a long time."""
    return max(1, time.time_ns() // 1000 & rules.MARK_MAX)


class GuestNetworks:
    def __init__(self, data_dir: Path, options: NetworkOptions, live: Callable[[str], bool]) -> None:
        """`live(instance_id)`: whether the instance's supervisor runs (adoption)."""
        self.tag = tag_of(data_dir)
        self.table = f"kibo_{self.tag}"
        self.prefix = slots.veth_prefix(self.tag)
        self.records = data_dir / "runtime" / "network"
        self.records.mkdir(parents=True, exist_ok=True)
        self._live = live
        self._options = options
        self._lock = threading.RLock()
        self._held: dict[str, Held] = {}
        self._by_address: dict[str, Held] = {}
        self._ready: list[slots.Slot] = []
        self._unknown = set(slots.existing(self.tag))  # found on the machine, owner not yet known
        self._making: set[int] = set()  # being made by the filler
        self._closed = False
        self.network = pool.claim(self.tag, data_dir, options.network or None, self.prefix)
        self.nft = Nft()
        pool.forward_on(self.tag)
        blocked = [ipaddress.IPv4Network(n) for n in rules.ALWAYS_BLOCKED]
        blocked += [n for n in rules._networks(options.deny)]
        upstreams = [parse_upstream(d) for d in options.dns] or host_upstreams()
        # The resolver on a loop of its own: it answers while the runtime's loop is busy, and
        # the runtime's methods stay blocking (called in threads).
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kibo-guest-dns", daemon=True)
        self._thread.start()
        self.resolver = GuestResolver(self._guest_dns, upstreams)
        self.resolver_port = asyncio.run_coroutine_threadsafe(self.resolver.start(), self._loop).result(10)
        self.nft.run(
            rules.table(self.table, self.prefix, self.network, blocked, self.resolver_port, pool.forward_by_kibo())
        )
        self._refill = threading.Event()
        self._last_take = 0.0
        self._filler = threading.Thread(target=self._fill, name="kibo-guest-slots", daemon=True)
        self._filler.start()
        log.info("guest network: %s (table inet %s, resolver port %d)", self.network, self.table, self.resolver_port)

    # -- the ready slots --------------------------------------------------------------------

    def _next_index(self) -> int:
        taken = {h.slot.index for h in self._held.values()} | {s.index for s in self._ready}
        taken |= self._unknown | self._making
        index = 0
        while index in taken:
            index += 1
        return index

    def _make_slot(self) -> slots.Slot:
        with self._lock:
            s = slots.slot(self.tag, self.network, self._next_index())
            self._making.add(s.index)  # reserved while it is made
        try:
            slots.make(s)
        finally:
            with self._lock:
                self._making.discard(s.index)
        return s

    def _fill(self) -> None:
        while not self._closed:
            with self._lock:
                ready = len(self._ready)
                wanted = not self._closed and ready < self._options.ready_slots
                quiet_in = self._last_take + REFILL_QUIET_S - time.monotonic()
            if wanted and ready > 0 and quiet_in > 0:
                # A launch is going on: a slot made now (netlink, in Python) would take the
                # CPU and the GIL from it. Made once launches pause, unless none is left.
                self._refill.wait(quiet_in)
                self._refill.clear()
                continue
            if wanted:
                try:
                    s = self._make_slot()
                except Exception as error:
                    log.warning("making a guest network slot failed: %s", error)
                    self._refill.wait(5)
                    continue
                with self._lock:
                    if self._closed:
                        slots.remove(s)
                        return
                    self._ready.append(s)
                continue
            self._refill.wait()
            self._refill.clear()

    def _take_slot(self) -> slots.Slot:
        """A ready slot (or a new one), reserved (`_making`) until `attach` holds it: the
        filler must never pick its index meanwhile (it would remove it as a leftover)."""
        with self._lock:
            s = self._ready.pop(0) if self._ready else None
            if s is not None:
                self._making.add(s.index)
            self._last_take = time.monotonic()
        self._refill.set()
        if s is None:
            s = self._make_slot()
            with self._lock:
                self._making.add(s.index)
        return s

    # -- guests ---------------------------------------------------------------------------

    def attach(self, instance_id: str, policy: NetworkPolicy) -> slots.Slot:
        """The guest's slot, its policy applied (blocking). A slot it holds already (a launch
        re-driven) is kept."""
        parsed = rules.parse(policy)
        with self._lock:
            held = self._held.get(instance_id)
        if held is not None:
            return held.slot
        s = self._take_slot()
        gen = _gen()
        try:
            self.nft.run(
                rules.guest_chain(self.table, s.chain, parsed, gen, keep_domains=False)
                + rules.guest_entry(self.table, s.veth, s.address, s.chain)
            )
            held = Held(instance_id, s, parsed, gen, self._dns(parsed, s), {})
            with self._lock:
                self._held[instance_id] = held
                self._by_address[str(s.address)] = held
            self._record(held)
        except BaseException:
            slots.remove(s)
            raise
        finally:
            with self._lock:
                self._making.discard(s.index)
        return s

    def set_policy(self, instance_id: str, policy: NetworkPolicy) -> None:
        """Enforce `policy` now (blocking): one transaction; KeyError if the instance holds no slot."""
        parsed = rules.parse(policy)
        with self._lock:
            held = self._held[instance_id]
            keep = (held.policy.allowed_domains, held.policy.denied_domains) == (
                parsed.allowed_domains,
                parsed.denied_domains,
            )
            gen = _gen()
            self.nft.run(rules.guest_chain(self.table, held.slot.chain, parsed, gen, keep_domains=keep))
            held.policy, held.gen = parsed, gen
            held.dns = self._dns(parsed, held.slot)
            if not keep:
                held.domains.clear()
        self._record(held)

    def release(self, instance_id: str) -> None:
        """The guest's chain, sets, veth and namespace go (idempotent, blocking)."""
        with self._lock:
            held = self._held.pop(instance_id, None)
            if held is not None:
                self._by_address.pop(str(held.slot.address), None)
                # Reserved while it goes: the filler (its own thread) would otherwise make a
                # slot of the same name meanwhile, which this removal then took away (a ready
                # slot with no namespace: "/run/netns/kibo-...: No such file" at a launch).
                self._making.add(held.slot.index)
        if held is None:
            return
        try:
            self._unhold(held.slot)
        finally:
            with self._lock:
                self._making.discard(held.slot.index)

    def _unhold(self, s: slots.Slot) -> None:
        with contextlib.suppress(NftError):
            self.nft.run(rules.drop_guest(self.table, s.veth, s.address, s.chain))
        slots.remove(s)
        with contextlib.suppress(FileNotFoundError):
            (self.records / f"{s.index}.json").unlink()

    def netns_of(self, instance_id: str) -> slots.Slot | None:
        with self._lock:
            held = self._held.get(instance_id)
        return held.slot if held is not None else None

    def present(self, instance_id: str) -> bool:
        """Whether the instance's slot (its namespace or veth) is on the machine, found by the
        slots' records: the machine, not this process's memory."""
        for record in self.records.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                data = json.loads(record.read_text())
                if data["instance_id"] == instance_id:
                    return slots.present(slots.slot(self.tag, self.network, int(data["index"])))
        return False

    # -- restart ----------------------------------------------------------------------------

    def adopt(self, known: frozenset[str] = frozenset()) -> None:
        """After a restart: each slot found on the machine is its recorded owner's if that
        owner still runs or the store still has it on this node (`known`: its end, a destroy,
        releases it), its policy in force again; else it goes."""
        with self._lock:
            found = sorted(self._unknown)
        for index in found:
            s = slots.slot(self.tag, self.network, index)
            record = self.records / f"{index}.json"
            owner = None
            with contextlib.suppress(OSError, ValueError, KeyError, msgspec.DecodeError):
                data = json.loads(record.read_text())
                if data["instance_id"] in known or self._live(data["instance_id"]):
                    policy = msgspec.convert(data["policy"], NetworkPolicy)
                    owner = data["instance_id"]
            if owner is None:
                self._unhold(s)
            else:
                parsed = rules.parse(policy)
                held = Held(owner, s, parsed, int(data["gen"]), self._dns(parsed, s), {})
                with self._lock:
                    # Held before it is no longer unknown, in one step: the filler (its own
                    # thread) never sees the index free and makes a slot of it again (which
                    # took the adopted guest's veth, and its route, under load).
                    self._held[owner] = held
                    self._by_address[str(s.address)] = held
                    self._unknown.discard(index)
                try:
                    self.nft.run(
                        rules.guest_chain(self.table, s.chain, held.policy, held.gen, keep_domains=True)
                        + rules.guest_entry(self.table, s.veth, s.address, s.chain)
                    )
                except NftError as error:
                    log.error("guest network of %s: its policy could not be applied again: %s", owner, error)
            with self._lock:
                self._unknown.discard(index)
        self._refill.set()

    # -- the resolver's view ------------------------------------------------------------

    def _dns(self, parsed: rules.Parsed, s: slots.Slot) -> GuestDns:
        try:
            domain_rules = DomainRules(parsed.allowed_domains, parsed.denied_domains)
        except ValueError as error:
            log.warning("guest %s: domain rules ignored: %s", s.netns, error)
            domain_rules = DomainRules()
        return GuestDns(parsed.egress, domain_rules, lambda addresses, ttl: self._allow(s, addresses, ttl))

    def _guest_dns(self, source: str) -> GuestDns | None:
        held = self._by_address.get(source)
        return held.dns if held is not None else None

    def _allow(self, s: slots.Slot, addresses: list[str], ttl: int) -> None:
        """An allowed name's addresses into the guest's domain set for `ttl` seconds (a
        fresher answer renews them)."""
        held = self._by_address.get(str(s.address))
        if held is None or not addresses:
            return
        # At most an hour, whatever the upstream says: a name that moves is followed within it.
        ttl = min(ttl, MAX_ALLOWANCE_S)
        now = time.monotonic()
        parsed = [ipaddress.IPv4Address(a) for a in addresses]
        fresh = [a for a in parsed if str(a) not in held.domains or held.domains[str(a)] < now]
        renew = [a for a in parsed if a not in fresh and held.domains[str(a)] < now + ttl]
        name, chain = self.table, f"{s.chain}_dyn"
        elements = ", ".join(f"{a} timeout {int(ttl)}s" for a in parsed)
        add = f"add element inet {name} {chain} {{ {elements} }}\n"
        try:
            # A fresher answer renews an element: deleted and added again, in one transaction.
            old = ", ".join(map(str, renew))
            self.nft.run((f"delete element inet {name} {chain} {{ {old} }}\n" if renew else "") + add)
        except NftError:
            # Our view was off (an element expired in the kernel meanwhile): add what is missing.
            self.nft.run(add)
        for a in parsed:
            held.domains[str(a)] = now + ttl

    def _record(self, held: Held) -> None:
        policy = NetworkPolicy(
            egress=held.policy.egress,
            allowed_cidrs=[str(n) for n in held.policy.allowed],
            denied_cidrs=[str(n) for n in held.policy.denied],
            allowed_domains=list(held.policy.allowed_domains),
            denied_domains=list(held.policy.denied_domains),
            allowed_ports=list(held.policy.ports),
        )
        data = {"instance_id": held.instance_id, "index": held.slot.index, "gen": held.gen}
        data["policy"] = msgspec.to_builtins(policy)
        path = self.records / f"{held.slot.index}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    # -- the end --------------------------------------------------------------------------

    def close(self) -> None:
        """Ready slots go; with no guest held, everything else of this runtime's too."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
            idle = not self._held and not self._unknown
        self._refill.set()
        self._filler.join(10)
        for s in ready:
            slots.remove(s)
        asyncio.run_coroutine_threadsafe(self.resolver.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        if idle:
            with contextlib.suppress(NftError):
                self.nft.run(f"delete table inet {self.table}\n")
            pool.forward_off(self.tag)
            pool.release(self.tag)
        self.nft.close()


def reap(data_dir: Path) -> None:
    """Everything of a data directory's guest network, whoever holds it (its runtime is gone
    and its guests killed): namespaces, veths, table, claim, ip_forward flip. For operators and
    tests' teardown."""
    tag = tag_of(data_dir)
    for index in slots.existing(tag):
        slots.remove(slots.slot(tag, ipaddress.IPv4Network("0.0.0.0/0"), index))

    def veths() -> None:
        with IPRoute() as ipr:
            for link in ipr.get_links():
                if (link.get_attr("IFLA_IFNAME") or "").startswith(slots.veth_prefix(tag)):
                    with contextlib.suppress(Exception):
                        ipr.link("del", index=link["index"])

    slots.off_loop(veths)
    nft = Nft()
    try:
        with contextlib.suppress(NftError):
            nft.run(f"delete table inet kibo_{tag}\n")
    finally:
        nft.close()
    pool.forward_off(tag)
    pool.release(tag)


def leftovers(data_dir: Path) -> list[str]:
    """What of a data directory's guest network is on the machine (tests' leftover check)."""
    tag = tag_of(data_dir)
    found = [f"netns kibo-{tag}-{i}" for i in slots.existing(tag)]
    found += [f"veth {name}" for name in _links() if name.startswith(slots.veth_prefix(tag))]
    nft = Nft()
    try:
        if f"table inet kibo_{tag}" in nft.run("list tables\n"):
            found.append(f"nft table inet kibo_{tag}")
    finally:
        nft.close()
    if (pool.CLAIMS_DIR / f"{tag}.json").exists():
        found.append(f"claim {pool.CLAIMS_DIR}/{tag}.json")
    if (pool.CLAIMS_DIR / f"forward.{tag}").exists():
        found.append(f"ip_forward flip {pool.CLAIMS_DIR}/forward.{tag}")
    return found


def _links() -> list[str]:
    def names() -> list[str]:
        with IPRoute() as ipr:
            return [str(link.get_attr("IFLA_IFNAME") or "") for link in ipr.get_links()]

    return slots.off_loop(names)
