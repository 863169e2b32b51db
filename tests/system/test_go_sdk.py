"""The Go SDK (sdk/go) in CI: its generated code is fresh, `go vet` is clean, and `go test ./...`
passes against a real `kibo-ctrl serve --runtime sim` started here (tokens required, given to
the tests as $KIBO_TOKEN). Offline, in GOPATH mode, with Debian's Go packages (sdk/go/go.sh;
`bash examples/setup.sh` installs them). The Go tests themselves are in sdk/go/kibotos:
lifecycle with settle, a force stop's CONFLICT as a typed error, watching until DELETED, a
resend after a lost answer, and the lifecycle page's Go snippets as Example functions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
GO_SH = REPO / "sdk" / "go" / "go.sh"
SETUP = "run `bash examples/setup.sh` (Go, protoc, protoc-gen-go, protoc-gen-go-grpc from Debian)"


def _need_tools() -> None:
    for tool in ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc"):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` is not installed: {SETUP}", pytrace=False)


def _go(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "KIBO_GOPATH": str(tmp_path / "gopath"), **(env or {})}
    return subprocess.run(
        ["bash", str(GO_SH), *args], capture_output=True, text=True, timeout=600, env=environment, check=False
    )


def test_the_go_code_is_generated_fresh_from_proto() -> None:
    _need_tools()
    done = subprocess.run(
        [sys.executable, str(REPO / "gen" / "generate_go.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_go_vet(tmp_path: Path) -> None:
    _need_tools()
    done = _go(tmp_path, "vet", "./...")
    assert done.returncode == 0, f"go vet ./... failed:\n{done.stdout}\n{done.stderr}"


def test_go_test_against_a_real_server(tmp_path: Path, server_factory: Callable[..., ServerProcess]) -> None:
    _need_tools()
    server = server_factory(auth=True)
    env = {"KIBO_SERVER": server.address, "KIBO_TOKEN": server.admin_token}
    done = _go(tmp_path, "test", "-count=1", "-v", "./...", env=env)
    assert done.returncode == 0, f"go test ./... failed:\n{done.stdout}\n{done.stderr}"
    # The seed's snippets ran as examples, not only compiled.
    for example in ("ExampleSettle", "ExampleClient_WaitWorkspace", "ExampleClient_WaitWorkspaceDeleted"):
        assert f"--- PASS: {example} " in done.stdout, done.stdout


def test_go_test_fails_without_a_server(tmp_path: Path) -> None:
    """The Go tests refuse to pass vacuously: without $KIBO_SERVER they fail and say why."""
    _need_tools()
    env = {k: v for k, v in os.environ.items() if k not in ("KIBO_SERVER", "KIBO_TOKEN")}
    done = subprocess.run(
        ["bash", str(GO_SH), "test", "-count=1", "./kibotos/"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "KIBO_GOPATH": str(tmp_path / "gopath")},
        check=False,
    )
    assert done.returncode != 0
    assert "set KIBO_SERVER" in done.stdout + done.stderr
