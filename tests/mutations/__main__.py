"""Proof that the tests bite: `python -m tests.mutations [--only TEXT] [--list] [--table] [-j N]`.

Each entry of `MUTATIONS` in the modules of this package (base.py says what one is) removes one
protection by one textual change. For each, in a scratch copy of the repository (without
.venv, node_modules, .git and bytecode), the change is made and the entry's tests are run
(`python -m pytest -n 0` with the copy's server, client and gen on PYTHONPATH, from the copy):

- CAUGHT: every test the entry names failed;
- NOT CAUGHT: one of them passed (or was skipped): the protection can go and that test says nothing;
- ERROR: the entry is stale (its `find` is not in its file exactly once), the tests could not be
  collected or run (pytest's exit 2-5: a mutation that breaks an import proves nothing), a test
  errored in setup or teardown, it ran over --timeout, or it already fails without the mutation.

Before the mutations, the union of their tests runs once unmutated in a copy (the baseline; skip
it with --no-baseline): a test that fails anyway is not counted as a catch. Exit status: 0 when
every mutation run was caught, 1 otherwise. The scratch copies are removed at the end.

`--table` prints the claims table SECURITY.md holds between `<!-- claims:begin -->` and
`<!-- claims:end -->` (tests/unit/test_claims_table.py checks it is this output): one row per
claim, the tests that prove it and the code that provides it.

Not run by the normal suite (each mutation is a pytest run of its own, some of them minutes)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import os
import pkgutil
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.mutations.base import Mutation

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parents[1]
# Modules of this package that hold no mutations.
NOT_ENTRIES = frozenset({"base", "__main__", "__init__"})
EXCLUDED = (".venv", "node_modules", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache")
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# pytest's summary lines (-rA): "PASSED node_id", "FAILED node_id - message", ...
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)(?: - (.*))?$", re.MULTILINE)
CAUGHT, NOT_CAUGHT, ERROR = "CAUGHT", "NOT CAUGHT", "ERROR"
# The pytest runs under way (each in a session of its own, which a Ctrl-C does not reach).
_RUNNING: set[subprocess.Popen[str]] = set()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Entry:
    """A mutation and the module (area) that declares it."""

    area: str
    mutation: Mutation

    @property
    def label(self) -> str:
        return f"{self.area}: {self.mutation.claim}"


@dataclass
class Result:
    entry: Entry
    verdict: str
    detail: str = ""
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def collect(package: Path = PACKAGE, name: str = "tests.mutations") -> list[Entry]:
    """Every `MUTATIONS` entry of the package's modules, by module name then declaration order."""
    entries = []
    for info in sorted(pkgutil.iter_modules([str(package)]), key=lambda i: i.name):
        if info.name in NOT_ENTRIES:
            continue
        module = importlib.import_module(f"{name}.{info.name}")
        for mutation in getattr(module, "MUTATIONS", []):
            assert isinstance(mutation, Mutation), f"{info.name}: {mutation!r} is not a Mutation"
            entries.append(Entry(info.name, mutation))
    return entries


# -- the claims table ---------------------------------------------------------------------------


def _cell(items: Iterable[str]) -> str:
    return "<br>".join(f"`{item}`" for item in items)


def table(entries: Sequence[Entry]) -> str:
    """The markdown claims table: one row per claim (sorted), its tests and its code (sorted, once each)."""
    rows: dict[str, tuple[set[str], set[str]]] = {}
    for entry in entries:
        tests, code = rows.setdefault(entry.mutation.claim, (set(), set()))
        tests.update(entry.mutation.tests)
        code.add(entry.mutation.code)
    lines = ["| claim | test(s) that prove it | code that provides it |", "|---|---|---|"]
    for claim in sorted(rows):
        tests, code = rows[claim]
        escaped = claim.replace("|", r"\|")
        lines.append(f"| {escaped} | {_cell(sorted(tests))} | {_cell(sorted(code))} |")
    return "\n".join(lines) + "\n"


def table_in(document: str) -> str:
    """The text between the claims markers of a document ("" without them)."""
    if BEGIN not in document or END not in document:
        return ""
    return document.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


# -- scratch copies -------------------------------------------------------------------------------


def stale(entry: Entry, root: Path) -> str:
    """Why the entry cannot be applied to the tree at `root` ("" if it can)."""
    path = root / entry.mutation.code
    try:
        text = path.read_text()
    except OSError as error:
        return f"{entry.mutation.code}: {error.strerror}"
    found = text.count(entry.mutation.find)
    if found != 1:
        return f"stale mutation: `find` occurs {found} times in {entry.mutation.code}, not once"
    if entry.mutation.find == entry.mutation.replace:
        return "stale mutation: `replace` is `find`"
    return ""


def copy_tree(source: Path, target: Path) -> None:
    """A copy of the repository at `target` (a new directory), without EXCLUDED at any depth;
    the standard library's, so the run needs no tool a fresh machine may lack (rsync)."""
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(*EXCLUDED))


@contextlib.contextmanager
def mutated(root: Path, mutation: Mutation) -> Iterator[None]:
    """The mutation applied in the copy at `root`, and undone (mtime too) afterwards. No bytecode
    of the file is left either way: a .pyc keyed by the same mtime and size would be stale."""
    path = root / mutation.code
    original = path.read_text()
    stat = path.stat()
    _forget_bytecode(path)
    path.write_text(original.replace(mutation.find, mutation.replace, 1))
    try:
        yield
    finally:
        path.write_text(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        _forget_bytecode(path)


def _forget_bytecode(path: Path) -> None:
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


# -- running tests ---------------------------------------------------------------------------------


@dataclass
class Run:
    code: int  # pytest's exit status; -1: timed out
    outcomes: dict[str, str]  # node ID -> PASSED, FAILED, ERROR, SKIPPED, ...
    output: str

    def why(self, test: str) -> str:
        """What pytest's summary says of a test's (first) failure."""
        for match in OUTCOME.finditer(self.output):
            if match.group(1) in ("FAILED", "ERROR") and (match.group(2) + "[").startswith(test + "["):
                return (match.group(3) or "").strip()
        return ""


def pytest_run(root: Path, tests: Sequence[str], basetemp: Path, timeout: float, python: str) -> Run:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(root / part) for part in ("server", "client", "gen")),
        "PYTHONDONTWRITEBYTECODE": "1",
        "COLUMNS": "1000",  # the summary's lines keep their messages (cut to the width otherwise)
    }
    command = [python, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rA", f"--basetemp={basetemp}"]
    with subprocess.Popen(
        [*command, *tests],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its process group: ended whole if it runs over
    ) as process:
        with _LOCK:
            _RUNNING.add(process)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_group(process)
            return Run(-1, {}, "")
        finally:
            with _LOCK:
                _RUNNING.discard(process)
    _remove_cgroups_of(basetemp)
    return Run(process.returncode, {m.group(2): m.group(1) for m in OUTCOME.finditer(output)}, output)


def _remove_cgroups_of(basetemp: Path) -> None:
    """The process runtimes' cgroups (kibo-<tag>, <tag> from a data directory's path) of the
    data directories under `basetemp`, if empty: a server a mutation broke may end without
    removing its parent cgroups, which the fixtures' reap does not know of (the next run
    clears basetemp). rmdir only: a cgroup still in use stays, nothing is killed."""
    tags = {
        hashlib.sha256(str(instances.parent.resolve()).encode()).hexdigest()[:10]
        for instances in basetemp.rglob("instances")
        if instances.is_dir()
    }
    if not tags:
        return
    hierarchies = [CGROUP_ROOT]
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        for controller in controllers.split(",") if controllers else []:
            hierarchy = CGROUP_ROOT / controller.removeprefix("name=")
            hierarchies += [hierarchy, hierarchy / own.lstrip("/")]
    for hierarchy in hierarchies:
        for tag in tags:
            parent = hierarchy / f"kibo-{tag}"
            if not parent.is_dir():
                continue
            for child in (c for c in parent.iterdir() if c.is_dir()):
                with contextlib.suppress(OSError):
                    child.rmdir()
            with contextlib.suppress(OSError):
                parent.rmdir()


def _end_group(process: subprocess.Popen[str]) -> None:
    """SIGINT first (pytest runs its teardowns: the servers and sandboxes its fixtures made
    go), then SIGKILL to what is left of the group."""
    for signum, grace in ((signal.SIGINT, 60.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            process.communicate(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def outcome_of(test: str, outcomes: dict[str, str]) -> str:
    """A named test's outcome over all its parameters: ERROR if one errored, FAILED if every
    one failed, else what the others had (e.g. "PASSED: test[b]"); "not run" if none ran."""
    found = {node: kind for node, kind in outcomes.items() if node == test or node.startswith(test + "[")}
    if not found:
        return "not run"
    if "ERROR" in found.values():
        return "ERROR"
    others = {node: kind for node, kind in found.items() if kind != "FAILED"}
    if not others:
        return "FAILED"
    return ", ".join(f"{kind}: {node}" if node != test else kind for node, kind in sorted(others.items()))


def judge(entry: Entry, run: Run, failing_anyway: set[str]) -> Result:
    tests = entry.mutation.tests
    if run.code == -1:
        return Result(entry, ERROR, "timed out")
    if run.code not in (0, 1):
        tail = "\n".join(run.output.strip().splitlines()[-5:])
        return Result(entry, ERROR, f"pytest exited {run.code} (nothing ran, or it could not be collected):\n{tail}")
    outcomes = {test: outcome_of(test, run.outcomes) for test in tests}
    failed = [test for test, kind in outcomes.items() if kind == "FAILED"]
    errored = [test for test, kind in outcomes.items() if kind == "ERROR"]
    anyway = [test for test in failed if test in failing_anyway]
    if errored:
        return Result(entry, ERROR, "errored in setup or teardown: " + ", ".join(errored), failed)
    if anyway:
        return Result(entry, ERROR, "fails without the mutation too: " + ", ".join(anyway), failed)
    missed = [f"{test} ({kind})" for test, kind in outcomes.items() if kind != "FAILED"]
    if missed:
        return Result(entry, NOT_CAUGHT, "still passes: " + ", ".join(missed), failed)
    reasons = [f"{test.rsplit('::', 1)[-1]}: {run.why(test)[:160]}" for test in failed if run.why(test)]
    return Result(entry, CAUGHT, "\n           ".join(reasons), failed)


class Scratch:
    """Scratch copies of the repository, one per worker, under one temporary directory."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.top = Path(tempfile.mkdtemp(prefix="kibo-mutations-"))
        # Readable by all: some tests run the copy's code as another user (the rootless sandbox).
        self.top.chmod(0o755)
        self._made = 0
        self._lock = threading.Lock()

    def make(self) -> tuple[Path, Path]:
        """A fresh copy and a pytest base temp directory beside it."""
        with self._lock:
            self._made += 1
            number = self._made
        root, basetemp = self.top / f"repo-{number}", self.top / f"tmp-{number}"
        copy_tree(self.source, root)
        return root, basetemp

    def remove(self) -> None:
        shutil.rmtree(self.top, ignore_errors=True)


def baseline(scratch: Scratch, entries: Sequence[Entry], timeout: float, python: str) -> dict[str, str]:
    """What each entry's tests do without any mutation: by test, "fails" or why they cannot
    run; tests that pass are absent. One pytest run for all; if that cannot run (a test that
    is not there, say), one per entry, to tell which."""
    root, basetemp = scratch.make()

    def of(group: Sequence[Entry]) -> tuple[Run, list[str]]:
        tests = sorted({test for entry in group for test in entry.mutation.tests})
        return pytest_run(root, tests, basetemp, timeout * max(1, len(group)), python), tests

    run, tests = of(entries)
    if run.code not in (0, 1):
        found: dict[str, str] = {}
        for entry in entries:
            found.update(baseline_of(*of([entry])))
        return found
    return baseline_of(run, tests)


def baseline_of(run: Run, tests: Sequence[str]) -> dict[str, str]:
    if run.code not in (0, 1):
        return dict.fromkeys(tests, f"cannot run without the mutation either (pytest exited {run.code})")
    failing = {node for node, kind in run.outcomes.items() if kind in ("FAILED", "ERROR")}
    return {test: "fails" for test in tests if any(n == test or n.startswith(test + "[") for n in failing)}


def run_all(
    entries: Sequence[Entry],
    source: Path = REPO,
    jobs: int = 2,
    timeout: float = 900.0,
    with_baseline: bool = True,
    python: str = sys.executable,
    report: Callable[[Result], None] = lambda result: None,
) -> list[Result]:
    """Each entry's verdict (in the entries' order); `report` hears of each as it comes."""
    scratch = Scratch(source)
    results: dict[int, Result] = {}
    try:
        failing_anyway: set[str] = set()
        applicable = []
        for index, entry in enumerate(entries):
            why = stale(entry, source)
            if why:
                results[index] = Result(entry, ERROR, why)
                report(results[index])
            else:
                applicable.append(index)
        if with_baseline and applicable:
            unmutated = baseline(scratch, [entries[i] for i in applicable], timeout, python)
            failing_anyway = {test for test, what in unmutated.items() if what == "fails"}
            for index in list(applicable):
                cannot = [
                    f"{t}: {unmutated[t]}"
                    for t in entries[index].mutation.tests
                    if unmutated.get(t, "fails") != "fails"
                ]
                if cannot:
                    applicable.remove(index)
                    results[index] = Result(entries[index], ERROR, "; ".join(cannot))
                    report(results[index])
        work: queue.Queue[int] = queue.Queue()
        for index in applicable:
            work.put(index)
        lock = threading.Lock()

        def worker() -> None:
            root: Path | None = None
            while True:
                try:
                    index = work.get_nowait()
                except queue.Empty:
                    return
                entry = entries[index]
                if root is None:
                    root, basetemp = scratch.make()
                began = time.monotonic()
                with mutated(root, entry.mutation):
                    run = pytest_run(root, entry.mutation.tests, basetemp, timeout, python)
                result = judge(entry, run, failing_anyway)
                result.seconds = time.monotonic() - began
                with lock:
                    results[index] = result
                    report(result)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(jobs, len(applicable))))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        with _LOCK:
            left = list(_RUNNING)
        for process in left:  # interrupted: their teardowns run before the copies go
            _end_group(process)
        scratch.remove()
    return [results[index] for index in range(len(entries))]


def _short(text: str, most: int = 70) -> str:
    shown = repr(text.strip())
    return shown if len(shown) <= most else shown[: most - 4] + "...'"


def line(result: Result) -> str:
    """One mutation's verdict: claim, then the change (file: find -> replace), the failed tests."""
    mutation = result.entry.mutation
    text = f"{result.verdict:<10} {result.entry.label}"
    text += f"\n           {mutation.code}: {_short(mutation.find)} -> {_short(mutation.replace)}"
    if result.seconds:
        text += f" ({result.seconds:.0f} s)"
    if result.failed:
        text += "\n           failed: " + ", ".join(result.failed)
    if result.detail:
        text += "\n           " + result.detail
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", metavar="TEXT", help="only the entries whose claim, file, area, find or tests contain TEXT"
    )
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    parser.add_argument("--table", action="store_true", help="print the claims table (markdown) and exit")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutations run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for one mutation's pytest run")
    parser.add_argument("--no-baseline", action="store_true", help="trust that the tests pass unmutated")
    args = parser.parse_args(argv)
    entries = collect()
    if args.table:
        print(table(entries), end="")
        return 0
    if args.only:
        needle = args.only.lower()
        entries = [
            e
            for e in entries
            if needle
            in " ".join((e.area, e.mutation.claim, e.mutation.code, e.mutation.find, *e.mutation.tests)).lower()
        ]
    if args.list:
        for entry in entries:
            print(f"{entry.label}\n    {entry.mutation.code}: {entry.mutation.find!r}")
            for test in entry.mutation.tests:
                print(f"    {test}")
        return 0
    if not entries:
        print("no mutation matches", file=sys.stderr)
        return 2
    print(f"{len(entries)} mutations, {args.jobs} at a time", flush=True)
    results = run_all(
        entries,
        jobs=args.jobs,
        timeout=args.timeout,
        with_baseline=not args.no_baseline,
        report=lambda result: print(line(result), flush=True),
    )
    counts = {verdict: sum(r.verdict == verdict for r in results) for verdict in (CAUGHT, NOT_CAUGHT, ERROR)}
    print(f"\n{counts[CAUGHT]} caught, {counts[NOT_CAUGHT]} not caught, {counts[ERROR]} errors of {len(results)}")
    for result in results:
        if result.verdict != CAUGHT:
            print(f"  {result.verdict}: {result.entry.label} ({result.entry.mutation.code})")
    return 0 if counts[CAUGHT] == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
