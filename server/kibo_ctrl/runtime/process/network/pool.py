"""The guest address pool of one runtime, claimed among every kibo runtime of the host.

Each runtime's guests get /31s from one IPv4 block: `--guest-network CIDR`, or by default the
first free /20 of 10.200.0.0/14 that overlaps no route of the host and no other runtime's
claim. Claims are files `/run/kibo/net/<tag>.json` ({"network", "data_dir", "pid"}) written
under `flock(/run/kibo/net/.lock)`, so servers started in parallel (the tests run many) never
take the same block. A claim whose data directory no longer exists is stale and reaped.

The same directory records that kibo turned `net.ipv4.ip_forward` on (`forward.<tag>`: one
file per runtime that needs it); the last runtime to release turns it back off."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path

from pyroute2 import IPRoute

from .slots import off_loop

CLAIMS_DIR = Path(os.environ.get("KIBO_NET_CLAIMS_DIR") or "/run/kibo/net")
DEFAULT_SPACE = ipaddress.IPv4Network("10.200.0.0/14")
DEFAULT_PREFIX = 20
FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


class PoolExhausted(RuntimeError):
    """No block free for this runtime's guests."""


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CLAIMS_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(CLAIMS_DIR / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _claims(own: str) -> list[ipaddress.IPv4Network]:
    """Live claims of other runtimes (stale ones removed)."""
    taken = []
    for path in CLAIMS_DIR.glob("*.json"):
        if path.stem == own:
            continue
        try:
            claim = json.loads(path.read_text())
            network = ipaddress.IPv4Network(claim["network"])
        except (OSError, ValueError, KeyError, TypeError):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if not Path(str(claim.get("data_dir", ""))).is_dir():
            with contextlib.suppress(OSError):
                path.unlink()  # its runtime's data directory is gone: nobody holds it
            continue
        taken.append(network)
    return taken


def _routes(exclude_prefix: str) -> list[ipaddress.IPv4Network]:
    """The host's IPv4 routes (but the default route and our own guests' veths)."""
    found = []
    with IPRoute() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") or "" for link in ipr.get_links()}
        for route in ipr.get_routes(family=2):
            dst, length = route.get_attr("RTA_DST"), route["dst_len"]
            if dst is None or length == 0:
                continue
            if names.get(route.get_attr("RTA_OIF"), "").startswith(exclude_prefix):
                continue
            with contextlib.suppress(ValueError):
                found.append(ipaddress.IPv4Network(f"{dst}/{length}", strict=False))
    return found


def claim(tag: str, data_dir: Path, wanted: str | None, veth_prefix: str) -> ipaddress.IPv4Network:
    """This runtime's block (its claim renewed if it holds one already: a restart)."""
    with _locked():
        path = CLAIMS_DIR / f"{tag}.json"
        others = _claims(tag)
        routes = off_loop(lambda: _routes(veth_prefix))
        if wanted:
            network = ipaddress.IPv4Network(wanted, strict=True)
            if network.prefixlen > 30:
                raise ValueError(f"--guest-network {wanted}: too small (at most /30)")
            for other in others:
                if network.overlaps(other):
                    raise ValueError(f"--guest-network {wanted} overlaps another kibo runtime's {other}")
        else:
            network = _first_free(others, routes, path)
        path.write_text(json.dumps({"network": str(network), "data_dir": str(data_dir), "pid": os.getpid()}))
        return network


def _first_free(
    others: list[ipaddress.IPv4Network], routes: list[ipaddress.IPv4Network], own: Path
) -> ipaddress.IPv4Network:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        held = ipaddress.IPv4Network(json.loads(own.read_text())["network"])
        if not any(held.overlaps(o) for o in others):
            return held  # kept across a restart: live guests have addresses in it
    for candidate in DEFAULT_SPACE.subnets(new_prefix=DEFAULT_PREFIX):
        if any(candidate.overlaps(o) for o in others) or any(candidate.overlaps(r) for r in routes):
            continue
        return candidate
    raise PoolExhausted(f"no /{DEFAULT_PREFIX} of {DEFAULT_SPACE} is free: set --guest-network")


def release(tag: str) -> None:
    """Give the block up (no guest of this runtime holds an address any more)."""
    with _locked(), contextlib.suppress(FileNotFoundError):
        (CLAIMS_DIR / f"{tag}.json").unlink()


def forward_on(tag: str) -> None:
    """IPv4 forwarding on for this runtime's guests; if kibo turned it on, say who needs it."""
    with _locked():
        if FORWARD.read_text().strip() == "1" and not any(CLAIMS_DIR.glob("forward.*")):
            return  # on already, by the host's own configuration: not ours to turn off
        (CLAIMS_DIR / f"forward.{tag}").write_text(str(os.getpid()))
        FORWARD.write_text("1")


def forward_off(tag: str) -> None:
    """This runtime no longer needs forwarding: the last one that kibo turned on turns it off."""
    with _locked():
        mine = CLAIMS_DIR / f"forward.{tag}"
        if not mine.exists():
            return
        mine.unlink()
        if not any(CLAIMS_DIR.glob("forward.*")):
            FORWARD.write_text("0")


def forward_by_kibo() -> bool:
    """Whether kibo turned IPv4 forwarding on (the forward chains then drop what no guest is in)."""
    return any(CLAIMS_DIR.glob("forward.*"))
