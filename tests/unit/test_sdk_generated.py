"""The drift check of the Python SDK's single source: kibotos/client.py (the blocking Client) is
generated from kibotos/aio.py (AsyncClient) by `python -m kibotos._generate`; CI fails here when
someone edits one and not the other."""

from __future__ import annotations

import inspect
from pathlib import Path

import kibotos
import pytest
from kibotos import _generate


def test_the_committed_sync_client_is_what_aio_generates() -> None:
    committed = _generate.TARGET.read_text()
    assert committed == _generate.generate(), (
        "client/kibotos/client.py differs from a fresh generation from aio.py: edit aio.py, then run "
        "`python -m kibotos._generate` and commit client.py"
    )


def test_the_check_fails_on_a_hand_edited_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = tmp_path / "client.py"
    edited.write_text(_generate.TARGET.read_text().replace("def get_workspace(", "def get_workspace_renamed(", 1))
    monkeypatch.setattr(_generate, "TARGET", edited)
    assert _generate.main(["--check"]) == 1
    assert _generate.main([]) == 0  # regenerating repairs it
    assert _generate.main(["--check"]) == 0


def _public_methods(kind: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(kind, inspect.isfunction)
        if not name.startswith("_")
    }


def test_both_clients_have_the_same_methods_and_parameters() -> None:
    blocking = _public_methods(kibotos.Client)
    awaitable = _public_methods(kibotos.AsyncClient)
    assert blocking.keys() == awaitable.keys()
    for name, signature in blocking.items():
        other = awaitable[name]
        assert [(p.name, p.kind, p.default) for p in signature.parameters.values()] == [
            (p.name, p.kind, p.default) for p in other.parameters.values()
        ], name


def test_the_generated_client_is_blocking() -> None:
    for name, member in inspect.getmembers(kibotos.Client, inspect.isfunction):
        assert not inspect.iscoroutinefunction(member) and not inspect.isasyncgenfunction(member), name
