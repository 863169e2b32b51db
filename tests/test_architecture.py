"""The folder tree is the architecture: layers as packages, dependencies pointing inwards.

The contracts are in pyproject.toml (`[tool.importlinter]`); `lint-imports` checks them on
the real package, and each crossing issue 12 measured is replayed on a copy of the package
to show that the check catches it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "server" / "kibo_ctrl"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the repository's contracts, on the kibo_ctrl found in `package_parent`."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(REPO / "pyproject.toml")],
        cwd=package_parent,
        env={"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(package_parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    result = lint_imports(REPO / "server")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


# (module, the import added to it, the contract that must break): the crossings issue 12
# measured on the flat package, each as it would be written in the layered one.
CROSSINGS = [
    pytest.param("api/control_plane.py", "from ..runtime.sim import simulator", "Adapters are chosen", id="api-sim"),
    pytest.param("api/data_plane.py", "from ..runtime.process import runtime", "Adapters are chosen", id="dp-process"),
    pytest.param("engine/controller.py", "from . import service", "Engine: loops on top", id="controller-service"),
    pytest.param("domain/validation.py", "from ..engine import steps", "Layers: each imports", id="validation-steps"),
    pytest.param("store/sqlite.py", "from ..api import auth", "Layers: each imports", id="store-auth"),
    pytest.param("transport/errors.py", "import sqlite3", "Only the store speaks SQL", id="transport-sqlite3"),
    pytest.param("domain/model.py", "import asyncio", "The domain is pure", id="domain-io"),
    pytest.param("engine/service.py", "import grpc", "nothing knows the wire", id="engine-wire"),
    pytest.param("runtime/sim/simulator.py", "from ..process import sandbox", "Runtime adapters", id="sim-process"),
]


@pytest.mark.parametrize(("module", "line", "contract"), CROSSINGS)
def test_a_wrong_import_breaks_the_contracts(tmp_path: Path, module: str, line: str, contract: str) -> None:
    copy = tmp_path / "kibo_ctrl"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}  # deliberately wrong\n")
    result = lint_imports(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    broken = output[output.index("Broken contracts") :] if "Broken contracts" in output else ""
    assert contract in broken, output
    dotted = "kibo_ctrl." + module.removesuffix(".py").replace("/", ".")
    assert dotted in broken, output


def test_the_copy_without_a_wrong_import_passes(tmp_path: Path) -> None:
    """The copies above fail because of their one added line, not because they are copies."""
    shutil.copytree(PACKAGE, tmp_path / "kibo_ctrl", ignore=shutil.ignore_patterns("__pycache__"))
    result = lint_imports(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
