"""Domain rules of a network policy (domain/domains.py): what a rule may be, its canonical form,
and how a name is decided (deny beats allow; `*.d` is any name under d, never d itself)."""

from __future__ import annotations

import time

import pytest
from kibo_ctrl.domain.domains import MAX_RULE_CHARS, DomainRules, normalize_rule


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("api.github.com", "api.github.com"),
        ("API.GitHub.COM.", "api.github.com"),
        ("*.pypi.org", "*.pypi.org"),
        ("*.PyPI.org.", "*.pypi.org"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("a-b.c0.io", "a-b.c0.io"),
        ("a" * 63 + ".com", "a" * 63 + ".com"),
        (".".join(["a" * 61] * 4) + ".com", ".".join(["a" * 61] * 4) + ".com"),  # 249 characters
    ],
)
def test_a_valid_rule_is_lowercased_without_its_trailing_dot(text: str, rule: str) -> None:
    assert normalize_rule(text) == rule


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "not empty"),
        ("com", "at least two labels"),
        ("*.com", "at least two labels"),
        ("*", "only '*.' at the start"),
        ("*.", "only '*.' at the start"),
        ("*..", "names a domain"),
        ("api.*.com", "only '*.' at the start"),
        ("*api.github.com", "only '*.' at the start"),
        ("**.github.com", "only '*.' at the start"),
        ("a..com", "no empty label"),
        (".a.com", "no empty label"),
        ("a.com..", "no empty label"),
        ("-a.com", "starts nor ends with '-'"),
        ("a-.com", "starts nor ends with '-'"),
        ("a_b.com", "only letters, digits and '-'"),
        ("a b.com", "only letters, digits and '-'"),
        ("a/b.com", "only letters, digits and '-'"),
        ("bücher.example", "punycode"),
        ("\u212a.com", "punycode"),  # the Kelvin sign lowercases to an ASCII "k": refused before
        ("ab--c.com", "punycode"),
        ("xn--99999999.com", "not valid punycode"),
        ("a" * 64 + ".com", "at most 63"),
        (".".join(["a" * 63] * 3) + "." + "a" * 58 + ".com", "at most 253"),  # 254 characters
        ("10.0.0.1", "not a domain name"),
        ("x" * (MAX_RULE_CHARS + 1), f"at most {MAX_RULE_CHARS}"),
    ],
)
def test_an_invalid_rule_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        normalize_rule(text)
    assert why in str(raised.value)


def test_a_rule_is_checked_in_linear_time() -> None:
    """The API bounds a rule's length before this, but the check itself is a single walk: a
    long text is refused at once, and the longest valid rules cost microseconds."""
    start = time.thread_time()
    for _ in range(1000):
        normalize_rule("*." + ".".join(["a" * 62] * 4))
        with pytest.raises(ValueError):
            normalize_rule("a." * 5_000_000)
    assert time.thread_time() - start < 1.0


def test_deny_beats_allow_and_unlisted_names_are_neither() -> None:
    rules = DomainRules(allowed=["*.example.com", "api.github.com"], denied=["bad.example.com", "*.evil.example.com"])
    assert rules.decide("ok.example.com") == "allow"
    assert rules.decide("bad.example.com") == "deny"
    assert rules.decide("x.evil.example.com") == "deny"
    assert rules.decide("evil.example.com") == "allow"  # the wildcard's domain itself is not under it
    assert rules.decide("api.github.com") == "allow"
    assert rules.decide("github.com") == "unlisted"
    assert rules.decide("x.api.github.com") == "unlisted"  # an exact rule holds no name under it


def test_a_wildcard_holds_every_depth_under_its_domain_and_not_the_domain() -> None:
    rules = DomainRules(allowed=["*.pypi.org"])
    for name in ("files.pypi.org", "a.b.c.pypi.org", "FILES.PyPI.org.", "files.pypi.org."):
        assert rules.decide(name) == "allow", name
    for name in ("pypi.org", "evilpypi.org", "pypi.org.evil.com", "org", "", ".", "pypi.org.x"):
        assert rules.decide(name) == "unlisted", name


def test_rules_are_validated_when_built_and_repr_names_none_of_them() -> None:
    with pytest.raises(ValueError):
        DomainRules(allowed=["*.com"])
    rules = DomainRules(allowed=["secret-project.example.com"], denied=["*.a.io", "b.io"])
    assert repr(rules) == "DomainRules(allowed=1, denied=2)"


def test_a_name_is_decided_in_time_linear_in_its_length() -> None:
    rules = DomainRules(allowed=[f"*.d{i}.example.com" for i in range(64)], denied=["*.x.io"])
    deep = ".".join(["a"] * 126) + ".d1.example.com"  # 127+ labels: the deepest DNS name
    start = time.thread_time()
    for _ in range(1000):
        assert rules.decide(deep) == "unlisted"  # longer than a DNS name may be
        assert rules.decide(".".join(["a"] * 100) + ".d1.example.com") == "allow"
    assert time.thread_time() - start < 1.0
