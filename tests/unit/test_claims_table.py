"""SECURITY.md's claims table and the mutations behind it (tests/mutations).

- The table in SECURITY.md is the one the mutations make (`python -m tests.mutations --table`).
- Every test a mutation names exists (its file, its function, its parameter), and every
  mutation applies to the tree as it is (its `find` occurs exactly once in its file): a renamed
  test or a rewritten line would otherwise turn a row of the table into a claim nothing checks.
- The runner itself can fail: on a tiny repository of its own it reports a caught mutation,
  one that is not caught, a stale one, one whose test fails anyway and one that breaks the
  import, each for what it is.

The mutations themselves are not run here (each is a pytest run of its own: see README,
Development)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.mutations.__main__ import (
    CAUGHT,
    ERROR,
    NOT_CAUGHT,
    REPO,
    Entry,
    Result,
    collect,
    run_all,
    stale,
    table,
    table_in,
)
from tests.mutations.base import Mutation

ENTRIES = collect()


def test_there_are_mutations_and_each_is_complete() -> None:
    assert len(ENTRIES) >= 10, [e.label for e in ENTRIES]
    for entry in ENTRIES:
        mutation = entry.mutation
        assert mutation.claim.strip() and mutation.find and mutation.tests, entry
        assert mutation.find != mutation.replace, entry


def test_security_md_holds_the_claims_table_of_the_mutations() -> None:
    held = table_in((REPO / "SECURITY.md").read_text())
    assert held, "SECURITY.md has no claims table between <!-- claims:begin --> and <!-- claims:end -->"
    assert held == table(ENTRIES), (
        "SECURITY.md's claims table is not the mutations' (tests/mutations/*.py): "
        "run `python -m tests.mutations --table` and put its output between the markers"
    )


def test_every_mutation_applies_to_the_tree_as_it_is() -> None:
    problems = [f"{e.label}: {why}" for e in ENTRIES if (why := stale(e, REPO))]
    assert not problems, problems


def _defined(path: Path) -> set[str]:
    """`name` and `Class::name` of every test function the module defines."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found.add(f"{node.name}::{item.name}")
    return found


def test_every_test_a_mutation_names_exists() -> None:
    named = sorted({test for entry in ENTRIES for test in entry.mutation.tests})
    missing = []
    for test in named:
        path, _, name = test.partition("::")
        if not (REPO / path).is_file():
            missing.append(f"{test}: no file {path}")
        elif name.split("[")[0] not in _defined(REPO / path):
            missing.append(f"{test}: {path} defines no {name.split('[')[0]}")
    assert not missing, missing
    # A parameter is checked by pytest itself: it collects what these IDs name, or says which is not there.
    with_parameters = [test for test in named if "[" in test]
    if with_parameters:
        collected = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",
                *with_parameters,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
        listed = set(collected.stdout.split())
        assert set(with_parameters) <= listed, sorted(set(with_parameters) - listed)


# -- the runner, on a repository of its own ---------------------------------------------------

CODE = """\
def positive(number: int) -> bool:
    return number > 0


def label(number: int) -> str:
    return "positive" if positive(number) else "not positive"
"""

TESTS = """\
from calc import label, positive


def test_zero_is_not_positive() -> None:
    assert not positive(0)


def test_one_is_positive() -> None:
    assert positive(1)


def test_wrong_anyway() -> None:
    assert label(1) == "something else"
"""


def _fake_repository(root: Path) -> None:
    (root / "server").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "server" / "calc.py").write_text(CODE)
    (root / "tests" / "test_calc.py").write_text(TESTS)


def _entry(find: str, replace: str, *tests: str) -> Entry:
    return Entry(
        "fake", Mutation("claim", "server/calc.py", find, replace, tuple(f"tests/test_calc.py::{t}" for t in tests))
    )


def test_the_runner_tells_caught_from_not_caught_stale_and_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_repository(tmp_path / "repo")
    scratch = tmp_path / "scratch"  # where the runner's copies go (tempfile's directory)
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    entries = [
        _entry("number > 0", "number >= 0", "test_zero_is_not_positive"),
        _entry('"not positive"', '"negative"', "test_one_is_positive"),  # the test does not look
        _entry("number > 0", "True", "test_zero_is_not_positive", "test_one_is_positive"),  # one passes
        _entry("number < 0", "True", "test_zero_is_not_positive"),  # not in the file
        _entry("number > 0", "number >= 0", "test_wrong_anyway"),  # fails without the mutation too
        _entry("def positive(", "def positive((", "test_zero_is_not_positive"),  # breaks the import
        _entry("number > 0", "number >= 0", "test_no_such_test"),
    ]
    reported: list[Result] = []
    results = run_all(entries, source=tmp_path / "repo", jobs=2, timeout=120, report=reported.append)
    expected = [
        (CAUGHT, ""),
        (NOT_CAUGHT, "still passes: tests/test_calc.py::test_one_is_positive (PASSED)"),
        (NOT_CAUGHT, "still passes: tests/test_calc.py::test_one_is_positive (PASSED)"),
        (ERROR, "stale mutation: `find` occurs 0 times in server/calc.py, not once"),
        (ERROR, "fails without the mutation too: tests/test_calc.py::test_wrong_anyway"),
        (ERROR, "pytest exited "),  # 4: no test collected where the import failed
        (ERROR, "tests/test_calc.py::test_no_such_test: cannot run without the mutation either (pytest exited 4)"),
    ]
    for result, (verdict, detail) in zip(results, expected, strict=True):
        assert (result.verdict, result.detail.startswith(detail)) == (verdict, True), (result.verdict, result.detail)
    assert results[0].failed == ["tests/test_calc.py::test_zero_is_not_positive"]
    assert "assert not True" in results[0].detail  # why it failed, from pytest's summary
    assert sorted(map(id, reported)) == sorted(map(id, results))
    # The repository is as it was, and no scratch copy is left.
    assert (tmp_path / "repo" / "server" / "calc.py").read_text() == CODE
    assert not list(scratch.iterdir())


@pytest.mark.parametrize(
    ("claim", "expected"),
    [("x | y", "| x \\| y |"), ("plain", "| plain |")],
    ids=["pipe-escaped", "plain"],
)
def test_the_table_has_one_row_per_claim(claim: str, expected: str) -> None:
    entries = [
        Entry("x", Mutation(claim, "b.py", "f", "g", ("t2",))),
        Entry("y", Mutation(claim, "a.py", "f", "g", ("t1", "t2"))),
        Entry("y", Mutation("another", "c.py", "f", "g", ("t3",))),
    ]
    lines = table(entries).splitlines()
    assert lines[:2] == ["| claim | test(s) that prove it | code that provides it |", "|---|---|---|"]
    assert lines[2] == "| another | `t3` | `c.py` |"
    assert lines[3] == f"{expected} `t1`<br>`t2` | `a.py`<br>`b.py` |"
    assert len(lines) == 4
