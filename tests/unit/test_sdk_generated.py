"""The drift check of the Python SDK's single sources: each blocking module is generated from its
awaitable one by `python -m kibotos._generate` (kibotos/client.py, the Client, from kibotos/aio.py;
kibotos/access.py, WorkspaceAccess and its processes and files, from kibotos/aio_access.py); CI
fails here when someone edits one and not the other."""

from __future__ import annotations

import inspect
from pathlib import Path

import kibotos
import pytest
from kibotos import _generate

# A line of each generated module that an edit by hand changes.
_EDITS = {"client.py": "def get_workspace(", "access.py": "def list_dir("}
# Each awaitable class and its blocking twin.
TWINS = [
    (kibotos.AsyncClient, kibotos.Client),
    (kibotos.AsyncWorkspaceAccess, kibotos.WorkspaceAccess),
    (kibotos.AsyncProcesses, kibotos.Processes),
    (kibotos.AsyncProcessHandle, kibotos.ProcessHandle),
    (kibotos.AsyncFiles, kibotos.Files),
]


@pytest.mark.parametrize(("source", "target"), _generate.PAIRS, ids=[t.name for _, t in _generate.PAIRS])
def test_the_committed_blocking_module_is_what_its_source_generates(source: Path, target: Path) -> None:
    assert target.read_text() == _generate.generate(source, target), (
        f"client/kibotos/{target.name} differs from a fresh generation from {source.name}: edit {source.name}, "
        f"then run `python -m kibotos._generate` and commit {target.name}"
    )


def test_every_generated_module_has_an_edit_below() -> None:
    assert sorted(_EDITS) == sorted(target.name for _, target in _generate.PAIRS)


@pytest.mark.parametrize(("source", "target"), _generate.PAIRS, ids=[t.name for _, t in _generate.PAIRS])
def test_the_check_fails_on_a_hand_edited_module(
    source: Path, target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edited = tmp_path / target.name
    line = _EDITS[target.name]
    assert line in target.read_text()
    edited.write_text(target.read_text().replace(line, line.replace("(", "_renamed("), 1))
    monkeypatch.setattr(_generate, "PAIRS", [(source, edited)])
    assert _generate.main(["--check"]) == 1
    assert _generate.main([]) == 0  # regenerating repairs it
    assert _generate.main(["--check"]) == 0


def _public_methods(kind: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(kind, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize(("awaitable", "blocking"), TWINS, ids=[b.__name__ for _, b in TWINS])
def test_both_forms_have_the_same_methods_and_parameters(awaitable: type, blocking: type) -> None:
    ours, theirs = _public_methods(blocking), _public_methods(awaitable)
    assert ours.keys() == theirs.keys()
    for name, signature in ours.items():
        other = theirs[name]
        assert [(p.name, p.kind, p.default) for p in signature.parameters.values()] == [
            (p.name, p.kind, p.default) for p in other.parameters.values()
        ], name


@pytest.mark.parametrize("blocking", [b for _, b in TWINS], ids=[b.__name__ for _, b in TWINS])
def test_the_generated_classes_are_blocking(blocking: type) -> None:
    for name, member in inspect.getmembers(blocking, inspect.isfunction):
        assert not inspect.iscoroutinefunction(member) and not inspect.isasyncgenfunction(member), name
