"""Regenerate the Python stubs in gen/ from proto/. Run: python gen/generate.py

Produces messages (_pb2.py), typing stubs (.pyi), grpc stubs (_pb2_grpc.py) and connectrpc
stubs (_connect.py). CI runs it and fails when the result differs from what is committed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
GEN = ROOT / "gen"
# Our own packages only: google/rpc comes from googleapis-common-protos at run time.
PACKAGES = ("kibo",)


def main() -> int:
    for package in PACKAGES:
        shutil.rmtree(GEN / package, ignore_errors=True)
    files = sorted(str(p.relative_to(PROTO)) for pkg in PACKAGES for p in (PROTO / pkg).rglob("*.proto"))
    plugin = shutil.which("protoc-gen-connectrpc", path=str(Path(sys.executable).parent))
    if plugin is None:
        print("protoc-gen-connectrpc not found next to this Python; pip install -e '.[dev]'", file=sys.stderr)
        return 1
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO}",
        f"--plugin=protoc-gen-connectrpc={plugin}",
        f"--python_out={GEN}",
        f"--pyi_out={GEN}",
        f"--grpc_python_out={GEN}",
        f"--connectrpc_out=protobuf=google:{GEN}",
        *files,
    ]
    subprocess.run(command, check=True, cwd=ROOT)
    for package in PACKAGES:
        for directory in [GEN / package, *(p for p in (GEN / package).rglob("*") if p.is_dir())]:
            (directory / "__init__.py").touch()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
