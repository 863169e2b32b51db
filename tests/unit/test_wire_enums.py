"""Every domain IntEnum has exactly the names and numbers of its wire enum.

Rendering casts domain enums to wire numbers (api/render.py), so a renamed,
renumbered, missing or extra value on either side would put a wrong value on the wire.
The wire's `*_UNSPECIFIED = 0` may be absent from a domain enum that never holds it
(errors.Reason, sim.Fault); when the domain enum has UNSPECIFIED, it must be 0.
"""

from __future__ import annotations

import inspect
from enum import IntEnum

import pytest
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.rpc import code_pb2
from kibo.ctrl.v1 import command_pb2, error_pb2, workspace_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs_pb2
from kibo.ctrl.v1 import volume_service_pb2 as vol_pb2
from kibo.sim.v1 import simulator_pb2 as sim_pb2
from kibo_ctrl.domain import model
from kibo_ctrl.domain.errors import Reason
from kibo_ctrl.runtime.sim.simulator import Fault

# domain enum -> (wire enum, prefix of its value names)
PAIRS: dict[type[IntEnum], tuple[EnumTypeWrapper, str]] = {
    model.WorkspaceState: (workspace_pb2.WorkspaceState, "WORKSPACE_STATE_"),
    model.ExpirationAction: (workspace_pb2.ExpirationAction, "EXPIRATION_ACTION_"),
    model.StopCause: (workspace_pb2.StopCause, "STOP_CAUSE_"),
    model.StopDurability: (workspace_pb2.StopDurability, "STOP_DURABILITY_"),
    model.NetworkEgress: (workspace_pb2.NetworkEgress, "NETWORK_EGRESS_"),
    model.ExposureAccess: (workspace_pb2.ExposureAccess, "EXPOSURE_ACCESS_"),
    model.CommandState: (command_pb2.CommandState, "COMMAND_STATE_"),
    model.CommandKind: (command_pb2.CommandKind, "COMMAND_KIND_"),
    model.Phase: (obs_pb2.InstancePhase, "INSTANCE_PHASE_"),
    model.Component: (obs_pb2.CleanupComponent, "CLEANUP_COMPONENT_"),
    model.ComponentStatus: (obs_pb2.ComponentStatus, "COMPONENT_STATUS_"),
    model.CleanupState: (obs_pb2.CleanupState, "CLEANUP_STATE_"),
    model.CleanupCompleteness: (obs_pb2.CleanupCompleteness, "CLEANUP_COMPLETENESS_"),
    model.CleanupSource: (obs_pb2.CleanupSource, "CLEANUP_SOURCE_"),
    model.EventType: (obs_pb2.EventType, "EVENT_TYPE_"),
    model.VolumeState: (vol_pb2.VolumeState, "VOLUME_STATE_"),
    Reason: (error_pb2.ErrorReason, "ERROR_REASON_"),
    Fault: (sim_pb2.Fault, "FAULT_"),
}

# IntEnums of the model that never go on the wire.
INTERNAL_ONLY: frozenset[type[IntEnum]] = frozenset({model.Desired})
# IntEnums holding a subset of google.rpc.Code (checked by test_error_codes_are_google_rpc_codes).
RPC_CODES: frozenset[type[IntEnum]] = frozenset({model.ErrorCode})


def _domain(enum: type[IntEnum]) -> dict[str, int]:
    return {member.name: int(member.value) for member in enum}


def _wire(wire: EnumTypeWrapper, prefix: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for name, number in wire.items():
        assert name.startswith(prefix), f"{wire.DESCRIPTOR.full_name}: {name} lacks the prefix {prefix}"
        values[name.removeprefix(prefix)] = int(number)
    return values


@pytest.mark.parametrize("enum", list(PAIRS), ids=lambda e: e.__name__)
def test_domain_enum_equals_wire_enum(enum: type[IntEnum]) -> None:
    wire, prefix = PAIRS[enum]
    domain, on_wire = _domain(enum), _wire(wire, prefix)
    assert on_wire.get("UNSPECIFIED") == 0, f"{wire.DESCRIPTOR.full_name} has no UNSPECIFIED = 0"
    if "UNSPECIFIED" in domain:
        assert domain["UNSPECIFIED"] == 0
    else:
        on_wire.pop("UNSPECIFIED")
    assert domain == on_wire, f"{enum.__name__} differs from {wire.DESCRIPTOR.full_name}"


def test_every_model_int_enum_is_paired_or_declared_internal() -> None:
    found = {
        value
        for _, value in inspect.getmembers(model, inspect.isclass)
        if issubclass(value, IntEnum) and value is not IntEnum and value.__module__ == model.__name__
    }
    unpaired = found - set(PAIRS) - INTERNAL_ONLY - RPC_CODES
    assert not unpaired, f"model IntEnums with no wire enum check: {sorted(e.__name__ for e in unpaired)}"
    assert found >= INTERNAL_ONLY | RPC_CODES


def test_error_codes_are_google_rpc_codes() -> None:
    """model.ErrorCode is a subset of google.rpc.Code, with the same names and numbers."""
    for member in model.ErrorCode:
        assert code_pb2.Code.Value(member.name) == member.value, member
    # The contract: a superseded or cancelled command ends with error.code CANCELLED (1).
    assert int(model.ErrorCode.CANCELLED) == code_pb2.CANCELLED == 1
