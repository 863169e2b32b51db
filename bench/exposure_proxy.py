"""The exposure listener's cost (issue 28): a download and small requests through
transport/exposure_proxy.py against the same local server directly, in the same run.

    python -m bench.exposure_proxy [--guest] [--mib 100] [--rounds 5] [--requests 500]

With --guest, the whole path: the backend in a workspace of a `kibo-ctrl serve` (process
runtime, as root), direct to the guest's own address vs through its public exposure (the
listener, the store's route, the connection made in the guest's namespace).

Otherwise three processes on this host: a backend HTTP/1.1 server (GET /big answers --mib MiB, GET /
answers 2 bytes), the proxy (a router whose target opens a TCP connection to the backend: the
guest hop itself is not measured here), and a blocking client (this process). Throughput: each
round downloads /big directly and through the proxy (the order alternating), the median of
the rounds for each and their ratio (the issue asks >= 0.5). Latency: --requests small GETs,
each on a new connection, directly and through the proxy (interleaved), p50 of each and the
added p50 (the issue asks <= 1 ms)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import statistics
import subprocess
import sys
import time

from kibo_ctrl.transport.exposure_proxy import CHUNK, ExposureLimits, ExposureProxy, ExposureTarget, UpstreamStream

from bench.server import free_port

MIB = 1 << 20
HOST = "3000-ws-bench.localhost"

BACKEND = """
import asyncio, sys
SIZE = int(sys.argv[1])
BLOCK = b"x" * (1 << 20)
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\\r\\n\\r\\n")
            if head.startswith(b"GET /big "):
                writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % SIZE)
                left = SIZE
                while left:
                    part = BLOCK[: min(left, len(BLOCK))]
                    writer.write(part)
                    left -= len(part)
                    await writer.drain()
            else:
                writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
async def main():
    host, port = (sys.argv[2], int(sys.argv[3])) if len(sys.argv) > 3 else ("127.0.0.1", 0)
    server = await asyncio.start_server(serve, host, port)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


class _Upstream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self) -> bytes:
        return await self._reader.read(CHUNK)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def write_eof(self) -> None:
        if not self._writer.is_closing():
            self._writer.write_eof()

    async def close(self) -> None:
        self._writer.close()


class _Router:
    def __init__(self, port: int) -> None:
        self._port = port
        self._revoked = asyncio.Event()

    async def route(self, host: str, token: str | None) -> ExposureTarget:
        return ExposureTarget("ws-bench", 3000, host, self._open, self._revoked)

    async def _open(self) -> UpstreamStream:
        reader, writer = await asyncio.open_connection("127.0.0.1", self._port, limit=CHUNK)
        return _Upstream(reader, writer)


def _download(port: int, size: int, address: str = "127.0.0.1", host: str = HOST) -> float:
    """Seconds to GET /big and read all of it."""
    start = time.perf_counter()
    with socket.create_connection((address, port)) as sock:
        sock.sendall(f"GET /big HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        buffer = bytearray(1 << 20)
        view = memoryview(buffer)
        received = 0
        head_done = False
        while True:
            count = sock.recv_into(view)
            if not count:
                raise RuntimeError("closed early")
            if not head_done:
                end = bytes(buffer[:count]).find(b"\r\n\r\n")
                if end < 0:
                    raise RuntimeError("head not in the first read")
                head_done = True
                received += count - end - 4
            else:
                received += count
            if received >= size:
                break
    return time.perf_counter() - start


def _small(port: int, address: str = "127.0.0.1", host: str = HOST) -> float:
    """Seconds from connect to the end of a 2-byte response, on a new connection."""
    start = time.perf_counter()
    with socket.create_connection((address, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while not data.endswith(b"ok"):
            more = sock.recv(4096)
            if not more:
                raise RuntimeError("closed early")
            data += more
    return time.perf_counter() - start


async def _serve_proxy(backend_port: int) -> None:
    """The proxy's process: prints its port, serves until killed."""
    proxy = ExposureProxy(_Router(backend_port), "127.0.0.1:0", None, ExposureLimits())
    await proxy.start()
    print(proxy.port, flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument(
        "--guest",
        action="store_true",
        help="the whole path instead: the server in a workspace of a kibo-ctrl serve (process runtime, as root), "
        "direct to the guest's address vs its exposure's URL",
    )
    parser.add_argument("--serve-proxy", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        asyncio.run(_serve_proxy(args.serve_proxy))
        return
    if args.guest:
        _guest(args)
        return
    size = args.mib * MIB
    children: list[subprocess.Popen[str]] = []
    try:
        backend = subprocess.Popen([sys.executable, "-c", BACKEND, str(size)], stdout=subprocess.PIPE, text=True)
        children.append(backend)
        assert backend.stdout is not None
        direct = int(backend.stdout.readline())
        proxy = subprocess.Popen(
            [sys.executable, "-m", "bench.exposure_proxy", "--serve-proxy", str(direct)],
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(proxy)
        assert proxy.stdout is not None
        proxied = int(proxy.stdout.readline())
        _download(direct, size), _download(proxied, size)  # warm-up
        times: dict[str, list[float]] = {"direct": [], "proxy": []}
        for round_ in range(args.rounds):
            order = [("direct", direct), ("proxy", proxied)]
            for name, port in order if round_ % 2 == 0 else order[::-1]:
                times[name].append(_download(port, size))
        rates = {name: size / MIB / statistics.median(seconds) for name, seconds in times.items()}
        latency: dict[str, list[float]] = {"direct": [], "proxy": []}
        for _ in range(args.requests):
            latency["direct"].append(_small(direct))
            latency["proxy"].append(_small(proxied))
        p50 = {name: statistics.median(values) * 1000 for name, values in latency.items()}
        print(
            f"download {args.mib} MiB, median of {args.rounds}: direct {rates['direct']:.0f} MiB/s, "
            f"proxy {rates['proxy']:.0f} MiB/s, ratio {rates['proxy'] / rates['direct']:.2f} (asked >= 0.5)"
        )
        print(
            f"small GET on a new connection, p50 of {args.requests}: direct {p50['direct']:.3f} ms, "
            f"proxy {p50['proxy']:.3f} ms, added {p50['proxy'] - p50['direct']:.3f} ms (asked <= 1 ms)"
        )
    finally:
        for child in children:
            child.kill()
            child.wait()


def _measure(args: argparse.Namespace, direct: tuple[str, int, str], proxied: tuple[str, int, str]) -> None:
    """The rounds of both figures, direct vs through the proxy: (address, port, Host) each."""
    size = args.mib * MIB

    def download(target: tuple[str, int, str]) -> float:
        return _download(target[1], size, target[0], target[2])

    download(direct), download(proxied)  # warm-up
    times: dict[str, list[float]] = {"direct": [], "proxy": []}
    for round_ in range(args.rounds):
        order = [("direct", direct), ("proxy", proxied)]
        for name, target in order if round_ % 2 == 0 else order[::-1]:
            times[name].append(download(target))
    rates = {name: size / MIB / statistics.median(seconds) for name, seconds in times.items()}
    latency: dict[str, list[float]] = {"direct": [], "proxy": []}
    for _ in range(args.requests):
        latency["direct"].append(_small(direct[1], direct[0], direct[2]))
        latency["proxy"].append(_small(proxied[1], proxied[0], proxied[2]))
    p50 = {name: statistics.median(values) * 1000 for name, values in latency.items()}
    print(
        f"download {args.mib} MiB, median of {args.rounds}: direct {rates['direct']:.0f} MiB/s, "
        f"proxy {rates['proxy']:.0f} MiB/s, ratio {rates['proxy'] / rates['direct']:.2f} (asked >= 0.5)"
    )
    print(
        f"small GET on a new connection, p50 of {args.requests}: direct {p50['direct']:.3f} ms, "
        f"proxy {p50['proxy']:.3f} ms, added {p50['proxy'] - p50['direct']:.3f} ms (asked <= 1 ms)"
    )


def _guest(args: argparse.Namespace) -> None:
    """The backend in a guest: direct is the guest's own address (its veth, from the host),
    proxied is its public exposure through `kibo-ctrl serve`'s exposure listener."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    import kibotos
    from kibo.ctrl.v1 import workspace_pb2

    from tests.system.test_process_runtime import reap

    base = Path(tempfile.mkdtemp(prefix="kibo-bench-exposure-"))
    address, exposures = f"127.0.0.1:{free_port()}", free_port()
    serve = [sys.executable, "-m", "kibo_ctrl", "serve", "--listen", address, "--http-listen", ""]
    serve += ["--node-listen", "127.0.0.1:0", "--exposure-listen", f"127.0.0.1:{exposures}", "--insecure-no-auth"]
    serve += ["--runtime", "process", "--sandbox", "bwrap", "--data-dir", str(base / "data"), "--log-level", "warning"]
    with open(base / "server.log", "ab") as log:
        server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
            spec = workspace_pb2.WorkspaceSpec(resources=workspace_pb2.Resources(vcpus=2, memory_mib=512))
            workspace_id = client.create_workspace(spec).workspace.workspace_id
            while client.get_workspace(workspace_id).state != workspace_pb2.WORKSPACE_STATE_AVAILABLE:
                time.sleep(0.01)
            credential = client.issue_data_plane_credential(workspace_id).credential
            client.write_workspace_file(credential, "/data/backend.py", BACKEND.encode())
            port = 8000
            script = f"setsid python3 /data/backend.py {args.mib * MIB} 0.0.0.0 {port} </dev/null >/dev/null 2>&1 &"
            client.exec_workspace_command(credential, ["sh", "-c", script])
            exposure = client.create_workspace_exposure(workspace_id, port, public=True).exposure
            spec_file = next((base / "data" / "instances").glob(f"{workspace_id}-*/spec.json"))
            netns = str(json.loads(spec_file.read_text())["netns"]).rsplit("/", 1)[-1]
            shown = subprocess.run(
                ["ip", "-n", netns, "-4", "-o", "addr", "show", "eth0"], capture_output=True, text=True, check=True
            )
            guest = shown.stdout.split()[3].split("/")[0]
            host = exposure.url.split("//", 1)[1].split(":", 1)[0]
            deadline = time.monotonic() + 20
            while True:
                try:
                    _small(port, guest, host)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            print(f"the backend in workspace {workspace_id} at {guest}:{port}; its exposure {exposure.url}")
            _measure(args, (guest, port, host), ("127.0.0.1", exposures, host))
            client.delete_workspace(workspace_id)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
        from kibo_ctrl.runtime.process import network

        reap(base / "data")
        network.reap(base / "data")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
