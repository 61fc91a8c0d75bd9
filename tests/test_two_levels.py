"""The two levels of ``--llmperf-against``'s pairs (issue 50): process pairs, and the pairs of runs
within them. Properties of the hierarchical bootstrap (``judge.paired.two_level_ci``) and of the
levels' sds (``judge.paired.levels``) for any log ratios a session can give, and what it changes:
with a between-process offset of 1.5% over 2 process pairs, the single-level CI excludes 1 and the
two-level one does not. Seeded; nothing timed."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_llmperf.judge.paired import judged_pairs, levels, location_ci, needs_more_pairs, pair_levels, two_level_ci
from pytest_llmperf.judge.rule import JUDGED
from pytest_llmperf.judge.verdict import Verdict
from pytest_llmperf.session.against import ADDED, Processes, held_by_budget

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
    t = two_level_ci(_arrays(parts), resamples=200)
    assert all(math.isfinite(x) for x in (t.estimate, t.low, t.high, t.se))
    assert t.low <= t.estimate <= t.high
    assert t.se >= 0
    assert 0.0 <= t.greater <= 1.0 and 0.0 <= t.less <= 1.0
    lo, hi = min(min(p) for p in parts), max(max(p) for p in parts)
    assert lo - 1e-9 <= t.low and t.high <= hi + 1e-9  # within the pairs' range


@SETTINGS
@given(parts=process_pairs, shift=st.floats(min_value=-1.0, max_value=1.0))
def test_a_shift_of_every_pair_shifts_the_ci(parts, shift) -> None:
    """The same resamples (seeded): B uniformly slower by ``shift`` moves estimate and bounds by it."""
    a = two_level_ci(_arrays(parts), resamples=200)
    b = two_level_ci([p + shift for p in _arrays(parts)], resamples=200)
    for x, y in ((a.estimate, b.estimate), (a.low, b.low), (a.high, b.high)):
        assert math.isclose(y, x + shift, abs_tol=1e-9)


@SETTINGS
@given(parts=process_pairs)
def test_swapping_the_sides_turns_the_ci_over(parts) -> None:
    a = two_level_ci(_arrays(parts), resamples=200)
    b = two_level_ci([-p for p in _arrays(parts)], resamples=200)
    assert math.isclose(b.estimate, -a.estimate, abs_tol=1e-9)
    assert math.isclose(b.low, -a.high, abs_tol=1e-9) and math.isclose(b.high, -a.low, abs_tol=1e-9)


@SETTINGS
@given(parts=process_pairs)
def test_the_same_pairs_give_the_same_ci(parts) -> None:
    assert two_level_ci(_arrays(parts), resamples=200) == two_level_ci(_arrays(parts), resamples=200)


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
    """+4% in both process pairs (each with its own 0.5% offset): the two-level CI lies above 1."""
    parts = _synthetic((0.045, 0.035))
    t = two_level_ci(parts)
    assert t.low > 0.0


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


def _processes(k: int, budget: int = 4) -> Processes:
    """A measurement's ``Processes`` with ``k`` process pairs and no sides behind them."""
    got = Processes(SimpleNamespace(), "t", "", SimpleNamespace(), budget)  # type: ignore[arg-type]
    got.pairs = [SimpleNamespace()] * k  # type: ignore[list-item]
    return got


@given(k=st.integers(1, 6), since=st.integers(0, 40))
def test_the_pairs_go_in_turn_and_back_over_the_process_pairs(k, since) -> None:
    """ABBA over process pairs: each one in every 2k pairs twice, once in each half-turn, so a
    drift of the machine over the session is shared by all of them."""
    p = _processes(k)
    p.since = since
    order = [p.schedule(i) for i in range(since, since + 4 * k)]
    assert order[: 2 * k] == [*range(k), *reversed(range(k))] == order[2 * k :]


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
    assert tpot.verdict is Verdict.INCONCLUSIVE and "more processes per side can (max_processes)" in tpot.reason
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


def test_a_process_pair_is_added_while_the_offsets_dominate_and_the_budget_stops_the_pairs() -> None:
    parts = _synthetic((0.02, -0.02), n=10, within_sd=0.002)
    d = np.concatenate(parts)
    groups = [0] * 10 + [1] * 10
    b = np.exp(d) * 10.0
    comparisons = judged_pairs(
        _runs(np.full(b.size, 10.0)), _runs(b), alpha=0.01, threshold=0.01, tail_threshold=0.01, family=3, groups=groups
    )
    found = pair_levels(_runs(np.full(b.size, 10.0)), _runs(b), groups)
    assert all(one.share > 0.9 for one in found)
    added: list[int] = []
    grows = _processes(2)
    grows.add = lambda workload, at: added.append(at) or True  # type: ignore[method-assign]
    assert grows.after_look(comparisons, found, None, 20) == ADDED and added == [20]  # type: ignore[arg-type]
    full = _processes(2, budget=2)
    why = full.after_look(comparisons, found, None, 20)  # type: ignore[arg-type]
    assert why is not None and "the budget of 2 process pairs (max_processes) reached" in why
    assert _processes(1, budget=1).after_look(comparisons, found, None, 20) is None  # type: ignore[arg-type]


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
