"""Guest networking of the process runtime (runtime/process/network/), end to end: a real
`kibo-ctrl serve` with bubblewrap guests, each in its own network slot, reaching target hosts
that live in network namespaces of this test (198.18.0.0/15, the benchmark range) through
the host's NAT; probes run inside the guests (python3 of the host's /usr) by the data plane.

One server for the module and one workspace per policy; what no policy may open is tried
from each of them, each target and policy a test ID of its own (tests/mutations/guestnet.py
names them)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import SUCCEEDED, Client, S, meta
from tests.server import ServerProcess
from tests.system.guest_net_hosts import Host, Listener, Names, netns_names, socket_in, target_host
from tests.system.test_process_runtime import SMALL, DataPlane, reap, sandbox_server

pytestmark = pytest.mark.timeout(120)

ALLOW_ALL = wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_ALLOW_ALL)
DENY_ALL = wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_DENY_ALL)
# Allow-listed with every address listed: only what no policy opens stays closed.
LISTED_ALL = wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_cidrs=["0.0.0.0/0"])
POLICIES = {"allow_all": ALLOW_ALL, "deny_all": DENY_ALL, "listed_all": LISTED_ALL}

# A TCP connect from inside the guest: "open" (and the greeting read), "refused", "unreachable" or "timeout".
PROBE = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)
    s.settimeout(2)
    s.recv(16)
    print("open")
except ConnectionRefusedError:
    print("refused")
except socket.timeout:
    print("timeout")
except OSError as e:
    print("unreachable", e.errno)
"""


class Net:
    """The module's server, target hosts and host-side listeners."""

    def __init__(
        self, server: ServerProcess, web: Host, other: Host, metadata: Host, host_port: int, names: Names
    ) -> None:
        self.server, self.web, self.other, self.metadata, self.names = server, web, other, metadata, names
        self.host_port = host_port  # a listener of the host on 0.0.0.0 (PostgreSQL-like)
        self.web_a, self.web_b = web.listen(), web.listen()
        self.other_a = other.listen(self.web_a)
        self.metadata_port = metadata.listen(80)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def metadata_lock() -> Iterator[None]:
    """169.254.169.254 is one address on the host: one module (of parallel workers and
    mutation runs) at a time holds a host for it."""
    with open("/run/lock/kibo-test-metadata-host", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="module")
def net(server_factory: object) -> Iterator[Net]:
    # Names and 198.18/198.19 subnets of this process's own: workers and runs in parallel.
    n = os.getpid() % 250
    with (
        target_host(f"ktw{os.getpid()}", f"198.18.{n}.2", f"198.18.{n}.1") as web,
        target_host(f"kto{os.getpid()}", f"198.19.{n}.2", f"198.19.{n}.1") as other,
        metadata_lock(),
        target_host(f"ktm{os.getpid()}", "169.254.169.254", "169.254.169.253", 30) as metadata,
    ):
        # Greets like the targets' listeners: a probe that reached it would say "open".
        host_listener = Listener(socket_in(None, "0.0.0.0", 0))
        # The guests' resolver asks the test's own DNS server (domain rules).
        names = Names()
        try:
            flags = ("--guest-dns", f"127.0.0.1:{names.port}")
            with sandbox_server(server_factory, *flags) as server:  # type: ignore[arg-type]
                yield Net(server, web, other, metadata, host_listener.port, names)
        finally:
            host_listener.close()
            names.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def guests(net: Net) -> AsyncIterator[dict[str, tuple[wp.Workspace, str]]]:
    """A workspace per policy, and a data-plane credential for each."""
    async with Client.connect(net.server.address) as client:
        made = await asyncio.gather(*(client.create(resources=SMALL, network_policy=p) for p in POLICIES.values()))
        data = DataPlane(client)
        found = {}
        for name, workspace in zip(POLICIES, made, strict=True):
            assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
            found[name] = (workspace, await data.credential(workspace.workspace_id))
        yield found


async def probe(client: Client, credential: str, address: str, port: int) -> str:
    code, out, err = await DataPlane(client).exec(credential, "python3", "-c", PROBE, address, str(port))
    assert code == 0, err
    return out.decode().strip()


def netns_of(data_dir: Path, workspace_id: str) -> str:
    """The guest's network namespace name, from its instance's spec."""
    for spec in data_dir.glob("instances/*/spec.json"):
        loaded = json.loads(spec.read_text())
        if loaded["workspace_id"] == workspace_id and loaded.get("netns"):
            return str(loaded["netns"]).rsplit("/", 1)[-1]
    raise AssertionError(f"no network namespace for {workspace_id}")


def gateway_of(netns: str) -> str:
    out = subprocess.run(["ip", "-n", netns, "-4", "route", "show", "default"], capture_output=True, text=True)
    return out.stdout.split()[2]


def address_of(netns: str) -> str:
    """The guest's own address (its eth0)."""
    out = subprocess.run(["ip", "-n", netns, "-4", "-o", "addr", "show", "eth0"], capture_output=True, text=True)
    return out.stdout.split()[3].split("/")[0]


def primary_address() -> str:
    """The host's address on its default route's interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.200", 9))
        return str(s.getsockname()[0])


# -- what each policy opens ------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="module")
async def test_allow_all_reaches_the_target(net: Net, guests: dict[str, tuple[wp.Workspace, str]]) -> None:
    async with Client.connect(net.server.address) as client:
        assert await probe(client, guests["allow_all"][1], net.web.address, net.web_a) == "open"


@pytest.mark.asyncio(loop_scope="module")
async def test_deny_all_blocks_the_target(net: Net, guests: dict[str, tuple[wp.Workspace, str]]) -> None:
    async with Client.connect(net.server.address) as client:
        assert await probe(client, guests["deny_all"][1], net.web.address, net.web_a) != "open"
        # ... while the same target answers the guest next door.
        assert await probe(client, guests["allow_all"][1], net.web.address, net.web_a) == "open"


@pytest.mark.asyncio(loop_scope="module")
async def test_allow_listed_admits_only_the_listed_address_and_port(net: Net) -> None:
    listed = wp.NetworkPolicy(
        egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_cidrs=[f"{net.web.address}/32"], allowed_ports=[net.web_a]
    )
    async with Client.connect(net.server.address) as client:
        workspace = await client.create(resources=SMALL, network_policy=listed)
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
        credential = await DataPlane(client).credential(workspace.workspace_id)
        assert await probe(client, credential, net.web.address, net.web_a) == "open"
        assert await probe(client, credential, net.web.address, net.web_b) != "open"  # another port
        assert await probe(client, credential, net.other.address, net.other_a) != "open"  # another address
        await client.delete(workspace.workspace_id)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_live_policy_change_applies_without_a_restart_and_cuts_what_it_forbids(net: Net) -> None:
    """ALLOW_ALL, a connection open; DENY_ALL set while AVAILABLE: the open connection is cut
    (its next send gets a reset), a new one is refused; the guest's agent never restarted;
    ALLOW_ALL again: reached again."""
    hold = f"""
import socket, os, time
s = socket.create_connection(("{net.web.address}", {net.web_a}), 2)
s.settimeout(3)
assert s.recv(3) == b"hi\\n"
s.sendall(b"one"); print("first", s.recv(3))
deadline = time.time() + 30
while not os.path.exists("/tmp/go") and time.time() < deadline:
    time.sleep(0.05)
try:
    s.sendall(b"two"); got = s.recv(3); print("second", "kept" if got == b"two" else "cut")
except OSError as e:
    print("second cut", e.errno)
"""
    async with Client.connect(net.server.address) as client:
        workspace = await client.create(resources=SMALL, network_policy=ALLOW_ALL)
        data = DataPlane(client)
        credential = await data.credential(workspace.workspace_id)
        code, agent, _ = await data.exec(credential, "cat", "/run/kibo/agent.pid")
        holding = asyncio.ensure_future(data.exec(credential, "python3", "-c", hold))
        accepted = sum(listener.accepted for listener in net.web.listeners)
        deadline = time.monotonic() + 15
        while sum(listener.accepted for listener in net.web.listeners) == accepted:
            assert time.monotonic() < deadline and not holding.done(), await holding if holding.done() else ""
            await asyncio.sleep(0.05)
        await set_policy(client, workspace.workspace_id, DENY_ALL)
        await eventually_probe(client, credential, net.web.address, net.web_a, want_open=False)
        await data.exec(credential, "touch", "/tmp/go")
        code, out, err = await holding
        assert code == 0, err
        assert b"first b'one'" in out and b"second cut" in out, out
        await set_policy(client, workspace.workspace_id, ALLOW_ALL)
        await eventually_probe(client, credential, net.web.address, net.web_a, want_open=True)
        assert (await data.exec(credential, "cat", "/run/kibo/agent.pid"))[1] == agent  # no restart
        assert (await client.get(workspace.workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        await client.delete(workspace.workspace_id)


async def set_policy(client: Client, workspace_id: str, policy: wp.NetworkPolicy) -> None:
    request = ws.SetWorkspaceNetworkPolicyRequest(metadata=meta(), workspace_id=workspace_id, network_policy=policy)
    response = await client.settle(client.ws.SetWorkspaceNetworkPolicy, request)
    assert response.command.state == SUCCEEDED, response


async def eventually_probe(client: Client, credential: str, address: str, port: int, want_open: bool) -> None:
    """The node applies a policy change after its command: probe until it shows (10 s)."""
    deadline = time.monotonic() + 10
    while (await probe(client, credential, address, port) == "open") != want_open:
        assert time.monotonic() < deadline, f"{address}:{port} still {'closed' if want_open else 'open'}"
        await asyncio.sleep(0.2)


# -- domain rules: the node's resolver admits what it answers for an allowed name ----------------

# getaddrinfo (the guest's /etc/resolv.conf: its node's resolver) then a TCP connect to the
# first address: "ADDRESS open|refused|...", or "noname" when the name does not resolve.
PROBE_NAME = """
import socket, sys
try:
    address = socket.getaddrinfo(sys.argv[1], int(sys.argv[2]), socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
except socket.gaierror:
    print("noname")
    raise SystemExit
try:
    s = socket.create_connection((address, int(sys.argv[2])), 2)
    s.settimeout(2)
    s.recv(16)
    print(address, "open")
except OSError as e:
    print(address, "closed", e.errno)
"""


async def probe_name(client: Client, credential: str, name: str, port: int) -> str:
    code, out, err = await DataPlane(client).exec(credential, "python3", "-c", PROBE_NAME, name, str(port))
    assert code == 0, err
    return out.decode().strip()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_domain_rule_follows_its_name_to_a_new_address(net: Net) -> None:
    """ALLOW_LISTED with the domain app.kibo.test only: its address (the test's DNS) is
    reached, the other host is not (by address, or by a name not listed: refused by the
    node's resolver); the test moves the name to the other host: the guest follows it there."""
    names, port = net.names, net.web_a
    assert net.other_a == port  # both hosts listen on the same port
    names.records["app.kibo.test"] = net.web.address
    names.records["elsewhere.kibo.test"] = net.other.address
    listed = wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_domains=["app.kibo.test"])
    async with Client.connect(net.server.address) as client:
        workspace = await client.create(resources=SMALL, network_policy=listed)
        assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
        credential = await DataPlane(client).credential(workspace.workspace_id)
        assert await probe_name(client, credential, "app.kibo.test", port) == f"{net.web.address} open"
        assert await probe(client, credential, net.other.address, port) != "open"
        # A name not listed is refused by the resolver (the upstream is never asked for it).
        asked = len(names.queries)
        assert await probe_name(client, credential, "elsewhere.kibo.test", port) == "noname"
        assert "elsewhere.kibo.test" not in names.queries[asked:]
        # The name moves: the guest's next lookup admits and reaches the new address.
        names.records["app.kibo.test"] = net.other.address
        assert await probe_name(client, credential, "app.kibo.test", port) == f"{net.other.address} open"
        await client.delete(workspace.workspace_id)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_denied_domain_is_refused_under_allow_all(net: Net) -> None:
    names = net.names
    names.records["blocked.kibo.test"] = net.web.address
    names.records["fine.kibo.test"] = net.web.address
    policy = wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_ALLOW_ALL, denied_domains=["blocked.kibo.test"])
    async with Client.connect(net.server.address) as client:
        workspace = await client.create(resources=SMALL, network_policy=policy)
        credential = await DataPlane(client).credential(workspace.workspace_id)
        assert await probe_name(client, credential, "fine.kibo.test", net.web_a) == f"{net.web.address} open"
        assert await probe_name(client, credential, "blocked.kibo.test", net.web_a) == "noname"
        await client.delete(workspace.workspace_id)


# -- what no policy opens ---------------------------------------------------------------------

NEVER = ("host_veth", "host_primary", "host_loopback", "api_port", "metadata", "other_guest")


@pytest.mark.parametrize("target", NEVER)
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.asyncio(loop_scope="module")
async def test_never_reached(
    net: Net, guests: dict[str, tuple[wp.Workspace, str]], policy: str, target: str, neighbor_listener: int
) -> None:
    """Under every policy (ALLOW_LISTED listing 0.0.0.0/0 too), a guest reaches none of: a
    listener of the host's on 0.0.0.0 (a PostgreSQL, the node port: by the gateway, the
    host's primary address or 127.0.0.1), the API port, 169.254.169.254, another guest."""
    workspace, credential = guests[policy]
    gateway = gateway_of(netns_of(net.server.data_dir, workspace.workspace_id))
    api_port = int(net.server.address.rsplit(":", 1)[1])
    where = {
        "host_veth": (gateway, net.host_port),
        "host_primary": (primary_address(), net.host_port),
        "host_loopback": ("127.0.0.1", net.host_port),
        "api_port": (gateway, api_port),
        "metadata": (net.metadata.address, net.metadata_port),
        "other_guest": (NEIGHBOR_ADDRESS[0], neighbor_listener),
    }[target]
    async with Client.connect(net.server.address) as client:
        assert await probe(client, credential, *where) != "open", where


NEIGHBOR_ADDRESS: list[str] = []


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def neighbor_listener(net: Net) -> AsyncIterator[int]:
    """A listener in a guest of its own (ALLOW_ALL), made in its network namespace."""
    async with Client.connect(net.server.address) as client:
        workspace = await client.create(resources=SMALL, network_policy=ALLOW_ALL)
        netns = netns_of(net.server.data_dir, workspace.workspace_id)
        NEIGHBOR_ADDRESS[:] = [await asyncio.to_thread(address_of, netns)]
        listener = Listener(socket_in(netns, "0.0.0.0", 0))
        try:
            yield int(listener.port)
        finally:
            listener.close()
            await client.delete(workspace.workspace_id)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_probe_reaches_a_listener_it_may(net: Net, guests: dict[str, tuple[wp.Workspace, str]]) -> None:
    """The probes above can succeed: the same kind of listener, on a target host, answers."""
    async with Client.connect(net.server.address) as client:
        for policy in ("allow_all", "listed_all"):
            assert await probe(client, guests[policy][1], net.web.address, net.web_a) == "open"


# -- anti-spoof ---------------------------------------------------------------------------------

SEND_FROM = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
for _ in range(5):
    s.sendto(sys.argv[4].encode(), (sys.argv[2], int(sys.argv[3])))
"""


def test_a_guest_packet_with_another_source_address_is_dropped(
    net: Net, guests: dict[str, tuple[wp.Workspace, str]]
) -> None:
    """A guest cannot change its address (its namespace is the host's user namespace's, it
    holds no capability there); should one ever send with another guest's address (the
    resolver knows guests by source), the host drops it. Sent here as root in the ALLOW_ALL
    guest's namespace: with its own address the datagrams arrive, with another one they don't."""
    workspace, _ = guests["allow_all"]
    netns = netns_of(net.server.data_dir, workspace.workspace_id)
    own = address_of(netns)
    other = str(ipaddress.IPv4Address(own) + 2)  # the next slot's guest address, in the pool
    receiver = socket_in(net.web.netns, net.web.address, 0, socket.SOCK_DGRAM)
    receiver.settimeout(2)
    port = receiver.getsockname()[1]
    try:
        subprocess.run(["ip", "-n", netns, "addr", "add", f"{other}/32", "dev", "eth0"], check=True)
        for source, tag in ((own, "own"), (other, "spoofed")):
            subprocess.run(
                ["ip", "netns", "exec", netns, "python3", "-c", SEND_FROM, source, net.web.address, str(port), tag],
                check=True,
            )
        got = set()
        with contextlib.suppress(TimeoutError):
            while True:
                got.add(receiver.recv(64).decode())
        assert got == {"own"}, got
    finally:
        receiver.close()
        subprocess.run(["ip", "-n", netns, "addr", "del", f"{other}/32", "dev", "eth0"], check=False)


# -- a control-plane restart ------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="module")
async def test_after_a_control_plane_kill_the_guest_keeps_its_network_and_takes_a_new_policy(
    net: Net, server_factory: Callable[..., ServerProcess]
) -> None:
    """kill -9 of `kibo-ctrl serve`: its guest runs on and still reaches the target (the slot,
    rules and NAT are the kernel's); the restarted server finds the slot on the machine and a
    live policy change applies to it; the delete releases it."""
    server = server_factory("--runtime", "process", "--sandbox", "bwrap", "--settle-ms", "3000")
    try:
        async with Client.connect(server.address) as client:
            workspace = await client.create(resources=SMALL, network_policy=ALLOW_ALL)
            assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
            credential = await DataPlane(client).credential(workspace.workspace_id)
            assert await probe(client, credential, net.web.address, net.web_a) == "open"
        netns = netns_of(server.data_dir, workspace.workspace_id)
        server.kill()
        assert netns in netns_names()  # the kernel's, not the process's
        server.start()
        async with Client.connect(server.address) as client:
            credential = await DataPlane(client).credential(workspace.workspace_id)
            assert await probe(client, credential, net.web.address, net.web_a) == "open"
            await set_policy(client, workspace.workspace_id, DENY_ALL)
            await eventually_probe(client, credential, net.web.address, net.web_a, want_open=False)
            await client.delete(workspace.workspace_id)
            await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_DELETED, within=30)
        assert netns not in netns_names()
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)
