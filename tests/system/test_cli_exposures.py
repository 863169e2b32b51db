"""`kibo workspace expose|exposures|unexpose` and `network-policy`'s domain, deny and port rules
against a real server, as a user runs them: the token printed once with how to use it, the
list without tokens, a revoke and a stop ending exposures, a policy's every list round-tripping,
and the combinations the server refuses caught as usage errors before any round trip.
(Reaching an exposure's URL end to end is tests/system/test_exposures.py's.)"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import kibotos
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo_cli.exit_codes import ExitCode
from kibo_cli.main import app

from tests.server import ServerProcess
from tests.system.test_cli import kibo, new_workspace, ok, runner


class _Http1Listener:
    """A port that answers HTTP/1.1 and counts connections: a command that reached it would
    exit UNAVAILABLE (8) at once (the SDK does not retry a wrong port), not USAGE (2)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.socket.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.socket.accept()
                self.connections += 1
                with connection:
                    connection.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")


@pytest.fixture(scope="module")
def http1() -> Iterator[_Http1Listener]:
    listener = _Http1Listener()
    yield listener
    listener.socket.close()


def _exposures(server: ServerProcess, workspace_id: str) -> list[dict[str, object]]:
    listed: list[dict[str, object]] = json.loads(
        ok(kibo(server, "workspace", "exposures", workspace_id, "-o", "json")).stdout
    )["exposures"]
    return listed


def test_expose_lists_and_unexposes(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    assert f"{workspace_id}: no exposures" in ok(kibo(firecracker, "workspace", "exposures", workspace_id)).stdout
    # A token exposure: the URL, the token, and both ways to send it, printed once.
    shown = ok(kibo(firecracker, "workspace", "expose", workspace_id, "8080")).stdout
    url = next(word for word in shown.split() if word.startswith("http://8080-"))
    assert url.startswith(f"http://8080-{workspace_id}.localhost") and url.endswith("/"), shown
    (token,) = [line.split(": ", 1)[1] for line in shown.splitlines() if line.startswith("token: ")]
    assert token.startswith("kex1_") and len(token) > 40, shown
    assert f"X-Kibo-Exposure-Token: {token}" in shown and f"{url}?kibo_token={token}" in shown, shown
    assert "until revoked" in shown
    # A public one that ends in an hour: -o json is the Exposure (no token: it has none).
    before = time.time()
    expose_public = ("expose", workspace_id, "3000", "--public", "--expire-in", "1h", "-o", "json")
    public = json.loads(ok(kibo(firecracker, "workspace", *expose_public)).stdout)
    assert public["access"] == "EXPOSURE_ACCESS_PUBLIC" and public["port"] == 3000 and public["token"] == ""
    assert public["url"].startswith(f"http://3000-{workspace_id}.localhost") and public["workspaceId"] == workspace_id
    expires = Timestamp()
    expires.FromJsonString(public["expireTime"])
    assert before + 3600 - 5 <= expires.seconds <= time.time() + 3600 + 5
    # The list: both, never a token; its text shows URL, port, access and expiry.
    listed = _exposures(firecracker, workspace_id)
    assert sorted(int(str(e["port"])) for e in listed) == [3000, 8080]
    assert all(e["token"] == "" for e in listed)
    text = ok(kibo(firecracker, "workspace", "exposures", workspace_id)).stdout
    assert url in text and "TOKEN" in text and "PUBLIC" in text and "until revoked" in text and token not in text
    # One exposure per port: exit 4 with the server's reason.
    again = kibo(firecracker, "workspace", "expose", workspace_id, "8080")
    assert again.exit_code == ExitCode.CONFLICT and "exposed already" in again.stderr, again.output
    # Sending the same command ID again answers the exposure its first send made, without the token.
    first = ok(kibo(firecracker, "workspace", "expose", workspace_id, "9000", "--command-id", "test/expose-9000"))
    assert "token: kex1_" in first.stdout
    resent = ok(kibo(firecracker, "workspace", "expose", workspace_id, "9000", "--command-id", "test/expose-9000"))
    assert "token: not shown" in resent.stdout and "kex1_" not in resent.stdout, resent.stdout
    by_port = {int(str(e["port"])): str(e["exposureId"]) for e in _exposures(firecracker, workspace_id)}
    assert sorted(by_port) == [3000, 8080, 9000]
    # unexpose: gone from the list; an unknown one is NOT_FOUND.
    revoked = ok(kibo(firecracker, "workspace", "unexpose", workspace_id, by_port[8080]))
    assert f"exposure {by_port[8080]} revoked" in revoked.stdout
    assert sorted(int(str(e["port"])) for e in _exposures(firecracker, workspace_id)) == [3000, 9000]
    missing = kibo(firecracker, "workspace", "unexpose", workspace_id, by_port[8080])
    assert missing.exit_code == ExitCode.NOT_FOUND, missing.output
    ok(kibo(firecracker, "workspace", "unexpose", workspace_id, by_port[9000], "-o", "json"))
    ok(kibo(firecracker, "workspace", "unexpose", workspace_id, by_port[3000]))
    assert _exposures(firecracker, workspace_id) == []
    # A stop ends every exposure; exposing needs AVAILABLE (exit 4).
    ok(kibo(firecracker, "workspace", "expose", workspace_id, "8080"))
    ok(kibo(firecracker, "workspace", "stop", workspace_id))
    assert _exposures(firecracker, workspace_id) == []
    stopped = kibo(firecracker, "workspace", "expose", workspace_id, "8080")
    assert stopped.exit_code == ExitCode.CONFLICT and "STOPPED" in stopped.stderr, stopped.output


def test_network_policy_with_domains_deny_and_ports_round_trips(firecracker: ServerProcess) -> None:
    workspace_id = new_workspace(firecracker)
    rules = (
        *("--allow", "10.0.0.0/8", "--deny", "10.9.0.0/16"),
        *("--allow-domain", "API.GitHub.com", "--allow-domain", "*.pypi.org", "--deny-domain", "evil.pypi.org"),
        *("--port", "443", "--port", "22"),
    )
    set_policy = kibo(firecracker, "workspace", "network-policy", workspace_id, *rules, "-o", "json")
    document = json.loads(ok(set_policy).stdout)
    policy = document["workspace"]["spec"]["networkPolicy"]
    assert policy == {
        "egress": "NETWORK_EGRESS_ALLOW_LISTED",
        "allowedCidrs": ["10.0.0.0/8"],
        "deniedCidrs": ["10.9.0.0/16"],
        "allowedDomains": ["api.github.com", "*.pypi.org"],  # lowercased by the server
        "deniedDomains": ["evil.pypi.org"],
        "allowedPorts": [22, 443],
    }, policy
    shown = ok(kibo(firecracker, "workspace", "network-policy", workspace_id)).stdout
    assert (
        "egress ALLOW_LISTED (10.0.0.0/8, api.github.com, *.pypi.org; ports 22, 443; denied 10.9.0.0/16, evil.pypi.org)"
        in shown
    ), shown
    assert "denied 10.9.0.0/16, evil.pypi.org" in ok(kibo(firecracker, "workspace", "get", workspace_id)).stdout
    # Only deny rules: allow-all less those.
    denying = ok(kibo(firecracker, "workspace", "network-policy", workspace_id, "--deny-domain", "*.example.com"))
    assert "egress ALLOW_ALL (denied *.example.com)" in denying.stdout, denying.stdout
    with kibotos.Client(firecracker.address) as client:
        stored = client.get_workspace(workspace_id).spec.network_policy
        assert stored.egress == wp.NETWORK_EGRESS_ALLOW_ALL and list(stored.denied_domains) == ["*.example.com"]
        assert not stored.allowed_cidrs and not stored.allowed_domains and not stored.allowed_ports
    # What only the server knows is INVALID_ARGUMENT (exit 5) with the field.
    for bad in (("--allow-domain", "exa mple.com"), ("--deny-domain", "a.*.example.com"), ("--deny", "10.0.0.0/33")):
        refused = kibo(firecracker, "workspace", "network-policy", workspace_id, *bad)
        assert refused.exit_code == ExitCode.INVALID_ARGUMENT and "field: network_policy." in refused.stderr, (
            bad,
            refused.output,
        )


# Combinations the server refuses (test_the_server_refuses_what_the_cli_calls_a_usage_error),
# and an allow-listed policy that would allow nothing (--port alone, --deny alone with it).
USAGE_ERRORS = {
    "deny-cidr-with-deny-all": ("network-policy", "--egress", "deny-all", "--deny", "10.0.0.0/8"),
    "deny-domain-with-deny-all": ("network-policy", "--egress", "deny-all", "--deny-domain", "example.com"),
    "allow-domain-with-allow-all": ("network-policy", "--egress", "allow-all", "--allow-domain", "example.com"),
    "port-with-allow-all": ("network-policy", "--egress", "allow-all", "--port", "443"),
    "port-with-deny-all": ("network-policy", "--egress", "deny-all", "--port", "443"),
    "port-alone": ("network-policy", "--port", "443"),
    "allow-listed-deny-only": ("network-policy", "--egress", "allow-listed", "--deny", "10.0.0.0/8"),
    "port-0": ("network-policy", "--allow", "10.0.0.0/8", "--port", "0"),
    "port-65536": ("network-policy", "--allow", "10.0.0.0/8", "--port", "65536"),
    "expose-port-0": ("expose", "0"),
    "expose-port-65536": ("expose", "65536"),
    "expire-in-soon": ("expose", "8080", "--expire-in", "soon"),
    "expire-in-0s": ("expose", "8080", "--expire-in", "0s"),
    "expire-in-367d": ("expose", "8080", "--expire-in", "367d"),
}


@pytest.mark.parametrize("args", list(USAGE_ERRORS.values()), ids=list(USAGE_ERRORS))
def test_usage_errors_exit_2_before_any_round_trip(http1: _Http1Listener, args: tuple[str, ...]) -> None:
    command, *rest = args
    before = http1.connections
    result = runner.invoke(app, ["--server", http1.address, "workspace", command, "ws-00000000000000000000", *rest])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert http1.connections == before


def test_the_usage_check_s_listener_is_reached_by_a_valid_command(http1: _Http1Listener) -> None:
    """The check above can fail: a valid command reaches the listener and exits 8 (UNAVAILABLE)."""
    before = http1.connections
    valid = ("network-policy", "ws-00000000000000000000", "--egress", "deny-all")
    result = runner.invoke(app, ["--server", http1.address, "workspace", *valid])
    assert result.exit_code == ExitCode.UNAVAILABLE, result.output
    assert http1.connections > before


def test_the_server_refuses_what_the_cli_calls_a_usage_error(firecracker: ServerProcess) -> None:
    """The CLI's rules are the server's: each combination sent anyway is INVALID_ARGUMENT."""
    workspace_id = new_workspace(firecracker)
    with kibotos.Client(firecracker.address) as client:
        for egress, lists in (
            (wp.NETWORK_EGRESS_DENY_ALL, {"denied_cidrs": ["10.0.0.0/8"]}),
            (wp.NETWORK_EGRESS_DENY_ALL, {"denied_domains": ["example.com"]}),
            (wp.NETWORK_EGRESS_ALLOW_ALL, {"allowed_domains": ["example.com"]}),
            (wp.NETWORK_EGRESS_ALLOW_ALL, {"allowed_ports": [443]}),
        ):
            with pytest.raises(kibotos.InvalidArgumentError):
                client.set_workspace_network_policy(workspace_id, egress, **lists)  # type: ignore[arg-type]
        for port, seconds in ((0, 0), (65536, 0), (8080, 367 * 86400)):
            with pytest.raises(kibotos.InvalidArgumentError):
                client.create_workspace_exposure(workspace_id, port, expire_in_seconds=seconds)
        assert client.get_workspace(workspace_id).spec.network_policy.egress != wp.NETWORK_EGRESS_DENY_ALL
        assert client.list_workspace_exposures(workspace_id) == []
