"""The ceiling: a bare grpc.aio server answering GetWorkspace with one fixed, pre-serialized
GetWorkspaceResponse from memory. No parsing, no store, no rendering: the most this Python
gRPC stack can do on this machine. Run: python -m bench.ceiling --port P --payload FILE.

It also serves the floor of the watch fan-out: WatchWorkspace streams that get each change
as one message serialized once and handed to every stream's queue, and a made-up method
(`BURST`, not part of kibo's API) that emits `n` such changes back to back, as a command's
few stored changes do."""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from kibo.ctrl.v1 import workspace_service_pb2 as ws

SERVICE = "kibo.ctrl.v1.WorkspaceService"
BURST_SERVICE = "kibo.bench.v1.Ceiling"
# Request: 4 bytes, big-endian count of changes; response: 8 bytes, the last etag.
BURST = f"/{BURST_SERVICE}/Burst"


class Changes:
    """The watched workspace (one, whatever ID is asked for) and every open stream's queue."""

    def __init__(self, payload: bytes) -> None:
        self.workspace = ws.GetWorkspaceResponse.FromString(payload).workspace
        self.etag = int(self.workspace.etag or 0)
        self.streams: set[asyncio.Queue[bytes]] = set()

    def snapshot(self) -> bytes:
        self.workspace.etag = str(self.etag)
        stamp = Timestamp()
        stamp.FromNanoseconds(time.time_ns())
        self.workspace.update_time.CopyFrom(stamp)
        return ws.WatchWorkspaceResponse(workspace=self.workspace).SerializeToString()

    def burst(self, count: int) -> int:
        for _ in range(count):
            self.etag += 1
            message = self.snapshot()  # once per change, shared by every stream
            for queue in self.streams:
                queue.put_nowait(message)
        return self.etag


async def serve(port: int, payload: bytes) -> None:
    changes = Changes(payload)

    async def get_workspace(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return payload

    async def watch_workspace(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        changes.streams.add(queue)
        try:
            yield changes.snapshot()
            while True:
                yield await queue.get()
        finally:
            changes.streams.discard(queue)

    async def burst(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        (count,) = struct.unpack(">I", raw)
        return struct.pack(">Q", changes.burst(count))

    server = grpc.aio.server(options=[("grpc.server.max_pending_requests", 20_000)])
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetWorkspace": grpc.unary_unary_rpc_method_handler(get_workspace),
            "WatchWorkspace": grpc.unary_stream_rpc_method_handler(watch_workspace),
        },
    )
    bench = grpc.method_handlers_generic_handler(BURST_SERVICE, {"Burst": grpc.unary_unary_rpc_method_handler(burst)})
    server.add_generic_rpc_handlers([handler, bench])
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
