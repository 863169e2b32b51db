"""One mutation: a protection removed by one textual change, and the tests that must catch it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    """`find` must occur exactly once in `code` (a path relative to the repository's root);
    the scratch copy has it replaced by `replace`, and then each of `tests` (pytest node IDs)
    must fail. `claim` is the sentence of SECURITY.md's claims table that the tests prove."""

    claim: str
    code: str
    find: str
    replace: str
    tests: tuple[str, ...]
