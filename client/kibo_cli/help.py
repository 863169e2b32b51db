"""Help text that is never cut: boxed rich help on a terminal, plain click help when piped.

Rich lays help out in boxes as wide as the terminal, and 80 columns when there is none, so
`kibo ... --help > file` used to cut option names (`--insecure-no-au…`). Piped help, and the
CLI reference in the README (`python -m kibo_cli.docs`), are click's plain text instead,
wrapped at `WIDTH` and never truncated."""

from __future__ import annotations

import sys

import typer
from typer._click import core as click_core  # typer 0.29 vendors click

WIDTH = 100
CONTEXT: dict[str, object] = {"max_content_width": WIDTH, "terminal_width": WIDTH}


def _keep_preformatted(text: str | None) -> str | None:
    """Mark paragraphs laid out by hand (indented lines, e.g. the exit-code table) so that
    click does not rewrap them (its `\\b` marker)."""
    if not text:
        return text
    paragraphs = text.split("\n\n")
    return "\n\n".join(f"\b\n{p}" if any(line.startswith("  ") for line in p.splitlines()) else p for p in paragraphs)


def make_plain(command: click_core.Command) -> click_core.Command:
    """Switch `command` and all its subcommands to plain click help."""
    command.rich_markup_mode = None  # type: ignore[attr-defined]
    command.help = _keep_preformatted(command.help)
    command.epilog = _keep_preformatted(command.epilog)
    command.context_settings = {**command.context_settings, **CONTEXT}
    if command.help and not command.short_help:
        # The first paragraph whole: click would cut it with "..." in the list of commands.
        command.short_help = " ".join(command.help.split("\n\n")[0].split())
    for subcommand in getattr(command, "commands", {}).values():
        make_plain(subcommand)
    return command


def command_of(app: typer.Typer, *, plain: bool | None = None) -> click_core.Command:
    """The click command of `app`; plain help when `plain`, by default when stdout is no terminal."""
    command = typer.main.get_command(app)
    if plain if plain is not None else not sys.stdout.isatty():
        make_plain(command)
    return command
