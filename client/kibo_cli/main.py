"""Entry point of the `kibo` command: drive workspaces from a terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import kibotos
import typer
from kibotos.token_discovery import discover

from . import events, exit_codes, nodes, volumes_and_commands, workspace
from .help import command_of
from .session import Settings, use

HELP = (
    "kibo: drive workspaces from a terminal.\n\n"
    "Talks gRPC to a kibo server: --server HOST:PORT, else $KIBO_SERVER, else 127.0.0.1:50051. "
    "Commands that change something wait until the workspace is steady, showing the state as it goes; "
    "giving up the wait (--timeout) never cancels the command. Every read has -o json."
)

app = typer.Typer(
    help=HELP,
    epilog="Exit codes:\n" + exit_codes.table(),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
app.add_typer(workspace.app, name="workspace")
app.add_typer(volumes_and_commands.command_app, name="command")
app.add_typer(volumes_and_commands.volume_app, name="volume")
app.add_typer(nodes.app, name="node")
app.command("capabilities")(volumes_and_commands.capabilities)
app.command("events")(events.events)


@app.callback()
def _global(
    server: Annotated[
        str,
        typer.Option(envvar="KIBO_SERVER", help="The server's gRPC address, HOST:PORT."),
    ] = kibotos.DEFAULT_ADDRESS,
    tls: Annotated[bool, typer.Option("--tls", help="Use TLS (system roots unless --ca-cert).")] = False,
    ca_cert: Annotated[
        Path | None, typer.Option("--ca-cert", exists=True, dir_okay=False, help="PEM roots to trust (implies --tls).")
    ] = None,
    cert: Annotated[
        Path | None,
        typer.Option("--cert", exists=True, dir_okay=False, help="PEM client certificate (mutual TLS)."),
    ] = None,
    key: Annotated[
        Path | None, typer.Option("--key", exists=True, dir_okay=False, help="PEM private key of --cert.")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="Bearer token sent with every call. Else $KIBO_TOKEN; else, for a loopback server, the "
            "admin token of the local kibo-ctrl serve on that address, whatever its --data-dir (it records "
            "where under $XDG_STATE_HOME/kibo/servers/), then ~/.local/share/kibo/admin.token.",
            show_default=False,
        ),
    ] = None,
) -> None:
    if (cert is None) != (key is None):
        raise typer.BadParameter("give both --cert and --key")
    try:
        kibotos.check_address(server)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--server / KIBO_SERVER") from None
    secure = tls or ca_cert is not None or cert is not None
    found = discover(server, token, given_as="--token")
    use(Settings(server=server, tls=secure, ca_cert=ca_cert, cert=cert, key=key, discovery=found))


def main() -> None:
    # Plain help when stdout is not a terminal, so that piped help is never cut (kibo_cli.help).
    command_of(app)(prog_name="kibo")
