"""The data plane people work in (issue 29): `python -m bench.data_plane [--size-mib N] [--rounds N]
[--keys N] [--starts N] [--json FILE]`.

Starts `kibo-ctrl serve --runtime process` (bubblewrap sandboxes, no auth) and, in the same run,
the ceiling: a bare grpc.aio server (`python -m bench.data_plane --ceiling`) that streams a host
file from the same disk as DownloadWorkspaceFile messages and writes WriteWorkspaceUpload parts to
one, with no credential, no guest and no store. Then, interleaved round by round (medians):

1. upload (2 MiB parts, one after another, as the SDK sends them) and download of a `--size-mib`
   file (default 256), over gRPC and over Connect (connectrpc's client on pyqwest, HTTP/1.1, no
   compression), each as a ratio to the ceiling's gRPC figure of the same round;
2. keystroke echo through a PTY: a process with a terminal in raw mode running `cat`; one byte
   sent with SendWorkspaceProcessInput, timed until its echo arrives on the Start stream (p50, p99
   of `--keys`, gRPC);
3. starting a background process (`true`, answered once it started) beside today's exec of
   `true` (answered once it ended), interleaved, p50 of `--starts` each.

The figures go to stdout (and `--json`). Everything it made is deleted at the end; it checks that
no guest process of its data directory remains. Needs root and bubblewrap."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pyqwest
from kibo.ctrl.v1 import data_plane_service_connect as dpc
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dpg
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.ctrl.v1 import workspace_service_pb2_grpc as wsg

from bench.server import free_port, wait_serving

PART = 2 << 20
# The ceiling's download message: the size of kibo's own (measured in the run, passed here).
DEFAULT_CHUNK = 256 << 10
OPTIONS = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]
GUEST_FILE = "/var/tmp/bench.bin"
# Processes of the run's data directory found (and killed) at its end: the bench then exits 1.
LEFT_BEHIND: dict[int, str] = {}


# -- the ceiling: a bare grpc.aio server --------------------------------------------------------


class _Ceiling(dpg.DataPlaneServiceServicer):
    def __init__(self, directory: Path, chunk: int) -> None:
        self._directory = directory
        self._chunk = chunk

    async def DownloadWorkspaceFile(
        self, request: dp.DownloadWorkspaceFileRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[dp.DownloadWorkspaceFileResponse]:
        path = self._directory / Path(request.path).name
        yield dp.DownloadWorkspaceFileResponse(info=dp.FileInfo(path=request.path, size=path.stat().st_size))
        with open(path, "rb", buffering=0) as f:  # noqa: ASYNC230 (a bench: blocking reads are what it times)
            while chunk := f.read(self._chunk):
                yield dp.DownloadWorkspaceFileResponse(data=chunk)

    async def StartWorkspaceUpload(
        self, request: dp.StartWorkspaceUploadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.StartWorkspaceUploadResponse:
        (self._directory / "upload.bin").write_bytes(b"")
        return dp.StartWorkspaceUploadResponse(upload_id="ceiling")

    async def WriteWorkspaceUpload(
        self, request: dp.WriteWorkspaceUploadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.WriteWorkspaceUploadResponse:
        with open(self._directory / "upload.bin", "ab", buffering=0) as f:  # noqa: ASYNC230 (a bench: blocking reads are what it times)
            f.write(request.data)
            size = f.tell()
        return dp.WriteWorkspaceUploadResponse(size=size, finished=request.finish)


async def _serve_ceiling(port: int, directory: Path, chunk: int) -> None:
    server = grpc.aio.server(options=OPTIONS)
    dpg.add_DataPlaneServiceServicer_to_server(_Ceiling(directory, chunk), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    await stopped.wait()
    await server.stop(0)


# -- the two sides, through the same client code ------------------------------------------------


class Side:
    """Upload and download through one transport: a grpc.aio stub or a Connect client."""

    def __init__(self, name: str, stub: Any, connect: bool) -> None:
        self.name = name
        self._stub = stub
        self._connect = connect

    async def _unary(self, rpc: str, request: Any) -> Any:
        if self._connect:
            return await getattr(self._stub, _snake(rpc))(request)
        return await getattr(self._stub, rpc)(request)

    def _stream(self, rpc: str, request: Any) -> AsyncIterator[Any]:
        if self._connect:
            return getattr(self._stub, _snake(rpc))(request)  # type: ignore[no-any-return]
        return getattr(self._stub, rpc)(request)  # type: ignore[no-any-return]

    async def upload(self, credential: str, source: Path, path: str) -> float:
        began = time.perf_counter()
        started = await self._unary(
            "StartWorkspaceUpload", dp.StartWorkspaceUploadRequest(credential=credential, path=path)
        )
        offset = 0
        size = source.stat().st_size  # noqa: ASYNC240
        with open(source, "rb", buffering=0) as f:  # noqa: ASYNC230 (a bench: blocking reads are what it times)
            while True:
                data = f.read(PART)
                finish = offset + len(data) >= size
                request = dp.WriteWorkspaceUploadRequest(
                    credential=credential, upload_id=started.upload_id, offset=offset, data=data, finish=finish
                )
                answer = await self._unary("WriteWorkspaceUpload", request)
                offset = answer.size
                if finish:
                    break
        return time.perf_counter() - began

    async def download(self, credential: str, path: str, expect: int) -> tuple[float, int]:
        """Seconds, and the median size of its data messages."""
        began = time.perf_counter()
        got = 0
        sizes: list[int] = []
        async for part in self._stream(
            "DownloadWorkspaceFile", dp.DownloadWorkspaceFileRequest(credential=credential, path=path)
        ):
            if part.WhichOneof("part") == "data":
                got += len(part.data)
                sizes.append(len(part.data))
        if got != expect:
            raise RuntimeError(f"{self.name}: downloaded {got} bytes of {expect}")
        return time.perf_counter() - began, int(statistics.median(sizes))


def _meta() -> wp.CommandMetadata:
    return wp.CommandMetadata(command_id=f"bench/{uuid.uuid4()}")


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


# -- PTY echo and process starts ------------------------------------------------------------------


async def pty_echo(data: dpg.DataPlaneServiceStub, credential: str, keys: int) -> list[float]:
    """Milliseconds from sending one byte to its echo, `keys` times."""
    start = dp.StartWorkspaceProcessRequest(
        credential=credential,
        shell="stty raw -echo; echo ready; exec cat",
        pty=dp.PtySize(rows=24, cols=80),
        tag="bench-echo",
    )
    stream = data.StartWorkspaceProcess(start)
    seen = b""
    while b"ready" not in seen:  # read() only: grpc.aio refuses a call read both ways
        event = await stream.read()
        if event is grpc.aio.EOF:
            raise RuntimeError("the echo process ended before it was ready")
        seen += event.pty
    times = []
    for i in range(keys):
        key = bytes([ord("a") + i % 26])
        began = time.perf_counter()
        await data.SendWorkspaceProcessInput(
            dp.SendWorkspaceProcessInputRequest(
                credential=credential, process=dp.ProcessSelector(tag="bench-echo"), data=key
            )
        )
        echoed = b""
        while key not in echoed:
            event = await stream.read()
            if event is grpc.aio.EOF:
                raise RuntimeError("the echo process ended")
            echoed += event.pty
        times.append((time.perf_counter() - began) * 1000)
    stream.cancel()
    return times


async def starts(data: dpg.DataPlaneServiceStub, credential: str, count: int) -> tuple[list[float], list[float]]:
    """Milliseconds: a background `true` answered as started, and an exec of `true`, interleaved."""
    background: list[float] = []
    execs: list[float] = []
    for _ in range(count):
        began = time.perf_counter()
        async for _event in data.StartWorkspaceProcess(
            dp.StartWorkspaceProcessRequest(credential=credential, argv=["true"], background=True)
        ):
            pass
        background.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        async for _event in data.ExecWorkspaceCommand(
            dp.ExecWorkspaceCommandRequest(credential=credential, argv=["true"])
        ):
            pass
        execs.append((time.perf_counter() - began) * 1000)
    return background, execs


# -- the run --------------------------------------------------------------------------------------


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def _make_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 4 << 20))
            f.write(block)
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    return ""


def _guest_processes(data_dir: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if str(data_dir).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


async def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    size = args.size_mib << 20
    source = scratch / "bench.bin"
    _make_file(source, size)
    data_dir = scratch / "data"
    port, http_port, ceiling_port = free_port(), free_port(), free_port()
    log = open(scratch / "server.log", "wb")  # noqa: SIM115, ASYNC230 (closed below)
    command = [
        sys.executable,
        "-m",
        "kibo_ctrl",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--node-listen",
        "127.0.0.1:0",
    ]
    command += ["--http-listen", f"127.0.0.1:{http_port}", "--data-dir", str(data_dir), "--runtime", "process"]
    command += ["--insecure-no-auth", "--log-level", "warning"]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # noqa: ASYNC220
    ceiling_dir = scratch / "ceiling"
    ceiling_dir.mkdir()
    shutil.copyfile(source, ceiling_dir / "bench.bin")
    ceiling: subprocess.Popen[bytes] | None = None
    workspace_id = ""
    try:
        wait_serving(f"127.0.0.1:{port}", 120, server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        workspaces = wsg.WorkspaceServiceStub(channel)  # type: ignore[no-untyped-call]
        data = dpg.DataPlaneServiceStub(channel)  # type: ignore[no-untyped-call]
        created = await workspaces.CreateWorkspace(
            ws.CreateWorkspaceRequest(
                metadata=_meta(), spec=wp.WorkspaceSpec(resources=wp.Resources(vcpus=1, memory_mib=512))
            )
        )
        workspace_id = created.workspace.workspace_id
        credential = await _credential(data, workspace_id)
        kibo = Side("kibo gRPC", data, connect=False)
        # One upload first: the file the downloads read, and kibo's message size for the ceiling's.
        await kibo.upload(credential, source, GUEST_FILE)
        _, chunk = await kibo.download(credential, GUEST_FILE, size)
        ceiling = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "bench.data_plane", "--ceiling", str(ceiling_port), str(ceiling_dir), str(chunk)],
            start_new_session=True,
        )
        wait_ceiling(f"127.0.0.1:{ceiling_port}", ceiling)
        ceiling_channel = grpc.aio.insecure_channel(f"127.0.0.1:{ceiling_port}", options=OPTIONS)
        bare = Side("ceiling gRPC", dpg.DataPlaneServiceStub(ceiling_channel), connect=False)  # type: ignore[no-untyped-call]
        http = pyqwest.Client(pyqwest.HTTPTransport())
        connect = Side(
            "kibo Connect",
            dpc.DataPlaneServiceClient(
                f"http://127.0.0.1:{http_port}", http_client=http, send_compression=None, accept_compression=()
            ),
            connect=True,
        )
        rounds: dict[str, list[float]] = {
            k: [] for k in ("up_ceiling", "up_grpc", "up_connect", "down_ceiling", "down_grpc", "down_connect")
        }
        for _ in range(args.rounds):
            rounds["up_ceiling"].append(size / await bare.upload("", source, "/bench.bin") / 2**20)
            rounds["up_grpc"].append(size / await kibo.upload(credential, source, GUEST_FILE) / 2**20)
            rounds["up_connect"].append(size / await connect.upload(credential, source, GUEST_FILE) / 2**20)
            rounds["down_ceiling"].append(size / (await bare.download("", "/bench.bin", size))[0] / 2**20)
            rounds["down_grpc"].append(size / (await kibo.download(credential, GUEST_FILE, size))[0] / 2**20)
            rounds["down_connect"].append(size / (await connect.download(credential, GUEST_FILE, size))[0] / 2**20)
        echo = await pty_echo(data, credential, args.keys)
        background, execs = await starts(data, credential, args.starts)
        await ceiling_channel.close()
        await channel.close()
        med = {k: statistics.median(v) for k, v in rounds.items()}
        return {
            "size_mib": args.size_mib,
            "rounds": args.rounds,
            "message_bytes": chunk,
            "mib_s": med,
            "ratios": {
                "upload_grpc": med["up_grpc"] / med["up_ceiling"],
                "upload_connect": med["up_connect"] / med["up_ceiling"],
                "download_grpc": med["down_grpc"] / med["down_ceiling"],
                "download_connect": med["down_connect"] / med["down_ceiling"],
            },
            "pty_echo_ms": {"p50": _percentile(echo, 50), "p99": _percentile(echo, 99), "keys": len(echo)},
            "start_ms": {
                "background_p50": statistics.median(background),
                "exec_p50": statistics.median(execs),
                "difference_p50": statistics.median(background) - statistics.median(execs),
            },
        }
    finally:
        if workspace_id:
            with contextlib.suppress(Exception):
                await _delete(port, workspace_id)
        for process in (ceiling, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        log.close()
        # The node supervisor exits once it holds nothing and its runtime is gone.
        deadline = time.monotonic() + 20
        while _guest_processes(data_dir) and time.monotonic() < deadline:  # noqa: ASYNC110 - a deadline
            await asyncio.sleep(0.1)
        left = {pid: _cmdline(pid) for pid in _guest_processes(data_dir)}
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if left:
            print(f"left behind (killed): {left}", file=sys.stderr)
            LEFT_BEHIND.update(left)


async def _credential(data: dpg.DataPlaneServiceStub, workspace_id: str) -> str:
    deadline = time.monotonic() + 120
    while True:
        try:
            issued = await data.IssueDataPlaneCredential(dp.IssueDataPlaneCredentialRequest(workspace_id=workspace_id))
            return str(issued.credential)
        except grpc.aio.AioRpcError as error:
            if (
                error.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)
                or time.monotonic() > deadline
            ):
                raise
            await asyncio.sleep(0.2)


async def _delete(port: int, workspace_id: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        workspaces = wsg.WorkspaceServiceStub(channel)  # type: ignore[no-untyped-call]
        await workspaces.DeleteWorkspace(ws.DeleteWorkspaceRequest(metadata=_meta(), workspace_id=workspace_id))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                got = await workspaces.GetWorkspace(ws.GetWorkspaceRequest(workspace_id=workspace_id))
            except grpc.aio.AioRpcError:
                return
            if got.workspace.state == wp.WORKSPACE_STATE_DELETED:
                return
            await asyncio.sleep(0.2)


def wait_ceiling(address: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the ceiling server exited")
        with grpc.insecure_channel(address) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=0.5)
                return
            except grpc.FutureTimeoutError:
                pass
    raise TimeoutError("the ceiling server did not start")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--ceiling":
        asyncio.run(_serve_ceiling(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kibo-bench-dp-") as scratch:
        figures = asyncio.run(run(args, Path(scratch)))
    mib, ratios = figures["mib_s"], figures["ratios"]
    print(f"file {args.size_mib} MiB, {args.rounds} rounds, medians in MiB/s (kibo's download messages:", end=" ")
    print(f"{figures['message_bytes']} bytes)")
    for way, key in (("upload", "up"), ("download", "down")):
        print(
            f"  {way}: ceiling {mib[key + '_ceiling']:.0f}, gRPC {mib[key + '_grpc']:.0f}"
            f" ({ratios[way + '_grpc']:.2f}x), Connect {mib[key + '_connect']:.0f} ({ratios[way + '_connect']:.2f}x)"
        )
    echo = figures["pty_echo_ms"]
    print(f"PTY keystroke echo ({echo['keys']} keys): p50 {echo['p50']:.2f} ms, p99 {echo['p99']:.2f} ms")
    start = figures["start_ms"]
    print(
        f"start, p50: background process {start['background_p50']:.2f} ms, exec of `true`"
        f" {start['exec_p50']:.2f} ms ({start['difference_p50']:+.2f} ms)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if LEFT_BEHIND:
        sys.exit(1)


if __name__ == "__main__":
    main()
