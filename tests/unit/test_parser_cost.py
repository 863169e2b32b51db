"""Every parser of request fields costs, on the worst input of its largest size, about what
a valid input of that size costs (issue 27, item 3: `\\s+AND\\s+` made a 4 KiB filter of
spaces cost ~130 ms, 500 times a valid 32-term filter, and one reader slowed every tenant).

Each test measures both in the same run (the best of several rounds, each long enough for
the clock) and compares them: never an absolute time. A refusal also pays for raising an
InvalidArgument, a constant measured here too (`floor`): the bound is RATIO times the valid
input's cost plus that constant, so a parser that is quick either way cannot fail on it,
and one that backtracks (500x) cannot pass."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from connectrpc.errors import ConnectError
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo_ctrl.api import control_plane, parse
from kibo_ctrl.domain import validation
from kibo_ctrl.domain.errors import KiboError
from kibo_ctrl.transport.connect import MAX_JSON_VALUES, StrictJsonCodec

RATIO = 5.0
ROUNDS = 7
ROUND_SECONDS = 0.004
MESSAGE_BYTES = 4 * 1024 * 1024  # what gRPC takes in one message (app.MAX_MESSAGE_BYTES)


def _call(parser: Callable[[Any], object], value: Any) -> None:
    with contextlib.suppress(KiboError, ConnectError):
        parser(value)


def cost(parser: Callable[[Any], object], value: Any, rounds: int = ROUNDS) -> float:
    """CPU seconds per call (this thread's: a machine busy with other processes does not
    count, as wall time did: a 21 ms round in CI under four test workers on two cores): the
    best of `rounds` rounds of as many calls as fill ROUND_SECONDS."""
    start = time.thread_time()
    _call(parser, value)
    # At least 4 calls a round: the first calls with a large value set the allocator's
    # thresholds (until then each one maps and faults in fresh pages: 8x slower).
    loops = max(4, int(ROUND_SECONDS / max(time.thread_time() - start, 1e-7)))
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(loops):
            _call(parser, value)
        best = min(best, (time.thread_time() - start) / loops)
    return best


def floor() -> float:
    """What refusing anything costs: raising and catching an InvalidArgument."""
    return cost(validation.command_id, "")


_ONE_HUGE_VALUE = wp.WorkspaceSpec(annotations={"a": "x" * MESSAGE_BYTES})


def message_floor() -> float:
    """What merely reading a message's worth of one string field costs (protobuf makes a
    fresh 4 MiB Python string of it, UTF-8 checked): any parser that looks at that field pays
    it once, and here it varies between 0.2 and 1.6 ms, over the bound of a small valid
    input (a 'huge-annotation' failed so in CI)."""
    return cost(lambda spec: spec.annotations["a"], _ONE_HUGE_VALUE)


def assert_linear(
    parser: Callable[[Any], object], valid: Any, worst: dict[str, Any], rounds: int = ROUNDS, attempts: int = 3
) -> None:
    """Each worst input within RATIO of the valid one. An input over the bound is measured
    again, with the valid one, up to `attempts` times: a busy machine can slow one round of
    one side (seen under a full suite beside other work), a parser that backtracks is slow in
    every attempt (the filter's old split: 470x, each time)."""
    parser(valid)  # valid indeed: it raises otherwise
    pending = dict(worst)
    for _ in range(attempts):
        baseline = cost(parser, valid, rounds)
        bound = RATIO * (baseline + floor() + message_floor())
        costs = {name: cost(parser, value, rounds) for name, value in pending.items()}
        shown = ", ".join(f"{name} {seconds * 1e6:.0f}" for name, seconds in costs.items())
        print(f"{getattr(parser, '__name__', parser)}: valid {baseline * 1e6:.1f} us; worst (us): {shown}")
        slow = {name: f"{seconds * 1e6:.0f} us" for name, seconds in costs.items() if seconds > bound}
        if not slow:
            return
        pending = {name: pending[name] for name in slow}
    raise AssertionError(f"valid: {baseline * 1e6:.1f} us, bound {bound * 1e6:.1f} us; over it: {slow}")


# -- the list filter ----------------------------------------------------------------------------


def _padded(text: str, size: int = validation.MAX_FILTER_CHARS) -> str:
    return text + " " * (size - len(text))


VALID_FILTER = _padded(" AND ".join(f'labels.k{i} != "x"' for i in range(validation.MAX_FILTER_TERMS)))
WORST_FILTERS = {
    # The input: spaces for \s+ to try from every position.
    "issue": "a=b " + " " * 4088 + "ANDx",
    "spaces-before-and": _padded("state = AVAILABLE" + " " * 4070 + "AND"),
    "tabs": "state=FAILED\t" + "\t" * 4070 + "AND\tx",
    "unterminated-quote": 'labels.k = "' + "v" * 4084,
    "long-field": "labels." + "k" * 4085 + " = x",
    "long-value": "labels.k = " + "v" * 4083 + " x",
    "quotes": '"' * 4096,
    "equals": "=" * 4096,
    "ands": " AND" * 1024,
    "too-many-terms": " AND ".join(["state = FAILED"] * 300)[: validation.MAX_FILTER_CHARS],
    "oversized": "state = FAILED " * (MESSAGE_BYTES // 16),
}


def test_the_filter_parser_is_linear() -> None:
    assert len(VALID_FILTER) == validation.MAX_FILTER_CHARS
    assert all(len(text) <= validation.MAX_FILTER_CHARS for name, text in WORST_FILTERS.items() if name != "oversized")
    assert_linear(validation.workspace_filter, VALID_FILTER, WORST_FILTERS)


# -- command IDs, resource IDs, mount paths, page tokens ------------------------------------------


def test_command_and_resource_ids_are_linear() -> None:
    assert_linear(
        validation.command_id,
        "c" * 128,
        {"huge": "c" * MESSAGE_BYTES, "bad-last": "c" * 127 + "\x00", "reserved": "guest-shutdown/" + "c" * 113},
    )
    assert_linear(
        parse.workspace_id,
        "ws-" + "0" * 125,
        {"huge": "ws-" + "0" * MESSAGE_BYTES, "bad-last": "ws-" + "0" * 124 + " ", "prefix": "wx-" + "0" * 125},
    )


def test_mount_paths_are_linear() -> None:
    valid = "/" + "/".join(["segment"] * 31) + "/" + "x" * 6
    assert len(valid) == 255
    assert_linear(
        lambda path: validation.mount_path(path, "mount_path"),
        valid,
        {
            "huge": "/" + "a" * MESSAGE_BYTES,
            "slashes": "/" * 255,
            "dots": "/" + "../" * 84,
            "bad-last": "/" + "a" * 253 + "\n",
        },
    )


def test_page_tokens_are_linear() -> None:
    scope = "0123456789abcdef"
    valid = control_plane._encode_token(2**62, scope)

    def decode(token: str) -> int:
        return control_plane._decode_token(token, scope)

    nested = base64.urlsafe_b64encode(b"[" * 190).decode()
    assert_linear(
        decode,
        valid,
        {
            "huge": "A" * MESSAGE_BYTES,
            "nested": nested,
            "garbage": "!" * control_plane.MAX_PAGE_TOKEN_CHARS,
            "long-number": base64.urlsafe_b64encode(b'{"after": ' + b"9" * 180 + b', "scope": "x"}').decode(),
        },
    )


# -- labels, annotations, selectors, CIDRs, volumes: whole requests -------------------------------


def _create(**spec: Any) -> ws.CreateWorkspaceRequest:
    return ws.CreateWorkspaceRequest(metadata=wp.CommandMetadata(command_id="c" * 128), spec=wp.WorkspaceSpec(**spec))


# The largest valid spec: every bounded field at its bound.
VALID_SPEC: dict[str, Any] = {
    "labels": {f"{'a' * 59}{i:04d}": "v" * 63 for i in range(validation.MAX_LABELS)},
    "annotations": {f"note-{i}": "x" * 1000 for i in range(60)},
    "node_selector": {f"{'n' * 59}{i:04d}": "v" * 63 for i in range(32)},
    "network_policy": wp.NetworkPolicy(
        egress=wp.NETWORK_EGRESS_ALLOW_LISTED,
        allowed_cidrs=[f"2001:db8::{i:x}/128" for i in range(validation.MAX_CIDRS)],
    ),
}


def _many(count: int, key: str = "k") -> dict[str, str]:
    return {f"{key}{i}": "" for i in range(count)}


# ~4 MiB each: as much of one thing as a message holds.
WORST_SPECS: dict[str, dict[str, Any]] = {
    "labels": {"labels": _many(300_000)},
    "bad-last-label": {"labels": {**_many(63), "z" * 62 + "-": "v"}},
    "bad-last-value": {"labels": {**_many(63), "z": "v" * 62 + "-"}},
    "huge-label-key": {"labels": {"k" * MESSAGE_BYTES: "v"}},
    "annotations": {"annotations": _many(300_000)},
    "huge-annotation": {"annotations": {"a": "x" * MESSAGE_BYTES}},
    "node-selector": {"node_selector": _many(300_000)},
    "cidrs": {
        "network_policy": wp.NetworkPolicy(
            egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_cidrs=["10.0.0.0/8"] * 380_000
        )
    },
    "huge-cidr": {
        "network_policy": wp.NetworkPolicy(egress=wp.NETWORK_EGRESS_ALLOW_LISTED, allowed_cidrs=["1" * MESSAGE_BYTES])
    },
    "volumes": {"volumes": [wp.VolumeBinding(volume_id=f"vol-{i:020d}", mount_path=f"/m{i}") for i in range(100_000)]},
}


def test_create_and_set_labels_are_linear() -> None:
    valid = _create(**VALID_SPEC)
    worst = {name: _create(**spec) for name, spec in WORST_SPECS.items()}
    assert all(request.ByteSize() < MESSAGE_BYTES * 1.2 for request in worst.values())
    assert_linear(parse.create, valid, worst, rounds=3)

    def labels(spec: dict[str, Any]) -> ws.SetWorkspaceLabelsRequest:
        return ws.SetWorkspaceLabelsRequest(
            metadata=wp.CommandMetadata(command_id="c" * 128),
            workspace_id="ws-" + "0" * 20,
            labels=spec.get("labels", {}),
            annotations=spec.get("annotations", {}),
        )

    assert_linear(
        parse.set_labels,
        labels(VALID_SPEC),
        {name: labels(spec) for name, spec in WORST_SPECS.items() if set(spec) <= {"labels", "annotations"}},
        rounds=3,
    )


# -- Connect JSON bodies ------------------------------------------------------------------------


def test_connect_json_bodies_are_linear() -> None:
    """The codec's floor is JSON itself: a 4 MiB body of one string (json_format scans each
    string once). The worst: as many values as 4 MiB holds (json_format converts each in
    ~1-2.5 us, json.loads makes an object of each first), refused before they are parsed;
    and the most values allowed. (The largest body the data plane takes, a file's content
    in base64, costs less than the string.)"""
    codec = StrictJsonCodec()
    size = MESSAGE_BYTES - 64

    def decoder(message_class: type[Any]) -> Callable[[bytes], object]:
        return lambda body: codec.decode(body, message_class)

    one_string = json.dumps({"filter": "x" * (size - 20)}).encode()
    assert_linear(
        decoder(ws.ListWorkspacesRequest),
        one_string,
        {
            "empty-lists": b'{"filter": [' + b"[]," * (size // 3 - 10) + b"[]]}",
            "deep": b'{"filter": ' + b"[" * (size // 2 - 8) + b"]" * (size // 2 - 8) + b"}",
            "big-number": b'{"pageSize": "' + b"9" * (size - 20) + b'"}',
        },
        rounds=3,
    )
    one_annotation = json.dumps({"spec": {"annotations": {"a": "x" * (size - 40)}}}).encode()
    assert_linear(
        decoder(ws.CreateWorkspaceRequest),
        one_annotation,
        {
            "cidrs": json.dumps({"spec": {"networkPolicy": {"allowedCidrs": ["10.0.0.0/8"] * (size // 14)}}}).encode(),
            "annotations": json.dumps({"spec": {"annotations": _many(size // 12)}}).encode(),
            "at-the-limit": json.dumps({"spec": {"annotations": _many(MAX_JSON_VALUES - 10)}}).encode(),
        },
        rounds=3,
    )
    content = json.dumps({"path": "/data/f", "content": base64.b64encode(b"x" * (3 << 20)).decode()}).encode()
    assert cost(decoder(dp.WriteWorkspaceFileRequest), content, 3) < cost(
        decoder(ws.ListWorkspacesRequest), one_string, 3
    )


def test_the_measure_sees_a_quadratic_parser() -> None:
    """The measure itself: the split the filter parser had before issue 27 fails the bound."""

    def old_split(text: str) -> object:
        return re.split(r"\s+AND\s+", text.strip())

    with pytest.raises(AssertionError, match="over it"):
        assert_linear(old_split, VALID_FILTER, {"issue": WORST_FILTERS["issue"]})
