"""kibo.node.v1.NodeGuestService, transport-free: served by a node agent (`kibo-ctrl node`,
process runtime) to the control plane only. The data plane's last hop: the control plane
has checked the client's data-plane credential (api/data_plane.py, as for its own node),
and runs the job here with the secret this node made for its join (`guest_authenticator`)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2

from ..domain.access import Caller, Role, TokenRecord
from ..domain.errors import InvalidArgument
from ..runtime.base import Exit, GuestAccess, GuestPorts, GuestRefused, GuestStream, Output
from .auth import Authenticator, PeerRule, token_hash

MAX_JOB_BYTES = 64 * 1024
# OpenGuestPort: a data frame's bytes at most, how long the first frame may take, and the
# longest instance ID (the node's are far shorter: longer is refused before any lookup).
MAX_PORT_DATA = 64 * 1024
FIRST_FRAME_S = 10.0
MAX_INSTANCE_ID = 256


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
        # The process runtime also opens guests' ports (exposures); another runtime refuses.
        self._ports = guests if isinstance(guests, GuestPorts) else None

    async def run_guest_job(
        self, request: guest_pb2.RunGuestJobRequest, caller: Caller
    ) -> AsyncGenerator[guest_pb2.RunGuestJobResponse, None]:
        if len(request.job) > MAX_JOB_BYTES:
            raise InvalidArgument(f"job: at most {MAX_JOB_BYTES} bytes", field="job")
        try:
            job = msgspec.json.decode(request.job, type=dict[str, Any])
        except (msgspec.ValidationError, msgspec.DecodeError) as error:
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
    return guest_pb2.OpenGuestPortResponse(
        refused=guest_pb2.GuestRefusal(status=refused.status, message=str(refused), errno=refused.errno)
    )
