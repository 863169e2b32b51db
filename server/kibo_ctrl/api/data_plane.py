"""kibo.ctrl.v1.DataPlaneService: credentials, commands and files in running workspaces.

A credential is an HMAC-signed token naming the workspace, its execution generation and
its data_plane.credential_revision, signed with a key kept in the data directory (so it
survives a control-plane restart). Every request re-reads the workspace: a stop, force
stop, revoke or delete bumps the revision and a start makes a new generation, so an old
credential is refused (UNAUTHENTICATED); a firecracker guest reboot changes neither, so
the credential stays valid and requests meanwhile get UNAVAILABLE (retryable).

Calls already running when their credential is revoked (revoke, stop, force stop, delete)
are ended at once: their command is killed in the guest and the stream ends with
UNAUTHENTICATED, as any later request with that credential would (data_plane_sessions.py).
Exec output reaches the client with back-pressure and bounded memory (runtime/guest_jobs.py).

Issuing a credential is a control-plane call: it needs an admin token of the workspace's
tenant (when authentication is on). The other calls are authorized by the credential
alone, so it can be handed to whoever should use the workspace. Served over gRPC and
Connect like every service; errors are domain errors, mapped in transport/errors.py."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import data_plane_service_pb2 as dp

from ..domain import validation
from ..domain.access import Caller
from ..domain.errors import (
    Conflict,
    GuestError,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from ..domain.model import Phase, Workspace, WorkspaceState
from ..runtime.base import (
    Exit,
    GuestAccess,
    GuestProcesses,
    GuestRefused,
    JobStopped,
    Output,
)
from ..store.base import Changes, Reader, Store
from .data_plane_errors import refused as _refused
from .data_plane_errors import revoked as _revoked
from .data_plane_files import DataPlaneFiles
from .data_plane_processes import DataPlaneProcesses
from .data_plane_sessions import Session, Sessions

log = logging.getLogger(__name__)

# Exec and file calls are authorized by this credential in the request (routes.py:
# credential=True), not by a control-plane token.
TOKEN_PREFIX = "kdp1"
# A file read or written in one message stays well under the 4 MiB message limit.
MAX_FILE_BYTES = 3 << 20
# PATH_MAX: a longer path can never be opened.
MAX_PATH_BYTES = 4095


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _key(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key


class DataPlane:
    def __init__(self, store: Store, guests: Mapping[str, GuestAccess], data_dir: Path) -> None:
        """`guests`: by node ID, the runtimes whose guests the data plane can reach."""
        self._store = store
        self._guests = guests
        data_dir.mkdir(parents=True, exist_ok=True)
        self._key = _key(data_dir / "data-plane.key")
        self.sessions = Sessions()
        self.processes = DataPlaneProcesses(self)
        self.files = DataPlaneFiles(self)
        # By workspace: (instance, revision, live) as last seen, and the processes' ends under way.
        self._process_owners: dict[str, tuple[str | None, int, bool]] = {}
        self._ending: set[asyncio.Task[None]] = set()

    def on_changes(self, changes: Changes) -> None:
        """A hub listener: ends the calls whose credential a commit revoked, and the guest
        processes started under it."""
        self.sessions.on_changes(changes)
        for workspace in changes.workspaces.values():
            self._end_processes(workspace)

    def _end_processes(self, workspace: Workspace) -> None:
        """Has the workspace's node end the processes started under a credential revision the
        workspace no longer honours (a revoke, stop, force stop or delete): when its revision
        changes or it stops being AVAILABLE, and when first seen (what ran before a restart of
        this server is not known here). Nothing to do (a dict lookup) for any other change."""
        live = workspace.state is WorkspaceState.AVAILABLE and not (workspace.deleted or workspace.deletion_started)
        now = (workspace.instance_id, workspace.data_plane_revision, live)
        before = self._process_owners.pop(workspace.id, None)
        if not workspace.deleted:
            self._process_owners[workspace.id] = now
        if workspace.instance_id is None or before == now:
            return
        if before is not None and (before[0] != now[0] or (before[1] == now[1] and not before[2])):
            return  # a new instance (nothing of it runs yet), or one becoming AVAILABLE
        runtime = self._guests.get(workspace.node_id or "")
        if not isinstance(runtime, GuestProcesses):
            return
        keep = workspace.data_plane_revision if live else None
        task = asyncio.get_running_loop().create_task(runtime.end_guest_processes(workspace.instance_id, keep))
        self._ending.add(task)
        task.add_done_callback(self._processes_ended)

    def _processes_ended(self, task: asyncio.Task[None]) -> None:
        self._ending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("ending a workspace's revoked processes failed: %s", task.exception())

    # -- credentials ----------------------------------------------------------------------

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def _credential(self, workspace_id: str, generation: int, revision: int) -> str:
        payload = _b64(json.dumps({"w": workspace_id, "g": generation, "r": revision}).encode())
        return f"{TOKEN_PREFIX}.{payload}.{self._sign(payload)}"

    def _claims(self, credential: str) -> tuple[str, int, int]:
        refused = Unauthenticated("the data-plane credential is not valid", field="credential")
        prefix, _, rest = credential.partition(".")
        payload, _, signature = rest.partition(".")
        if prefix != TOKEN_PREFIX or not hmac.compare_digest(signature, self._sign(payload)):
            raise refused
        try:
            claims = json.loads(_unb64(payload))
            return str(claims["w"]), int(claims["g"]), int(claims["r"])
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise refused from None

    async def issue_data_plane_credential(
        self, request: dp.IssueDataPlaneCredentialRequest, caller: Caller
    ) -> dp.IssueDataPlaneCredentialResponse:
        caller.require_admin("issuing a data-plane credential")
        # Checked first: the NotFound below quotes it (a 4 MiB ID overflowed gRPC's metadata).
        workspace_id = validation.resource_id(request.workspace_id, "workspace_id", "ws-")
        workspace = await self._store.read(lambda r: r.get_workspace(workspace_id))
        # Another tenant's workspace does not exist for this caller.
        if workspace is None or workspace.deleted or workspace.tenant != caller.tenant:
            raise NotFound(f"workspace {workspace_id} not found", field="workspace_id")
        if workspace.state is not WorkspaceState.AVAILABLE or workspace.deletion_started:
            raise Conflict(
                f"workspace {workspace.id} is {workspace.state.name}: credentials are issued while AVAILABLE",
                state=workspace.state.name,
            )
        issued = Timestamp()
        issued.FromNanoseconds(time.time_ns())
        return dp.IssueDataPlaneCredentialResponse(
            credential=self._credential(workspace.id, workspace.generation, workspace.data_plane_revision),
            execution_generation=workspace.generation,
            credential_revision=workspace.data_plane_revision,
            issue_time=issued,
        )

    async def _authorize(self, session: Session) -> tuple[GuestAccess, str, list[str]]:
        """The runtime and instance a credential gives access to, and the volume mounts."""
        workspace_id, generation, revision = session.workspace_id, session.generation, session.revision

        def load(reader: Reader) -> tuple[Any, Any]:
            workspace = reader.get_workspace(workspace_id)
            instance = reader.get_instance(workspace.instance_id) if workspace and workspace.instance_id else None
            return workspace, instance

        workspace, instance = await self._store.read(load)
        if workspace is None or workspace.deleted or workspace.deletion_started:
            raise Unauthenticated("the credential was revoked: the workspace is deleted", field="credential")
        if workspace.generation != generation or workspace.data_plane_revision != revision:
            raise Unauthenticated(
                "the credential was revoked (stop, force stop, revoke or a new start): request a new one",
                field="credential",
            )
        runtime = self._guests.get(workspace.node_id or "")
        if runtime is None:
            raise Unimplemented("this workspace's runtime has no data plane (the simulator has none)")
        restarting = instance is None or instance.phase is not Phase.RUNNING or not workspace.guest.responding
        if workspace.state is not WorkspaceState.AVAILABLE or restarting or not runtime.guest_ready(instance.id):
            raise Unavailable("the guest is not answering (restarting?): retry", state=workspace.state.name)
        return runtime, instance.id, [b.mount_path for b in workspace.bindings]

    # -- commands and files ---------------------------------------------------------------------

    async def exec_workspace_command(
        self, request: dp.ExecWorkspaceCommandRequest, caller: Caller
    ) -> AsyncGenerator[dp.ExecWorkspaceCommandResponse, None]:
        if not request.argv:
            raise InvalidArgument("argv: give the command to run", field="argv")
        if request.timeout_seconds < 0:
            raise InvalidArgument("timeout_seconds must not be negative", field="timeout_seconds")
        job = {"mode": "exec", "argv": list(request.argv), "env": dict(request.env), "cwd": request.working_dir or "/"}
        with self.sessions.track(*self._claims(request.credential)) as session:
            runtime, instance_id, _ = await self._authorize(session)
            items = runtime.guest_job(instance_id, job, request.stdin, float(request.timeout_seconds), session.stop)
            try:
                async with aclosing(items):
                    async for item in items:
                        if isinstance(item, Exit):
                            yield dp.ExecWorkspaceCommandResponse(exit_code=item.code)
                        elif item.stream == "stdout":
                            yield dp.ExecWorkspaceCommandResponse(stdout=item.data)
                        else:
                            yield dp.ExecWorkspaceCommandResponse(stderr=item.data)
            except JobStopped:
                raise _revoked(session) from None
            except GuestRefused as refused:
                raise _refused(refused, request.working_dir or "/", "working_dir") from None

    async def _file_job(
        self, credential: str, path: str, job: dict[str, Any], stdin: bytes = b""
    ) -> AsyncGenerator[Output | Exit, None]:
        """A read or write job on `path`, tracked under its credential like an exec."""
        with self.sessions.track(*self._claims(credential)) as session:
            runtime, instance_id, mounts = await self._authorize(session)
            _check_path(runtime, path, mounts)
            items = runtime.guest_job(instance_id, {**job, "path": path}, stdin, 0.0, session.stop)
            try:
                async with aclosing(items):
                    async for item in items:
                        yield item
            except JobStopped:
                raise _revoked(session) from None
            except GuestRefused as refused:
                raise _refused(refused, path, "path") from None

    async def read_workspace_file(
        self, request: dp.ReadWorkspaceFileRequest, caller: Caller
    ) -> dp.ReadWorkspaceFileResponse:
        content = bytearray()
        async with aclosing(self._file_job(request.credential, request.path, {"mode": "read"})) as items:
            async for item in items:
                if isinstance(item, Exit):
                    if item.code != 0:
                        raise GuestError(f"reading {request.path} in the guest failed", field="path")
                elif item.stream == "stdout":
                    content += item.data
                    if len(content) > MAX_FILE_BYTES:
                        raise Conflict(
                            f"{request.path} is larger than {MAX_FILE_BYTES >> 20} MiB: read it in parts with exec"
                        )
        return dp.ReadWorkspaceFileResponse(content=bytes(content))

    async def write_workspace_file(
        self, request: dp.WriteWorkspaceFileRequest, caller: Caller
    ) -> dp.WriteWorkspaceFileResponse:
        if len(request.content) > MAX_FILE_BYTES:
            raise InvalidArgument(f"content is larger than {MAX_FILE_BYTES >> 20} MiB", field="content")
        if request.mode > 0o7777:
            raise InvalidArgument("mode: permission bits only (at most 0o7777)", field="mode")
        job = {"mode": "write", "file_mode": request.mode or 0o644}
        async with aclosing(self._file_job(request.credential, request.path, job, request.content)) as items:
            async for item in items:
                if isinstance(item, Exit) and item.code != 0:
                    raise GuestError(f"writing {request.path} in the guest failed", field="path")
        return dp.WriteWorkspaceFileResponse(size=len(request.content))


def _check_path(guests: GuestAccess, path: str, mounts: list[str]) -> None:
    if len(path.encode()) > MAX_PATH_BYTES:
        raise InvalidArgument(f"path is longer than {MAX_PATH_BYTES} bytes", field="path")
    try:
        guests.check_file_path(path, mounts)
    except ValueError as error:
        raise InvalidArgument(str(error), field="path") from None
