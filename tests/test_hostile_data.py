"""Hostile inputs that lost data silently or gave wrong results (issue 21, class 4), one table
row each: two measurements of a test under one label, same-named modules outside the rootdir,
pytest-rerunfailures' attempts, symlinked baseline files, an empty baseline folder.

Every row runs a real inner pytest session and asserts, as tests/test_hostile.py does: the
exact one line, printed exactly once (``-rN``: pytest's short summary would repeat it); the
exit status; no traceback; a bounded elapsed time; the API key nowhere in the output or the
files; no temporary file left; and what the files hold afterwards. Parameter ids holding
``::`` have their own test below (two sessions: record, then compare).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from inner import run
from test_hostile import API_KEY, VALID, source

from pytest_llmperf.baselines import store as baseline_store
from pytest_llmperf.reports.text import short_ids

UPDATE = "--llmperf-update-baselines"
DIR = "--llmperf-baseline-dir=baselines"
MODULE = "test_inner.py"
BASELINE = "baselines/test_inner.json"
DISTINCT = "give each measurement of a test a distinct label"


def body(*calls: str, marker: str = "prompt_tokens=4, max_tokens=8, runs=3, warmup=0") -> str:
    lines = "".join(f"    {c}\n" for c in calls)
    return f"import pytest\n\n@pytest.mark.llmperf({marker})\ndef test_a(llmperf):\n{lines}"


#: Each attempt measures a different workload (max_tokens 4 + 2 x attempt) and fails until the
#: third: the files then say which attempt they hold.
ATTEMPTS = """
import pytest
from pathlib import Path

def attempt() -> int:
    counter = Path(__file__).with_name("attempts")
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    return n

@pytest.fixture
def teardown_fails_once():
    yield
    if Path(__file__).with_name("attempts").read_text() == "1":
        raise RuntimeError("teardown of attempt 1 fails")

@pytest.mark.llmperf(prompt_tokens=4, runs=3, warmup=0)
def test_a(llmperf, {fixture}):
    n = attempt()
    llmperf.measure(max_tokens=4 + 2 * n)
    assert {condition}, f"attempt {{n}}"
"""


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file under ``root`` (bytes), every symlink (``-> its text``); the session's own
    history and bytecode left out."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".llmperf/") or "__pycache__" in rel:
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


def stored_tests(path: Path) -> dict:
    return baseline_store.load(path)


def workloads(path: Path) -> dict[str, list[int]]:
    """``{test key: [max_tokens of each hardware entry]}`` of a baseline file."""
    return {k: [e["workload"]["max_tokens"] for e in per_hw.values()] for k, per_hw in stored_tests(path).items()}


# -- what must hold afterwards -------------------------------------------------------------------


def unchanged(root: Path, before: dict) -> None:
    assert snapshot(root) == before


def nothing_written(root: Path, before: dict) -> None:
    unchanged(root, before)
    assert not list(root.rglob("*.json"))


def keys(expected: dict[str, list[int]]) -> Callable[[Path, dict], None]:
    """The baseline file holds exactly these keys, each with the workload of the measurement
    that took the label first (never overwritten); the session file as many results."""

    def check(root: Path, before: dict) -> None:
        assert workloads(root / BASELINE) == expected
        results = json.loads((root / "session.json").read_text())["results"]
        assert len(results) == len(expected)

    return check


def one_file_per_module(root: Path, before: dict) -> None:
    base = root / "ci" / "baselines"
    assert workloads(base / "__parent__/a/test_x.json") == {"test_a": [8]}
    assert workloads(base / "__parent__/b/test_x.json") == {"test_a": [9]}
    assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()) == [
        "__parent__/a/test_x.json",
        "__parent__/b/test_x.json",
    ]


def last_attempt(root: Path, before: dict) -> None:
    """Attempt 3 (max_tokens 10) alone: baseline, session file, history, JUnit properties."""
    assert (root / "attempts").read_text() == "3"
    assert workloads(root / BASELINE) == {"test_a": [10]}
    (result,) = json.loads((root / "session.json").read_text())["results"]
    assert result["record"]["workload"]["max_tokens"] == 10
    with sqlite3.connect(root / ".llmperf" / "history.sqlite") as db:
        rows = db.execute("SELECT test, workload FROM llmperf_measurements").fetchall()
    assert [(t, json.loads(w)["max_tokens"]) for t, w in rows] == [(f"{MODULE}::test_a", 10)]
    # JUnit: a testcase per attempt (pytest's), each with its own attempt's properties only.
    testcases = ET.parse(root / "junit.xml").iter("testcase")
    cases = [[(p.get("name"), p.get("value")) for p in tc.iter("property")] for tc in testcases]
    assert [dict(c)["llmperf.output_tokens"] for c in cases] == ["6", "8", "10"]
    assert all(len(c) == len(dict(c)) for c in cases), cases


def last_attempt_after_teardown(root: Path, before: dict) -> None:
    """Attempt 1's call passed, its teardown failed: attempt 2 (max_tokens 8) alone."""
    assert (root / "attempts").read_text() == "2"
    assert workloads(root / BASELINE) == {"test_a": [8]}
    (result,) = json.loads((root / "session.json").read_text())["results"]
    assert result["record"]["workload"]["max_tokens"] == 8


def written_through(target: str) -> Callable[[Path, dict], None]:
    """The link is still the same link; its target holds this run's entry (and the old file's)."""

    def check(root: Path, before: dict) -> None:
        link = root / BASELINE
        assert link.is_symlink() and "-> " + os.readlink(link) == before[BASELINE]
        tests = stored_tests(root / target)
        assert "test_a" in tests
        if target in before:  # the old file's entries are carried over
            assert tests["test_other"] == json.loads(before[target])["tests"]["test_other"]
        assert [p.name for p in (root / "baselines").iterdir()] == ["test_inner.json"]

    return check


@dataclass(frozen=True)
class Case:
    """One hostile input; ``{root}`` in the message and the args is the session's folder."""

    id: str
    message: str | None  # the one line printed exactly once (None: no line to find)
    exit: int
    modules: dict[str, str]  # path -> source
    args: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)  # path -> the symlink's text
    after: Callable[[Path, dict], None] = unchanged
    outcomes: dict[str, int] = field(default_factory=dict)
    seconds: float = 60.0


OUTSIDE = {
    "a/__init__.py": "",
    "a/test_x.py": body("llmperf.measure()"),
    "b/__init__.py": "",
    "b/test_x.py": body("llmperf.measure()", marker="prompt_tokens=4, max_tokens=9, runs=3, warmup=0"),
}
OLD_PLACE = (
    "no baseline: run with --llmperf-update-baselines (into __parent__/{m}/test_x.json; test_x.json is where older "
    "versions kept the baselines of every module named test_x.py outside the rootdir: git mv it to "
    "__parent__/{m}/test_x.json if it is this module's)"
)
EMPTY_DIR = (
    "argument --llmperf-baseline-dir: is empty (that would be the rootdir itself); give a folder, e.g. baselines"
)
JSON = "--llmperf-json=session.json"

CASES = [
    # One label, one baseline key: a second measurement under it fails the test, never overwrites.
    Case(
        "label-used-twice",
        f"llmperf.measure(label='a'): label 'a' is taken by an earlier measurement of this test; {DISTINCT}",
        1,
        {MODULE: body('llmperf.measure(label="a")', 'llmperf.measure(label="a", max_tokens=9)')},
        (UPDATE, DIR, JSON),
        after=keys({"test_a#a": [8]}),
        outcomes={"failed": 1},
    ),
    Case(
        "automatic-label-already-taken",
        f"llmperf.measure(): its automatic label '#3' is taken by an earlier measurement of this test; {DISTINCT}",
        1,
        {MODULE: body("llmperf.measure()", 'llmperf.measure(label="#3")', "llmperf.measure(max_tokens=9)")},
        (UPDATE, DIR, JSON),
        after=keys({"test_a": [8], "test_a##3": [8]}),
        outcomes={"failed": 1},
    ),
    Case(
        "label-takes-an-automatic-one",
        f"llmperf.measure(label='#2'): label '#2' is taken by an earlier measurement of this test; {DISTINCT}",
        1,
        {MODULE: body("llmperf.measure()", "llmperf.measure()", 'llmperf.measure(label="#2", max_tokens=9)')},
        (UPDATE, DIR, JSON),
        after=keys({"test_a": [8], "test_a##2": [8]}),
        outcomes={"failed": 1},
    ),
    # --rootdir elsewhere: two test_x.py, two files (not one file, one key, the last one winning).
    Case(
        "same-named-modules-outside-the-rootdir",
        None,
        0,
        OUTSIDE,
        ("--rootdir={root}/ci", UPDATE, DIR),
        files={"ci/README": "the rootdir"},
        after=one_file_per_module,
        outcomes={"passed": 2},
    ),
    Case(
        "old-shared-file-of-modules-outside-the-rootdir",
        OLD_PLACE.format(m="a"),
        0,
        OUTSIDE,
        ("--rootdir={root}/ci", DIR),
        files={"ci/baselines/test_x.json": VALID},
        outcomes={"passed": 2},
    ),
    # pytest-rerunfailures: the last attempt is the test's result, the others are not measurements.
    Case(
        "rerun-records-the-last-attempt",
        None,
        0,
        {MODULE: ATTEMPTS.format(fixture="tmp_path", condition="n == 3")},
        ("--reruns=2", UPDATE, DIR, JSON, "--junitxml=junit.xml"),
        after=last_attempt,
        outcomes={"passed": 1, "rerun": 2},
    ),
    Case(
        "rerun-after-a-failed-teardown",
        None,
        0,
        {MODULE: ATTEMPTS.format(fixture="teardown_fails_once", condition="True")},
        ("--reruns=1", UPDATE, DIR, JSON),
        after=last_attempt_after_teardown,
        outcomes={"passed": 2, "rerun": 1},
    ),  # attempt 1's call passed (rerunfailures counts it)
    # A symlinked baseline file: the target is replaced atomically, the link stays a link.
    Case(
        "baseline-file-is-a-symlink",
        None,
        0,
        {MODULE: source()},
        (UPDATE, DIR),
        files={"shared/test_inner.json": VALID},
        links={BASELINE: "../shared/test_inner.json"},
        after=written_through("shared/test_inner.json"),
        outcomes={"passed": 1},
    ),
    Case(
        "baseline-file-is-a-dangling-symlink",
        None,
        0,
        {MODULE: source()},
        (UPDATE, DIR),
        files={"shared/README": "the target's folder"},
        links={BASELINE: "../shared/new.json"},
        after=written_through("shared/new.json"),
        outcomes={"passed": 1},
    ),
    # An empty baseline folder would be the rootdir: refused before anything runs.
    Case(
        "empty-baseline-dir",
        EMPTY_DIR,
        4,
        {MODULE: source()},
        (UPDATE, "--llmperf-baseline-dir="),
        after=nothing_written,
    ),
    Case(
        "blank-baseline-dir",
        EMPTY_DIR,
        4,
        {MODULE: source()},
        (UPDATE, "--llmperf-baseline-dir=  "),
        after=nothing_written,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_data(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, case: Case) -> None:
    monkeypatch.setenv("LLMPERF_API_KEY", API_KEY)
    root = pytester.path
    for rel, text in {**case.modules, **case.files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for rel, target in case.links.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(target)
    before = snapshot(root)
    started = time.monotonic()
    result = run(pytester, "-rN", *[a.format(root=root) for a in case.args])
    elapsed = time.monotonic() - started
    output = result.stdout.str() + result.stderr.str()
    assert elapsed < case.seconds, f"took {elapsed:.1f} s"
    assert result.ret == case.exit, output
    if case.message is not None:
        message = case.message.format(root=root)
        assert "\n" not in message
        assert output.count(message) == 1, output
    if case.outcomes:  # "rerun" too, which assert_outcomes does not know
        outcomes = result.parseoutcomes()
        assert {k: outcomes.get(k, 0) for k in ("passed", "failed", "rerun", "errors")} == {
            "passed": 0,
            "failed": 0,
            "rerun": 0,
            "errors": 0,
            **case.outcomes,
        }, output
    assert "Traceback" not in output and "During handling of the above exception" not in output, output
    written = [p for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".xml", ".sqlite")]
    assert API_KEY not in output and not [p for p in written if API_KEY.encode() in p.read_bytes()]
    assert not list(root.rglob(".*.tmp"))  # no temp file left, beside a link or its target
    case.after(root, before)


# -- parameter ids holding "::" ------------------------------------------------------------------

PARAMS = """
import pytest

# A shared machine's noise must not fail it: no change below 900% counts, no extra runs.
@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=3, warmup=0, min_tps=1, max_runs=3, threshold=9,
                     tail_threshold=9)
@pytest.mark.parametrize("v", [1, 2], ids=["x::y", "x::z"])
def test_a(llmperf, v):
    pass
"""
IDS = [f"{MODULE}::test_a[x::y]", f"{MODULE}::test_a[x::z]"]


def test_parameter_ids_with_double_colons_are_shown_whole(pytester: pytest.Pytester) -> None:
    """``test_a[x::y]`` in every table and report (it was ``y]``): the terminal summary, the
    comparison table, the JSON, Markdown and HTML reports, the baseline keys."""
    pytester.makepyfile(test_inner=PARAMS)
    recorded = run(pytester, "-rN", UPDATE, DIR)
    assert recorded.ret == 0, recorded.stdout.str()
    assert sorted(stored_tests(pytester.path / BASELINE)) == ["test_a[x::y]", "test_a[x::z]"]
    started = time.monotonic()
    # In a subprocess: matplotlib first imported by an in-process session and dropped with its
    # modules afterwards breaks a later session's plots.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rN", DIR, JSON, "--llmperf-markdown=summary.md", "--llmperf-html=report.html"
    )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    assert time.monotonic() - started < 180
    assert "Traceback" not in output
    table_rows = [line for line in output.splitlines() if line.startswith("test_a[x::")]
    assert len(table_rows) >= 4, output  # two tests, in the summary and in the comparison table
    assert not [line for line in output.splitlines() if re.match(r"\s*[yz]\]", line)], output
    results = json.loads((pytester.path / "session.json").read_text())["results"]
    assert sorted(r["test"] for r in results) == IDS
    for name in ("summary.md", "report.html"):
        text = (pytester.path / name).read_text()
        assert all(i in text for i in IDS), name


def test_short_ids_keep_a_parameter_id_whole() -> None:
    from pytest_llmperf.core import formats as nodeids

    assert short_ids(IDS) == {IDS[0]: "test_a[x::y]", IDS[1]: "test_a[x::z]"}
    assert short_ids(["t.py::K::test_a[x::y]", "t.py::L::test_a[x::y]"]) == {
        "t.py::K::test_a[x::y]": "K::test_a[x::y]",
        "t.py::L::test_a[x::y]": "L::test_a[x::y]",
    }
    assert nodeids.parts("a/t.py::K::test_a[x::y][#2]") == ["a/t.py", "K", "test_a[x::y][#2]"]
    assert nodeids.last("t.py::test_a[::]") == "test_a[::]"
    assert baseline_store.entry_key("t.py::K::test_a[x::y]", "l") == "K::test_a[x::y]#l"
