"""What a workspace's annotations hold reaches the terminal escaped (issue 27, item 7): an
annotation holding ESC[31m turned the terminal of `kibo workspace get` red. The real `kibo`
command runs as a subprocess, on a pipe and on a terminal (a pty, where rich writes its own
styles). JSON output keeps the value exactly, escaped by JSON's rules."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import kibotos
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.server import ServerProcess

KIBO = [sys.executable, "-c", "from kibo_cli.main import main; main()"]
ANNOTATIONS = {
    "note": "\x1b[31mred\x1b[0m\nsecond line",
    "title": "\x1b]0;owned\x07",
    "csi": "c1 \x9b31m",
    "bidi": "abc\u202edef",
}
# What the text output shows instead.
SHOWN = ["\\x1b[31mred\\x1b[0m\\nsecond line", "\\x1b]0;owned", "c1 \\x9b31m", "abc\\u202edef"]
# What must never reach the terminal as itself (the CLI's own styles use other sequences).
RAW = ["\x1b[31m", "\x1b]0;", "\x9b", "\u202e", "\nsecond line"]


@pytest.fixture(scope="module")
def annotated(firecracker: ServerProcess) -> Iterator[str]:
    with kibotos.Client(firecracker.address) as sdk:
        created = sdk.create_workspace(wp.WorkspaceSpec(annotations=ANNOTATIONS, labels={"escaping": "test"}))
        workspace_id = created.workspace.workspace_id
        assert dict(sdk.get_workspace(workspace_id).annotations) == ANNOTATIONS
        yield workspace_id
        sdk.delete_workspace(workspace_id)


def run(server: ServerProcess, *args: str) -> str:
    done = subprocess.run([*KIBO, "--server", server.address, *args], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def run_on_a_terminal(server: ServerProcess, *args: str) -> str:
    """Stdout is a pty: rich takes it for a terminal (colours, its own escape sequences)."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [*KIBO, "--server", server.address, *args],
            stdout=terminal,
            stderr=subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
            | {"TERM": "xterm-256color", "COLUMNS": "500"},
        )
        os.close(terminal)
        terminal = -1
        output = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the other end closed
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        assert process.wait(timeout=30) == 0, process.stderr.read() if process.stderr else ""
        if process.stderr:
            process.stderr.close()
        return output.decode(errors="replace")
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)


@pytest.mark.parametrize("command", [("workspace", "get"), ("workspace", "labels")], ids=["get", "labels"])
def test_annotations_are_shown_escaped(firecracker: ServerProcess, annotated: str, command: tuple[str, str]) -> None:
    for output in (run(firecracker, *command, annotated), run_on_a_terminal(firecracker, *command, annotated)):
        for shown in SHOWN:
            assert shown in output, (shown, output)
        for raw in RAW:
            assert raw not in output, (raw, output)
        assert "\x07" not in output


def test_json_output_keeps_annotations_exactly(firecracker: ServerProcess, annotated: str) -> None:
    output = run(firecracker, "workspace", "get", annotated, "-o", "json")
    assert json.loads(output)["annotations"] == ANNOTATIONS
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in output)
    assert "\u202e" not in output  # JSON output is ASCII
