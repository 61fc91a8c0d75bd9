"""The two levels of ``--llmperf-against``'s pairs (issue 50): process pairs, and the pairs of runs
within them. Properties of the two-level CI (``judge.paired.two_level_ci``: Student's t over the process
pairs' locations) and of the
levels' sds (``judge.paired.levels``) for any log ratios a session can give, and what it changes:
with a between-process offset of 1.5% over 2 process pairs, the single-level CI excludes 1 and the
two-level one does not. Seeded; nothing timed."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_llmperf.judge.paired import (
    PAIRS_PER_PROCESS,
    POCOCK_95,
    Levels,
    hodges_lehmann,
    judged_pairs,
    levels,
    location_ci,
    look,
    needs_more_pairs,
    pairs_per_process,
    repeated_level,
    two_level_ci,
)
from pytest_llmperf.judge.rule import JUDGED
from pytest_llmperf.judge.verdict import CI_LEVEL, Verdict
from pytest_llmperf.session.against import held_by_budget, looks_for

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: A pair's log ratio B/A: from identical to a thousandfold either way.
log_ratio = st.floats(min_value=-7.0, max_value=7.0, allow_nan=False, allow_infinity=False)
#: 2 to 5 process pairs, 1 to 20 pairs each (unequal: a process pair added at a later look has fewer).
process_pairs = st.lists(st.lists(log_ratio, min_size=1, max_size=20), min_size=2, max_size=5)


def _arrays(parts: list[list[float]]) -> list[np.ndarray]:
    return [np.asarray(p, dtype=float) for p in parts]


@SETTINGS
@given(parts=process_pairs)
def test_the_ci_holds_the_estimate_and_is_finite(parts) -> None:
    t = two_level_ci(_arrays(parts))
    assert all(math.isfinite(x) for x in (t.estimate, t.low, t.high, t.se))
    assert t.low <= t.estimate <= t.high
    assert t.se >= 0
    assert 0.0 <= t.greater <= 1.0 and 0.0 <= t.less <= 1.0
    assert t.df == len(parts) - 1
    locations = [float(np.median([(x + y) / 2 for i, x in enumerate(p) for y in p[i:]])) for p in parts]
    assert math.isclose(t.estimate, float(np.mean(locations)), abs_tol=1e-9)  # each process pair weighs alike


@SETTINGS
@given(parts=process_pairs, shift=st.floats(min_value=-1.0, max_value=1.0))
def test_a_shift_of_every_pair_shifts_the_ci(parts, shift) -> None:
    """The same resamples (seeded): B uniformly slower by ``shift`` moves estimate and bounds by it."""
    a = two_level_ci(_arrays(parts))
    b = two_level_ci([p + shift for p in _arrays(parts)])
    for x, y in ((a.estimate, b.estimate), (a.low, b.low), (a.high, b.high)):
        assert math.isclose(y, x + shift, abs_tol=1e-9)


@SETTINGS
@given(parts=process_pairs)
def test_swapping_the_sides_turns_the_ci_over(parts) -> None:
    a = two_level_ci(_arrays(parts))
    b = two_level_ci([-p for p in _arrays(parts)])
    assert math.isclose(b.estimate, -a.estimate, abs_tol=1e-9)
    assert math.isclose(b.low, -a.high, abs_tol=1e-9) and math.isclose(b.high, -a.low, abs_tol=1e-9)


@SETTINGS
@given(parts=process_pairs)
def test_the_same_pairs_give_the_same_ci(parts) -> None:
    assert two_level_ci(_arrays(parts)) == two_level_ci(_arrays(parts))


@SETTINGS
@given(parts=process_pairs)
def test_the_levels_sds_are_finite_and_not_negative(parts) -> None:
    d = np.concatenate(_arrays(parts))
    groups = [g for g, p in enumerate(parts) for _ in p]
    got = levels("tpot_ms", d, groups)
    assert got.process_pairs == len(parts) and got.pairs == d.size
    assert got.between_sd >= 0 and got.within_sd >= 0 and 0.0 <= got.share <= 1.0
    assert "process pairs" in got.line() and len(got.line()) < 300


def test_process_pairs_alike_have_no_between_level() -> None:
    part = [0.01, -0.02, 0.005, 0.0, 0.015]
    got = levels("tpot_ms", np.array(part * 3), [0] * 5 + [1] * 5 + [2] * 5)
    assert got.between_sd == 0.0 and got.within_sd > 0


def test_an_offset_between_processes_is_the_between_level() -> None:
    rng = np.random.default_rng(7)
    parts = [rng.normal(mu, 0.005, 40) for mu in (0.02, -0.02, 0.02, -0.02)]
    got = levels("tpot_ms", np.concatenate(parts), [g for g in range(4) for _ in range(40)])
    assert 0.015 < got.between_sd < 0.03 and got.within_sd < 0.007 and got.share > 0.9


def _synthetic(offsets: tuple[float, ...], n: int = 20, within_sd: float = 0.01, seed: int = 50) -> list[np.ndarray]:
    """Per process pair, ``n`` pairs' log ratios of unchanged code: the process pair's offset
    (its processes' placement) plus each pair's own noise."""
    rng = np.random.default_rng(seed)
    return [rng.normal(math.log1p(off), within_sd, n) for off in offsets]


def test_an_offset_of_one_and_a_half_percent_between_two_process_pairs() -> None:
    """Unchanged code whose two process pairs differ by 1.5% (one at +1.5%, one at 0): pairs
    within a pair of processes cannot see that offset, and their CI excludes 1 (a false
    statement); the two-level CI holds 1."""
    parts = _synthetic((0.015, 0.0))
    _, low, _ = location_ci(np.concatenate(parts))
    assert low > 0.0  # the old single-level CI: "slower", for unchanged code
    t = two_level_ci(parts)
    assert t.low < 0.0 < t.high


def _runs(values: np.ndarray) -> list[SimpleNamespace]:
    return [SimpleNamespace(**{s.name: v for s in JUDGED}, decode_tps=1 / v, prefill_tps=1 / v) for v in values]


def test_the_offset_is_no_regression_at_a_1_percent_threshold() -> None:
    """The same session judged at ``--llmperf-threshold=1%``: one level calls unchanged code
    slower (its CI above 1); the two levels hold 1, and no REGRESSION."""
    parts = _synthetic((0.015, 0.0))
    b = np.exp(np.concatenate(parts)) * 10.0
    a = np.full(b.size, 10.0)
    groups = [0] * 20 + [1] * 20
    judging = {"alpha": 0.01, "threshold": 0.01, "tail_threshold": 0.01, "family": 3}
    one = {c.metric: c for c in judged_pairs(_runs(a), _runs(b), **judging)}
    two = {c.metric: c for c in judged_pairs(_runs(a), _runs(b), **judging, groups=groups)}
    assert one["tpot_ms"].ci_low > 1.0
    assert two["tpot_ms"].verdict is not Verdict.REGRESSION
    assert two["tpot_ms"].ci_low < 1.0 < two["tpot_ms"].ci_high


def test_a_change_every_process_pair_shows_is_still_found() -> None:
    """+4% in six process pairs (each with its own offset of up to 0.5%): the two-level CI lies
    above 1. Two process pairs cannot say it: one degree of freedom of the offsets (t = 12.7)."""
    parts = _synthetic((0.045, 0.035, 0.04, 0.042, 0.038, 0.036))
    assert two_level_ci(parts).low > 0.0
    assert two_level_ci(parts[:2]).low < 0.0


def test_the_ci_over_process_pairs_covers_their_offsets() -> None:
    """Calibration of the model alone: unchanged code over 10 process pairs of 4 pairs, offsets
    of sd 0.75% and pairs of sd 1.4% (the decode levels measured on this machine): the 95% CI
    holds 1 in 95% of 2000 seeded sessions (within the binomial's spread), where the pairs' own
    test of 40 pairs on one process pair (one process per side) holds it in about half."""
    rng = np.random.default_rng(50)
    held = own = 0
    sessions = 2000
    for _ in range(sessions):
        t = two_level_ci([rng.normal(rng.normal(0.0, 0.0075), 0.014, 4) for _ in range(10)])
        held += t.low <= 0.0 <= t.high
        _, low, high = location_ci(rng.normal(rng.normal(0.0, 0.0075), 0.014, 40))
        own += low <= 0.0 <= high
    assert 0.93 * sessions <= held <= 0.97 * sessions
    assert own < 0.6 * sessions


@SETTINGS
@given(parts=process_pairs, looks=st.integers(1, 6))
def test_grouped_paired_judgement_never_raises(parts, looks) -> None:
    b = np.exp(np.concatenate(_arrays(parts)))
    groups = [g for g, p in enumerate(parts) for _ in p]
    for c in judged_pairs(
        _runs(np.ones(b.size)),
        _runs(b),
        alpha=0.01,
        threshold=0.01,
        tail_threshold=0.1,
        family=3,
        looks=looks,
        groups=groups,
    ):
        assert isinstance(c.verdict, Verdict) and math.isfinite(c.ratio) and c.ratio > 0
        assert c.ci_low is not None and c.ci_high is not None and c.ci_low <= c.ratio <= c.ci_high
        assert len(c.line()) < 1000


@given(
    between=st.floats(0.0, 0.05),
    within=st.floats(0.0, 0.05),
    start_s=st.floats(0.0, 60.0),
    pair_s=st.floats(0.01, 30.0),
)
def test_the_pairs_per_process_pair_follow_the_costs_and_levels(between, within, start_s, pair_s) -> None:
    """Kalibera & Jones' optimum within its range: more pairs per process pair where a start-up
    costs more or the pairs are noisier, fewer where the processes' offsets are larger."""
    low, high = PAIRS_PER_PROCESS
    one = Levels("tpot_ms", 4, 20, between, within)
    n = pairs_per_process([one], start_s, pair_s)
    assert low <= n <= high
    assert pairs_per_process([one], start_s * 4, pair_s) >= n
    assert pairs_per_process([Levels("tpot_ms", 4, 20, between * 2, within)], start_s, pair_s) <= n
    assert pairs_per_process([], start_s, pair_s) == high  # nothing measured: the fewest process pairs
    # the decode levels measured here (sd 0.75% between, 1.4% within; 3.3 s a start, 0.95 s a pair)
    assert pairs_per_process([Levels("tpot_ms", 4, 20, 0.0075, 0.014)], 3.3, 0.95) == 3


def test_at_the_budget_a_comparison_more_pairs_could_move_is_inconclusive() -> None:
    """The process budget stopped the pairs: what was not decided yet says so, and what can
    decide it (never a silent cap); the rest is left as it was."""
    parts = _synthetic((0.02, -0.02), n=10, within_sd=0.002)
    b = np.exp(np.concatenate(parts)) * 10.0
    comparisons = judged_pairs(
        _runs(np.full(b.size, 10.0)),
        _runs(b),
        alpha=0.01,
        threshold=0.01,
        tail_threshold=0.01,
        family=3,
        groups=[0] * 10 + [1] * 10,
    )
    tpot = next(c for c in comparisons if c.metric == "tpot_ms")
    assert tpot.verdict is Verdict.INCONCLUSIVE and "pairs would decide it" in tpot.reason  # on fresh process pairs
    undecided = {c.metric for c in comparisons if needs_more_pairs(c) or c.verdict is Verdict.INCONCLUSIVE}
    held = held_by_budget(comparisons, "the budget of 2 process pairs (max_processes) reached")
    for before, after in zip(comparisons, held):
        if before.metric in undecided or before.mirror_of in undecided:
            assert after.verdict is Verdict.INCONCLUSIVE and "raise max_processes" in after.reason
        else:
            assert after == before
    settled = judged_pairs(
        _runs(np.full(20, 10.0)),
        _runs(np.full(20, 10.0) * 1.5),
        alpha=0.01,
        threshold=0.01,
        tail_threshold=0.01,
        family=3,
        groups=[0] * 10 + [1] * 10,
    )
    assert held_by_budget(settled, "x") == settled  # REGRESSIONs beyond the threshold: nothing held


def test_two_levels_are_never_bolder_than_the_pairs_own_test() -> None:
    """10 pairs over 2 process pairs, every one 30% slower: the bootstrap alone would call it at
    once, but the signed-rank test's floor (2^-10 at 10 pairs, Holm over 3 at alpha / 6 looks)
    keeps the first look from a REGRESSION, as with one process pair; the CI spans the pairs' own."""
    b = np.exp(np.concatenate(_synthetic((0.30, 0.28), n=5, within_sd=0.01)))
    a_runs, b_runs = _runs(np.ones(10)), _runs(b)
    judging = {"alpha": 0.01, "threshold": 0.01, "tail_threshold": 0.01, "family": 3, "looks": 6}
    one = {c.metric: c for c in judged_pairs(a_runs, b_runs, **judging)}
    two = {c.metric: c for c in judged_pairs(a_runs, b_runs, **judging, groups=[0] * 5 + [1] * 5)}
    assert one["tpot_ms"].verdict is not Verdict.REGRESSION and two["tpot_ms"].verdict is not Verdict.REGRESSION
    assert two["tpot_ms"].p_value >= one["tpot_ms"].p_value
    assert two["tpot_ms"].ci_low <= one["tpot_ms"].ci_low and two["tpot_ms"].ci_high >= one["tpot_ms"].ci_high


def test_the_worked_example_of_docs_against() -> None:
    """docs/against.md's worked example, its figures as printed there."""
    rng = np.random.default_rng(7)
    one = rng.normal(0.012, 0.014, 24)  # one process pair whose placement costs +1.2%
    estimate, low, high = (round(math.exp(x), 3) for x in location_ci(one))
    assert (estimate, low, high) == (1.007, 1.001, 1.012)
    offsets = (0.012, -0.004, 0.009, 0.002, 0.011, -0.008)
    parts = [rng.normal(off, 0.014, 4) for off in offsets]
    assert [round(hodges_lehmann(p) * 100, 2) for p in parts] == [0.57, -0.92, -0.23, 0.13, 1.19, -0.37]
    t = two_level_ci(parts)
    assert round(t.estimate * 100, 2) == 0.06 and round(t.se * 100, 2) == 0.30 and t.df == 5
    assert round(t.se * math.sqrt(6) * 100, 2) == 0.75
    assert (round(math.exp(t.low), 3), round(math.exp(t.high), 3)) == (0.993, 1.008)
    groups = [g for g, p in enumerate(parts) for _ in p]
    got = levels("tpot_ms", np.concatenate(parts), groups)
    assert got.line() == (
        "decode TPOT: between 6 process pairs sd 0.10%, within their 24 pairs sd 1.32% "
        "(the process level 2% of the CI's variance)"
    )


def test_pococks_constants_hold_95_percent_over_the_looks() -> None:
    """``POCOCK_95`` (Jennison & Turnbull's table) against the multivariate normal of a statistic
    looked at K times at equally spaced information (corr(Z_i, Z_j) = sqrt(i / j)): all K looks
    within +-z with probability 95%, for K = 2..5 (6 and beyond take seconds each)."""
    from scipy.stats import multivariate_normal

    for k in range(2, 6):
        i = np.arange(1, k + 1)
        cov = np.sqrt(np.minimum.outer(i, i) / np.maximum.outer(i, i))
        z = POCOCK_95[k - 1]
        mvn = multivariate_normal(mean=np.zeros(k), cov=cov, seed=k)
        assert abs(mvn.cdf(np.full(k, z), lower_limit=np.full(k, -z)) - 0.95) < 0.002


def test_the_repeated_level_grows_with_the_looks() -> None:
    """One look: 95%; six (the default runs' looks): 98.6%; more looks, never narrower; past the
    table, Bonferroni's (wider still)."""
    assert repeated_level(1) == CI_LEVEL == 0.95
    assert abs(repeated_level(6) - 0.9858) < 1e-4
    levels_by_looks = [repeated_level(k) for k in range(1, 30)]
    assert levels_by_looks == sorted(levels_by_looks)
    assert repeated_level(len(POCOCK_95) + 1) >= 1 - 0.05 / (len(POCOCK_95) + 1)


def _sequential_session(
    rng: np.random.Generator, change: float, between_sd: float, within_sd: float, ttft: tuple[float, float] = (0.0, 0.0)
):
    """One synthetic ``--llmperf-against`` measurement as ``session.against._looks`` takes it: blocks
    of 5, 5, then 3 pairs, each on a fresh process pair (its own offset), a look at the first
    block's end at or past every 10 pairs up to 60 (6 looks), each ``judge.paired.look`` at a 1%
    threshold, stopped at the first that stops. ``change`` and the decode levels move TPOT (and
    the ITL p95); ``ttft``: TTFT's (between, within) sds, no change. (decode comparison, TTFT
    comparison, pairs) at the stop."""
    cap, looks, step = looks_for(20, None)
    d: list[float] = []
    t: list[float] = []
    groups: list[int] = []
    at = 0
    for group, size in enumerate([5, 5] + [3] * 20):
        offset, ttft_offset = rng.normal(0.0, between_sd), rng.normal(0.0, ttft[0])
        for _ in range(min(size, cap - len(d))):
            d.append(change + offset + rng.normal(0.0, within_sd))
            t.append(ttft_offset + rng.normal(0.0, ttft[1]))
            groups.append(group)
        if len(d) < cap and len(d) < step * (at + 1):
            continue
        at += 1
        a = _runs(np.full(len(d), 10.0))
        b = _runs(np.exp(np.asarray(d)) * 10.0)
        for run, x in zip(b, t, strict=True):  # TTFT: its own pairs, 50 ms
            run.ttft_ms, run.prefill_tps = 50.0 * math.exp(x), 1.0 / (50.0 * math.exp(x))
        for run in a:
            run.ttft_ms, run.prefill_tps = 50.0, 1.0 / 50.0
        judging = {"alpha": 0.01, "threshold": 0.01, "tail_threshold": 0.10, "family": 3}
        seen = look(a, b, cap=cap, looks=looks, groups=groups, **judging)
        if seen.why is not None:
            by = {c.metric: c for c in seen.comparisons}
            return by["tpot_ms"], by.get("ttft_ms"), len(d)
    raise AssertionError("the cap ends every session")


def test_the_ci_where_the_pairs_stopped_covers_1_for_unchanged_code() -> None:
    """Calibration of the looks: 300 seeded A/A sessions at the decode levels measured on this
    machine (offsets sd 0.8%, pairs sd 0.7%): the CI of the look each stopped at holds 1 in at
    least 95% of them (a 95% CI at every look: about 91%), and no REGRESSION; +1% per token over
    100 sessions: the CI lies above 1 in at least 80% (the issue asks 8 of 10)."""
    rng = np.random.default_rng(56)
    aa = [_sequential_session(rng, 0.0, 0.008, 0.007)[0] for _ in range(300)]
    assert sum(c.ci_low <= 1.0 <= c.ci_high for c in aa) >= 0.95 * len(aa)
    assert not any(c.verdict is Verdict.REGRESSION for c in aa)
    plus1 = [_sequential_session(rng, math.log(1.01), 0.008, 0.007)[0] for _ in range(100)]
    assert sum(c.ci_low > 1.0 for c in plus1) >= 80


def test_ttfts_spread_decides_unchanged_code_in_a_median_of_at_most_36_pairs() -> None:
    """TTFT's pairs spread more than decode's (one 32-token prefill per run against 31 tokens'
    mean: 2% within a process pair, 0.5% between, as measured here on a quiet machine), so
    TTFT's equivalence at 1% was what held the pairs: with the equivalence stop at the repeated
    level (98.6%) 200 seeded A/A sessions took a median of 40 pairs. At the look's 95% CI
    (``judge.paired.equivalent``) they take at most 36, while the printed CIs (repeated) still
    hold 1 in at least 95% for both, none is a REGRESSION, and +1% per token still lies above 1
    in at least 80 of 100 (the issue's 8 of 10)."""
    rng = np.random.default_rng(50)
    aa = [_sequential_session(rng, 0.0, 0.008, 0.007, ttft=(0.005, 0.02)) for _ in range(200)]
    assert np.median([n for _, _, n in aa]) <= 36
    for c in [x for d, t, _ in aa for x in (d, t)]:
        assert c.verdict is not Verdict.REGRESSION
    assert sum(d.ci_low <= 1.0 <= d.ci_high for d, _, _ in aa) >= 0.95 * len(aa)
    assert sum(t.ci_low <= 1.0 <= t.ci_high for _, t, _ in aa) >= 0.95 * len(aa)
    plus1 = [_sequential_session(rng, math.log(1.01), 0.008, 0.007, ttft=(0.005, 0.02))[0] for _ in range(100)]
    assert sum(c.ci_low > 1.0 for c in plus1) >= 80
