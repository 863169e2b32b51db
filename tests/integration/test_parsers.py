"""Request parsers under a hostile tenant (issue 27, items 3 and 7, and the three "not yet
tried"): a 4 KiB filter answers INVALID_ARGUMENT quoting a short prefix, labels refuse
control characters (annotations keep them as given), page tokens answer only the query and
tenant that made them, command IDs are each tenant's own, and Connect JSON and gRPC-Web
bodies that are deep or large are refused cleanly, the server serving on with bounded memory.

Each test replays the attack through a real server (tests/server.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import struct
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws

from tests.client import Client, ErrorInfo, error_of, meta, new_id
from tests.conftest import TRANSPORTS
from tests.integration.test_api_hardening import connected
from tests.integration.test_auth import make_token
from tests.server import ServerProcess

Factory = Callable[..., ServerProcess]
INVALID = grpc.StatusCode.INVALID_ARGUMENT
# What an error message may quote of a request's value (domain/validation.py QUOTE_CHARS).
QUOTE_CHARS = 64


@pytest.fixture(scope="module")
def secured(server_factory: Factory) -> ServerProcess:
    """A simulator with tokens (tenants are made per test with make_token)."""
    return server_factory(auth=True)


async def refusal(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str, ErrorInfo]:
    """A call that must fail: its code, its message and its details."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or "", error_of(error)
    raise AssertionError("the call was accepted")


# -- item 3: a 4 KiB filter -------------------------------------------------------------------

FILTERS = {
    # The issue's: `\s+AND\s+` tried every position of the spaces (~130 ms).
    "issue": "a=b " + " " * 4088 + "ANDx",
    "long-term": "labels." + "k" * 4087 + " x",
    "unterminated": 'labels.k = "' + "v" * 4084,
    "spaces-before-and": "state = AVAILABLE" + " " * 4076 + "AND",
}


@pytest.mark.parametrize("name", FILTERS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_4kib_bad_filter_is_invalid_argument_quoting_a_short_prefix(
    secured: ServerProcess, transport: str, name: str
) -> None:
    """The attack's second half: the message quoted the whole 4 KiB term, which overflowed
    gRPC's 8 KiB metadata limit: the client got RESOURCE_EXHAUSTED ("received metadata size
    exceeds soft limit") instead of the error."""
    text = FILTERS[name]
    assert len(text) == 4096
    async with connected(secured, transport, secured.admin_token) as client:
        code, message, error = await refusal(client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=text)))
        assert (code, error.reason, error.detail.field) == (INVALID, "INVALID_ARGUMENT", "filter"), message[:300]
        # At most a short prefix of any part of the filter, and the rest of the message is short.
        for run in re.findall(r"(.)\1*", text):
            assert run * 2 not in message or len(run) <= QUOTE_CHARS
        assert len(message) <= 2 * QUOTE_CHARS + 120, message
        if name in ("long-term", "unterminated"):
            assert "…" in message, message
        # The server serves on (a valid filter of the same size is answered).
        await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter="state = AVAILABLE" + " " * 4079))


# -- item 7: labels and annotations ------------------------------------------------------------

BAD_LABELS: dict[str, dict[str, str]] = {
    "newline-in-value": {"team": "a\nb"},
    "escape-in-value": {"team": "\x1b[31m"},
    "nul-in-key": {"team\x00": "a"},
    "uppercase-key": {"Team": "a"},
    "space-in-key": {"a b": "x"},
    "uppercase-prefix": {"Example.com/team": "a"},
    "two-slashes": {"a/b/c": "x"},
    "key-not-alphanumeric-at-start": {"-team": "a"},
    "value-not-alphanumeric-at-end": {"team": "a-"},
    "value-over-63": {"team": "v" * 64},
    "key-over-63": {"k" * 64: "v"},
    "value-with-space": {"team": "a b"},
}


async def test_labels_with_control_characters_are_refused_and_nothing_is_stored(secured: ServerProcess) -> None:
    """The attack: a label value with a newline was stored. Labels follow Kubernetes' syntax
    (lowercase keys); every refusal leaves the workspace, the commands and the list as they were."""
    marker = uuid.uuid4().hex[:12]
    async with Client.connect(secured.address, secured.admin_token) as client:
        workspace = await client.create(labels={"team": "a", "marker": marker}, annotations={"note": "n"})
        before = workspace.SerializeToString(deterministic=True)
        for name, labels in BAD_LABELS.items():
            relabel = ws.SetWorkspaceLabelsRequest(
                metadata=meta(new_id("relabel")), workspace_id=workspace.workspace_id, labels=labels
            )
            code, message, error = await refusal(client.ws.SetWorkspaceLabels(relabel))
            assert (code, error.detail.field) == (INVALID, "labels"), (name, code, message)
            assert "\n" not in message and "\x1b" not in message and "\x00" not in message, (name, message)
            create = ws.CreateWorkspaceRequest(
                metadata=meta(new_id("create")), spec=wp.WorkspaceSpec(labels={**labels, "marker": marker})
            )
            code, message, error = await refusal(client.ws.CreateWorkspace(create))
            assert (code, error.detail.field) == (INVALID, "spec.labels"), (name, code, message)
            for command_id in (relabel.metadata.command_id, create.metadata.command_id):
                code, _, _ = await refusal(
                    client.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=command_id))
                )
                assert code == grpc.StatusCode.NOT_FOUND, (name, command_id)
        assert (await client.get(workspace.workspace_id)).SerializeToString(deterministic=True) == before
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=f'labels.marker = "{marker}"'))
        assert [w.workspace_id for w in listed.workspaces] == [workspace.workspace_id]

        # Kubernetes' own forms are accepted: a DNS prefix, '_' and '.' in names, empty values.
        valid = {"example.com/team": "a-b_c.d", "app.kubernetes.io/name": "Web1", "empty": "", "marker": marker}
        await client.settle(
            client.ws.SetWorkspaceLabels,
            ws.SetWorkspaceLabelsRequest(metadata=meta(), workspace_id=workspace.workspace_id, labels=valid),
        )
        assert dict((await client.get(workspace.workspace_id)).labels) == valid


async def test_annotations_keep_any_utf8_as_given(secured: ServerProcess) -> None:
    """Annotations may hold control characters (the CLI and the logs escape them when shown:
    tests/system/test_cli_escaping.py); their keys are label keys."""
    annotations = {"note": "\x1b[31mred\x1b[0m\nsecond line\ttab \u202e", "example.com/blob": "é" * 100}
    async with Client.connect(secured.address, secured.admin_token) as client:
        workspace = await client.create(annotations=annotations)
        assert dict((await client.get(workspace.workspace_id)).annotations) == annotations
        bad_key = ws.SetWorkspaceLabelsRequest(
            metadata=meta(), workspace_id=workspace.workspace_id, annotations={"a\nb": "x"}
        )
        code, message, error = await refusal(client.ws.SetWorkspaceLabels(bad_key))
        assert (code, error.detail.field) == (INVALID, "annotations") and "\n" not in message
        # 64 KiB in UTF-8 bytes, not characters: 33,000 two-byte characters are over it.
        over = ws.SetWorkspaceLabelsRequest(
            metadata=meta(), workspace_id=workspace.workspace_id, annotations={"a": "é" * 33_000}
        )
        code, _, error = await refusal(client.ws.SetWorkspaceLabels(over))
        assert (code, error.detail.field) == (INVALID, "annotations")
        assert dict((await client.get(workspace.workspace_id)).annotations) == annotations


# -- not yet tried: page-token tampering ---------------------------------------------------------


def _token(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


def _claims(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(token))
    return claims


async def test_tampered_page_tokens_are_invalid_argument_and_never_show_another_tenants_rows(
    secured: ServerProcess,
) -> None:
    run = uuid.uuid4().hex[:12]
    alpha, beta = make_token(secured, f"alpha-{run}"), make_token(secured, f"beta-{run}")
    flt = f'labels.run = "{run}"'
    async with Client.connect(secured.address, alpha) as a, Client.connect(secured.address, beta) as b:
        mine = {(await a.create(labels={"run": run})).workspace_id for _ in range(3)}
        theirs = {(await b.create(labels={"run": run})).workspace_id for _ in range(3)}
        b_page = await b.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt, page_size=1))
        a_page = await a.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt, page_size=1))
        b_token, a_token = b_page.next_page_token, a_page.next_page_token
        assert b_token and a_token
        a_scope = _claims(a_token)["scope"]
        tampered = {
            "another-tenants": b_token,
            "garbage": "!!not a token!!",
            "other-json": _token({"a": 1}),
            "a-list": _token([1, 2]),
            "a-string": _token("x"),
            "after-as-text": _token({"after": "1", "scope": a_scope}),
            "after-as-float": _token({"after": 1.5, "scope": a_scope}),
            "after-negative": _token({"after": -1, "scope": a_scope}),
            "after-over-sqlite": _token({"after": 2**63, "scope": a_scope}),
            "nested": base64.urlsafe_b64encode(b"[" * 150).decode(),
            "huge": a_token * 50_000,
        }
        for name, token in tampered.items():
            request = ws.ListWorkspacesRequest(filter=flt, page_size=1, page_token=token)
            code, message, error = await refusal(a.ws.ListWorkspaces(request))
            assert (code, error.detail.field) == (INVALID, "page_token"), (name, code, message[:200])
        # A's own token, on another query.
        for other in (
            ws.ListWorkspacesRequest(filter=f'labels.run = "{run}x"', page_size=1, page_token=a_token),
            ws.ListWorkspacesRequest(filter=flt, include_deleted=True, page_size=1, page_token=a_token),
        ):
            code, _, error = await refusal(a.ws.ListWorkspaces(other))
            assert (code, error.detail.field) == (INVALID, "page_token")
        # A token A forges in its own scope (from the start, or from B's row) shows A's rows only.
        for after in (0, _claims(b_token)["after"], _claims(a_token)["after"]):
            token = _token({"after": after, "scope": a_scope})
            page = await a.ws.ListWorkspaces(ws.ListWorkspacesRequest(filter=flt, page_size=1000, page_token=token))
            assert {w.workspace_id for w in page.workspaces} <= mine
            assert not {w.workspace_id for w in page.workspaces} & theirs
        # Events: B's token for B's workspace is refused on A's workspace.
        b_events = await b.obs.ListWorkspaceEvents(
            obs.ListWorkspaceEventsRequest(workspace_id=next(iter(theirs)), page_size=1)
        )
        assert b_events.next_page_token
        events = obs.ListWorkspaceEventsRequest(
            workspace_id=next(iter(mine)), page_size=1, page_token=b_events.next_page_token
        )
        code, _, error = await refusal(a.obs.ListWorkspaceEvents(events))
        assert (code, error.detail.field) == (INVALID, "page_token")


# -- not yet tried: command-ID reuse across tenants ---------------------------------------------


async def test_the_same_command_id_in_two_tenants_is_two_commands(secured: ServerProcess) -> None:
    """B's command with A's command ID, on B's own workspace: never ALREADY_EXISTS, never A's
    command or workspace in the answer, and each tenant reads back its own."""
    run = uuid.uuid4().hex[:12]
    alpha, beta = make_token(secured, f"alpha-{run}"), make_token(secured, f"beta-{run}")
    async with Client.connect(secured.address, alpha) as a, Client.connect(secured.address, beta) as b:
        # Creates first: A's finished create is what a lookup by ID alone would hand B.
        shared = new_id("shared")
        a_create = await a.settle(a.ws.CreateWorkspace, ws.CreateWorkspaceRequest(metadata=meta(shared)))
        b_create = await b.settle(b.ws.CreateWorkspace, ws.CreateWorkspaceRequest(metadata=meta(shared)))
        a_ws, b_ws = a_create.workspace.workspace_id, b_create.workspace.workspace_id
        assert a_ws != b_ws and b_create.command.workspace_id == b_ws
        # Then the same ID on each tenant's own workspace, at once.
        relabel = new_id("relabel")
        a_set, b_set = await asyncio.gather(
            a.ws.SetWorkspaceLabels(
                ws.SetWorkspaceLabelsRequest(metadata=meta(relabel), workspace_id=a_ws, labels={"owner": "alpha"})
            ),
            b.ws.SetWorkspaceLabels(
                ws.SetWorkspaceLabelsRequest(metadata=meta(relabel), workspace_id=b_ws, labels={"owner": "beta"})
            ),
        )
        assert (a_set.command.workspace_id, b_set.command.workspace_id) == (a_ws, b_ws)
        assert (a_set.workspace.labels["owner"], b_set.workspace.labels["owner"]) == ("alpha", "beta")
        # Stops and starts under one ID at once: both callers wait for their command to finish
        # (a waiter keyed by the ID alone would be handed the other tenant's workspace).
        for kind in ("stop", "start", "stop"):
            both = new_id(kind)
            method = "StopWorkspace" if kind == "stop" else "StartWorkspace"
            request = ws.StopWorkspaceRequest if kind == "stop" else ws.StartWorkspaceRequest
            answers = await asyncio.gather(
                getattr(a.ws, method)(request(metadata=meta(both), workspace_id=a_ws)),
                getattr(b.ws, method)(request(metadata=meta(both), workspace_id=b_ws)),
            )
            assert [(x.workspace.workspace_id, x.command.workspace_id) for x in answers] == [(a_ws, a_ws), (b_ws, b_ws)]
            for client, own in ((a, a_ws), (b, b_ws)):
                await client.wait_steady(own)
                assert (await client.command(both)).workspace_id == own
        for client, own in ((a, a_ws), (b, b_ws)):
            for command_id in (shared, relabel):
                assert (await client.command(command_id)).workspace_id == own
        # Within a tenant an ID stays one request's: B's other request under it is refused,
        # and that leaves A's command alone.
        code, _, error = await refusal(
            b.ws.SetWorkspaceLabels(
                ws.SetWorkspaceLabelsRequest(metadata=meta(relabel), workspace_id=b_ws, labels={"owner": "x"})
            )
        )
        assert (code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "COMMAND_ID_REUSED")
        assert (await a.get(a_ws)).labels["owner"] == "alpha"


# -- a workspace ID quoted in an error ------------------------------------------------------------


async def test_a_huge_workspace_id_for_a_credential_is_invalid_argument(secured: ServerProcess) -> None:
    """IssueDataPlaneCredential looked a 6 KiB ID up and answered NOT_FOUND quoting it whole:
    over gRPC, RESOURCE_EXHAUSTED (the metadata limit) instead."""
    async with Client.connect(secured.address, secured.admin_token) as client:
        assert client.channel is not None
        stub = dp_grpc.DataPlaneServiceStub(client.channel)  # type: ignore[no-untyped-call]
        request = dp.IssueDataPlaneCredentialRequest(workspace_id="ws-" + "a" * 6000)
        code, message, error = await refusal(stub.IssueDataPlaneCredential(request))
        assert (code, error.detail.field) == (INVALID, "workspace_id"), (code, message[:200])
        assert len(message) < 200


# -- not yet tried: deep and large Connect JSON and gRPC-Web bodies -------------------------------

WORKSPACE_SERVICE = "kibo.ctrl.v1.WorkspaceService"
DEPTH = 10_000


def post(server: ServerProcess, method: str, body: bytes, content_type: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"http://{server.http_address}/{WORKSPACE_SERVICE}/{method}",
        data=body,
        headers={"content-type": content_type, "authorization": f"Bearer {server.admin_token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def grpc_web_frame(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def grpc_web_status(headers: dict[str, str], body: bytes) -> int:
    """The grpc-status of a gRPC-Web answer: in the headers, or in its trailer frame."""
    if "grpc-status" in headers:
        return int(headers["grpc-status"])
    while body:
        flags, length = body[0], struct.unpack(">I", body[1:5])[0]
        frame, body = body[5 : 5 + length], body[5 + length :]
        if flags & 0x80:
            found = re.search(rb"grpc-status: ?(\d+)", frame)
            assert found is not None, frame
            return int(found.group(1))
    raise AssertionError(f"no grpc-status in {headers} {body[:200]!r}")


def connect_code(status: int, body: bytes) -> str:
    assert status != 200, body[:200]
    code: str = json.loads(body)["code"]
    return code


def rss_mib(server: ServerProcess) -> float:
    assert server.process is not None
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(re.findall(r"VmRSS:\s+(\d+)", status)[0]) / 1024


def _values(count: int) -> bytes:
    return json.dumps(
        {"metadata": {"commandId": new_id("json")}, "spec": {"annotations": {f"k{i}": "" for i in range(count)}}}
    ).encode()


Hostile = dict[str, tuple[str, bytes, str, str | int]]


def hostile() -> Hostile:
    """Name: (method, body, content type, the answer: a Connect code or a gRPC status number)."""
    return {
        "json-deep-array": (
            "ListWorkspaces",
            b'{"filter": ' + b"[" * DEPTH + b"]" * DEPTH + b"}",
            "application/json",
            "invalid_argument",
        ),
        "json-deep-object": (
            "ListWorkspaces",
            b'{"pageSize": ' + b'{"a":' * DEPTH + b"1" + b"}" * DEPTH + b"}",
            "application/json",
            "invalid_argument",
        ),
        # Just under the 4 MiB message limit: 1.4 million empty lists (json.loads: 100 MiB, 0.35 s).
        "json-many-lists": (
            "ListWorkspaces",
            b'{"filter": [' + b"[]," * 1_390_000 + b"[]]}",
            "application/json",
            "invalid_argument",
        ),
        # 280,000 CIDRs were parsed one by one and stored (1.2 s of the event loop each time).
        "json-many-cidrs": (
            "CreateWorkspace",
            json.dumps(
                {
                    "metadata": {"commandId": "many-cidrs"},
                    "spec": {
                        "networkPolicy": {
                            "egress": "NETWORK_EGRESS_ALLOW_LISTED",
                            "allowedCidrs": ["10.0.0.0/8"] * 280_000,
                        }
                    },
                }
            ).encode(),
            "application/json",
            "invalid_argument",
        ),
        "json-many-annotations": ("CreateWorkspace", _values(250_000), "application/json", "invalid_argument"),
        # Near the 8 MiB body cap: over the 4 MiB message limit.
        "json-near-8mib": (
            "ListWorkspaces",
            json.dumps({"filter": "x" * (8 * 1024 * 1024 - 1024)}).encode(),
            "application/json",
            "resource_exhausted",
        ),
        "grpc-web-json-deep": (
            "ListWorkspaces",
            grpc_web_frame(b'{"filter": ' + b"[" * DEPTH + b"]" * DEPTH + b"}"),
            "application/grpc-web+json",
            3,
        ),
        "grpc-web-json-many-lists": (
            "ListWorkspaces",
            grpc_web_frame(b'{"filter": [' + b"[]," * 1_390_000 + b"[]]}"),
            "application/grpc-web+json",
            3,
        ),
        # Unknown field 99 as 10,000 nested groups.
        "grpc-web-proto-deep-groups": (
            "ListWorkspaces",
            grpc_web_frame(b"\x9b\x06" * DEPTH + b"\x9c\x06" * DEPTH),
            "application/grpc-web+proto",
            3,
        ),
        "grpc-web-proto-many-cidrs": (
            "CreateWorkspace",
            grpc_web_frame(
                ws.CreateWorkspaceRequest(
                    metadata=wp.CommandMetadata(command_id="many-cidrs-proto"),
                    spec=wp.WorkspaceSpec(
                        network_policy=wp.NetworkPolicy(
                            egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_cidrs=["10.0.0.0/8"] * 340_000
                        )
                    ),
                ).SerializeToString()
            ),
            "application/grpc-web+proto",
            3,
        ),
        "grpc-web-proto-near-8mib": (
            "ListWorkspaces",
            grpc_web_frame(ws.ListWorkspacesRequest(filter="x" * (8 * 1024 * 1024 - 1024)).SerializeToString()),
            "application/grpc-web+proto",
            8,  # RESOURCE_EXHAUSTED
        ),
    }


def answer(server: ServerProcess, bodies: Hostile, name: str) -> None:
    method, body, content_type, wanted = bodies[name]
    status, headers, reply = post(server, method, body, content_type)
    if isinstance(wanted, str):
        assert connect_code(status, reply) == wanted, (name, status, reply[:300])
        assert len(reply) < 4096, (name, len(reply))
    else:
        assert grpc_web_status(headers, reply) == wanted, (name, status, headers, reply[:300])


async def grpc_refusals(client: Client) -> None:
    """The same over the gRPC port: 4 MiB requests, refused."""
    big_filter = ws.ListWorkspacesRequest(filter="x" * (4 * 1024 * 1024 - 64))
    many_cidrs = ws.CreateWorkspaceRequest(
        metadata=meta("many-cidrs-grpc"),
        spec=wp.WorkspaceSpec(
            network_policy=wp.NetworkPolicy(
                egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_cidrs=["10.0.0.0/8"] * 340_000
            )
        ),
    )
    for call in (client.ws.ListWorkspaces(big_filter), client.ws.CreateWorkspace(many_cidrs)):
        code, _, _ = await refusal(call)
        assert code == INVALID


async def test_deep_and_large_json_and_grpc_web_bodies_are_refused_cleanly(server_factory: Factory) -> None:
    """Each hostile body answers a clean INVALID_ARGUMENT or RESOURCE_EXHAUSTED; meanwhile the
    server answers another client, nothing was stored, and its memory stays bounded."""
    server = server_factory(auth=True)
    async with Client.connect(server.address, server.admin_token) as client:
        await client.create()
        bodies = hostile()
        for name in bodies:  # once, to warm up what every request allocates anyway
            await asyncio.to_thread(answer, server, bodies, name)
        await grpc_refusals(client)
        before = rss_mib(server)
        for _ in range(3):
            for name in bodies:
                await asyncio.to_thread(answer, server, bodies, name)
                await client.ws.GetCapabilities(ws.GetCapabilitiesRequest())
            await grpc_refusals(client)
        grown = rss_mib(server) - before
        print(f"RSS {before:.0f} MiB before 3 rounds of {len(bodies) + 2} hostile bodies, +{grown:.1f} MiB after")
        assert grown < 64, f"RSS grew {grown:.0f} MiB"
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(include_deleted=True))
        assert len(listed.workspaces) == 1
        for command_id in ("many-cidrs", "many-cidrs-proto", "many-cidrs-grpc"):
            code, _, _ = await refusal(
                client.ws.GetWorkspaceCommand(ws.GetWorkspaceCommandRequest(command_id=command_id))
            )
            assert code == grpc.StatusCode.NOT_FOUND
