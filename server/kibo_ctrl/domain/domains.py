"""Domain rules of a network policy: `allowed_domains` and `denied_domains`.

A rule is an exact name (`api.github.com`) or a wildcard (`*.pypi.org`: any name under
pypi.org, at any depth, never pypi.org itself). Rules are checked and put in one canonical
form here, once, by the API's validation and by the node's resolver
(runtime/process/network/resolver.py), so both agree on what a rule means. Everything is a
character-by-character walk over a bounded string: no regular expression, linear time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

# "*." + the longest name (253) + a trailing dot: a longer text is rejected before any work.
MAX_RULE_CHARS = 256
MAX_NAME_CHARS = 253
MAX_LABEL_CHARS = 63

_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")

Decision = Literal["allow", "deny", "unlisted"]


def normalize_rule(text: str) -> str:
    """`text` as a canonical rule (lowercase, no trailing dot), or ValueError saying why not.

    Only ASCII is accepted: an internationalized name must be given in its punycode form
    (`xn--...`), so that the rule and the name a guest's resolver asks for are the same bytes
    (a Unicode form would need IDNA mapping, whose variants differ between libraries)."""
    if not isinstance(text, str):
        raise ValueError("a domain rule is a string")
    if len(text) > MAX_RULE_CHARS:
        raise ValueError(f"a domain rule has at most {MAX_RULE_CHARS} characters")
    if not text:
        raise ValueError("a domain rule is not empty")
    if not text.isascii():
        raise ValueError("write an internationalized name in its punycode form (xn--...)")
    rule = text.lower()
    if rule.endswith("."):
        rule = rule[:-1]
    wildcard = rule.startswith("*.")
    name = rule[2:] if wildcard else rule
    if "*" in name:
        raise ValueError("a wildcard is only '*.' at the start of a rule (as in *.pypi.org)")
    _check_name(name, wildcard)
    return rule


def _check_name(name: str, wildcard: bool) -> None:
    if not name:
        raise ValueError("a domain rule names a domain")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"a domain name has at most {MAX_NAME_CHARS} characters")
    labels = name.split(".")
    if len(labels) < 2:
        what = "the domain after '*.'" if wildcard else "a domain name"
        raise ValueError(f"{what} has at least two labels (as in example.com)")
    for label in labels:
        _check_label(label)
    if labels[-1].isdigit():
        raise ValueError("an address is not a domain name (use allowed_cidrs or denied_cidrs)")


def _check_label(label: str) -> None:
    if not label:
        raise ValueError("a domain name has no empty label (no '..', no leading dot)")
    if len(label) > MAX_LABEL_CHARS:
        raise ValueError(f"a label of a domain name has at most {MAX_LABEL_CHARS} characters")
    for char in label:
        if char not in _LABEL_CHARS:
            raise ValueError(f"a label of a domain name has only letters, digits and '-' (not {char!r})")
    if label[0] == "-" or label[-1] == "-":
        raise ValueError("a label of a domain name neither starts nor ends with '-'")
    if label[2:4] == "--":
        if not label.startswith("xn--"):
            raise ValueError("a label with '--' in its third and fourth places is punycode: 'xn--...'")
        try:
            # A label is at most 63 characters, so the decoder's quadratic worst case is bounded.
            label[4:].encode("ascii").decode("punycode")
        except UnicodeError:
            raise ValueError("an 'xn--' label is not valid punycode") from None


class DomainRules:
    """A policy's domain rules, decided per name in O(labels) set lookups: exact names in one
    set, wildcards' domains in another, and a name's proper suffixes looked up in the latter.
    Deny beats allow."""

    __slots__ = ("_allowed_exact", "_allowed_under", "_denied_exact", "_denied_under")

    def __init__(self, allowed: Iterable[str] = (), denied: Iterable[str] = ()) -> None:
        self._allowed_exact, self._allowed_under = _split(allowed)
        self._denied_exact, self._denied_under = _split(denied)

    def decide(self, name: str) -> Decision:
        """ "deny" when a denied rule matches `name`, else "allow" when an allowed one does,
        else "unlisted". `name` is a plain dotted name (any case, trailing dot or not); each
        "." separates labels (a caller holding a DNS name with a "." or other byte outside
        letters, digits, '-' and '_' inside a label must not pass it here: see the resolver)."""
        name = name.lower()
        if name.endswith("."):
            name = name[:-1]
        if not name or len(name) > MAX_NAME_CHARS:
            return "unlisted"
        if self._matches(name, self._denied_exact, self._denied_under):
            return "deny"
        if self._matches(name, self._allowed_exact, self._allowed_under):
            return "allow"
        return "unlisted"

    @staticmethod
    def _matches(name: str, exact: frozenset[str], under: frozenset[str]) -> bool:
        if name in exact:
            return True
        if not under:
            return False
        dot = name.find(".")
        while dot != -1:
            # name[dot + 1:] is a proper suffix: "*.pypi.org" holds a.pypi.org and a.b.pypi.org.
            if name[dot + 1 :] in under:
                return True
            dot = name.find(".", dot + 1)
        return False

    def __repr__(self) -> str:
        # Counts only: the rules themselves may name what a tenant reaches.
        return (
            f"DomainRules(allowed={len(self._allowed_exact) + len(self._allowed_under)}, "
            f"denied={len(self._denied_exact) + len(self._denied_under)})"
        )


def _split(rules: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    exact: set[str] = set()
    under: set[str] = set()
    for text in rules:
        rule = normalize_rule(text)
        if rule.startswith("*."):
            under.add(rule[2:])
        else:
            exact.add(rule)
    return frozenset(exact), frozenset(under)
