"""Paired statistics of an interleaved A/B: per pair, the log ratio b/a of one metric.

A and B run side by side, one pair at a time (AB or BA, seeded), so whatever the machine does
during a pair (a neighbour's build, a frequency change, a slow drift over the session) moves
both runs of it alike and cancels in the pair's ratio. The ratios are summarised with the
verdicts' own location estimator (the Hodges-Lehmann estimate: the median of the Walsh averages
of the log ratios), and its exact Wilcoxon signed-rank CI and test: order statistics of the
same Walsh averages, so a few wild pairs (a neighbour's burst that began between A and B) widen
the CI instead of narrowing it as a trimmed spread would (docs/ab.md)."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import ndtr, ndtri, stdtr
from scipy.stats import rankdata

from ..core import catalog
from .rule import JUDGED, METRICS, decide, mirrored
from .verdict import (
    CI_LEVEL,
    HL_SE_FACTOR,
    Comparison,
    NoiseSource,
    Shown,
    Verdict,
    exp_clamped,
    fmt_p,
    fmt_value,
    level,
    log_level,
    positive_values,
    t_quantile,
)

if TYPE_CHECKING:
    from ..core.catalog import Metric
    from ..core.measurement import RunMetrics

#: metric -> its catalog entry (label, phase, unit...). Times are compared as b/a time ratios.
PAIRED_METRICS: dict[str, Metric] = {name: catalog.METRICS[name] for name in catalog.PAIRED}


@dataclass(frozen=True)
class PairedComparison:
    """One metric of B against A over n pairs. ``ratio``: B's time / A's (1.25 = B 25% slower);
    ``speedup`` = 1 / ratio (B's rate / A's)."""

    metric: str
    label: str
    phase: str
    unit: str
    a_median: float
    b_median: float
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float  # two-sided paired test of ratio == 1
    n_pairs: int
    spread: float  # robust sd of the pairs' log ratios

    @property
    def speedup(self) -> float:
        return 1.0 / self.ratio

    @property
    def excludes_one(self) -> bool:
        return self.ci_low > 1.0 or self.ci_high < 1.0

    def line(self) -> str:
        """``decode TPOT: B/A 1.93 (95% CI 1.88..1.99, p=1.2e-09, 20 pairs; medians A 5.10 ms,
        B 9.84 ms)``: B/A is the pairs' ratio (their level), not the medians' ratio."""
        return (
            f"{self.phase} {self.label}: B/A {self.ratio:.3f} ({CI_LEVEL:.0%} CI {self.ci_low:.3f}..{self.ci_high:.3f}, "
            f"p={fmt_p(self.p_value)}, {self.n_pairs} pairs; medians A {fmt_value(self.a_median)} {self.unit}, "
            f"B {fmt_value(self.b_median)} {self.unit})"
        )


def paired(metric: str, a: Sequence[float], b: Sequence[float], ci_level: float = CI_LEVEL) -> PairedComparison:
    """B against A from per-pair values (same length, pair i = A's run i and B's run i); the CI at
    ``ci_level`` (``repeated_level`` where the pairs are looked at more than once)."""
    if len(a) != len(b):
        raise ValueError(f"{metric}: {len(a)} A runs but {len(b)} B runs; pairs need both")
    m = PAIRED_METRICS[metric]
    # The log ratio of each pair (a difference of logs: a quotient of extreme values overflows).
    d = np.log(positive_values(f"{metric} B", b)) - np.log(positive_values(f"{metric} A", a))
    estimate, low, high = location_ci(d, ci_level)
    return PairedComparison(
        metric=metric,
        label=m.label,
        phase=m.phase,
        unit=m.unit,
        a_median=statistics.median(a),
        b_median=statistics.median(b),
        ratio=exp_clamped(estimate),
        ci_low=exp_clamped(low),
        ci_high=exp_clamped(high),
        p_value=signed_rank_p(d),
        n_pairs=d.size,
        spread=log_level(d).spread,
    )


def location_ci(d: np.ndarray, ci_level: float = CI_LEVEL) -> tuple[float, float, float]:
    """The Hodges-Lehmann location of per-pair differences ``d`` (the median of their Walsh
    averages) and its exact Wilcoxon signed-rank CI at ``ci_level``: (estimate, low, high)."""
    walsh = _walsh(d)
    c = _lower_index(d.size, 1.0 - ci_level)
    return float(np.median(walsh)), float(walsh[c]), float(walsh[walsh.size - 1 - c])


def hodges_lehmann(d: np.ndarray) -> float:
    """The Hodges-Lehmann location of ``d``: the median of its Walsh averages."""
    return float(np.median(_walsh(d)))


def _walsh(d: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(d.size)
    return np.sort((d[i] + d[j]) / 2.0)


@functools.lru_cache(maxsize=128)
def _null_cdf(n: int) -> np.ndarray:
    """P(T+ <= t), t = 0..n(n+1)/2, of the signed-rank statistic under "no difference"."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    return np.cumsum(counts) / 2.0**n


#: Beyond this many pairs the signed-rank statistic is read from its normal approximation
#: (exact counts would overflow a float; the approximation is then accurate to 1e-4).
EXACT_MAX_PAIRS = 60


def _lower_index(n: int, alpha: float) -> int:
    """Index (0-based) of the lower CI end among the sorted Walsh averages: the largest c with
    P(T+ <= c) <= alpha / 2 (Hollander & Wolfe). Fewer than 6 pairs reach no 95%: then 0, the
    smallest average (the CI is the widest the pairs give)."""
    if n > EXACT_MAX_PAIRS:
        mean, sd = n * (n + 1) / 4.0, math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        return max(math.floor(mean + float(ndtri(alpha / 2.0)) * sd - 0.5), 0)
    cdf = _null_cdf(n)
    return max(int(np.searchsorted(cdf, alpha / 2.0, side="right")) - 1, 0)


#: Pocock's constants for a 95% level (Jennison & Turnbull, "Group Sequential Methods with
#: Applications to Clinical Trials", 2000, table 2.1; checked by tests/test_against_stopping.py
#: against the multivariate normal): the z that a normal statistic looked at K times, at equally
#: spaced information, stays within at all K looks with probability 95% (K = 1, 2, ...).
POCOCK_95 = (1.960, 2.178, 2.289, 2.361, 2.413, 2.453, 2.485, 2.512, 2.535, 2.555, 2.572, 2.588)


def repeated_level(looks: int) -> float:
    """The level each look's CI is taken at so that the CIs of all ``looks`` looks hold the true
    ratio together with probability ``CI_LEVEL`` (95%): a repeated confidence interval (Jennison &
    Turnbull 1989) with Pocock's constant, so the CI of the look the pairs stopped at is a 95% CI
    whichever look that was (6 looks: 98.6% each). A 95% CI at every look would not be: a stop
    when the CI first lies within the threshold picks the looks whose spread came out small, and
    unchanged code then ended with a CI excluding 1 in about 8% of sessions. More looks than the
    table: Bonferroni's z (wider, never narrower). One look: ``CI_LEVEL``."""
    if looks <= 1:
        return CI_LEVEL
    z = POCOCK_95[looks - 1] if looks <= len(POCOCK_95) else float(ndtri(1.0 - (1.0 - CI_LEVEL) / (2.0 * looks)))
    return float(2.0 * ndtr(z) - 1.0)


def signed_rank_p(d: np.ndarray) -> float:
    """Two-sided exact Wilcoxon signed-rank p-value of per-pair differences ``d`` (zeros dropped):
    twice the smaller one-sided one (``_signed_rank_greater`` of ``d`` and of ``-d``: T- = N - T+,
    so P(T- >= N - t) = P(T+ <= t)), at most 1."""
    return min(1.0, 2.0 * min(_signed_rank_greater(d), _signed_rank_greater(-d)))


def _upper_tail(cdf: np.ndarray, t: float) -> float:
    """P(T+ >= t) read from the lower tail by the null's symmetry (P(T+ <= N - t)): ``1 - cdf``
    loses every digit below 1e-16 and went negative at 60 pairs all one way (an INTERNALERROR
    from Holm's check in an --llmperf-against session that took its 60-pair cap)."""
    top = cdf.size - 1  # N = n(n+1)/2
    k = top - math.ceil(t)
    return float(cdf[k]) if k >= 0 else 0.0


def _signed_rank_greater(d: np.ndarray) -> float:
    """One-sided exact Wilcoxon signed-rank p-value of "the differences lean positive"."""
    d = d[d != 0]
    n = d.size
    if n == 0:
        return 1.0
    t = float(rankdata(np.abs(d))[d > 0].sum())
    if n > EXACT_MAX_PAIRS:
        mean, sd = n * (n + 1) / 4.0, math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        return float(ndtr(-(t - mean - 0.5) / sd))
    return min(1.0, _upper_tail(_null_cdf(n), t))


@dataclass(frozen=True)
class Levels:
    """What each level of a session's pairs contributed to one metric's log ratio B/A
    (``levels``): the process pairs (each side's fresh process, its own placement in memory and
    on the cores) and the pairs of runs within them. ``between_sd``: the sd of a process pair's
    true log ratio around the session's (what its pairs' own spread does not explain, never
    below 0); ``within_sd``: the sd of one pair's log ratio within its process pair. ``share``:
    the between level's part of the estimate's variance (1/P of between, 1/N of within)."""

    metric: str
    process_pairs: int
    pairs: int
    between_sd: float
    within_sd: float

    @property
    def share(self) -> float:
        between = self.between_sd**2 / max(self.process_pairs, 1)
        total = between + self.within_sd**2 / max(self.pairs, 1)
        return between / total if total > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "process_pairs": self.process_pairs,
            "pairs": self.pairs,
            "between_sd": round(self.between_sd, 6),
            "within_sd": round(self.within_sd, 6),
            "between_share": round(self.share, 4),
        }

    def line(self, unit: str = "process") -> str:
        """``decode TPOT: between 2 process pairs sd 0.81%, within their 40 pairs sd 2.10% (the process
        level 62% of the CI's variance)``; ``unit``: what the upper level's pairs are (an in-process
        A/B's: "instance")."""
        m = PAIRED_METRICS[self.metric]
        return (
            f"{m.phase} {m.label}: between {self.process_pairs} {unit} pairs sd {self.between_sd:.2%}, "
            f"within their {self.pairs} pairs sd {self.within_sd:.2%} "
            f"(the {unit} level {self.share:.0%} of the CI's variance)"
        )


def grouped(d: np.ndarray, groups: Sequence[int]) -> list[np.ndarray]:
    """The log ratios ``d`` by process pair (``groups[i]``: pair i's), in order of first appearance."""
    keys = list(dict.fromkeys(groups))
    g = np.asarray(groups)
    return [d[g == k] for k in keys]


def levels(metric: str, d: np.ndarray, groups: Sequence[int]) -> Levels:
    """The two levels' sds of one metric's log ratios ``d`` (method of moments, one-way random
    effects): within, the pooled sd about each process pair's mean; between, the variance of the
    process pairs' means less what their pairs' spread puts there."""
    parts = grouped(d, groups)
    sizes = np.array([p.size for p in parts], dtype=float)
    dof = float((sizes - 1).sum())
    within_var = sum(float(((p - p.mean()) ** 2).sum()) for p in parts) / dof if dof > 0 else 0.0
    means = np.array([p.mean() for p in parts])
    between_var = 0.0
    if means.size > 1:
        between_var = max(float(means.var(ddof=1)) - within_var * float(np.mean(1.0 / sizes)), 0.0)
    return Levels(metric, len(parts), int(d.size), math.sqrt(between_var), math.sqrt(within_var))


def pair_levels(
    a_runs: Sequence[RunMetrics],
    b_runs: Sequence[RunMetrics],
    groups: Sequence[int],
    metrics: Iterable[str] = catalog.JUDGED,
) -> tuple[Levels, ...]:
    """Each of ``metrics``' two levels over pairs of runs (``levels``; pair i in process pair,
    or an A/B's instance pair, ``groups[i]``), the metrics a run did not observe left out.
    ``metrics``: the judged ones (``--llmperf-against``), or an A/B's ``PAIRED_METRICS``."""
    return tuple(
        levels(metric, d, groups)
        for metric in metrics
        if (d := observed_log_ratios(a_runs, b_runs, metric)) is not None
    )


def observed_log_ratios(a_runs: Sequence[RunMetrics], b_runs: Sequence[RunMetrics], metric: str) -> np.ndarray | None:
    """The pairs' log ratios b/a of ``metric``; None where a run did not observe it."""
    seen = _observed(a_runs, b_runs, metric)
    return None if not a_runs or seen is None else _log_ratios(*seen)


def _observed(
    a_runs: Sequence[RunMetrics], b_runs: Sequence[RunMetrics], metric: str
) -> tuple[list[float], list[float]] | None:
    """Each side's values of ``metric`` over the pairs; None where a run did not observe it
    (a callable's prefill)."""
    va = [getattr(r, metric) for r in a_runs]
    vb = [getattr(r, metric) for r in b_runs]
    return None if any(v is None or not 0 < v < math.inf for v in va + vb) else (va, vb)


def two_level_ci(parts: Sequence[np.ndarray], ci_level: float = CI_LEVEL) -> TwoLevel:
    """The log ratio's location over process pairs ``parts`` (each its pairs' log ratios) and its
    CI at ``ci_level`` from the top level of a two-level random-effects model (Kalibera & Jones,
    "Rigorous benchmarking in reasonable time"): each process pair's Hodges-Lehmann location is
    one observation of the change plus its processes' offset plus its pairs' noise, so the CI is
    Student's t over those k locations (k - 1 degrees of freedom), whatever share each level has.
    Each process pair weighs alike: a fresh process is the unit a change's effect is replicated
    over. (A bootstrap over 2-4 process pairs was too narrow: its decode CI held 1 in 18 of 20
    A/A sessions at 4; t over k locations is exact for normal offsets.) The one-sided p-values
    are the same t's."""
    values = np.array([hodges_lehmann(p) for p in parts if p.size], dtype=float)
    k = values.size
    estimate = float(values.mean()) if k else 0.0
    se = float(values.std(ddof=1)) / math.sqrt(k) if k > 1 else 0.0
    df = float(k - 1)
    if not se > 0:  # one process pair, or all alike: the pairs' own test (``_two_levels``) is the bound
        greater, less = (0.0, 1.0) if estimate > 0 else (1.0, 0.0) if estimate < 0 else (1.0, 1.0)
        return TwoLevel(estimate, estimate, estimate, 0.0, greater, less, df)
    q = t_quantile(df, 1.0 - (1.0 - ci_level) / 2.0)
    score = estimate / se
    return TwoLevel(
        estimate, estimate - q * se, estimate + q * se, se, float(stdtr(df, -score)), float(stdtr(df, score)), df
    )


@dataclass(frozen=True)
class TwoLevel:
    """``two_level_ci``'s answer, on the log scale: the estimate, its CI, its standard error, the
    one-sided p-values of "B slower" (``greater``) and "B faster" (``less``), and the degrees of
    freedom (process pairs less one)."""

    estimate: float
    low: float
    high: float
    se: float
    greater: float
    less: float
    df: float


def pairs_per_process(levels: Sequence[Levels], start_s: float, pair_s: float) -> int:
    """How many pairs the next process pair should run (Kalibera & Jones' optimum for a
    two-level experiment): sqrt(c_process / c_pair x within variance / between variance), the
    cost of a process pair's start-up (``start_s``, warm-ups included) against one pair's
    (``pair_s``), for each metric in ``levels`` (those not decided yet), the smallest (the most
    process pairs: the level a few of them cannot see is the one that makes a CI too narrow),
    within ``PAIRS_PER_PROCESS``. No between level measured: the most."""
    low, high = PAIRS_PER_PROCESS
    best = high
    for one in levels:
        if one.between_sd > 0 and pair_s > 0:
            n = math.sqrt(max(start_s, 0.0) / pair_s) * one.within_sd / one.between_sd
            best = min(best, round(n)) if n < high else best
    return max(low, min(high, best))


#: The range of ``pairs_per_process``: at least 3 pairs (a process pair's location needs a
#: few), at most 8 (a measurement's 60 pairs then still run over 8 process pairs or more).
PAIRS_PER_PROCESS = (3, 8)


def judged_pairs(
    a_runs: Sequence[RunMetrics],
    b_runs: Sequence[RunMetrics],
    *,
    alpha: float,
    threshold: float,
    tail_threshold: float,
    family: int,
    looks: int = 1,
    reference: str = "",
    groups: Sequence[int] = (),
    ci_level: float | None = None,
    levels: Sequence[Levels] | None = None,
) -> list[Comparison]:
    """B (the current side) judged against A (``--llmperf-against``'s REF) from interleaved pairs
    of runs (``measuring.metrics.RunMetrics``; pair i = A's run i and B's run i), with the
    baseline rule's words, threshold and alpha (``verdict.decided``): per phase (TTFT, TPOT) and
    the decode tail (ITL p95), the rates mirroring them. The estimate and CI are the paired
    Hodges-Lehmann ratio and its Wilcoxon CI (``paired``); the p-values the one-sided signed-rank
    tests; the standard error the pairs' robust spread. Holm over ``family`` (the session's
    judged comparisons, unseen ones counted as p = 1), each look at alpha / ``looks``. ``groups``:
    each pair's process pair; with two or more, the estimate, CI, p-values and standard error are
    the two-level model's (``two_level_ci``), whose CI carries the processes' offsets. Every CI
    is a repeated CI over the ``looks`` (``repeated_level``): whichever look the pairs stop at,
    it held the true ratio with 95% probability; ``ci_level`` another level (``look``'s 95% CIs
    of each look, which its equivalence stop reads); ``levels``: the pairs' ``pair_levels`` where
    they are known already (None: computed here)."""
    two = len(set(groups)) > 1
    ci = repeated_level(looks) if ci_level is None else ci_level
    judged: list[Comparison] = []
    for spec in JUDGED:
        if (seen := _observed(a_runs, b_runs, spec.name)) is None:
            continue  # not observed for this subject (a callable's prefill)
        va, vb = seen
        c = _paired_comparison(spec, va, vb, tail_threshold if spec.tail else threshold, reference, ci)
        judged.append(_two_levels(c, va, vb, groups, ci) if two else c)
    by_metric = {c.metric: c for c in judged}
    rates = [
        _paired_rate(
            by_metric[m.mirror_of], m, list(map(float, rate[0])), list(map(float, rate[1])), groups if two else (), ci
        )
        for m in METRICS.values()
        if m.mirror_of in by_metric and (rate := _observed(a_runs, b_runs, m.name)) is not None
    ]
    out = decide([*judged, *rates], alpha=alpha / max(looks, 1), m=max(family, len(judged)))
    if not two:
        return out
    between = {one.metric: one for one in (pair_levels(a_runs, b_runs, groups) if levels is None else levels)}
    return [_process_held(c, between.get(c.mirror_of or c.metric)) for c in out]


def _process_held(c: Comparison, level: Levels | None) -> Comparison:
    """An INCONCLUSIVE of two levels that more pairs cannot decide says what can: more processes
    (the rule's words name a baseline's sessions, which pairs against REF have none of)."""
    if c.verdict is not Verdict.INCONCLUSIVE or c.runs_needed is not None or level is None:
        return c
    head = c.reason.split("; more runs cannot decide it", 1)[0]
    why = (
        f"{head}; more pairs cannot decide it: the processes' offsets (between {level.process_pairs} process "
        f"pairs sd {level.between_sd:.1%}) leave too much; more processes per side can (max_processes)"
    )
    return dataclasses.replace(c, reason=why)


def _log_ratios(va: Sequence[float], vb: Sequence[float]) -> np.ndarray:
    d: np.ndarray = np.log(np.asarray(vb, dtype=float)) - np.log(np.asarray(va, dtype=float))
    return d


def _two_levels(
    c: Comparison, va: Sequence[float], vb: Sequence[float], groups: Sequence[int], ci_level: float = CI_LEVEL
) -> Comparison:
    """``c`` with the two-level model's estimate, CI, p-values, standard error and degrees of
    freedom (``two_level_ci``), never bolder than the pairs' own signed-rank ones (``c``'s): the
    CI spans both, each p-value is the larger. The signed-rank test's floor (2^-n) is what keeps
    a look at 10 pairs from deciding a REGRESSION. ``cv_candidate`` becomes the spread one pair
    would need to give that standard error alone (sqrt(pairs) x se, on the Hodges-Lehmann scale),
    so that "about N pairs would decide it" counts the process pairs the next pairs start too."""
    t = two_level_ci(grouped(_log_ratios(va, vb), groups), ci_level)
    worse, better = (t.less, t.greater) if c.higher_is_better else (t.greater, t.less)
    se = max(t.se, c.se_log)
    return dataclasses.replace(
        c,
        ratio=exp_clamped(t.estimate),
        ci_low=min(exp_clamped(t.low), c.ci_low if c.ci_low is not None else math.inf),
        ci_high=max(exp_clamped(t.high), c.ci_high if c.ci_high is not None else 0.0),
        p_value=max(worse, c.p_value if c.p_value is not None else 0.0),
        p_value_better=max(better, c.p_value_better if c.p_value_better is not None else 0.0),
        se_log=se,
        df=min(t.df, c.df) if c.df is not None else t.df,
        cv_candidate=se * math.sqrt(len(va)) / HL_SE_FACTOR,
    )


def _paired_rate(
    c: Comparison,
    spec: Metric,
    va: Sequence[float],
    vb: Sequence[float],
    groups: Sequence[int] = (),
    ci_level: float = CI_LEVEL,
) -> Comparison:
    """The rate that mirrors ``c`` (decode TPS of TPOT's pairs), shown with its own medians and its
    own pairs' ratio and CI (the line's percentage is that ratio's; ``groups``: the two-level
    model's), with ``c``'s verdict."""
    d = _log_ratios(va, vb)
    estimate, low, high = location_ci(d, ci_level)
    if groups:  # as ``_two_levels``: the model's estimate, its CI spanning the pairs' own too
        t = two_level_ci(grouped(d, groups), ci_level)
        estimate, low, high = t.estimate, min(t.low, low), max(t.high, high)
    change = (exp_clamped(estimate), exp_clamped(low), exp_clamped(high))
    return mirrored(c, spec, (statistics.median(va), statistics.median(vb)), change=change)


def _paired_comparison(
    spec: Metric, va: Sequence[float], vb: Sequence[float], threshold: float, reference: str, ci_level: float
) -> Comparison:
    """One metric's pairs as an undecided ``Comparison`` (``decide`` gives its verdict), its CI at ``ci_level``."""
    pc = paired(spec.name, va, vb, ci_level)
    d = _log_ratios(va, vb)
    ratios = log_level(d)
    greater, less = _signed_rank_greater(d), _signed_rank_greater(-d)
    worse, better = (less, greater) if spec.higher_is_better else (greater, less)
    return Comparison(
        metric=spec.name,
        label=spec.label,
        phase=spec.phase,
        unit=spec.unit,
        higher_is_better=spec.higher_is_better,
        threshold=threshold,
        baseline_value=pc.a_median,
        candidate_value=pc.b_median,
        ratio=pc.ratio,
        ci_low=pc.ci_low,
        ci_high=pc.ci_high,
        p_value=worse,
        p_value_better=better,
        n_baseline=pc.n_pairs,
        n_candidate=pc.n_pairs,
        cv_baseline=level(va, spec.name).spread,
        cv_candidate=ratios.spread,
        verdict=Verdict.INCONCLUSIVE,
        reason="",
        se_log=ratios.se,
        se_within_log=ratios.se,
        df=float(pc.n_pairs - 1),
        noise_source=NoiseSource.PAIRED,
        noise_sessions=0,
        reference=reference,
        shown=Shown.MEDIAN,
    )


def _worse_low(c: Comparison) -> float | None:
    """The low end of the change's CI in the worse direction (a rate's CI turned over); None: no CI."""
    if c.ci_low is None or c.ci_high is None:
        return None
    return 1.0 / c.ci_high if c.higher_is_better else c.ci_low


def _beyond(c: Comparison) -> bool:
    """Its whole CI lies beyond its threshold, in the worse direction."""
    return (low := _worse_low(c)) is not None and low > 1.0 + c.threshold


def needs_more_pairs(c: Comparison, cap: int | None = None, looks: int = 1) -> str | None:
    """Why one judged comparison of a look (``judged_pairs``) needs more pairs, or None when more
    pairs would not change what it says (docs/against.md, "When the pairs stop"):

    - REGRESSION with its whole CI beyond the threshold (one reaching into it may still come
      back within it: a +4% change measured +6% at an early look), or IMPROVED: decided;
    - UNCHANGED with its 95% CI excluding 1: a change within the threshold, found;
    - UNCHANGED with its 95% CI within +-the threshold: equivalence shown at the threshold (a
      change of the threshold's size is ruled out at 97.5% one-sided, each look);
    - INCONCLUSIVE that more pairs would not decide (``worth_more_runs``: leaning faster, or level
      with pairs that cannot decide), nor the pairs left before the ``cap`` (it needs more pairs
      than the cap, and leans slower by less than half the threshold: a slowdown is not in
      sight, and the cap would end it INCONCLUSIVE all the same: futility);
    - UNCHANGED whose CI, narrowed as the square root of the pairs, would at the ``cap`` still
      reach past the threshold and still hold 1: the verdict stands, and the pairs left can show
      neither equivalence nor a change within the threshold (futility). One whose CI at the cap
      would exclude 1 goes on: a +1% change at a 1% threshold is found there, not hidden.

    Otherwise (an UNCHANGED whose CI holds 1 and reaches past the threshold: a change of a few
    percent could hide in it; an INCONCLUSIVE that more pairs may decide) it says why. ``looks``:
    the measurement's looks, whose repeated CI (``repeated_level``) the projection to the cap takes."""
    if c.verdict is Verdict.REGRESSION:
        if _worse_low(c) is None or _beyond(c):
            return None
        return "a REGRESSION whose CI reaches into the threshold"
    if c.verdict is Verdict.IMPROVED:
        return None
    if c.verdict is Verdict.INCONCLUSIVE:
        futile = cap is not None and _known(c) and c.runs_needed is not None and c.runs_needed > cap
        futile = futile and not _leans_slower(c)
        return None if not c.worth_more_runs or futile else "undecided"
    if c.verdict is not Verdict.UNCHANGED or c.ci_low is None or c.ci_high is None:
        return None
    why = _unchanged_needs_more(c.ci_low, c.ci_high, c.threshold)
    if why is not None and cap is not None and _known(c):
        half, estimate = _half_at(c, cap, repeated_level(looks)), abs(math.log(c.ratio))
        if estimate + half >= math.log1p(c.threshold) and estimate <= half:
            return None  # at the cap the CI would still reach past the threshold and hold 1: futility
    return why


#: Futility (``needs_more_pairs``) needs a spread known to this many degrees of freedom: the
#: spread of two or three process pairs' locations (1 or 2) can be anything.
FUTILITY_MIN_DF = 4


def _known(c: Comparison) -> bool:
    """Whether futility may be judged: ``c``'s spread known well enough."""
    return c.df is None or c.df >= FUTILITY_MIN_DF


def _half_at(c: Comparison, cap: int, ci_level: float) -> float:
    """The half-width (log scale) ``c``'s CI at ``ci_level`` would have at the ``cap``: its standard
    error narrowed as sqrt(pairs), its degrees of freedom grown with them (a process pair per block)."""
    n = max(c.n_candidate, 1)
    df = (c.df if c.df is not None else math.inf) + 1.0
    return t_quantile(df * max(cap, n) / n - 1.0, 1.0 - (1.0 - ci_level) / 2.0) * c.se_log * math.sqrt(n / max(cap, n))


def _unchanged_needs_more(low: float, high: float, threshold: float) -> str | None:
    """An UNCHANGED needs more pairs while its CI (``low``..``high``) holds 1 and reaches past the threshold."""
    bound = 1.0 + threshold
    if low > 1.0 or high < 1.0 or (high < bound and low > 1.0 / bound):
        return None
    return "its CI holds 1 and reaches past the threshold"


#: ``pairs_settled``'s word when every judged comparison is settled (none needs more pairs).
SETTLED = "every comparison decided"


def _leans_slower(c: Comparison) -> bool:
    """Its estimate is slower by half the threshold or more."""
    worse = -math.log(c.ratio) if c.higher_is_better else math.log(c.ratio)
    return worse >= math.log1p(c.threshold / 2)


def pairs_settled(
    comparisons: Sequence[Comparison], cap: int | None = None, looks: int = 1, at_95: Sequence[Comparison] = ()
) -> str | None:
    """Why the pairs of one measurement may stop at this look (``judged_pairs``' comparisons),
    or None to take more: a REGRESSION whose whole CI lies beyond the threshold (the test fails,
    and more pairs would not bring the change back within it), or every judged comparison
    settled (``needs_more_pairs``, with the measurement's ``cap`` of pairs; an UNCHANGED also
    when its 95% CI of this look in ``at_95`` lies within the threshold: ``equivalent``). The cap
    stops the pairs apart from this. A REGRESSION does not stop them while another comparison is
    INCONCLUSIVE with its whole CI beyond its threshold and more pairs may decide it (its p short
    of this look's alpha): the ITL p95's REGRESSION would leave the TPOT it names undecided."""
    judged = [c for c in comparisons if c.mirror_of is None]
    pending = any(c.verdict is Verdict.INCONCLUSIVE and _beyond(c) and needs_more_pairs(c, cap, looks) for c in judged)
    for c in judged:
        if c.verdict is Verdict.REGRESSION and _beyond(c) and not pending:
            return f"{c.phase} {c.label} REGRESSION, its whole CI beyond {c.threshold:.0%}"
    shown = {c.metric: c for c in at_95}
    if any(needs_more_pairs(c, cap, looks) and not (shown and equivalent(c, shown.get(c.metric))) for c in judged):
        return None
    return SETTLED


def equivalent(c: Comparison, at_95: Comparison | None) -> bool:
    """An UNCHANGED whose 95% CI of this look (``at_95``: the same pairs judged at 95%, not at
    the repeated level) holds 1 and lies within the threshold either way: equivalence shown by
    two one-sided tests at 2.5% each (TOST), a stop of the pairs. The CI printed stays the
    repeated one, which holds the true ratio at whichever look the pairs stop, however the stop
    was chosen (Jennison & Turnbull 1989); the equivalence stop need not be as wide (at the
    repeated level it took a median of 40 pairs where TTFT's pairs spread 2%, docs/against.md).
    One whose 95% CI excludes 1 goes on: a change within the threshold, shown when the printed
    CI shows it (or futility stops it)."""
    if at_95 is None or c.verdict is not Verdict.UNCHANGED or at_95.ci_low is None or at_95.ci_high is None:
        return False
    bound = 1.0 + c.threshold
    return 1.0 / bound < at_95.ci_low <= 1.0 <= at_95.ci_high < bound


@dataclass(frozen=True)
class Look:
    """One look at a measurement's pairs (``look``): the comparisons judged there (each CI the
    repeated one) and why the pairs stop there (None: they go on)."""

    comparisons: list[Comparison]
    why: str | None
    #: What each level contributed per judged metric (``pair_levels``; two process pairs or more).
    levels: tuple[Levels, ...] = ()


def look(
    a_runs: Sequence[RunMetrics],
    b_runs: Sequence[RunMetrics],
    *,
    cap: int,
    looks: int,
    alpha: float,
    threshold: float,
    tail_threshold: float,
    family: int,
    reference: str = "",
    groups: Sequence[int] = (),
) -> Look:
    """One look of ``--llmperf-against``'s sequential pairs (and of their replays in benchmarks
    and tests): the pairs judged (``judged_pairs``: repeated CIs, alpha / ``looks``), and whether
    they stop (``pairs_settled``, with the same pairs' 95% CIs for the equivalence stop) or the
    ``cap`` is reached. ``groups``: each pair's process pair (one only: the pairs' own model);
    their levels computed once, for both judgements and the ``Look``."""
    two = groups if len(set(groups)) > 1 else ()
    between = pair_levels(a_runs, b_runs, two) if two else ()
    judge = functools.partial(
        judged_pairs, a_runs, b_runs, alpha=alpha, threshold=threshold, tail_threshold=tail_threshold, family=family
    )
    comparisons = judge(looks=looks, reference=reference, groups=two, levels=between)
    at_95 = judge(looks=looks, groups=two, ci_level=CI_LEVEL, levels=between) if looks > 1 else comparisons
    capped = f"the cap of {cap} pairs" if len(a_runs) >= cap else None
    return Look(comparisons, pairs_settled(comparisons, cap, looks, at_95) or capped, between)


#: The most pairs on each of a measurement's first two blocks (process pairs of
#: ``--llmperf-against``: two of them make the first look's 10 pairs, half a smaller look's;
#: engine instance pairs of an in-process A/B), before the levels are measured; the least is
#: ``PAIRS_PER_PROCESS``' (3). After them ``pairs_per_process``.
FIRST_BLOCK = 5
