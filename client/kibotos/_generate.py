"""Write kibotos/client.py (the blocking Client) from kibotos/aio.py (AsyncClient), with unasync.

The client is written once, awaitable; unasync removes `async`/`await` and renames the names
below, then ruff sorts the imports and formats the result. The generated file is committed, so
the SDK needs no unasync at run time.

    python -m kibotos._generate           # rewrite client/kibotos/client.py
    python -m kibotos._generate --check   # exit 1, with a diff, when client.py is stale

tests/unit/test_sdk_generated.py runs the check in CI.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

PACKAGE = Path(__file__).resolve().parent
SOURCE = PACKAGE / "aio.py"
TARGET = PACKAGE / "client.py"

# Async names and their blocking twins, beyond unasync's own (__aenter__, AsyncIterator, ...;
# it also turns any other `AsyncX` into `SyncX`, e.g. call_options.AsyncCall -> SyncCall).
REPLACEMENTS = {
    "AsyncClient": "Client",
    "open_async_channel": "open_channel",
    "settle_async": "settle",
    "wait_async": "wait",
    "retrying_async": "retrying",
    "aclosing": "closing",
}
HEADER = "# Generated from aio.py by `python -m kibotos._generate` (unasync): edit aio.py, not this file.\n"
# Lint waivers that only the async source needs (ruff's ASYNC rules).
_ASYNC_NOQA = re.compile(r"  # noqa: ASYNC\d+[^\n]*")


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        raise SystemExit("ruff not found: pip install -e '.[dev]'")
    return found


def _ruff_stdin(arguments: list[str], text: str) -> str:
    done = subprocess.run(
        [_ruff(), *arguments, "--stdin-filename", str(TARGET), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        cwd=PACKAGE,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(arguments)} failed on the generated client:\n{done.stderr}{done.stdout}")
    return done.stdout


def generate() -> str:
    """The text client.py must have: unasync of aio.py, then ruff's import sort and format."""
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "_async" / "aio.py"
        source.parent.mkdir()
        shutil.copyfile(SOURCE, source)
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(source)], [rule])
        text = (Path(scratch) / "_sync" / "aio.py").read_text()
    text = HEADER + _ASYNC_NOQA.sub("", text)
    # Import order and unused imports after the renames; `for x in xs: yield x`, which async
    # code must spell out, becomes `yield from xs` (the same for these lists).
    text = _ruff_stdin(["check", "--fix", "--unsafe-fixes", "--select", "I,F401,UP028", "--quiet"], text)
    return _ruff_stdin(["format", "--quiet"], text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kibotos._generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when client.py is stale")
    arguments = parser.parse_args(argv)
    fresh = generate()
    current = TARGET.read_text() if TARGET.exists() else ""
    if arguments.check:
        if fresh == current:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True), fresh.splitlines(keepends=True), "client.py (committed)", "generated"
        )
        sys.stdout.writelines(diff)
        print("client/kibotos/client.py is stale: run `python -m kibotos._generate` and commit it", file=sys.stderr)
        return 1
    if fresh != current:
        TARGET.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
