"""Moving a STOPPED workspace's disks between two nodes on this host, against a plain copy
of the same images on the same disk in the same run (issue 26).

    python -m bench.move [--mib 1024] [--rounds 3] [--dir DIR]

A control plane (--no-local-node) and two `kibo-ctrl node --runtime process` agents, all on
this machine (the default node link: plaintext here, as --insecure-no-auth implies; the
cluster default is mutual TLS). One workspace writes --mib MiB of random data to /data and
stops; then, each round, its layer and volume images are copied with `cp --sparse=always`
and synced (the floor: what the disk does), and the workspace is moved to the other node
(MoveWorkspace, until SUCCEEDED). Both figures are the moved data bytes (holes and zero
blocks excluded) over the time taken; the ratio is move / plain copy. Medians over the
rounds. Everything it starts and makes is gone when it ends."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kibotos
from kibo.ctrl.v1 import command_pb2, workspace_pb2

MIB = 1 << 20


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _until(check: object, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():  # type: ignore[operator]
                return
        time.sleep(0.2)
    raise SystemExit(f"bench.move: timed out waiting for {what}")


def _images(data_dir: Path) -> list[Path]:
    return sorted([*data_dir.glob("layers/*/layer.img"), *data_dir.glob("volumes/*/volume.img")])


def _plain_copy(images: list[Path], into: Path) -> float:
    """Seconds to copy the images (sparse) and sync them: the floor."""
    started = time.perf_counter()
    copies = []
    for i, image in enumerate(images):
        copy = into / f"copy-{i}.img"
        subprocess.run(["cp", "--sparse=always", str(image), str(copy)], check=True)
        copies.append(copy)
    for copy in copies:
        fd = os.open(copy, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    took = time.perf_counter() - started
    for copy in copies:
        copy.unlink()
    return took


def run(args: argparse.Namespace) -> None:
    base = Path(tempfile.mkdtemp(prefix="kibo-bench-move-", dir=args.dir))
    address = f"127.0.0.1:{_port()}"
    python = [sys.executable, "-m", "kibo_ctrl"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        serve = [*python, "serve", "--listen", address, "--http-listen", "", "--no-local-node", "--insecure-no-auth"]
        serve += ["--data-dir", str(base / "server"), "--node-listen", "127.0.0.1:0", "--log-level", "warning"]
        processes.append(_start(serve, base / "server.log"))
        for name in ("node-a", "node-b"):
            node = [*python, "node", "--control-plane", address, "--runtime", "process", "--node-id", name]
            node += ["--data-dir", str(base / name), "--data-plane-listen", f"127.0.0.1:{_port()}"]
            node += ["--supervisor", "instance", "--vcpus", "8", "--memory-mib", "8192", "--log-level", "warning"]
            processes.append(_start(node, base / f"{name}.log"))
        with kibotos.Client(address) as client:
            _until(lambda: {n.id for n in client.list_nodes()} >= {"node-a", "node-b"}, 60, "both nodes")
            client.cordon_node("node-b")
            spec = workspace_pb2.WorkspaceSpec(resources=workspace_pb2.Resources(vcpus=1, memory_mib=256))
            workspace_id = client.create_workspace(spec).workspace.workspace_id
            _until(
                lambda: client.get_workspace(workspace_id).state == workspace_pb2.WORKSPACE_STATE_AVAILABLE,
                120,
                "AVAILABLE",
            )
            client.uncordon_node("node-b")
            credential = client.issue_data_plane_credential(workspace_id).credential
            write = f"head -c {args.mib}M /dev/urandom > /data/big && sync"
            result = client.exec_workspace_command(credential, ["sh", "-c", write], timeout=900)
            assert result.exit_code == 0, result
            client.stop_workspace(workspace_id)
            _until(
                lambda: client.get_workspace(workspace_id).state == workspace_pb2.WORKSPACE_STATE_STOPPED,
                120,
                "STOPPED",
            )
            where = "node-a"
            rows = []
            for round_ in range(args.rounds):
                to = "node-b" if where == "node-a" else "node-a"
                plain_s = _plain_copy(_images(base / where), base)
                started = time.perf_counter()
                command = client.move_workspace(workspace_id, to).command
                while command.state not in (command_pb2.COMMAND_STATE_SUCCEEDED, command_pb2.COMMAND_STATE_FAILED):
                    time.sleep(0.05)
                    command = client.get_command(command.command_id)
                move_s = time.perf_counter() - started
                assert command.state == command_pb2.COMMAND_STATE_SUCCEEDED, command.error.message
                data = command.progress.total_bytes
                plain, move = data / MIB / plain_s, data / MIB / move_s
                rows.append((plain, move, move / plain))
                print(
                    f"round {round_ + 1}: {where} -> {to}, {data / MIB:.0f} MiB of data: "
                    f"plain copy {plain:.0f} MiB/s, move {move:.0f} MiB/s, ratio {move / plain:.2f}",
                    flush=True,
                )
                where = to
            client.delete_workspace(workspace_id)
            _until(
                lambda: client.get_workspace(workspace_id).state == workspace_pb2.WORKSPACE_STATE_DELETED,
                120,
                "DELETED",
            )
        plain_m, move_m, ratio_m = (statistics.median(r[i] for r in rows) for i in range(3))
        print(
            f"median of {len(rows)}: plain copy {plain_m:.0f} MiB/s, move {move_m:.0f} MiB/s, "
            f"move / plain copy = {ratio_m:.2f}"
        )
    finally:
        for process in reversed(processes):
            _stop(process)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="random data the workspace writes to /data")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the nodes keep their data (default: the temp dir)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
