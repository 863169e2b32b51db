"""Checks of request values that need no store: command IDs, labels, resources, filters.

Every check costs time linear in its input, whatever the input (issue 27, item 3): lengths
and counts are checked before anything reads the values; patterns are character classes
under `fullmatch`, on values whose length is bounded first, never a split or search whose
quantifiers can try each position again (the filter's old `\\s+AND\\s+` split spent 13 ms on
4 KiB of spaces here, 470 times a valid 32-term filter; ~130 ms in the issue); the filter is
read token by token. An error message quotes at most QUOTE_CHARS of a value (`quote`): a
message quoting a whole 4 KiB value made gRPC's status metadata overflow its 8 KiB limit."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import domains
from .errors import InvalidArgument, ReservedCommandId
from .model import NetworkEgress, NetworkPolicy, Resources, WorkspaceState
from .rules import RESERVED_PREFIXES

COMMAND_ID = re.compile(r"[A-Za-z0-9._~:/-]{1,128}")
MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,254}")
# Labels and annotation keys follow Kubernetes' syntax (an optional DNS-subdomain prefix and
# "/", then a name; values of at most 63 letters, digits, '-', '_', '.', alphanumeric at both
# ends), kept stricter where kibo always was: lowercase keys of at most 63 characters in all.
# No control character, space or quote can reach a label, so a terminal or a log line shows
# labels as they are; annotations hold any UTF-8 (the CLI and the logs escape what they show).
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 63
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[a-z0-9]([-a-z0-9_.]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
MAX_LABELS = 64
MAX_ANNOTATIONS_BYTES = 64 * 1024
# A network policy's CIDRs (each is parsed by ipaddress, ~3 us: 280,000 of them in one 4 MiB
# request held the event loop for 1.2 s, and were stored).
MAX_CIDRS = 256
# Domain rules and ports in one network policy, each list.
MAX_POLICY_ENTRIES = 64
# The volumes a create binds (each is looked up in the store, in the create's transaction).
MAX_VOLUMES = 32
# How much of a request's value an error message quotes.
QUOTE_CHARS = 64

# (minimum, maximum) of each resource; 0 in a request means the default.
LIMITS: dict[str, tuple[int, int]] = {
    "vcpus": (1, 64),
    "memory_mib": (16, 262_144),
    "writable_layer_gib": (1, 1024),
}
DEFAULT_RESOURCES = Resources(vcpus=2, memory_mib=2048, writable_layer_gib=10)
DEFAULT_DATA_VOLUME_GIB = 10
MAX_VOLUME_GIB = 16_384


def quote(value: str, limit: int = QUOTE_CHARS) -> str:
    """A request's value as an error message shows it: its first `limit` characters, escaped
    as Python literals are (so a control character cannot reach a terminal or a log line as
    itself), and "…" when there is more."""
    return repr(value[:limit]) + ("…" if len(value) > limit else "")


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


def is_label_key(key: str) -> bool:
    """`[prefix/]name`: prefix a DNS subdomain, name as Kubernetes allows, all lowercase and
    at most MAX_LABEL_KEY characters (checked first: nothing longer is read)."""
    if not 0 < len(key) <= MAX_LABEL_KEY:
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not all(_DNS_LABEL.fullmatch(part) for part in prefix.split(".")):
        return False
    return _LABEL_NAME.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    return value == "" or (len(value) <= MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(value) is not None)


def label_map(values: Mapping[str, str], field: str) -> dict[str, str]:
    if len(values) > MAX_LABELS:
        raise InvalidArgument(f"at most {MAX_LABELS} {field}", field=field)
    for key, value in values.items():
        if not is_label_key(key):
            raise InvalidArgument(
                f"{field} key {quote(key)}: an optional DNS-name prefix and '/', then at most 63 lowercase "
                "letters, digits, '-', '_' or '.', beginning and ending with a letter or digit",
                field=field,
            )
        if not is_label_value(value):
            raise InvalidArgument(
                f"{field} value of {key!r}: empty, or at most {MAX_LABEL_VALUE} letters, digits, '-', '_' "
                "or '.', beginning and ending with a letter or digit",
                field=field,
            )
    return dict(values)


def annotation_map(values: Mapping[str, str]) -> dict[str, str]:
    """Keys as label keys; values any UTF-8, at most MAX_ANNOTATIONS_BYTES in all (keys
    included). Every key takes a byte at least, so a longer map is refused before it is read."""
    too_large = InvalidArgument("annotations are over 64 KiB in total", field="annotations")
    if len(values) > MAX_ANNOTATIONS_BYTES:
        raise too_large
    total = 0
    for key, value in values.items():
        if not is_label_key(key):
            raise InvalidArgument(f"annotation key {quote(key)} is not valid (as a label key)", field="annotations")
        # A character is a byte at least: a value over the bound in characters is not encoded.
        total += len(key) + (len(value) if len(value) > MAX_ANNOTATIONS_BYTES else len(value.encode()))
        if total > MAX_ANNOTATIONS_BYTES:
            raise too_large
    return dict(values)


def network_policy(policy: Any, field: str = "network_policy") -> NetworkPolicy:
    """A NetworkPolicy message's fields checked (egress, CIDRs, domains, ports), each list
    bounded before it is read."""
    egress = int(policy.egress)
    try:
        mode = NetworkEgress(egress) if egress else NetworkEgress.ALLOW_ALL
    except ValueError:
        raise InvalidArgument(f"unknown egress value {egress}", field=f"{field}.egress") from None
    lists = {
        "allowed_cidrs": policy.allowed_cidrs,
        "denied_cidrs": policy.denied_cidrs,
        "allowed_domains": policy.allowed_domains,
        "denied_domains": policy.denied_domains,
        "allowed_ports": policy.allowed_ports,
    }
    for name, values in lists.items():
        bound = MAX_CIDRS if name.endswith("cidrs") else MAX_POLICY_ENTRIES
        if len(values) > bound:
            raise InvalidArgument(f"at most {bound} {name}", field=f"{field}.{name}")
        if not values:
            continue
        if name.startswith("allowed") and mode is not NetworkEgress.ALLOW_LISTED:
            raise InvalidArgument(f"{name} needs NETWORK_EGRESS_ALLOW_LISTED", field=f"{field}.{name}")
        if name.startswith("denied") and mode is NetworkEgress.DENY_ALL:
            raise InvalidArgument(
                f"{name} needs NETWORK_EGRESS_ALLOW_ALL or _ALLOW_LISTED (DENY_ALL denies everything)",
                field=f"{field}.{name}",
            )
    for name in ("allowed_cidrs", "denied_cidrs"):
        for cidr in lists[name]:
            if not _is_network(cidr):
                raise InvalidArgument(f"{quote(cidr)} is not a CIDR", field=f"{field}.{name}")
    rules: dict[str, list[str]] = {}
    for name in ("allowed_domains", "denied_domains"):
        rules[name] = []
        for text in lists[name]:
            try:
                rules[name].append(domains.normalize_rule(text[: domains.MAX_RULE_CHARS + 1]))
            except ValueError as error:
                raise InvalidArgument(f"{quote(text)}: {error}", field=f"{field}.{name}") from None
    for port in lists["allowed_ports"]:
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"port {port} is not 1..65535", field=f"{field}.allowed_ports")
    return NetworkPolicy(
        egress=mode,
        allowed_cidrs=list(policy.allowed_cidrs),
        denied_cidrs=list(policy.denied_cidrs),
        allowed_domains=list(dict.fromkeys(rules["allowed_domains"])),
        denied_domains=list(dict.fromkeys(rules["denied_domains"])),
        allowed_ports=sorted(set(policy.allowed_ports)),
    )


def _is_network(cidr: str) -> bool:
    # The longest CIDR ("ffff:...:255.255.255.255/128") has 49 characters: no longer one is parsed.
    if len(cidr) > QUOTE_CHARS:
        return False
    try:
        ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False
    return True


def mount_path(value: str, field: str) -> str:
    if not MOUNT_PATH.fullmatch(value) or "//" in value or "/../" in f"{value}/" or value.endswith("/"):
        raise InvalidArgument(f"mount path {quote(value)} must be an absolute, normalized path", field=field)
    return value


def page_size(value: int, default: int, field: str = "page_size") -> int:
    if value < 0 or value > 1000:
        raise InvalidArgument("page_size must be between 0 and 1000", field=field)
    return value or default


@dataclass(frozen=True)
class Filter:
    states: tuple[tuple[WorkspaceState, bool], ...] = ()
    labels: tuple[tuple[str, str, bool], ...] = ()


# What one filter may cost. Each term is evaluated on every stored workspace a list scans
# (a label term parses the workspace's JSON), so the terms bound the work of a page; no
# real filter needs more (a workspace has at most MAX_LABELS labels and one state).
MAX_FILTER_CHARS = 4096
MAX_FILTER_TERMS = 32

# The filter's tokens. Each alternative is one character class or a fixed string, so a token
# is matched in time linear in its length and the scan never goes back over text it has
# passed: the filter is read once, whatever it holds.
_TOKEN = re.compile(r'(?P<space>\s+)|(?P<quoted>"[^"]*")|(?P<op>!=|=)|(?P<word>[A-Za-z0-9_./:-]+)')
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELD_PATH = re.compile(r"[A-Za-z0-9_./-]+")
_USAGE = 'use state = X, labels.KEY = "v", != and AND'


@dataclass(frozen=True)
class _Token:
    kind: str  # quoted, op, word; "end" after the last one
    text: str
    start: int  # where it begins in the filter
    spaced: bool  # space comes before it


class _Tokens:
    """The filter's tokens without the spaces, read front to back as the parser asks for them
    (a filter that is wrong early is not read further); the end repeats."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0
        self.ahead: list[_Token] = []

    def _scan(self) -> _Token:
        spaced = False
        while self.position < len(self.text):
            match = _TOKEN.match(self.text, self.position)
            if match is None:
                what = "an unterminated quote" if self.text[self.position] == '"' else repr(self.text[self.position])
                raise self.error(self.position, "cannot parse the filter at", f" ({what})")
            start, self.position = self.position, match.end()
            if match.lastgroup != "space":
                assert match.lastgroup is not None
                return _Token(match.lastgroup, match.group(), start, spaced)
            spaced = True
        return _Token("end", "", len(self.text), spaced)

    def peek(self) -> _Token:
        if not self.ahead:
            self.ahead.append(self._scan())
        return self.ahead[0]

    def take(self) -> _Token:
        token = self.peek()
        if token.kind != "end":
            self.ahead.pop()
        return token

    def error(self, position: int, before: str, after: str = "") -> InvalidArgument:
        """The words `before` a short quote of the filter from `position` on, and `after` it."""
        return InvalidArgument(f"{before} {quote(self.text[position:])}{after}; {_USAGE}", field="filter")


def workspace_filter(text: str) -> Filter:
    """Parse the AIP-160 subset: `state`, `labels.KEY` (or `labels."KEY"`), `=`, `!=`, and
    `AND` between spaces. Time linear in the filter's length (see _TOKEN), at most
    MAX_FILTER_CHARS characters and MAX_FILTER_TERMS terms."""
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidArgument(
            f"the filter is {len(text)} characters; at most {MAX_FILTER_CHARS} are allowed", field="filter"
        )
    tokens = _Tokens(text)
    states: list[tuple[WorkspaceState, bool]] = []
    label_terms: list[tuple[str, str, bool]] = []
    if tokens.peek().kind == "end":
        return Filter()
    while True:
        if len(states) + len(label_terms) == MAX_FILTER_TERMS:
            raise InvalidArgument(f"the filter has over {MAX_FILTER_TERMS} terms, the most allowed", field="filter")
        start = tokens.peek().start
        name = _field(tokens)
        operator, value = tokens.take(), tokens.take()
        if operator.kind != "op" or value.kind not in ("word", "quoted"):
            raise tokens.error(start, "cannot parse filter term")
        literal = value.text[1:-1] if value.kind == "quoted" else value.text
        _add_term(name, literal, operator.text == "=", states, label_terms)
        joint = tokens.take()
        if joint.kind == "end":
            return Filter(states=tuple(states), labels=tuple(label_terms))
        if not (joint.spaced and joint.text == "AND" and tokens.peek().spaced and tokens.peek().kind != "end"):
            raise tokens.error(joint.start, "expected AND between spaces at")


def _field(tokens: _Tokens) -> str:
    """`state`, `labels.KEY` or `labels."KEY"` (no space inside)."""
    token = tokens.take()
    ident, dot, path = token.text.partition(".")
    if token.kind == "word" and _IDENT.fullmatch(ident):
        after = tokens.peek()
        if dot and not path and after.kind == "quoted" and not after.spaced:
            return token.text + tokens.take().text
        if not dot or _FIELD_PATH.fullmatch(path):
            return token.text
    raise tokens.error(token.start, "cannot parse filter term")


def _add_term(
    name: str,
    value: str,
    equal: bool,
    states: list[tuple[WorkspaceState, bool]],
    label_terms: list[tuple[str, str, bool]],
) -> None:
    if name == "state":
        key = value.upper().removeprefix("WORKSPACE_STATE_")
        if key not in WorkspaceState.__members__ or key == "UNSPECIFIED":
            raise InvalidArgument(f"unknown state {quote(value)} in filter", field="filter")
        states.append((WorkspaceState[key], equal))
    elif name.startswith("labels."):
        label_terms.append((name.removeprefix("labels.").strip('"'), value, equal))
    else:
        raise InvalidArgument(f"cannot filter on {quote(name)}; use state or labels.KEY", field="filter")
