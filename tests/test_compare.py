"""The statistics core: known answers on generated samples, Holm, determinism, A/A false alarms."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from pytest_llmperf.compare import (
    METRICS,
    Comparison,
    Verdict,
    compare_runs,
    compare_tail,
    decide,
    holm,
    lognormal_sigma,
    min_detectable_effect,
)

TPOT, DECODE_TPS, TTFT, TAIL = (METRICS[k] for k in ("tpot_ms", "decode_tps", "ttft_ms", "itl_p95_ms"))
ALPHA = 0.01


def lognormal(rng: np.random.Generator, median: float, cv: float, n: int) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, lognormal_sigma(cv), n))


def itl_runs(rng: np.random.Generator, n_runs: int, n_tokens: int, median: float = 12.0, run_cv: float = 0.03) -> list[list[float]]:
    """Per-run ITL samples: a run-level factor (machine state) times token-level noise."""
    return [
        list(lognormal(rng, median * math.exp(rng.normal(0.0, lognormal_sigma(run_cv))), 0.15, n_tokens))
        for _ in range(n_runs)
    ]


def runs(spec, base, cand, *, threshold=0.05, m=None, fail_unstable=False) -> Comparison:
    c = compare_runs(spec, base, cand, threshold=threshold, alpha=ALPHA)
    return decide([c], alpha=ALPHA, m=m, fail_unstable=fail_unstable)[0]


def test_metric_families() -> None:
    assert set(METRICS) == {"ttft_ms", "prefill_tps", "tpot_ms", "decode_tps", "itl_p95_ms"}
    assert {s.phase for s in METRICS.values()} == {"prefill", "decode"}
    assert [s.name for s in METRICS.values() if s.tail] == ["itl_p95_ms"]
    assert METRICS["decode_tps"].higher_is_better and not METRICS["tpot_ms"].higher_is_better
    assert METRICS["prefill_tps"].phase == "prefill" and METRICS["itl_p95_ms"].phase == "decode"


def test_identical_samples_are_unchanged() -> None:
    base = lognormal(np.random.default_rng(1), 6.5, 0.03, 10)
    c = runs(TPOT, base, base, m=100)
    assert c.verdict is Verdict.UNCHANGED
    assert c.ratio == 1.0 and c.ci_low <= 1.0 <= c.ci_high
    assert c.p_value >= 0.5 and c.p_adjusted == 1.0
    constant = runs(TPOT, [5.0] * 6, [5.0] * 6)
    assert constant.verdict is Verdict.UNCHANGED and constant.p_value == 1.0


def test_clear_slowdown_is_a_regression() -> None:
    rng = np.random.default_rng(2)
    base, cand = lognormal(rng, 6.5, 0.03, 10), lognormal(rng, 6.5 * 1.2, 0.03, 10)
    c = runs(TPOT, base, cand, m=100)
    assert c.verdict is Verdict.REGRESSION and c.failed
    assert c.ci_low > 1.0 and 1.1 < c.ratio < 1.3 and c.change_pct > 10
    assert c.p_adjusted < ALPHA and c.p_adjusted == pytest.approx(100 * c.p_value)
    assert (c.n_baseline, c.n_candidate, c.phase) == (10, 10, "decode")


def test_speed_up_is_an_improvement() -> None:
    rng = np.random.default_rng(3)
    base, cand = lognormal(rng, 6.5, 0.03, 10), lognormal(rng, 6.5 / 1.2, 0.03, 10)
    c = runs(TPOT, base, cand, m=20)
    assert c.verdict is Verdict.IMPROVED and not c.failed
    assert c.ci_high < 1.0 and c.p_value > 0.5 and c.p_adjusted_better < ALPHA


def test_throughput_direction() -> None:
    rng = np.random.default_rng(4)
    base, slower = lognormal(rng, 150.0, 0.03, 10), lognormal(rng, 150.0 / 1.2, 0.03, 10)
    c = runs(DECODE_TPS, base, slower)
    assert c.verdict is Verdict.REGRESSION and c.ratio < 1.0 and c.ci_high < 1.0
    assert c.line().startswith("decode regression: decode TPS")
    assert runs(DECODE_TPS, slower, base).verdict is Verdict.IMPROVED
    # decode TPS = 1000 / TPOT: the rank test gives both the same p-value.
    tpot = runs(TPOT, 1000.0 / base, 1000.0 / slower)
    assert tpot.verdict is Verdict.REGRESSION and tpot.p_value == pytest.approx(c.p_value)


def test_significant_but_negligible_is_unchanged() -> None:
    rng = np.random.default_rng(5)
    base, cand = lognormal(rng, 6.5, 0.005, 20), lognormal(rng, 6.5 * 1.01, 0.005, 20)
    c = runs(TPOT, base, cand)
    assert c.p_adjusted < ALPHA and c.ci_high < 1.05
    assert c.verdict is Verdict.UNCHANGED and "negligible" in c.reason


def test_high_cv_is_unstable_unless_asked() -> None:
    rng = np.random.default_rng(6)
    noisy = runs(TPOT, lognormal(rng, 6.5, 0.15, 10), lognormal(rng, 6.5, 0.15, 10))
    assert noisy.verdict is Verdict.UNSTABLE and "CV" in noisy.reason and not noisy.failed
    base, cand = lognormal(rng, 6.5, 0.15, 20), lognormal(rng, 6.5 * 2, 0.15, 20)
    assert runs(TPOT, base, cand).verdict is Verdict.UNSTABLE
    assert "would be REGRESSION" in runs(TPOT, base, cand).reason
    assert runs(TPOT, base, cand, fail_unstable=True).verdict is Verdict.REGRESSION


def test_two_runs_are_insufficient() -> None:
    c = runs(TPOT, [6.5, 6.6], [9.0, 9.1])
    assert c.verdict is Verdict.INSUFFICIENT
    assert "p-value floor" in c.reason and c.p_floor == pytest.approx(1 / 6)
    assert "need >= 5 runs a side" in c.reason
    # Holm over a session of 100 comparisons needs a lower floor: 6 runs a side are not enough.
    rng = np.random.default_rng(7)
    six = runs(TPOT, lognormal(rng, 6.5, 0.03, 6), lognormal(rng, 6.5, 0.03, 6), m=100)
    assert six.verdict is Verdict.INSUFFICIENT and "need >= 8 runs a side" in six.reason


def test_invalid_values_are_rejected() -> None:
    with pytest.raises(ValueError):
        compare_runs(TPOT, [], [1.0], threshold=0.05, alpha=ALPHA)
    with pytest.raises(ValueError):
        compare_runs(TPOT, [1.0, float("nan")], [1.0, 2.0], threshold=0.05, alpha=ALPHA)


def tail(base, cand, *, m=None) -> Comparison:
    c = compare_tail(TAIL, base, cand, q=0.95, threshold=0.10, alpha=ALPHA)
    return decide([c], alpha=ALPHA, m=m)[0]


def test_tail_regression_and_null() -> None:
    rng = np.random.default_rng(8)
    base = itl_runs(rng, 8, 63)
    slow = tail(base, itl_runs(rng, 8, 63, median=12.0 * 1.25))
    assert slow.verdict is Verdict.REGRESSION and slow.ci_low > 1.0
    assert slow.baseline_value == pytest.approx(np.quantile(np.concatenate(base), 0.95))
    assert slow.n_tokens_baseline == 8 * 63 and slow.quantile == 0.95
    same = tail(base, itl_runs(rng, 8, 63))
    assert same.verdict is Verdict.UNCHANGED and same.p_value > 0.01


def test_tail_with_few_tokens_is_insufficient() -> None:
    rng = np.random.default_rng(9)
    c = tail(itl_runs(rng, 5, 30), itl_runs(rng, 5, 30, median=20.0))
    assert c.verdict is Verdict.INSUFFICIENT
    assert "too few tokens" in c.reason and "150 ITL samples" in c.reason


def test_tail_cluster_resampling_sees_run_level_shifts() -> None:
    # Tokens of a run share its state: with strong run-to-run variation the pooled p95 moves
    # a lot by chance, which resampling runs (unlike resampling tokens) reflects.
    rng = np.random.default_rng(10)
    ps = [tail(itl_runs(rng, 10, 63, run_cv=0.08), itl_runs(rng, 10, 63, run_cv=0.08)).p_value for _ in range(30)]
    assert min(ps) > 1e-3


def test_deterministic() -> None:
    rng = np.random.default_rng(11)
    base, cand = lognormal(rng, 6.5, 0.04, 12), lognormal(rng, 6.8, 0.04, 12)
    assert compare_runs(TPOT, base, cand, threshold=0.05, alpha=ALPHA) == compare_runs(
        TPOT, list(base), list(cand), threshold=0.05, alpha=ALPHA
    )
    b_runs, c_runs = itl_runs(rng, 10, 63), itl_runs(rng, 10, 63, median=12.5)  # Monte Carlo path
    first = compare_tail(TAIL, b_runs, c_runs, threshold=0.10, alpha=ALPHA)
    assert first == compare_tail(TAIL, b_runs, c_runs, threshold=0.10, alpha=ALPHA)
    assert decide([first], alpha=ALPHA, m=5) == decide([first], alpha=ALPHA, m=5)


def test_holm_hand_computed() -> None:
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, max(0.06, 0.04*1) = 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    # two more comparisons not seen yet: multipliers 6, 5, 4, 3
    assert holm([0.01, 0.04, 0.03, 0.005], m=6) == pytest.approx([0.05, 0.12, 0.12, 0.03])
    with pytest.raises(ValueError):
        holm([0.1, 0.2], m=1)


def test_holm_bound_for_unseen_comparisons() -> None:
    """With m > len, the result bounds the final adjustment whatever the unseen p-values are."""
    rng = np.random.default_rng(12)
    for _ in range(500):
        seen = list(rng.uniform(0, 0.05, rng.integers(1, 6)) ** rng.uniform(1, 3))
        unseen = list(rng.uniform(0, 1, rng.integers(0, 6)) ** rng.uniform(0.2, 4))
        m = len(seen) + len(unseen)
        bound = holm(seen, m=m)
        final = holm(seen + unseen)[: len(seen)]
        assert all(f <= b + 1e-12 for f, b in zip(final, bound))
        assert holm(seen + [1.0] * len(unseen))[: len(seen)] == pytest.approx(bound)


def test_decide_uses_the_family() -> None:
    rng = np.random.default_rng(13)
    base, cand = lognormal(rng, 6.5, 0.03, 8), lognormal(rng, 6.5 * 1.08, 0.03, 8)
    c = compare_runs(TPOT, base, cand, threshold=0.05, alpha=ALPHA)
    assert c.p_adjusted is None and c.verdict is Verdict.REGRESSION  # provisional, m = 1
    assert decide([c], alpha=ALPHA, m=1)[0].verdict is Verdict.REGRESSION
    big = decide([c], alpha=ALPHA, m=1000)[0]
    assert big.verdict is Verdict.INSUFFICIENT and big.p_adjusted == pytest.approx(min(1.0, 1000 * c.p_value))
    no_p = dataclasses.replace(c, p_value=None, reason="engine gave no values")
    out = decide([no_p, c], alpha=ALPHA)
    assert out[0].verdict is Verdict.INSUFFICIENT and out[0].p_adjusted is None
    assert out[1].p_adjusted == pytest.approx(c.p_value)


def test_line_format() -> None:
    c = Comparison(
        metric="tpot_ms", label="TPOT", phase="decode", unit="ms", higher_is_better=False, threshold=0.05,
        baseline_value=6.52, candidate_value=7.41, ratio=1.136, ci_low=1.098, ci_high=1.172,
        p_value=4e-6, p_value_better=1.0, p_floor=5.4e-6, n_baseline=10, n_candidate=10,
        cv_baseline=0.02, cv_candidate=0.03, verdict=Verdict.REGRESSION, reason="", p_adjusted=0.0004,
    )
    assert c.line() == (
        "decode regression: TPOT 7.41 ms vs 6.52 ms baseline "
        "(+13.6%, 95% CI +9.8..+17.2%, p=0.0004 Holm, 10 vs 10 runs)"
    )
    assert c.change_pct == pytest.approx(13.6)
    tps = dataclasses.replace(c, metric="decode_tps", label="decode TPS", unit="t/s", higher_is_better=True,
                              baseline_value=153.4, candidate_value=135.0, ratio=0.88, ci_low=0.85, ci_high=0.91)
    assert tps.line().startswith("decode regression: decode TPS 135.0 t/s vs 153.4 t/s baseline (-12.0%, 95% CI -15.0..-9.0%")
    raw = dataclasses.replace(c, p_adjusted=None, verdict=Verdict.INSUFFICIENT, reason="p-value floor: ...")
    assert "p=4.0e-06," in raw.line() and raw.line().endswith("10 vs 10 runs): p-value floor: ...")


def test_min_detectable_effect() -> None:
    mde = min_detectable_effect(20, 0.03, alpha=ALPHA, m=100, n_sim=500)
    assert 0.03 < mde < 0.07
    assert min_detectable_effect(30, 0.03, alpha=ALPHA, m=100, n_sim=500) < mde
    assert min_detectable_effect(20, 0.05, alpha=ALPHA, m=100, n_sim=500) > mde
    assert math.isinf(min_detectable_effect(5, 0.03, alpha=ALPHA, m=100))


def test_aa_sessions_false_alarm_rate() -> None:
    """A/A sessions of 20 tests at the default settings: at most 1% raise a false REGRESSION.

    Each test compares TPOT, TTFT and the ITL p95 tail of two samples from one distribution
    (10 vs 10 runs, CV 3%), decided with Holm over the session's 100 comparisons (the
    throughput twins of TPOT and TTFT, same p-values, raise a false alarm only with them).
    Seeded: the count is fixed, so the test cannot flake.
    """
    rng = np.random.default_rng(2024)
    sessions, alarms, improved = 60, 0, 0
    for _ in range(sessions):
        comparisons = []
        for _ in range(20):
            for spec, median in ((TPOT, 6.5), (TTFT, 80.0)):
                base, cand = lognormal(rng, median, 0.03, 10), lognormal(rng, median, 0.03, 10)
                comparisons.append(compare_runs(spec, base, cand, threshold=0.05, alpha=ALPHA))
            comparisons.append(
                compare_tail(TAIL, itl_runs(rng, 10, 63), itl_runs(rng, 10, 63), threshold=0.10, alpha=ALPHA)
            )
        verdicts = [c.verdict for c in decide(comparisons, alpha=ALPHA, m=100)]
        alarms += Verdict.REGRESSION in verdicts
        improved += Verdict.IMPROVED in verdicts
    assert alarms <= 0.01 * sessions
    assert improved <= 0.01 * sessions
