"""1,000 exposures on one node (issue 28): what they cost the control plane, in the same run.

    python -m bench.exposures [--workspaces 32] [--per-workspace 32] [--requests 300]

One `kibo-ctrl serve --runtime sim` (bench/server.py) with its exposure listener. It makes
--workspaces workspaces and --per-workspace token exposures on each (1,024 by default: 32 is
the most one workspace may have), and reports:
- CreateWorkspaceExposure: p50 and p90 of each call (a command: one commit);
- a request routed by the listener (Host and token checked against the store; the simulator
  opens no guest port, so it ends 503 after the whole route): p50 with ONE exposure made,
  then with all of them, and their ratio (routing reads one workspace: it should not grow);
- the server's RSS before and after, per exposure.
Quote medians: this machine is noisy."""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc

from bench.server import Server, free_port, rss_mib, wait_serving


class ExposingServer(Server):
    exposure_port: int = 0

    def command(self) -> list[str]:
        return [*super().command(), "--exposure-listen", f"127.0.0.1:{self.exposure_port}"]


def meta() -> wp.CommandMetadata:
    return wp.CommandMetadata(command_id=f"bench/{uuid.uuid4()}")


def routed(port: int, host: str, token: str) -> tuple[float, int]:
    """One GET through the listener on a new connection: (seconds, status)."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nX-Kibo-Exposure-Token: {token}\r\n\r\n".encode())
        head = sock.recv(4096)
    return time.perf_counter() - started, int(head.split(b" ")[1])


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspaces", type=int, default=32)
    parser.add_argument("--per-workspace", type=int, default=32)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kibo-bench-exposures-") as tmp:
        server = ExposingServer(Path(tmp) / "data", Path(tmp) / "server.log")
        server.exposure_port = free_port()
        with open(server.log_path, "wb") as log:
            server.process = subprocess.Popen(server.command(), stderr=log)
        try:
            wait_serving(server.address, 30, server.process)
            with grpc.insecure_channel(server.address) as channel:
                stub = ws_grpc.WorkspaceServiceStub(channel)  # type: ignore[no-untyped-call]
                md = server.metadata
                ids = []
                for _ in range(args.workspaces):
                    made = stub.CreateWorkspace(ws.CreateWorkspaceRequest(metadata=meta()), metadata=md)
                    ids.append(made.workspace.workspace_id)
                for workspace_id in ids:
                    while (
                        stub.GetWorkspace(
                            ws.GetWorkspaceRequest(workspace_id=workspace_id), metadata=md
                        ).workspace.state
                        != wp.WORKSPACE_STATE_AVAILABLE
                    ):
                        time.sleep(0.01)
                rss_before = rss_mib(server.pid)

                def expose(workspace_id: str, port: int) -> tuple[float, wp.Exposure]:
                    started = time.perf_counter()
                    request = ws.CreateWorkspaceExposureRequest(metadata=meta(), workspace_id=workspace_id, port=port)
                    answer = stub.CreateWorkspaceExposure(request, metadata=md)
                    return time.perf_counter() - started, answer.exposure

                _, first = expose(ids[0], 1000)
                host = first.url.split("//", 1)[1].split(":", 1)[0]
                one = [routed(server.exposure_port, host, first.token) for _ in range(args.requests)]
                assert {status for _, status in one} == {503}, {status for _, status in one}
                creates = []
                for index, workspace_id in enumerate(ids):
                    for n in range(args.per_workspace - (1 if index == 0 else 0)):
                        seconds, _ = expose(workspace_id, 2000 + n)
                        creates.append(seconds)
                total = len(creates) + 1
                rss_after = rss_mib(server.pid)
                many = [routed(server.exposure_port, host, first.token) for _ in range(args.requests)]
        finally:
            server.process.terminate()
            server.process.wait(30)
    one_p50 = statistics.median(s for s, _ in one)
    many_p50 = statistics.median(s for s, _ in many)
    print(f"{total} exposures on {args.workspaces} workspaces (simulator node)")
    print(f"CreateWorkspaceExposure: p50 {1000 * p(creates, 0.5):.2f} ms, p90 {1000 * p(creates, 0.9):.2f} ms")
    print(
        f"a routed request, p50 of {args.requests}: with 1 exposure {1000 * one_p50:.3f} ms, "
        f"with {total} {1000 * many_p50:.3f} ms, ratio {many_p50 / one_p50:.2f}"
    )
    per = 1024 * (rss_after - rss_before) / total
    print(f"server RSS {rss_before:.0f} -> {rss_after:.0f} MiB: {per:.1f} KiB per exposure")


if __name__ == "__main__":
    main()
