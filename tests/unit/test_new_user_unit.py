"""Issue 36 ("small things a new user trips on"), the parts that need no server: the rules'
hints, the SDK's reading of a wrong address, the failure words of a process sandbox, and the
server pointers local clients find tokens through."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import kibotos
import pytest
from kibo_ctrl.domain import rules
from kibo_ctrl.domain.errors import Conflict
from kibo_ctrl.domain.model import CommandKind as Op
from kibo_ctrl.domain.model import WorkspaceState as S
from kibo_ctrl.runtime.process.supervisor_handle import crash_detail
from kibotos import token_discovery
from kibotos.errors import from_rpc_error
from kibotos.settle import SettleOptions, settle

# -- item 5: hints -------------------------------------------------------------------------


@pytest.mark.parametrize("op", [Op.RESIZE, Op.BIND_VOLUME, Op.UNBIND_VOLUME])
def test_what_only_a_stopped_workspace_takes_says_stop_it_first(op: Op) -> None:
    with pytest.raises(Conflict) as caught:
        rules.check(op, rules.Facts(S.AVAILABLE, holds_execution=True))
    assert caught.value.hint.startswith("stop it first"), caught.value.hint


class _Http1Peer(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What grpc raises when the address answers HTTP/1.x (its words, as seen on port 8080)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return (
            "failed to connect to all addresses; last error: UNIMPLEMENTED: ipv4:127.0.0.1:8080: Failed parsing "
            "HTTP/2 (Expected SETTINGS frame as the first frame, got frame type 80) (Trying to connect an "
            "http1.x server (HTTP status 404))"
        )

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_the_http_port_is_named_and_not_retried() -> None:
    error = from_rpc_error(_Http1Peer())
    assert isinstance(error, kibotos.WrongPortError) and isinstance(error, kibotos.UnavailableError)
    assert "HTTP port" in error.hint and "50051" in error.hint
    calls = []

    def call() -> kibotos.CommandResponse:
        calls.append(1)
        raise _Http1Peer()

    # settle retries UNAVAILABLE until its deadline; a wrong port is said at once.
    with pytest.raises(kibotos.WrongPortError):
        settle(call, SettleOptions(timeout=3))
    assert len(calls) == 1


@pytest.mark.parametrize("url", ["http://127.0.0.1:50051", "https://kibo.example:443", "grpc://127.0.0.1:50051"])
def test_a_url_is_refused_with_drop_the_scheme(url: str) -> None:
    with pytest.raises(ValueError, match="drop the scheme"):
        kibotos.Client(url)
    with pytest.raises(ValueError, match="drop the scheme"):
        kibotos.Connection(address=url)


@pytest.mark.parametrize("target", ["127.0.0.1:50051", "localhost:50051", "dns:///kibo.example:50051", "[::1]:50051"])
def test_grpc_targets_pass(target: str) -> None:
    assert kibotos.check_address(target) == target


# -- item 6: a process sandbox's failure names what ended -----------------------------------------


@pytest.mark.parametrize(
    ("info", "words"),
    [
        (None, "supervisor is gone"),
        ({"reason": "exit", "code": 3, "signal": None}, "its init exited (code 3)"),
        ({"reason": "exit", "code": None, "signal": 9}, "its init exited (signal 9)"),
        ({"reason": "exit", "error": "the guest ended while no supervisor held it (gone)"}, "no supervisor held it"),
    ],
)
def test_a_sandbox_crash_names_its_supervisor_or_its_guest(info: dict[str, object] | None, words: str) -> None:
    detail = crash_detail(info)
    assert words in detail and "VMM" not in detail, detail


# -- item 7: server pointers ----------------------------------------------------------------------


@pytest.fixture
def state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("KIBO_TOKEN", raising=False)
    return tmp_path / "state" / "kibo" / "servers"


def _pointer_of_a_process_that_exited(address: str, token_file: Path) -> Path:
    """A pointer written by a server process that is gone now (as after a kill -9)."""
    code = (
        "import sys; from pathlib import Path; from kibotos.token_discovery import write_pointer; "
        "write_pointer(sys.argv[1], Path(sys.argv[2]))"
    )
    subprocess.run([sys.executable, "-c", code, address, str(token_file)], check=True, timeout=60)
    return token_discovery.pointer_path(address)


def test_a_pointer_whose_server_is_gone_is_passed_over_and_pruned(state_home: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "old" / "admin.token"
    token_file.parent.mkdir()
    token_file.write_text("kibo_old\n")
    pointer = _pointer_of_a_process_that_exited("127.0.0.1:50977", token_file)
    found = token_discovery.discover("127.0.0.1:50977")
    assert found.token is None, "a gone server's token was followed (its port may be another server's now)"
    assert f"{pointer} (passed over: its server, PID" in found.describe()
    assert token_discovery.prune_pointers() == [pointer]
    assert not pointer.exists() and not Path(f"{pointer}.pid").exists()


def test_a_live_servers_pointer_is_followed_and_removed_only_by_it(state_home: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("kibo_live\n")
    pointer = token_discovery.write_pointer("127.0.0.1:50978", token_file)  # this process: alive
    assert token_discovery.discover("127.0.0.1:50978").token == "kibo_live"
    assert token_discovery.prune_pointers() == []
    # Another process's pointer is not this one's to remove.
    other = _pointer_of_a_process_that_exited("127.0.0.1:50979", token_file)
    assert not token_discovery.remove_pointer(other) and other.exists()
    assert token_discovery.remove_pointer(pointer)
    assert sorted(p.name for p in state_home.iterdir()) == ["127.0.0.1_50979", "127.0.0.1_50979.pid"]


def test_a_pointer_of_an_older_server_without_an_owner_is_followed(state_home: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("kibo_older\n")
    state_home.mkdir(parents=True)
    (state_home / "127.0.0.1_50980").write_text(f"{token_file}\n")
    # One whose data dir is gone (the 19 found were mostly of deleted temporary dirs) is pruned.
    (state_home / "127.0.0.1_50981").write_text(f"{tmp_path / 'deleted' / 'admin.token'}\n")
    assert token_discovery.discover("127.0.0.1:50980").token == "kibo_older"
    assert token_discovery.prune_pointers() == [state_home / "127.0.0.1_50981"]
    assert sorted(os.listdir(state_home)) == ["127.0.0.1_50980"]
