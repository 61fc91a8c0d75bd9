"""States are types end to end (issue 48, point 4): each state is an enum, every member of it is
handled by each place that maps a state to something (a word, a colour, an order, a badge, a
failing test), a state crossing a file is read back into its enum where the file is read, and
no package module recovers a state from a display word.

A new member (a verdict, a budget state...) fails these tests until every such place handles it."""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import json
import re
from pathlib import Path

import pytest

from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge import budgets, regression, verdict
from pytest_llmperf.judge.budgets import BudgetState, BudgetStatus
from pytest_llmperf.judge.result import BaselineVerdict, Outcome, comparison_from_json, comparison_json
from pytest_llmperf.judge.verdict import BaselineStatus, Comparison, NoiseSource, Shown, Verdict
from pytest_llmperf.reports import charts, html, session_file

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_llmperf"

#: Every state type of the package.
STATES: tuple[type[enum.Enum], ...] = (Verdict, BaselineStatus, Shown, NoiseSource, BudgetState, BudgetStatus)


def _comparison(v: Verdict = Verdict.UNCHANGED, shown: Shown | None = Shown.LEVEL) -> Comparison:
    return Comparison(
        "tpot_ms", "TPOT", "decode", "ms", False, 0.05, 10.0, 10.5, 1.05, 1.01, 1.09, 0.01, 0.99, 20, 20, 0.02, 0.02,
        v, "a reason", shown=shown,
    )  # fmt: skip


def _result(status: BaselineStatus, *verdicts: Verdict, failures: tuple[str, ...] = ()) -> Outcome:
    """A result whose baseline said ``status``, with one comparison per verdict."""
    record = BaselineVerdict(
        status, short=str(status), failures=failures, comparisons=tuple(map(_comparison, verdicts))
    )
    return Outcome(test="t.py::test_a", verdict=record)


# --- every member handled ----------------------------------------------------------------------


@pytest.mark.parametrize("v", list(Verdict))
def test_every_verdict_has_its_word_colour_order_and_badge(v: Verdict) -> None:
    assert verdict.VERDICT_WORDS[v] and v in verdict.HEADLINE_ORDER and v in charts.VERDICT_ORDER
    assert charts.VERDICT_COLOURS[v].startswith("#") and html.LOOKS[v]
    assert f">{html.LOOKS[v][1]} {v}</span>" in html.badge(v)
    assert verdict.headline([v, Verdict.UNCHANGED]) is min(
        v, Verdict.UNCHANGED, key=verdict.HEADLINE_ORDER.index
    )  # the headline of any mix is the earlier of the order
    assert f" {verdict.VERDICT_WORDS[v]}: TPOT " in _comparison(v).line()
    # a compared test shows the verdict its comparisons name, with its colour
    assert html.state_of(_result(BaselineStatus.COMPARED, v, Verdict.UNCHANGED))[0] is verdict.headline([v])


def test_the_orders_of_verdicts_hold_each_once() -> None:
    for order in (verdict.HEADLINE_ORDER, charts.VERDICT_ORDER):
        assert sorted(order) == sorted(Verdict) and len(set(order)) == len(order)
    assert verdict.headline([]) is Verdict.INCONCLUSIVE  # nothing could be judged


@pytest.mark.parametrize("v", list(Verdict))
def test_a_stored_verdict_word_reads_back_as_its_member(v: Verdict) -> None:
    """The one reader of a stored verdict cell (a history row's ``baseline``): the word as the
    summary table wrote it, a regression's phases after it."""
    cell = regression.regression_cell(["decode", "prefill"]) if v is Verdict.REGRESSION else str(v)
    assert verdict.stored_verdict(cell) is v
    c = comparison_from_json(json.loads(json.dumps(comparison_json(_comparison(v)))))
    assert c.verdict is v and isinstance(c.verdict, Verdict)


@pytest.mark.parametrize("word", [None, "", *(s.value for s in BaselineStatus), "REGRESSIONS", "ok"])
def test_a_stored_word_that_is_no_verdict_reads_as_none(word: str | None) -> None:
    assert verdict.stored_verdict(word) is None


@pytest.mark.parametrize("status", list(BaselineStatus))
def test_every_baseline_status_has_its_badge_and_reads_back(status: BaselineStatus) -> None:
    r = _result(status)
    state, word = html.state_of(r)
    if status is BaselineStatus.COMPARED:
        assert state is Verdict.INCONCLUSIVE  # compared, nothing judged
    else:
        assert state is status and word == str(status)
    assert html.LOOKS[status] and f">{html.LOOKS[state][1]} {status}</span>" in html.test_badge(r)
    back = Outcome.from_json(json.loads(json.dumps(r.to_json())))
    assert back.verdict is not None and back.verdict.status is status


@pytest.mark.parametrize("state", list(BudgetState))
def test_every_budget_state_fails_or_passes_and_has_its_badge(state: BudgetState) -> None:
    assert isinstance(budgets.FAILS[state], bool) and state.fails is budgets.FAILS[state]
    entry = json.loads(json.dumps({"budgets": [{"status": state, "line": "a line"}]}))
    [(read, line)] = session_file.ab_budget_lines(entry)  # the session JSON's word, read back here
    assert read is state and line == "a line"
    look = html.LOOKS[state]
    assert f'class="badge {look[0]}">{look[1]} ' in html._ab_badge(state)
    assert ("FAIL" in html._ab_badge(state)) is state.fails
    md = session_file.ab_markdown_lines([{**_ab_entry(), "budgets": [{"status": str(state), "line": "a line"}]}])
    assert ("- **FAIL** a line" in md) is state.fails


def _ab_entry() -> dict[str, object]:
    return {"test": "t.py::test_ab", "a": {"name": "a"}, "b": {"name": "b"}, "orders": [], "comparisons": []}


@pytest.mark.parametrize("status", list(BudgetStatus))
def test_every_budget_status_has_its_cell_and_badge_and_reads_back(status: BudgetStatus) -> None:
    assert status.cell(["min_tps"]).split(" ")[0] == str(status) and html.LOOKS[status]
    r = Outcome(test="t", budget=status, breached_budgets=("min_tps",) if status is BudgetStatus.FAIL else ())
    assert Outcome.from_json(json.loads(json.dumps(r.to_json()))).budget is status
    assert r.over_budget is (status is BudgetStatus.FAIL)
    state, word = html.state_of(r)
    assert (state is BudgetStatus.FAIL) is r.over_budget and (word == html.OVER_BUDGET) is r.over_budget


@pytest.mark.parametrize("shown", list(Shown))
def test_every_statistic_shown_is_named_and_reads_back(shown: Shown) -> None:
    c = _comparison(shown=shown)
    assert f": TPOT {shown} " in c.line()
    assert comparison_from_json(json.loads(json.dumps(comparison_json(c)))).shown is shown


@pytest.mark.parametrize("source", list(NoiseSource))
def test_every_noise_source_is_said_and_reads_back(source: NoiseSource) -> None:
    c = dataclasses.replace(_comparison(), noise_source=source, noise_sessions=4, detectable=0.14, reference="REF")
    said = {
        NoiseSource.PRIOR: "the prior",
        NoiseSource.BASELINE: "4 recorded baseline session(s)",
        NoiseSource.HISTORY: "4 session(s) of the history",
        NoiseSource.PAIRED: "interleaved pairs against REF",
    }
    assert c.reach().startswith("detects >= 14% here; ") and said[source] in c.reach()
    back = comparison_from_json(json.loads(json.dumps(comparison_json(c))))
    assert back.noise_source is source and back == c


def test_a_regression_fails_the_test_and_names_its_phases() -> None:
    r = _result(BaselineStatus.COMPARED, Verdict.REGRESSION, failures=("decode regression",))
    assert html.state_of(r) == (Verdict.REGRESSION, "REGRESSION") and r.regressed
    v = BaselineVerdict(BaselineStatus.COMPARED, comparisons=(_comparison(Verdict.REGRESSION),)).decided()
    assert v.short == "REGRESSION decode" and verdict.stored_verdict(v.short) is Verdict.REGRESSION


def _state_keyed_maps() -> list[tuple[str, str]]:
    """(module, name) of every module-level dict of the package written with a state member
    as a key (``Verdict.REGRESSION: ...``)."""
    names = {t.__name__ for t in STATES}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(path.read_text()).body:
            target, value = _assigned(node)
            if isinstance(value, ast.Dict) and any(
                isinstance(k, ast.Attribute) and isinstance(k.value, ast.Name) and k.value.id in names
                for k in value.keys
            ):
                found.append((module, target))
    return found


def _assigned(node: ast.stmt) -> tuple[str, ast.expr | None]:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id, node.value
    return "", None


#: Module-level dicts keyed by some members of a state on purpose, each with why.
PARTIAL_MAPS: dict[tuple[str, str], str] = {}


def test_every_map_keyed_by_a_state_holds_every_member_of_it() -> None:
    """A dict over a state's members is total: a new member fails here until each holds it."""
    maps = _state_keyed_maps()
    assert ("pytest_llmperf.reports.html", "LOOKS") in maps and ("pytest_llmperf.judge.budgets", "FAILS") in maps
    for module, name in maps:
        if (module, name) in PARTIAL_MAPS:
            continue
        keys = set(getattr(importlib.import_module(module), name))
        for kind in STATES:
            if keys & set(kind):
                assert set(kind) <= keys, f"{module}.{name} misses {sorted(set(kind) - keys)}"


# --- no state from a display word --------------------------------------------------------------

#: Expressions that name a state, or a cell or word that shows one.
STATE_NAMES = re.compile(r"verdict|status|short|state|cell|word|source", re.IGNORECASE)
#: Every state's word.
WORDS = {member.value for kind in STATES for member in kind}
#: The places that read a state word on purpose, each with why: the readers where a file is read.
ALLOWED = {
    ("judge/verdict.py", "(word or '').split(' ', 1)"): "stored_verdict: the one reader of a stored verdict cell",
    ("judge/budgets.py", "cell.split(' ', 1)"): "BudgetStatus.of_cell: cell's inverse, no package caller reads a cell",
    ("history/series.py", "'REGRESSION'"): "writes a change point's direction (Step.regression, a bool), no verdict",
    ("session/assess.py", "verdict.note.split('; ')"): "a verdict's note split into its clauses, no state",
}


def _word_reads(path: Path) -> list[str]:
    """Each place in ``path`` that takes a state-like name apart (``.startswith``, ``.split``), holds
    a verdict's word as a literal, compares an enum's ``.value`` with a literal or a state-like
    name with a state's word."""
    words = {v.value for v in Verdict}
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "split", "partition") and STATE_NAMES.search(
                ast.unparse(node.func.value)
            ):
                out.append(ast.unparse(node))
        elif isinstance(node, ast.Constant) and node.value in words:
            out.append(repr(node.value))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            literal = [c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)]
            named = any(isinstance(s, ast.Attribute) and s.attr == "value" for s in sides) and any(
                isinstance(v, str) for v in literal
            )
            if named or (set(literal) & WORDS and any(STATE_NAMES.search(ast.unparse(s)) for s in sides)):
                out.append(ast.unparse(node))
    return out


def test_no_package_module_reads_a_state_back_from_a_word() -> None:
    found = {(path.relative_to(PACKAGE).as_posix(), hit) for path in PACKAGE.rglob("*.py") for hit in _word_reads(path)}
    enums = {("judge/verdict.py", repr(v.value)) for v in Verdict}  # the enum's own members
    assert found - enums - set(ALLOWED) == set()
    assert set(ALLOWED) <= found, "an allowed place is gone: drop it from ALLOWED"


def test_the_scan_sees_a_state_read_from_a_word(tmp_path: Path) -> None:
    """The scan fails the code it is written against (the first word of a verdict's cell)."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(r):\n    return r.verdict.short.split()[0] == 'REGRESSION' or r.status.value == 'ok'\n"
        "def g(short, c):\n    return short.startswith('IMPROVED') or c.noise_source in ('prior', 'history')\n"
    )
    assert set(_word_reads(bad)) == {
        "r.verdict.short.split()",
        "r.verdict.short.split()[0] == 'REGRESSION'",
        "r.status.value == 'ok'",
        "short.startswith('IMPROVED')",
        "c.noise_source in ('prior', 'history')",
        "'REGRESSION'",
        "'IMPROVED'",
    }


def test_a_record_keeps_its_verdict_typed_through_the_session_file() -> None:
    r = dataclasses.replace(_result(BaselineStatus.COMPARED, Verdict.MACHINE_SLOWER), budget=BudgetStatus.OK)
    back = Outcome.from_json(json.loads(json.dumps(r.to_json())))
    assert back.verdict is not None and back.verdict.comparisons[0].verdict is Verdict.MACHINE_SLOWER
    assert html.state_of(back) == (Verdict.MACHINE_SLOWER, "MACHINE_SLOWER") and back.budget is BudgetStatus.OK


def _plain(value: object) -> bool:
    """``value`` is plain JSON data, no ``str`` subclass (an enum member): what xdist's wire carries."""
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(map(_plain, value))
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("source", list(NoiseSource))
def test_a_result_writes_its_states_as_plain_words(source: NoiseSource) -> None:
    c = dataclasses.replace(_comparison(Verdict.IMPROVED), noise_source=source, detectable=0.1)
    record = BaselineVerdict(BaselineStatus.COMPARED, short="IMPROVED", comparisons=(c,))
    r = Outcome(test="t", budget=BudgetStatus.FAIL, verdict=record)
    assert _plain(r.to_json()) and r.to_json()["verdict"]["comparisons"][0]["noise_source"] == source.value


@pytest.mark.parametrize("v", list(Verdict))
def test_the_history_reads_a_rows_verdict_once_and_keeps_noise_in_its_window(v: Verdict, tmp_path: Path) -> None:
    """A history row's stored verdict cell is read into its member where the row is read
    (``history.database``); the window leaves out the measurements judged ``NOT_NOISE``."""
    from test_history import result, stamp

    from pytest_llmperf.history import append_session
    from pytest_llmperf.history.connection import parse
    from pytest_llmperf.history.series import NOT_NOISE, read_windows

    loc = parse(str(tmp_path / "h.sqlite"), "test", tmp_path)
    r = result("t.py::test_a", 10.0, seed=1)
    r["verdict"] = {
        "status": "compared",
        "short": regression.regression_cell(["decode"]) if v is Verdict.REGRESSION else str(v),
    }
    append_session(loc, [r], stamp(0), tmp_path, compared=True)
    rows = read_windows(loc, r["hardware_key"], ["tpot_ms"]).rows[("t.py::test_a", "")]
    assert [row["verdict"] for row in rows] == [v]
    entry = {"recorded_at": stamp(0), "subject": r["record"]["subject"], "workload": r["record"]["workload"]}
    window = read_windows(loc, r["hardware_key"], ["tpot_ms"]).levels("t.py::test_a", "", Measurement.read(entry))
    assert bool(window) is (v not in NOT_NOISE)
