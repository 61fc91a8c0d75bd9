"""Where it went in every report (reports/where.py): the terminal block under the comparison
table (at most 80 columns), the JSON round trip, the JUnit properties, the Markdown section and
the HTML report's chart and table, all from real part comparisons (``judge.parts``) of
synthetic runs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_ab import simulated
from test_parts import _comparison, _runs

from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge import ab as AB
from pytest_llmperf.judge import parts as P
from pytest_llmperf.judge.result import BaselineVerdict, MeasurementResult
from pytest_llmperf.judge.verdict import BaselineStatus, Verdict
from pytest_llmperf.reports import session_file, where
from pytest_llmperf.session import SessionSettings
from pytest_llmperf.session.finish import summary

CREATED = "2026-12-03T00:00:00+00:00"


def _result(
    test: str, *, outside_ms: float = 1.9, seed: int = 10, verdict: Verdict = Verdict.REGRESSION
) -> MeasurementResult:
    """A test whose decode is ``verdict`` against its baseline, with its parts compared pair by
    pair: ``outside_ms`` per token outside llama.cpp now (1.0 in the baseline)."""
    parts = P.paired_parts(_runs(20, seed), _runs(20, seed + 1, outside_ms=outside_ms), alpha=0.01)
    ratio = 1.088 if verdict is Verdict.REGRESSION else 1.0
    comparisons = (
        _comparison("prefill", "ttft_ms", "TTFT", 1.0, Verdict.UNCHANGED),
        _comparison("decode", "tpot_ms", "TPOT", ratio, verdict),
    )
    failures = ("decode TPOT REGRESSION",) if verdict is Verdict.REGRESSION else ()
    short = "REGRESSION decode" if failures else "UNCHANGED"
    v = BaselineVerdict(BaselineStatus.COMPARED, short=short, failures=failures, comparisons=comparisons, parts=parts)
    return MeasurementResult(test, test, verdict=v)


def _ab_entry(test: str = "tests/test_ab.py::test_wrapper") -> dict[str, Any]:
    """A session JSON ``ab`` entry: an A/B whose B is 10% slower, with parts where only the time
    outside llama.cpp moved."""
    r = dataclasses.replace(
        simulated(3, b_slower=1.1, max_slowdown=None),
        parts=P.paired_parts(_runs(20, 40), _runs(20, 41, outside_ms=1.9), alpha=0.01),
    )
    return json.loads(json.dumps({"test": test, "nodeid": test, **AB.as_dict(r)}))


def _unmoved(test: str) -> MeasurementResult:
    return _result(test, outside_ms=1.0, verdict=Verdict.UNCHANGED)


def _plain(test: str) -> MeasurementResult:
    """A compared test without parts (a served side, or a record of an earlier version)."""
    r = _result(test)
    assert r.verdict is not None
    return dataclasses.replace(r, verdict=dataclasses.replace(r.verdict, parts=()))


# --- terminal ---------------------------------------------------------------------------------


def _block(lines: list[tuple[str, str]]) -> list[str]:
    """The "where it went" block's lines of a terminal summary."""
    kinds = [(k, t) for k, t in lines]
    start = kinds.index(("sep", "llmperf where it went"))
    out = []
    for kind, text in kinds[start + 1 :]:
        if kind != "line":
            break
        out += text.splitlines()
    return out


def test_the_terminal_shows_where_it_went_under_the_comparison_table_in_80_columns() -> None:
    results = [_result("tests/perf/test_chat.py::test_answer_stream"), _unmoved("tests/perf/test_chat.py::test_quiet")]
    results.append(_plain("tests/perf/test_chat.py::test_without_parts"))
    rows = [session_file.summary_row(r) for r in results]
    lines = summary(SessionSettings.of("."), rows, results, None, [], verbosity=0, width=80)
    seps = [t for k, t in lines if k == "sep"]
    assert seps.index("llmperf where it went") == seps.index("llmperf baseline comparison") + 1
    block = _block(lines)
    assert all(len(line) <= 80 for line in block), "\n".join(block)
    text = "\n".join(block)
    assert block[0] == "test_answer_stream (REGRESSION decode)"
    assert "test_quiet" not in text and "test_without_parts" not in text and "n/a" not in text
    assert re.sub(r"\s+", " ", text).count("decode TPOT +8.8% (1.058..1.118): moved: outside llama.cpp +0.") == 1
    header = next(line for line in block if "decode (ms/token)" in line)
    assert header.split() == ["decode", "(ms/token)", "baseline", "now", "change", "95%", "CI", "moved"]
    outside = next(line for line in block if line.strip().startswith("outside llama.cpp"))
    assert outside.endswith("moved") and "ms/token" in outside
    (p,) = [p for p in results[0].verdict.parts if p.metric == "decode_outside_ms_per_token"]  # type: ignore[union-attr]
    assert p.change_text() in outside and p.ci_text() in outside
    assert next(line for line in block if line.strip().startswith("llama.cpp eval")).endswith("-")
    assert not any("prefill (ms)" in line for line in block)  # prefill did not move: its parts stay in the JSON


def test_the_block_fits_narrow_terminals_and_large_figures() -> None:
    big = _result("tests/test_a.py::test_" + "x" * 90 + "[" + "p" * 40 + "]")
    scaled = [
        dataclasses.replace(p, a_median=p.a_median * 1e4, b_median=p.b_median * 1e4, delta=p.delta * 1e4)
        for p in big.verdict.parts  # type: ignore[union-attr]
    ]
    big = dataclasses.replace(big, verdict=dataclasses.replace(big.verdict, parts=tuple(scaled)))  # type: ignore[arg-type]
    entries = where.explained([big], [_ab_entry()])
    for width in (60, 80, 120):
        block = where.terminal_lines(entries, width)
        assert block and all(len(line) <= width for line in block), "\n".join(block)


def test_many_tests_show_a_few_then_say_where_the_rest_are() -> None:
    results = [_result(f"tests/test_a.py::test_{i}", seed=100 + 2 * i) for i in range(where.TERMINAL_SHOWN + 3)]
    entries = where.explained(results)
    block = where.terminal_lines(entries, 80)
    shown = [line for line in block if re.match(r"test_\d+ \(", line)]
    assert len(shown) == where.TERMINAL_SHOWN
    assert " ".join(block[-2:]).startswith("llmperf: 3 more comparison(s) whose phase moved: -v shows them")
    every = where.terminal_lines(entries, 80, verbose=True)
    assert len([line for line in every if re.match(r"test_\d+ \(", line)]) == len(results)


def test_an_ab_entry_gets_its_block_with_its_sides_named() -> None:
    entry = _ab_entry()
    assert entry["why"], "B is 10% slower: its decode moved"
    lines = summary(SessionSettings.of("."), [], [], None, [], verbosity=0, width=80, ab=[entry])
    block = _block(lines)
    assert block[0] == "test_wrapper: B [b] vs A [a]"
    header = next(line for line in block if "decode (ms/token)" in line)
    assert header.split()[2:4] == ["a", "b"]
    assert any(line.strip().startswith("outside llama.cpp") and line.endswith("moved") for line in block)
    assert summary(SessionSettings.of("."), [], [], None, [], verbosity=-1, width=80, ab=[entry]) == []


def test_nothing_moved_no_block() -> None:
    results = [_unmoved("tests/test_a.py::test_a"), _plain("tests/test_a.py::test_b")]
    lines = summary(
        SessionSettings.of("."),
        [session_file.summary_row(r) for r in results],
        results,
        None,
        [],
        verbosity=0,
        width=80,
    )
    assert ("sep", "llmperf where it went") not in lines
    assert "### Where it went" not in session_file.markdown(results)


# --- JSON -------------------------------------------------------------------------------------


def test_a_session_file_with_parts_reads_back_and_writes_the_same(tmp_path: Path) -> None:
    results = [_result("tests/test_a.py::test_a"), _plain("tests/test_a.py::test_b")]
    text = session_file.session_json(results, CREATED, ab=[_ab_entry()])
    path = tmp_path / "s.json"
    path.write_text(text)
    data, back = session_file.read_session(path)
    assert [r.verdict.parts for r in back] == [r.verdict.parts for r in results]  # type: ignore[union-attr]
    assert back[0].verdict.why() == results[0].verdict.why()  # type: ignore[union-attr]
    assert session_file.session_json(back, CREATED, ab=data["ab"]) == text
    assert session_file.load_session(path) == back


def _recorded(test: str, outside_ms: float, seed: int) -> MeasurementResult:
    """A measured result with its record, from runs whose llama.cpp counters are read (so the
    record stores each run's parts): 10 ms/token in llama.cpp's eval, 0.5 in the sampler,
    ``outside_ms`` outside llama.cpp."""
    from pytest_llmperf.baselines.records import stored
    from pytest_llmperf.core.fingerprint import Fingerprint, subject
    from pytest_llmperf.core.workload import EngineInfo, NativeCounters, RunTrace, Workload
    from pytest_llmperf.judge.result import Figures
    from pytest_llmperf.measuring.metrics import summarize

    rng = np.random.default_rng(seed)
    traces = []
    for i in range(12):
        start = i * 10**9
        eval_ms, sample_ms = 10.0 * (1 + rng.normal(0, 0.01, 11)), 0.5 * (1 + rng.normal(0, 0.01, 11))
        gaps = eval_ms + sample_ms + outside_ms * (1 + rng.normal(0, 0.01, 11))
        ttft = 30.0 * (1 + rng.normal(0, 0.01))
        tokens = start + np.concatenate([[ttft], ttft + np.cumsum(gaps)]) * 1e6
        native = NativeCounters(25.0, 16, float(eval_ms.sum()), 11, float(sample_ms.sum()), 11)
        traces.append(RunTrace(start, start + int(26e6), tuple(int(t) for t in tokens), 16, native=native))
    m = summarize(traces, Workload(prompt_tokens=16, max_tokens=12, runs=12), EngineInfo("llama.cpp", "synthetic"))
    rec = stored(m, Fingerprint({}, subject(m.engine)), commit=None, recorded_at=CREATED).to_json()
    assert set(rec["parts"]) >= {"native_decode_ms_per_token", "decode_outside_ms_per_token"}
    return MeasurementResult(test, test, figures=Figures.of(m), key=test, record=Measurement.read(rec))


def test_llmperf_compare_shows_where_it_went_and_report_draws_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two saved sessions whose records hold their runs' parts: ``llmperf compare`` judges the
    parts too and prints the block; ``llmperf report`` draws each test's parts."""
    from test_against_reports import AGAINST, paired_result

    from pytest_llmperf.cli import main as cli_main

    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(session_file.session_json([_recorded("tests/test_a.py::test_wrapper", 1.0, 1)], CREATED))
    new.write_text(session_file.session_json([_recorded("tests/test_a.py::test_wrapper", 15.0, 2)], CREATED))
    status = cli_main(["compare", str(base), str(new)])
    out = capsys.readouterr().out
    assert status == 1, out
    block = out.split("where it went:\n", 1)[1].splitlines()
    assert block[0] == "test_wrapper (REGRESSION decode)" and "moved: outside llama.cpp +" in block[1]
    assert any(line.strip().startswith("outside llama.cpp") and line.endswith("moved") for line in block)

    # Against REF: no records to compare, but the verdict's parts are in the file and the page.
    r = paired_result("tests/test_p.py::test_wrapper")
    r = dataclasses.replace(r, verdict=dataclasses.replace(r.verdict, parts=_result("x").verdict.parts))  # type: ignore[arg-type, union-attr]
    path = tmp_path / "against.json"
    path.write_text(session_file.session_json([r], CREATED, ab=[_ab_entry()], against=AGAINST))
    page = tmp_path / "report.html"
    assert cli_main(["report", str(path), "-o", str(page), "--jobs", "1"]) == 0
    text = page.read_text()
    assert text.count('data-figure="parts"') == 2 and text.count("<h3>Where it went</h3>") == 2
    assert "REF (A)" in text and "this tree (B)" in text


# --- JUnit ------------------------------------------------------------------------------------


def test_junit_properties_carry_each_part() -> None:
    r = _result("tests/test_a.py::test_a")
    props = dict(session_file.junit_properties(r))
    (p,) = [p for p in r.verdict.parts if p.metric == "decode_outside_ms_per_token"]  # type: ignore[union-attr]
    assert props["llmperf.part.decode_outside_ms_per_token.change"] == p.change_text()
    assert props["llmperf.part.decode_outside_ms_per_token.ci"] == p.ci_text()
    assert props["llmperf.part.decode_outside_ms_per_token.moved"] == "true"
    assert props["llmperf.part.native_decode_ms_per_token.change"].startswith("x")
    assert props["llmperf.part.native_decode_ms_per_token.moved"] == "false"
    assert props["llmperf.verdict.tpot_ms"] == "REGRESSION"
    labelled = dict(session_file.junit_properties(dataclasses.replace(r, label="q8")))
    assert "llmperf[q8].part.sampling_ms_per_token.ci" in labelled
    assert not any(".part." in k for k, _ in session_file.junit_properties(_plain("tests/test_a.py::test_b")))
    ab = dataclasses.replace(simulated(3), parts=r.verdict.parts, label="")  # type: ignore[union-attr]
    ab_props = dict(AB.properties([ab]))
    assert ab_props["llmperf.ab.part.decode_outside_ms_per_token.moved"] == "true"
    assert "llmperf.ab.tpot_ms.ratio" in ab_props


# --- Markdown ---------------------------------------------------------------------------------


def test_markdown_has_a_where_it_went_section_for_the_tests_whose_phase_moved() -> None:
    results = [_result("tests/test_a.py::test_slow"), _unmoved("tests/test_a.py::test_same")]
    md = session_file.markdown(results, ab=[_ab_entry()])
    section = md.split("### Where it went", 1)[1].split("\n### ", 1)[0]
    assert "`tests/test_a.py::test_slow` (REGRESSION decode)" in section and "test_same" not in section
    assert "`tests/test_ab.py::test_wrapper`: B [b] vs A [a]" in section
    assert "- decode TPOT +8.8% (1.058..1.118): moved: outside llama.cpp +0." in section
    assert "| decode (ms/token) | baseline | now | change | 95% CI | moved |" in section
    assert re.search(r"\| outside llama.cpp \| [\d.]+ \| [\d.]+ \| \+[\d.]+ ms/token \| [^|]+ \| moved \|", section)
    assert md.index("### Comparisons") < md.index("### Where it went") < md.index("### A/B comparisons")


# --- HTML -------------------------------------------------------------------------------------


def test_html_draws_the_parts_of_each_phase_side_by_side_with_the_table() -> None:
    pytest.importorskip("matplotlib")
    from pytest_llmperf.reports import html

    r = _result("tests/test_a.py::test_slow")
    section = html.test_section(0, r)
    assert "<h3>Where it went</h3>" in section and 'data-figure="parts"' in section
    svg = section.split('data-figure="parts"', 1)[1].split("</figure>", 1)[0]
    for label in ("tokenization", "llama.cpp prompt eval", "llama.cpp eval", "sampling", "outside llama.cpp"):
        assert label in svg
    assert "prefill: where the time went" in svg and "decode: where the time went" in svg
    assert "(moved)" in svg and "baseline" in svg and "now" in svg
    assert "<th>baseline (A)</th><th>now (B)</th>" in section
    assert section.count("<tr>") >= 1 + len(r.verdict.parts)  # type: ignore[union-attr]
    (sampling,) = [p for p in r.verdict.parts if p.metric == "sampling_ms_per_token"]  # type: ignore[union-attr]
    assert f'<span title="{html._e(sampling.source)}">{html._e(sampling.label)}</span>' in section  # its source
    assert "decode TPOT +8.8% (1.058..1.118): moved: outside llama.cpp" in section
    assert "Where it went" not in html.test_section(1, _plain("tests/test_a.py::test_b"))
    quiet = html.test_section(2, _unmoved("tests/test_a.py::test_same"))
    assert 'data-figure="parts"' in quiet and "no phase moved" in quiet
    ab = html.ab_section([_ab_entry()])
    assert 'data-figure="parts"' in ab and "<th>a (A)</th><th>b (B)</th>" in ab
    ids = re.findall(r'\bid="([^"]+)"', html.render_html([r, _unmoved("t2")], ab=[_ab_entry()]))
    assert len(ids) == len(set(ids))


def test_the_parts_chart_stacks_each_sides_parts() -> None:
    pytest.importorskip("matplotlib")
    from pytest_llmperf.reports import charts

    parts = _result("x").verdict.parts  # type: ignore[union-attr]
    fig = charts.parts_chart(parts, ("baseline", "now"))
    assert [ax.get_title() for ax in fig.axes] == ["prefill: where the time went", "decode: where the time went"]
    decode = fig.axes[1]
    bars = [b for b in decode.patches if b.get_facecolor()[3] > 0]  # the hatch overlay is unfilled
    mine = [p for p in parts if p.phase == "decode"]
    assert len(bars) == 2 * len(mine)
    a_total = sum(b.get_width() for b in bars if abs(b.get_y() + b.get_height() / 2) < 1e-9)
    assert a_total == pytest.approx(sum(p.a_median for p in mine))


# --- an inner session -------------------------------------------------------------------------


def test_a_regression_against_the_stored_baseline_shows_where_it_went_in_the_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real llama.cpp, a stored baseline made certain-faster (``outpace``) with half a TPOT less
    outside llama.cpp per token: the summary's block under the comparison table names the test,
    its decode line and the parts table, the time outside llama.cpp moved; within 80 columns."""
    import statistics

    from inner import busiest_baseline, outpace, run
    from test_plugin_baselines import SUITE, edit_baseline

    monkeypatch.setenv("COLUMNS", "80")
    pytester.makepyfile(test_suite=SUITE)
    run(pytester, "--llmperf-update-baselines", "-k", "test_decode").assert_outcomes(passed=1, deselected=1)

    def less_outside(entry: dict) -> None:
        half_tpot = statistics.median(entry["runs"]["tpot_ms"]) / 2
        parts = entry["parts"]
        parts["decode_outside_ms_per_token"] = [v - half_tpot for v in parts["decode_outside_ms_per_token"]]
        outpace(entry, 50.0)
        busiest_baseline(entry)

    edit_baseline(pytester, less_outside)
    result = run(pytester, "-k", "test_decode")
    result.assert_outcomes(failed=1)
    out = result.stdout.lines
    start = next(i for i, line in enumerate(out) if re.fullmatch(r"-+ llmperf where it went -+", line))
    assert any(re.fullmatch(r"-+ llmperf baseline comparison -+", line) for line in out[:start])
    block = []
    for line in out[start + 1 :]:
        if re.fullmatch(r"[-=]+ .* [-=]+", line) or line.startswith("llmperf: "):
            break
        block.append(line)
    assert block[0].startswith("test_decode (REGRESSION decode"), block
    assert all(len(line) <= 80 for line in block), "\n".join(block)
    at = next(i for i, line in enumerate(block) if re.match(r"  decode TPOT >?\+", line))  # >+9999% past that
    rest = itertools.takewhile(lambda line: line.startswith("    "), block[at + 1 :])  # its wrapped lines
    decode = " ".join([block[at], *(line.strip() for line in rest)])
    # A busy machine may slow llama.cpp's eval against the stored runs too: both then moved.
    assert re.search(r": moved: [^;]*outside llama\.cpp \+", decode), decode
    table = next(i for i, line in enumerate(block) if re.match(r"  decode \(ms/token\) +baseline  ", line))
    outside = next(line for line in block[table:] if line.startswith("  outside llama.cpp"))
    assert outside.endswith("moved")


# --- where llama.cpp's time went (an attribution pass's comparison, judge.attribution's JSON) --


def _slice(name: str, a_ms: float, b_ms: float, moved: bool) -> dict[str, Any]:
    """A slice as ``SliceChange.to_json`` writes it; one side lacking it has no ratio."""
    if not a_ms or not b_ms:
        return {"name": name, "a_ms": a_ms, "b_ms": b_ms, "ratio": None, "ci_low": None, "ci_high": None, "moved": True}
    ratio = b_ms / a_ms
    return {
        "name": name,
        "a_ms": a_ms,
        "b_ms": b_ms,
        "ratio": ratio,
        "ci_low": ratio * 0.97,
        "ci_high": ratio * 1.03,
        "moved": moved,
    }


def _attribution() -> dict[str, Any]:
    """``AttributionChange.to_json()``'s shape: decode's layer 3 and matrix multiplication moved,
    FLASH_ATTN_EXT only in A; prefill unchanged."""
    decode = {
        "layers": [_slice("layer 0", 1.0, 1.01, False), _slice("layer 3", 1.0, 1.4, True)],
        "groups": [_slice("matrix multiplication", 2.0, 2.5, True), _slice("attention", 0.5, 0.51, False)],
        "ops": [_slice("MUL_MAT", 2.0, 2.5, True), _slice("FLASH_ATTN_EXT", 0.3, 0.0, True)],
        "reading": "layer 3 +40.0%, the rest unchanged; matrix multiplication +25.0%, FLASH_ATTN_EXT only in A",
        "a_step_ms": 3.0,
        "b_step_ms": 3.5,
    }
    prefill = {
        "layers": [_slice("layer 0", 5.0, 5.0, False)],
        "groups": [],
        "ops": [],
        "reading": "no layer moved (blocks +0.0%); no op group moved",
        "a_step_ms": 5.0,
        "b_step_ms": 5.0,
    }
    return {
        "reason": "llama.cpp's decode time moved",
        "a": "a",
        "b": "b",
        "phases": {"prefill": prefill, "decode": decode},
        "cost": {},
        "sides": {},
    }


def test_the_attribution_reading_and_its_top_changes_are_rendered_where_it_went() -> None:
    entry = {**_ab_entry(), "attribution": _attribution()}
    (e,) = where.explained([], [entry])
    phases = {phase: (reading, rows) for phase, reading, rows in where.attribution_phases(e.attribution)}
    reading, rows = phases["decode"]
    assert reading.startswith("layer 3 +40.0%, the rest unchanged")
    assert [r[1] for r in rows] == ["matrix multiplication", "MUL_MAT", "layer 3", "FLASH_ATTN_EXT"]  # by ms moved
    assert rows[0][:5] == ["op group", "matrix multiplication", "2.00", "2.50", "1.25"]
    assert rows[-1][4] == "only in A" and rows[-1][5] == "n/a"
    assert phases["prefill"][0].startswith("no layer moved") and not phases["prefill"][1]
    block = where.terminal_lines([e], 80)
    assert all(len(line) <= 80 for line in block)
    assert "  Where llama.cpp's time went (llama.cpp's decode time moved): A a, B b" in block
    assert any(line.startswith("  decode: layer 3 +40.0%, the rest unchanged") for line in block)
    md = session_file.markdown([], ab=[entry])
    assert "- Where llama.cpp's time went (llama.cpp's decode time moved): A a, B b" in md
    assert "- decode: layer 3 +40.0%, the rest unchanged; matrix multiplication +25.0%" in md
    pytest.importorskip("matplotlib")
    from pytest_llmperf.reports import html

    page = html.ab_section([entry])
    block = page.split('<div class="attribution">', 1)[1]
    assert "<b>decode</b>: layer 3 +40.0%, the rest unchanged" in block
    assert "<th>slice</th><th>name</th><th>A ms</th><th>B ms</th><th>B/A</th>" in block
    assert "<td>layer 3</td>" in block and "<td>attention</td>" not in block
    assert html.attribution_html(None) == [] and 'class="attribution"' not in html.ab_section([_ab_entry()])
    alone = html.ab_section([{**entry, "parts": [], "why": []}])  # a pass without parts: its block alone
    assert 'class="attribution"' in alone and 'data-figure="parts"' not in alone


def test_a_verdicts_attribution_pass_reads_in_every_report(tiny_engine, tmp_path: Path) -> None:
    """Two real passes on the tiny model (``measuring.attribution``) compared as a verdict's
    ``attribution``: the terminal block has its readings, the HTML its table, the Markdown its
    lines, and the session file reads back the same."""
    from pytest_llmperf.core.workload import Workload
    from pytest_llmperf.judge.attribution import compare_attributions
    from pytest_llmperf.measuring.attribution import attribute

    workload = Workload(prompt_tokens=32, max_tokens=8, runs=5, warmup=1)
    change = compare_attributions(
        attribute(tiny_engine, workload),
        attribute(tiny_engine, workload),
        reason="asked",
        a_name="baseline",
        b_name="now",
    )
    r = _result("tests/test_a.py::test_slow")
    r = dataclasses.replace(r, verdict=dataclasses.replace(r.verdict, attribution=change))  # type: ignore[arg-type]
    (e,) = where.explained([r])
    assert e.attribution == change.to_json()
    decode = change.phase("decode").reading
    block = where.terminal_lines([e], 80)
    assert all(len(line) <= 80 for line in block)
    assert "  Where llama.cpp's time went (asked): A baseline, B now" in block
    assert " ".join(line.strip() for line in block).count(f"decode: {decode}") == 1
    assert f"- decode: {decode}" in session_file.markdown([r])
    path = tmp_path / "s.json"
    path.write_text(session_file.session_json([r], CREATED))
    (back,) = session_file.load_session(path)
    assert where.explained([back]) == [e]
    pytest.importorskip("matplotlib")
    from pytest_llmperf.reports import html

    section = html.test_section(0, back)
    assert "<h3>Where llama.cpp&#x27;s time went (asked): A baseline, B now</h3>" in section
    assert f"<b>decode</b>: {html._e(decode)}" in section


def test_why_a_due_pass_did_not_run_reads_where_its_readings_would() -> None:
    """An A/B whose pass was asked for on a side that cannot have one (a callable, an endpoint):
    its ``attribution_note`` takes the readings' place in the terminal block, the Markdown and
    the HTML."""
    note = "attribution: not run: side B is no in-process llama.cpp engine (a callable)"
    entry = {**_ab_entry(), "attribution": None, "attribution_note": note}
    (e,) = where.explained([], [entry])
    assert e.attribution is None and e.attribution_text() == [note]
    block = where.terminal_lines([e], 80)
    assert "  attribution: not run: side B is no in-process llama.cpp engine (a callable)" in block
    assert f"- {note}" in session_file.markdown([], ab=[entry])
    pytest.importorskip("matplotlib")
    from pytest_llmperf.reports import html

    assert f'<p class="attribution-note">{note}</p>' in html.ab_section([entry])
    assert "attribution-note" not in html.ab_section([_ab_entry()])
