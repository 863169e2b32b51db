"""Guest networking's cost (issue 28): create -> AVAILABLE with and without it, and the
kernel memory one guest network takes.

    python -m bench.guest_network [--workspaces 20] [--slots 100] [--dir DIR]

A/B in the same run: two `kibo-ctrl serve --runtime process --sandbox bwrap` servers at once,
B with `--guest-network off` (loopback only, as before), creating --workspaces workspaces in
turns (create until AVAILABLE, as a client sees it; which server goes first alternates; all
deleted at the end); medians and p90, and the ratio on / off. Then --slots network slots
(runtime/process/network/slots.py: a namespace, a veth pair, addresses and a route) are made
directly and the kernel's memory is read before and after from /proc/meminfo (MemAvailable
and Slab, each slot's share in KiB; the nftables chain and sets of a guest are not included:
a few KiB). Needs root. Everything it starts and makes is gone when it ends."""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kibotos
from kibo.ctrl.v1 import workspace_pb2

from bench.server import free_port
from bench.stats import median, percentile, ratio


class _Server:
    """One `kibo-ctrl serve --runtime process` of the A/B (its `flags`), until `stop`."""

    def __init__(self, base: Path, name: str, flags: tuple[str, ...]) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.data_dir = base / name
        serve = [sys.executable, "-m", "kibo_ctrl", "serve", "--listen", self.address, "--http-listen", ""]
        serve += ["--node-listen", "127.0.0.1:0", "--exposure-listen", f"127.0.0.1:{free_port()}", "--insecure-no-auth"]
        serve += ["--runtime", "process", "--sandbox", "bwrap", "--data-dir", str(self.data_dir)]
        serve += ["--log-level", "warning", *flags]
        with open(base / f"{name}.log", "ab") as log:
            self.process = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.client = kibotos.Client(self.address)
        self.made: list[str] = []
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.list_nodes()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def create(self) -> float:
        """Seconds from CreateWorkspace to AVAILABLE, as a client sees it."""
        spec = workspace_pb2.WorkspaceSpec(resources=workspace_pb2.Resources(vcpus=1, memory_mib=128))
        started = time.perf_counter()
        workspace_id = self.client.create_workspace(spec).workspace.workspace_id
        while self.client.get_workspace(workspace_id).state != workspace_pb2.WORKSPACE_STATE_AVAILABLE:
            time.sleep(0.005)
        took = time.perf_counter() - started
        self.made.append(workspace_id)
        return took

    def stop(self) -> None:
        from kibo_ctrl.runtime.process import network

        from tests.system.test_process_runtime import reap

        try:
            for workspace_id in self.made:
                self.client.delete_workspace(workspace_id)
            self.client.close()
        finally:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
            reap(self.data_dir)
            network.reap(self.data_dir)


def _creates(base: Path, count: int) -> tuple[list[float], list[float]]:
    """Create -> AVAILABLE on both servers at once, one workspace at a time, alternating which
    goes first each round (the machine's drift falls on both); each waits a moment after a
    create, as a user between two creates (the deletes come at the end)."""
    on, off = _Server(base, "on", ()), None
    try:
        off = _Server(base, "off", ("--guest-network", "off"))
        took: dict[str, list[float]] = {"on": [], "off": []}
        for round_ in range(count + 2):  # the first two warm up (fork server, image pool, slots)
            order = (("on", on), ("off", off)) if round_ % 2 else (("off", off), ("on", on))
            for name, server in order:
                took[name].append(server.create())
                time.sleep(0.3)
        return took["on"][2:], took["off"][2:]
    finally:
        on.stop()
        if off is not None:
            off.stop()


def _meminfo() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    return fields


def _slot_memory(count: int) -> tuple[float, float]:
    """KiB per slot: (MemAvailable drop, Slab growth)."""
    from kibo_ctrl.runtime.process.network import slots

    pool = ipaddress.IPv4Network("10.203.240.0/20")  # only addresses of veths in namespaces of this run
    tag = f"bench{os.getpid() % 100000:05d}"
    made = [slots.slot(tag, pool, i) for i in range(count)]
    before = _meminfo()
    try:
        for s in made:
            slots.make(s)
        time.sleep(1)
        after = _meminfo()
    finally:
        for s in made:
            slots.remove(s)
    return (before["MemAvailable"] - after["MemAvailable"]) / count, (after["Slab"] - before["Slab"]) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspaces", type=int, default=20)
    parser.add_argument("--slots", type=int, default=100)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kibo-bench-net-", dir=args.dir))
    try:
        on, off = _creates(base, args.workspaces)
        print(f"create -> AVAILABLE, {args.workspaces} workspaces each, one at a time:")
        for name, values in (("network on ", on), ("network off", off)):
            print(f"  {name}: p50 {median(values) * 1000:7.1f} ms   p90 {percentile(values, 90) * 1000:7.1f} ms")
        print(f"  ratio on/off (p50): {ratio(median(on), median(off)):.2f}")
        available, slab = _slot_memory(args.slots)
        print(f"kernel memory per guest network ({args.slots} slots):", end=" ")
        print(f"MemAvailable -{available:.0f} KiB, Slab +{slab:.0f} KiB")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
