"""The guest network's slots and its filler thread (runtime/process/network/__init__.py): a
slot being released, or adopted after a restart, is never made again meanwhile by the filler,
which makes ready slots in a thread of its own (`_make` removes a "leftover" of the same name
first). Found by CI rehearsals under load: a guest lost its route after a restart, and a launch
met "/run/netns/kibo-...: No such file" (a ready slot whose namespace a release had removed).
Needs root, nftables and network namespaces, like tests/system/test_guest_network.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kibo_ctrl.domain.model import NetworkPolicy
from kibo_ctrl.runtime.process import network
from kibo_ctrl.runtime.process.network import slots


@pytest.fixture
def nets(tmp_path: Path) -> Iterator[network.GuestNetworks]:
    assert os.geteuid() == 0, "guest networking needs root"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    made = network.GuestNetworks(data_dir, network.NetworkOptions(), lambda _: False)
    try:
        yield made
    finally:
        made.close()
        network.reap(data_dir)


def _until(check: Callable[[], bool], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_released_slot_is_not_made_again_while_it_goes(
    nets: network.GuestNetworks, monkeypatch: pytest.MonkeyPatch
) -> None:
    _until(lambda: len(nets._ready) == nets._options.ready_slots)
    first = nets.attach("i-first", NetworkPolicy())
    nets.attach("i-second", NetworkPolicy())  # the filler now wants a slot (after its quiet time)
    real_remove = slots.remove
    removing = threading.Event()

    def slow_remove(s: slots.Slot) -> None:
        if s.index == first.index and not removing.is_set():
            removing.set()
            time.sleep(network.REFILL_QUIET_S + 1.0)  # the filler makes its slot meanwhile
        real_remove(s)

    monkeypatch.setattr(slots, "remove", slow_remove)
    nets.release("i-first")
    assert removing.is_set()
    _until(lambda: len(nets._ready) == nets._options.ready_slots and not nets._making)
    missing = [s.netns for s in nets._ready if not slots.present(s) or not Path(s.path).exists()]
    assert not missing, f"ready slots without their namespace: {missing}"
    nets.release("i-second")
