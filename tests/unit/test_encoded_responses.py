"""The responses assembled from remembered encodings (api/render.py Encoded, field_bytes) are
byte for byte what protobuf itself makes of the same messages."""

from __future__ import annotations

import pytest
from google.protobuf import wrappers_pb2
from hypothesis import given
from hypothesis import strategies as st
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.api import render


def _workspace(n: int, label_bytes: int) -> wp.Workspace:
    return wp.Workspace(workspace_id=f"ws-{n:020x}", etag=str(n), labels={"k": "v" * label_bytes})


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=20_000), max_size=6),
    token=st.text(max_size=300),
)
def test_an_assembled_list_is_what_protobuf_encodes(sizes: list[int], token: str) -> None:
    # Label sizes cross the varint boundaries of a length (127/128, 16383/16384 bytes).
    workspaces = [_workspace(n, size) for n, size in enumerate(sizes)]
    fields = [render.field_bytes(1, w.SerializeToString()) for w in workspaces]
    if token:
        fields.append(render.field_bytes(2, token.encode()))
    expected = ws.ListWorkspacesResponse(workspaces=workspaces, next_page_token=token)
    assert b"".join(fields) == expected.SerializeToString()


@pytest.mark.parametrize("size", [1, 127, 128, 300, 16_383, 16_384, 2_097_152])
def test_a_field_is_its_key_its_length_and_its_bytes(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    # BytesValue is one length-delimited field numbered 1: protobuf's own encoding of it.
    assert render.field_bytes(1, payload) == wrappers_pb2.BytesValue(value=payload).SerializeToString()
    assert render.field_bytes(2, payload)[1:] == render.field_bytes(1, payload)[1:]
    assert render.field_bytes(2, payload)[0] == 2 << 3 | 2


def test_encoded_gives_the_message_it_was_made_from_or_parses_it() -> None:
    workspace = _workspace(7, 10)
    made = render.Encoded.of(ws.GetWorkspaceResponse(workspace=workspace))
    assert made.data == ws.GetWorkspaceResponse(workspace=workspace).SerializeToString()
    assembled = render.Encoded(render.field_bytes(1, workspace.SerializeToString()), ws.GetWorkspaceResponse)
    assert assembled.message == ws.GetWorkspaceResponse(workspace=workspace)
    assert assembled.data == made.data
