"""Node agents as their own processes (`kibo-ctrl node`), for the tests of issue 13."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from kibo.node.v1 import node_admin_service_pb2 as adm
from kibo.node.v1 import node_admin_service_pb2_grpc as adm_grpc


@dataclass
class NodeProcess:
    control_plane: str
    data_dir: Path
    node_id: str
    flags: tuple[str, ...] = ()
    runtime: str = "sim"
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> NodeProcess:
        log_path = self.data_dir.parent / f"{self.node_id}-node.log"
        command = [
            sys.executable,
            "-m",
            "kibo_ctrl",
            "node",
            "--control-plane",
            self.control_plane,
            "--runtime",
            self.runtime,
            "--sim-step-ms",
            "5",
            "--data-dir",
            str(self.data_dir),
            "--node-id",
            self.node_id,
            "--vcpus",
            "64",
            "--memory-mib",
            "65536",
            "--log-level",
            "info",
            *self.flags,
        ]
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        return self

    def log(self) -> str:
        path = self.data_dir.parent / f"{self.node_id}-node.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def kill(self) -> None:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(15)


async def list_nodes(address: str, token: str = "") -> dict[str, adm.Node]:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = adm_grpc.NodeAdminServiceStub(channel)  # type: ignore[no-untyped-call]
        response = await stub.ListNodes(adm.ListNodesRequest(), metadata=metadata)
    return {node.id: node for node in response.nodes}


async def admin(address: str, rpc: str, node_id: str, token: str = "") -> adm.Node:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = adm_grpc.NodeAdminServiceStub(channel)  # type: ignore[no-untyped-call]
        request = getattr(adm, f"{rpc}Request")(node_id=node_id)
        response = await getattr(stub, rpc)(request, metadata=metadata)
    node: adm.Node = response.node
    return node
