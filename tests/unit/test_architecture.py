"""The folder tree is the architecture: layers as packages, dependencies pointing inwards.

The contracts are in pyproject.toml (`[tool.importlinter]`); `lint-imports` checks them on
the real package, and each crossing issue 12 measured is replayed on a copy of the package
to show that the check catches it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo_ctrl import routes
from kibo_ctrl.api import commands
from kibo_ctrl.api.control_plane import Api
from kibo_ctrl.api.data_plane import DataPlane
from kibo_ctrl.api.data_plane_files import DataPlaneFiles
from kibo_ctrl.api.data_plane_processes import DataPlaneProcesses
from kibo_ctrl.runtime.sim.api import SimulatorApi
from kibo_ctrl.transport.rpc import ServerStream, Service, Unary

REPO = Path(__file__).resolve().parents[2]
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
    # The file-path rule lives beside guest_exec.py; the data plane asks the runtime for it.
    pytest.param("api/data_plane.py", "from ..runtime.process import safepath", "Adapters are", id="dp-safepath"),
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


def _architecture_md_modules() -> set[str]:
    """The modules ARCHITECTURE.md's "Modules" list names, as paths under kibo_ctrl/."""
    text = (REPO / "ARCHITECTURE.md").read_text()
    start = text.index("### Modules")
    section = text[start : text.index("\n## ", start)]
    groups: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            groups.append(line[2:])
        elif line.startswith("  ") and groups:
            groups[-1] += " " + line.strip()
    named = set()
    for group in groups:
        head = re.match(r"(top|`([\w/]+/)`):", group)
        assert head, f"ARCHITECTURE.md: a module group must start with top: or `package/`: {group!r}"
        prefix = head.group(2) or ""
        named.update(prefix + module for module in re.findall(r"`([\w/]+\.py)`", group[head.end() :]))
    return named


def test_architecture_md_names_every_module_and_no_other() -> None:
    actual = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    named = _architecture_md_modules()
    assert not actual - named, f"ARCHITECTURE.md's module list does not name: {sorted(actual - named)}"
    assert not named - actual, (
        f"ARCHITECTURE.md's module list names modules that do not exist: {sorted(named - actual)}"
    )


# -- explicit dispatch: each RPC table names every proto method, with the proto's types ------

TABLES = [
    pytest.param(routes.workspace_service, Api, id="WorkspaceService"),
    pytest.param(routes.observation_service, Api, id="WorkspaceObservationService"),
    pytest.param(routes.volume_service, Api, id="VolumeService"),
    pytest.param(routes.data_plane_service, DataPlane, id="DataPlaneService"),
    pytest.param(routes.simulator_service, SimulatorApi, id="SimulatorService"),
]


def _mock(implementation: type) -> Mock:
    """spec=: a handler the implementation does not have is an AttributeError. The data
    plane's processes and files are objects of their own, made in its __init__."""
    mock = Mock(spec=implementation)
    if implementation is DataPlane:
        mock.processes = Mock(spec=DataPlaneProcesses)
        mock.files = Mock(spec=DataPlaneFiles)
    return mock


@pytest.mark.parametrize(("build", "implementation"), TABLES)
def test_every_proto_method_is_routed_to_a_handler_of_its_service(build: Any, implementation: type) -> None:
    implementation_mock = _mock(implementation)
    service = build(implementation_mock)
    assert sorted(rpc.name for rpc in service.rpcs) == sorted(m.name for m in service.descriptor.methods)
    entries = {entry.rpc: entry for entry in (*commands.WORKSPACE_COMMANDS, *commands.VOLUME_COMMANDS)}
    for rpc in service.rpcs:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", rpc.name).lower()
        entry = entries.get(rpc.name)
        if entry is None:
            assert rpc.handler._mock_name == snake, rpc.name
            continue
        # A command: served through its registry entry (api/commands.py), whose engine
        # handler is named after it.
        workspace_command = entry in commands.WORKSPACE_COMMANDS
        runner = implementation_mock.workspace_command if workspace_command else implementation_mock.volume_command
        assert rpc.handler is runner.return_value, rpc.name
        assert any(call.args == (entry,) for call in runner.call_args_list), rpc.name
        assert entry.handle.__name__ == snake, rpc.name


def test_a_table_that_drifts_from_its_proto_stops_the_server_from_starting() -> None:
    table = routes.volume_service(Mock(spec=Api))
    with pytest.raises(ValueError, match="the table names"):
        Service(table.descriptor, table.rpcs[:-1])
    create = table.rpcs[0]
    with pytest.raises(ValueError, match="not the proto's"):
        Service(
            table.descriptor,
            (Unary(create.name, vol.GetVolumeRequest, create.response, create.handler), *table.rpcs[1:]),
        )
    with pytest.raises(ValueError, match="streaming"):
        Service(
            table.descriptor,
            (ServerStream(create.name, create.request, create.response, create.handler), *table.rpcs[1:]),
        )


def test_only_the_data_planes_credential_methods_skip_the_token() -> None:
    services = [build(_mock(implementation)) for build, implementation in (p.values for p in TABLES)]
    open_paths = set().union(*(service.credential_paths for service in services))
    data_plane = dp.DESCRIPTOR.services_by_name["DataPlaneService"]
    # Every data-plane call but the credential's own issue (a control-plane call).
    assert open_paths == {
        f"/kibo.ctrl.v1.DataPlaneService/{method.name}"
        for method in data_plane.methods
        if method.name != "IssueDataPlaneCredential"
    }
