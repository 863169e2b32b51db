"""Data-plane credentials against forgery (data_plane.py): a credential is `kdp1.PAYLOAD.SIG`,
PAYLOAD the workspace, its execution generation and its credential revision (base64 JSON), SIG
the HMAC-SHA256 of PAYLOAD under the server's key (DATA_DIR/data-plane.key).

Each forgery is well-formed: a payload the server would honour, a signature of the right size.
What is wrong is only the signature (made with another key, or taken from a credential for
something else: another workspace, an older generation or revision) or, signed with the
server's own key (which only the server has; a test reads it from the data directory), the
generation or revision. Each test first shows that the same payload signed with the server's
key is accepted, so a refusal is the signature's or the claim's, never a malformed token's.
Exec, read and write are each refused (UNAUTHENTICATED) and change nothing in the guest.
Needs root and bubblewrap, like test_process_runtime."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import kibotos
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.server import ServerProcess
from tests.system.test_data_plane_client import create, delete, poll
from tests.system.test_process_runtime import sandbox_server

Claims = dict[str, Any]


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory) as started:
        yield started


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(server.address) as client:
        yield client


@pytest.fixture
def workspace(sdk: kibotos.Client, server: ServerProcess) -> Iterator[str]:
    workspace_id = create(sdk)
    yield workspace_id
    if not sdk.get_workspace(workspace_id).deletion_started:
        delete(sdk, workspace_id, server)


@pytest.fixture
def victim(sdk: kibotos.Client, server: ServerProcess) -> Iterator[str]:
    workspace_id = create(sdk)
    yield workspace_id
    delete(sdk, workspace_id, server)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def server_key(server: ServerProcess) -> bytes:
    return (server.data_dir / "data-plane.key").read_bytes()


def signed(key: bytes, claims: Claims) -> str:
    """A credential for `claims`, signed with `key` as the server signs."""
    payload = _b64(json.dumps(claims).encode())
    return f"kdp1.{payload}.{_b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())}"


def claims_of(credential: str) -> Claims:
    claims = json.loads(_unb64(credential.split(".")[1]))
    assert isinstance(claims, dict) and set(claims) == {"w", "g", "r"}, claims
    return claims


def with_claims(credential: str, claims: Claims) -> str:
    """`credential`'s signature on a payload of other claims (what a holder can forge)."""
    prefix, _, signature = credential.split(".")
    return f"{prefix}.{_b64(json.dumps(claims).encode())}.{signature}"


def current(sdk: kibotos.Client, workspace_id: str) -> Claims:
    """The claims the workspace honours now."""
    workspace = sdk.get_workspace(workspace_id)
    return {"w": workspace_id, "g": workspace.execution_generation, "r": workspace.data_plane.credential_revision}


def accepted(sdk: kibotos.Client, credential: str) -> None:
    """The control: the credential works."""
    assert sdk.exec_workspace_command(credential, ["echo", "in"]).stdout == b"in\n"


def refused(sdk: kibotos.Client, credential: str, genuine: str, why: str) -> None:
    """Exec, read and write are each refused with `why`; nothing was written or run in the
    guest (asked with `genuine`, a credential the workspace honours)."""
    calls: list[Callable[[], object]] = [
        lambda: sdk.exec_workspace_command(credential, ["touch", "/data/forged-exec"]),
        lambda: sdk.read_workspace_file(credential, "/data/kept"),
        lambda: sdk.write_workspace_file(credential, "/data/forged-write", b"forged"),
    ]
    for call in calls:
        with pytest.raises(kibotos.UnauthenticatedError) as error:
            call()
        assert error.value.field == "credential" and why in error.value.message, error.value
    listing = sdk.exec_workspace_command(genuine, ["ls", "-A", "/data"])
    assert b"forged" not in listing.stdout, listing


SIGNATURE = "the data-plane credential is not valid"
REVOKED = "the credential was revoked"


def test_a_credential_signed_with_another_key_is_refused(
    sdk: kibotos.Client, server: ServerProcess, workspace: str
) -> None:
    genuine = sdk.issue_data_plane_credential(workspace).credential
    claims = claims_of(genuine)
    assert claims == current(sdk, workspace)
    accepted(sdk, signed(server_key(server), claims))
    refused(sdk, signed(secrets.token_bytes(32), claims), genuine, SIGNATURE)
    payload = genuine.split(".")[1]
    refused(sdk, f"kdp1.{payload}.{_b64(bytes(32))}", genuine, SIGNATURE)
    refused(sdk, f"kdp1.{payload}.", genuine, SIGNATURE)
    refused(sdk, f"kdp1.{payload}.AAAA", genuine, SIGNATURE)


def test_a_credential_re_signed_for_another_workspace_is_refused(
    sdk: kibotos.Client, server: ServerProcess, workspace: str, victim: str
) -> None:
    """The holder of one workspace's credential writes another's ID into it, keeping its
    signature, or signs that payload with a key of its own: both refused. Both workspaces are
    new (generation 1, revision 0), so the payload is the victim's own to the letter."""
    mine = sdk.issue_data_plane_credential(workspace).credential
    theirs = sdk.issue_data_plane_credential(victim).credential
    target = current(sdk, victim)
    assert claims_of(mine) == {**target, "w": workspace}
    accepted(sdk, signed(server_key(server), target))
    refused(sdk, with_claims(mine, target), theirs, SIGNATURE)
    refused(sdk, signed(secrets.token_bytes(32), target), theirs, SIGNATURE)
    refused(sdk, with_claims(mine, target).rsplit(".", 1)[0] + ".AAAA", theirs, SIGNATURE)


def test_a_revoked_credential_re_signed_for_the_current_revision_is_refused(
    sdk: kibotos.Client, server: ServerProcess, workspace: str
) -> None:
    old = sdk.issue_data_plane_credential(workspace).credential
    sdk.revoke_workspace_data_plane_access(workspace)
    now = current(sdk, workspace)
    assert now["r"] == claims_of(old)["r"] + 1 and now["g"] == claims_of(old)["g"]
    fresh = sdk.issue_data_plane_credential(workspace).credential
    accepted(sdk, signed(server_key(server), now))
    refused(sdk, old, fresh, REVOKED)
    refused(sdk, with_claims(old, now), fresh, SIGNATURE)


def test_an_old_generations_credential_re_signed_for_the_current_one_is_refused(
    sdk: kibotos.Client, server: ServerProcess, workspace: str
) -> None:
    old = sdk.issue_data_plane_credential(workspace).credential
    sdk.stop_workspace(workspace)
    sdk.start_workspace(workspace)
    poll(lambda: sdk.get_workspace(workspace).state == wp.WORKSPACE_STATE_AVAILABLE, within=30)
    now = current(sdk, workspace)
    assert now["g"] == claims_of(old)["g"] + 1
    fresh = sdk.issue_data_plane_credential(workspace).credential
    accepted(sdk, signed(server_key(server), now))
    refused(sdk, old, fresh, REVOKED)
    refused(sdk, with_claims(old, now), fresh, SIGNATURE)


@pytest.mark.parametrize(
    ("field", "by"),
    [("g", 1), ("g", -1), ("r", 1), ("r", -1)],
    ids=["next-generation", "previous-generation", "next-revision", "previous-revision"],
)
def test_a_credential_for_another_generation_or_revision_is_refused_whoever_signed_it(
    sdk: kibotos.Client, server: ServerProcess, workspace: str, field: str, by: int
) -> None:
    """Signed with the server's own key, so only the claim itself can be refused: a generation
    or revision the workspace is not at is no credential of it, whatever its signature."""
    genuine = sdk.issue_data_plane_credential(workspace).credential
    now = current(sdk, workspace)
    accepted(sdk, signed(server_key(server), now))
    refused(sdk, signed(server_key(server), {**now, field: now[field] + by}), genuine, REVOKED)


def test_a_deleted_workspace_honours_no_credential_whoever_signed_it(
    sdk: kibotos.Client, server: ServerProcess, workspace: str
) -> None:
    """A workspace being deleted (and deleted) is refused even a credential of its generation
    and revision as they are now, signed with the server's key; a missing one too."""
    genuine = sdk.issue_data_plane_credential(workspace).credential
    deleted = sdk.delete_workspace(workspace, settle=False)
    now = current(sdk, workspace)
    forged = signed(server_key(server), now)
    for credential in (forged, genuine):
        with pytest.raises(kibotos.UnauthenticatedError) as error:
            sdk.exec_workspace_command(credential, ["true"])
        assert error.value.field == "credential" and REVOKED in error.value.message, error.value
    sdk.wait_workspace_deleted(workspace, deleted.command.command_id, timeout=30)
    with pytest.raises(kibotos.UnauthenticatedError):
        sdk.read_workspace_file(signed(server_key(server), current(sdk, workspace)), "/data/kept")
    with pytest.raises(kibotos.UnauthenticatedError):
        sdk.read_workspace_file(signed(server_key(server), {**now, "w": "ws-missing"}), "/data/kept")
