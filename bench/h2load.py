"""A second opinion from a client no one here wrote: h2load (Debian's nghttp2-client)
driving gRPC with a pre-framed request body (5-byte gRPC prefix + message)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path


def available() -> str | None:
    return shutil.which("h2load")


def frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: no compression, 4-byte big-endian length."""
    return b"\0" + struct.pack(">I", len(message)) + message


@dataclass(frozen=True)
class H2Result:
    qps: float
    mean_ms: float
    succeeded: int
    failed: int


_FINISHED = re.compile(r"finished in [\d.]+\w+, ([\d.]+) req/s")
_REQUESTS = re.compile(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed")
_TIME = re.compile(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)")
_UNIT = {"us": 0.001, "ms": 1.0, "s": 1000.0}


GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")
CONNECT_HEADERS = ("content-type: application/proto",)


def run(
    address: str,
    path: str,
    body: Path,
    seconds: float,
    streams: int = 64,
    connections: int = 1,
    headers: tuple[str, ...] = GRPC_HEADERS,
    http1: bool = False,
) -> H2Result:
    """`streams` requests in flight over `connections` connections (HTTP/2, or HTTP/1.1 with
    one request in flight per connection) for `seconds`."""
    command = [
        "h2load",
        *(["--h1"] if http1 else []),
        "-c",
        str(connections),
        "-m",
        str(max(1, streams // connections)),
        "-t",
        "1",
        "-D",
        f"{round(seconds * 1000)}ms",
        "--warm-up-time",
        "500ms",
        "-d",
        str(body),
        *(arg for header in headers for arg in ("-H", header)),
        f"http://{address}{path}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
    out = done.stdout + done.stderr
    finished, requests, times = _FINISHED.search(out), _REQUESTS.search(out), _TIME.search(out)
    if finished is None or requests is None or times is None:
        raise RuntimeError(f"cannot read h2load's output:\n{out}")
    return H2Result(
        qps=float(finished[1]),
        mean_ms=float(times[5]) * _UNIT[times[6]],
        succeeded=int(requests[1]),
        failed=int(requests[2]),
    )
