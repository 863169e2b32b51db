"""`kibo workspace bind-volume|rebind-volume|unbind-volume|network-policy|revoke-access`:
what a workspace is connected to (its volume bindings, its egress) and who may reach its data
plane. Each is one command, settled (resent until terminal) like resize and labels."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated

import kibotos
import typer
from kibo.ctrl.v1 import workspace_pb2

from . import output, render
from .exit_codes import ExitCode
from .output import Format
from .session import CommandIdOpt, OutputOpt, command_id_or_new, connect, fail, handle

WorkspaceId = Annotated[str, typer.Argument(help="The workspace ID (ws-...).", show_default=False)]
VolumeId = Annotated[str, typer.Argument(help="The volume ID (vol-...).", show_default=False)]


class Egress(enum.StrEnum):
    allow_all = "allow-all"
    deny_all = "deny-all"
    allow_listed = "allow-listed"

    def wire(self) -> int:
        return {
            Egress.allow_all: workspace_pb2.NETWORK_EGRESS_ALLOW_ALL,
            Egress.deny_all: workspace_pb2.NETWORK_EGRESS_DENY_ALL,
            Egress.allow_listed: workspace_pb2.NETWORK_EGRESS_ALLOW_LISTED,
        }[self]


def _emit(response: kibotos.CommandResponse, fmt: Format, text: str) -> None:
    if fmt is Format.json:
        output.emit_json({"workspace": output.to_dict(response.workspace), "command": output.to_dict(response.command)})
    else:
        output.stdout().print(text, markup=False)


def _binding(workspace: workspace_pb2.Workspace, volume_id: str) -> workspace_pb2.VolumeBinding | None:
    return next((b for b in workspace.spec.volumes if b.volume_id == volume_id), None)


def _bound_text(workspace: workspace_pb2.Workspace, volume_id: str) -> str:
    binding = _binding(workspace, volume_id)
    if binding is None:
        return f"{workspace.workspace_id}: {volume_id} is not bound"
    return f"{workspace.workspace_id}: {volume_id} at {binding.mount_path}, {render.volume_fate(binding)}"


DeleteWithOpt = Annotated[
    bool,
    typer.Option(
        "--delete-with-workspace",
        help="Delete the volume and its data when the workspace is deleted (default: keep it, only unbound).",
    ),
]


@handle
def bind_volume(
    workspace_id: WorkspaceId,
    volume_id: VolumeId,
    mount_path: Annotated[str, typer.Option("--mount-path", help="Absolute guest path to mount it at.")],
    delete_with_workspace: DeleteWithOpt = False,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Bind an existing volume to a workspace (the workspace must be STOPPED; it is mounted at the next start)."""
    command_id = command_id_or_new(command_id)
    with connect() as client:
        response = client.bind_workspace_volume(
            workspace_id, volume_id, mount_path, delete_with_workspace=delete_with_workspace, command_id=command_id
        )
    _emit(response, fmt, _bound_text(response.workspace, volume_id))


@handle
def rebind_volume(
    workspace_id: WorkspaceId,
    volume_id: VolumeId,
    mount_path: Annotated[str | None, typer.Option("--mount-path", help="New guest path (default: keep).")] = None,
    delete_with_workspace: Annotated[
        bool | None,
        typer.Option(
            "--delete-with-workspace/--keep-on-delete",
            help="Whether deleting the workspace deletes the volume (default: keep the current setting).",
            show_default=False,
        ),
    ] = None,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Change a bound volume's mount path or whether it is deleted with the workspace (STOPPED only).
    Exits 3 when the volume is not bound to the workspace (bind it with bind-volume)."""
    command_id = command_id_or_new(command_id)
    if mount_path is None and delete_with_workspace is None:
        raise fail("nothing to change: give --mount-path or --delete-with-workspace/--keep-on-delete", ExitCode.USAGE)
    with connect() as client:
        current = _binding(client.get_workspace(workspace_id), volume_id)
        if current is None:
            raise fail(
                f"{volume_id} is not bound to {workspace_id}",
                ExitCode.NOT_FOUND,
                hint=f"kibo workspace bind-volume {workspace_id} {volume_id} --mount-path PATH",
            )
        response = client.bind_workspace_volume(
            workspace_id,
            volume_id,
            mount_path if mount_path is not None else current.mount_path,
            delete_with_workspace=(
                delete_with_workspace if delete_with_workspace is not None else current.delete_with_workspace
            ),
            command_id=command_id,
        )
    _emit(response, fmt, _bound_text(response.workspace, volume_id))


@handle
def unbind_volume(
    workspace_id: WorkspaceId, volume_id: VolumeId, command_id: CommandIdOpt = None, fmt: OutputOpt = Format.text
) -> None:
    """Remove a volume's binding (the workspace must be STOPPED). The volume and its data stay:
    delete it with kibo volume delete."""
    command_id = command_id_or_new(command_id)
    with connect() as client:
        response = client.unbind_workspace_volume(workspace_id, volume_id, command_id=command_id)
    _emit(response, fmt, _bound_text(response.workspace, volume_id))


@handle
def network_policy(
    workspace_id: WorkspaceId,
    egress: Annotated[
        Egress | None,
        typer.Option(
            help=(
                "What the guest may reach. Default: show the policy; with --allow, --allow-domain or --port "
                "allow-listed, with only --deny or --deny-domain allow-all."
            ),
            show_default=False,
        ),
    ] = None,
    allow: Annotated[
        list[str] | None, typer.Option("--allow", help="A CIDR the guest may reach (repeat; implies allow-listed).")
    ] = None,
    deny: Annotated[
        list[str] | None,
        typer.Option("--deny", help="A CIDR the guest may not reach (repeat; deny beats allow; not with deny-all)."),
    ] = None,
    allow_domain: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-domain",
            help="A name the guest may reach: api.github.com or *.pypi.org (repeat; implies allow-listed).",
        ),
    ] = None,
    deny_domain: Annotated[
        list[str] | None,
        typer.Option(
            "--deny-domain",
            help=(
                "A name the node's resolver refuses (repeat; deny beats allow; not with deny-all). Under allow-all "
                "a guest with its own resolver is not stopped: use allow-listed for a boundary."
            ),
        ),
    ] = None,
    port: Annotated[
        list[int] | None,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            help="A TCP/UDP port the allowed CIDRs and domains are limited to (repeat; default: any port).",
        ),
    ] = None,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Show or replace the workspace's egress policy (AVAILABLE: applied at once, connections it no
    longer allows are cut; STOPPED: at the next start). The options given replace the whole policy.

    Precedence: what no policy opens (the node, the control plane, link-local, other guests) >
    --deny and --deny-domain > --allow and --allow-domain > the egress default. Domains are exact
    (api.github.com) or *.example.com (any name under example.com, not example.com itself), followed
    through the node's resolver as their addresses change. --port limits what --allow and
    --allow-domain open."""
    command_id = command_id_or_new(command_id)
    rules = _PolicyRules(allow or [], deny or [], allow_domain or [], deny_domain or [], port or [])
    chosen = rules.egress(egress)
    with connect() as client:
        if chosen is None:
            workspace = client.get_workspace(workspace_id)
            if fmt is Format.json:
                output.emit_json(output.to_dict(workspace.spec.network_policy))
            else:
                output.stdout().print(f"{workspace_id}: {render.network(workspace.spec)}", markup=False)
            return
        response = client.set_workspace_network_policy(
            workspace_id,
            chosen.wire(),
            rules.allow,
            denied_cidrs=rules.deny,
            allowed_domains=rules.allow_domain,
            denied_domains=rules.deny_domain,
            allowed_ports=rules.port,
            command_id=command_id,
        )
    _emit(response, fmt, f"{workspace_id}: {render.network(response.workspace.spec)}")


@dataclasses.dataclass(frozen=True)
class _PolicyRules:
    """The lists of `kibo workspace network-policy`, checked as the server checks them (so a
    combination it refuses is a usage error before any round trip)."""

    allow: list[str]
    deny: list[str]
    allow_domain: list[str]
    deny_domain: list[str]
    port: list[int]

    def egress(self, given: Egress | None) -> Egress | None:
        """The egress to send (None: nothing to change, show the policy); raises a usage error."""
        allowing = [name for name, values in self._allowing() if values]
        denying = [name for name, values in self._denying() if values]
        if given is None and not allowing and not denying:
            return None
        chosen = given or (Egress.allow_listed if allowing else Egress.allow_all)
        if allowing and chosen is not Egress.allow_listed:
            raise fail(f"{', '.join(allowing)}: only with --egress allow-listed", ExitCode.USAGE)
        if denying and chosen is Egress.deny_all:
            raise fail(
                f"{', '.join(denying)}: only with --egress allow-all or allow-listed (deny-all denies everything)",
                ExitCode.USAGE,
            )
        if chosen is Egress.allow_listed and not (self.allow or self.allow_domain):
            raise fail("--egress allow-listed needs at least one --allow CIDR or --allow-domain NAME", ExitCode.USAGE)
        return chosen

    def _allowing(self) -> list[tuple[str, list[str] | list[int]]]:
        return [("--allow", self.allow), ("--allow-domain", self.allow_domain), ("--port", self.port)]

    def _denying(self) -> list[tuple[str, list[str] | list[int]]]:
        return [("--deny", self.deny), ("--deny-domain", self.deny_domain)]


@handle
def revoke_access(workspace_id: WorkspaceId, command_id: CommandIdOpt = None, fmt: OutputOpt = Format.text) -> None:
    """Invalidate every data-plane credential issued for the workspace (AVAILABLE); the next
    kibo workspace exec or cp gets a new one."""
    command_id = command_id_or_new(command_id)
    with connect() as client:
        response = client.revoke_workspace_data_plane_access(workspace_id, command_id=command_id)
    _emit(response, fmt, f"{workspace_id}: data-plane access revoked")
