"""The Go SDK's data plane (sdk/go/kibotos: processes.go, files.go) against a real `kibo-ctrl
serve --runtime process` (bubblewrap sandboxes; root), which the simulator behind
test_go_sdk.py cannot be: its tests carry the `dataplane` build tag, so `go test ./...` there
does not build them, and run here (`go test -tags dataplane -run '^TestDataPlane'`, once for
the module). Each Go test is a test ID of its own here, seen passing by name (a filter that
matched nothing would pass vacuously), so a mutation names the Go test that catches it."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.server import ServerProcess
from tests.system.test_go_sdk import _go, _need_tools
from tests.system.test_process_runtime import sandbox_server

GO_TESTS = (
    "TestDataPlaneRun",
    "TestDataPlaneBackgroundProcessByTag",
    "TestDataPlanePTY",
    "TestDataPlaneForegroundCloseKills",
    "TestDataPlaneFiles",
    "TestDataPlaneUploadDownload",
    "TestDataPlaneUploadError",
    "TestDataPlaneTransferResume",
    "TestDataPlaneArchive",
    "TestDataPlaneWatch",
)


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    # The guests' network is not what these tests are about (test_guest_network.py is).
    with sandbox_server(server_factory, "--guest-network", "off") as started:
        yield started


@pytest.fixture(scope="module")
def go_run(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One `go test` of them all (one build), read by each test below."""
    _need_tools()
    args = ("test", "-count=1", "-v", "-tags", "dataplane", "-run", "^TestDataPlane", "./kibotos/")
    return _go(tmp_path_factory.mktemp("go"), *args, env={"KIBO_SERVER": server.address})


def test_go_vet_with_the_data_plane_tests(tmp_path: Path) -> None:
    _need_tools()
    done = _go(tmp_path, "vet", "-tags", "dataplane", "./...")
    assert done.returncode == 0, f"go vet -tags dataplane ./... failed:\n{done.stdout}\n{done.stderr}"


def test_every_go_data_plane_test_is_listed_here(go_run: subprocess.CompletedProcess[str]) -> None:
    ran = set(re.findall(r"^=== RUN   (TestDataPlane\w+)$", go_run.stdout, flags=re.MULTILINE))
    assert ran == set(GO_TESTS), f"ran {sorted(ran)}:\n{go_run.stdout}\n{go_run.stderr}"


@pytest.mark.parametrize("name", GO_TESTS)
def test_go_data_plane(go_run: subprocess.CompletedProcess[str], name: str) -> None:
    passed = re.search(rf"^--- PASS: {name} ", go_run.stdout, flags=re.MULTILINE)
    assert passed, f"{name} did not pass:\n{_output_of(go_run.stdout, name)}\n{go_run.stderr[-4000:]}"


def _output_of(stdout: str, name: str) -> str:
    """The lines of one Go test's run (from its RUN to the next top-level RUN)."""
    part = stdout.split(f"=== RUN   {name}\n", 1)[-1]
    return part.split("\n=== RUN   Test", 1)[0]
