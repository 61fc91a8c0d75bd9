"""The typed result (judge/result.py): the JSON it writes reads back exactly, the JUnit
properties and the terminal summary come from it (also across pytest-xdist), and the session
and baseline files are checked against the published JSON Schemas."""

from __future__ import annotations

import copy
import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_llmperf.baselines import store
from pytest_llmperf.core import catalog
from pytest_llmperf.core.documents import ANNOTATIONS, KEYWORDS, SchemaViolation, load_schema, validate
from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.result import Figures, LayerChange, MeasurementResult, ResultError
from pytest_llmperf.judge.verdict import Comparison, Verdict
from pytest_llmperf.reports import session_file
from pytest_llmperf.reports.session_file import load_session

#: Two measurements (one labelled, one a load test) on a callable engine: fast and real.
SUITE = """
import json, pathlib, time
import pytest

def tokens(prompt, max_tokens):
    for _ in range(max_tokens):
        time.sleep(0.002)
        yield "t"

def keep(name, m):
    seen = pathlib.Path(__file__).parent / "measured.json"
    data = json.loads(seen.read_text()) if seen.exists() else {}
    load = m.load
    data[name] = dict(
        label=m.label, model=m.engine.model, engine=m.engine.engine, prompt_tokens=m.prompt_tokens,
        output_tokens=m.output_tokens, runs=m.n_runs, ttft_ms=m.ttft_ms, ttft_p95_ms=m.ttft_p95_ms,
        prefill_ms=m.prefill_ms, prefill_tps=m.prefill_tps, tpot_ms=m.tpot_ms, decode_tps=m.decode_tps,
        e2e_ms=m.e2e_ms, itl_count=m.itl.count, itl_p50_ms=m.itl.p50_ms, itl_p90_ms=m.itl.p90_ms,
        itl_p95_ms=m.itl.p95_ms, itl_p99_ms=m.itl.p99_ms, itl_cv=m.itl.cv, native_prefill_ms=m.native_prefill_ms,
        native_decode_ms_per_token=m.native_decode_ms_per_token, overhead_ms_per_token=m.overhead_ms_per_token,
        load=None if load is None else dict(concurrency=load.concurrency, requests=load.n_requests,
            failed_requests=load.n_failed, requests_per_s=load.requests_per_s, output_tps=load.output_tps,
            goodput=load.goodput),
    )
    # A figure added to the catalog since: as the catalog reads it (in its place, below).
    from pytest_llmperf.core.catalog import FIGURES
    data[name].update({k: f.read(m) for k, f in FIGURES.items() if k not in data[name]})
    seen.write_text(json.dumps(data))

@pytest.mark.llmperf(max_tokens=4, runs=3, warmup=0, min_tps=1e9, tpot_ms=1e6)
def test_two(llmperf):
    keep("test_two", llmperf.measure(engine=tokens))
    keep("test_two[warm]", llmperf.measure(engine=tokens, label="warm"))
"""

#: A load test on a real server (the session's ``--llmperf-endpoint``): its figures come last.
LOAD_SUITE = (
    SUITE.split("@pytest.mark")[0]
    + """
@pytest.mark.llmperf(prompt_tokens=8, max_tokens=4, requests=4, concurrency=2, warmup=0, ttft_ms=60000)
def test_load(llmperf):
    keep("test_load", llmperf.measure())
"""
)

NAMES = [
    "model",
    "engine",
    "prompt_tokens",
    "output_tokens",
    "runs",
    "ttft_ms",
    "ttft_p95_ms",
    "prefill_ms",
    "prefill_tps",
    "tpot_ms",
    "decode_tps",
    "e2e_ms",
    "itl_count",
    "itl_p50_ms",
    "itl_p90_ms",
    "itl_p95_ms",
    "itl_p99_ms",
    "itl_cv",
    "native_prefill_ms",
    "native_decode_ms_per_token",
    "overhead_ms_per_token",
    "budget",
]
LOAD_NAMES = ["concurrency", "requests", "failed_requests", "requests_per_s", "output_tps", "goodput"]


def expected_properties(
    measured: dict, budgets: dict[str, str], verdicts: dict[str, list], parts: dict[str, list] | None = None
) -> list[tuple[str, str]]:
    """The JUnit properties as the plugin wrote them before the typed result: the figures in
    this order (``budget``, then a load test's), ``baseline``, then ``verdict.<metric>``; then
    each part of a phase (``parts``: name -> the verdict's ``PartChange`` objects) as
    ``part.<metric>.change``, ``.ci`` and ``.moved``."""
    out = []
    for name, m in measured.items():
        prefix = f"llmperf[{m['label']}]." if m["label"] else "llmperf."
        # These names in this order; a figure added to the catalog since goes in its place.
        later = [k for k in catalog.FIGURES if k not in NAMES]
        assert [k for k in catalog.FIGURES if k not in later] == NAMES[:-1]
        values = {k: m[k] for k in catalog.FIGURES}
        values["budget"] = budgets[name]
        if m["load"] is not None:
            values.update(m["load"])
        out += [(prefix + k, str(v)) for k, v in values.items()]
        if name in verdicts:
            short, comparisons = verdicts[name]
            out.append((prefix + "baseline", short))
            out += [(f"{prefix}verdict.{metric}", verdict) for metric, verdict in comparisons]
        for p in (parts or {}).get(name, ()):
            out += [
                (f"{prefix}part.{p.metric}.change", p.change_text()),
                (f"{prefix}part.{p.metric}.ci", p.ci_text()),
                (f"{prefix}part.{p.metric}.moved", "true" if p.moved else "false"),
            ]
    return out


def xml_properties(path: Path) -> list[tuple[str, str]]:
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        out += [(p.get("name"), p.get("value")) for p in case.iter("property")]
    return out


def run_inner(pytester: pytest.Pytester, *args: str, suite: str = SUITE) -> tuple[pytest.RunResult, Path]:
    pytester.makepyfile(test_suite=suite)
    seen = pytester.path / "measured.json"
    seen.unlink(missing_ok=True)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args)
    return result, seen


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist"])
def test_junit_properties_and_summary_come_from_the_result(pytester: pytest.Pytester, xdist: bool) -> None:
    dist = ["-n", "2"] if xdist else []
    result, _ = run_inner(pytester, "--llmperf-update-baselines", *dist)
    assert result.ret == 1  # min_tps=1e9: over budget
    result, seen = run_inner(pytester, "--junitxml=junit.xml", "--llmperf-json=session.json", *dist)
    measured = json.loads(seen.read_text())
    results = load_session(pytester.path / "session.json")
    assert [r.test for r in results] == [f"test_suite.py::{n}" for n in measured]  # the order measured
    by_name = {r.test.split("::")[1]: r for r in results}
    verdicts = {
        n: (r.verdict.short, [(c.metric, c.verdict.value) for c in r.verdict.comparisons])
        for n, r in by_name.items()
        if r.verdict is not None
    }
    budgets = {"test_two": "FAIL min_tps", "test_two[warm]": "FAIL min_tps"}
    parts = {n: r.verdict.parts for n, r in by_name.items() if r.verdict is not None}  # a callable of its own: none
    assert xml_properties(pytester.path / "junit.xml") == expected_properties(measured, budgets, verdicts, parts)
    assert any(v[1] for v in verdicts.values())  # compared: the verdict properties are there
    # The terminal summary's rows: from the same results (the controller's, under xdist).
    out = result.stdout.str()
    summary = out.split("llmperf summary")[1].split("llmperf baseline comparison")[0].splitlines()
    for name in measured:
        row = [line.split() for line in summary if line.startswith(name + " ")]
        assert len(row) == 1 and row[0][-2:] == ["FAIL", "min_tps"], summary


def test_junit_properties_of_a_load_test(pytester: pytest.Pytester, llmperf_server) -> None:
    result, seen = run_inner(
        pytester,
        f"--llmperf-endpoint={llmperf_server.url}",
        "--junitxml=junit.xml",
        "--llmperf-budgets-only",
        suite=LOAD_SUITE,
    )
    result.assert_outcomes(passed=1)
    measured = json.loads(seen.read_text())
    assert measured["test_load"]["load"]["requests"] == 4
    assert xml_properties(pytester.path / "junit.xml") == expected_properties(measured, {"test_load": "ok"}, {})
    row = [line.split() for line in result.stdout.str().splitlines() if line.startswith("test_load ")]
    assert len(row) == 1 and row[0][-1] == "ok"


def test_session_file_round_trips_exactly_and_validates(pytester: pytest.Pytester) -> None:
    import jsonschema
    import referencing

    run_inner(pytester, "--llmperf-update-baselines")
    run_inner(pytester, "--llmperf-json=session.json")
    doc = json.loads((pytester.path / "session.json").read_text())
    for r in doc["results"]:
        typed = MeasurementResult.from_json(r)
        assert typed.to_json() == r
        assert MeasurementResult.from_json(typed.to_json()) == typed
        assert typed.verdict is not None and all(isinstance(c, Comparison) for c in typed.verdict.comparisons)
    # The reference implementation agrees: the session file and the baseline files it compared with.
    schemas = {n: load_schema(n) for n in ("session", "baselines")}
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas.values()
    )
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schemas["session"], registry=registry).validate(doc)
    baselines = list((pytester.path / "baselines").rglob("*.json"))
    assert baselines
    for path in baselines:
        data = json.loads(path.read_text())
        validate(data, "baselines")
        jsonschema.Draft202012Validator(schemas["baselines"], registry=registry).validate(data)
    # A session file of an older version (no figures, no breached budgets) still loads and compares.
    for r in doc["results"]:
        del r["figures"], r["breached_budgets"]
    old = pytester.path / "old.json"
    old.write_text(json.dumps(doc))
    assert [r.test for r in load_session(old)] == [r["test"] for r in doc["results"]]
    from pytest_llmperf.cli import main as cli_main

    assert cli_main(["compare", str(old), str(pytester.path / "session.json"), "--columns", "all"]) in (0, 1)


def test_the_validator_uses_only_keywords_it_knows_and_covers_the_dataclasses() -> None:
    def walk(node):
        if isinstance(node, dict):
            yield node
            for key, value in node.items():
                if key not in ("properties", "$defs"):
                    yield from walk(value)
                else:
                    for sub in value.values():
                        yield from walk(sub)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    for name in ("session", "baselines"):
        for node in walk(load_schema(name)):
            assert set(node) <= KEYWORDS | ANNOTATIONS, (name, set(node) - KEYWORDS - ANNOTATIONS)
    defs = load_schema("session")["$defs"]
    for cls, definition in ((Comparison, "comparison"), (LayerChange, "layer_change"), (Figures, "figures")):
        assert {f.name for f in dataclasses.fields(cls)} <= set(defs[definition]["properties"]), cls
    assert {f.name for f in dataclasses.fields(MeasurementResult)} == set(defs["result"]["properties"])


def entry() -> dict:
    return {"runs": {"ttft_ms": [1.0, 2.0]}, "workload": {}, "subject": {}, "hardware": {}, "itl_ms": [[1.0]]}


HOSTILE = [
    # (what, edit of a valid session document, the line expected after "<file>: ")
    (
        "wrong type",
        lambda d: d["results"][0]["record"]["runs"].update(ttft_ms=[1.0, "2"]),
        "results[0].record.runs['ttft_ms'][1] is a string, not a number",
    ),
    ("missing key", lambda d: d["results"][0]["record"].pop("workload"), "results[0].record has no 'workload'"),
    (
        "not finite",
        lambda d: d["results"][0]["record"]["runs"].update(ttft_ms=[float("nan")]),
        "results[0].record.runs['ttft_ms'][0] is nan, not a finite number (JSON has none)",
    ),
    (
        "bad verdict",
        lambda d: d["results"][0].update(verdict={"status": 3}),
        "results[0].verdict.status is an integer, not a string",
    ),
    ("results not a list", lambda d: d.update(results={}), "results is an object, not an array"),
]


@pytest.mark.parametrize("what,edit,line", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_session_file_is_one_line_and_stays_as_it_was(tmp_path: Path, what, edit, line) -> None:
    from pytest_llmperf.baselines.store import BaselineError

    doc = {
        "schema": "pytest-llmperf/session",
        "schema_version": 1,
        "created_at": None,
        "results": [{"test": "t", "hardware_key": "hw", "record": entry()}],
    }
    edit(doc)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    with pytest.raises(BaselineError) as caught:
        load_session(path)
    message = str(caught.value)
    assert message == f"{path}: {line}; write the report again with pytest --llmperf-json"
    assert path.read_bytes() == before


def test_a_newer_session_file_says_upgrade(tmp_path: Path) -> None:
    from pytest_llmperf.baselines.store import BaselineError

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"schema": "pytest-llmperf/session", "schema_version": 2, "results": []}))
    with pytest.raises(BaselineError, match="newer pytest-llmperf; upgrade") as caught:
        load_session(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "tests,line",
    [
        (
            {"t": {"hw": {**entry(), "runs": {"ttft_ms": "fast"}}}},
            "tests['t']['hw'].runs['ttft_ms'] is a string, not an array",
        ),
        ({"t": {"hw": {"runs": {}}}}, "tests['t']['hw'] has no 'workload'"),
        ({"t": []}, "tests['t'] is an array, not an object"),
    ],
)
def test_a_hostile_baseline_file_is_one_line_and_stays_as_it_was(tmp_path: Path, tests, line) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"schema": store.SCHEMA, "schema_version": 1, "tests": tests}))
    before = path.read_bytes()
    with pytest.raises(store.BaselineError) as caught:
        store.load(path)
    assert str(caught.value).startswith(f"{path}: {line}") and "\n" not in str(caught.value)
    assert "re-record" in str(caught.value)
    assert path.read_bytes() == before


def test_from_json_gives_one_line_for_a_bad_document() -> None:
    good = MeasurementResult(test="t::a", record=Measurement.read(entry()), hardware_key="hw")
    assert MeasurementResult.from_json(good.to_json()) == good
    bad = good.to_json()
    bad["figures"] = {"model": "m"}
    with pytest.raises(ResultError, match=r"^result.figures has no 'engine'$"):
        MeasurementResult.from_json(bad)
    with pytest.raises(ResultError, match=r"^result is an array, not an object$"):
        MeasurementResult.from_json([])


def test_validator_agrees_with_jsonschema_on_hostile_documents() -> None:
    import jsonschema
    import referencing

    schemas = {n: load_schema(n) for n in ("session", "baselines")}
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas.values()
    )
    checker = jsonschema.Draft202012Validator(schemas["session"], registry=registry)
    base = {
        "schema": "pytest-llmperf/session",
        "schema_version": 1,
        "results": [{"test": "t", "hardware_key": "hw", "record": entry()}],
    }
    for what, edit, _ in HOSTILE:
        if what == "not finite":
            continue  # JSON has no NaN: jsonschema (on Python floats) does not judge it
        doc = copy.deepcopy(base)
        edit(doc)
        with pytest.raises(SchemaViolation):
            validate(doc, "session")
        assert not checker.is_valid(doc)
    validate(base, "session")
    assert checker.is_valid(base)


def test_a_session_file_written_before_the_typed_result_still_loads(tmp_path: Path, capsys) -> None:
    """tests/data/session-before-typed-result.json: written by pytest-llmperf before this
    change (a real session with per-layer timing), kept as it was."""
    from pytest_llmperf.cli import main as cli_main

    path = Path(__file__).parent / "data" / "session-before-typed-result.json"
    doc = json.loads(path.read_text())
    results = load_session(path)
    assert [r.test for r in results] == [r["test"] for r in doc["results"]]
    assert all(r.figures is None and r.verdict is not None and len(r.verdict.comparisons) == 5 for r in results)
    assert len(results[0].verdict.layer_changes) == 10 and isinstance(results[0].verdict.layer_changes[0], LayerChange)

    def without_lines(d: dict) -> dict:
        d = copy.deepcopy(d)
        for c in d["verdict"]["comparisons"]:
            del c["line"]  # written before the session's Holm step: recomputed now
        return d

    for typed, old in zip(results, doc["results"]):
        new = typed.to_json()
        assert new.pop("figures") is None and new.pop("breached_budgets") == [] and new.pop("budget_notes") == []
        assert without_lines(new) == without_lines(old)
    assert cli_main(["compare", str(path), str(path)]) == 0
    assert "0 regression(s) in 2 compared measurement(s)" in capsys.readouterr().out


def test_a_session_file_written_before_the_one_outcome_reads_back_and_writes_the_same(capsys) -> None:
    """tests/data/session-before-outcome.json: written by pytest-llmperf before the one
    ``Outcome`` (a real session through ``session.Session``: a breached budget, a labelled
    measurement, per-layer timing, the parts of each phase, judged against a recorded
    baseline), kept as it was: it reads back typed and writes the same bytes."""
    from pytest_llmperf.cli import main as cli_main
    from pytest_llmperf.judge.budgets import BudgetStatus
    from pytest_llmperf.judge.verdict import BaselineStatus
    from pytest_llmperf.reports.session_file import read_session, session_json

    path = Path(__file__).parent / "data" / "session-before-outcome.json"
    data, results = read_session(path)
    assert [r.test for r in results] == [
        "tests/test_today.py::test_decode",
        "tests/test_today.py::test_labelled[short]",
    ]
    assert [r.budget for r in results] == [BudgetStatus.FAIL, BudgetStatus.NONE]
    assert results[0].breached_budgets == ("min_tps",) and results[0].over_budget and results[0].failed
    assert all(r.verdict is not None and r.verdict.status is BaselineStatus.COMPARED for r in results)
    assert all(r.figures is not None and r.assessed and r.baseline_record is not None for r in results)
    assert results[0].verdict is not None and results[0].verdict.parts and results[0].verdict.layer_changes
    assert session_json(results, data["created_at"]) == path.read_text()
    assert [MeasurementResult.from_json(r.to_json()) for r in results] == results
    assert cli_main(["compare", str(path), str(path)]) == 0
    assert "0 regression(s) in 2 compared measurement(s)" in capsys.readouterr().out


def _comparison(verdict, **changes) -> Comparison:
    c = Comparison(
        metric="tpot_ms", label="TPOT", phase="decode", unit="ms", higher_is_better=False, threshold=0.05,
        baseline_value=6.52, candidate_value=7.41, ratio=1.136, ci_low=1.098, ci_high=1.172, p_value=4e-6,
        p_value_better=1.0, n_baseline=10, n_candidate=10, cv_baseline=0.02, cv_candidate=0.03,
        verdict=verdict, reason="why", p_adjusted=0.0004,
    )  # fmt: skip
    return dataclasses.replace(c, **changes)


#: Fields that change which keys a comparison writes (the later fields, REF), each way they can be.
VARIANTS = [
    {},
    {"detectable": 0.14, "df": 17.5, "noise_source": "history", "noise_sessions": 12},
    {"df": 9.0},  # no reach yet: these used to be dropped
    {"noise_source": "baseline", "noise_sessions": 3},
    {"detectable": 0.2},
    {"reference": "git:main (3f2a1b9c0d1e)", "noise_source": "paired", "df": 19.0},
    {"ci_low": None, "ci_high": None, "p_value": None, "runs_needed": 7, "mirror_of": "ttft_ms"},
]


@pytest.mark.parametrize("verdict", list(Verdict), ids=lambda v: v.value)
def test_a_comparison_reads_back_from_its_json_equal(verdict) -> None:
    """object -> JSON text -> object is the identity, for every verdict and every set of the
    fields written only sometimes (``df``, ``noise_*`` without ``detectable`` used to be lost)."""
    from pytest_llmperf.judge.result import BaselineVerdict, comparison_from_json, comparison_json

    for changes in VARIANTS:
        c = _comparison(verdict, **changes)
        back = comparison_from_json(json.loads(json.dumps(comparison_json(c))))
        assert back == c, (changes, dataclasses.asdict(back), dataclasses.asdict(c))
    record = BaselineVerdict(
        "compared", short=verdict.value, comparisons=tuple(_comparison(verdict, **v) for v in VARIANTS)
    )
    assert BaselineVerdict.from_json(json.loads(json.dumps(record.to_json()))) == record
    # A comparison with every later field at its default writes none of them (older files write the same).
    assert not set(comparison_json(_comparison(verdict))) & {"df", "noise_source", "noise_sessions", "detectable"}


def test_states_are_typed_and_written_as_the_words_they_replaced() -> None:
    from pytest_llmperf.judge.budgets import BudgetStatus
    from pytest_llmperf.judge.result import BaselineVerdict
    from pytest_llmperf.judge.verdict import BaselineStatus

    over = MeasurementResult(test="t", budget="FAIL", breached_budgets=("min_tps", "ttft_ms"))  # a word: typed
    assert over.budget is BudgetStatus.FAIL and over.over_budget and over.failed and not over.regressed
    assert over.to_json()["budget"] == "FAIL" and json.dumps(over.to_json()["budget"]) == '"FAIL"'
    assert f"{over.budget}|{BudgetStatus.NONE}" == "FAIL|-" and str(BudgetStatus.OK) == "ok"
    assert BudgetStatus.FAIL.cell(over.breached_budgets) == "FAIL min_tps,ttft_ms"
    assert [BudgetStatus.of_cell(c) for c in ("FAIL min_tps", "ok", "-", "")] == [
        BudgetStatus.FAIL,
        BudgetStatus.OK,
        BudgetStatus.NONE,
        BudgetStatus.NONE,
    ]
    regressed = MeasurementResult(test="t", verdict=BaselineVerdict("compared", failures=("decode slower",)))
    assert regressed.verdict is not None and regressed.verdict.status is BaselineStatus.COMPARED
    assert regressed.regressed and regressed.failed and not regressed.over_budget
    assert not MeasurementResult(test="t", budget=BudgetStatus.OK).failed
    assert MeasurementResult.from_json(regressed.to_json()) == regressed
    # What leaves the process is plain data: xdist's wire (execnet) takes no str subclass.
    plain = (str, int, float, bool, type(None))
    for r in (over, regressed):
        assert type(r.to_json()["budget"]) is str and all(type(v) in plain for _, v in session_file.junit_properties(r))
    assert type(regressed.to_json()["verdict"]["status"]) is str


@pytest.mark.parametrize(
    "edit,line",
    [
        (lambda d: d.update(budget="over"), 'result.budget is "over", not one of -, ok, FAIL'),
        (
            lambda d: d.update(verdict={"status": "judged"}),
            'result.verdict.status is "judged", not one of compared, no-baseline, other-hardware, '
            "workload-changed, error, not-compared",
        ),
    ],
)
def test_a_state_no_pytest_llmperf_writes_is_one_line(tmp_path: Path, edit, line) -> None:
    from pytest_llmperf.baselines.store import BaselineError

    d = MeasurementResult(test="t").to_json()
    edit(d)
    with pytest.raises(ResultError) as caught:
        MeasurementResult.from_json(d)
    assert str(caught.value) == line
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"schema": "pytest-llmperf/session", "schema_version": 1, "results": [d]}))
    with pytest.raises(BaselineError, match="results\\[0\\]"):
        load_session(path)


def test_a_live_outcome_carries_its_measurement_and_budget_failure_and_stores_neither() -> None:
    """What ``pytest_llmperf_result`` sees is the Outcome itself: the live measurement and its
    budget failure (a hook's ``failure=None`` waives it, and the budget words follow), neither
    of them stored, so what a file gives back equals it."""
    from pytest_llmperf.judge.budgets import BudgetStatus
    from pytest_llmperf.session.options import validate
    from pytest_llmperf.session.results import Measurer

    def tokens(prompt: str, max_tokens: int):
        yield from range(max_tokens)

    marker = validate({"runs": 3, "warmup": 0, "max_tokens": 3, "prompt": "x", "max_runs": 3, "tpot_ms": 1e-6})
    r = Measurer(marker, lambda: None, nodeid="t.py::test_a", test_id="sub/t.py::test_a").measure(tokens)
    assert isinstance(r, MeasurementResult) and r.measurement is not None and r.failure is not None
    assert (r.test, r.nodeid, r.n_budgets, r.baseline) == ("sub/t.py::test_a", "t.py::test_a", 1, None)
    assert r.budget is BudgetStatus.FAIL and r.breached_budgets == ("tpot_ms",) and r.budget_failures
    waived = dataclasses.replace(r, extra_info={"cost": 1}, failure=None)
    assert waived.measurement is r.measurement and waived.budget is BudgetStatus.OK and waived.budget_failures == ()
    d = waived.to_json()
    assert not {"measurement", "failure", "n_budgets"} & set(d) and d["budget"] == "ok" and d["breached_budgets"] == []
    back = MeasurementResult.from_json(json.loads(json.dumps(d)))
    assert back == waived and back.measurement is None and back.failure is None and back.to_json() == d


def test_a_figure_an_older_session_file_lacks_reads_as_none_and_is_not_written_back(tmp_path) -> None:
    """A figure added to the catalog after a session file was written (here: the file's
    ``tpot_p99_ms`` and ``delivered_ttft_ms`` taken out, as a file from before them) reads as
    None and the file writes back as it was: a new figure leaves older session files as they are."""
    from pytest_llmperf.reports.session_file import read_session, session_json

    doc = json.loads((Path(__file__).parent / "data" / "session-before-outcome.json").read_text())
    later = {"tpot_p99_ms", "delivered_ttft_ms"}
    assert not later & set(load_schema("session")["$defs"]["figures"]["required"])
    older = set(catalog.FIGURES) - set(doc["results"][0]["figures"])  # any added since the file
    for r in doc["results"]:
        r["figures"] = {k: v for k, v in r["figures"].items() if k not in later}
    path = tmp_path / "older.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False))
    data, results = read_session(path)
    assert all(r.figures is not None and r.figures.tpot_p99_ms is None for r in results)
    assert all(r.figures is not None and r.figures.absent_figures == later | older for r in results)
    assert session_json(results, data["created_at"]) == path.read_text()
    # A fresh one's figures are all written, None too (today's files).
    assert results[0].figures is not None
    fresh = dataclasses.replace(results[0].figures)
    assert fresh.absent_figures == frozenset() and set(later) <= set(fresh.to_json())
