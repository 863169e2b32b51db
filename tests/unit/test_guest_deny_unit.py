"""A node agent's guests never reach its control plane (issue 28): the replicas named by
--control-plane are added to the node's --guest-deny, as the addresses they resolve to."""

from __future__ import annotations

import pytest
from kibo_ctrl.cli import _guest_network_config
from kibo_ctrl.node_host import control_plane_cidrs


def test_the_control_planes_replicas_become_denied_addresses() -> None:
    assert control_plane_cidrs("10.1.2.3:50051") == ("10.1.2.3/32",)
    assert control_plane_cidrs("10.1.2.3:50051, 10.1.2.4:50051,10.1.2.3:50053") == ("10.1.2.3/32", "10.1.2.4/32")
    assert "127.0.0.1/32" in control_plane_cidrs("localhost:50051")
    # A name that does not resolve adds nothing (the join fails on it anyway).
    assert control_plane_cidrs("no-such-host.invalid:50051") == ()


def test_the_guest_network_flags_are_checked() -> None:
    import typer

    assert _guest_network_config("10.50.0.0/20", ["192.0.2.0/24"], ["192.0.2.53:5353"]) == {
        "guest_network": "10.50.0.0/20",
        "guest_deny": ("192.0.2.0/24",),
        "guest_dns": ("192.0.2.53:5353",),
    }
    assert _guest_network_config("off", None, None)["guest_network"] == "off"
    for bad in (("10.50.0.0/33", None, None), ("", ["nonsense"], None), ("", None, ["1.2.3.4:99999"])):
        with pytest.raises(typer.BadParameter):
            _guest_network_config(*bad)
