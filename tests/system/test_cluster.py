"""The cluster test of issue 13: 3 `kibo-ctrl serve --no-local-node` replicas on one
PostgreSQL database and 3 `kibo-ctrl node --runtime sim` agents, each a process of its own on
loopback, started with the deployment example's own command lines (examples/cluster/cluster.sh).

Clients spread over the replicas send mixed lifecycle commands (create, stop, start,
delete; some sent again with the same command ID), resending to the next replica when one
cannot be reached, while the leader is killed with -9 twice (restarted as a follower each
time) and one node agent is killed with -9 and restarted. Then: every acknowledged command
is found on every replica and SUCCEEDED, each workspace's final state is what its last
acknowledged command implies (an acknowledged delete is DELETED), the watches on every replica
saw each workspace's versions without a gap, and no instance was launched twice: counted by the
nodes' runtimes themselves (tests/recorded_sim.py), where the launches happen."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import SUCCEEDED, TERMINAL, Client, S, implied_states, meta, state_name
from tests.postgres import Databases
from tests.server import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "cluster" / "cluster.sh"
COMMANDS = 500
WORKERS = 9
LEASE_MS = 3000
# A launch a node's runtime finished longer ago than this has been reported to the control plane
# (a report takes milliseconds): a node agent restarted after that must not launch it again.
REPORTED_WITHIN_S = 1.0
# Calls that may not have got through (a killed replica): sent again, same command ID, to the next replica.
PASSING = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
STEADY = {S.WORKSPACE_STATE_AVAILABLE, S.WORKSPACE_STATE_STOPPED, S.WORKSPACE_STATE_DELETED, S.WORKSPACE_STATE_FAILED}

pytestmark = [pytest.mark.timeout(900), pytest.mark.serial]


@dataclass
class Part:
    """One replica or node agent: `cluster.sh ROLE I`, whose exec makes its pid kibo-ctrl's."""

    role: str
    index: int
    env: dict[str, str]
    logs: Path
    # Run under this (e.g. `ip netns exec NS`, which execs the script in the namespace).
    prefix: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Part:
        command = [*self.prefix, "sh", str(SCRIPT), self.role, str(self.index)]
        with open(self.logs / f"{self.role}-{self.index}.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


async def _serving(address: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{address} not serving after {within}s")


def _leader(url: str) -> tuple[int, int] | None:
    """(pid, fencing token) of the replica holding an unexpired leader lease."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT holder, token FROM kibo_leader WHERE expires_at > now()").fetchone()
    return None if row is None or not row[0] else (int(str(row[0]).split("/")[1]), int(row[1]))


@dataclass
class Tally:
    acknowledged: dict[str, tuple[str, str]] = field(default_factory=dict)  # command ID -> (kind, workspace)
    resends: int = 0
    repeats: int = 0
    workspaces: list[str] = field(default_factory=list)
    watches: dict[tuple[str, int], list[list[tuple[int, int]]]] = field(default_factory=dict)
    failovers: list[tuple[float, float]] = field(default_factory=list)
    node_down_s: float = 0.0
    unknown_after_s: float = 0.0
    victim: str = ""
    # The victim's kibo-ctrl before its kill -9 and after its restart.
    killed_pid: int = 0
    restarted_pid: int = 0
    killed_at: float = 0.0  # wall clock


class Cluster:
    def __init__(self, clients: list[Client], tally: Tally) -> None:
        self.clients = clients
        self.tally = tally
        self.done = asyncio.Event()

    async def call(self, rpc: str, request: Any, first: int) -> Any:
        """Send until a replica answers (the same request, so the same command ID)."""
        for attempt in range(600):
            client = self.clients[(first + attempt) % len(self.clients)]
            try:
                return await getattr(client.ws, rpc)(request, timeout=10)
            except grpc.aio.AioRpcError as error:
                if error.code() not in PASSING:
                    raise
                self.tally.resends += 1
                await asyncio.sleep(0.1)
        raise TimeoutError(f"{rpc}: no replica answered")

    async def steady(self, workspace_id: str, first: int, within: float = 180.0) -> wp.Workspace:
        deadline = time.monotonic() + within
        while True:
            response = await self.call("GetWorkspace", ws.GetWorkspaceRequest(workspace_id=workspace_id), first)
            workspace: wp.Workspace = response.workspace
            if workspace.state in STEADY:
                return workspace
            if time.monotonic() > deadline:
                raise TimeoutError(f"{workspace_id} stuck in {S.Name(workspace.state)}")
            await asyncio.sleep(0.05)

    async def command(self, kind: str, rpc: str, request: Any, first: int, rng: random.Random) -> str:
        response = await self.call(rpc, request, first)
        workspace_id = response.workspace.workspace_id
        self.tally.acknowledged[request.metadata.command_id] = (kind, workspace_id)
        if rng.random() < 0.1:
            # The same command sent again, to another replica: the same answer, nothing new.
            again = await self.call(rpc, request, first + 1)
            assert again.command.command_id == response.command.command_id
            assert again.workspace.workspace_id == workspace_id
            self.tally.repeats += 1
        return str(workspace_id)

    async def watch(self, workspace_id: str, replica: int) -> None:
        """Every version the replica's watch shows, in segments (a killed replica breaks one)."""
        segments = self.tally.watches.setdefault((workspace_id, replica), [])
        while True:
            segment: list[tuple[int, int]] = []
            segments.append(segment)
            call = self.clients[replica].ws.WatchWorkspace(ws.WatchWorkspaceRequest(workspace_id=workspace_id))
            try:
                while (message := await call.read()) is not grpc.aio.EOF:
                    segment.append((int(message.workspace.etag), message.workspace.state))
                if segment and segment[-1][1] == S.WORKSPACE_STATE_DELETED:
                    return
            except grpc.aio.AioRpcError as error:
                if error.code() not in PASSING:
                    raise
            finally:
                call.cancel()
            if self.done.is_set():
                return
            await asyncio.sleep(0.2)

    async def worker(self, number: int, budget: Counter[str], watches: list[asyncio.Task[None]]) -> None:
        rng = random.Random(number)
        first = number % len(self.clients)
        while budget["left"] > 0:
            budget["left"] -= 1
            create = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(labels={"worker": str(number)}))
            workspace_id = await self.command("create", "CreateWorkspace", create, first, rng)
            self.tally.workspaces.append(workspace_id)
            watches.extend(asyncio.create_task(self.watch(workspace_id, r)) for r in range(len(self.clients)))
            state = (await self.steady(workspace_id, first)).state
            for _ in range(rng.randint(1, 6)):
                if budget["left"] <= 0 or state not in (S.WORKSPACE_STATE_AVAILABLE, S.WORKSPACE_STATE_STOPPED):
                    break
                budget["left"] -= 1
                first = rng.randrange(len(self.clients))
                if state == S.WORKSPACE_STATE_AVAILABLE:
                    stop = ws.StopWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
                    await self.command("stop", "StopWorkspace", stop, first, rng)
                else:
                    start = ws.StartWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
                    await self.command("start", "StartWorkspace", start, first, rng)
                state = (await self.steady(workspace_id, first)).state
            if budget["left"] > 0 and rng.random() < 0.7:
                budget["left"] -= 1
                delete = ws.DeleteWorkspaceRequest(metadata=meta(), workspace_id=workspace_id)
                await self.command("delete", "DeleteWorkspace", delete, rng.randrange(len(self.clients)), rng)
                await self.steady(workspace_id, first)


async def _when(check: Callable[[], bool | Awaitable[bool]], within: float, what: str) -> float:
    """Wait until `check` holds; the seconds it took."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        result = check()
        if await result if isinstance(result, Awaitable) else result:
            return time.monotonic() - began
        await asyncio.sleep(0.05)
    raise TimeoutError(what)


@contextlib.asynccontextmanager
async def _started(parts: list[Part]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for part in parts:
            part.stop()


def _environment(url: str, addresses: list[str], data: Path) -> dict[str, str]:
    """cluster.sh's settings: the test's database and ports, the simulated runtime, fast steps."""
    return {
        **os.environ,
        "KIBO_STORE": url,
        "KIBO_REPLICA_ADDRESSES": ",".join(addresses),
        "KIBO_CLUSTER_DIR": str(data),
        "KIBO_CTRL": f"{sys.executable} -m kibo_ctrl",
        "KIBO_RUNTIME": "sim",
        "KIBO_SERVE_FLAGS": f"--insecure-no-auth --settle-ms 300 --node-timeout-ms {LEASE_MS} --log-level warning",
        "KIBO_NODE_FLAGS": "--sim-step-ms 5 --vcpus 256 --memory-mib 262144 --log-level warning",
    }


def _node_environment(env: dict[str, str], launches: Path, labels: str) -> dict[str, str]:
    """A node agent's: its runtime records its launches in `launches` (tests/recorded_sim.py)."""
    return {
        **env,
        "KIBO_CTRL": f"{sys.executable} -m tests.recorded_sim",
        "KIBO_TEST_LAUNCHES": str(launches),
        "KIBO_NODE_FLAGS": f"{env['KIBO_NODE_FLAGS']} --labels {labels}",
    }


@dataclass(frozen=True)
class Launch:
    """One launch a node's runtime was asked to make (tests/recorded_sim.py)."""

    node: str
    pid: int
    instance: str
    workspace: str
    done_at: float = 0.0  # when it finished (wall clock); 0: it did not


def _launches(path: Path) -> dict[str, list[Launch]]:
    """By instance, the launches the nodes' runtimes began, in order, each with when it finished."""
    begun: dict[str, list[Launch]] = defaultdict(list)
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, node, pid, instance, workspace, at = line.split()
        if kind == "begin":
            begun[instance].append(Launch(node, int(pid), instance, workspace))
        else:
            runs = begun[instance]
            last = max(i for i, run in enumerate(runs) if (run.node, run.pid) == (node, int(pid)))
            runs[last] = Launch(node, int(pid), instance, workspace, done_at=float(at))
    return begun


async def test_three_replicas_and_three_nodes_lose_no_acknowledged_command_through_kill_9s(
    postgres_databases: Databases, tmp_path: Path
) -> None:
    url = postgres_databases.create()
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    env = _environment(url, addresses, tmp_path)
    replicas = [Part("replica", i + 1, env, tmp_path) for i in range(3)]
    launches_log = tmp_path / "launches.log"
    nodes = [Part("node", i + 1, _node_environment(env, launches_log, f"node={i + 1}"), tmp_path) for i in range(3)]
    tally = Tally()
    async with _started(replicas + nodes), contextlib.AsyncExitStack() as stack:
        for replica, address in zip(replicas, addresses, strict=True):
            replica.start()
            await _serving(address)
        for node in nodes:
            node.start()
        clients = [await stack.enter_async_context(Client.connect(a)) for a in addresses]
        cluster = Cluster(clients, tally)

        def ready_nodes() -> bool:
            with psycopg.connect(url) as conn:
                rows = conn.execute("SELECT count(*) FROM nodes").fetchone()
            return rows is not None and int(rows[0]) == 3

        await _when(ready_nodes, 60, "3 nodes joined")

        async def kill_the_leader() -> None:
            held = _leader(url)
            assert held is not None, "no leader"
            pid, token = held
            dead = next(r for r in replicas if r.process is not None and r.process.pid == pid)
            dead.kill()
            killed = time.monotonic()
            survivor = next(i for i, r in enumerate(replicas) if r is not dead)

            def taken() -> bool:
                now = _leader(url)
                return now is not None and now[0] != pid and now[1] > token

            lease_s = await _when(taken, 60, "a survivor takes the lease")
            # The next create, through a survivor, AVAILABLE (placed by the new leader's scheduler).
            probe = ws.CreateWorkspaceRequest(metadata=meta(), spec=wp.WorkspaceSpec(labels={"probe": "failover"}))
            workspace_id = await cluster.command("create", "CreateWorkspace", probe, survivor, random.Random(0))
            tally.workspaces.append(workspace_id)
            assert (await cluster.steady(workspace_id, survivor)).state == S.WORKSPACE_STATE_AVAILABLE
            tally.failovers.append((lease_s, time.monotonic() - killed))
            dead.start()  # as a follower: the lease is taken
            await _serving(addresses[dead.index - 1])

        async def kill_a_node() -> None:
            # The node that runs the most workspaces now (each node renews through its own replica).
            listed = await cluster.call("ListWorkspaces", ws.ListWorkspacesRequest(page_size=1000), 0)
            running = Counter(w.node_id for w in listed.workspaces if w.state == S.WORKSPACE_STATE_AVAILABLE)
            victim = running.most_common(1)[0][0] if running else "node-2"
            node = nodes[int(victim.split("-")[1]) - 1]
            # One workspace of the victim's is AVAILABLE when it dies, whatever the workers do
            # meanwhile: a probe placed there (its label), which no worker touches.
            spec = wp.WorkspaceSpec(labels={"probe": "node-kill"}, node_selector={"node": str(node.index)})
            probe = ws.CreateWorkspaceRequest(metadata=meta(), spec=spec)
            probe_id = await cluster.command("create", "CreateWorkspace", probe, 0, random.Random(0))
            tally.workspaces.append(probe_id)
            placed = await cluster.steady(probe_id, 0)
            assert (placed.state, placed.node_id) == (S.WORKSPACE_STATE_AVAILABLE, victim), placed
            assert node.process is not None
            tally.killed_pid = node.process.pid
            tally.killed_at = time.time()
            node.kill()
            killed = time.monotonic()

            async def unknown() -> bool:
                response = await cluster.call("GetWorkspace", ws.GetWorkspaceRequest(workspace_id=probe_id), 0)
                return bool(response.workspace.state == S.WORKSPACE_STATE_UNKNOWN)

            # Its workspaces go UNKNOWN once its lease runs out (on the leader, whichever replica
            # it renewed through); started again on its data dir, it takes them back.
            within = 6 * LEASE_MS / 1000
            tally.unknown_after_s = await _when(unknown, within, f"{victim}'s workspace {probe_id} UNKNOWN")
            node.start()
            assert node.process is not None
            tally.restarted_pid = node.process.pid
            tally.node_down_s = time.monotonic() - killed
            tally.victim = victim

        async def chaos() -> None:
            plan: list[tuple[int, Callable[[], Awaitable[None]]]] = [
                (COMMANDS // 5, kill_the_leader),
                (2 * COMMANDS // 5, kill_a_node),
                (3 * COMMANDS // 5, kill_the_leader),
            ]
            for at, act in plan:
                await _when(lambda at=at: len(tally.acknowledged) >= at, 600, f"{at} commands acknowledged")  # type: ignore[misc]
                await act()

        budget: Counter[str] = Counter(left=COMMANDS)
        watches: list[asyncio.Task[None]] = []
        began = time.monotonic()
        await asyncio.gather(chaos(), *(cluster.worker(w, budget, watches) for w in range(WORKERS)))
        elapsed = time.monotonic() - began

        # Every acknowledged command is there, read through every replica, and SUCCEEDED: nothing
        # was injected and each was sent in a state that allows it, so a FAILED one is a loss.
        lost, unsuccessful = [], []
        for command_id, (kind, workspace_id) in tally.acknowledged.items():
            request = ws.GetWorkspaceCommandRequest(command_id=command_id)
            for replica in range(3):
                try:
                    command = (await cluster.call("GetWorkspaceCommand", request, replica)).command
                except grpc.aio.AioRpcError:
                    lost.append(command_id)
                    break
                if command.state not in TERMINAL:
                    await _when(lambda r=request, i=replica: _terminal(cluster, r, i), 60, f"{command_id} terminal")
                    command = (await cluster.call("GetWorkspaceCommand", request, replica)).command
                if command.state != SUCCEEDED:
                    unsuccessful.append(f"{kind} {workspace_id} ({command_id}) on replica {replica + 1}: {command}")
                    break
        # Each workspace ends where its last acknowledged command leaves it.
        finals = {w: await _final(cluster, w) for w in tally.workspaces}
        expected = implied_states(tally.acknowledged.values())
        wrong = [
            f"{w}: {state_name(finals[w].state)}, its last command implies {state_name(expected[w])}"
            for w in tally.workspaces
            if finals[w].state != expected[w]
        ]
        # Let the watches of live workspaces catch up with the last version, then end them.
        await asyncio.sleep(2)
        cluster.done.set()
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        gaps = _gaps(tally, finals)
        # No instance launched twice, as the nodes' runtimes saw it: each instance was begun once.
        # The one exception: a launch the killed node agent had begun and not reported (not
        # finished, or finished just before the kill), begun again once by its restarted self
        # (the sim's instances live in its memory, so the same launch is redone).
        launches = _launches(launches_log)
        launched_twice, resumed = [], []
        for instance, runs in launches.items():
            if len(runs) == 1:
                continue
            nodes_pids = [(run.node, run.pid) for run in runs]
            unreported = not runs[0].done_at or runs[0].done_at > tally.killed_at - REPORTED_WITHIN_S
            if nodes_pids == [(tally.victim, tally.killed_pid), (tally.victim, tally.restarted_pid)] and unreported:
                resumed.append(instance)
            else:
                launched_twice.append(f"{instance}: {runs}")
        # And each create and start that SUCCEEDED is one launch the runtimes finished.
        finished = {instance for instance, runs in launches.items() if runs[-1].done_at}
        starts = sum(kind in ("create", "start") for kind, _ in tally.acknowledged.values())
        on_their_nodes = {(runs[-1].workspace, runs[-1].node) for runs in launches.values() if runs[-1].done_at}
        unlaunched = [
            w
            for w, final in finals.items()
            if final.state == S.WORKSPACE_STATE_AVAILABLE and (w, final.node_id) not in on_their_nodes
        ]

        kinds = Counter(kind for kind, _ in tally.acknowledged.values())
        print(
            f"\ncluster: {len(tally.acknowledged)} commands acknowledged ({dict(kinds)}) in {elapsed:.1f}s, "
            f"{tally.repeats} sent again with the same command ID, {tally.resends} resends after a failed call; "
            f"kills: 2 leaders (kill -9), 1 node agent ({tally.victim}: kill -9, its workspace UNKNOWN after "
            f"{tally.unknown_after_s:.1f}s, restarted after {tally.node_down_s:.1f}s); "
            f"lost {len(lost)}, not SUCCEEDED {len(unsuccessful)}, final state not the last command's {len(wrong)}; "
            "failover (kill -9 -> lease taken / -> next create AVAILABLE): "
            + ", ".join(f"{a:.2f}s / {b:.2f}s" for a, b in tally.failovers)
            + f"; watches: {len(tally.watches)} on 3 replicas, "
            f"{sum(sum(1 for seg in s if seg) - 1 for s in tally.watches.values())} reconnects, {len(gaps)} gaps; "
            f"launches begun by the nodes' runtimes: {sum(len(r) for r in launches.values())} of "
            f"{len(launches)} instances ({len(finished)} finished, for {starts} creates and starts); "
            f"instances launched twice: {len(launched_twice)}; launches redone by the restarted node agent: "
            f"{len(resumed)}"
        )
        assert not lost, lost
        assert not unsuccessful, unsuccessful[:5]
        assert not wrong, wrong[:5]
        assert len(tally.failovers) == 2
        assert not gaps, gaps[:5]
        assert not launched_twice, launched_twice[:5]
        assert len(finished) == len(launches) == starts, (len(finished), len(launches), starts)
        assert not unlaunched, unlaunched[:5]


async def _final(cluster: Cluster, workspace_id: str) -> wp.Workspace:
    """The workspace once steady; DELETED if it is gone altogether."""
    try:
        return await cluster.steady(workspace_id, 0, within=60)
    except grpc.aio.AioRpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return wp.Workspace(workspace_id=workspace_id, state=S.WORKSPACE_STATE_DELETED)


async def _terminal(cluster: Cluster, request: ws.GetWorkspaceCommandRequest, replica: int) -> bool:
    command = (await cluster.call("GetWorkspaceCommand", request, replica)).command
    return command.state in TERMINAL


def _gaps(tally: Tally, finals: dict[str, wp.Workspace]) -> list[str]:
    """Versions a watch skipped: within a segment each version follows the last by one; a
    reconnect (a snapshot) never goes back; every watch reaches the workspace's last version."""
    gaps = []
    for (workspace_id, replica), segments in tally.watches.items():
        seen = [version for segment in segments for version, _ in segment]
        for segment in segments:
            versions = [version for version, _ in segment]
            for before, after in itertools.pairwise(versions):
                if after != before + 1:
                    gaps.append(f"{workspace_id} on replica {replica + 1}: {before} -> {after}")
        if sorted(seen) != seen:
            gaps.append(f"{workspace_id} on replica {replica + 1}: went back {seen}")
        last = [state for segment in segments for _, state in segment][-1:]
        if finals[workspace_id].state == S.WORKSPACE_STATE_DELETED:
            # A watch ends with the DELETED change (the files' release may bump the version after).
            if last != [S.WORKSPACE_STATE_DELETED]:
                gaps.append(f"{workspace_id} on replica {replica + 1}: never saw DELETED")
        elif not seen or seen[-1] != int(finals[workspace_id].etag):
            gaps.append(
                f"{workspace_id} on replica {replica + 1}: ended at {seen[-1:]}, not {finals[workspace_id].etag}"
            )
    return gaps


@contextlib.contextmanager
def _namespace() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this host by a veth pair: (name, host address, the
    namespace's end of the link). Removed at the end, with its link."""
    tag = f"{os.getpid() % 100_000}{random.randrange(100)}"
    name, host_end, ns_end = f"kibo-test-{tag}", f"kh{tag}", f"kn{tag}"
    subnet = f"10.{200 + os.getpid() % 50}.{random.randrange(256)}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    ip("netns", "add", name)
    try:
        ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        ip("link", "set", ns_end, "netns", name)
        ip("addr", "add", f"{subnet}.1/30", "dev", host_end)
        ip("link", "set", host_end, "up")
        ip("-n", name, "addr", "add", f"{subnet}.2/30", "dev", ns_end)
        ip("-n", name, "link", "set", ns_end, "up")
        yield name, f"{subnet}.1", ns_end
    finally:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


async def test_a_node_cut_off_in_its_network_namespace_goes_unknown_and_comes_back(
    postgres_databases: Databases, tmp_path: Path
) -> None:
    """Two replicas; node-1 on this host, node-2 in a network namespace of its own (a test
    host). Its link goes down: its workspaces become UNKNOWN (node-1's stay AVAILABLE); the
    link comes back: they are AVAILABLE again, nothing was launched twice, and they obey."""
    assert os.geteuid() == 0, "the partition test puts a node agent in a network namespace: run it as root"
    url = postgres_databases.create()
    with _namespace() as (namespace, host_address, link):
        # The replicas listen on the host's end of the link; node-1 reaches them there too.
        addresses = [f"{host_address}:{free_port()}" for _ in range(2)]
        env = _environment(url, addresses, tmp_path)
        replicas = [Part("replica", i + 1, env, tmp_path) for i in range(2)]
        launches_log = tmp_path / "launches.log"
        nodes = [
            Part("node", 1, _node_environment(env, launches_log, "side=host"), tmp_path),
            Part(
                "node",
                2,
                _node_environment(env, launches_log, "side=cut"),
                tmp_path,
                prefix=("ip", "netns", "exec", namespace),
            ),
        ]
        async with _started(replicas + nodes), contextlib.AsyncExitStack() as stack:
            for replica, address in zip(replicas, addresses, strict=True):
                replica.start()
                await _serving(address)
            for node in nodes:
                node.start()
            client = await stack.enter_async_context(Client.connect(addresses[1]))

            def joined() -> bool:
                with psycopg.connect(url) as conn:
                    row = conn.execute("SELECT count(*) FROM nodes").fetchone()
                return row is not None and int(row[0]) == 2

            await _when(joined, 60, "both nodes joined")
            cut = [(await client.create(node_selector={"side": "cut"})).workspace_id for _ in range(2)]
            kept = (await client.create(node_selector={"side": "host"})).workspace_id
            for workspace_id in (*cut, kept):
                assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
            launches = _launches(launches_log)
            assert sorted(runs[0].workspace for runs in launches.values() if runs[0].node == "node-2") == sorted(cut)

            async def states(*wanted: int) -> bool:
                return all([(await client.get(w)).state in wanted for w in cut])

            await _link(namespace, link, "down")
            unknown_s = await _when(lambda: states(S.WORKSPACE_STATE_UNKNOWN), 6 * LEASE_MS / 1000, "UNKNOWN")
            assert (await client.get(kept)).state == S.WORKSPACE_STATE_AVAILABLE
            await _link(namespace, link, "up")
            back_s = await _when(lambda: states(S.WORKSPACE_STATE_AVAILABLE), 120, "AVAILABLE again")
            assert _launches(launches_log) == launches, "launched again after the partition"
            # The node obeys again: a stop and a start of one of its workspaces settle.
            await client.stop(cut[0])
            assert (await client.wait_steady(cut[0], within=30)).state == S.WORKSPACE_STATE_STOPPED
            await client.start(cut[0])
            assert (await client.wait_steady(cut[0], within=30)).state == S.WORKSPACE_STATE_AVAILABLE
            print(f"\npartition: node-2's link down -> UNKNOWN in {unknown_s:.1f}s; up -> AVAILABLE in {back_s:.1f}s")


async def _link(namespace: str, link: str, state: str) -> None:
    ip = await asyncio.create_subprocess_exec("ip", "-n", namespace, "link", "set", link, state)
    assert await asyncio.wait_for(ip.wait(), 10) == 0
