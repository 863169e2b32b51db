"""Unit tests of request validation: command IDs and the list filter (AIP-160 subset),
written from the contract's rules."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kibo_ctrl.domain import validation
from kibo_ctrl.domain.errors import InvalidArgument, KiboError, Reason, ReservedCommandId
from kibo_ctrl.domain.model import WorkspaceState as S
from kibo_ctrl.transport.errors import to_status

# -- validation: command IDs -------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "a",
        "example/6f1c2b3a",
        "6f1c2b3a-1d2e-4f50-8a9b-0c1d2e3f4a5b",
        "A-Z.a_z~0:9/-",
        "x" * 128,
        "guest-shutdown",  # the prefix is "guest-shutdown/"
        "x/guest-shutdown/1",
        "host-memory",
        "host-memory:1",
    ],
)
def test_valid_command_ids(value: str) -> None:
    assert validation.command_id(value) == value


@pytest.mark.parametrize(
    "value",
    ["", "x" * 129, "a b", "a\n", "é", "a+b", "a@b", "a*", "a,b", "a#b", "a\x00"],
    ids=lambda v: repr(v)[:20],
)
def test_invalid_command_ids(value: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.command_id(value)
    assert caught.value.reason is Reason.INVALID_ARGUMENT
    assert caught.value.field == "metadata.command_id"


@pytest.mark.parametrize("value", ["guest-shutdown/", "guest-shutdown/x", "host-memory/", "host-memory/123"])
def test_reserved_command_id_prefixes(value: str) -> None:
    with pytest.raises(ReservedCommandId) as caught:
        validation.command_id(value)
    assert caught.value.reason is Reason.RESERVED_COMMAND_ID
    code, _ = to_status(caught.value)
    assert code is grpc.StatusCode.INVALID_ARGUMENT


ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~:/-"


@given(st.text(alphabet=ALPHABET, min_size=1, max_size=128))
def test_any_id_from_the_alphabet_is_valid_unless_reserved(value: str) -> None:
    if value.startswith(("guest-shutdown/", "host-memory/")):
        with pytest.raises(ReservedCommandId):
            validation.command_id(value)
    else:
        assert validation.command_id(value) == value


@given(st.text(min_size=1, max_size=140).filter(lambda v: len(v) > 128 or any(c not in ALPHABET for c in v)))
def test_any_other_id_is_invalid(value: str) -> None:
    with pytest.raises(KiboError) as caught:
        validation.command_id(value)
    assert caught.value.reason is Reason.INVALID_ARGUMENT


# -- validation: the list filter (AIP-160 subset) --------------------------------------------


@pytest.mark.parametrize(
    ("text", "states", "labels"),
    [
        ("", (), ()),
        ("   ", (), ()),
        ("state = AVAILABLE", ((S.AVAILABLE, True),), ()),
        ("state=WORKSPACE_STATE_STOPPED", ((S.STOPPED, True),), ()),
        ("state != DELETED", ((S.DELETED, False),), ()),
        ('state = "FAILED"', ((S.FAILED, True),), ()),
        ('labels.team = "a b"', (), (("team", "a b", True),)),
        ("labels.team!=x", (), (("team", "x", False),)),
        ('labels."example.com/team" = x', (), (("example.com/team", "x", True),)),
        (
            "labels.team = x AND state = STOPPED AND state != DELETED",
            ((S.STOPPED, True), (S.DELETED, False)),
            (("team", "x", True),),
        ),
    ],
)
def test_filter_parses(text: str, states: tuple[Any, ...], labels: tuple[Any, ...]) -> None:
    parsed = validation.workspace_filter(text)
    assert parsed.states == states
    assert parsed.labels == labels


@pytest.mark.parametrize(
    "text",
    [
        "state = NOPE",
        "state = UNSPECIFIED",
        "state = WORKSPACE_STATE_UNSPECIFIED",
        "name = x",
        "state",
        "state =",
        "= AVAILABLE",
        "state = AVAILABLE OR state = STOPPED",
        "state ~ AVAILABLE",
        'labels.team = "unterminated',
        "state = AVAILABLE AND",
        "AND",
        "state = AVAILABLE and state = STOPPED",
        "NOT state = AVAILABLE",
        "state = AVAILABLE state = STOPPED",
    ],
)
def test_filter_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.workspace_filter(text)
    assert caught.value.field == "filter"
