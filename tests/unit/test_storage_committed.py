"""The declared capacity promised to existing images (storage.promised_bytes), remembered
between counts for a second: never lower than a fresh count would be (an admission adds what
it promised), and counted afresh after a deletion (a create right after one sees the room it
made)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kibo_ctrl.runtime.process import storage

GIB = 1 << 30


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    storage._committed.clear()
    yield
    storage._committed.clear()


def _image(data_dir: Path, name: str, gib: int = 1) -> Path:
    directory = data_dir / "layers" / name
    directory.mkdir(parents=True)
    with open(directory / storage.LAYER_IMAGE, "wb") as f:
        f.truncate(gib * GIB)
    return directory


def test_an_admission_adds_its_promise_without_a_count(tmp_path: Path) -> None:
    first = _image(tmp_path, "ws-1")
    assert storage.promised_bytes(tmp_path) == GIB
    (tmp_path / "layers" / "ws-2").mkdir()
    storage.admit(tmp_path, [storage.entry(tmp_path / "layers" / "ws-2", storage.LAYER_IMAGE, 1, None)], 0.0)
    _image(tmp_path, "ws-3", 3)  # made behind the runtime's back: seen at the next count only
    assert storage.promised_bytes(tmp_path) == 2 * GIB
    storage.destroy(first)
    assert storage.promised_bytes(tmp_path) == 4 * GIB, "counted afresh: ws-2 and ws-3"


def test_the_figure_is_counted_again_once_it_is_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _image(tmp_path, "ws-1")
    assert storage.promised_bytes(tmp_path) == GIB
    _image(tmp_path, "ws-2")
    assert storage.promised_bytes(tmp_path) == GIB
    monkeypatch.setattr(storage, "COMMITTED_MAX_AGE_S", 0.0)
    assert storage.promised_bytes(tmp_path) == 2 * GIB
