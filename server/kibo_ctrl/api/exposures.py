"""Exposures: URLs to a TCP port in a running guest (issue 28), transport-free.

An exposure lives in its workspace's record (domain/model.py `Exposure`), bound to the
execution generation and data-plane revision it was made in, as a data-plane credential is:
the commit of a stop, force stop, revoke, delete or new start ends it (engine/steps.py
`revoke_credentials`), and the guest's exit ends it (the workspace leaves AVAILABLE).

Its URL is host-based, `{port}-{workspace_id}.{domain}`, so a web app's absolute paths work;
the exposure listener (transport/exposure_proxy.py, its own port: a guest's pages never share
an origin or a listener with the API) asks `route` for each new client connection. `route`
reads the store (any replica can serve any exposure), checks the token and answers how to open
the guest's port: on this process's node, or through the node's guest hop. Each answered
route carries an event that `on_changes` (a hub listener) sets when a commit ends the
exposure, or a timer at its expiry: the listener then cuts the connection, WebSockets
included, as soon as this replica sees the commit."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import workspace_pb2
from kibo.ctrl.v1 import workspace_service_pb2 as ws_pb2

from ..domain import validation
from ..domain.access import Caller
from ..domain.errors import Conflict, KiboError, NotFound, PermissionDenied, Unauthenticated, Unavailable
from ..domain.model import Command, Exposure, ExposureAccess, Phase, Workspace, WorkspaceState
from ..engine.service import CommandRequest
from ..runtime.base import GuestAccess, GuestPorts, GuestStream
from ..store.base import Changes, Reader, Store

# A host's first label: "{port}-{workspace ID}" (ws- and 20 hex digits: 30 characters at most).
MAX_LABEL_CHARS = 63


@dataclass(frozen=True)
class ExposureSettings:
    """How exposure URLs look: `{scheme}://{port}-{workspace}.{domain}[:{listen_port}]/`."""

    domain: str = "localhost"
    scheme: str = "http"
    # The exposure listener's port as clients reach it; 0 (or the scheme's default): not shown.
    listen_port: int = 0

    def url(self, workspace_id: str, port: int) -> str:
        default = {"http": 80, "https": 443}.get(self.scheme)
        shown = f":{self.listen_port}" if self.listen_port and self.listen_port != default else ""
        return f"{self.scheme}://{port}-{workspace_id}.{self.domain}{shown}/"


class Gone(Conflict):
    """The workspace is not running: its exposures ended (HTTP 410)."""


@dataclass(frozen=True)
class Route:
    """What a client connection to an exposure reaches: `open` makes the guest connection;
    `revoked` is set when the exposure ends (the connection is then cut)."""

    workspace_id: str
    port: int
    open: Callable[[], Awaitable[GuestStream]]
    revoked: asyncio.Event


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_host(host: str, domain: str) -> tuple[int, str] | None:
    """(port, workspace ID) of `{port}-{workspace}.{domain}[:port]`, or None. Bounded, no regex."""
    if len(host) > 300:
        return None
    name = host.lower()
    if name.startswith("["):
        return None
    name = name.rsplit(":", 1)[0] if ":" in name else name
    suffix = f".{domain.lower()}"
    if not name.endswith(suffix):
        return None
    label = name[: -len(suffix)]
    if not label or "." in label or len(label) > MAX_LABEL_CHARS:
        return None
    port_text, sep, workspace_id = label.partition("-")
    if not sep or not port_text.isdigit() or len(port_text) > 5 or not workspace_id.startswith("ws-"):
        return None
    port = int(port_text)
    if not 1 <= port <= 65535:
        return None
    try:
        validation.resource_id(workspace_id, "host", "ws-")
    except KiboError:
        return None
    return port, workspace_id


class Exposures:
    def __init__(self, store: Store, guests: Mapping[str, GuestAccess], settings: ExposureSettings) -> None:
        self._store = store
        self._guests = guests
        self.settings = settings
        # By workspace: the revocation events of the routes answered (held by their open
        # connections: an entry goes when its connection does), each with its exposure's ID.
        self._open: dict[str, weakref.WeakKeyDictionary[asyncio.Event, str]] = {}

    # -- the API -------------------------------------------------------------------------------

    def render(self, workspace: Workspace, exposure: Exposure, token: str = "") -> workspace_pb2.Exposure:
        created = Timestamp()
        created.FromNanoseconds(int(exposure.create_time * 1e9))
        message = workspace_pb2.Exposure(
            exposure_id=exposure.id,
            workspace_id=workspace.id,
            port=exposure.port,
            access=f"EXPOSURE_ACCESS_{exposure.access.name}",
            url=self.settings.url(workspace.id, exposure.port),
            token=token,
            create_time=created,
            execution_generation=exposure.generation,
            command_id=exposure.command_id,
        )
        if exposure.expire_time is not None:
            message.expire_time.FromNanoseconds(int(exposure.expire_time * 1e9))
        return message

    def answer(self, workspace: Workspace, command: Command, request: CommandRequest) -> dict[str, Message]:
        """CreateWorkspaceExposure's `exposure`: the one its command made, with the token only
        when this very request made it (a resend's token is another, never stored)."""
        for exposure in workspace.exposures:
            if exposure.command_id == command.id:
                mine = bool(request.exposure_token) and hmac.compare_digest(
                    exposure.token_sha256, token_digest(request.exposure_token)
                )
                return {"exposure": self.render(workspace, exposure, request.exposure_token if mine else "")}
        return {}

    async def list_workspace_exposures(
        self, request: ws_pb2.ListWorkspaceExposuresRequest, caller: Caller
    ) -> ws_pb2.ListWorkspaceExposuresResponse:
        caller.require_admin("ListWorkspaceExposures")
        workspace_id = validation.resource_id(request.workspace_id, "workspace_id", "ws-")
        workspace = await self._store.read(lambda r: r.get_workspace(workspace_id))
        if workspace is None or workspace.tenant != caller.tenant:
            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")
        return ws_pb2.ListWorkspaceExposuresResponse(
            exposures=[self.render(workspace, e) for e in workspace.valid_exposures(time.time())]
        )

    # -- the listener's questions --------------------------------------------------------------

    async def route(self, host: str, token: str | None) -> Route:
        """Where a request to `host` goes, or the error its client gets: NotFound (no such
        exposure), Gone (the workspace is not running), Unauthenticated (no token),
        PermissionDenied (a wrong token), Unavailable (the guest is restarting)."""
        parsed = parse_host(host, self.settings.domain)
        if parsed is None:
            raise NotFound(f"no exposure at {host[:100]!r}: exposure URLs look like {self.settings.url('ws-...', 0)}")
        port, workspace_id = parsed

        def load(reader: Reader) -> tuple[Workspace | None, object]:
            workspace = reader.get_workspace(workspace_id)
            instance = reader.get_instance(workspace.instance_id) if workspace and workspace.instance_id else None
            return workspace, instance

        workspace, instance = await self._store.read(load)
        if workspace is None or workspace.deleted:
            raise NotFound(f"no exposure of port {port} of {workspace_id}")
        if workspace.state is not WorkspaceState.AVAILABLE or workspace.deletion_started:
            state = "being deleted" if workspace.deletion_started else workspace.state.name
            raise Gone(
                f"workspace {workspace_id} is {state}: its exposures ended; create a new one after its next start"
            )
        exposure = next((e for e in workspace.valid_exposures(time.time()) if e.port == port), None)
        if exposure is None:
            raise NotFound(f"port {port} of {workspace_id} is not exposed")
        if exposure.access is ExposureAccess.TOKEN:
            if not token:
                raise Unauthenticated(
                    "this exposure needs its token: the X-Kibo-Exposure-Token header, or ?kibo_token=... once"
                )
            if not hmac.compare_digest(exposure.token_sha256, token_digest(token)):
                raise PermissionDenied("this token does not open this exposure")
        runtime = self._guests.get(workspace.node_id or "")
        running = getattr(instance, "phase", None) is Phase.RUNNING and workspace.guest.responding
        if not isinstance(runtime, GuestPorts) or not running:
            raise Unavailable(f"the guest of {workspace_id} is not answering (restarting?): retry")
        instance_id = workspace.instance_id or ""
        revoked = asyncio.Event()
        self._open.setdefault(workspace_id, weakref.WeakKeyDictionary())[revoked] = exposure.id
        if exposure.expire_time is not None:
            asyncio.get_running_loop().call_at(
                asyncio.get_running_loop().time() + max(0.0, exposure.expire_time - time.time()), revoked.set
            )

        async def open_port() -> GuestStream:
            return await runtime.open_guest_port(instance_id, port)

        return Route(workspace_id, port, open_port, revoked)

    def on_changes(self, changes: Changes) -> None:
        """A hub listener: the routes whose exposure a commit ended are revoked now."""
        now = time.time()
        for workspace in changes.workspaces.values():
            routes = self._open.get(workspace.id)
            if routes is None:
                continue
            valid = {e.id for e in workspace.valid_exposures(now)}
            for event, exposure_id in list(routes.items()):
                if exposure_id not in valid:
                    event.set()
            if not valid or not routes:
                # Nothing open can be valid again: an exposure that ended never comes back.
                for event in list(routes.keys()):
                    event.set()
                del self._open[workspace.id]

    def open_routes(self) -> int:
        """Connections answered and not yet ended or revoked (a gauge, for tests and metrics)."""
        return sum(len(r) for r in self._open.values())
