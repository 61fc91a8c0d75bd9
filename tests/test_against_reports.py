"""Reports of a session run with ``--llmperf-against REF``: the terminal summary, the JSON session
file (checked against its schema, by our validator and by jsonschema), the Markdown summary, the
HTML report and the JUnit properties all name REF and show both sides' figures and the paired
ratio with its CI. The results are built as the controller builds them: seeded run traces of two
sides, judged pair by pair (``judge.ab.paired.judged_pairs``); no llama.cpp needed. The session
file's ``against`` object comes from a real controller whose two side processes started."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_llmperf.core.documents import SchemaViolation, load_schema, validate
from pytest_llmperf.core.formats import fmt
from pytest_llmperf.core.workload import EngineInfo, RunTrace, Workload
from pytest_llmperf.judge.paired import judged_pairs
from pytest_llmperf.judge.result import BaselineVerdict, Figures, MeasurementResult
from pytest_llmperf.judge.verdict import Verdict
from pytest_llmperf.measuring.metrics import run_metrics, summarize
from pytest_llmperf.reports import session_file
from pytest_llmperf.session import Session, SessionSettings
from pytest_llmperf.session.finish import summary

REF = "git:main (3f2a1b9c0d1e)"
WRAPPER = "tests/test_perf.py::test_wrapper_streams_tokens_from_llama_cpp"  # too long for both figures in 80 columns
PAIRS = 20
NOT_COMPARED = (
    "not compared: side REF (git:main (3f2a1b9c0d1e)) cannot collect tests/test_new.py: ImportError: "
    "cannot import name 'new_api' from 'wrapper'"
)
AGAINST = {
    "ref": "git:main",
    "described": REF,
    "sides": {
        "current": {
            "shown": "this tree",
            "interpreter": sys.executable,
            "code_root": "/src/project",
            "python": "3.11.7",
            "llama_cpp": "0.3.36",
            "code": {"wrapper": "/src/project/wrapper/__init__.py"},
        },
        "REF": {
            "shown": REF,
            "interpreter": sys.executable,
            "code_root": "/cache/worktrees/3f2a1b9c0d1e",
            "python": "3.11.7",
            "llama_cpp": "0.3.16",
            "code": {"wrapper": "/cache/worktrees/3f2a1b9c0d1e/wrapper/__init__.py"},
        },
    },
}


def _traces(rng: np.random.Generator, drift: np.ndarray, ttft_ms: float, tpot_ms: float) -> list[RunTrace]:
    """One side's runs: 16 prompt tokens, 12 generated, each run slowed by the pair's drift."""
    out = []
    for i, d in enumerate(drift):
        start = i * 10**9
        ttft = ttft_ms * d * (1 + rng.normal(0, 0.01))
        gaps = tpot_ms * d * (1 + rng.normal(0, 0.01, 11))
        tokens = start + np.concatenate([[ttft], ttft + np.cumsum(gaps)]) * 1e6
        out.append(
            RunTrace(
                start_ns=start,
                prefill_done_ns=start + int(ttft * 0.95e6),
                token_ns=tuple(int(t) for t in tokens),
                prompt_tokens=16,
            )
        )
    return out


def paired_result(test: str, slowdown: float = 1.10, seed: int = 7) -> MeasurementResult:
    """A result as the current side reports it: REF's runs and this tree's interleaved (a shared
    drift per pair), decode ``slowdown`` x slower here, judged pair by pair."""
    rng = np.random.default_rng(seed)
    drift = 1 + 0.2 * rng.random(PAIRS)  # the machine's speed moves by up to 20% between pairs
    ref, cur = _traces(rng, drift, 30.0, 5.0), _traces(rng, drift, 30.0, 5.0 * slowdown)
    comparisons = judged_pairs(
        [run_metrics(t) for t in ref],
        [run_metrics(t) for t in cur],
        alpha=0.01,
        threshold=0.05,
        tail_threshold=0.10,
        family=6,
        reference=REF,
    )
    note = (
        f"against {REF}: {PAIRS} pairs interleaved (10 AB, 10 BA, seeded; up to 60 in 3 look(s)) after 1 "
        "warm-up run(s) each; llama-cpp-python 0.3.16 (REF) vs 0.3.36 (this tree)"
    )
    m = summarize(cur, Workload(prompt_tokens=16, max_tokens=12, runs=PAIRS), EngineInfo("llama.cpp", "synthetic-tiny"))
    return MeasurementResult(
        test,
        test,
        budget="ok",
        budgets={"tpot_ms": 1000.0},
        figures=Figures.of(m),
        key=test,
        verdict=BaselineVerdict("compared", note, tuple(comparisons)).decided(),
    )


def solo_result(test: str) -> MeasurementResult:
    """A test REF cannot collect: measured on the current side only (budgets still checked)."""
    cur = _traces(np.random.default_rng(3), np.ones(6), 30.0, 5.0)
    m = summarize(cur, Workload(prompt_tokens=16, max_tokens=12, runs=6), EngineInfo("llama.cpp", "synthetic-tiny"))
    return MeasurementResult(
        test,
        test,
        budget="ok",
        budgets={"tpot_ms": 1000.0},
        figures=Figures.of(m),
        key=test,
        verdict=BaselineVerdict("not-compared", NOT_COMPARED).decided(),
    )


@pytest.fixture(scope="module")
def results() -> list[MeasurementResult]:
    return [paired_result(WRAPPER), solo_result("tests/test_new.py::test_new_api")]


def _decode(r: MeasurementResult):
    return next(c for c in r.verdict.comparisons if c.metric == "tpot_ms")


def _cells(c) -> tuple[str, str, str, str]:
    """REF's figure, this tree's, the ratio and its CI as every report writes them."""
    return fmt(c.baseline_value), fmt(c.candidate_value), f"{c.ratio:.3f}", f"{c.ci_low:.3f}..{c.ci_high:.3f}"


def test_a_ratio_far_from_one_keeps_its_digits() -> None:
    shown = [session_file.fmt_ratio(x) for x in (1.0724, 0.9, 340.069, 0.0029412)]
    assert shown == ["1.072", "0.900", "340", "0.00294"]


def test_the_paired_results_are_what_the_reports_show(results: list[MeasurementResult]) -> None:
    """The input is real: a 10% decode slowdown through 20% drift is a REGRESSION against REF."""
    c = _decode(results[0])
    assert c.reference == REF and c.noise_source == "paired" and c.n_candidate == PAIRS
    assert c.verdict is Verdict.REGRESSION and 1.07 < c.ratio < 1.13 and c.ci_low > 1.0
    assert results[0].reference == REF and results[0].verdict.pairs == PAIRS
    assert results[1].reference == "" and session_file.against_of(results) == REF


def _row(text: str, *cells: str) -> bool:
    """A line of ``text`` holding ``cells`` in order, as whole words."""
    pattern = r"\s+".join(re.escape(c) for c in cells)
    return re.search(rf"(^|\s){pattern}(\s|$)", text, re.MULTILINE) is not None


def test_terminal_names_ref_and_shows_both_sides_and_the_ratio(results: list[MeasurementResult]) -> None:
    settings = SessionSettings.of(".", against="git:main")
    rows = [session_file.summary_row(r) for r in results]
    ref_value, now_value, ratio, ci = _cells(_decode(results[0]))
    for width in (80, 160):
        lines = summary(settings, rows, results, None, [], verbosity=0, width=width)
        assert ("sep", f"llmperf comparison against {REF}") in lines
        assert not any("baseline comparison" in text for _, text in lines)
        table = next(text for kind, text in lines if kind == "line" and "now/REF" in text)
        assert all(len(line) <= width for line in table.splitlines()), table
        if width == 160:  # room for both sides' figures: REF's column, this tree's, the ratio and its CI
            assert table.splitlines()[0].split()[:6] == ["test", "metric", "REF", "now", "now/REF", "95%"]
            assert _row(table, "decode TPOT (ms)", ref_value, now_value, ratio, ci, "REGRESSION"), table
        else:  # 80 columns: the ratio and its CI, and a line that says where both figures are
            assert _row(table, "decode TPOT (ms)", ratio, ci, "REGRESSION"), table
            assert any("both sides' figures" in text for _, text in lines)
        notes = [text for _, text in lines if text.startswith("test_new_api: ")]
        assert [" ".join(n.split()) for n in notes] == [f"test_new_api: {NOT_COMPARED}"]  # wrapped to the width
        assert all(len(line) <= width for _, text in lines for line in text.splitlines())
    quiet = summary(settings, rows, results, None, [], verbosity=-1, width=80)
    assert any(f"judged against {REF}" in text for _, text in quiet)


def test_a_baseline_comparison_keeps_its_words(results: list[MeasurementResult]) -> None:
    """Without a reference the table is the baseline one (the same comparisons, no REF)."""
    import dataclasses

    baseline = tuple(dataclasses.replace(c, reference="") for c in results[0].verdict.comparisons)
    plain = [dataclasses.replace(results[0], verdict=dataclasses.replace(results[0].verdict, comparisons=baseline))]
    lines = summary(
        SessionSettings.of("."), [session_file.summary_row(r) for r in plain], plain, None, [], verbosity=0, width=160
    )
    assert ("sep", "llmperf baseline comparison") in lines
    table = session_file.comparison_table(plain, None, 160)
    assert "REF" not in table and "change" in table and f"{(_decode(plain[0]).ratio - 1) * 100:+.1f}%" in table
    assert ("llmperf.against", REF) not in session_file.junit_properties(plain[0])
    assert "Judged against REF" not in session_file.markdown(plain)


def test_session_file_has_the_against_object_and_validates(results: list[MeasurementResult], tmp_path: Path) -> None:
    import jsonschema
    import referencing

    path = tmp_path / "session.json"
    path.write_text(session_file.session_json(results, "2026-12-01T00:00:00+00:00", against=AGAINST))
    data, back = session_file.read_session(path)  # our validator: raises on a violation
    assert data["against"] == AGAINST
    assert [r.to_json() for r in back] == [r.to_json() for r in results]
    c = _decode(back[0])
    assert (c.reference, c.baseline_value, c.candidate_value, c.ci_low, c.ci_high) == (
        REF,
        _decode(results[0]).baseline_value,
        _decode(results[0]).candidate_value,
        _decode(results[0]).ci_low,
        _decode(results[0]).ci_high,
    )
    assert back[0].record is None and back[1].verdict.note == NOT_COMPARED
    schemas = {n: load_schema(n) for n in ("session", "baselines")}
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas.values()
    )
    checker = jsonschema.Draft202012Validator(schemas["session"], registry=registry)
    checker.validate(data)
    for broken, where in (
        (lambda d: d["against"].pop("sides"), "has no 'sides'"),
        (lambda d: d["against"]["sides"].pop("REF"), "has no 'REF'"),
        (lambda d: d["against"]["sides"]["REF"].update(llama_cpp=3), "llama_cpp"),
    ):
        doc = json.loads(json.dumps(data))
        broken(doc)
        with pytest.raises(SchemaViolation, match=where):
            validate(doc, "session")
        assert not checker.is_valid(doc)
    plain = json.loads(session_file.session_json(results, "t"))
    assert "against" not in plain  # only a session run with --llmperf-against has one


def test_markdown_names_ref_and_shows_both_sides(results: list[MeasurementResult]) -> None:
    md = session_file.markdown(results, against=AGAINST)
    line = next(x for x in md.splitlines() if x.startswith("Judged against REF "))
    assert line.startswith(f"Judged against REF `{REF}`: 1 of 2 measurement(s) compared")
    assert f"({PAIRS} pairs each; ratio = this tree / REF)" in line
    assert "REF: Python 3.11.7, llama-cpp-python 0.3.16; this tree: Python 3.11.7, llama-cpp-python 0.3.36" in line
    assert "| test | TTFT ms | decode t/s | ITL p95 ms | budget | vs REF |" in md
    assert f"| `{WRAPPER}` |" in md and "| REGRESSION decode |" in md
    assert "| test | metric | REF | now | now/REF | 95% CI | p (Holm) | verdict | detects |" in md
    assert "| " + " | ".join([WRAPPER, "decode TPOT (ms)", *_cells(_decode(results[0]))]) in md
    assert "| `tests/test_new.py::test_new_api` |" in md and "| ok | not compared |" in md
    assert f"### Not compared against REF\n\n- tests/test_new.py::test_new_api: {NOT_COMPARED}" in md
    assert f"### Regressions\n\n- {WRAPPER}: decode regression: TPOT" in md and f"at {REF}" in md
    # Without the controller's object (e.g. from the results alone) REF is still named.
    assert f"Judged against REF `{REF}`" in session_file.markdown(results)


def test_html_names_ref_in_the_header_and_per_test(results: list[MeasurementResult]) -> None:
    from pytest_llmperf.reports.html import render_html

    page = render_html(results, "2026-12-01T00:00:00+00:00", workers=1, against=AGAINST)
    assert f"<title>pytest-llmperf report against {REF}</title>" in page
    assert f"<h1>pytest-llmperf report against {REF}</h1>" in page
    section = re.search(r'<section id="against">(.*?)</section>', page, re.DOTALL).group(1)
    assert f"Judged against REF {REF}" in section and "1 of 2 measurement(s)" in section
    assert "llama-cpp-python 0.3.16" in section and "llama-cpp-python 0.3.36" in section
    assert "wrapper from /cache/worktrees/3f2a1b9c0d1e/wrapper/__init__.py" in section
    tests = dict(re.findall(r'<section class="test"[^>]*data-test="([^"]+)"[^>]*>(.*?)</section>', page, re.DOTALL))
    paired = tests[WRAPPER]
    assert f"against REF {REF}: {PAIRS} interleaved pairs" in paired and "baseline:" not in paired
    assert "<th>REF</th><th>now</th><th>now/REF</th><th>95% CI</th>" in paired
    assert "<td>decode TPOT (ms)</td>" + "".join(f"<td>{v}</td>" for v in _cells(_decode(results[0]))) in paired
    alone = tests["tests/test_new.py::test_new_api"]
    assert f"against REF {REF}: not compared" in alone and "ImportError" in alone
    # Its figures as measured (no record), not n/a.
    assert f"<td>decode TPOT median</td><td>ms</td><td>{fmt(results[1].figures.tpot_ms)}</td>" in alone
    budget = f"<tr><td>tpot_ms</td><td>&le; 1000</td><td>{fmt(results[1].figures.tpot_ms)}</td><td>"
    assert budget + '<span class="badge good">' in alone
    summary_row = re.search(f'<a href="#test-0">{re.escape(WRAPPER)}</a>.*?</tr>', page).group(0)
    assert f"<td>{fmt(results[0].figures.decode_tps)}</td>" in summary_row


def test_junit_properties_name_ref(results: list[MeasurementResult]) -> None:
    props = session_file.junit_properties(results[0])
    assert ("llmperf.against", REF) in props
    assert ("llmperf.verdict.tpot_ms", "REGRESSION") in props
    assert ("llmperf.tpot_ms", results[0].figures.tpot_ms) in props
    assert not any(k == "llmperf.against" for k, _ in session_file.junit_properties(results[1]))  # not compared: no REF


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def test_the_controller_fills_the_session_files_against_object(tmp_path: Path) -> None:
    """A real controller (``session.against.open_against``) of a two-commit repository starts both
    sides (pytest processes of its tests); ``Session.note_against`` takes what they said, and the
    session file carries it: REF as given and resolved, each side's Python, llama-cpp-python and
    where its code under test was imported from (REF's: its worktree)."""
    from pytest_llmperf.engines.llama_cpp_native import llama_cpp_version
    from pytest_llmperf.session.against import open_against
    from pytest_llmperf.session.refs import Project

    repo = tmp_path / "repo"
    (repo / "wrapper").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "wrapper" / "__init__.py").write_text("EXTRA_MS = 0.0\n")
    (repo / "tests" / "test_perf.py").write_text(
        "import pytest\nimport wrapper\n\n@pytest.mark.llmperf(runs=2)\ndef test_marker_only():\n    pass\n"
    )
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    ag = open_against(
        "git:HEAD",
        Project(repo, repo),
        tmp_path / "cache",
        ["tests", "-p", "no:cacheprovider"],
        str(repo),
        alpha=0.01,
        threshold=0.05,
        tail_threshold=0.1,
        family=3,
        timeout_s=240,
    )
    session = Session(SessionSettings.of(repo, against="git:HEAD", json=str(tmp_path / "s.json")))
    try:
        ag.start()
        session.note_against(ag)
    finally:
        ag.close()
    info = session.against_sides
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert info["ref"] == "git:HEAD" and info["described"] == f"git:HEAD ({commit[:12]})"
    current, ref = info["sides"]["current"], info["sides"]["REF"]
    assert current["shown"] == "this tree" and ref["shown"] == info["described"]
    for side in (current, ref):
        assert side["python"] == sys.version.split()[0] and side["llama_cpp"] == llama_cpp_version()
    assert Path(current["code"]["wrapper"]).resolve() == (repo / "wrapper" / "__init__.py").resolve()
    assert commit in ref["code"]["wrapper"] and str(tmp_path / "cache") in ref["code"]["wrapper"]
    session.results = [paired_result("tests/test_perf.py::test_marker_only")]
    outputs = session.finish({})
    assert outputs is not None and not outputs.failed, outputs
    data, _ = session_file.read_session(tmp_path / "s.json")
    assert data["against"] == json.loads(json.dumps(info))


def test_llmperf_compare_and_report_read_a_session_run_against_ref(
    results: list[MeasurementResult],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Results judged against REF have no record: ``llmperf compare`` says so per test (exit 0:
    nothing regressed between the files) and ``llmperf report`` draws the page with REF named."""
    from pytest_llmperf.cli import main as cli_main

    path = tmp_path / "against.json"
    path.write_text(session_file.session_json(results, "2026-12-01T00:00:00+00:00", against=AGAINST))
    monkeypatch.setenv("COLUMNS", "1000")  # each note whole (tests/test_report_width.py: wrapped at 80)
    assert cli_main(["compare", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{WRAPPER}: no record in {path} (a session run with --llmperf-against): not compared" in out
    assert "0 regression(s) in 0 compared measurement(s)" in out
    page = tmp_path / "report.html"
    assert cli_main(["report", str(path), "-o", str(page), "--jobs", "1"]) == 0
    text = page.read_text()
    assert f"<h1>pytest-llmperf report against {REF}</h1>" in text and "llama-cpp-python 0.3.16" in text


def test_holm_family_counts_each_labelled_measurement_once() -> None:
    """The controller never runs ``Session.assess``: its family grows by one member per phase
    for a test's second and later labels, as the session's does; a later look at a label seen
    already, or another test's first label, adds none."""
    from pytest_llmperf.judge.rule import JUDGED
    from pytest_llmperf.session.against import Against

    ag = Against(
        reference=None,
        sides={},
        alpha=0.05,
        threshold=0.05,
        tail_threshold=0.1,  # type: ignore[arg-type]
        family=4 * len(JUDGED),
        timeout_s=1.0,
    )
    assert ag.family_for("t.py::a", "") == 4 * len(JUDGED)
    assert ag.family_for("t.py::a", "") == 4 * len(JUDGED)
    assert ag.family_for("t.py::a", "long") == 5 * len(JUDGED)
    assert ag.family_for("t.py::b", "") == 5 * len(JUDGED)
    assert ag.family_for("t.py::b", "short") == 6 * len(JUDGED)


def test_a_session_that_compared_nothing_fails_unless_allowed(tmp_path: Path) -> None:
    """A gate that compared nothing does not pass: one line naming REF and the first reason;
    ``--llmperf-allow-not-compared`` lets it pass; one comparison is enough."""
    solo = [solo_result("tests/test_new.py::test_new_api"), solo_result("tests/test_new.py::test_other")]
    session = Session(SessionSettings.of(tmp_path, against="git:main"))
    session.against_sides = AGAINST
    session.results = list(solo)
    assert session.not_compared_line() == (
        f"llmperf: --llmperf-against {REF}: none of the 2 measurement(s) could be compared with REF, so the "
        f"session fails ({NOT_COMPARED}); --llmperf-allow-not-compared lets it pass"
    )
    allowed = Session(SessionSettings.of(tmp_path, against="git:main", allow_not_compared=True))
    allowed.results = list(solo)
    assert allowed.not_compared_line() is None
    session.results = [*solo, paired_result(WRAPPER)]
    assert session.not_compared_line() is None
    session.results = []  # nothing judged (none ran, or each failed): the tests' outcomes say it
    assert session.not_compared_line() is None
    assert Session(SessionSettings.of(tmp_path)).not_compared_line() is None
