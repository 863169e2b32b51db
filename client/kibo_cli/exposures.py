"""`kibo workspace expose|exposures|unexpose`: URLs to a TCP port in a running guest.

An exposure's token (access TOKEN) is stored hashed by the server and is in the answer of the
request that made it only, so `expose` prints it once, with how to use it; nothing shows it
again (unexpose and expose again for a new one)."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from kibo.ctrl.v1 import workspace_pb2

from . import output, parsing
from .exit_codes import ExitCode
from .output import Format, enum_name, when
from .session import CommandIdOpt, OutputOpt, command_id_or_new, connect, fail, handle

WorkspaceId = Annotated[str, typer.Argument(help="The workspace ID (ws-...).", show_default=False)]
TOKEN_HEADER = "X-Kibo-Exposure-Token"
TOKEN_PARAMETER = "kibo_token"
# The longest the server lets an exposure last (366 days).
MAX_EXPIRE_SECONDS = 366 * 24 * 3600


def access(exposure: workspace_pb2.Exposure) -> str:
    return enum_name(workspace_pb2.ExposureAccess, exposure.access, "EXPOSURE_ACCESS_")


def expiry(exposure: workspace_pb2.Exposure) -> str:
    stamp = when(exposure.expire_time, exposure, "expire_time")
    return "until revoked" if stamp == "-" else f"until {stamp}"


def expire_seconds(text: str | None) -> int:
    """--expire-in as whole seconds (rounded up), 0 when not given; a usage error otherwise."""
    if text is None:
        return 0
    try:
        seconds = parsing.duration(text)
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    if not 1 <= math.ceil(seconds) <= MAX_EXPIRE_SECONDS:
        raise fail(f"--expire-in {text}: give 1s to 366d", ExitCode.USAGE)
    return math.ceil(seconds)


def how_to_use(exposure: workspace_pb2.Exposure) -> list[str]:
    """The lines `expose` prints: the URL, and for a token exposure the token and its two forms."""
    lines = [
        f"{exposure.workspace_id}: port {exposure.port} exposed at {exposure.url} "
        f"({access(exposure)}, {expiry(exposure)}; exposure {exposure.exposure_id})"
    ]
    if exposure.access != workspace_pb2.EXPOSURE_ACCESS_TOKEN:
        lines.append("anyone with the URL can reach it")
    elif exposure.token:
        separator = "&" if "?" in exposure.url else "?"
        lines += [
            f"token: {exposure.token}",
            "  shown once: it is stored hashed (to replace it, unexpose and expose again)",
            f"  programs: send the header {TOKEN_HEADER}: {exposure.token}",
            f"    curl -H '{TOKEN_HEADER}: {exposure.token}' {exposure.url}",
            f"  browsers: open {exposure.url}{separator}{TOKEN_PARAMETER}={exposure.token} once (it sets a cookie "
            "for that host and drops the parameter)",
        ]
    else:
        lines.append(
            "token: not shown (only the request that made the exposure gets it); to get a new one: "
            f"kibo workspace unexpose {exposure.workspace_id} {exposure.exposure_id}, then expose again"
        )
    return lines


@handle
def expose(
    workspace_id: WorkspaceId,
    port: Annotated[int, typer.Argument(min=1, max=65535, help="The guest's TCP port.", show_default=False)],
    public: Annotated[
        bool, typer.Option("--public", help="Anyone with the URL may use it (default: it needs the token).")
    ] = False,
    expire_in: Annotated[
        str | None,
        typer.Option("--expire-in", help="End it after this long, e.g. 30m, 1h, 90s (default: until revoked)."),
    ] = None,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Give a TCP port in the guest a URL (the workspace must be AVAILABLE; one exposure per port).
    Prints the URL and, unless --public, its token, once: send it as the X-Kibo-Exposure-Token
    header, or open the URL once with ?kibo_token=TOKEN in a browser. It ends when unexposed, at
    --expire-in, or when the workspace stops (expose again after the next start). -o json prints
    the Exposure."""
    command_id = command_id_or_new(command_id)
    seconds = expire_seconds(expire_in)
    with connect() as client:
        response = client.create_workspace_exposure(
            workspace_id, port, public=public, expire_in_seconds=seconds, command_id=command_id
        )
    if fmt is Format.json:
        output.emit_json(response.exposure)
        return
    console = output.stdout()
    for line in how_to_use(response.exposure):
        console.print(output.printable(line), markup=False, soft_wrap=True)


@handle
def exposures(workspace_id: WorkspaceId, fmt: OutputOpt = Format.text) -> None:
    """List the workspace's exposures valid now (URL, port, access, expiry); tokens are never shown
    again. A stopped workspace has none."""
    with connect() as client:
        found = client.list_workspace_exposures(workspace_id)
    if fmt is Format.json:
        output.emit_json({"exposures": [output.to_dict(e) for e in found]})
        return
    if not found:
        output.stdout().print(f"{workspace_id}: no exposures", markup=False)
        return
    rows = output.table("EXPOSURE", "URL", "PORT", "ACCESS", "EXPIRES")
    for exposure in sorted(found, key=lambda e: e.port):
        rows.add_row(exposure.exposure_id, exposure.url, str(exposure.port), access(exposure), expiry(exposure))
    output.stdout().print(rows)


@handle
def unexpose(
    workspace_id: WorkspaceId,
    exposure_id: Annotated[
        str, typer.Argument(help="The exposure's ID (ex-..., see kibo workspace exposures).", show_default=False)
    ],
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Revoke one exposure (the workspace must be AVAILABLE): its URL stops answering and its open
    connections are cut."""
    command_id = command_id_or_new(command_id)
    with connect() as client:
        response = client.delete_workspace_exposure(workspace_id, exposure_id, command_id=command_id)
    if fmt is Format.json:
        output.emit_json({"workspace": output.to_dict(response.workspace), "command": output.to_dict(response.command)})
        return
    output.stdout().print(f"{workspace_id}: exposure {exposure_id} revoked", markup=False)
