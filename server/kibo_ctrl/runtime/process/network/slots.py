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

import asyncio
import concurrent.futures
import contextlib
import ctypes
import ipaddress
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pyroute2 import IPRoute

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 2
GUEST_IFNAME = "eth0"

_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


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


def off_loop(work: Callable[[], T]) -> T:
    """`work()`, in a thread of its own when this one runs an asyncio loop: pyroute2's
    blocking calls run a loop of their own, which cannot nest in a running one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return work()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kibo-netlink") as pool:
        return pool.submit(work).result()


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


def _in_thread(work: Callable[[], None]) -> None:
    """`work()` in a thread of its own (whose network namespace it may change), its error raised here."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=run, name="kibo-netns")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _share_netns_dir() -> None:
    """/run/netns a shared mount (as iproute2 makes it): a namespace bound there shows in
    every mount namespace copied from the host's, the supervisors' among them."""
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    directory = str(NETNS_DIR).encode()
    if _libc.mount(b"", directory, b"none", MS_SHARED | MS_REC, None) != 0:
        _check(_libc.mount(directory, directory, b"none", MS_BIND | MS_REC, None), "bind /run/netns")
        _check(_libc.mount(b"", directory, b"none", MS_SHARED | MS_REC, None), "share /run/netns")


def _create_netns(s: Slot) -> None:
    """A new network namespace bound at /run/netns/<name>, IPv6 off: made by a thread that
    unshares it (no fork: the control plane runs gRPC's threads, whose fork handlers a fork
    would run)."""
    _share_netns_dir()
    path = NETNS_DIR / s.netns
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))

    def unshare() -> None:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        _check(_libc.mount(b"/proc/thread-self/ns/net", str(path).encode(), b"none", MS_BIND, None), "bind netns")
        for name in ("all", "default"):
            with open(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", "w") as f:
                f.write("1")

    try:
        _in_thread(unshare)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _configure_guest_side(s: Slot) -> None:
    """In the namespace: eth0's address, lo and eth0 up, the default route via the gateway."""

    def configure() -> None:
        fd = os.open(NETNS_DIR / s.netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns({s.netns})")
        finally:
            os.close(fd)
        with IPRoute() as ns:
            guest = ns.link_lookup(ifname=GUEST_IFNAME)[0]
            loopback = ns.link_lookup(ifname="lo")[0]
            ns.addr("add", index=guest, address=str(s.address), prefixlen=31)
            ns.link("set", index=guest, state="up")
            ns.link("set", index=loopback, state="up")
            ns.route("add", dst="0.0.0.0/0", gateway=str(s.gateway))

    _in_thread(configure)


def make(s: Slot) -> None:
    """Create the slot (a leftover of the same name is removed first)."""
    off_loop(lambda: _make(s))


def _make(s: Slot) -> None:
    _remove(s)
    _create_netns(s)
    try:
        with IPRoute() as ipr:
            fd = os.open(NETNS_DIR / s.netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                ipr.link("add", ifname=s.veth, kind="veth", peer={"ifname": GUEST_IFNAME, "net_ns_fd": fd})
            finally:
                os.close(fd)
            host = ipr.link_lookup(ifname=s.veth)[0]
            ipr.addr("add", index=host, address=str(s.gateway), prefixlen=31)
            ipr.link("set", index=host, state="up")
        _configure_guest_side(s)
    except BaseException:
        _remove(s)
        raise


def remove(s: Slot) -> None:
    """The slot's veth and namespace go (idempotent). The veth pair dies with the namespace,
    but only once nothing holds it: deleted first, so the name is free at once."""
    off_loop(lambda: _remove(s))


def _remove(s: Slot) -> None:
    with IPRoute() as ipr:
        for index in ipr.link_lookup(ifname=s.veth):
            with contextlib.suppress(Exception):
                ipr.link("del", index=index)
    path = NETNS_DIR / s.netns
    if path.exists():
        _libc.umount2(str(path).encode(), MNT_DETACH)
        path.unlink(missing_ok=True)


def present(s: Slot) -> bool:
    """Whether the slot's namespace or its veth is on the machine (cleanup status)."""
    if (NETNS_DIR / s.netns).exists():
        return True
    return Path("/sys/class/net", s.veth).exists()
