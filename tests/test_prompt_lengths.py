"""Length-aware figures and pairing by request (issue 49 point 4): where a prompt set's runs have
different prompt lengths, TTFT and prefill per prompt-length bucket (each with its runs) and the
prefill per prompt token; a comparison against a stored baseline pairs the runs that sent the
same request, so the mix of lengths neither hides a change nor passes as one; the HTML report
draws TTFT against prompt length for both sides.

No timing is asserted: counts, structure, verdicts on hand-made records, and agreement with
llama.cpp's own counters."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from inner import run

from pytest_llmperf import LlamaCppEngine, Workload, measure
from pytest_llmperf.baselines.records import stored as record_of
from pytest_llmperf.core.formats import sig6
from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.core.workload import drawn, prompt_set_requests
from pytest_llmperf.judge.regression import CompareSettings, judge, request_pairs
from pytest_llmperf.judge.result import Outcome
from pytest_llmperf.judge.verdict import NoiseModel, Verdict
from pytest_llmperf.measuring.interleave import SideRuns
from pytest_llmperf.measuring.metrics import MAX_LENGTH_BUCKETS, diagnose, length_buckets, summarize, summarize_runs
from pytest_llmperf.reports import charts, record_charts
from pytest_llmperf.reports import html as html_report
from pytest_llmperf.reports.text import metrics_table
from pytest_llmperf.session.against import by_request

#: Four prompts of clearly different lengths (the tiny model's tokenizer: a few tokens a word).
REQUESTS = [{"prompt": " ".join(["word"] * n)} for n in (4, 30, 120, 300)]
W = Workload(prompt_set=prompt_set_requests(REQUESTS), max_tokens=4, runs=12, warmup=1)


@pytest.fixture(scope="module")
def measured(tiny_engine) -> object:
    return measure(tiny_engine, W)


def test_buckets_and_their_counts_from_a_real_run_over_a_set(tiny_engine, measured) -> None:
    m = measured
    lengths = [r.prompt_tokens for r in m.runs]
    assert lengths == [len(tiny_engine.prompt_ids(W.request(i))) for i in range(W.runs)]
    pl = m.prompt_lengths
    assert pl is not None and pl.n_runs == W.runs and pl.rule == "one bucket per prompt length"
    assert [(b.low_tokens, b.high_tokens) for b in pl.buckets] == [(n, n) for n in sorted(set(lengths))]
    assert {b.low_tokens: b.n_runs for b in pl.buckets} == Counter(lengths)
    for b in pl.buckets:
        ttfts = [r.ttft_ms for r in m.runs if r.prompt_tokens == b.low_tokens]
        assert b.ttft_p50_ms == pytest.approx(statistics.median(ttfts))
        assert min(ttfts) <= b.ttft_p95_ms <= max(ttfts)
        assert b.prefill_p50_ms is not None and 0 < b.prefill_p50_ms <= b.ttft_p50_ms
    # stored: each run's request and length (what pairing reads), the figures by length
    stored = record_of(m).to_json()
    assert stored["requests"] == {
        "request": [drawn(W.prompt_set, W.seed, i) for i in range(W.runs)],
        "prompt_tokens": lengths,
    }
    assert [b["n_runs"] for b in stored["prompt_lengths"]["buckets"]] == [b.n_runs for b in pl.buckets]
    assert Measurement.from_json(stored).to_json() == stored  # schema-checked, read and written again alike
    table = metrics_table(m)
    for b in pl.buckets:
        assert f"TTFT median / p95, prompt {b.low_tokens} tokens" in table and f"{b.n_runs} runs" in table
    assert "prefill per prompt token median" in table and "by prompt length: one bucket per prompt length" in table


def test_ms_per_prompt_token_agrees_with_llama_cpps_counters(tiny_engine) -> None:
    """The clock's prefill per prompt token against llama.cpp's own (NativeCounters' prefill_ms
    over its prefill_tokens): the clock's holds llama.cpp's and the little around it."""
    traces = [tiny_engine.run(W, i) for i in range(-1, W.runs)][1:]
    m = summarize(traces, W, tiny_engine.info())
    assert m.prompt_lengths is not None
    native = statistics.median(t.native.prefill_ms / t.native.prefill_tokens for t in traces if t.native)
    assert len(traces) == W.runs and all(t.native and t.native.prefill_tokens == t.prompt_tokens for t in traces)
    assert m.prompt_lengths.native_ms_per_prompt_token == pytest.approx(native)
    ours = m.prompt_lengths.ms_per_prompt_token
    assert ours is not None and 0.9 * native <= ours <= 1.5 * native  # the clock's: llama.cpp's and more
    slope = m.prompt_lengths.slope_ms_per_token
    assert slope is not None and slope > 0  # a longer prompt takes longer


def test_one_length_or_no_set_keeps_the_record_as_today(tiny_engine) -> None:
    plain = measure(tiny_engine, Workload(prompt_tokens=8, max_tokens=4, runs=3, warmup=0))
    assert plain.prompt_lengths is None
    stored = record_of(plain).to_json()
    assert "requests" not in stored and "prompt_lengths" not in stored
    one = Workload(prompt_set=prompt_set_requests([{"prompt": "a b c"}, {"prompt": "a b c"}]), max_tokens=4, runs=3)
    m = measure(tiny_engine, one)
    assert m.prompt_lengths is None  # one length: the measurement's own figures say it
    assert record_of(m).to_json()["requests"]["request"] == [drawn(one.prompt_set, 0, i) for i in range(3)]


def test_the_mix_of_lengths_is_no_instability(measured) -> None:
    """Runs as steady as can be within each length (TTFT and TPOT a function of the length) are
    steady: the stability figures read each run against its length's, not the mix's spread."""
    runs = tuple(
        dataclasses.replace(r, ttft_ms=0.1 * (r.prompt_tokens or 0), tpot_ms=1.0 + 0.001 * (r.prompt_tokens or 0))
        for r in measured.runs
    )
    m = summarize_runs(runs, W, measured.engine)
    assert statistics.pstdev(r.ttft_ms for r in runs) > 0  # the mix spreads them
    stability = diagnose(m)
    assert stability.ttft_cv == pytest.approx(0.0, abs=1e-12) and stability.tpot_cv == pytest.approx(0.0, abs=1e-12)
    assert not [w for w in stability.warnings if w.startswith("unstable")]


@given(st.lists(st.integers(min_value=1, max_value=200_000), min_size=1, max_size=200))
def test_the_bucket_rule_puts_every_length_in_exactly_one_bucket(lengths: list[int]) -> None:
    buckets = length_buckets(lengths)
    assert all(low <= high for low, high in buckets)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(buckets))  # ordered, disjoint
    for n in lengths:
        assert sum(low <= n <= high for low, high in buckets) == 1
    assert all(any(low <= n <= high for n in lengths) for low, high in buckets)  # none empty
    if len(set(lengths)) <= MAX_LENGTH_BUCKETS:
        assert buckets == tuple((n, n) for n in sorted(set(lengths)))
    else:  # one doubling each
        assert all(high == 2 * low - 1 and low & (low - 1) == 0 for low, high in buckets)


# -- pairing by request, on hand-made records ---------------------------------------------------

SET = prompt_set_requests([{"prompt": "x " * n} for n in (8, 60, 240, 800)])
TOKENS = (17, 121, 481, 1601)
#: A machine whose sessions vary by 1% (its history would say so): a 10% change is then decidable.
QUIET = CompareSettings(noise=NoiseModel(between_sd=0.01))


def hand_made(slower: float, seed: int, *, by_request: bool = True, n: int = 20) -> dict[str, object]:
    """A record of ``n`` runs of ``SET`` (run i sends ``drawn(SET, 0, i)``): TTFT grows with the
    prompt, decode a little; each run 3% noise; ``slower``: every request that much slower."""
    rng = np.random.default_rng(seed)
    sent = [drawn(SET, 0, i) for i in range(n)]
    length = np.asarray([TOKENS[r] for r in sent], dtype=float)

    def values(base: np.ndarray) -> list[float]:
        return [round(float(v), 5) for v in base * slower * np.exp(rng.normal(0.0, 0.03, n))]

    tpot = 0.8 + 0.0003 * length
    rec: dict[str, object] = {
        "workload": {"prompt_set": "sha256:abc", "seed": 0, "max_tokens": 4},
        "subject": {},
        "runs": {"ttft_ms": values(0.12 * length + 1.0), "tpot_ms": values(tpot), "itl_p95_ms": values(1.3 * tpot)},
    }
    if by_request:
        rec["requests"] = {"request": sent, "prompt_tokens": [TOKENS[r] for r in sent]}
    return rec


def verdicts(baseline: dict[str, object], candidate: dict[str, object]) -> dict[str, Verdict]:
    v = judge({"hw": Measurement.read(baseline)}, "hw", Measurement.read(candidate), QUIET)
    return {c.metric: c.verdict for c in v.comparisons if c.mirror_of is None}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_paired_slowdown_of_every_request_is_flagged(seed: int) -> None:
    got = verdicts(hand_made(1.0, 0), hand_made(1.10, seed))
    assert got["ttft_ms"] is Verdict.REGRESSION and got["tpot_ms"] is Verdict.REGRESSION


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_requests_in_the_same_order_unchanged_are_not_flagged(seed: int) -> None:
    got = verdicts(hand_made(1.0, 0), hand_made(1.0, seed))
    assert Verdict.REGRESSION not in got.values() and got["ttft_ms"] is Verdict.UNCHANGED


def test_unpaired_the_mix_hides_the_same_slowdown() -> None:
    """Records without their requests (today's) are compared as today: run values unpaired,
    where the spread of the mix leaves a 10% slowdown of every request undecided."""
    baseline, candidate = hand_made(1.0, 0, by_request=False), hand_made(1.10, 1, by_request=False)
    verdict = judge({"hw": Measurement.read(baseline)}, "hw", Measurement.read(candidate), QUIET)
    assert "run by run" not in verdict.note
    assert verdicts(baseline, candidate)["ttft_ms"] is not Verdict.REGRESSION
    paired = judge({"hw": Measurement.read(hand_made(1.0, 0))}, "hw", Measurement.read(hand_made(1.10, 1)), QUIET)
    assert "compared run by run over 20 runs that sent the same request" in paired.note


def test_only_runs_of_the_same_request_and_length_are_paired() -> None:
    baseline, candidate = hand_made(1.0, 0), hand_made(1.0, 1, n=12)
    assert request_pairs(Measurement.read(baseline), Measurement.read(candidate)) == tuple(
        range(12)
    )  # the shorter side's runs
    lengths = candidate["requests"]["prompt_tokens"]  # type: ignore[index]
    lengths[3] += 1  # a tokenizer that changed: that run's request is no longer the same prompt
    assert request_pairs(Measurement.read(baseline), Measurement.read(candidate)) == tuple(
        i for i in range(12) if i != 3
    )
    assert request_pairs(Measurement.read(baseline), Measurement.read(hand_made(1.0, 1, by_request=False))) == ()


def parted(slower: float, seed: int, *, by_request: bool = True) -> dict[str, object]:
    """``hand_made`` with its prefill's parts: tokenization (by length, the same every session),
    llama.cpp's prompt eval (the TTFT's change: ``slower`` is all there) and 1 ms outside it."""
    rec = hand_made(slower, seed, by_request=by_request)
    length = np.asarray([TOKENS[drawn(SET, 0, i)] for i in range(20)], dtype=float)
    ttft = np.asarray(rec["runs"]["ttft_ms"])  # type: ignore[index]
    tokenize = 0.002 * length
    rec["parts"] = {
        "tokenize_ms": tokenize.round(5).tolist(),
        "native_prefill_ms": (ttft - 1.0 - tokenize).round(5).tolist(),
        "prefill_outside_ms": [1.0] * 20,
    }
    return rec


def test_a_prompt_sets_parts_are_compared_on_the_same_requests() -> None:
    """Both records keep their requests: each part is compared pair by pair on the runs that sent
    the same request, so llama.cpp's prompt eval 10% slower on every request is the part that
    moved (over the whole mix its spread hides it) and the unchanged parts stay unchanged."""
    v = judge({"hw": Measurement.read(parted(1.0, 0))}, "hw", Measurement.read(parted(1.10, 1)), QUIET)
    assert {c.metric: c.verdict for c in v.comparisons}["ttft_ms"] is Verdict.REGRESSION
    parts = {p.metric: p for p in v.parts}
    eval_ = parts["native_prefill_ms"]
    assert eval_.moved and eval_.paired and (eval_.n_a, eval_.n_b) == (20, 20)
    assert eval_.ratio_low < 1.10 < eval_.ratio_high and eval_.ratio_low > 1.0
    assert not parts["tokenize_ms"].moved and not parts["prefill_outside_ms"].moved
    assert "moved: llama.cpp prompt eval x1.1" in next(line for line in v.why() if line.startswith("prefill"))
    # Records without their requests (today's): the parts unpaired over the mix, as before.
    old = judge(
        {"hw": Measurement.read(parted(1.0, 0, by_request=False))},
        "hw",
        Measurement.read(parted(1.10, 1, by_request=False)),
        QUIET,
    )
    assert old.parts and not any(p.paired or p.moved for p in old.parts)


# -- both sides of an in-process pairing: run i of each sends the same request -----------------


def side_runs(engine: LlamaCppEngine, workload: Workload) -> object:
    """One side of --llmperf-against as its process runs it (``SideRuns``), its controller's ops
    written ahead: the warm-up, then runs 0..n-1, then done."""
    ops = [{"op": "run", "index": i} for i in range(-1, workload.runs)] + [{"op": "done"}]
    side = SideRuns(io.BytesIO("".join(json.dumps(op) + "\n" for op in ops).encode()), io.BytesIO())
    m, _ = side.measure(engine, workload, "side", settings={}, max_runs=None, threads=None, slo={})
    return m


def test_both_sides_of_llmperf_against_send_the_same_request_at_each_run(tiny_model_path: Path, tiny_engine) -> None:
    other = LlamaCppEngine(tiny_model_path, threads=1, n_batch=64)
    try:
        a, b = side_runs(tiny_engine, W), side_runs(other, W)
    finally:
        other.close()
    lengths = [r.prompt_tokens for r in a.runs]
    assert lengths == [r.prompt_tokens for r in b.runs] and len(set(lengths)) > 1
    assert lengths == [len(tiny_engine.prompt_ids(W.request(i))) for i in range(W.runs)]


# -- the HTML chart -----------------------------------------------------------------------------


def test_the_chart_draws_both_sides_and_only_where_prompts_vary(measured) -> None:
    now = record_of(measured).to_json()
    assert "ttft-by-length" in [fig_id for fig_id, _, _ in record_charts.charts_for(Measurement.read(now))]
    base = json.loads(json.dumps(now))
    svg = charts.render(
        record_charts.ttft_by_length, Measurement.read(now), Measurement.read(base), {"ttft_p95_ms": 1000.0}
    )
    assert f"baseline ({W.runs} runs)" in svg and f"now ({W.runs} runs)" in svg and "prompt tokens" in svg
    assert "ttft-by-length" not in [
        fig_id for fig_id, _, _ in record_charts.charts_for(Measurement.read({**now, "prompt_lengths": None}))
    ]


SUITE = """
import pytest

@pytest.mark.llmperf(prompt_set={requests!r}, max_tokens=4, runs=6)
def test_set():
    pass
"""


def test_the_html_report_shows_ttft_against_prompt_length_for_both_sides(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE.format(requests=REQUESTS))
    run(pytester, "--llmperf-update-baselines").assert_outcomes(passed=1)
    # The chart is what this test is about: two sessions' noise on a busy machine (ITL p95 of
    # 3-token runs read +45% between two sessions of the same code) is the gate's tests' concern.
    wide = ("--llmperf-threshold=0.5", "--llmperf-tail-threshold=2.0")
    result = run(pytester, "--llmperf-html", "r.html", "--llmperf-json", "r.json", "-rP", *wide)
    result.assert_outcomes(passed=1)
    page = (pytester.path / "r.html").read_text(encoding="utf-8")
    assert "TTFT against prompt length, now vs baseline" in page
    assert "<th>by prompt length</th>" in page and "by prompt length: one bucket per prompt length" in page
    session = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    record = next(iter(session["results"]))["record"]
    n = record["summary"]["n_runs"]  # 6, or more where the verdict asked for more runs
    assert sum(b["n_runs"] for b in record["prompt_lengths"]["buckets"]) == n >= 6
    assert "baseline (6 runs)" in page and f"now ({n} runs)" in page
    result.stdout.fnmatch_lines(["*TTFT median / p95, prompt * tokens*"])


def test_against_ref_the_chart_draws_refs_runs_kept_in_the_decision(measured) -> None:
    """Under --llmperf-against neither side keeps a record: the decision's ``by_request`` (each
    side's runs of a prompt set, pair by pair) is what the HTML report draws, REF and this tree."""
    runs = {"A": measured.runs, "B": measured.runs[::-1]}  # two sides' runs, as the pairs hand them
    kept = by_request(W, runs)
    assert kept is not None and kept["request"] == [drawn(W.prompt_set, W.seed, i) for i in range(W.runs)]
    assert kept["REF"]["prompt_tokens"] == [r.prompt_tokens for r in measured.runs]
    assert kept["current"]["ttft_ms"] == [sig6(r.ttft_ms) for r in measured.runs[::-1]]
    assert by_request(Workload(prompt_tokens=8, runs=2), {"A": measured.runs[:2], "B": measured.runs[:2]}) is None
    test = "t.py::test_set"
    against = {"ref": "git:HEAD", "described": "git:HEAD (abc)", "decisions": [{"test": test, "by_request": kept}]}
    result = Outcome(test, budgets={"ttft_p95_ms": 1000.0})
    page = html_report.render_html([result], workers=1, against=json.loads(json.dumps(against)))
    assert "TTFT against prompt length, this tree vs REF" in page
    assert f"REF ({W.runs} runs)" in page and f"this tree ({W.runs} runs)" in page
    assert "TTFT against prompt length" not in html_report.render_html([result], workers=1, against={})
