"""Hypothesis strategies for any request message, derived from its descriptor.

Well-formed requests on real workspaces and volumes, the same with one field replaced by a
generated value, and wholly generated messages: strings (unicode, empty, huge), numbers
(negative, huge), unknown enum numbers, nested messages and maps."""

from __future__ import annotations

import time
from typing import Any, Protocol

from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import strategies as st
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_pb2 as wp
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.sim.v1 import simulator_pb2 as sim

UNKNOWN_WS = "ws-00000000000000000000"
UNKNOWN_VOL = "vol-00000000000000000000"


def message_type(field: FieldDescriptor) -> Descriptor:
    assert field.message_type is not None
    return field.message_type


def is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(message_type(field).GetOptions().map_entry)


class RealIds(Protocol):
    """IDs that exist on the server under test, so requests reach the rules."""

    workspace_ids: list[str]
    volume_ids: list[str]


#
# Strategies built from the message descriptors. Each value is "mostly well formed, sometimes
# anything", so a generated request often passes validation and reaches the domain (state
# rules, idempotency, real workspaces) instead of stopping at the first malformed field.


def mostly(good: st.SearchStrategy[Any], anything: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, good, good, anything)


VALID_ID = st.from_regex(r"[A-Za-z0-9._~:/-]{1,128}", fullmatch=True)
# Repeated across examples: later requests resend or reuse earlier ones.
SHARED_IDS = st.sampled_from(["dup/1", "dup/2", "dup/3"])
ANY_INT32 = st.one_of(st.integers(-3, 1100), st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 2**31 - 1]))
ANY_INT64 = st.one_of(ANY_INT32, st.integers(-(2**63), 2**63 - 1), st.sampled_from([-(2**63), 2**63 - 1]))
INT32 = mostly(st.one_of(st.integers(0, 64), st.sampled_from([128, 1024, 2048, 1000])), ANY_INT32)
INT64 = mostly(st.integers(0, 4), ANY_INT64)
TEXT = st.one_of(
    st.just(""),
    st.text(max_size=24),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=100, max_size=300),
    st.sampled_from(["ws-", "vol-", "\x00", "é", "💥", "a b", "/", "..", "ws-" + "a" * 200]),
)
LABEL_KEYS = mostly(
    st.sampled_from(["team", "a", "x.y/z", "run-1"]), st.one_of(TEXT, st.sampled_from(["A", "-a", "a" * 64]))
)
LABEL_VALUES = mostly(st.sampled_from(["a", "b", ""]), TEXT)


def timestamps() -> st.SearchStrategy[Timestamp]:
    now = int(time.time())
    # In the future, but not so near that an expiration fires during the test.
    future = st.integers(now + 86_400, now + 10 * 365 * 86_400)
    seconds = mostly(
        future,
        st.one_of(
            ANY_INT64,
            st.integers(-100, 100),
            st.integers(253402300799 - 2, 253402300799 + 2),  # around the largest valid Timestamp
        ),
    )
    nanos = mostly(st.integers(0, 999_999_999), st.one_of(ANY_INT32, st.integers(999_999_998, 1_000_000_001)))
    return st.builds(Timestamp, seconds=seconds, nanos=nanos)


def string_strategy(field: FieldDescriptor, real: dict[str, list[str]]) -> st.SearchStrategy[Any]:
    if field.name == "command_id":
        bad = st.one_of(TEXT, st.just("a" * 129), st.sampled_from(["guest-shutdown/x", "host-memory/x"]))
        return mostly(st.one_of(VALID_ID, SHARED_IDS), bad)
    if field.name in ("workspace_id", "volume_id"):
        unknown = st.sampled_from([UNKNOWN_WS, UNKNOWN_VOL])
        return mostly(st.sampled_from(real[field.name]), st.one_of(TEXT, unknown)) if real else st.one_of(TEXT, unknown)
    if field.name == "filter":
        good = st.sampled_from(["", "state = AVAILABLE", 'labels.team = "a" AND state != STOPPED', "state != DELETED"])
        return mostly(good, st.one_of(TEXT, st.sampled_from(["state = X", "x = 1", "state = AVAILABLE OR"])))
    if field.name == "mount_path":
        return mostly(
            st.sampled_from(["/mnt/x", "/srv/y"]), st.one_of(TEXT, st.sampled_from(["/data", "/a/../b", "//x"]))
        )
    if field.name == "allowed_cidrs":
        return mostly(st.sampled_from(["10.0.0.0/8", "::1/128"]), st.one_of(TEXT, st.sampled_from(["300.0.0.0/8"])))
    return mostly(st.sampled_from(["", "a"]), TEXT)


def field_strategy(field: FieldDescriptor, real: dict[str, list[str]], depth: int) -> st.SearchStrategy[Any]:
    if is_map(field):
        key, value = message_type(field).fields_by_name["key"], message_type(field).fields_by_name["value"]
        keys = LABEL_KEYS if key.type == FieldDescriptor.TYPE_STRING else single(key, real, depth)
        values = LABEL_VALUES if value.type == FieldDescriptor.TYPE_STRING else single(value, real, depth)
        return st.dictionaries(keys, values, max_size=4)
    if field.is_repeated:
        return st.lists(single(field, real, depth), max_size=3)
    return single(field, real, depth)


def single(field: FieldDescriptor, real: dict[str, list[str]], depth: int) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return message_strategy(message_type(field), real, depth + 1)
    if kind == FieldDescriptor.TYPE_STRING:
        return string_strategy(field, real)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        known = st.sampled_from([v.number for v in field.enum_type.values])
        return mostly(known, st.one_of(st.integers(-5, 1000), st.sampled_from([-(2**31), 2**31 - 1])))
    if kind in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return INT32
    if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return INT64
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=32 if kind == FieldDescriptor.TYPE_FLOAT else 64)
    raise AssertionError(f"no strategy for {field.full_name}")


def message_strategy(descriptor: Descriptor, real: dict[str, list[str]], depth: int = 0) -> st.SearchStrategy[Any]:
    cls = GetMessageClass(descriptor)
    if descriptor.full_name == "google.protobuf.Timestamp":
        return timestamps()
    if depth > 3:
        return st.just(cls())
    # Every field is drawn (the "anything" side includes the zero values that absence means).
    fields = {f.name: field_strategy(f, real, depth) for f in descriptor.fields}
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


def well_formed(method: MethodDescriptor, ids: RealIds) -> st.SearchStrategy[Any]:
    """Requests that pass validation (on real workspaces and volumes): they reach the domain."""
    # Per method, so most are new commands here (SHARED_IDS are resent or reused on purpose).
    fresh = VALID_ID.map(lambda c: f"{method.name}/{c}"[:128])
    cmd = st.one_of(fresh, fresh, SHARED_IDS).map(lambda c: wp.CommandMetadata(command_id=c))
    wsid = st.sampled_from(ids.workspace_ids)
    volid = st.sampled_from(ids.volume_ids)
    revision = st.integers(0, 3)
    future = timestamps().map(lambda t: Timestamp(seconds=max(t.seconds, int(time.time()) + 86_400)))
    action = st.sampled_from([wp.EXPIRATION_ACTION_STOP, wp.EXPIRATION_ACTION_DELETE])
    labels = st.dictionaries(st.sampled_from(["team", "a", "x.y/z"]), st.sampled_from(["a", "b", ""]), max_size=3)
    resources = st.builds(
        wp.Resources,
        vcpus=st.integers(0, 64),
        memory_mib=st.sampled_from([0, 128, 4096]),
        writable_layer_gib=st.integers(0, 20),
    )
    policy = st.one_of(
        st.builds(wp.NetworkPolicy, egress=st.sampled_from([0, 1, 2])),
        st.builds(
            wp.NetworkPolicy,
            egress=st.just(wp.NETWORK_EGRESS_ALLOW_LISTED),
            allowed_cidrs=st.lists(st.sampled_from(["10.0.0.0/8", "::1/128"]), max_size=2),
        ),
    )
    binding = st.builds(
        wp.VolumeBinding,
        volume_id=volid,
        mount_path=st.sampled_from(["/mnt/x", "/srv/y"]),
        delete_with_workspace=st.booleans(),
    )
    spec = st.builds(
        wp.WorkspaceSpec,
        resources=resources,
        labels=labels,
        volumes=st.lists(binding, max_size=1),
        network_policy=policy,
    )
    bases: dict[str, st.SearchStrategy[Any]] = {
        "CreateWorkspace": st.builds(ws.CreateWorkspaceRequest, metadata=cmd, spec=spec),
        "GetWorkspace": st.builds(ws.GetWorkspaceRequest, workspace_id=wsid),
        "ListWorkspaces": st.builds(
            ws.ListWorkspacesRequest,
            page_size=st.integers(0, 1000),
            include_deleted=st.booleans(),
            filter=st.sampled_from(["", "state = AVAILABLE", 'labels.team = "a" AND state != STOPPED']),
        ),
        "StopWorkspace": st.builds(
            ws.StopWorkspaceRequest,
            metadata=cmd,
            workspace_id=wsid,
            expected_expiration_revision=revision,
            mode=st.sampled_from([0, 1, 2]),
        ),
        "StartWorkspace": st.builds(
            ws.StartWorkspaceRequest, metadata=cmd, workspace_id=wsid, expected_expiration_revision=revision
        ),
        "DeleteWorkspace": st.builds(
            ws.DeleteWorkspaceRequest, metadata=cmd, workspace_id=wsid, expected_expiration_revision=revision
        ),
        "GetWorkspaceCommand": st.builds(ws.GetWorkspaceCommandRequest, command_id=st.one_of(VALID_ID, SHARED_IDS)),
        "WatchWorkspace": st.builds(ws.WatchWorkspaceRequest, workspace_id=wsid),
        "GetCapabilities": st.just(ws.GetCapabilitiesRequest()),
        "SetWorkspaceExpiration": st.builds(
            ws.SetWorkspaceExpirationRequest,
            metadata=cmd,
            workspace_id=wsid,
            expected_expiration_revision=revision,
            expire_time=future,
            action=action,
        ),
        "ClearWorkspaceExpiration": st.builds(
            ws.ClearWorkspaceExpirationRequest, metadata=cmd, workspace_id=wsid, expected_expiration_revision=revision
        ),
        "SetWorkspaceLabels": st.builds(
            ws.SetWorkspaceLabelsRequest, metadata=cmd, workspace_id=wsid, labels=labels, annotations=labels
        ),
        "ResizeWorkspace": st.builds(ws.ResizeWorkspaceRequest, metadata=cmd, workspace_id=wsid, resources=resources),
        "SetWorkspaceNetworkPolicy": st.builds(
            ws.SetWorkspaceNetworkPolicyRequest, metadata=cmd, workspace_id=wsid, network_policy=policy
        ),
        "BindWorkspaceVolume": st.builds(
            ws.BindWorkspaceVolumeRequest, metadata=cmd, workspace_id=wsid, binding=binding
        ),
        "UnbindWorkspaceVolume": st.builds(
            ws.UnbindWorkspaceVolumeRequest, metadata=cmd, workspace_id=wsid, volume_id=volid
        ),
        "RevokeWorkspaceDataPlaneAccess": st.builds(
            ws.RevokeWorkspaceDataPlaneAccessRequest, metadata=cmd, workspace_id=wsid
        ),
        "GetWorkspaceCleanup": st.builds(obs.GetWorkspaceCleanupRequest, workspace_id=wsid),
        "ListWorkspaceEvents": st.builds(
            obs.ListWorkspaceEventsRequest, workspace_id=wsid, page_size=st.integers(0, 1000)
        ),
        "ListWorkspaceInstances": st.builds(obs.ListWorkspaceInstancesRequest, workspace_id=wsid),
        "CreateVolume": st.builds(vol.CreateVolumeRequest, metadata=cmd, capacity_gib=st.integers(0, 100)),
        "GetVolume": st.builds(vol.GetVolumeRequest, volume_id=volid),
        "DeleteVolume": st.builds(vol.DeleteVolumeRequest, metadata=cmd, volume_id=volid),
        # Faults for "the next workspace created" only (see generated()).
        "InjectFault": st.builds(
            sim.InjectFaultRequest,
            fault=st.sampled_from([sim.FAULT_STALL, sim.FAULT_CREATE_FAIL, sim.FAULT_CREATE_FAIL_HOLDING]),
        ),
    }
    # An RPC added later still gets generated messages, just not well-formed ones.
    return bases.get(method.name, message_strategy(method.input_type, {}))


def mutated(base: st.SearchStrategy[Any], descriptor: Descriptor, real: dict[str, list[str]]) -> st.SearchStrategy[Any]:
    """A well-formed request with one field replaced by a generated value."""
    if not descriptor.fields:
        return base
    replacement = st.sampled_from(list(descriptor.fields)).flatmap(
        lambda f: field_strategy(f, real, 0).map(lambda value: (f.name, value))
    )

    def apply(request: Message, change: tuple[str, Any]) -> Message:
        name, value = change
        changed = type(request)()
        changed.CopyFrom(request)
        changed.ClearField(name)
        changed.MergeFrom(type(request)(**{name: value}))
        return changed

    return st.tuples(base, replacement).map(lambda pair: apply(*pair))


def generated(method: MethodDescriptor, ids: RealIds) -> st.SearchStrategy[Any]:
    real: dict[str, list[str]] = {}
    if method.containing_service.name != "SimulatorService":
        # Faults aimed at real workspaces (a silent node...) would make the server busy for good.
        real = {"workspace_id": ids.workspace_ids, "volume_id": ids.volume_ids}
    base = well_formed(method, ids)
    return st.one_of(base, mutated(base, method.input_type, real), message_strategy(method.input_type, real))
