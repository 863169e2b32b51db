"""`kibo command get`, `kibo volume create|get|delete`, `kibo capabilities`."""

from __future__ import annotations

from typing import Annotated

import typer

from . import output, render
from .output import Format
from .session import CommandIdOpt, OutputOpt, YesOpt, command_id_or_new, confirm, connect, handle

command_app = typer.Typer(help="Commands: the result of any mutating call, by command ID.", no_args_is_help=True)
volume_app = typer.Typer(help="Volumes that outlive workspaces (bind one with workspace create --volume).")


@command_app.command(
    "get",
    help=(
        "A command's state and result (durability for stops, the error when FAILED), the server's "
        "own commands (guest-shutdown/..., host-memory/...) included."
    ),
)
@handle
def command_get(
    command_id: Annotated[str, typer.Argument(help="The command ID.", show_default=False)],
    fmt: OutputOpt = Format.text,
) -> None:
    with connect() as client:
        command = client.get_command(command_id)
    if fmt is Format.json:
        output.emit_json(command)
    else:
        output.stdout().print(render.command(command))


VolumeId = Annotated[str, typer.Argument(help="The volume ID (vol-...).", show_default=False)]


@volume_app.command("create")
@handle
def volume_create(
    capacity: Annotated[int, typer.Option(help="Capacity, GiB (0: the server default).")] = 0,
    command_id: CommandIdOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the volume ID.")] = False,
    fmt: OutputOpt = Format.text,
) -> None:
    """Create a standalone volume."""
    command_id = command_id_or_new(command_id)
    with connect() as client:
        volume = client.create_volume(capacity, command_id=command_id)
    if quiet:
        output.stdout().print(volume.volume_id, markup=False)
    elif fmt is Format.json:
        output.emit_json(volume)
    else:
        output.stdout().print(render.volume(volume))


@volume_app.command("get")
@handle
def volume_get(volume_id: VolumeId, fmt: OutputOpt = Format.text) -> None:
    """Show a volume: state, capacity, pool, the workspace it is bound to."""
    with connect() as client:
        volume = client.get_volume(volume_id)
    if fmt is Format.json:
        output.emit_json(volume)
    else:
        output.stdout().print(render.volume(volume))


@volume_app.command("delete")
@handle
def volume_delete(
    volume_id: VolumeId,
    yes: YesOpt = False,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Delete an unbound volume and its data. Asks for confirmation unless --yes (required without a terminal)."""
    command_id = command_id_or_new(command_id)
    confirm(f"Delete volume {volume_id} and its data?", yes, require_terminal=True)
    with connect() as client:
        volume = client.delete_volume(volume_id, command_id=command_id)
    if fmt is Format.json:
        output.emit_json(volume)
    else:
        output.stdout().print(render.volume(volume))


@handle
def capabilities(fmt: OutputOpt = Format.text) -> None:
    """What this server declares (workspace.stop.force, workspace.stop.guest_shutdown...)."""
    with connect() as client:
        names = client.get_capabilities()
    if fmt is Format.json:
        output.emit_json({"capabilities": names})
    else:
        for name in names:
            output.stdout().print(name, markup=False)
