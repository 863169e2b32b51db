"""Write the blocking twins of the awaitable SDK modules, with unasync: kibotos/client.py (Client)
from kibotos/aio.py (AsyncClient), and kibotos/access.py (WorkspaceAccess, Processes, Files) from
kibotos/aio_access.py (AsyncWorkspaceAccess...): the PAIRS below.

Each is written once, awaitable; unasync removes `async`/`await` and renames the names below,
then ruff sorts the imports and formats the result. The generated files are committed, so the
SDK needs no unasync at run time.

    python -m kibotos._generate           # rewrite every target
    python -m kibotos._generate --check   # exit 1, with a diff, when a target is stale

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
# (awaitable source, blocking target), each a file of this package.
PAIRS: list[tuple[Path, Path]] = [
    (PACKAGE / "aio.py", PACKAGE / "client.py"),
    (PACKAGE / "aio_access.py", PACKAGE / "access.py"),
]

# Async names and their blocking twins, beyond unasync's own (__aenter__, AsyncIterator, ...;
# it also turns any other `AsyncX` into `SyncX`, e.g. call_options.AsyncCall -> SyncCall).
REPLACEMENTS = {
    "AsyncClient": "Client",
    "open_async_channel": "open_channel",
    "settle_async": "settle",
    "wait_async": "wait",
    "retrying_async": "retrying",
    "aclosing": "closing",
    "aclose": "close",
    "anext": "next",
    # kibotos/aio_access.py -> kibotos/access.py
    "aio": "client",
    "aio_access": "access",
    "AsyncWorkspaceAccess": "WorkspaceAccess",
    "AsyncProcesses": "Processes",
    "AsyncProcessHandle": "ProcessHandle",
    "AsyncFiles": "Files",
    "offload_async": "offload",
    "sleep_async": "sleep",
}
HEADER = "# Generated from {source} by `python -m kibotos._generate` (unasync): edit {source}, not this file.\n"
# Lint waivers that only the async source needs (ruff's ASYNC rules).
_ASYNC_NOQA = re.compile(r"  # noqa: ASYNC\d+[^\n]*")


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        raise SystemExit("ruff not found: pip install -e '.[dev]'")
    return found


def _ruff_stdin(arguments: list[str], text: str, target: Path) -> str:
    done = subprocess.run(
        [_ruff(), *arguments, "--stdin-filename", str(target), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        cwd=PACKAGE,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"ruff {' '.join(arguments)} failed on the generated {target.name}:\n{done.stderr}{done.stdout}"
        )
    return done.stdout


def generate(source: Path, target: Path) -> str:
    """The text `target` must have: unasync of `source`, then ruff's import sort and format."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "_async" / source.name
        copy.parent.mkdir()
        shutil.copyfile(source, copy)
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(copy)], [rule])
        text = (Path(scratch) / "_sync" / source.name).read_text()
    text = HEADER.format(source=source.name) + _ASYNC_NOQA.sub("", text)
    # Import order and unused imports after the renames; `for x in xs: yield x`, which async
    # code must spell out, becomes `yield from xs` (the same for these lists).
    text = _ruff_stdin(["check", "--fix", "--unsafe-fixes", "--select", "I,F401,UP028", "--quiet"], text, target)
    return _ruff_stdin(["format", "--quiet"], text, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kibotos._generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a target is stale")
    arguments = parser.parse_args(argv)
    stale = 0
    for source, target in PAIRS:
        fresh = generate(source, target)
        current = target.read_text() if target.exists() else ""
        if fresh == current:
            continue
        if arguments.check:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                fresh.splitlines(keepends=True),
                f"{target.name} (committed)",
                "generated",
            )
            sys.stdout.writelines(diff)
            print(
                f"client/kibotos/{target.name} is stale: run `python -m kibotos._generate` and commit it",
                file=sys.stderr,
            )
            stale = 1
        else:
            target.write_text(fresh)
    return stale


if __name__ == "__main__":
    raise SystemExit(main())
