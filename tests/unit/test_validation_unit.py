"""Unit tests of request validation: command IDs and the list filter (AIP-160 subset),
written from the contract's rules."""

from __future__ import annotations

import base64
import urllib.parse
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


@pytest.mark.parametrize(
    ("text", "states", "labels"),
    [
        # AND inside a quoted value is the value's (the old split cut the term there).
        ('labels.a = "x AND y"', (), (("a", "x AND y", True),)),
        ("state=FAILED\tAND\tstate!=DELETED", ((S.FAILED, True), (S.DELETED, False)), ()),
        ('labels."k" = "" AND labels.k2 != v', (), (("k", "", True), ("k2", "v", False))),
    ],
)
def test_filter_parses_quotes_and_spaces(text: str, states: tuple[Any, ...], labels: tuple[Any, ...]) -> None:
    parsed = validation.workspace_filter(text)
    assert (parsed.states, parsed.labels) == (states, labels)


@pytest.mark.parametrize(
    "text",
    [
        'state = AVAILABLE"x"',
        'state = FAILED AND"',
        'labels. "k" = v',
        "labels.a:b = v",
        "state = \x1b[31m",
        "state = AVAILABLE AND ",
        " AND ".join(["state = FAILED"] * (validation.MAX_FILTER_TERMS + 1)),
        "x" * (validation.MAX_FILTER_CHARS + 1),
        " " * (validation.MAX_FILTER_CHARS + 1),
    ],
    ids=lambda v: repr(v)[:24],
)
def test_filter_rejects_more(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.workspace_filter(text)
    assert caught.value.field == "filter"
    assert len(caught.value.message) < 250 and "\x1b" not in caught.value.message


def test_filter_errors_quote_a_short_prefix() -> None:
    for text in ("labels." + "k" * 4000 + " x", 'labels.k = "' + "v" * 4000, "a=b " + " " * 4000 + "ANDx"):
        with pytest.raises(InvalidArgument) as caught:
            validation.workspace_filter(text)
        assert len(caught.value.message) <= validation.QUOTE_CHARS + 120, caught.value.message


def test_quote() -> None:
    assert validation.quote("abc") == "'abc'"
    assert validation.quote("a" * 100) == "'" + "a" * validation.QUOTE_CHARS + "'…"
    assert validation.quote("\x1b[31m\n") == "'\\x1b[31m\\n'"


# -- validation: labels and annotations (Kubernetes' syntax, lowercase keys) ------------------


@pytest.mark.parametrize(
    "key",
    ["a", "team", "sdk-test", "x.y/z", "example.com/team", "app.kubernetes.io/name", "a_b", "a.b-c", "k" * 63],
)
def test_valid_label_keys(key: str) -> None:
    assert validation.label_map({key: "v"}, "labels") == {key: "v"}
    assert validation.annotation_map({key: "v"}) == {key: "v"}


@pytest.mark.parametrize(
    "key",
    [
        "",
        "Team",
        "a b",
        "-a",
        "a-",
        "_a",
        "a/b/c",
        "/a",
        "a/",
        "Example.com/a",
        "a_b.c/d",
        "a..b/c",
        "k" * 64,
        "a\n",
        "é",
    ],
    ids=repr,
)
def test_invalid_label_keys(key: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.label_map({key: "v"}, "labels")
    assert caught.value.field == "labels" and "\n" not in caught.value.message
    with pytest.raises(InvalidArgument):
        validation.annotation_map({key: "v"})


@pytest.mark.parametrize("value", ["", "a", "A1", "a-b_c.d", "v" * 63])
def test_valid_label_values(value: str) -> None:
    assert validation.label_map({"k": value}, "labels") == {"k": value}


@pytest.mark.parametrize("value", ["a\nb", "\x1b[31m", "a b", "-a", "a.", "v" * 64, "é", "a/b", "a\x00"], ids=repr)
def test_invalid_label_values(value: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.label_map({"k": value}, "spec.labels")
    assert caught.value.field == "spec.labels"
    assert not any(c in caught.value.message for c in "\n\x1b\x00")


def test_annotation_values_are_any_utf8_up_to_64_kib_in_bytes() -> None:
    hostile = {"note": "\x1b[31mred\n\x00\u202e"}
    assert validation.annotation_map(hostile) == hostile
    assert validation.annotation_map({"a": "x" * (64 * 1024 - 1)})
    with pytest.raises(InvalidArgument):
        validation.annotation_map({"a": "é" * (32 * 1024)})  # 64 KiB of characters, 128 KiB of UTF-8
    with pytest.raises(InvalidArgument):
        validation.annotation_map({f"k{i}": "" for i in range(64 * 1024 + 1)})


def test_a_status_message_is_bounded_whatever_quotes_it() -> None:
    """A message that quotes a 4 KiB value whole (a data-plane path) overflowed gRPC's 8 KiB
    trailing metadata: the client read RESOURCE_EXHAUSTED instead of the error."""
    for text in ("p" * 5000, "é" * 5000, "€/" * 3000):
        _, status = to_status(InvalidArgument(f"path {text!r} is not under a volume mount", field="path"))
        assert len(status.message.encode()) <= 1024 + len("…".encode())
        assert status.message.startswith("path '") and status.message.endswith("…")
        # What gRPC sends: the message percent-encoded, the whole status in base64.
        percent = len(urllib.parse.quote(status.message, safe=""))
        assert percent + len(base64.b64encode(status.SerializeToString())) < 8 * 1024
    _, short = to_status(InvalidArgument("a short message"))
    assert short.message == "a short message"
