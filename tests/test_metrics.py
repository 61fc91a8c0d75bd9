"""Metrics and budgets on hand-made traces with known answers."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pytest_llmperf import EngineInfo, NativeCounters, RunTrace, Workload, check_budgets, summarize
from pytest_llmperf.measuring.metrics import latency_stats, run_metrics

MS = 1_000_000  # ns


def trace(
    ttft_ms: float,
    gaps_ms: list[float],
    prompt_tokens: int = 10,
    prefill_ms: float | None = None,
    tokenize_ms: float = 0.0,
    native: NativeCounters | None = None,
) -> RunTrace:
    start = 1_000 * MS
    tokens = [start + int(ttft_ms * MS)]
    for gap in gaps_ms:
        tokens.append(tokens[-1] + int(gap * MS))
    return RunTrace(
        start_ns=start,
        prefill_done_ns=None if prefill_ms is None else start + int(prefill_ms * MS),
        token_ns=tuple(tokens),
        prompt_tokens=prompt_tokens,
        tokenize_ns=int(tokenize_ms * MS),
        native=native,
    )


def test_run_metrics_definitions() -> None:
    native = NativeCounters(prefill_ms=19.0, prefill_tokens=10, decode_ms=3 * 1.9, decode_tokens=3)
    r = run_metrics(trace(20.0, [1.0, 2.0, 3.0], prefill_ms=19.5, tokenize_ms=0.5, native=native))
    assert r.output_tokens == 4
    assert r.tokenize_ms == pytest.approx(0.5)
    assert r.ttft_ms == pytest.approx(20.5)  # tokenization counts: the caller waits for it
    assert r.e2e_ms == pytest.approx(26.5)
    assert r.tpot_ms == pytest.approx(2.0)  # (E2E - TTFT) / (n - 1)
    assert r.decode_tps == pytest.approx(500.0)
    assert r.itl_ms == pytest.approx((1.0, 2.0, 3.0))
    assert r.itl_p50_ms == pytest.approx(2.0)
    assert r.prefill_ms == pytest.approx(19.5)
    assert r.prefill_tps == pytest.approx(10 / 19.5 * 1000)
    assert r.native_decode_ms_per_token == pytest.approx(1.9)
    assert r.overhead_ms_per_token == pytest.approx(0.1)


def test_engine_overhead_is_never_below_zero_and_the_gap_is_said() -> None:
    """llama.cpp's decode counters above the clock's TPOT (2.0 ms): the overhead is 0, not
    -0.5 ms/token, and the decode part's clock gap says by how much."""
    native = NativeCounters(prefill_ms=19.0, prefill_tokens=10, decode_ms=3 * 2.5, decode_tokens=3)
    r = run_metrics(trace(20.0, [1.0, 2.0, 3.0], prefill_ms=19.5, native=native))
    assert r.overhead_ms_per_token == 0.0 and r.decode_outside_ms_per_token == 0.0
    assert dict(r.clock_gaps)["decode_outside_ms_per_token_gap"] == pytest.approx(0.5)


def test_one_token_is_not_a_run() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        run_metrics(trace(5.0, []))


def test_latency_stats_percentiles_interpolate() -> None:
    s = latency_stats(list(range(1, 101)))
    assert s.count == 100
    assert s.p50_ms == pytest.approx(50.5)
    assert s.p95_ms == pytest.approx(95.05)
    assert s.p99_ms == pytest.approx(99.01)
    assert s.min_ms == 1 and s.max_ms == 100
    assert s.cv == pytest.approx(np.std(range(1, 101), ddof=1) / 50.5)


def measurement(runs: int = 3):
    traces = [trace(10.0 + i, [1.0] * 9 + [5.0], prefill_ms=9.0) for i in range(runs)]
    return summarize(traces, Workload(max_tokens=11, runs=runs), EngineInfo(engine="test", model="m"))


def test_summary_medians_and_pooling() -> None:
    m = measurement()
    assert m.n_runs == 3
    assert m.ttft_ms == pytest.approx(11.0)
    assert m.itl.count == 30  # 10 gaps x 3 runs, pooled
    assert m.itl.p50_ms == pytest.approx(1.0)
    assert m.itl.max_ms == pytest.approx(5.0)
    assert m.tpot_ms == pytest.approx(1.4)
    assert m.output_tokens == 11


def test_measurement_is_json_serializable() -> None:
    data = json.loads(json.dumps(measurement().to_dict()))
    assert data["itl"]["count"] == 30
    assert len(data["runs"]) == 3


def test_budgets_pass_and_fail_with_message() -> None:
    m = measurement()
    assert check_budgets(m, {"p50_ms": 2.0, "min_tps": 100.0, "ttft_ms": 50}) is None
    failure = check_budgets(m, {"p99_ms": 1.0, "min_tps": 10_000.0, "ttft_ms": 50})
    assert failure is not None
    assert [b.key for b in failure.breaches] == ["p99_ms", "min_tps"]
    line = failure.as_longrepr()
    assert line.startswith("decode ITL p99 ")
    # 30 tokens bound a p99 from below only: the line names the sample it would take.
    assert re.search(
        r"ms > budget 1\.00 ms \(95% CI [\d.]+\.\.\+inf, 30 tokens, 3 runs; 30 tokens cannot estimate a p99 at "
        r"95% \(about 368 bound it\)\)",
        line,
    ), line
    # 3 runs cannot bound a median at 95%: the value decides, and the line says so.
    assert (
        "decode TPS median 714 t/s < budget 10000 t/s (3 runs; 3 runs cannot estimate a median at 95% (about 6 "
        "bound it): its value decides)" in line
    ), line


def test_budget_on_unmeasured_statistic_fails_clearly() -> None:
    traces = [trace(10.0, [1.0, 1.0])]  # no prefill reading: a plain token stream
    m = summarize(traces, Workload(runs=1), EngineInfo(engine="callable", model="m"))
    failure = check_budgets(m, {"min_prefill_tps": 1.0})
    assert failure is not None
    assert "prefill TPS median was not measured by this engine" in failure.as_longrepr()


def test_preemptions_with_no_other_process_are_the_engines_own_threads() -> None:
    """Involuntary switches while other processes used none of the CPUs: the engine's threads took
    turns with each other (more threads than cores), not "other processes took these cores"."""
    from pytest_llmperf.core.measurement import SystemDelta, SystemSample
    from pytest_llmperf.measuring.metrics import likely_causes

    def delta(others_ticks: int) -> SystemDelta:
        before = SystemSample(0.1, None, 0, 0, 0, cpu_ticks=(0, 0), busy_ticks=(0, 0, 0))
        after = SystemSample(0.1, None, 0, 0, 43, cpu_ticks=(0, 1000), busy_ticks=(600 + others_ticks, 590, 10))
        return SystemDelta(before, after)

    alone = likely_causes(delta(0))
    assert alone == [
        "43 involuntary context switches while no other process used the CPUs (the engine's own threads "
        "outnumber the cores)"
    ]
    assert likely_causes(delta(300)) == ["43 involuntary context switches (other processes took these cores)"]
