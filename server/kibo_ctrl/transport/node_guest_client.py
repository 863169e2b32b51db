"""The data plane's hop to a remote node's guests, on the control plane: `GuestAccess`,
`GuestPorts` and `GuestProcesses` over gRPC (kibo.node.v1.NodeGuestService, served by
`kibo-ctrl node`), and the map by node ID that api/data_plane.py reads (the local node's
runtime, else the node's declared hop)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import msgspec
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2
from kibo.node.v1 import node_guest_service_pb2_grpc as guest_grpc

from ..api.node_api import encode
from ..api.node_guest_api import (
    EndArguments,
    FollowSelection,
    InputArguments,
    ListArguments,
    Received,
    ResizeArguments,
    SignalArguments,
    StartArguments,
)
from ..domain.errors import Unimplemented
from ..engine import pki
from ..runtime.base import (
    Dropped,
    Exit,
    GuestAccess,
    GuestPorts,
    GuestProcesses,
    GuestRefused,
    GuestStream,
    JobStopped,
    Output,
    ProcessInfo,
    ProcessSpec,
    Replayed,
    Selector,
)

T = TypeVar("T")
PathRule = Callable[[str, list[str]], object]
Endpoints = Callable[[str], tuple[str, str] | None]
# A data frame's bytes at most (OpenGuestPort), as the node takes them.
PORT_CHUNK = 64 * 1024
# How long a guest-process operation that does not wait on the guest (list, signal, resize,
# end) may take: a node that does not answer must not hold a revoke's `end` for good. A
# start and an input wait as long as the guest makes them (a stdin it does not read).
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class GuestTls:
    """The control plane's identity on the guest hop (SECURITY.md: the node link): the cluster
    CA's certificate and key, which it presents, and the root it checks each node against."""

    ca_pem: bytes
    key_pem: bytes

    def channel(self, address: str, node_id: str) -> grpc.aio.Channel:
        """A channel to `node_id`'s hop that takes only that node's certificate: the CA must
        have signed it for the node's name (pki.node_name), so another node's cannot stand in."""
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.ca_pem
        )
        options = [("grpc.ssl_target_name_override", pki.node_name(node_id))]
        return grpc.aio.secure_channel(address, credentials, options=options)


class RemoteGuests:
    """A remote node's guests: each job is one RunGuestJob call, each connection to a guest's
    port one OpenGuestPort call, each operation on its guest processes one CallGuestProcesses
    call and each follower one FollowGuestProcess call (over mutual TLS, unless the node link
    is plaintext: --insecure-node-link)."""

    def __init__(
        self, address: str, secret: str, check_path: PathRule, tls: GuestTls | None = None, node_id: str = ""
    ) -> None:
        self.address = address
        self._channel = grpc.aio.insecure_channel(address) if tls is None else tls.channel(address, node_id)
        self._stub = guest_grpc.NodeGuestServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {secret}"),)
        self._check_path = check_path

    async def close(self) -> None:
        await self._channel.close()

    def guest_ready(self, instance_id: str) -> bool:
        # The node answers for its guests: one that is not ready refuses the job ("unavailable").
        return True

    def check_file_path(self, path: str, mounts: list[str]) -> None:
        self._check_path(path, mounts)

    async def guest_job(
        self,
        instance_id: str,
        job: dict[str, Any],
        stdin: bytes = b"",
        seconds: float = 0.0,
        stop: asyncio.Event | None = None,
    ) -> AsyncGenerator[Output | Exit, None]:
        request = guest_pb2.RunGuestJobRequest(
            instance_id=instance_id, job=encode(job), stdin=stdin, timeout_seconds=seconds
        )
        call = self._stub.RunGuestJob(request, metadata=self._metadata)
        stopper = asyncio.create_task(_cancel_on(stop, call)) if stop is not None else None
        try:
            async for response in call:
                which = response.WhichOneof("event")
                if which == "output":
                    yield Output(response.output.stream, response.output.data)
                elif which == "exit":
                    yield Exit(response.exit.code)
                elif which == "refused":
                    refused = response.refused
                    raise GuestRefused(refused.status, refused.message, refused.errno)
        except asyncio.CancelledError:
            if stop is not None and stop.is_set():
                raise JobStopped() from None
            raise
        except grpc.aio.AioRpcError as error:
            raise GuestRefused(
                "unavailable", f"the node's data plane did not answer ({error.code().name}): retry"
            ) from None
        finally:
            if stopper is not None:
                stopper.cancel()
            call.cancel()
        if stop is not None and stop.is_set():
            raise JobStopped()

    async def open_guest_port(self, instance_id: str, port: int) -> GuestStream:
        """A TCP connection to `port` in the guest, made by the node (one OpenGuestPort call);
        GuestRefused as the node's runtime refuses, "unavailable" if the node does not answer."""
        call = self._stub.OpenGuestPort(metadata=self._metadata)
        try:
            await call.write(
                guest_pb2.OpenGuestPortRequest(open=guest_pb2.GuestPortOpen(instance_id=instance_id, port=port))
            )
            first = await call.read()
        except grpc.aio.AioRpcError as error:
            call.cancel()
            raise _unanswered(error) from None
        except BaseException:
            call.cancel()
            raise
        which = None if first is grpc.aio.EOF else first.WhichOneof("frame")
        if which == "opened":
            return RemoteGuestStream(call)
        call.cancel()
        if which == "refused":
            raise GuestRefused(first.refused.status, first.refused.message, first.refused.errno)
        raise GuestRefused("unavailable", "the node ended the connection before it was opened")

    # -- guest processes (runtime.base.GuestProcesses), kept by the node ------------------------

    async def start_guest_process(self, instance_id: str, spec: ProcessSpec) -> ProcessInfo:
        arguments = StartArguments(
            argv=list(spec.argv),
            env=dict(spec.env),
            cwd=spec.cwd,
            user=spec.user,
            tag=spec.tag,
            pty=spec.pty,
            close_stdin=spec.close_stdin,
            owner=spec.owner,
            job=None if spec.job is None else dict(spec.job),
        )
        answer = await self._processes(instance_id, "start", arguments, spec.stdin, waits=True)
        return _answer(answer, ProcessInfo)

    async def list_guest_processes(self, instance_id: str) -> list[ProcessInfo]:
        return _answer(await self._processes(instance_id, "list", ListArguments()), list[ProcessInfo])

    async def follow_guest_process(
        self,
        instance_id: str,
        selector: Selector,
        replay: bool = False,
        stop: asyncio.Event | None = None,
        hold: bool = False,
    ) -> AsyncGenerator[Output | Dropped | Replayed | Exit, None]:
        """One FollowGuestProcess call; closing this generator (or `stop`) cancels it, which
        closes the node's follower and leaves the process running. With `hold`, the node's
        follower is the one the process's output waits for, and it waits on this call's flow
        control: a consumer that stops reading stops the guest's output, end to end."""
        selection = FollowSelection(*_selection(selector), hold=hold)
        request = guest_pb2.FollowGuestProcessRequest(
            instance_id=instance_id, selector=encode(selection), replay=replay
        )
        call = self._stub.FollowGuestProcess(request, metadata=self._metadata)
        stopper = asyncio.create_task(_cancel_on(stop, call)) if stop is not None else None
        try:
            async for response in call:
                which = response.WhichOneof("event")
                if which == "output":
                    yield Output(response.output.stream, response.output.data)
                elif which == "dropped":
                    yield Dropped(response.dropped)
                elif which == "replayed":
                    yield Replayed()
                elif which == "exit":
                    yield Exit(response.exit.code)
                elif which == "refused":
                    refused = response.refused
                    raise GuestRefused(refused.status, refused.message, refused.errno)
        except asyncio.CancelledError:
            if stop is not None and stop.is_set():
                raise JobStopped() from None
            raise
        except grpc.aio.AioRpcError as error:
            raise _process_error(error) from None
        finally:
            if stopper is not None:
                stopper.cancel()
            call.cancel()  # at once, not at garbage collection: the node's follower is closed
        if stop is not None and stop.is_set():
            raise JobStopped()

    async def send_guest_process_input(
        self, instance_id: str, selector: Selector, data: bytes, close: bool = False, offset: int | None = None
    ) -> int:
        arguments = InputArguments(*_selection(selector), close=close, offset=offset)
        answer = await self._processes(instance_id, "input", arguments, data, waits=True)
        return _answer(answer, Received).received

    async def signal_guest_process(self, instance_id: str, selector: Selector, signum: int) -> None:
        await self._processes(instance_id, "signal", SignalArguments(*_selection(selector), signal=signum))

    async def resize_guest_process(self, instance_id: str, selector: Selector, rows: int, cols: int) -> None:
        arguments = ResizeArguments(*_selection(selector), rows=rows, cols=cols)
        await self._processes(instance_id, "resize", arguments)

    async def end_guest_processes(self, instance_id: str, keep_owner: int | None = None) -> None:
        await self._processes(instance_id, "end", EndArguments(keep_owner=keep_owner))

    async def _processes(
        self, instance_id: str, operation: str, arguments: object, data: bytes = b"", waits: bool = False
    ) -> bytes:
        """One CallGuestProcesses call: its answer's JSON; GuestRefused as the node refused.
        `waits`: the operation waits on the guest (no deadline), else CALL_TIMEOUT_S."""
        request = guest_pb2.CallGuestProcessesRequest(
            instance_id=instance_id, operation=operation, arguments=encode(arguments), data=data
        )
        try:
            response = await self._stub.CallGuestProcesses(
                request, metadata=self._metadata, timeout=None if waits else CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise _process_error(error) from None
        if response.WhichOneof("outcome") == "refused":
            refused = response.refused
            raise GuestRefused(refused.status, refused.message, refused.errno)
        return bytes(response.result)


def _selection(selector: Selector) -> tuple[int | None, str | None]:
    """A selector as the wire's (pid, tag): one of them."""
    return (None, selector) if isinstance(selector, str) else (selector, None)


def _answer(raw: bytes, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise GuestRefused("error", f"the node's answer cannot be read as {kind}: {error}") from None


def _process_error(error: grpc.aio.AioRpcError) -> GuestRefused | Unimplemented:
    """Why a guest-process call failed on the hop itself: a node whose agent keeps no guest
    processes (an older one) cannot, arguments it refused are the caller's, a message past
    the hop's 4 MiB (a request, or an answer) is no use retrying, anything else is the node
    not answering (retry)."""
    if error.code() is grpc.StatusCode.UNIMPLEMENTED:
        return Unimplemented("the workspace's node keeps no guest processes (its agent is older: upgrade it)")
    if error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return GuestRefused("error", f"larger than the node's hop carries: {error.details()}")
    return _unanswered(error)


class RemoteGuestStream:
    """A GuestStream over one OpenGuestPort call: data frames of at most 64 KiB each way,
    gRPC's flow control for back-pressure; `close` cancels the call, which cuts the node's
    connection to the guest."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._eof = False
        self._sent_eof = False

    async def read(self) -> bytes:
        while not self._eof:
            try:
                frame = await self._call.read()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                frame = grpc.aio.EOF  # the call ended (cut, or cancelled by close)
            if frame is grpc.aio.EOF or frame.WhichOneof("frame") != "data":
                self._eof = True
            elif frame.data:
                return bytes(frame.data)
        return b""

    async def write(self, data: bytes) -> None:
        if self._sent_eof or self._call.done():
            raise ConnectionResetError("the connection to the guest is closed")
        view = memoryview(data)
        try:
            for offset in range(0, len(view), PORT_CHUNK):
                await self._call.write(guest_pb2.OpenGuestPortRequest(data=bytes(view[offset : offset + PORT_CHUNK])))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            raise ConnectionResetError("the connection to the guest is closed") from None

    async def write_eof(self) -> None:
        if self._sent_eof or self._call.done():
            return
        self._sent_eof = True
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._call.write(guest_pb2.OpenGuestPortRequest(eof=guest_pb2.GuestPortEof()))
            await self._call.done_writing()

    async def close(self) -> None:
        self._eof = self._sent_eof = True
        self._call.cancel()


def _unanswered(error: grpc.aio.AioRpcError) -> GuestRefused:
    """Why an OpenGuestPort call failed before its connection was made."""
    if error.code() is grpc.StatusCode.INVALID_ARGUMENT:
        return GuestRefused("invalid", error.details() or "refused by the node")
    return GuestRefused("unavailable", f"the node's data plane did not answer ({error.code().name}): retry")


async def _cancel_on(stop: asyncio.Event, call: Any) -> None:
    await stop.wait()
    call.cancel()


class NodeGuests(Mapping[str, GuestAccess]):
    """By node ID: the guests the data plane can reach. The embedded node's runtime, else a
    remote node's hop as it declared at its last join (a node that rejoins with a new secret
    or address gets a new connection)."""

    def __init__(
        self, local: Mapping[str, GuestAccess], endpoints: Endpoints, check_path: PathRule, tls: GuestTls | None = None
    ) -> None:
        self._tls = tls
        self._local = dict(local)
        self._endpoints = endpoints
        self._check_path = check_path
        self._remote: dict[str, tuple[tuple[str, str], RemoteGuests]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __getitem__(self, node_id: str) -> GuestAccess:
        local = self._local.get(node_id)
        if local is not None:
            return local
        endpoint = self._endpoints(node_id)
        if endpoint is None:
            raise KeyError(node_id)
        known = self._remote.get(node_id)
        if known is not None and known[0] == endpoint:
            return known[1]
        if known is not None:
            task = asyncio.get_running_loop().create_task(known[1].close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        remote = RemoteGuests(endpoint[0], endpoint[1], self._check_path, self._tls, node_id)
        self._remote[node_id] = (endpoint, remote)
        return remote

    def ports(self, node_id: str) -> GuestPorts:
        """`node_id`'s guests' ports (exposures): KeyError for a node with no data plane, or
        whose runtime opens none (the simulator)."""
        guests = self[node_id]
        if not isinstance(guests, GuestPorts):
            raise KeyError(node_id)
        return guests

    def processes(self, node_id: str) -> GuestProcesses:
        """`node_id`'s guest processes: KeyError for a node with no data plane, or whose
        runtime keeps none (the simulator). A remote node's are its hop's (RemoteGuests)."""
        guests = self[node_id]
        if not isinstance(guests, GuestProcesses):
            raise KeyError(node_id)
        return guests

    def __iter__(self) -> Iterator[str]:
        return iter(self._local)

    def __len__(self) -> int:
        return len(self._local)

    async def close(self) -> None:
        for _, remote in self._remote.values():
            with contextlib.suppress(Exception):
                await remote.close()
