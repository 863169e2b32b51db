"""The data plane's hop to a remote node's guests, on the control plane: `GuestAccess`
over gRPC (kibo.node.v1.NodeGuestService, served by `kibo-ctrl node`), and the map by node
ID that api/data_plane.py reads (the local node's runtime, else the node's declared hop)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from kibo.node.v1 import node_guest_service_pb2 as guest_pb2
from kibo.node.v1 import node_guest_service_pb2_grpc as guest_grpc

from ..api.node_api import encode
from ..engine import pki
from ..runtime.base import Exit, GuestAccess, GuestRefused, JobStopped, Output

PathRule = Callable[[str, list[str]], object]
Endpoints = Callable[[str], tuple[str, str] | None]


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
    """A remote node's guests: each job is one RunGuestJob call (over mutual TLS, unless the
    node link is plaintext: --insecure-node-link)."""

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

    def __iter__(self) -> Iterator[str]:
        return iter(self._local)

    def __len__(self) -> int:
        return len(self._local)

    async def close(self) -> None:
        for _, remote in self._remote.values():
            with contextlib.suppress(Exception):
                await remote.close()
