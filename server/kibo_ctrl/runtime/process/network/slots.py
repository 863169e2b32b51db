"""A guest's network slot: a named network namespace and the veth pair into it.

Slot n of a runtime (tag h): netns `kibo-<h>-<n>` (/run/netns, owned by the host's user
namespace: the guest, in a user namespace of its own without capabilities here, changes
neither its addresses nor its routes), host side veth `kb<h6><n>` with the gateway address
(pool base + 2n, /31), guest side `eth0` with pool base + 2n + 1, a default route via the
gateway, `lo` up and IPv6 switched off inside. Made ahead (__init__.py keeps a few ready)
because a create should not pay the ~20 ms; found again from /run/netns after a restart.

pyroute2 (netlink) for all of it; the sysctls of the namespace are written by a short
thread that setns()s into it (setns moves only the calling thread)."""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute, NetNS, netns

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
GUEST_IFNAME = "eth0"

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Slot:
    index: int
    netns: str  # the name under /run/netns
    veth: str  # the host side
    gateway: ipaddress.IPv4Address
    address: ipaddress.IPv4Address  # the guest's

    @property
    def path(self) -> str:
        return str(NETNS_DIR / self.netns)

    @property
    def chain(self) -> str:
        return f"g{self.index}"


def netns_prefix(tag: str) -> str:
    return f"kibo-{tag}-"


def veth_prefix(tag: str) -> str:
    return f"kb{tag[:6]}"


def slot(tag: str, pool: ipaddress.IPv4Network, index: int) -> Slot:
    gateway = pool.network_address + 2 * index
    if gateway + 1 > pool.broadcast_address:
        raise ValueError(f"the guest pool {pool} is full ({index} guests)")
    return Slot(index, f"{netns_prefix(tag)}{index}", f"{veth_prefix(tag)}{index}", gateway, gateway + 1)


def capacity(pool: ipaddress.IPv4Network) -> int:
    return pool.num_addresses // 2


def existing(tag: str) -> list[int]:
    """Indices of this runtime's slots on the machine (their namespaces)."""
    found = []
    prefix = netns_prefix(tag)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(NETNS_DIR):
            if name.startswith(prefix) and name[len(prefix) :].isdigit():
                found.append(int(name[len(prefix) :]))
    return sorted(found)


def _in_netns(name: str, work: list[tuple[str, str]]) -> None:
    """Write sysctls (path, value) inside the namespace, from a thread of its own."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(NETNS_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({name})")
            finally:
                os.close(fd)
            for path, value in work:
                with open(path, "w") as f:
                    f.write(value)
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=run, name="kibo-netns")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def make(s: Slot) -> None:
    """Create the slot (a leftover of the same name is removed first)."""
    remove(s)
    netns.create(s.netns)
    try:
        _in_netns(
            s.netns,
            [
                ("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1"),
                ("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"),
            ],
        )
        with IPRoute() as ipr:
            ipr.link("add", ifname=s.veth, kind="veth", peer={"ifname": GUEST_IFNAME, "net_ns_fd": s.netns})
            host = ipr.link_lookup(ifname=s.veth)[0]
            ipr.addr("add", index=host, address=str(s.gateway), prefixlen=31)
            ipr.link("set", index=host, state="up")
        with NetNS(s.netns) as ns:
            guest = ns.link_lookup(ifname=GUEST_IFNAME)[0]
            loopback = ns.link_lookup(ifname="lo")[0]
            ns.addr("add", index=guest, address=str(s.address), prefixlen=31)
            ns.link("set", index=guest, state="up")
            ns.link("set", index=loopback, state="up")
            ns.route("add", dst="0.0.0.0/0", gateway=str(s.gateway))
    except BaseException:
        remove(s)
        raise


def remove(s: Slot) -> None:
    """The slot's veth and namespace go (idempotent). The veth pair dies with the namespace,
    but only once nothing holds it: deleted first, so the name is free at once."""
    with IPRoute() as ipr:
        for index in ipr.link_lookup(ifname=s.veth):
            with contextlib.suppress(Exception):
                ipr.link("del", index=index)
    if (NETNS_DIR / s.netns).exists():
        with contextlib.suppress(FileNotFoundError):
            netns.remove(s.netns)


def present(s: Slot) -> bool:
    """Whether the slot's namespace or its veth is on the machine (cleanup status)."""
    if (NETNS_DIR / s.netns).exists():
        return True
    return Path("/sys/class/net", s.veth).exists()
