"""Regenerate the Go code of the Go SDK (sdk/go/gen) from proto/. Run: python gen/generate_go.py

protoc with Debian's protoc-gen-go and protoc-gen-go-grpc (examples/setup.sh installs them).
The protos' go_package names the stand-alone import path github.com/kibo-dev/kibo/gen/go/...;
the SDK module maps every kibo file to its own tree instead (`M` options), so nothing in
proto/ changes. google/rpc/status.proto maps to the genproto package Debian ships.
`--check` compares a fresh generation with sdk/go/gen (tests/system/test_go_sdk.py runs it).
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
MODULE = "github.com/kibo-dev/kibo/sdk/go"
OUT = ROOT / "sdk" / "go" / "gen"
TOOLS = ("protoc", "protoc-gen-go", "protoc-gen-go-grpc")
STATUS = "google/rpc/status.proto=google.golang.org/genproto/googleapis/rpc/status"


def _files() -> list[str]:
    return sorted(str(p.relative_to(PROTO)) for p in (PROTO / "kibo").rglob("*.proto"))


def _mappings(files: list[str]) -> list[str]:
    """kibo/ctrl/v1/x.proto -> MODULE/gen/kibo/ctrl/v1;ctrlv1 (the package name the protos use)."""
    maps = [STATUS]
    for name in files:
        directory = str(Path(name).parent)
        package = directory.split("/")[-2] + directory.split("/")[-1]  # kibo/ctrl/v1 -> ctrlv1
        maps.append(f"{name}={MODULE}/gen/{directory};{package}")
    return maps


def generate(out: Path) -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not installed: run `bash examples/setup.sh`")
    files = _files()
    options = ["paths=source_relative", *(f"M{m}" for m in _mappings(files))]
    out.mkdir(parents=True, exist_ok=True)
    command = [
        "protoc",
        f"-I{PROTO}",
        f"--go_out={out}",
        *(f"--go_opt={o}" for o in options),
        f"--go-grpc_out={out}",
        *(f"--go-grpc_opt={o}" for o in options),
        *files,
    ]
    subprocess.run(command, check=True, cwd=ROOT)


def _stale(fresh: Path, committed: Path) -> list[str]:
    """Paths (relative) that differ, are missing or are extra in `committed`."""
    fresh_files = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    committed_files = {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()}
    differ = [
        str(p)
        for p in sorted(fresh_files & committed_files)
        if not filecmp.cmp(fresh / p, committed / p, shallow=False)
    ]
    return sorted({*differ, *(str(p) for p in fresh_files ^ committed_files)})


def main(argv: list[str]) -> int:
    if "--check" in argv:
        with tempfile.TemporaryDirectory() as scratch:
            generate(Path(scratch))
            stale = _stale(Path(scratch), OUT)
        if stale:
            print(f"sdk/go/gen is stale ({', '.join(stale)}): run `python gen/generate_go.py`", file=sys.stderr)
            return 1
        return 0
    shutil.rmtree(OUT, ignore_errors=True)
    generate(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
