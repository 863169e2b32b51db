"""kibo.node.v1.NodeGuestService, transport-free: served by a node agent (`kibo-ctrl node`,
process runtime) to the control plane only. The data plane's last hop: the control plane
has checked the client's data-plane credential (api/data_plane.py, as for its own node),
and runs the job here with the secret this node made for its join (`guest_authenticator`)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2

from ..domain.access import Caller, Role, TokenRecord
from ..domain.errors import InvalidArgument
from ..runtime.base import Exit, GuestAccess, GuestRefused, Output
from .auth import Authenticator, PeerRule, token_hash

MAX_JOB_BYTES = 64 * 1024


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
