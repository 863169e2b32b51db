"""The API, transport-free: parse the wire request, call the domain, render the answer.

gRPC and Connect both call these methods, so every rule, check and error exists once."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from google.protobuf.message import Message
from kibo.ctrl.v1 import (
    observation_service_pb2 as obs_pb2,
)
from kibo.ctrl.v1 import (
    volume_service_pb2 as vol_pb2,
)
from kibo.ctrl.v1 import (
    workspace_service_pb2 as ws_pb2,
)

from ..domain import cleanup, validation
from ..domain.access import Caller
from ..domain.errors import InvalidArgument, NotFound, Unavailable, Unimplemented
from ..domain.model import Command, Instance, Workspace
from ..engine.hub import Hub, Signal
from ..engine.service import CommandRequest, Service
from ..runtime.base import MachineObserver
from ..store.base import Changes, ListedWorkspace, Reader, Store, WorkspaceQuery, WorkspaceSlice
from . import parse, render
from .commands import VolumeCommand, WorkspaceCommand, respond
from .exposures import Exposures
from .fairness import WATCHES_PER_TENANT, TenantSlots, TenantStreams

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)

# The encoded workspaces GetWorkspace, ListWorkspaces and WatchWorkspace remember (bytes of
# protobuf, about 400 each; the budget counts each entry's overhead too): a list at any depth
# of a store this size (~120,000 workspaces) costs what a list of a small one does. Past it,
# a miss renders (~30 µs). (32 MiB held ~60,000: List(100) at 100,000 stored was 1.66x the
# 1,000 figure, bench/run; the memory is taken only as workspaces are read.)
ENCODED_BUDGET_BYTES = 64 * 1024 * 1024
ENCODED_ENTRY_OVERHEAD = 160  # a dict slot, a tuple, a bytes header, the key
# The WatchWorkspace messages (one per watched workspace), and how many workspace records
# GetWorkspace and WatchWorkspace can answer from memory.
WATCHED_WORKSPACES = 4096
LATEST_WORKSPACES = 4096


@dataclass(frozen=True)
class ListCost:
    """What one ListWorkspaces may cost, in term evaluations (rows scanned x (1 + terms))."""

    # One read on the store's scan thread: short, so other lists and checkpoints go between.
    slice: int = 4096
    # One request: past it the page ends short, with a page token to go on from.
    request: int = 200_000
    # Lists a tenant may run at once; its further lists wait for one of its own slots.
    per_tenant: int = 2


LIST_COST = ListCost()
# Room in a response for what is not a workspace (the page token, framing).
PAGE_HEADROOM_BYTES = 16 * 1024


class Api:
    def __init__(
        self,
        store: Store,
        hub: Hub,
        service: Service,
        capabilities: list[str],
        settle_seconds: float,
        observer: MachineObserver | None = None,
        max_message_bytes: int = 4 * 1024 * 1024,
        watches_per_tenant: int = WATCHES_PER_TENANT,
    ) -> None:
        self._store = store
        # A page must fit in one message (gRPC refuses larger ones): lists cut pages by size.
        self._page_bytes = max_message_bytes - PAGE_HEADROOM_BYTES
        self._list_slots = TenantSlots(LIST_COST.per_tenant)
        # Open WatchWorkspace and WatchEvents streams per tenant: past the cap RESOURCE_EXHAUSTED
        # (fairness.py).
        self.watch_streams = TenantStreams(
            watches_per_tenant, "WatchEvents and WatchWorkspace streams", "watch_streams"
        )
        # ListEvents and WatchEvents (imported here: api/events.py reads this module's page tokens).
        from .events import EventsApi

        self.events = EventsApi(store, hub, self.watch_streams)
        # The runtime that can read the cleanup status off this machine (none in the simulator).
        self._observer = observer
        self._hub = hub
        self._service = service
        self._capabilities = sorted(set(capabilities))
        self._settle = settle_seconds
        # Least recently used first: a list's pages and a Get's workspaces stay while they are read.
        self._encoded: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._encoded_bytes = 0
        self._watch_encoded: dict[str, tuple[int, render.Encoded[ws_pb2.WatchWorkspaceResponse]]] = {}
        self._latest: dict[str, Workspace] = {}
        # URLs to guest ports (api/exposures.py): set by the app, which makes them over the
        # data plane's hops; None: none (ListWorkspaceExposures answers an empty list).
        self.exposures: Exposures | None = None
        hub.listen(self._on_changes)

    def _encode(self, workspace: Workspace) -> bytes:
        """render.workspace's encoding, remembered by (ID, version): a version is one stored
        state of the workspace, so its encoding never changes. Gets, lists and every watcher
        of a change share it. The tenant check is the caller's, on the record, before this."""
        remembered = self._remembered(workspace.id, workspace.version)
        if remembered is not None:
            return remembered
        data = render.workspace(workspace).SerializeToString()
        cached = self._encoded.pop(workspace.id, None)  # re-inserted below: the newest entry
        if cached is not None:
            self._encoded_bytes -= len(cached[1]) + ENCODED_ENTRY_OVERHEAD
        self._encoded[workspace.id] = (workspace.version, data)
        self._encoded_bytes += len(data) + ENCODED_ENTRY_OVERHEAD
        while self._encoded_bytes > ENCODED_BUDGET_BYTES and len(self._encoded) > 1:
            _, (_, oldest) = self._encoded.popitem(last=False)  # the least recently used
            self._encoded_bytes -= len(oldest) + ENCODED_ENTRY_OVERHEAD
        return data

    def _encode_listed(self, listed: ListedWorkspace) -> bytes:
        """As _encode, for a row a list scanned: the record is decoded only on a miss."""
        remembered = self._remembered(listed.id, listed.version)
        return remembered if remembered is not None else self._encode(listed.record())

    def _remembered(self, workspace_id: str, version: int) -> bytes | None:
        """The remembered encoding of this stored version, now the most recently used."""
        cached = self._encoded.get(workspace_id)
        if cached is None or cached[0] != version:
            return None
        self._encoded.move_to_end(workspace_id)
        return cached[1]

    def _watch_response(self, workspace: Workspace) -> render.Encoded[ws_pb2.WatchWorkspaceResponse]:
        """The WatchWorkspace message of one stored version, made once: every stream of the
        workspace sends the same bytes (remembered by ID and version, as _encode)."""
        cached = self._watch_encoded.get(workspace.id)
        if cached is not None and cached[0] == workspace.version:
            return cached[1]
        encoded = render.Encoded(render.field_bytes(1, self._encode(workspace)), ws_pb2.WatchWorkspaceResponse)
        if cached is None and len(self._watch_encoded) >= WATCHED_WORKSPACES:
            del self._watch_encoded[next(iter(self._watch_encoded))]  # the oldest entry
        self._watch_encoded[workspace.id] = (workspace.version, encoded)
        return encoded

    # -- commands (declared in api/commands.py) ---------------------------------------

    def workspace_command(self, command: WorkspaceCommand[Req, Resp]) -> Callable[[Req, Caller], Awaitable[Resp]]:
        """The RPC handler of a registry entry (api/commands.py) for a workspace command."""

        async def handle(message: Req, caller: Caller) -> Resp:
            request = self._parse(caller, command, message)
            workspace, done = await self._command(request, command)
            fields: dict[str, Message] = {"workspace": render.workspace(workspace), "command": render.command(done)}
            if command.rpc == "CreateWorkspaceExposure" and self.exposures is not None:
                # Its exposure, with the token when this very request made it.
                fields.update(self.exposures.answer(workspace, done, request))
            return respond(command.response, **fields)

        return handle

    def volume_command(self, command: VolumeCommand[Req, Resp]) -> Callable[[Req, Caller], Awaitable[Resp]]:
        """The RPC handler of a registry entry for a volume command (it takes effect at once)."""

        async def handle(message: Req, caller: Caller) -> Resp:
            request = self._parse(caller, command, message)
            volume = await self._store.transact(self._service.execute, command.handle, request)
            return respond(command.response, volume=render.volume(volume))

        return handle

    @staticmethod
    def _parse(
        caller: Caller, entry: WorkspaceCommand[Req, Resp] | VolumeCommand[Req, Resp], message: Req
    ) -> CommandRequest:
        # Permission before anything else (AIP-193), then every field, then reserved prefixes.
        caller.require_admin(entry.rpc)
        if isinstance(entry, WorkspaceCommand) and entry.operator:
            caller.require_operator(entry.rpc)
        request = replace(entry.parse(message), tenant=caller.tenant)
        assert request.kind in entry.kinds, (entry.rpc, request.kind)  # a parser that drifted from its entry
        validation.command_id(request.command_id)
        return request

    async def _command(self, request: CommandRequest, entry: WorkspaceCommand[Req, Resp]) -> tuple[Workspace, Command]:
        workspace, command = await self._store.transact(self._service.execute, entry.handle, request)
        if command.terminal or self._settle <= 0 or not entry.settles:
            return workspace, command
        done = self._hub.command_done(command.key)
        try:
            latest = None
            if not done.done() and self._store.published_mark() is None:
                # What is stored may not be published yet (another replica's commit, or one of
                # this store's in flight): the command may have finished already.
                latest = await self._store.read(lambda r: r.get_command(command.tenant, command.id))
            if not done.done() and not (latest is not None and latest.terminal):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(done), self._settle)
        finally:
            self._hub.forget(command.key, done)
        if done.done() and not done.cancelled():
            finished = done.result()
            # The commit that finished the command, as published: no read on the answer's path
            # when the store vouches that what it published is what it stores.
            if finished.workspace is not None and self._store.published_mark() is not None:
                return finished.workspace, finished.command

        def both(reader: Reader) -> tuple[Workspace, Command]:
            ws, cmd = reader.get_workspace(workspace.id), reader.get_command(command.tenant, command.id)
            assert ws is not None and cmd is not None
            return ws, cmd

        return await self._store.read(both)

    # -- queries -----------------------------------------------------------------------

    async def list_workspace_exposures(
        self, request: ws_pb2.ListWorkspaceExposuresRequest, caller: Caller
    ) -> ws_pb2.ListWorkspaceExposuresResponse:
        if self.exposures is None:
            raise Unimplemented("this server serves no exposures")
        return await self.exposures.list_workspace_exposures(request, caller)

    def _on_changes(self, changes: Changes) -> None:
        # Published commits keep the remembered records current (rows are never removed).
        for workspace in changes.workspaces.values():
            if workspace.id in self._latest:
                self._latest[workspace.id] = workspace

    def _recall(self, workspace_id: str) -> Workspace | None:
        """The stored record from memory, when the store vouches that every commit is published."""
        return self._latest.get(workspace_id) if self._store.published_mark() is not None else None

    async def _read_workspace(self, workspace_id: str) -> Workspace | None:
        workspace = self._recall(workspace_id)
        if workspace is not None:
            return workspace
        mark = self._store.published_mark()
        workspace = await self._store.read(lambda r: r.get_workspace(workspace_id))
        # Remember it only if nothing committed meanwhile: then it is what is stored now, and
        # _on_changes keeps it so. (A read overtaken by a commit may be older than that.)
        if workspace is not None and mark is not None and self._store.published_mark() == mark:
            if len(self._latest) >= LATEST_WORKSPACES:
                del self._latest[next(iter(self._latest))]  # the oldest entry
            self._latest[workspace.id] = workspace
        return workspace

    async def _workspace(self, caller: Caller, workspace_id: str) -> Workspace:
        workspace = await self._read_workspace(workspace_id)
        # Another tenant's workspace does not exist for this caller.
        if workspace is None or workspace.tenant != caller.tenant:
            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")
        return workspace

    async def get_workspace(
        self, request: ws_pb2.GetWorkspaceRequest, caller: Caller
    ) -> render.Encoded[ws_pb2.GetWorkspaceResponse]:
        workspace = await self._workspace(caller, parse.workspace_id(request.workspace_id))
        return render.Encoded(render.field_bytes(1, self._encode(workspace)), ws_pb2.GetWorkspaceResponse)

    async def list_workspaces(
        self, request: ws_pb2.ListWorkspacesRequest, caller: Caller
    ) -> render.Encoded[ws_pb2.ListWorkspacesResponse]:
        size = validation.page_size(request.page_size, 50)
        where = validation.workspace_filter(request.filter)
        scope = _digest(f"{caller.tenant}|{request.include_deleted}|{request.filter}")
        query = WorkspaceQuery(
            tenant=caller.tenant,
            after_seq=_decode_token(request.page_token, scope),
            include_deleted=request.include_deleted,
            states=where.states,
            labels=where.labels,
        )
        # A tenant's lists run a few at a time, each as bounded scans (fairness.py, LIST_COST).
        async with self._list_slots.slot(caller.tenant):
            found, resume = await self._scan_page(query, size)
        # The response is assembled from the remembered encodings: field 1 (workspaces) once
        # per workspace, then field 2 (next_page_token).
        fields: list[bytes] = []
        budget = self._page_bytes
        for listed in found:
            field = render.field_bytes(1, self._encode_listed(listed))
            if fields and len(field) > budget:
                # The page is as large as a message may be: the rest comes on the next page.
                resume = found[len(fields) - 1].seq
                break
            budget -= len(field)
            fields.append(field)
        if resume:
            fields.append(render.field_bytes(2, _encode_token(resume, scope).encode()))
        return render.Encoded(b"".join(fields), ws_pb2.ListWorkspacesResponse)

    async def _scan_page(self, query: WorkspaceQuery, size: int) -> tuple[list[ListedWorkspace], int]:
        """Up to `size` matching workspaces, and the seq to resume after (0: nothing is left).
        The scan runs in slices of at most LIST_COST.slice term evaluations, and stops after
        LIST_COST.request of them with what it has (fewer than `size`, or none, with a page
        token: AIP-158 allows a short page)."""
        terms = 1 + len(query.labels) + len(query.states)
        largest = max(16, LIST_COST.slice // terms)
        scanned = 0
        found: list[ListedWorkspace] = []
        after = query.after_seq
        # Slices start at what the page still needs (a dense match is one read) and double up
        # to `largest` (a sparse one takes few reads).
        rows = min(largest, size + 1)
        while True:
            sliced = replace(query, after_seq=after)
            want = size + 1 - len(found)
            part = await self._store.scan(_scan_slice, sliced, rows, want)
            found.extend(part.workspaces)
            scanned += rows
            if len(found) > size:
                return found[:size], found[size - 1].seq
            if part.exhausted:
                return found, 0
            after = part.last_seq
            # A full page goes on looking for one more match (within the cost): a page token
            # only when more is there, not when the slice just ended with the last row.
            if scanned * terms >= LIST_COST.request:
                return found, after
            rows = min(largest, rows * 2)

    async def get_workspace_command(
        self, request: ws_pb2.GetWorkspaceCommandRequest, caller: Caller
    ) -> ws_pb2.GetWorkspaceCommandResponse:
        command_id = request.command_id
        if not command_id or not validation.COMMAND_ID.fullmatch(command_id):
            raise InvalidArgument("command_id is not a valid command ID", field="command_id")
        command = await self._store.read(lambda r: r.get_command(caller.tenant, command_id))
        if command is None:
            raise NotFound(f"command {command_id} not found", field="command_id")
        return ws_pb2.GetWorkspaceCommandResponse(command=render.command(command))

    async def watch_workspace(
        self, request: ws_pb2.WatchWorkspaceRequest, caller: Caller
    ) -> AsyncGenerator[render.Encoded[ws_pb2.WatchWorkspaceResponse], None]:
        workspace_id = parse.workspace_id(request.workspace_id)
        # Counted before the lookup: at its cap a tenant is refused whatever the ID names.
        with self.watch_streams.hold(caller.tenant), self._hub.watch(workspace_id) as changes:
            workspace = await self._workspace(caller, workspace_id)
            yield self._watch_response(workspace)
            version = workspace.version
            while not workspace.deleted:
                snapshot = await changes.get()
                if snapshot is Signal.CLOSED:
                    raise Unavailable("the server is shutting down: watch again")
                if snapshot is Signal.RESYNC:
                    snapshot = await self._workspace(caller, workspace_id)
                if snapshot.version <= version:
                    continue
                workspace, version = snapshot, snapshot.version
                yield self._watch_response(workspace)

    def add_capability(self, capability: str) -> None:
        """One this server has beyond its runtimes' (e.g. `workspace.exposures`, once its
        exposure listener serves)."""
        self._capabilities = sorted({*self._capabilities, capability})

    async def get_capabilities(
        self, request: ws_pb2.GetCapabilitiesRequest, caller: Caller
    ) -> ws_pb2.GetCapabilitiesResponse:
        nodes = await self._store.read(lambda r: r.list_nodes())
        response = ws_pb2.GetCapabilitiesResponse(capabilities=self._capabilities)
        if nodes:
            response.largest_workspace.CopyFrom(render.largest_workspace(nodes))
        return response

    # -- observation -------------------------------------------------------------------

    async def get_workspace_cleanup(
        self, request: obs_pb2.GetWorkspaceCleanupRequest, caller: Caller
    ) -> obs_pb2.GetWorkspaceCleanupResponse:
        workspace_id = parse.workspace_id(request.workspace_id)

        def load(reader: Reader) -> tuple[Workspace | None, Instance | None]:
            workspace = reader.get_workspace(workspace_id)
            instance = reader.get_instance(workspace.instance_id) if workspace and workspace.instance_id else None
            return workspace, instance

        workspace, instance = await self._store.read(load)
        if workspace is None or workspace.tenant != caller.tenant:
            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")
        derived = cleanup.derive(workspace, instance, time.time())
        if self._observer is not None:
            # The machine itself, where the runtime can look: it wins over what the store remembers.
            going = tuple(b.volume_id for b in workspace.bindings if b.delete_with_workspace)
            seen = await asyncio.to_thread(
                self._observer.observe, instance.id if instance else None, workspace.id, going
            )
            derived = cleanup.with_observation(workspace, derived, seen, time.time())
        return obs_pb2.GetWorkspaceCleanupResponse(cleanup=render.cleanup(workspace_id, derived))

    async def list_workspace_events(
        self, request: obs_pb2.ListWorkspaceEventsRequest, caller: Caller
    ) -> obs_pb2.ListWorkspaceEventsResponse:
        workspace_id = parse.workspace_id(request.workspace_id)
        size = validation.page_size(request.page_size, 100)
        scope = _digest(f"{caller.tenant}|{workspace_id}")
        after = _decode_token(request.page_token, scope)
        await self._workspace(caller, workspace_id)
        events = await self._store.read(lambda r: r.list_events(workspace_id, after, size + 1))
        token = _encode_token(events[size - 1].seq, scope) if len(events) > size else ""
        return obs_pb2.ListWorkspaceEventsResponse(
            events=[render.event(e) for e in events[:size]], next_page_token=token
        )

    def list_events(self, request: obs_pb2.ListEventsRequest, caller: Caller) -> Awaitable[obs_pb2.ListEventsResponse]:
        """Fleet-wide events: api/events.py."""
        return self.events.list_events(request, caller)

    def watch_events(
        self, request: obs_pb2.WatchEventsRequest, caller: Caller
    ) -> AsyncGenerator[obs_pb2.WatchEventsResponse, None]:
        return self.events.watch_events(request, caller)

    async def list_workspace_instances(
        self, request: obs_pb2.ListWorkspaceInstancesRequest, caller: Caller
    ) -> obs_pb2.ListWorkspaceInstancesResponse:
        workspace_id = parse.workspace_id(request.workspace_id)
        await self._workspace(caller, workspace_id)
        instances = await self._store.read(lambda r: r.list_instances(workspace_id))
        return obs_pb2.ListWorkspaceInstancesResponse(instances=[render.instance(i) for i in instances])

    # -- volumes -----------------------------------------------------------------------

    async def get_volume(self, request: vol_pb2.GetVolumeRequest, caller: Caller) -> vol_pb2.GetVolumeResponse:
        volume_id = validation.resource_id(request.volume_id, "volume_id", "vol-")
        volume = await self._store.read(lambda r: r.get_volume(volume_id))
        if volume is None or volume.tenant != caller.tenant:
            raise NotFound(f"volume {volume_id} not found", field="volume_id")
        return vol_pb2.GetVolumeResponse(volume=render.volume(volume))


def _scan_slice(reader: Reader, query: WorkspaceQuery, max_rows: int, want: int) -> WorkspaceSlice:
    return reader.scan_workspaces(query, max_rows, want)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Page tokens. A token names the row to resume after and its query's scope: a digest of the
# caller's tenant and the request's other fields, so a token answers only the query that
# made it, for the tenant that made it (another's, or another filter's, is INVALID_ARGUMENT).
# A token is only ever what the server made (~70 characters): anything longer is refused
# unread, and only an integer row in SQLite's range is taken.
MAX_PAGE_TOKEN_CHARS = 256
MAX_SEQ = (1 << 63) - 1


def _encode_token(seq: int, scope: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": seq, "scope": scope}).encode()).decode()


def _decode_token(token: str, scope: str) -> int:
    if not token:
        return 0
    if len(token) > MAX_PAGE_TOKEN_CHARS:
        raise InvalidArgument("page_token is not valid", field="page_token")
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        after, token_scope = data["after"], data["scope"]
    except (ValueError, KeyError, TypeError, IndexError, binascii.Error, RecursionError):
        raise InvalidArgument("page_token is not valid", field="page_token") from None
    if type(after) is not int or not 0 <= after <= MAX_SEQ:
        raise InvalidArgument("page_token is not valid", field="page_token")
    if token_scope != scope:
        raise InvalidArgument("page_token belongs to another query", field="page_token")
    return after
