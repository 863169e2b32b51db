"""Guest networking's cost (issue 28): create -> AVAILABLE with and without it, and the
kernel memory one guest network takes.

    python -m bench.guest_network [--workspaces 20] [--slots 100] [--dir DIR]

A/B in the same run: two `kibo-ctrl serve --runtime process --sandbox bwrap` servers one after
the other, B with `--guest-network off` (loopback only, as before),
each creating --workspaces workspaces one at a time (create until AVAILABLE, as a client sees
it; then deleted); medians and p90, and the ratio on / off. Then --slots network slots
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
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kibotos
from kibo.ctrl.v1 import workspace_pb2

from bench.stats import median, percentile, ratio


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _creates(base: Path, name: str, count: int, flags: tuple[str, ...]) -> list[float]:
    """Seconds from CreateWorkspace to AVAILABLE, `count` workspaces one at a time."""
    address = f"127.0.0.1:{_port()}"
    data_dir = base / name
    serve = [sys.executable, "-m", "kibo_ctrl", "serve", "--listen", address, "--http-listen", ""]
    serve += ["--node-listen", "127.0.0.1:0", "--exposure-listen", f"127.0.0.1:{_port()}", "--insecure-no-auth"]
    serve += ["--runtime", "process", "--sandbox", "bwrap", "--data-dir", str(data_dir), "--log-level", "warning"]
    serve += flags
    with open(base / f"{name}.log", "ab") as log:
        server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    took: list[float] = []
    try:
        with kibotos.Client(address) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.list_nodes()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            spec = workspace_pb2.WorkspaceSpec(resources=workspace_pb2.Resources(vcpus=1, memory_mib=128))
            for _ in range(count + 2):  # the first two warm up (fork server, image pool, slots)
                started = time.perf_counter()
                workspace_id = client.create_workspace(spec).workspace.workspace_id
                while client.get_workspace(workspace_id).state != workspace_pb2.WORKSPACE_STATE_AVAILABLE:
                    time.sleep(0.005)
                took.append(time.perf_counter() - started)
                client.delete_workspace(workspace_id)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
        from kibo_ctrl.runtime.process import network

        from tests.system.test_process_runtime import reap

        reap(data_dir)
        network.reap(data_dir)
    return took[2:]


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
        on = _creates(base, "on", args.workspaces, ())
        off = _creates(base, "off", args.workspaces, ("--guest-network", "off"))
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
