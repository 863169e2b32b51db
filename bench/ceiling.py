"""The ceiling: a bare grpc.aio server answering GetWorkspace with one fixed, pre-serialized
GetWorkspaceResponse from memory. No parsing, no store, no rendering: the most this Python
gRPC stack can do on this machine. Run: python -m bench.ceiling --port P --payload FILE."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE = "kibo.ctrl.v1.WorkspaceService"


async def serve(port: int, payload: bytes) -> None:
    async def get_workspace(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return payload

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"GetWorkspace": grpc.unary_unary_rpc_method_handler(get_workspace)}
    )
    server.add_generic_rpc_handlers([handler])
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--payload", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.payload.read_bytes()))


if __name__ == "__main__":
    main()
