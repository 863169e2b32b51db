"""The guests' DNS resolver: where a network policy's domain rules are enforced.

Every guest's /etc/resolv.conf names its gateway, and the host redirects the guests' udp/tcp
53 to this resolver's port. It knows a guest by the source address of its query (the guest
cannot change it: its netns belongs to the host's user namespace and nftables drops spoofed
sources), and answers per that guest's policy:

- DENY_ALL: REFUSED. A denied name: REFUSED (deny beats allow, under every egress).
- ALLOW_LISTED and a name no allowed rule matches: REFUSED.
- otherwise the query goes to the upstream resolvers (UDP, TCP when truncated, the next one on
  a timeout); for a name allowed by a rule under ALLOW_LISTED, every A record the answer
  leads to (through CNAMEs) is handed to `allow_addresses` BEFORE the answer is sent, so the
  guest's connect that follows is admitted by the guest's nftables set. Each query refreshes
  the allowance, so the set follows a name as its addresses change.

Why DNS and not an SNI proxy: it covers every protocol and needs no TLS parsing. Its limits are
SECURITY.md's (names sharing an address share the allowance; under ALLOW_ALL a guest that
asks another resolver, or uses an address, is not stopped by denied names).

A source no guest has gets no answer at all: the port may be reachable from elsewhere, and an
answer would make it an open resolver (and a reflector). Refusals carry an Extended DNS Error
"Blocked" (RFC 8914) saying why, when the query had EDNS. Guests are IPv4 only, so AAAA of a
name the guest may ask for is answered empty. Bounded: MAX_IN_FLIGHT queries at once (more
are dropped, as a loaded resolver does), TCP connections limited in number, time and queries.
Query names are logged at debug level only: they say what a tenant's code reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

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

from ....domain.domains import DomainRules
from ....domain.model import NetworkEgress

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256
MAX_TCP_CONNECTIONS = 64
TCP_IDLE_S = 5.0  # between two queries of one connection (RFC 7766 suggests a few seconds)
TCP_LIFETIME_S = 30.0
TCP_QUERIES = 64  # per connection
MIN_ALLOWANCE_S = 60  # an answer's TTL under this still admits its addresses for a minute
MAX_CNAME_CHAIN = 16
UPSTREAM_PAYLOAD = 1232  # the EDNS payload asked of upstreams (no fragmentation: DNS flag day 2020)
HEADER = 12
_LABEL_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_")


@dataclass(frozen=True)
class GuestDns:
    """One guest's policy, as its resolver needs it. `allow_addresses(addresses, ttl_s)` admits
    IPv4 addresses for `ttl_s` seconds (the guest's dynamic nftables set); it is called on the
    resolver's event loop, so it must be quick, and an exception from it is a SERVFAIL (the
    answer is not sent when its addresses could not be admitted)."""

    egress: NetworkEgress
    rules: DomainRules
    allow_addresses: Callable[[list[str], int], None]


class GuestResolver:
    """The resolver of one node's guests: UDP and TCP on one port. `guests(source_ip)` answers
    the policy of the guest with that address, or None (no answer at all)."""

    def __init__(
        self,
        guests: Callable[[str], GuestDns | None],
        upstreams: list[tuple[str, int]],
        timeout_s: float = 3.0,
    ) -> None:
        self._guests = guests
        self._upstreams = list(upstreams)
        self._timeout_s = timeout_s
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._connections = 0

    async def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Listens on `host`:`port` (0: a free port, the same one for UDP and TCP); returns it."""
        loop = asyncio.get_running_loop()
        for _attempt in range(20 if port == 0 else 1):
            udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(host, port), family=socket.AF_INET
            )
            chosen = int(udp.get_extra_info("sockname")[1])
            try:
                tcp = await asyncio.start_server(
                    self._connection, host, chosen, family=socket.AF_INET, reuse_address=True, backlog=64
                )
            except OSError as error:
                udp.close()
                if port == 0 and error.errno == errno.EADDRINUSE:
                    continue  # the UDP port's TCP twin is taken: another free port
                raise
            self._udp, self._tcp = udp, tcp
            return chosen
        raise OSError(errno.EADDRINUSE, "no port free for both UDP and TCP")

    async def close(self) -> None:
        """Stops listening and ends every query and connection in flight."""
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._tcp is not None:
            await self._tcp.wait_closed()
        self._udp = self._tcp = None

    def _policy(self, source: str) -> GuestDns | None:
        """The policy of the guest at `source`; None: no guest has it, and nothing is answered
        (checked when a datagram or connection arrives, and again for each query)."""
        return self._guests(source)

    # -- the two transports ---------------------------------------------------------------

    def _datagram(self, data: bytes, source: tuple[str, int]) -> None:
        if self._in_flight >= MAX_IN_FLIGHT:
            return  # overloaded: dropped; the guest's stub resolver asks again
        if self._policy(source[0]) is None:
            return
        self._spawn(self._answer_datagram(data, source))

    async def _answer_datagram(self, data: bytes, source: tuple[str, int]) -> None:
        reply = await self._answer(data, source[0], tcp=False)
        if reply is not None and self._udp is not None:
            self._udp.sendto(reply, source)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._connections += 1
        try:
            peer = writer.get_extra_info("peername")
            if self._connections > MAX_TCP_CONNECTIONS or not peer or self._policy(str(peer[0])) is None:
                return
            async with asyncio.timeout(TCP_LIFETIME_S):
                await self._queries(reader, writer, str(peer[0]))
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections -= 1
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _queries(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, source: str) -> None:
        for _ in range(TCP_QUERIES):
            async with asyncio.timeout(TCP_IDLE_S):
                (length,) = struct.unpack("!H", await reader.readexactly(2))
                if length < HEADER:
                    return
                data = await reader.readexactly(length)
            if self._in_flight >= MAX_IN_FLIGHT:
                return
            self._in_flight += 1
            try:
                reply = await self._answer(data, source, tcp=True)
            finally:
                self._in_flight -= 1
            if reply is None:
                return
            writer.write(struct.pack("!H", len(reply)) + reply)
            await writer.drain()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        # Counted from the moment it is taken, so a burst cannot outrun the bound.
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight -= 1
        self._tasks.discard(task)

    # -- one query ------------------------------------------------------------------------

    async def _answer(self, data: bytes, source: str, *, tcp: bool) -> bytes | None:
        """The reply's wire form, or None to send nothing. The guest's policy is looked up for
        each query (a TCP connection outlives a policy change)."""
        guest = self._policy(source)
        if guest is None:
            return None
        try:
            query = dns.message.from_wire(data)
        except Exception:  # hostile bytes: any parse error is the sender's
            return _formerr(data)
        if query.flags & dns.flags.QR:
            return None  # a response is never answered (no loops between resolvers)
        try:
            response = await self._respond(query, guest)
        except Exception as error:
            # The error's text may hold the name or its addresses: only at debug level.
            log.warning("guest resolver: a query failed (%s): SERVFAIL", type(error).__name__)
            log.debug("guest resolver: the failure", exc_info=True)
            response = _reply(query, dns.rcode.SERVFAIL)
        limit = 65535 if tcp else _udp_limit(query)
        try:
            return response.to_wire(max_size=limit, prefer_truncation=True)
        except dns.exception.DNSException:
            return _reply(query, dns.rcode.SERVFAIL).to_wire()

    async def _respond(self, query: dns.message.Message, guest: GuestDns) -> dns.message.Message:
        if query.opcode() != dns.opcode.QUERY:
            return _reply(query, dns.rcode.NOTIMP)
        if len(query.question) != 1 or query.answer or query.authority:
            return _reply(query, dns.rcode.FORMERR)
        question = query.question[0]
        if question.rdclass != dns.rdataclass.IN or dns.rdatatype.is_metatype(question.rdtype):
            return _reply(query, dns.rcode.REFUSED)  # no CHAOS, ANY, AXFR, IXFR through a guest's resolver
        name = _rule_name(question.name)
        shown = question.name.to_text(omit_final_dot=True)
        if guest.egress is NetworkEgress.DENY_ALL:
            return _refused(query, "kibo: the workspace's network policy allows no network")
        decision = guest.rules.decide(name)
        if decision == "deny":
            return _refused(query, f"kibo: {shown} is denied by the workspace's network policy")
        listed = guest.egress is NetworkEgress.ALLOW_LISTED
        if listed and decision != "allow":
            return _refused(query, f"kibo: {shown} is not in the workspace's network policy")
        log.debug("guest resolver: %s %s", shown, dns.rdatatype.to_text(question.rdtype))
        if question.rdtype == dns.rdatatype.AAAA:
            return _reply(query, dns.rcode.NOERROR)  # guests are IPv4 only
        upstream = await self._forward(question.name, question.rdtype)
        if upstream is None:
            return _reply(query, dns.rcode.SERVFAIL)
        if listed:
            addresses, ttl = _addresses(upstream, question.name)
            if addresses:
                guest.allow_addresses(addresses, max(ttl, MIN_ALLOWANCE_S))
        response = _reply(query, upstream.rcode())
        response.answer = upstream.answer
        response.authority = upstream.authority
        response.additional = upstream.additional
        return response

    async def _forward(self, name: dns.name.Name, rdtype: dns.rdatatype.RdataType) -> dns.message.Message | None:
        """The first upstream's answer (TCP when UDP's was truncated), the next upstream's when one
        fails or times out; None when none answered. A fresh query, not the guest's bytes: the
        guest's EDNS options, cookies or flags never reach the upstream."""
        for host, port in self._upstreams:
            query = dns.message.make_query(name, rdtype, use_edns=0, payload=UPSTREAM_PAYLOAD)
            try:
                answer = await dns.asyncquery.udp(
                    query, host, timeout=self._timeout_s, port=port, ignore_unexpected=True, ignore_errors=True
                )
                if answer.flags & dns.flags.TC:
                    answer = await dns.asyncquery.tcp(query, host, timeout=self._timeout_s, port=port)
            except (dns.exception.DNSException, OSError, EOFError, ValueError):
                continue  # a timeout, a refused connection, a malformed answer: the next upstream
            return answer
        return None


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, resolver: GuestResolver) -> None:
        self._resolver = resolver

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._resolver._datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        pass  # an ICMP error for an earlier reply: nothing to do


def _rule_name(name: dns.name.Name) -> str:
    """`name` as the dotted lowercase text DomainRules decides on. A label with a byte other than
    a letter, digit, '-' or '_' (a '.' inside a label, a space, ...) becomes "\\x00", a label no
    rule has: its dots stay exactly the name's label boundaries, so no escaping can fake a
    suffix, and the name is still under its real parent (a denied `*.evil.com` holds
    `a\\.b.evil.com`)."""
    labels = []
    for label in name.labels:
        if not label:
            continue  # the root
        lower = label.lower()
        labels.append(lower.decode("ascii") if all(byte in _LABEL_BYTES for byte in lower) else "\x00")
    return ".".join(labels)


def _addresses(answer: dns.message.Message, qname: dns.name.Name) -> tuple[list[str], int]:
    """The A records the answer gives `qname`, following its CNAME chain, and the least TTL on
    the way. Records of other owners (an upstream's extra data) are not taken."""
    chain = {qname}
    ttl: int | None = None
    current = qname
    for _ in range(MAX_CNAME_CHAIN):
        cname = _find(answer, current, dns.rdatatype.CNAME)
        if cname is None:
            break
        ttl = cname.ttl if ttl is None else min(ttl, cname.ttl)
        current = cname[0].target
        if current in chain:
            break  # a loop
        chain.add(current)
    addresses: list[str] = []
    for owner in chain:
        found = _find(answer, owner, dns.rdatatype.A)
        if found is not None:
            ttl = found.ttl if ttl is None else min(ttl, found.ttl)
            addresses.extend(rdata.address for rdata in found)
    return sorted(set(addresses)), ttl or 0


def _find(answer: dns.message.Message, owner: dns.name.Name, rdtype: dns.rdatatype.RdataType) -> dns.rrset.RRset | None:
    for rrset in answer.answer:
        if rrset.rdtype == rdtype and rrset.rdclass == dns.rdataclass.IN and rrset.name == owner:
            return rrset
    return None


def _reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> dns.message.Message:
    response = dns.message.make_response(query, recursion_available=True)
    response.set_rcode(rcode)
    return response


def _refused(query: dns.message.Message, why: str) -> dns.message.Message:
    response = _reply(query, dns.rcode.REFUSED)
    if query.edns >= 0:
        response.use_edns(
            0,
            payload=UPSTREAM_PAYLOAD,
            request_payload=query.payload,
            options=[dns.edns.EDEOption(dns.edns.EDECode.BLOCKED, why)],
        )
    return response


def _udp_limit(query: dns.message.Message) -> int:
    # A guest without EDNS takes 512 bytes; with it, what it said it takes (at least 512).
    return max(512, min(query.payload, 4096)) if query.edns >= 0 else 512


def _formerr(data: bytes) -> bytes | None:
    """A FORMERR for bytes that are no DNS message, when they at least have a header that is a
    query (else nothing: a reply to garbage is a reflection)."""
    if len(data) < HEADER or data[2] & 0x80:
        return None
    opcode = data[2] & 0x78
    flags = 0x80 | opcode | (data[2] & 0x01)  # QR, the opcode and RD copied
    return data[:2] + bytes([flags, dns.rcode.FORMERR]) + bytes(8)


def host_upstreams(resolv_conf: str = "/etc/resolv.conf") -> list[tuple[str, int]]:
    """The host's nameservers (at most 3, as the C library takes them), port 53; the local
    one (127.0.0.1) when the file names none or cannot be read, as resolv.conf(5) has it.
    The resolver runs in the host's network namespace, so a loopback nameserver (e.g.
    systemd-resolved's 127.0.0.53) is reachable from it."""
    found: list[tuple[str, int]] = []
    try:
        with open(resolv_conf, encoding="utf-8", errors="replace") as file:
            text = file.read(1 << 16)
    except OSError:
        text = ""
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != "nameserver":
            continue
        try:
            address = ipaddress.ip_address(words[1])
        except ValueError:
            continue
        found.append((str(address), 53))
        if len(found) == 3:
            break
    return found or [("127.0.0.1", 53)]


def parse_upstream(text: str) -> tuple[str, int]:
    """`ADDR[:PORT]` (`[v6]:PORT` for IPv6) as (address, port): --guest-dns's form."""
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{text!r}: expected [ADDRESS]:PORT")
            port = _port(rest[1:], text)
    elif text.count(":") == 1:
        host, _, rest = text.partition(":")
        port = _port(rest, text)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{text!r}: a resolver is an IP address (ADDRESS[:PORT])") from None
    return str(address), port


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{whole!r}: the port is 1..65535")
    return int(text)
