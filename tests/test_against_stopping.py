"""When ``--llmperf-against``'s pairs stop (issue 37.3; docs/against.md, "When the pairs stop"):
``session.against.looks_for`` (where the looks are) and ``judge.paired.pairs_settled`` (whether a
look's verdicts can still change), on synthetic pairs: no sides, no llama.cpp."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_llmperf.judge.paired import SETTLED, judged_pairs, needs_more_pairs, pairs_settled
from pytest_llmperf.judge.verdict import Verdict
from pytest_llmperf.session.against import looks_for


def runs(log_ratios, ttft=None, itl=None):
    """REF's and this tree's runs whose per-pair TPOT log ratios are ``log_ratios`` (the machine's
    speed drifting under both alike); TTFT and ITL p95 the same unless given."""
    n = len(log_ratios)
    drift = np.exp(0.2 * np.sin(np.arange(n)))
    ttft = np.zeros(n) if ttft is None else np.asarray(ttft)
    itl = np.asarray(log_ratios) if itl is None else np.asarray(itl)

    def run(scale, d_ttft, d_tpot, d_itl):
        tpot = 2.0 * scale * math.exp(d_tpot)
        ttft_ms = 10.0 * scale * math.exp(d_ttft)
        return SimpleNamespace(
            ttft_ms=ttft_ms,
            prefill_tps=32_000.0 / ttft_ms,
            tpot_ms=tpot,
            decode_tps=1000.0 / tpot,
            itl_p95_ms=2.6 * scale * math.exp(d_itl),
        )

    a = [run(s, 0.0, 0.0, 0.0) for s in drift]
    b = [run(s, t, d, i) for s, t, d, i in zip(drift, ttft, log_ratios, itl)]
    return a, b


def sequential(log_ratios, runs_per_look=20, **kw):
    """The pairs as ``session.against.pairs`` takes them: a look every step up to the cap, each
    at alpha / looks; returns (pairs taken, why they stopped, the last look's comparisons)."""
    cap, looks, step = looks_for(runs_per_look, None)
    a, b = runs(log_ratios[:cap], **kw)
    n = 0
    while True:
        n = min(n + step, cap)
        comparisons = judged_pairs(a[:n], b[:n], alpha=0.01, threshold=0.05, tail_threshold=0.10, family=3, looks=looks)
        why = pairs_settled(comparisons)
        if why is not None or n >= cap:
            return n, why, {c.metric: c for c in comparisons}


def noise(seed: int, sd: float, n: int = 60) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, sd, n)


def test_looks_every_half_runs_up_to_the_cap() -> None:
    assert looks_for(20, None) == (60, 6, 10)  # the default: 20 runs, up to 60 pairs
    assert looks_for(20, 40) == (40, 4, 10)
    assert looks_for(6, None) == (18, 3, 6)  # a look needs 10 pairs, and comes at least every `runs`
    assert looks_for(4, 8) == (8, 2, 4)
    for r, cap in ((20, None), (30, 100), (7, 7), (13, 50)):
        most, looks, step = looks_for(r, cap)
        assert (looks - 1) * step < most <= looks * step  # every look counted: the last at the cap


@pytest.mark.parametrize("seed", range(5))
def test_a_clearly_unchanged_series_stops_before_the_cap(seed: int) -> None:
    n, why, comps = sequential(noise(seed, 0.01))
    assert n < 60 and why == "every comparison decided"
    for c in comps.values():
        assert c.verdict is not Verdict.REGRESSION
    tpot = comps["tpot_ms"]
    assert tpot.verdict is Verdict.UNCHANGED and 1 / 1.05 < tpot.ci_low <= tpot.ci_high < 1.05


@pytest.mark.parametrize("seed", range(5))
def test_a_clear_regression_stops_at_an_early_look(seed: int) -> None:
    n, why, comps = sequential(math.log(1.20) + noise(seed, 0.02))
    assert n <= 20 and why == "decode TPOT REGRESSION, its whole CI beyond 5%"
    assert comps["tpot_ms"].verdict is Verdict.REGRESSION and comps["tpot_ms"].ci_low > 1.05


def test_an_undecided_series_goes_on() -> None:
    """+5% at a pair spread of 15%: the first look decides nothing, so more pairs come."""
    a, b = runs(math.log(1.05) + noise(1, 0.15, 10))
    comparisons = judged_pairs(a, b, alpha=0.01, threshold=0.05, tail_threshold=0.10, family=3, looks=6)
    tpot = next(c for c in comparisons if c.metric == "tpot_ms")
    assert needs_more_pairs(tpot) is not None
    assert pairs_settled(comparisons) is None


def comparison(verdict: Verdict, low: float, high: float, *, worth: bool = False, better: bool = False):
    return SimpleNamespace(
        verdict=verdict,
        ci_low=low,
        ci_high=high,
        threshold=0.05,
        worth_more_runs=worth,
        mirror_of=None,
        higher_is_better=better,
        phase="decode",
        label="TPOT",
    )


def test_which_comparisons_need_more_pairs() -> None:
    u = Verdict.UNCHANGED
    assert needs_more_pairs(comparison(u, 0.98, 1.04)) is None  # within +-5%: equivalence shown
    assert needs_more_pairs(comparison(u, 1.01, 1.07)) is None  # excludes 1: a change within 5%, found
    assert needs_more_pairs(comparison(u, 0.97, 1.06)) is not None  # holds 1, reaches past 5%: +4% may hide
    assert needs_more_pairs(comparison(u, 0.94, 1.02)) is not None
    assert needs_more_pairs(comparison(Verdict.INCONCLUSIVE, 0.9, 1.2, worth=True)) == "undecided"
    assert needs_more_pairs(comparison(Verdict.INCONCLUSIVE, 0.8, 1.01)) is None  # leaning faster: no slowdown in sight
    # A REGRESSION whose CI reaches into the threshold may still come back within it (a +4% change
    # measured +6% at an early look): more pairs; with its whole CI beyond, it stops every pair.
    assert needs_more_pairs(comparison(Verdict.REGRESSION, 1.02, 1.12)) is not None
    assert needs_more_pairs(comparison(Verdict.REGRESSION, 1.06, 1.12)) is None
    assert needs_more_pairs(comparison(Verdict.IMPROVED, 0.85, 0.99)) is None
    still = comparison(Verdict.INCONCLUSIVE, 0.9, 1.2, worth=True)
    assert (
        pairs_settled([comparison(Verdict.REGRESSION, 1.02, 1.12), comparison(Verdict.UNCHANGED, 0.99, 1.01)]) is None
    )
    assert pairs_settled([comparison(Verdict.REGRESSION, 1.06, 1.12), still]) is not None
    rate = comparison(Verdict.REGRESSION, 1 / 1.12, 1 / 1.06, better=True)  # a rate: lower is worse
    assert pairs_settled([rate, still]) is not None


def test_a_tail_regression_does_not_stop_a_time_metric_that_more_pairs_would_decide() -> None:
    """ITL p95 REGRESSION with its whole CI beyond, and TPOT INCONCLUSIVE at 7.4x with its whole
    CI beyond 5% (its p short of this look's alpha): the pairs go on until TPOT is decided too (a
    shared runner's fresh-clone run, the wrapper's test in tests/test_against.py)."""
    itl = comparison(Verdict.REGRESSION, 4.6, 8.9)
    tpot = comparison(Verdict.INCONCLUSIVE, 4.5, 12.2, worth=True)
    assert pairs_settled([tpot, itl]) is None
    decided = comparison(Verdict.REGRESSION, 4.5, 12.2)
    assert pairs_settled([decided, itl]) == "decode TPOT REGRESSION, its whole CI beyond 5%"
    # An INCONCLUSIVE that more pairs would not decide does not hold the stop back.
    assert pairs_settled([comparison(Verdict.INCONCLUSIVE, 4.5, 12.2), itl]) is not None
    # Nor does an INCONCLUSIVE whose CI reaches into the threshold.
    assert pairs_settled([comparison(Verdict.INCONCLUSIVE, 0.9, 1.2, worth=True), itl]) is not None


def test_an_equivalence_shown_by_the_looks_95_percent_ci_stops_the_pairs() -> None:
    """The equivalence stop reads the look's 95% CI, not the repeated one printed (6 looks: 98.6%,
    wider): an UNCHANGED whose printed CI reaches past 5% but whose 95% CI lies within +-5% and
    holds 1 is settled; one whose 95% CI also reaches past 5%, or excludes 1 (a change within the
    threshold, which the printed CI must show first), is not; nor an INCONCLUSIVE."""
    u = Verdict.UNCHANGED

    def named(c, metric: str = "tpot_ms"):
        c.metric = metric
        return c

    printed = named(comparison(u, 0.96, 1.055))
    assert pairs_settled([printed]) is None
    assert pairs_settled([printed], at_95=[named(comparison(u, 0.97, 1.04))]) == SETTLED
    assert pairs_settled([printed], at_95=[named(comparison(u, 0.97, 1.051))]) is None
    assert pairs_settled([printed], at_95=[named(comparison(u, 1.002, 1.04))]) is None  # excludes 1
    assert pairs_settled([printed], at_95=[named(comparison(u, 0.97, 1.04), "ttft_ms")]) is None  # another metric's
    inconclusive = named(comparison(Verdict.INCONCLUSIVE, 0.96, 1.055, worth=True))
    assert pairs_settled([inconclusive], at_95=[named(comparison(u, 0.97, 1.04))]) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(min_value=6, max_value=60),
    shift=st.floats(min_value=-0.3, max_value=0.3),
    sd=st.floats(min_value=0.001, max_value=0.3),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_a_stop_never_hides_a_change_it_could_still_find(n: int, shift: float, sd: float, seed: int) -> None:
    """Whatever the pairs: a look that stops with every comparison decided left no UNCHANGED whose
    CI holds 1 while reaching past the threshold, and no INCONCLUSIVE that more pairs could
    decide; a REGRESSION whose CI lies beyond the threshold always stops."""
    a, b = runs(shift + noise(seed, sd, n), ttft=noise(seed + 1, sd, n), itl=shift + noise(seed + 2, sd, n))
    comparisons = judged_pairs(a, b, alpha=0.01, threshold=0.05, tail_threshold=0.10, family=3, looks=6)
    judged = [c for c in comparisons if c.mirror_of is None]
    why = pairs_settled(comparisons)
    if any(c.verdict is Verdict.REGRESSION and c.ci_low > 1 + c.threshold for c in judged):
        assert why is not None and "REGRESSION" in why
    elif why is not None:
        for c in judged:
            assert not (c.verdict is Verdict.INCONCLUSIVE and c.worth_more_runs)
            assert c.verdict is not Verdict.REGRESSION  # one reaching into the threshold goes on
            if c.verdict is Verdict.UNCHANGED and c.ci_low <= 1 <= c.ci_high:
                assert 1 / (1 + c.threshold) < c.ci_low and c.ci_high < 1 + c.threshold
    else:
        assert any(needs_more_pairs(c) for c in judged)


def run_level(rng: np.random.Generator, n: int, sd: float, shared: float) -> np.ndarray:
    """Per-pair log ratios B/A as the recorded sessions on this project's 2-core VM showed them
    (docs/lab-notes.md, "What the pairs' spread is made of"): each run's tokens all faster or slower together
    (a run-level speed of sd ``sd``), A's and B's speeds correlated by ``shared`` only, and one run
    in 10 hit by a burst (exponential, mean ``sd``)."""
    common = rng.normal(0.0, sd, n)
    a, b = (
        math.sqrt(shared) * common
        + math.sqrt(1 - shared) * rng.normal(0.0, sd, n)
        + rng.exponential(sd, n) * (rng.random(n) < 0.1)
        for _ in range(2)
    )
    return b - a


@pytest.mark.parametrize("sd", [0.08, 0.25])
def test_a_a_under_run_level_noise_rarely_flags_at_any_look(sd: float) -> None:
    """An unchanged subject, looked at every 10 pairs up to 60 (each look at alpha / 6, Holm over
    the three judged metrics): a REGRESSION in any metric in at most 1% of 200 sessions (alpha
    1%), at the quiet machine's run-level noise and at the loaded one's."""
    rng = np.random.default_rng(37)
    alarms = 0
    for _ in range(200):
        d = [run_level(rng, 60, sd, shared=0.4) for _ in range(3)]
        _, _, comps = sequential(d[0], ttft=d[1], itl=d[2])
        alarms += any(c.verdict is Verdict.REGRESSION for c in comps.values())
    assert alarms <= 2


def _futile_case(verdict: Verdict, ratio: float, se: float, df: float, n: int, runs_needed: int | None = None):
    """A TTFT comparison at a 1% threshold: its ratio, standard error (its CI +-2 se), degrees of freedom and pairs."""
    half = math.exp(2.0 * se)
    return SimpleNamespace(
        verdict=verdict,
        ci_low=ratio / half,
        ci_high=ratio * half,
        threshold=0.01,
        worth_more_runs=verdict is Verdict.INCONCLUSIVE,
        mirror_of=None,
        higher_is_better=False,
        phase="prefill",
        label="TTFT",
        ratio=ratio,
        se_log=se,
        df=df,
        n_candidate=n,
        runs_needed=runs_needed,
    )


def test_futility_stops_what_the_cap_cannot_settle_once_the_spread_is_known() -> None:
    """At a 1% threshold, a TTFT whose 95% CI would still reach past 1% and hold 1 at the cap of
    60 pairs (UNCHANGED; one whose CI there would exclude 1 goes on), or that needs more pairs than the cap and leans slower by less than half the
    threshold (INCONCLUSIVE), stops the pairs; not while its spread rests on a few process
    pairs (df below 4: the t quantile of 2 process pairs is 12.7), not without a cap, and never
    one that leans slower (+1% may be a REGRESSION: the pairs go on)."""
    u, i = Verdict.UNCHANGED, Verdict.INCONCLUSIVE
    wide = _futile_case(u, 1.002, 0.008, 9, 30)  # 0.8% at 30 pairs: about 0.57% at 60, t 2.0: past 1%
    assert needs_more_pairs(wide) is not None and needs_more_pairs(wide, 60) is None
    narrowing = _futile_case(u, 1.002, 0.0045, 9, 30)  # CI past 1% at 30 pairs; about 0.66% + 0.2% at 60: within
    assert needs_more_pairs(narrowing, 60) is not None
    found = _futile_case(u, 1.006, 0.004, 9, 30)  # +0.6%: past 1% at 60 pairs, but its CI there excludes 1
    assert needs_more_pairs(found, 60) is not None  # a change within the threshold, found at the cap: go on
    early = _futile_case(u, 1.002, 0.02, 1, 10)  # 2 process pairs: nothing known yet
    assert needs_more_pairs(early, 60) is not None
    hopeless = _futile_case(i, 1.003, 0.01, 9, 30, runs_needed=150)
    assert needs_more_pairs(hopeless) == "undecided" and needs_more_pairs(hopeless, 60) is None
    assert needs_more_pairs(_futile_case(i, 1.003, 0.01, 9, 30, runs_needed=45), 60) == "undecided"
    assert needs_more_pairs(_futile_case(i, 1.003, 0.01, 2, 30, runs_needed=150), 60) == "undecided"
    assert needs_more_pairs(_futile_case(i, 1.008, 0.01, 9, 30, runs_needed=150), 60) == "undecided"  # leans slower
