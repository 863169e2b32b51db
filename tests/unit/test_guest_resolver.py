"""The guests' DNS resolver (runtime/process/network/resolver.py), on real sockets: an upstream
DNS server started here (dnspython, answering from a dict each test changes), the resolver on a
random port of 127.0.0.1, queries from 127.0.0.1 (a guest the test's policy governs) or
127.0.0.2 (no guest). What is proven: refusals per egress and rule, deny beats allow,
wildcards, allowed A records admitted with a TTL floor BEFORE the answer leaves, an address
change followed, unknown sources dropped, upstream failures, hostile bytes, TCP, bounds."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import dns.asyncquery
import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest
from kibo_ctrl.domain.domains import DomainRules
from kibo_ctrl.domain.model import NetworkEgress
from kibo_ctrl.runtime.process.network import resolver as r

GUEST = "127.0.0.1"
STRANGER = "127.0.0.2"
EXPIRED = 0.4  # the resolver's upstream timeout in these tests


@dataclass
class Upstream:
    """An authoritative-looking server: `a[name] = (ttl, [addresses])`, `cname[name] = (ttl,
    target)`; `silent`: answers nothing; names in `big` get 60 A records (truncated over UDP)."""

    a: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    cname: dict[str, tuple[int, str]] = field(default_factory=dict)
    big: set[str] = field(default_factory=set)
    extra: set[str] = field(default_factory=set)  # asked names whose answer section has other.test's A too
    silent: bool = False
    asked: list[tuple[str, str, str]] = field(default_factory=list)  # (transport, name, type)
    port: int = 0

    def answer(self, wire: bytes, transport: str) -> bytes | None:
        query = dns.message.from_wire(wire)
        question = query.question[0]
        name = question.name.to_text().lower()
        self.asked.append((transport, name, dns.rdatatype.to_text(question.rdtype)))
        if self.silent:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        owner = question.name
        for _ in range(8):
            if owner.to_text().lower() not in self.cname:
                break
            ttl, target = self.cname[owner.to_text().lower()]
            response.answer.append(dns.rrset.from_text(owner, ttl, "IN", "CNAME", target))
            owner = dns.name.from_text(target)
        key = owner.to_text().lower()
        if question.rdtype == dns.rdatatype.A and key in self.big:
            addresses = [f"198.18.1.{i}" for i in range(1, 61)]
            response.answer.append(dns.rrset.from_text_list(owner, 300, "IN", "A", addresses))
        elif question.rdtype == dns.rdatatype.A and key in self.a:
            ttl, addresses = self.a[key]
            response.answer.append(dns.rrset.from_text_list(owner, ttl, "IN", "A", addresses))
        elif question.rdtype == dns.rdatatype.TXT and key in self.a:
            response.answer.append(dns.rrset.from_text(owner, 30, "IN", "TXT", '"hello"'))
        elif not response.answer:
            response.set_rcode(dns.rcode.NXDOMAIN)
        # An unrelated record an upstream may add: never admitted (not on the name's chain).
        unrelated = dns.rrset.from_text("other.test.", 300, "IN", "A", "198.18.9.9")
        if name in self.extra:
            response.answer.insert(0, unrelated)
        else:
            response.additional.append(unrelated)
        return response.to_wire(max_size=512 if transport == "udp" else 65535, prefer_truncation=True)


class _UpstreamUdp(asyncio.DatagramProtocol):
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        reply = self.upstream.answer(data, "udp")
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


async def _serve(up: Upstream) -> tuple[asyncio.DatagramTransport, asyncio.Server]:
    """UDP and TCP on one free port (another port when the UDP port's TCP twin is taken)."""
    loop = asyncio.get_running_loop()

    async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            reply = up.answer(await reader.readexactly(length), "tcp")
            if reply is not None:
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        finally:
            writer.close()

    for _ in range(20):
        udp, _ = await loop.create_datagram_endpoint(lambda: _UpstreamUdp(up), local_addr=("127.0.0.1", 0))
        up.port = udp.get_extra_info("sockname")[1]
        try:
            return udp, await asyncio.start_server(tcp, "127.0.0.1", up.port)
        except OSError:
            udp.close()
    raise OSError("no port free for both UDP and TCP")


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    udp, server = await _serve(up)
    yield up
    udp.close()
    server.close()
    await server.wait_closed()


@dataclass
class Guest:
    """The policy the resolver sees for 127.0.0.1, and what it admitted."""

    egress: NetworkEgress = NetworkEgress.ALLOW_LISTED
    allowed: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    admitted: list[tuple[list[str], int]] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)
    on_admit: list[object] = field(default_factory=list)  # callables run inside allow_addresses

    def dns(self) -> r.GuestDns:
        def admit(addresses: list[str], ttl: int) -> None:
            self.admitted.append((addresses, ttl))
            for hook in self.on_admit:
                hook()  # type: ignore[operator]

        return r.GuestDns(self.egress, DomainRules(self.allowed, self.denied), admit)

    def lookup(self, source: str) -> r.GuestDns | None:
        self.lookups.append(source)
        return self.dns() if source == GUEST else None


@dataclass
class Running:
    port: int
    guest: Guest
    upstream: Upstream
    resolver: r.GuestResolver


async def _start(upstreams: list[tuple[str, int]], guest: Guest, up: Upstream) -> Running:
    resolver = r.GuestResolver(guest.lookup, upstreams, timeout_s=EXPIRED)
    port = await resolver.start("127.0.0.1", 0)
    return Running(port, guest, up, resolver)


@pytest.fixture
async def running(upstream: Upstream) -> AsyncIterator[Running]:
    run = await _start([("127.0.0.1", upstream.port)], Guest(), upstream)
    yield run
    await run.resolver.close()


async def ask(
    run: Running, name: str, rdtype: str = "A", *, edns: bool = True, tcp: bool = False, source: str = GUEST
) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype, use_edns=0 if edns else False)
    if tcp:
        return await dns.asyncquery.tcp(query, "127.0.0.1", timeout=3, port=run.port, source=source)
    return await dns.asyncquery.udp(query, "127.0.0.1", timeout=3, port=run.port, source=source)


def _addresses(message: dns.message.Message) -> list[str]:
    return sorted(rd.address for rrset in message.answer if rrset.rdtype == dns.rdatatype.A for rd in rrset)


def _blocked(message: dns.message.Message) -> list[str]:
    return [o.text or "" for o in message.options if isinstance(o, dns.edns.EDEOption) and o.code == 15]


# -- refusals per egress and rule --------------------------------------------------------


async def test_deny_all_refuses_every_name_with_a_blocked_error_and_asks_no_upstream(running: Running) -> None:
    running.guest.egress = NetworkEgress.DENY_ALL
    running.upstream.a["api.example.com."] = (300, ["198.18.0.1"])
    answer = await ask(running, "api.example.com")
    assert answer.rcode() == dns.rcode.REFUSED
    assert _blocked(answer) == ["kibo: the workspace's network policy allows no network"]
    plain = await ask(running, "api.example.com", edns=False)
    assert plain.rcode() == dns.rcode.REFUSED and plain.edns < 0  # no EDNS asked: none answered
    assert running.upstream.asked == [] and running.guest.admitted == []


async def test_allow_listed_refuses_an_unlisted_name_saying_so(running: Running) -> None:
    running.guest.allowed = ["api.example.com"]
    running.upstream.a["www.example.com."] = (300, ["198.18.0.2"])
    answer = await ask(running, "www.example.com")
    assert answer.rcode() == dns.rcode.REFUSED and not answer.answer
    assert _blocked(answer) == ["kibo: www.example.com is not in the workspace's network policy"]
    assert running.upstream.asked == [] and running.guest.admitted == []


async def test_deny_beats_allow_under_allow_listed_and_allow_all(running: Running) -> None:
    running.upstream.a["bad.example.com."] = (300, ["198.18.0.3"])
    running.upstream.a["good.example.com."] = (300, ["198.18.0.4"])
    for egress in (NetworkEgress.ALLOW_LISTED, NetworkEgress.ALLOW_ALL):
        running.guest.egress = egress
        running.guest.allowed = ["*.example.com"] if egress is NetworkEgress.ALLOW_LISTED else []
        running.guest.denied = ["bad.example.com"]
        refused = await ask(running, "BAD.example.com")
        assert refused.rcode() == dns.rcode.REFUSED, egress
        assert _blocked(refused) == ["kibo: BAD.example.com is denied by the workspace's network policy"]
        good = await ask(running, "good.example.com")
        assert good.rcode() == dns.rcode.NOERROR and _addresses(good) == ["198.18.0.4"], egress
    assert [name for _, name, _ in running.upstream.asked] == ["good.example.com."] * 2
    assert running.guest.admitted == [(["198.18.0.4"], 300)]  # ALLOW_ALL admits nothing: all is open


async def test_a_wildcard_holds_names_under_its_domain_not_the_domain(running: Running) -> None:
    running.guest.allowed = ["*.pypi.org"]
    for name in ("pypi.org.", "files.pypi.org.", "a.b.pypi.org.", "evilpypi.org."):
        running.upstream.a[name] = (300, ["198.18.0.5"])
    for name in ("files.pypi.org", "a.b.pypi.org", "FILES.PYPI.ORG"):
        assert (await ask(running, name)).rcode() == dns.rcode.NOERROR, name
    for name in ("pypi.org", "evilpypi.org", r"x\.pypi.org", "pypi.org.evil.test"):
        assert (await ask(running, name)).rcode() == dns.rcode.REFUSED, name


async def test_a_name_with_odd_bytes_in_a_label_is_still_under_its_real_parent(running: Running) -> None:
    """A '.' inside a label cannot fake a suffix, and cannot hide a name under a denied one."""
    running.guest.egress = NetworkEgress.ALLOW_ALL
    running.guest.denied = ["*.evil.test"]
    assert (await ask(running, r"a\.b.evil.test")).rcode() == dns.rcode.REFUSED
    assert (await ask(running, r"a\032b.evil.test")).rcode() == dns.rcode.REFUSED
    running.guest.egress = NetworkEgress.ALLOW_LISTED
    running.guest.denied = []
    running.guest.allowed = ["evil.test"]
    assert (await ask(running, r"evil\.test")).rcode() == dns.rcode.REFUSED  # one label: not evil.test


# -- allowed answers and their addresses -------------------------------------------------


async def test_an_allowed_answer_admits_its_a_records_with_a_ttl_floor(running: Running) -> None:
    running.guest.allowed = ["api.example.com", "*.cdn.example.com"]
    running.upstream.a["api.example.com."] = (5, ["198.18.0.7", "198.18.0.6"])
    running.upstream.a["x.cdn.example.com."] = (900, ["198.18.0.8"])
    answer = await ask(running, "api.example.com")
    assert answer.rcode() == dns.rcode.NOERROR and _addresses(answer) == ["198.18.0.6", "198.18.0.7"]
    assert answer.flags & dns.flags.RA
    assert (await ask(running, "x.cdn.example.com")).rcode() == dns.rcode.NOERROR
    assert running.guest.admitted == [(["198.18.0.6", "198.18.0.7"], 60), (["198.18.0.8"], 900)]


async def test_cname_targets_addresses_are_admitted_with_the_chains_least_ttl(running: Running) -> None:
    running.guest.allowed = ["www.example.com"]
    running.upstream.cname["www.example.com."] = (120, "edge.cdn.test.")
    running.upstream.cname["edge.cdn.test."] = (3600, "node7.cdn.test.")
    running.upstream.a["node7.cdn.test."] = (600, ["198.18.0.9"])
    running.upstream.extra.add("www.example.com.")
    answer = await ask(running, "www.example.com")
    assert _addresses(answer) == ["198.18.0.9", "198.18.9.9"]  # the upstream's answer, as it came
    assert running.guest.admitted == [(["198.18.0.9"], 120)]  # not other.test's 198.18.9.9: not on the chain


async def test_a_change_of_the_names_address_is_followed_on_the_next_query(running: Running) -> None:
    running.guest.allowed = ["api.example.com"]
    running.upstream.a["api.example.com."] = (60, ["198.18.0.10"])
    assert _addresses(await ask(running, "api.example.com")) == ["198.18.0.10"]
    running.upstream.a["api.example.com."] = (60, ["198.18.0.11"])
    assert _addresses(await ask(running, "api.example.com")) == ["198.18.0.11"]
    assert running.guest.admitted == [(["198.18.0.10"], 60), (["198.18.0.11"], 60)]


async def test_the_addresses_are_admitted_before_the_answer_leaves(running: Running) -> None:
    """allow_addresses runs while the guest's socket holds no reply yet: on loopback a reply
    sent is in the receiver's buffer at once, so a peek inside the call would see it."""
    running.guest.allowed = ["api.example.com"]
    running.upstream.a["api.example.com."] = (300, ["198.18.0.12"])
    seen: list[bool] = []
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.setblocking(False)
    client.bind((GUEST, 0))

    def peek() -> None:
        try:
            client.recv(1, socket.MSG_PEEK)
            seen.append(True)
        except BlockingIOError:
            seen.append(False)

    running.guest.on_admit.append(peek)
    try:
        query = dns.message.make_query("api.example.com", "A")
        client.sendto(query.to_wire(), ("127.0.0.1", running.port))
        reply = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(client, 4096), 3)
    finally:
        client.close()
    assert _addresses(dns.message.from_wire(reply)) == ["198.18.0.12"]
    assert seen == [False]


async def test_an_answer_whose_addresses_could_not_be_admitted_is_servfail(running: Running) -> None:
    running.guest.allowed = ["api.example.com"]
    running.upstream.a["api.example.com."] = (300, ["198.18.0.20"])

    def fail() -> None:
        raise OSError("nft: no such set")

    running.guest.on_admit.append(fail)
    answer = await ask(running, "api.example.com")
    assert answer.rcode() == dns.rcode.SERVFAIL and not answer.answer
    running.guest.on_admit.clear()
    assert _addresses(await ask(running, "api.example.com")) == ["198.18.0.20"]


async def test_allow_all_forwards_and_admits_nothing(running: Running) -> None:
    running.guest.egress = NetworkEgress.ALLOW_ALL
    running.upstream.a["anything.test."] = (300, ["198.18.0.13"])
    assert _addresses(await ask(running, "anything.test")) == ["198.18.0.13"]
    assert (await ask(running, "missing.test")).rcode() == dns.rcode.NXDOMAIN
    assert running.guest.admitted == []


async def test_aaaa_of_an_allowed_name_is_empty_and_other_types_are_forwarded(running: Running) -> None:
    running.guest.allowed = ["api.example.com"]
    running.upstream.a["api.example.com."] = (300, ["198.18.0.14"])
    aaaa = await ask(running, "api.example.com", "AAAA")
    assert aaaa.rcode() == dns.rcode.NOERROR and not aaaa.answer
    txt = await ask(running, "api.example.com", "TXT")
    assert txt.rcode() == dns.rcode.NOERROR and txt.answer[0].rdtype == dns.rdatatype.TXT
    assert (await ask(running, "www.example.com", "AAAA")).rcode() == dns.rcode.REFUSED
    assert running.upstream.asked == [("udp", "api.example.com.", "TXT")]
    assert running.guest.admitted == []


# -- sources, upstreams, transports ------------------------------------------------------


async def test_a_source_that_is_no_guest_gets_no_answer_at_all(running: Running) -> None:
    running.guest.egress = NetworkEgress.ALLOW_ALL
    running.upstream.a["api.example.com."] = (300, ["198.18.0.15"])
    query = dns.message.make_query("api.example.com", "A")
    with pytest.raises(dns.exception.Timeout):
        await dns.asyncquery.udp(query, "127.0.0.1", timeout=0.5, port=running.port, source=STRANGER)
    with pytest.raises((EOFError, ConnectionError)):
        await dns.asyncquery.tcp(query, "127.0.0.1", timeout=2, port=running.port, source=STRANGER)
    assert running.guest.lookups == [STRANGER, STRANGER]
    assert running.upstream.asked == []
    assert _addresses(await ask(running, "api.example.com")) == ["198.18.0.15"]


async def test_an_upstream_timeout_is_servfail_and_the_next_upstream_is_asked(upstream: Upstream) -> None:
    silent = Upstream(silent=True)
    loop = asyncio.get_running_loop()
    udp, _ = await loop.create_datagram_endpoint(lambda: _UpstreamUdp(silent), local_addr=("127.0.0.1", 0))
    silent_port = udp.get_extra_info("sockname")[1]
    guest = Guest(egress=NetworkEgress.ALLOW_ALL)
    upstream.a["api.example.com."] = (300, ["198.18.0.16"])
    only_silent = await _start([("127.0.0.1", silent_port)], guest, silent)
    both = await _start([("127.0.0.1", silent_port), ("127.0.0.1", upstream.port)], guest, upstream)
    try:
        started = loop.time()
        failed = await ask(only_silent, "api.example.com")
        assert failed.rcode() == dns.rcode.SERVFAIL
        assert EXPIRED <= loop.time() - started < EXPIRED + 1.5
        assert _addresses(await ask(both, "api.example.com")) == ["198.18.0.16"]
        assert len(silent.asked) == 2
    finally:
        await only_silent.resolver.close()
        await both.resolver.close()
        udp.close()


async def test_tcp_works_and_a_truncated_upstream_answer_is_asked_again_over_tcp(running: Running) -> None:
    running.guest.allowed = ["*.example.com"]
    running.upstream.a["api.example.com."] = (300, ["198.18.0.17"])
    running.upstream.big.add("many.example.com.")
    assert _addresses(await ask(running, "api.example.com", tcp=True)) == ["198.18.0.17"]
    refused = await ask(running, "www.other.test", tcp=True)
    assert refused.rcode() == dns.rcode.REFUSED and _blocked(refused)
    many = await ask(running, "many.example.com", tcp=True)
    assert len(_addresses(many)) == 60 and not many.flags & dns.flags.TC
    assert [t for t, name, _ in running.upstream.asked if name == "many.example.com."] == ["udp", "tcp"]
    assert len(running.guest.admitted[-1][0]) == 60
    # Over UDP, without EDNS (512 bytes), the guest gets TC and asks again over TCP.
    truncated = await ask(running, "many.example.com", edns=False)
    assert truncated.flags & dns.flags.TC


async def test_several_queries_on_one_tcp_connection_and_an_idle_one_is_closed(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(r, "TCP_IDLE_S", 0.3)
    running.guest.egress = NetworkEgress.ALLOW_ALL
    running.upstream.a["a.test."] = (300, ["198.18.0.18"])
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    try:
        for _ in range(3):
            wire = dns.message.make_query("a.test", "A").to_wire()
            writer.write(struct.pack("!H", len(wire)) + wire)
            (length,) = struct.unpack("!H", await asyncio.wait_for(reader.readexactly(2), 3))
            assert _addresses(dns.message.from_wire(await reader.readexactly(length))) == ["198.18.0.18"]
        writer.write(b"\x00")  # half a length, then silence
        assert await asyncio.wait_for(reader.read(), 3) == b""  # closed by the resolver
    finally:
        writer.close()


# -- hostile bytes and bounds ------------------------------------------------------------


def _header(qid: int, flags: int, qd: int = 1, an: int = 0) -> bytes:
    return struct.pack("!HHHHHH", qid, flags, qd, an, 0, 0)


async def test_malformed_packets_get_formerr_or_nothing_and_the_resolver_carries_on(running: Running) -> None:
    running.guest.egress = NetworkEgress.ALLOW_ALL
    running.upstream.a["a.test."] = (300, ["198.18.0.19"])
    two = dns.message.make_query("a.test", "A")
    two.question.append(dns.rrset.RRset(dns.name.from_text("b.test"), dns.rdataclass.IN, dns.rdatatype.A))
    chaos = dns.message.make_query("version.bind", "TXT", "CH")
    notify = dns.message.make_query("a.test", "SOA")
    notify.set_opcode(dns.opcode.NOTIFY)
    cases: list[tuple[bytes, int | None]] = [
        (b"", None),
        (b"\x12", None),
        (b"\xff" * 11, None),  # shorter than a header
        (_header(7, 0x0100) + b"\x05abc", dns.rcode.FORMERR),  # a name cut short
        (_header(7, 0x0100) + b"\xc0\x0c\x00\x01\x00\x01", dns.rcode.FORMERR),  # a pointer to itself
        (_header(7, 0x0100) + b"\x07a.test\x00\x00\x01\x00\x01junk", dns.rcode.FORMERR),
        (_header(7, 0x8100) + b"\x01a\x04test\x00\x00\x01\x00\x01", None),  # a response: never answered
        (_header(7, 0x0100, qd=0), dns.rcode.FORMERR),
        (_header(7, 0x0100, qd=65535) + b"\x00" * 400, dns.rcode.FORMERR),
        (two.to_wire(), dns.rcode.FORMERR),
        (chaos.to_wire(), dns.rcode.REFUSED),
        (dns.message.make_query("a.test", "ANY").to_wire(), dns.rcode.REFUSED),
        (dns.message.make_query("a.test", "AXFR").to_wire(), dns.rcode.REFUSED),
        (notify.to_wire(), dns.rcode.NOTIMP),
        (bytes(range(256)) * 200, dns.rcode.FORMERR),  # 51,200 bytes of everything, headed as a query
        (b"\x00\x01\x80" + bytes(range(256)) * 20, None),  # garbage headed as a response: no reflection
    ]
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.setblocking(False)
    client.bind((GUEST, 0))
    loop = asyncio.get_running_loop()
    try:
        for data, expected in cases:
            client.sendto(data, ("127.0.0.1", running.port))
            if expected is None:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(loop.sock_recv(client, 65535), 0.3)
                continue
            reply = await asyncio.wait_for(loop.sock_recv(client, 65535), 3)
            assert reply[:2] == data[:2] and reply[2] & 0x80, data[:40]
            assert reply[3] & 0x0F == expected, (data[:40], reply[3] & 0x0F)
    finally:
        client.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    writer.write(b"\x00\x05hello")  # a length under a header: the connection ends
    assert await asyncio.wait_for(reader.read(), 3) == b""
    writer.close()
    assert running.upstream.asked == []
    assert _addresses(await ask(running, "a.test")) == ["198.18.0.19"]
    assert _addresses(await ask(running, "a.test", tcp=True)) == ["198.18.0.19"]


async def test_at_most_max_in_flight_queries_are_held_the_rest_dropped(upstream: Upstream) -> None:
    """A silent upstream holds every query for the resolver's timeout (1.5 s here: all are sent
    well within it, even on a loaded machine); only the first MAX_IN_FLIGHT get an answer."""
    upstream.silent = True
    resolver = r.GuestResolver(Guest(egress=NetworkEgress.ALLOW_ALL).lookup, [("127.0.0.1", upstream.port)], 1.5)
    port = await resolver.start("127.0.0.1", 0)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.setblocking(False)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    client.bind((GUEST, 0))
    loop = asyncio.get_running_loop()
    sent = r.MAX_IN_FLIGHT + 40
    replies: set[int] = set()
    try:
        started = loop.time()
        for qid in range(sent):
            client.sendto(_header(qid, 0x0100) + b"\x01a\x04test\x00\x00\x01\x00\x01", ("127.0.0.1", port))
            if qid % 32 == 31:
                # Let the resolver read them: the kernel holds only ~256 small datagrams per socket.
                await asyncio.sleep(0.005)
        assert loop.time() - started < 1.0, "too slow to fill the resolver within its timeout"
        while True:
            try:
                reply = await asyncio.wait_for(loop.sock_recv(client, 4096), 0.5 if replies else 5)
            except TimeoutError:
                break
            assert reply[3] & 0x0F == dns.rcode.SERVFAIL
            replies.add(struct.unpack("!H", reply[:2])[0])
    finally:
        client.close()
        await resolver.close()
    assert replies == set(range(r.MAX_IN_FLIGHT))
    assert len(upstream.asked) == r.MAX_IN_FLIGHT


def test_host_upstreams_reads_resolv_conf(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "resolv.conf"  # type: ignore[operator]
    path.write_text(
        "# comment\nsearch example.com\nnameserver 10.0.0.2\nnameserver bogus\nnameserver ::1\n"
        "nameserver 10.0.0.3\nnameserver 10.0.0.4\n"
    )
    assert r.host_upstreams(str(path)) == [("10.0.0.2", 53), ("::1", 53), ("10.0.0.3", 53)]
    path.write_text("options ndots:2\n")
    assert r.host_upstreams(str(path)) == [("127.0.0.1", 53)]
    assert r.host_upstreams(str(path) + ".missing") == [("127.0.0.1", 53)]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.0.0.2", ("10.0.0.2", 53)),
        ("10.0.0.2:5353", ("10.0.0.2", 5353)),
        ("[::1]:54", ("::1", 54)),
        ("::1", ("::1", 53)),
    ],
)
def test_parse_upstream(text: str, parsed: tuple[str, int]) -> None:
    assert r.parse_upstream(text) == parsed


@pytest.mark.parametrize("text", ["", "dns.google", "10.0.0.2:0", "10.0.0.2:70000", "[::1]x", "10.0.0.2:x"])
def test_parse_upstream_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        r.parse_upstream(text)
