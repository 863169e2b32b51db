"""Checks of request values that need no store: command IDs, labels, resources, filters."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from .errors import InvalidArgument, ReservedCommandId
from .model import NetworkEgress, NetworkPolicy, Resources, WorkspaceState
from .rules import RESERVED_PREFIXES

COMMAND_ID = re.compile(r"[A-Za-z0-9._~:/-]{1,128}")
LABEL_KEY = re.compile(r"[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?")
MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,254}")
MAX_LABELS = 64
MAX_LABEL_VALUE = 256
MAX_ANNOTATIONS_BYTES = 64 * 1024

# (minimum, maximum) of each resource; 0 in a request means the default.
LIMITS: dict[str, tuple[int, int]] = {
    "vcpus": (1, 64),
    "memory_mib": (16, 262_144),
    "writable_layer_gib": (1, 1024),
}
DEFAULT_RESOURCES = Resources(vcpus=2, memory_mib=2048, writable_layer_gib=10)
DEFAULT_DATA_VOLUME_GIB = 10
MAX_VOLUME_GIB = 16_384


def command_id(value: str, field: str = "metadata.command_id", *, reserved_ok: bool = False) -> str:
    """Check a caller's command ID. `reserved_ok` defers the reserved-prefix check, which
    must come after every other field's check (the error table's first row wins)."""
    if not value:
        raise InvalidArgument("a command ID is required", field=field)
    if not COMMAND_ID.fullmatch(value):
        raise InvalidArgument("a command ID is 1 to 128 characters from A-Z a-z 0-9 . _ ~ : / -", field=field)
    if not reserved_ok and value.startswith(RESERVED_PREFIXES):
        raise ReservedCommandId(
            f"command IDs beginning with {' or '.join(RESERVED_PREFIXES)} are reserved for the server",
            field=field,
        )
    return value


def resource_id(value: str, field: str, prefix: str) -> str:
    if not value:
        raise InvalidArgument(f"{field} is required", field=field)
    if len(value) > 128 or not value.startswith(prefix) or not COMMAND_ID.fullmatch(value):
        raise InvalidArgument(f"{field} is not a valid ID (they look like {prefix}...)", field=field)
    return value


def resources(vcpus: int, memory_mib: int, writable_layer_gib: int, base: Resources) -> Resources:
    """Apply requested values (0 keeps `base`) and check each is within LIMITS."""
    values = {"vcpus": vcpus, "memory_mib": memory_mib, "writable_layer_gib": writable_layer_gib}
    merged = {}
    for name, value in values.items():
        low, high = LIMITS[name]
        if value == 0:
            merged[name] = getattr(base, name)
        elif not low <= value <= high:
            raise InvalidArgument(f"{name} must be between {low} and {high}", field=f"resources.{name}")
        else:
            merged[name] = value
    return Resources(**merged)


def label_map(values: dict[str, str], field: str) -> dict[str, str]:
    if len(values) > MAX_LABELS:
        raise InvalidArgument(f"at most {MAX_LABELS} {field}", field=field)
    for key, value in values.items():
        if not LABEL_KEY.fullmatch(key):
            raise InvalidArgument(
                f"{field} key {key!r} must be 1 to 63 lowercase letters, digits, '.', '_', '/' or '-'",
                field=field,
            )
        if len(value) > MAX_LABEL_VALUE:
            raise InvalidArgument(f"{field} value of {key!r} is over {MAX_LABEL_VALUE} characters", field=field)
    return dict(values)


def annotation_map(values: dict[str, str]) -> dict[str, str]:
    for key in values:
        if not LABEL_KEY.fullmatch(key):
            raise InvalidArgument(f"annotation key {key!r} is not valid", field="annotations")
    if sum(len(k) + len(v) for k, v in values.items()) > MAX_ANNOTATIONS_BYTES:
        raise InvalidArgument("annotations are over 64 KiB in total", field="annotations")
    return dict(values)


def network_policy(egress: int, cidrs: list[str], field: str = "network_policy") -> NetworkPolicy:
    try:
        mode = NetworkEgress(egress) if egress else NetworkEgress.ALLOW_ALL
    except ValueError:
        raise InvalidArgument(f"unknown egress value {egress}", field=f"{field}.egress") from None
    if cidrs and mode is not NetworkEgress.ALLOW_LISTED:
        raise InvalidArgument("allowed_cidrs needs NETWORK_EGRESS_ALLOW_LISTED", field=f"{field}.allowed_cidrs")
    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise InvalidArgument(f"{cidr!r} is not a CIDR", field=f"{field}.allowed_cidrs") from None
    return NetworkPolicy(egress=mode, allowed_cidrs=list(cidrs))


def mount_path(value: str, field: str) -> str:
    if not MOUNT_PATH.fullmatch(value) or "//" in value or "/../" in f"{value}/" or value.endswith("/"):
        raise InvalidArgument(f"mount path {value!r} must be an absolute, normalized path", field=field)
    return value


def page_size(value: int, default: int, field: str = "page_size") -> int:
    if value < 0 or value > 1000:
        raise InvalidArgument("page_size must be between 0 and 1000", field=field)
    return value or default


@dataclass(frozen=True)
class Filter:
    states: tuple[tuple[WorkspaceState, bool], ...] = ()
    labels: tuple[tuple[str, str, bool], ...] = ()


_TERM = re.compile(
    r"\s*(?P<field>[A-Za-z_][A-Za-z0-9_]*(?:\.(?:[A-Za-z0-9_./-]+|\"[^\"]*\"))?)\s*"
    r"(?P<op>!=|=)\s*(?P<value>\"[^\"]*\"|[A-Za-z0-9_./:-]+)\s*"
)


# What one filter may cost. Each term is evaluated on every stored workspace a list scans
# (a label term parses the workspace's JSON), so the terms bound the work of a page; no
# real filter needs more (a workspace has at most MAX_LABELS labels and one state).
MAX_FILTER_CHARS = 4096
MAX_FILTER_TERMS = 32


def workspace_filter(text: str) -> Filter:
    """Parse the AIP-160 subset: `state`, `labels.KEY`, `=`, `!=`, `AND`."""
    if not text.strip():
        return Filter()
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidArgument(
            f"the filter is {len(text)} characters; at most {MAX_FILTER_CHARS} are allowed", field="filter"
        )
    parts = re.split(r"\s+AND\s+", text.strip())
    if len(parts) > MAX_FILTER_TERMS:
        raise InvalidArgument(
            f"the filter has {len(parts)} terms; at most {MAX_FILTER_TERMS} are allowed", field="filter"
        )
    states: list[tuple[WorkspaceState, bool]] = []
    label_terms: list[tuple[str, str, bool]] = []
    for part in parts:
        match = _TERM.fullmatch(part)
        if match is None:
            raise InvalidArgument(
                f'cannot parse filter term {part!r}; use state = X, labels.KEY = "v", != and AND',
                field="filter",
            )
        name, value = match["field"], match["value"].strip('"')
        equal = match["op"] == "="
        if name == "state":
            key = value.upper().removeprefix("WORKSPACE_STATE_")
            if key not in WorkspaceState.__members__ or key == "UNSPECIFIED":
                raise InvalidArgument(f"unknown state {value!r} in filter", field="filter")
            states.append((WorkspaceState[key], equal))
        elif name.startswith("labels."):
            label_terms.append((name.removeprefix("labels.").strip('"'), value, equal))
        else:
            raise InvalidArgument(f"cannot filter on {name!r}; use state or labels.KEY", field="filter")
    return Filter(states=tuple(states), labels=tuple(label_terms))
