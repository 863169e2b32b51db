"""The CLI reference of the README, generated from the `kibo` command itself.

    python -m kibo_cli.docs                 # print the reference (Markdown)
    python -m kibo_cli.docs --write README.md   # replace it between the README's markers

Every command's plain help (kibo_cli.help), in the order `kibo --help` lists them, then the
server's (`kibo-ctrl`).
tests/system/test_readme.py fails when the README's copy differs from what this prints."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from typer._click import core as click_core  # typer 0.29 vendors click
from typer.core import TyperGroup

from .help import WIDTH, command_of
from .main import app

BEGIN = "<!-- cli-reference:begin (generated: python -m kibo_cli.docs --write README.md) -->"
END = "<!-- cli-reference:end -->"


def _context(command: click_core.Command, name: str, parent: click_core.Context | None) -> click_core.Context:
    return click_core.Context(command, info_name=name, parent=parent, max_content_width=WIDTH, terminal_width=WIDTH)


def _walk(command: click_core.Command, ctx: click_core.Context) -> Iterator[tuple[str, str]]:
    yield ctx.command_path, command.get_help(ctx).rstrip()
    if isinstance(command, TyperGroup):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, _context(sub, name, ctx))


def reference() -> str:
    """`kibo` and every subcommand, then `kibo-ctrl` (the server) and its subcommands."""
    from kibo_ctrl.cli import cli as server_cli  # the server's command line, documented alongside

    parts = []
    for app_, name in ((app, "kibo"), (server_cli, "kibo-ctrl")):
        root = command_of(app_, plain=True)
        for path, text in _walk(root, _context(root, name, None)):
            parts.append(f"#### `{path}`\n\n```text\n{text}\n```\n")
    return "\n".join(parts)


def block() -> str:
    """The reference with its markers, as it stands in the README."""
    return f"{BEGIN}\n\n{reference()}\n{END}"


def replace_in(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + block() + text[end:]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(replace_in(path.read_text()))
        return 0
    if argv:
        print("usage: python -m kibo_cli.docs [--write README.md]", file=sys.stderr)
        return 2
    print(block())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
