"""The node link over gRPC (kibo.node.v1.NodeService): the agent side of a node agent on
another host (`kibo-ctrl node`). Implements engine/node_link.py's `ControlPlaneLink`.

A call that cannot reach the control plane, or that it cannot take now (UNAVAILABLE,
DEADLINE_EXCEEDED, a dropped stream, RESOURCE_EXHAUSTED), raises `LinkDown`: the agent
retries it. Any other refusal is a `KiboError` with the server's words (a bug, or a token
that may not act as this node).

The target may name several control-plane replicas (`HOST:PORT,HOST:PORT`): every replica
serves the node API, so after a call that could not get through the link moves on to the
next one (the agent rejoins there, and its feed resumes or starts from a snapshot)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from kibo.node.v1 import node_service_pb2 as node_pb2
from kibo.node.v1 import node_service_pb2_grpc as node_grpc

from ..api.node_api import decode, encode, render_disk, render_resources
from ..domain.errors import Conflict, InvalidArgument, KiboError, NotFound, PermissionDenied, Unauthenticated
from ..domain.model import Instance
from ..domain.nodes import DiskStatus
from ..domain.reports import Report, StorageReleased
from ..engine.node_link import (
    Batch,
    Cursor,
    Declaration,
    InstanceWork,
    Joined,
    LinkDown,
    StorageWork,
    VolumeWork,
    Work,
)
from ..runtime.base import LaunchSpec

PASSING_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)
_REFUSALS: dict[grpc.StatusCode, type[KiboError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}
CALL_TIMEOUT_S = 30.0


def _error(error: grpc.aio.AioRpcError) -> Exception:
    code = error.code()
    if code in PASSING_CODES:
        return LinkDown(f"{code.name}: {error.details()}")
    return _REFUSALS.get(code, KiboError)(f"the control plane refused: {code.name}: {error.details()}")


def targets(control_plane: str) -> list[str]:
    """The replicas a `--control-plane` value names (comma-separated HOST:PORT)."""
    return [target.strip() for target in control_plane.split(",") if target.strip()]


# Opens the channel to one replica (a HOST:PORT of --control-plane): over mutual TLS, the node's
# identity dials that replica's node port (transport/node_identity.py NodeIdentity.dial).
Dial = Callable[[str], Awaitable[grpc.aio.Channel]]


class GrpcLink:
    def __init__(
        self, target: str, node_id: str, token: str = "", credentials: Any = None, dial: Dial | None = None
    ) -> None:
        self._targets = targets(target)
        if not self._targets:
            raise ValueError("--control-plane names no HOST:PORT")
        self._credentials = credentials
        self._dial = dial
        # Each replica's channel, opened at its first call (and again after `redial`).
        self._channels: list[grpc.aio.Channel | None] = [None] * len(self._targets)
        self._stubs: list[Any] = [None] * len(self._targets)
        self._current = 0
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.node_id = node_id

    async def _open(self, target: str) -> grpc.aio.Channel:
        if self._dial is not None:
            return await self._dial(target)
        options = [("grpc.max_receive_message_length", 4 * 1024 * 1024), ("grpc.keepalive_time_ms", 10_000)]
        if self._credentials is None:
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, self._credentials, options=options)

    async def _stub(self) -> Any:
        index = self._current
        if self._stubs[index] is None:
            try:
                channel = await self._open(self._targets[index])
            except grpc.aio.AioRpcError as error:
                raise self._failed(error) from None
            self._channels[index] = channel
            self._stubs[index] = node_grpc.NodeServiceStub(channel)  # type: ignore[no-untyped-call]
        return self._stubs[index]

    async def channel(self) -> grpc.aio.Channel:
        """The current replica's channel (the node's certificate renewal goes over it)."""
        await self._stub()
        channel = self._channels[self._current]
        assert channel is not None
        return channel

    def redial(self) -> list[grpc.aio.Channel]:
        """Forget the channels (new calls dial again, e.g. with a renewed certificate); the old
        ones, for the caller to close once their calls are done."""
        old = [channel for channel in self._channels if channel is not None]
        self._channels = [None] * len(self._targets)
        self._stubs = [None] * len(self._targets)
        return old

    def _failed(self, error: grpc.aio.AioRpcError) -> Exception:
        """The error to raise; a call that did not get through moves on to the next replica."""
        failure = _error(error)
        if isinstance(failure, LinkDown):
            self._current = (self._current + 1) % len(self._stubs)
        return failure

    async def close(self) -> None:
        for channel in self.redial():
            await channel.close()

    async def _call(self, method_name: str, request: Any) -> Any:
        method = getattr(await self._stub(), method_name)
        try:
            return await method(request, metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise self._failed(error) from None

    async def join(self, declaration: Declaration) -> Joined:
        node = declaration.node
        request = node_pb2.JoinRequest(
            node_id=node.id,
            vcpus=node.vcpus,
            memory_mib=node.memory_mib,
            storage_pool=node.storage_pool,
            labels=declaration.labels,
            capabilities=declaration.capabilities,
            data_plane_address=declaration.data_plane_address,
            data_plane_token=declaration.data_plane_token,
            resources=render_resources(declaration.resources),
            disk=render_disk(declaration.disk),
        )
        response = await self._call("Join", request)
        return Joined(response.node_id, response.lease_seconds)

    async def work(self, cursor: Cursor | None) -> AsyncIterator[Batch]:
        request = node_pb2.WatchStepsRequest(node_id=self.node_id)
        if cursor is not None:
            request.resume_after.CopyFrom(node_pb2.Cursor(epoch=cursor.epoch, seq=cursor.seq))
        call = (await self._stub()).WatchSteps(request, metadata=self._metadata)
        try:
            async for response in call:
                yield _batch(response)
        except grpc.aio.AioRpcError as error:
            raise self._failed(error) from None
        finally:
            call.cancel()
        # A replica that shuts down ends its feeds: carry on at the next one.
        self._current = (self._current + 1) % len(self._stubs)
        raise LinkDown("the control plane ended the feed")

    async def launch_spec(self, instance_id: str, step: int) -> LaunchSpec:
        request = node_pb2.GetLaunchSpecRequest(node_id=self.node_id, instance_id=instance_id, step=step)
        response = await self._call("GetLaunchSpec", request)
        return decode(response.spec, LaunchSpec, "spec")

    async def report(self, report: Report) -> None:
        await self._call("Report", _report_request(report, self.node_id))

    async def report_batch(self, reports: Sequence[Report]) -> None:
        request = node_pb2.ReportBatchRequest(node_id=self.node_id, reports=[_report_request(r) for r in reports])
        await self._call("ReportBatch", request)

    async def storage_released(self, report: StorageReleased) -> None:
        request = node_pb2.ReportStorageReleasedRequest(
            node_id=self.node_id, workspace_id=report.workspace_id, volume_ids=report.volume_ids
        )
        await self._call("ReportStorageReleased", request)

    async def volume_released(self, volume_id: str) -> None:
        request = node_pb2.ReportVolumeReleasedRequest(node_id=self.node_id, volume_id=volume_id)
        await self._call("ReportVolumeReleased", request)

    async def renew(self, disk: DiskStatus | None = None) -> None:
        request = node_pb2.RenewLeaseRequest(node_id=self.node_id)
        if disk is not None:
            request.disk.CopyFrom(render_disk(disk))
        await self._call("RenewLease", request)


def _batch(response: node_pb2.WatchStepsResponse) -> Batch:
    items: list[Work] = []
    for item in response.items:
        which = item.WhichOneof("item")
        if which == "instance":
            instance = decode(item.instance.record, Instance, "record")
            if instance.id != item.instance.instance_id or instance.step != item.instance.step:
                raise LinkDown("a feed item's record differs from its instance and step: skipped, resuming")
            items.append(InstanceWork(instance))
        elif which == "storage":
            items.append(StorageWork(item.storage.workspace_id, tuple(item.storage.volume_ids)))
        elif which == "volume":
            items.append(VolumeWork(item.volume.volume_id))
    return Batch(tuple(items), Cursor(response.cursor.epoch, response.cursor.seq), response.snapshot)


def _report_request(report: Report, node_id: str = "") -> node_pb2.ReportRequest:
    return node_pb2.ReportRequest(
        node_id=node_id,
        instance_id=report.instance_id,
        step=report.step or 0,
        kind=type(report).__name__,
        body=encode(report),
    )
