"""README.md as a newcomer reads it: its two commands (the same that .ci/run runs, the server's
run here in a fresh clone and a fresh venv), the snippets it shows, the CLI reference
generated from the CLI, the module map, and links that stay inside the repository."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kibo_cli import docs

from tests.server import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- first-run:begin", "<!-- first-run:end -->"


def readme() -> str:
    return (REPO / "README.md").read_text()


def readme_commands() -> list[str]:
    text = readme()
    block = text[text.index(BEGIN) : text.index(END)].splitlines()[1:]
    assert block[0] == "```sh" and block[-1] == "```", "the two commands must be one ```sh block"
    return block[1:-1]


def section(title: str) -> str:
    text = readme()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def block_after(text: str, marker: str, language: str = "sh") -> str:
    start = text.index(f"```{language}\n", text.index(marker)) + len(f"```{language}\n")
    return text[start : text.index("```", start)]


# -- the two commands ---------------------------------------------------------------------


def test_the_readme_begins_with_its_two_commands() -> None:
    lines = readme().splitlines()
    assert lines[0] == "# kibo"
    first_block = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert lines[first_block - 1].startswith(BEGIN), "the first code block must be the two commands"
    install, tests = readme_commands()
    assert "python3 -m venv .venv" in install and install.split("#")[0].rstrip().endswith("kibo-ctrl serve")
    for part in ("bash examples/setup.sh", "npm ci", "python3 -m venv .venv", "'.[dev]'"):
        assert part in tests, f"the tests' command must run {part}"
    assert tests.split("#")[0].rstrip().endswith("-m pytest"), "the tests' command runs the whole suite"


def test_ci_runs_exactly_the_readmes_two_commands() -> None:
    """.ci/run takes its two commands from the README; no parallel recipe of its own."""
    printed = subprocess.run(
        ["bash", str(REPO / ".ci" / "run"), "--print-commands"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.splitlines()
    assert printed == readme_commands(), "README.md and .ci/run disagree on the two commands"
    code = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#")]
    for recipe in ("pip install", "-m pytest", "npm ci", "setup.sh", "-m venv"):
        offending = [line for line in code if recipe in line]
        assert not offending, f".ci/run runs {recipe!r} itself instead of the README's line: {offending}"
    assert 'bash -c "$server_line"' in "\n".join(code) and 'bash -c "$tests_line"' in "\n".join(code)
    assert '"$tests_status" -eq 5' in "\n".join(code), "pytest's exit 5 (no tests) must fail CI"


def test_the_readme_names_every_package_setup_sh_installs() -> None:
    text = (REPO / "examples" / "setup.sh").read_text()
    packages = re.search(r"^PACKAGES=\((.*?)^\)", text, re.S | re.M)
    assert packages is not None
    names = [
        line.strip() for line in packages.group(1).splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    intro = " ".join(readme()[: readme().index("\n## ")].split())
    missing = [name for name in names if name not in intro]
    assert not missing, (
        f"examples/setup.sh installs {', '.join(missing)}, which the README's first section does not name: "
        "add them to the sentence after the two commands"
    )


@pytest.mark.timeout(900)
def test_the_readmes_server_command_runs_in_a_fresh_clone(tmp_path: Path) -> None:
    """The server's line verbatim, in a fresh clone and a fresh venv (only the ports move, by
    KIBO_LISTEN / KIBO_HTTP_LISTEN, and the per-user dirs, by XDG_*: this machine is shared),
    until SERVING; then one authenticated call with the clone's SDK finding the token by
    itself; then SIGTERM. (The tests' line runs the whole suite: .ci/run is its proof.)"""
    install, _ = readme_commands()
    clone = tmp_path / "kibo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    port, http_port = free_port(), free_port()
    environment = {k: v for k, v in os.environ.items() if k not in ("KIBO_TOKEN", "KIBO_SERVER", "VIRTUAL_ENV")}
    environment.update(
        KIBO_LISTEN=f"127.0.0.1:{port}",
        KIBO_HTTP_LISTEN=f"127.0.0.1:{http_port}",
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_STATE_HOME=str(tmp_path / "state"),
    )
    log = tmp_path / "server.log"
    started = time.monotonic()
    with open(log, "wb") as output:
        line = subprocess.Popen(
            ["bash", "-c", install],
            cwd=clone,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        serving = _wait_serving(f"127.0.0.1:{port}", line, log, timeout=600)
        print(f"\nREADME server line: SERVING {serving - started:.1f} s after the start (install included)")
        call = subprocess.run(
            [
                str(clone / ".venv" / "bin" / "python"),
                "-c",
                "import kibotos\n"
                f"with kibotos.Client('127.0.0.1:{port}') as client:\n"
                "    print(sorted(client.get_capabilities())[0], client.connection.discovery.describe())",
            ],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert call.returncode == 0, call.stderr
        assert str(tmp_path / "data" / "kibo" / "admin.token") in call.stdout, call.stdout
        print(f"authenticated call: {call.stdout.strip()}")
    finally:
        os.killpg(line.pid, signal.SIGTERM)
        code = line.wait(60)
    assert code == 0, log.read_text()[-3000:]
    print(f"stopped; the server's last lines:\n{log.read_text().strip().splitlines()[-1]}")


def _wait_serving(address: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert process.poll() is None, f"the README's server line exited {process.returncode}:\n{log.read_text()}"
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return time.monotonic()
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    raise AssertionError(f"not SERVING after {timeout} s:\n{log.read_text()[-3000:]}")


# -- the snippets -------------------------------------------------------------------------


def test_the_readmes_sdk_snippet_runs_against_a_server_with_auth(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """Issue 11 item 3: the snippet failed with UnauthenticatedError unless KIBO_TOKEN was set."""
    server = server_factory(auth=True)
    try:
        snippet = block_after(section("The Python SDK"), "## The Python SDK", "python")
        environment = {k: v for k, v in os.environ.items() if k != "KIBO_TOKEN"}
        environment["KIBO_SERVER"] = server.address
        done = subprocess.run(
            [sys.executable, "-c", snippet],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[1] == "AVAILABLE", done.stdout
    finally:
        server.stop()


def test_the_readmes_give_up_and_pick_up_delete_exits_10_then_0(tmp_path: Path) -> None:
    """Issue 11 item 9: the "exit 10" example now has its own slow server to run against."""
    tour = section("Five-minute tour")
    server_line = block_after(tour, "A stop or delete that takes long").strip()
    client_lines = block_after(tour, "and in the other terminal")
    port = free_port()
    data_dir = tmp_path / "slow"
    server_argv = server_line.replace("127.0.0.1:50061", f"127.0.0.1:{port}").replace("/tmp/kibo-slow", str(data_dir))
    server_argv = server_argv.replace(".venv/bin/kibo-ctrl", str(Path(sys.executable).parent / "kibo-ctrl"))
    log = tmp_path / "slow.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(["bash", "-c", f"exec {server_argv}"], stdout=output, stderr=subprocess.STDOUT)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 30
            while True:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                try:
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    time.sleep(0.1)
        script = client_lines.replace("127.0.0.1:50061", f"127.0.0.1:{port}")
        environment = {k: v for k, v in os.environ.items() if k != "KIBO_TOKEN"}
        environment["PATH"] = f"{Path(sys.executable).parent}:{environment.get('PATH', '')}"
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], env=environment, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        assert "exit 10" in done.stdout and "gave up waiting" in done.stderr, done.stdout + done.stderr
        assert re.search(r"^State +DELETED", done.stdout, re.M), done.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


# -- generated and checked sections -------------------------------------------------------


def test_the_cli_reference_is_current() -> None:
    assert docs.block() in readme(), (
        "the README's CLI reference is stale: run `python -m kibo_cli.docs --write README.md`"
    )


def _modules() -> list[str]:
    """Every module under server/ and client/, as the map names it (e.g. kibo_ctrl/hub.py)."""
    found = []
    for top in ("server", "client"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path.name != "__init__.py":
                found.append(path.relative_to(REPO / top).as_posix())
    return found


def test_the_architecture_section_names_every_module() -> None:
    architecture = section("Architecture")
    missing = [module for module in _modules() if f"`{module}`" not in architecture]
    assert not missing, (
        "README.md's Architecture module map does not name: "
        + ", ".join(missing)
        + ". Add a row `| `MODULE` | what it does |` for each to the map's table."
    )
    named = set(re.findall(r"`((?:kibo_ctrl|kibotos|kibo_cli)/[\w/]+\.py)`", architecture))
    stale = sorted(named - set(_modules()))
    assert not stale, f"README.md's module map names modules that do not exist: {', '.join(stale)}"


def test_the_readmes_links_stay_inside_the_repository() -> None:
    text = readme()
    assert "../" not in text and "shared/spec" not in text, "a clone has nothing outside the repository"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (REPO / target).exists(), f"README.md links to {target}, which is not in the repository"
    for spec in ("lifecycle.md", "api-contract.md", "architecture.md"):
        assert f"(docs/spec/{spec})" in text


def test_the_readmes_anchors_exist() -> None:
    text = readme()
    headings = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in text.splitlines()
        if line.startswith("#")
    }
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in headings, f"README.md links to #{anchor}, which no heading makes"


def test_the_readmes_stop_it_all_snippet_stops_every_available_workspace(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(auth=True)
    try:
        environment = {k: v for k, v in os.environ.items() if k != "KIBO_TOKEN"}
        environment["KIBO_SERVER"] = server.address
        environment["PATH"] = f"{Path(sys.executable).parent}:{environment.get('PATH', '')}"
        kibo = [str(Path(sys.executable).parent / "kibo")]
        created = [
            subprocess.run(
                [*kibo, "workspace", "create", "-q"], env=environment, capture_output=True, text=True, check=True
            ).stdout.strip()
            for _ in range(2)
        ]
        snippet = block_after(section("What keeps running"), "To stop it all")
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", snippet], env=environment, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        for workspace_id in created:
            assert f"{workspace_id} is STOPPED" in done.stdout, done.stdout
    finally:
        server.stop()
