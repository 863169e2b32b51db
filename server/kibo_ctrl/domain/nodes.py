"""Nodes as the control plane records them: what a node declared when it joined, its lease,
and what an operator decided (cordon, drain). Records and rules only (the store keeps them,
engine/node_registry.py changes them)."""

from __future__ import annotations

import re

import msgspec

from .errors import InvalidArgument
from .model import Node

# Node IDs are names an operator types (and a node token is bound to): like tenant names.
NODE_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
LABEL_KEY = re.compile(r"[a-z0-9]([a-z0-9./-]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"[A-Za-z0-9._-]{0,63}")
MAX_LABELS = 32


class NodeRecord(msgspec.Struct):
    id: str
    vcpus: int
    memory_mib: int
    storage_pool: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    # What the node's runtime can do (GetCapabilities): as it declared at its last join.
    capabilities: list[str] = msgspec.field(default_factory=list)
    join_time: float = 0.0
    # Wall time until which the node is taken to be alive (renewed by the agent).
    lease_expiry: float = 0.0
    lease_seconds: float = 0.0
    # Which control-plane incarnation (its node registry's epoch) stored this lease: the one
    # that sees the node's renewals. Another replica (the leader) takes the stored lease as
    # the truth until it sees renewals itself.
    renewed_by: str = ""
    # Its lease ran out and its workspaces were made UNKNOWN (cleared when it renews).
    silent: bool = False
    # No new placements (an operator's kibo node cordon); draining implies cordoned.
    cordoned: bool = False
    draining: bool = False
    # Where the node serves its guests' data plane (NodeGuestService), and the secret it
    # takes there (made by the node for its last join); empty: no data plane (the simulator).
    data_plane_address: str = ""
    data_plane_token: str = ""

    def node(self) -> Node:
        return Node(self.id, self.vcpus, self.memory_mib, self.storage_pool)

    @property
    def ready(self) -> bool:
        """May take new instances: alive and not cordoned. Alive: not silent, which the node
        registry decides from the lease (with a grace after a control-plane start, so a
        node is not dropped for the time the control plane itself was down)."""
        return not self.silent and not self.cordoned


def node_id(value: str, field: str = "node_id") -> str:
    if not NODE_ID.fullmatch(value):
        raise InvalidArgument("a node ID is 1 to 63 lowercase letters, digits and '-'", field=field)
    return value


def labels(values: dict[str, str], field: str = "labels") -> dict[str, str]:
    if len(values) > MAX_LABELS:
        raise InvalidArgument(f"at most {MAX_LABELS} labels", field=field)
    for key, value in values.items():
        if not LABEL_KEY.fullmatch(key):
            raise InvalidArgument(f"label key {key[:80]!r}: lowercase letters, digits, '.', '/', '-'", field=field)
        if not LABEL_VALUE.fullmatch(value):
            raise InvalidArgument(f"label {key}: the value is up to 63 letters, digits, '.', '_', '-'", field=field)
    return dict(values)
