"""`kibo events` and the SDK's list_events / watch_events against real servers: filters as
the server applies them, `--follow` as a process that prints each new event and ends at
Ctrl-C with exit 0, and a watch that goes on across a restart of its server, none missed."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO

import kibotos
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo_cli.exit_codes import ExitCode

from tests.server import ServerProcess
from tests.system.test_cli import KIBO_AT_A_TERMINAL, kibo, new_workspace, ok

E = obs.EventType


def test_events_lists_with_each_filter_as_the_server_does(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    ok(kibo(firecracker, "workspace", "stop", workspace_id))
    with kibotos.Client(firecracker.address) as client:
        stored = list(client.list_events(workspace_id=workspace_id))
    listed = json.loads(ok(kibo(firecracker, "events", "-w", workspace_id, "-o", "json")).stdout)["events"]
    assert [int(e["sequence"]) for e in listed] == [e.sequence for e in stored] and len(stored) >= 8
    assert {e["workspaceId"] for e in listed} == {workspace_id}
    changes = json.loads(
        ok(kibo(firecracker, "events", "-w", workspace_id, "--type", "state_changed", "-o", "json")).stdout
    )["events"]
    assert [int(e["sequence"]) for e in changes] == [e.sequence for e in stored if e.type == E.EVENT_TYPE_STATE_CHANGED]
    recent = json.loads(ok(kibo(firecracker, "events", "-w", workspace_id, "--since", "1h", "-o", "json")).stdout)
    assert len(recent["events"]) == len(stored)
    old = json.loads(ok(kibo(firecracker, "events", "-w", workspace_id, "--until", "1h", "-o", "json")).stdout)
    assert old["events"] == []
    text = ok(kibo(firecracker, "events", "-w", workspace_id, "-t", "SCHEDULED", "-t", "COMMAND_ACCEPTED")).stdout
    assert "SCHEDULED" in text and "COMMAND_ACCEPTED" in text and "STATE_CHANGED" not in text
    for bad in (("--type", "no_such_type"), ("--since", "yesterday")):
        refused = kibo(firecracker, "events", *bad)
        assert refused.exit_code == ExitCode.USAGE, refused.output
    missing = kibo(firecracker, "events", "-w", "ws-00000000000000000000")
    assert missing.exit_code == ExitCode.NOT_FOUND, missing.output


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def test_follow_prints_the_stored_events_then_each_new_one_and_ends_at_ctrl_c(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    command = [*KIBO_AT_A_TERMINAL, "--server", firecracker.address, "events", "-w", workspace_id, "-f", "-o", "json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        lines: queue.Queue[str] = queue.Queue()
        assert process.stdout is not None
        threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
        try:
            seen = [json.loads(lines.get(timeout=20))]  # history first: the create's events
            ok(kibo(firecracker, "workspace", "stop", workspace_id))
            while seen[-1].get("toState") != "WORKSPACE_STATE_STOPPED":
                seen.append(json.loads(lines.get(timeout=20)))
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=20)
        finally:
            process.kill()
    assert process.returncode == 0, err
    with kibotos.Client(firecracker.address) as client:
        stored = [e.sequence for e in client.list_events(workspace_id=workspace_id)]
    sequences = [int(e["sequence"]) for e in seen]
    assert sequences == stored[: len(sequences)], (sequences, stored)


def test_the_sdks_watch_goes_on_across_a_restart_of_its_server(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """watch_events reconnects when its stream breaks (the server stops: UNAVAILABLE) and
    resumes after the last event it gave: the events of commands made right after the
    restart are all there, once each."""
    server = server_factory()
    got: queue.Queue[obs.WorkspaceEvent] = queue.Queue()
    with kibotos.Client(server.address) as client:
        before = client.create_workspace().workspace.workspace_id

        def follow() -> None:
            with contextlib.suppress(kibotos.KiboError):  # the client closed at the end
                for event in client.watch_events(history=True):
                    got.put(event)

        threading.Thread(target=follow, daemon=True).start()
        seen = [got.get(timeout=20)]
        server.restart()
        after = _retrying(lambda: client.create_workspace().workspace.workspace_id)
        client.stop_workspace(after)
        stored = [e.sequence for e in client.list_events()]
        while len(seen) < len(stored):
            seen.append(got.get(timeout=30))
    assert [e.sequence for e in seen] == stored
    assert {before, after} == {e.workspace_id for e in seen}


def _retrying(call: Callable[[], str]) -> str:
    """The call, again while the client's channel reconnects to the restarted server."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return call()
        except kibotos.UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
