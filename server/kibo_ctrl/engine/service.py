"""Command handlers: each command is checked and recorded in one store transaction.

Each handler is named after its RPC and is what the command registry (api/commands.py)
names for it; `Service.execute` runs the one an entry names. Order of checks (the contract's
error table): the request is well formed (done by the caller, see validation), the
workspace exists, the command ID is new or a resend of the same request, the expiration
revision matches (these three in `on_workspace`), the state allows the operation."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..domain import rules
from ..domain.errors import (
    CommandIdReused,
    Conflict,
    InvalidArgument,
    NoCapacity,
    NotFound,
    QuotaExceeded,
    RevisionMismatch,
)
from ..domain.model import (
    MAX_EXPOSURES,
    Binding,
    Command,
    CommandKind,
    CommandState,
    Desired,
    EventType,
    Expiration,
    ExpirationAction,
    Exposure,
    ExposureAccess,
    NetworkPolicy,
    Phase,
    Resources,
    StopCause,
    Volume,
    VolumeState,
    Workspace,
    WorkspaceState,
)
from ..domain.nodes import too_big
from ..store.base import Tx
from . import moves, steps
from .placement import place_if_first
from .steps import event, save


@dataclass(frozen=True)
class CreateSpec:
    resources: Resources
    labels: dict[str, str]
    annotations: dict[str, str]
    bindings: list[Binding]
    network_policy: NetworkPolicy
    data_volume_gib: int
    expire_time: float | None = None
    expire_action: ExpirationAction = ExpirationAction.UNSPECIFIED
    node_selector: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandRequest:
    kind: CommandKind
    command_id: str
    # A digest of the whole request: a resend has the same one, a reuse another.
    fingerprint: str
    workspace_id: str = ""
    expected_revision: int = 0
    create: CreateSpec | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    expire_time: float | None = None
    expire_action: ExpirationAction = ExpirationAction.UNSPECIFIED
    resources: Resources | None = None
    network_policy: NetworkPolicy | None = None
    binding: Binding | None = None
    volume_id: str = ""
    capacity_gib: int = 0
    # Whose command this is: command IDs and workspaces are scoped per tenant.
    tenant: str = "default"
    # MoveWorkspace: the node to hold the disks.
    target_node: str = ""
    # CreateWorkspaceExposure / DeleteWorkspaceExposure.
    exposure: ExposureRequest | None = None
    # CreateWorkspaceExposure's token, for its answer only: never stored (its digest is).
    exposure_token: str = field(default="", repr=False)


@dataclass(frozen=True)
class ExposureRequest:
    """What CreateWorkspaceExposure asks (its ID and token made by the API before the
    transaction: the token is answered once, only its digest is stored), or which exposure
    DeleteWorkspaceExposure ends."""

    exposure_id: str
    port: int = 0
    access: ExposureAccess = ExposureAccess.TOKEN
    expire_in_seconds: int = 0
    token_sha256: str = ""


@dataclass(frozen=True)
class Quotas:
    """Per-tenant limits over workspaces not deleted; 0 means no limit."""

    workspaces: int = 0
    vcpus: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class Settings:
    storage_pool: str = "local"
    quotas: Quotas = field(default_factory=Quotas)
    # Place a create's or start's instance in the command's transaction when nothing waits
    # before it (placement.place_if_first): only where this process is the store's one writer.
    place_at_command: bool = False


T = TypeVar("T")
# A command on an existing workspace, after the checks every such command takes first.
WorkspaceHandler = Callable[["Service", Tx, Workspace, CommandRequest], Command]
# What a registry entry names: the whole command, in the transaction `Service.execute` runs.
WorkspaceCommandHandler = Callable[["Service", Tx, CommandRequest], tuple[Workspace, Command]]
VolumeCommandHandler = Callable[["Service", Tx, CommandRequest], Volume]


def on_workspace(handle: WorkspaceHandler) -> WorkspaceCommandHandler:
    """A handler of a command on an existing workspace: first the workspace exists (for this
    tenant), the command ID is new (a resend answers with its command), the expiration
    revision matches; then `handle`."""

    @functools.wraps(handle)
    def checked(service: Service, tx: Tx, request: CommandRequest) -> tuple[Workspace, Command]:
        workspace = tx.get_workspace(request.workspace_id)
        if workspace is None or workspace.tenant != request.tenant:
            raise NotFound(f"workspace {request.workspace_id} not found", field="workspace_id")
        existing = _existing(tx, request)
        if existing is not None:
            return existing
        if request.expected_revision and request.expected_revision != workspace.expiration.revision:
            raise RevisionMismatch(
                f"expected expiration revision {request.expected_revision}, "
                f"the workspace is at {workspace.expiration.revision}",
                field="expected_expiration_revision",
            )
        return workspace, handle(service, tx, workspace, request)

    return checked


def _existing(tx: Tx, request: CommandRequest) -> tuple[Workspace, Command] | None:
    command = tx.get_command(request.tenant, request.command_id)
    if command is None:
        return None
    if command.fingerprint != request.fingerprint:
        raise CommandIdReused(
            f"command ID {request.command_id} was already used for another request",
            field="metadata.command_id",
        )
    workspace = tx.get_workspace(command.workspace_id)
    assert workspace is not None  # commands are never recorded without their workspace
    return workspace, command


class Service:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    # -- entry point -------------------------------------------------------------------

    def execute(self, tx: Tx, handle: Callable[[Service, Tx, CommandRequest], T], request: CommandRequest) -> T:
        """Run the handler a registry entry names (api/commands.py), in this transaction."""
        return handle(self, tx, request)

    # -- lifecycle ---------------------------------------------------------------------

    def create_workspace(self, tx: Tx, request: CommandRequest) -> tuple[Workspace, Command]:
        existing = _existing(tx, request)
        if existing is not None:
            return existing
        spec = request.create
        assert spec is not None
        workspace_id = f"ws-{uuid.uuid4().hex[:20]}"
        self._check_quotas(tx, request.tenant, 1, spec.resources.vcpus, spec.resources.memory_mib)
        bound = sum(v.capacity_gib for b in spec.bindings if (v := tx.get_volume(b.volume_id)) is not None)
        _check_capacity(tx, spec.resources, spec.data_volume_gib + bound)
        own_volume = Volume(
            tenant=request.tenant,
            id=f"vol-{uuid.uuid4().hex[:20]}",
            storage_pool=self.settings.storage_pool,
            capacity_gib=spec.data_volume_gib,
            state=VolumeState.PENDING,
            create_time=tx.now,
            workspace_id=workspace_id,
        )
        bindings = [
            Binding(
                volume_id=own_volume.id,
                mount_path="/data",
                delete_with_workspace=True,
                capacity_gib=own_volume.capacity_gib,
            )
        ]
        for binding in spec.bindings:
            volume = self._bindable_volume(tx, binding.volume_id, workspace_id, request.tenant)
            volume.workspace_id = workspace_id
            tx.put_volume(volume)
            bindings.append(_sized(binding, volume))
        _check_mount_paths(bindings)
        tx.put_volume(own_volume)
        expiration = Expiration()
        if spec.expire_time is not None:
            expiration = Expiration(revision=1, expire_time=spec.expire_time, action=spec.expire_action)
        workspace = Workspace(
            id=workspace_id,
            seq=tx.next_workspace_seq(),
            state=WorkspaceState.UNSPECIFIED,
            resources=spec.resources,
            bindings=bindings,
            create_time=tx.now,
            update_time=tx.now,
            storage_pool=self.settings.storage_pool,
            tenant=request.tenant,
            labels=spec.labels,
            annotations=spec.annotations,
            network_policy=spec.network_policy,
            expiration=expiration,
            node_selector=spec.node_selector,
        )
        command = steps.new_command(tx, workspace, request.command_id, CommandKind.CREATE, request.fingerprint)
        self._next_generation(tx, workspace, command)
        return workspace, command

    @on_workspace
    def start_workspace(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        rules.check(CommandKind.START, steps.rule_facts(workspace))
        _check_capacity(tx, workspace.resources, sum(b.capacity_gib for b in workspace.bindings))
        command = steps.new_command(tx, workspace, request.command_id, CommandKind.START, request.fingerprint)
        self._next_generation(tx, workspace, command)
        return command

    @on_workspace
    def move_workspace(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        """An operator's move of a STOPPED workspace's disks (engine/moves.py copies them and
        ends the command). Nothing made yet, or there already: it takes effect at once."""
        rules.check(CommandKind.MOVE, steps.rule_facts(workspace))
        return moves.begin(tx, workspace, request.command_id, request.fingerprint, request.target_node)

    def _next_generation(self, tx: Tx, workspace: Workspace, command: Command) -> None:
        """A create's or start's new instance, saved with its command, and placed at once
        where this process may (Settings.place_at_command)."""
        instance = steps.new_instance(tx, workspace)
        save(tx, workspace, instance, command_id=command.id)
        if self.settings.place_at_command:
            place_if_first(tx, workspace)

    @on_workspace
    def stop_workspace(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        # One RPC, two commands: its mode (parse.stop) chose the kind.
        if request.kind is CommandKind.FORCE_STOP:
            return self._force_stop(tx, workspace, request)
        return self._graceful_stop(tx, workspace, request.command_id, request.fingerprint, StopCause.REQUESTED)

    def _graceful_stop(
        self, tx: Tx, workspace: Workspace, command_id: str, fingerprint: str, cause: StopCause
    ) -> Command:
        """A graceful stop, asked for by a caller or by the workspace's expiration."""
        rules.check(CommandKind.STOP, steps.rule_facts(workspace))
        instance = steps.current_instance(tx, workspace)
        command = steps.new_command(tx, workspace, command_id, CommandKind.STOP, fingerprint, cause=cause)
        steps.begin_stop(tx, workspace, instance, command_id, force=False, cause=cause)
        save(tx, workspace, instance, command_id=command_id)
        return command

    def _force_stop(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        decision = rules.check(CommandKind.FORCE_STOP, steps.rule_facts(workspace))
        if decision is rules.ForceStop.SUPERSEDE:
            steps.cancel_active(tx, workspace, request.command_id, "superseded by a force stop")
        instance = steps.current_instance(tx, workspace)
        command = steps.new_command(
            tx, workspace, request.command_id, CommandKind.FORCE_STOP, request.fingerprint, cause=StopCause.REQUESTED
        )
        steps.clear_failure(workspace)
        steps.begin_stop(tx, workspace, instance, request.command_id, force=True, cause=StopCause.REQUESTED)
        save(tx, workspace, instance, command_id=command.id)
        return command

    @on_workspace
    def delete_workspace(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        return self._delete(tx, workspace, request.command_id, request.fingerprint)

    def _delete(self, tx: Tx, workspace: Workspace, command_id: str, fingerprint: str) -> Command:
        """A delete, asked for by a caller or by the workspace's expiration."""
        rules.check(CommandKind.DELETE, steps.rule_facts(workspace))
        if workspace.active_command is not None:
            steps.cancel_active(tx, workspace, command_id, "cancelled by a delete")
        command = steps.new_command(tx, workspace, command_id, CommandKind.DELETE, fingerprint)
        steps.begin_delete(tx, workspace)
        instance = steps.current_instance(tx, workspace)
        if instance is not None and instance.node_id is None:
            # Never reached a node: nothing to release there.
            instance.phase = Phase.RELEASED
            instance.done_step = instance.step
        if (
            instance is not None
            and instance.node_id is not None
            and (instance.holds or instance.step != instance.done_step)
        ):
            steps.set_desired(instance, Desired.DESTROYED)
        else:
            steps.finish_delete(tx, workspace)
        save(tx, workspace, instance, command_id=command_id)
        return command

    # -- configuration (immediate commands) --------------------------------------------
    # A configuration field (expiration, labels, resources, ...) is written by its command alone.

    def _immediate(self, tx: Tx, workspace: Workspace, request: CommandRequest, message: str) -> Command:
        rules.check(request.kind, steps.rule_facts(workspace))
        return steps.immediate_command(tx, workspace, request.command_id, request.kind, request.fingerprint, message)

    @on_workspace
    def set_workspace_expiration(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        command = self._immediate(tx, workspace, request, "expiration set")
        workspace.expiration = Expiration(
            revision=workspace.expiration.revision + 1,
            expire_time=request.expire_time,
            action=request.expire_action,
        )
        save(tx, workspace, None)
        return command

    @on_workspace
    def clear_workspace_expiration(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        command = self._immediate(tx, workspace, request, "expiration cleared")
        workspace.expiration = Expiration(revision=workspace.expiration.revision + 1)
        save(tx, workspace, None)
        return command

    @on_workspace
    def set_workspace_labels(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        command = self._immediate(tx, workspace, request, "labels and annotations replaced")
        workspace.labels = dict(request.labels)
        workspace.annotations = dict(request.annotations)
        save(tx, workspace, None)
        return command

    @on_workspace
    def resize_workspace(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        assert request.resources is not None
        rules.check(request.kind, steps.rule_facts(workspace))
        wanted, current = request.resources, workspace.resources
        resized = Resources(
            vcpus=wanted.vcpus or current.vcpus,
            memory_mib=wanted.memory_mib or current.memory_mib,
            writable_layer_gib=wanted.writable_layer_gib or current.writable_layer_gib,
        )
        self._check_quotas(
            tx, workspace.tenant, 0, resized.vcpus - current.vcpus, resized.memory_mib - current.memory_mib
        )
        _check_capacity(tx, resized, sum(b.capacity_gib for b in workspace.bindings))
        command = self._immediate(tx, workspace, request, "resources changed")
        workspace.resources = resized
        save(tx, workspace, None)
        return command

    @on_workspace
    def set_workspace_network_policy(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        assert request.network_policy is not None
        when = "now" if workspace.state is WorkspaceState.AVAILABLE else "at the next start"
        command = self._immediate(tx, workspace, request, f"network policy changed, effective {when}")
        workspace.network_policy = request.network_policy
        instance = tx.get_instance(workspace.instance_id) if workspace.instance_id else None
        if instance is not None and workspace.state is WorkspaceState.AVAILABLE:
            # Its node applies it live (engine/node_agent.py), without a restart.
            instance.network_policy = request.network_policy
            instance.network_revision += 1
            tx.put_instance(instance)
        save(tx, workspace, None)
        return command

    @on_workspace
    def bind_workspace_volume(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        binding = request.binding
        assert binding is not None
        rules.check(request.kind, steps.rule_facts(workspace))
        volume = self._bindable_volume(tx, binding.volume_id, workspace.id, workspace.tenant)
        binding = _sized(binding, volume)
        bindings = [b for b in workspace.bindings if b.volume_id != binding.volume_id] + [binding]
        _check_mount_paths(bindings)
        command = self._immediate(tx, workspace, request, f"volume {binding.volume_id} bound at {binding.mount_path}")
        volume.workspace_id = workspace.id
        tx.put_volume(volume)
        workspace.bindings = bindings
        save(tx, workspace, None)
        return command

    @on_workspace
    def unbind_workspace_volume(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        rules.check(request.kind, steps.rule_facts(workspace))
        if not any(b.volume_id == request.volume_id for b in workspace.bindings):
            raise NotFound(f"volume {request.volume_id} is not bound to {workspace.id}", field="volume_id")
        command = self._immediate(tx, workspace, request, f"volume {request.volume_id} unbound and kept")
        workspace.bindings = [b for b in workspace.bindings if b.volume_id != request.volume_id]
        volume = tx.get_volume(request.volume_id)
        if volume is not None:
            volume.workspace_id = None
            tx.put_volume(volume)
        save(tx, workspace, None)
        return command

    @on_workspace
    def create_workspace_exposure(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        wanted = request.exposure
        assert wanted is not None
        rules.check(request.kind, steps.rule_facts(workspace))
        valid = workspace.valid_exposures(tx.now)
        if any(e.port == wanted.port for e in valid):
            raise Conflict(
                f"port {wanted.port} of {workspace.id} is exposed already: delete that exposure first",
                field="port",
            )
        if len(valid) >= MAX_EXPOSURES:
            raise Conflict(f"{workspace.id} has {MAX_EXPOSURES} exposures, the most it may have", field="port")
        command = self._immediate(tx, workspace, request, f"port {wanted.port} exposed")
        workspace.exposures = [
            *valid,
            Exposure(
                id=wanted.exposure_id,
                port=wanted.port,
                access=wanted.access,
                generation=workspace.generation,
                revision=workspace.data_plane_revision,
                create_time=tx.now,
                command_id=request.command_id,
                expire_time=tx.now + wanted.expire_in_seconds if wanted.expire_in_seconds else None,
                token_sha256=wanted.token_sha256,
            ),
        ]
        save(tx, workspace, None)
        return command

    @on_workspace
    def delete_workspace_exposure(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        assert request.exposure is not None
        exposure_id = request.exposure.exposure_id
        rules.check(request.kind, steps.rule_facts(workspace))
        valid = workspace.valid_exposures(tx.now)
        if not any(e.id == exposure_id for e in valid):
            raise NotFound(f"exposure {exposure_id} of {workspace.id} not found", field="exposure_id")
        command = self._immediate(tx, workspace, request, f"exposure {exposure_id} deleted")
        workspace.exposures = [e for e in valid if e.id != exposure_id]
        save(tx, workspace, None)
        return command

    @on_workspace
    def revoke_workspace_data_plane_access(self, tx: Tx, workspace: Workspace, request: CommandRequest) -> Command:
        command = self._immediate(tx, workspace, request, "every data-plane credential revoked")
        steps.revoke_credentials(workspace)
        save(tx, workspace, None)
        return command

    def _check_quotas(self, tx: Tx, tenant: str, workspaces: int, vcpus: int, memory_mib: int) -> None:
        quotas = self.settings.quotas
        if not (quotas.workspaces or quotas.vcpus or quotas.memory_mib):
            return
        used = tx.tenant_usage(tenant)
        for name, limit, in_use, more in (
            ("workspaces", quotas.workspaces, used[0], workspaces),
            ("vcpus", quotas.vcpus, used[1], vcpus),
            ("memory_mib", quotas.memory_mib, used[2], memory_mib),
        ):
            if limit and more > 0 and in_use + more > limit:
                raise QuotaExceeded(
                    f"tenant {tenant} would exceed its {name} quota",
                    quota=name,
                    limit=limit,
                    used=in_use,
                    requested=more,
                )

    def _bindable_volume(self, tx: Tx, volume_id: str, workspace_id: str, tenant: str) -> Volume:
        volume = tx.get_volume(volume_id)
        if volume is None or volume.tenant != tenant or volume.state is VolumeState.DELETED:
            raise NotFound(f"volume {volume_id} not found", field="volume_id")
        if volume.workspace_id not in (None, workspace_id):
            raise Conflict(f"volume {volume_id} is bound to workspace {volume.workspace_id}", field="volume_id")
        return volume

    # -- volumes ------------------------------------------------------------------------

    def create_volume(self, tx: Tx, request: CommandRequest) -> Volume:
        tenant, command_id, fingerprint = request.tenant, request.command_id, request.fingerprint
        existing = tx.get_command(tenant, command_id)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise CommandIdReused(f"command ID {command_id} was already used for another request")
            volume = tx.get_volume(existing.volume_id)
            assert volume is not None
            return volume
        volume = Volume(
            id=f"vol-{uuid.uuid4().hex[:20]}",
            storage_pool=self.settings.storage_pool,
            capacity_gib=request.capacity_gib,
            # Standalone volumes live in the control plane's pool record until first bound.
            state=VolumeState.READY,
            create_time=tx.now,
            tenant=tenant,
        )
        tx.put_volume(volume)
        steps.record_command(
            tx, tenant, command_id, CommandKind.CREATE_VOLUME, fingerprint, CommandState.SUCCEEDED, volume_id=volume.id
        )
        return volume

    def delete_volume(self, tx: Tx, request: CommandRequest) -> Volume:
        tenant, command_id, fingerprint, volume_id = (
            request.tenant,
            request.command_id,
            request.fingerprint,
            request.volume_id,
        )
        volume = tx.get_volume(volume_id)
        if volume is None or volume.tenant != tenant:
            raise NotFound(f"volume {volume_id} not found", field="volume_id")
        existing = tx.get_command(tenant, command_id)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise CommandIdReused(f"command ID {command_id} was already used for another request")
            return volume
        if volume.workspace_id is not None:
            raise Conflict(
                f"volume {volume_id} is bound to workspace {volume.workspace_id}",
                hint="unbind it (the workspace must be STOPPED) or delete the workspace first",
            )
        if volume.state is VolumeState.DELETED:
            raise Conflict(f"volume {volume_id} is already deleted")
        volume.state = VolumeState.DELETED
        # Its files (on a node of its pool, if it was ever mounted) go too: the node agent
        # destroys them and clears this (controller.apply_volume_released).
        volume.storage_pending = True
        tx.put_volume(volume)
        steps.record_command(
            tx, tenant, command_id, CommandKind.DELETE_VOLUME, fingerprint, CommandState.SUCCEEDED, volume_id=volume.id
        )
        return volume

    # -- expiration --------------------------------------------------------------------

    def expire(self, tx: Tx, *, workspace_id: str) -> None:
        """Act on a due expiration. Waits (does nothing) while another command runs."""
        workspace = tx.get_workspace(workspace_id)
        if workspace is None or workspace.expiration.expire_time is None:
            return
        if workspace.expiration.expire_time > tx.now or workspace.active_command is not None:
            return
        action = workspace.expiration.action
        command_id = f"expiration/{workspace.id}/r{workspace.expiration.revision}"
        if tx.get_command(workspace.tenant, command_id) is not None:
            command_id = f"{command_id}/{uuid.uuid4()}"
        workspace.expiration = Expiration(revision=workspace.expiration.revision + 1)
        event(tx, workspace, EventType.EXPIRED, command_id=command_id, message=f"expiration: {action.name}")
        if action is ExpirationAction.DELETE and workspace.state not in (
            WorkspaceState.DELETING,
            WorkspaceState.DELETED,
        ):
            self._delete(tx, workspace, command_id, "expiration")
        elif action is ExpirationAction.STOP and workspace.state is WorkspaceState.AVAILABLE:
            self._graceful_stop(tx, workspace, command_id, "expiration", StopCause.EXPIRED)
        else:
            save(tx, workspace, None, message=f"expiration found the workspace {workspace.state.name}: nothing to do")


def _sized(binding: Binding, volume: Volume) -> Binding:
    """The binding with its volume's capacity, which the workspace's volumes show."""
    return Binding(binding.volume_id, binding.mount_path, binding.delete_with_workspace, volume.capacity_gib)


def _check_capacity(tx: Tx, resources: Resources, volumes_gib: int) -> None:
    """Refuse (RESOURCE_EXHAUSTED) what no node could ever hold, before anything is written:
    accepted, it would wait UNSCHEDULABLE for good. What fits a node in all but not now
    waits instead. With no node known yet (one may join) nothing is refused here."""
    why = too_big(tx.list_nodes(), resources.vcpus, resources.memory_mib, resources.writable_layer_gib + volumes_gib)
    if why:
        raise NoCapacity(why, field="spec.resources", hint="ask for less, or add a bigger node")


def _check_mount_paths(bindings: list[Binding]) -> None:
    paths = [b.mount_path for b in bindings]
    if len(set(paths)) != len(paths):
        raise InvalidArgument("two volumes are bound at the same mount path", field="binding.mount_path")
