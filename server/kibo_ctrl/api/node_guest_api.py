"""kibo.node.v1.NodeGuestService, transport-free: served by a node agent (`kibo-ctrl node`,
process runtime) to the control plane only. The data plane's last hop: the control plane
has checked the client's data-plane credential (api/data_plane.py, as for its own node),
and runs the job here with the secret this node made for its join (`guest_authenticator`).

The guest processes (CallGuestProcesses, FollowGuestProcess) carry their arguments as JSON:
the structs below are that wire, decoded with msgspec into exactly these types and bounds
(transport/node_guest_client.py encodes them), so whatever a caller sends is refused as
INVALID_ARGUMENT before the runtime sees it."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, TypeVar

import msgspec
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2

from ..domain.access import Caller, Role, TokenRecord
from ..domain.errors import InvalidArgument, Unimplemented
from ..runtime.base import (
    Dropped,
    Exit,
    GuestAccess,
    GuestPorts,
    GuestProcesses,
    GuestRefused,
    GuestStream,
    Output,
    ProcessSpec,
    Replayed,
    Selector,
)
from .auth import Authenticator, PeerRule, token_hash

MAX_JOB_BYTES = 64 * 1024
# OpenGuestPort: a data frame's bytes at most, how long the first frame may take, and the
# longest instance ID (the node's are far shorter: longer is refused before any lookup).
MAX_PORT_DATA = 64 * 1024
FIRST_FRAME_S = 10.0
MAX_INSTANCE_ID = 256
# Guest processes: an operation's arguments as JSON (a start's argv and env take up to 1 MiB
# in the public API, api/data_plane_processes.py: twice that leaves room for JSON's escapes of
# ordinary text), a selector's, and an operation's bytes (an upload's part, 2 MiB, is the
# largest input the public API takes; a start's stdin and an input's are 1 MiB). A start's
# arguments and stdin together stay under the node's 4 MiB message.
MAX_ARGUMENTS_BYTES = 2 << 20
MAX_SELECTOR_BYTES = 4096
MAX_DATA_BYTES = 2 << 20
# An output frame on FollowGuestProcess at most (well under gRPC's 4 MiB message).
MAX_OUTPUT_FRAME = 256 * 1024
# A tag at most (the public API's rule is stricter), a pid of the guest's PID namespace.
MAX_TAG = 256
MAX_PID = 2**31 - 1
MAX_SIGNAL = 64
# A terminal's rows and columns (struct winsize's unsigned short).
MAX_PTY_SIDE = 65535

T = TypeVar("T")
Pid = Annotated[int, msgspec.Meta(ge=1, le=MAX_PID)]
Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TAG)]
PtySide = Annotated[int, msgspec.Meta(ge=1, le=MAX_PTY_SIDE)]
Revision = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


# -- the guest processes' wire (JSON objects; unknown fields refused) -----------------------------


class StartArguments(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """`start`: a ProcessSpec without its stdin (the request's `data`)."""

    argv: list[str] = []
    env: dict[str, str] = {}
    cwd: str = "/"
    user: str = ""
    tag: Annotated[str, msgspec.Meta(max_length=MAX_TAG)] = ""
    pty: tuple[PtySide, PtySide] | None = None
    close_stdin: bool = False
    owner: Revision = 0
    job: dict[str, Any] | None = None

    def spec(self, stdin: bytes) -> ProcessSpec:
        if bool(self.argv) == (self.job is not None):
            raise InvalidArgument("arguments: a command (argv) or an upload's job, exactly one", field="arguments")
        texts = [*self.argv, *self.env, *self.env.values(), self.cwd, self.user, self.tag]
        if any("\0" in text for text in texts):
            raise InvalidArgument("arguments: no NUL in argv, env, cwd, user or tag", field="arguments")
        return ProcessSpec(
            argv=tuple(self.argv),
            env=self.env,
            cwd=self.cwd,
            user=self.user,
            tag=self.tag,
            pty=self.pty,
            stdin=stdin,
            close_stdin=self.close_stdin,
            owner=self.owner,
            job=self.job,
        )


class Selection(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A process: {"pid": N} or {"tag": "..."}."""

    pid: Pid | None = None
    tag: Tag | None = None

    def selector(self) -> Selector:
        if (self.pid is None) == (self.tag is None):
            raise InvalidArgument("a process by pid or by tag, exactly one", field="selector")
        return self.pid if self.pid is not None else str(self.tag)


class FollowSelection(Selection, forbid_unknown_fields=True, omit_defaults=True):
    """FollowGuestProcessRequest.selector; `hold`: the process's output waits for this
    follower (a foreground start's: gRPC's flow control then carries the back-pressure)."""

    hold: bool = False


class ListArguments(msgspec.Struct, forbid_unknown_fields=True):
    pass


class InputArguments(Selection, forbid_unknown_fields=True, omit_defaults=True):
    close: bool = False
    offset: Revision | None = None


class SignalArguments(Selection, forbid_unknown_fields=True, omit_defaults=True):
    signal: Annotated[int, msgspec.Meta(ge=1, le=MAX_SIGNAL)] = 15


class ResizeArguments(Selection, forbid_unknown_fields=True, omit_defaults=True):
    rows: PtySide = 24
    cols: PtySide = 80


class EndArguments(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    keep_owner: Revision | None = None


class Received(msgspec.Struct):
    """`input`'s answer: the input bytes taken so far."""

    received: int


class Done(msgspec.Struct):
    """The answer of `signal`, `resize` and `end`: {}."""


def _arguments(raw: bytes, kind: type[T], field: str) -> T:
    try:
        return msgspec.json.decode(raw or b"{}", type=kind)
    # RecursionError: JSON nested deeper than msgspec follows (`job` is free-form).
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as error:
        raise InvalidArgument(f"{field}: {error}", field=field) from None


def _instance_id(instance_id: str) -> str:
    if not instance_id or len(instance_id) > MAX_INSTANCE_ID:
        raise InvalidArgument(f"instance_id: 1 to {MAX_INSTANCE_ID} characters", field="instance_id")
    return instance_id


async def _start(processes: GuestProcesses, instance_id: str, raw: bytes, data: bytes) -> object:
    spec = _arguments(raw, StartArguments, "arguments").spec(data)
    return await processes.start_guest_process(instance_id, spec)


async def _list(processes: GuestProcesses, instance_id: str, raw: bytes, data: bytes) -> object:
    _arguments(raw, ListArguments, "arguments")
    return await processes.list_guest_processes(instance_id)


async def _input(processes: GuestProcesses, instance_id: str, raw: bytes, data: bytes) -> object:
    arguments = _arguments(raw, InputArguments, "arguments")
    selector = arguments.selector()
    received = await processes.send_guest_process_input(instance_id, selector, data, arguments.close, arguments.offset)
    return Received(received)


async def _signal(processes: GuestProcesses, instance_id: str, raw: bytes, data: bytes) -> object:
    arguments = _arguments(raw, SignalArguments, "arguments")
    await processes.signal_guest_process(instance_id, arguments.selector(), arguments.signal)
    return Done()


async def _resize(processes: GuestProcesses, instance_id: str, raw: bytes, data: bytes) -> object:
    arguments = _arguments(raw, ResizeArguments, "arguments")
    await processes.resize_guest_process(instance_id, arguments.selector(), arguments.rows, arguments.cols)
    return Done()


async def _end(processes: GuestProcesses, instance_id: str, raw: bytes, data: bytes) -> object:
    arguments = _arguments(raw, EndArguments, "arguments")
    await processes.end_guest_processes(instance_id, arguments.keep_owner)
    return Done()


Operation = Callable[[GuestProcesses, str, bytes, bytes], Awaitable[object]]
# Each operation: its handler, and whether it takes `data` (a start's stdin, an input's bytes).
OPERATIONS: dict[str, tuple[Operation, bool]] = {
    "start": (_start, True),
    "list": (_list, False),
    "input": (_input, True),
    "signal": (_signal, False),
    "resize": (_resize, False),
    "end": (_end, False),
}


def guest_authenticator(secret: str, peer: PeerRule | None = None) -> Authenticator:
    """Takes exactly one bearer token: the secret this node gave the control plane (and over
    mutual TLS, `peer`: node_certs.control_plane_peer, the control plane's certificate only)."""
    digest = token_hash(secret)
    record = TokenRecord(id="control-plane", tenant="control-plane", role=Role.OPERATOR, create_time=time.time())

    async def lookup(candidate: str) -> TokenRecord | None:
        return record if hmac.compare_digest(candidate, digest) else None

    return Authenticator(lookup, peer=peer)


class NodeGuestApi:
    def __init__(self, guests: GuestAccess) -> None:
        self._guests = guests
        # The process runtime also opens guests' ports (exposures) and keeps guest processes;
        # another runtime refuses.
        self._ports = guests if isinstance(guests, GuestPorts) else None
        self._processes = guests if isinstance(guests, GuestProcesses) else None

    async def run_guest_job(
        self, request: guest_pb2.RunGuestJobRequest, caller: Caller
    ) -> AsyncGenerator[guest_pb2.RunGuestJobResponse, None]:
        if len(request.job) > MAX_JOB_BYTES:
            raise InvalidArgument(f"job: at most {MAX_JOB_BYTES} bytes", field="job")
        try:
            job = msgspec.json.decode(request.job, type=dict[str, Any])
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as error:
            raise InvalidArgument(f"job: not a guest job object: {error}", field="job") from None
        if request.timeout_seconds < 0:
            raise InvalidArgument("timeout_seconds must not be negative", field="timeout_seconds")
        stop = asyncio.Event()
        items = self._guests.guest_job(request.instance_id, job, request.stdin, request.timeout_seconds, stop)
        try:
            async with contextlib.aclosing(items):
                async for item in items:
                    if isinstance(item, Output):
                        yield guest_pb2.RunGuestJobResponse(
                            output=guest_pb2.GuestOutput(stream=item.stream, data=item.data)
                        )
                    elif isinstance(item, Exit):
                        yield guest_pb2.RunGuestJobResponse(exit=guest_pb2.GuestExit(code=item.code))
        except GuestRefused as refused:
            yield guest_pb2.RunGuestJobResponse(
                refused=guest_pb2.GuestRefusal(status=refused.status, message=str(refused), errno=refused.errno)
            )
        finally:
            # The call ended early (the control plane cancelled it: its client left, or the
            # credential was revoked): the job is killed.
            stop.set()

    async def open_guest_port(
        self, frames: AsyncIterator[guest_pb2.OpenGuestPortRequest], caller: Caller
    ) -> AsyncGenerator[guest_pb2.OpenGuestPortResponse, None]:
        """One TCP connection into a guest (the proto's OpenGuestPort): `open` first, then
        `opened` or `refused`; data both ways, each side's `eof`; the call ends once both
        sides sent theirs, or at once when it is cancelled (the connection is cut)."""
        try:
            async with asyncio.timeout(FIRST_FRAME_S):
                first = await anext(frames, None)
        except TimeoutError:
            raise InvalidArgument(f"no open frame in {FIRST_FRAME_S:g} s", field="open") from None
        if first is None or first.WhichOneof("frame") != "open":
            raise InvalidArgument("the first frame must be open (instance_id, port)", field="open")
        instance_id, port = first.open.instance_id, first.open.port
        if not instance_id or len(instance_id) > MAX_INSTANCE_ID:
            raise InvalidArgument(f"open.instance_id: 1 to {MAX_INSTANCE_ID} characters", field="instance_id")
        if self._ports is None:
            refusal = GuestRefused("unavailable", "this node's runtime opens no guest ports")
            yield _refusal(refusal)
            return
        try:
            stream = await self._ports.open_guest_port(instance_id, port)
        except GuestRefused as refused:
            yield _refusal(refused)
            return
        pump = asyncio.create_task(_to_guest(frames, stream))
        try:
            yield guest_pb2.OpenGuestPortResponse(opened=guest_pb2.GuestPortOpened())
            while data := await stream.read():
                # A read may be larger than a frame (runtime/process/guest_access/ports.py CHUNK).
                for offset in range(0, len(data), MAX_PORT_DATA):
                    yield guest_pb2.OpenGuestPortResponse(data=data[offset : offset + MAX_PORT_DATA])
            yield guest_pb2.OpenGuestPortResponse(eof=guest_pb2.GuestPortEof())
            # The guest sent all it will: the call ends once the control plane has too.
            await pump
        finally:
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump
            await stream.close()

    def _guest_processes(self) -> GuestProcesses:
        if self._processes is None:
            raise Unimplemented("this node's runtime keeps no guest processes")
        return self._processes

    async def call_guest_processes(
        self, request: guest_pb2.CallGuestProcessesRequest, caller: Caller
    ) -> guest_pb2.CallGuestProcessesResponse:
        """One operation on the node's guest processes (the proto's CallGuestProcesses): its
        answer as JSON, or the runtime's refusal."""
        processes = self._guest_processes()
        instance_id = _instance_id(request.instance_id)
        if len(request.arguments) > MAX_ARGUMENTS_BYTES:
            raise InvalidArgument(f"arguments: at most {MAX_ARGUMENTS_BYTES} bytes", field="arguments")
        known = OPERATIONS.get(request.operation)
        if known is None:
            names = ", ".join(OPERATIONS)
            raise InvalidArgument(f"operation: one of {names}, not {request.operation[:40]!r}", field="operation")
        operation, takes_data = known
        if len(request.data) > (MAX_DATA_BYTES if takes_data else 0):
            limit = f"at most {MAX_DATA_BYTES} bytes" if takes_data else f"none for {request.operation}"
            raise InvalidArgument(f"data: {limit}", field="data")
        try:
            result = await operation(processes, instance_id, request.arguments, request.data)
        except GuestRefused as refused:
            return guest_pb2.CallGuestProcessesResponse(refused=_guest_refusal(refused))
        return guest_pb2.CallGuestProcessesResponse(result=msgspec.json.encode(result))

    async def follow_guest_process(
        self, request: guest_pb2.FollowGuestProcessRequest, caller: Caller
    ) -> AsyncGenerator[guest_pb2.FollowGuestProcessResponse, None]:
        """A process's output, then its exit (the proto's FollowGuestProcess). The call's
        end (the control plane cancelled it) closes the follower: the process runs on."""
        processes = self._guest_processes()
        instance_id = _instance_id(request.instance_id)
        if len(request.selector) > MAX_SELECTOR_BYTES:
            raise InvalidArgument(f"selector: at most {MAX_SELECTOR_BYTES} bytes", field="selector")
        selection = _arguments(request.selector, FollowSelection, "selector")
        items = processes.follow_guest_process(
            instance_id, selection.selector(), replay=request.replay, hold=selection.hold
        )
        try:
            async with contextlib.aclosing(items):
                async for item in items:
                    if isinstance(item, Output):
                        for offset in range(0, len(item.data), MAX_OUTPUT_FRAME):
                            data = item.data[offset : offset + MAX_OUTPUT_FRAME]
                            output = guest_pb2.GuestOutput(stream=item.stream, data=data)
                            yield guest_pb2.FollowGuestProcessResponse(output=output)
                    elif isinstance(item, Dropped):
                        yield guest_pb2.FollowGuestProcessResponse(dropped=item.count)
                    elif isinstance(item, Replayed):
                        yield guest_pb2.FollowGuestProcessResponse(replayed=True)
                    elif isinstance(item, Exit):
                        yield guest_pb2.FollowGuestProcessResponse(exit=guest_pb2.GuestExit(code=item.code))
        except GuestRefused as refused:
            yield guest_pb2.FollowGuestProcessResponse(refused=_guest_refusal(refused))


def _guest_refusal(refused: GuestRefused) -> guest_pb2.GuestRefusal:
    return guest_pb2.GuestRefusal(status=refused.status, message=str(refused), errno=refused.errno)


async def _to_guest(frames: AsyncIterator[guest_pb2.OpenGuestPortRequest], stream: GuestStream) -> None:
    """The control plane's frames to the guest until its eof (or the end of its frames); a
    frame that breaks the protocol, or a write the guest no longer takes, cuts the connection
    (the guest-to-client side then reads its end)."""
    try:
        async for frame in frames:
            which = frame.WhichOneof("frame")
            if which == "data" and len(frame.data) <= MAX_PORT_DATA:
                await stream.write(frame.data)
            elif which == "eof":
                break
            else:
                await stream.close()
                return
        await stream.write_eof()
    except (ConnectionError, InvalidArgument):
        await stream.close()


def _refusal(refused: GuestRefused) -> guest_pb2.OpenGuestPortResponse:
    return guest_pb2.OpenGuestPortResponse(refused=_guest_refusal(refused))
