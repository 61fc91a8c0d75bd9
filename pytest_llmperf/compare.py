"""Regression or noise: the statistics that compare a candidate measurement with its baseline.

Pure numpy/scipy; nothing here knows about pytest or engines. Inputs are per-run values (one
number per run: the run is the sampling unit) or, for tails, each run's inter-token latencies.
Every random procedure takes a ``seed`` (default 0): the same inputs give the same verdicts
and the same p-values.

Per comparison
--------------
* Medians (:func:`compare_runs`): one-sided Mann-Whitney U in the *worse* direction
  (candidate larger for latencies, smaller for throughputs); exact distribution when there are
  no ties and at most 50 runs a side, else the normal approximation. The effect size is the
  ratio candidate/baseline of medians with a seeded percentile-bootstrap 95% CI
  (``scipy.stats.bootstrap``, runs resampled independently on each side).
* Tails (:func:`compare_tail`): the statistic is the ratio of pooled ITL q-quantiles. Tokens of
  one run are not independent, so every resampling moves whole runs: the p-value is a
  permutation test over run labels, the CI a cluster (run) bootstrap. The permutation test is
  exact when there are at most 20,000 ways to split the runs, else Monte Carlo with
  Besag-Clifford sequential stopping (stop once 20 permutations are as extreme as the data;
  at most 99,999). That keeps a null comparison at a few hundred permutations while a real
  regression can still reach p = 1e-5, below Holm's first step for 100 comparisons.
* The opposite direction gets its own one-sided p-value (``p_value_better``), used only for
  IMPROVED.

Across comparisons (:func:`decide`)
-----------------------------------
Holm's step-down adjustment over the family (all metrics of all tests of a session, ``m``).
Worse-direction p-values form the fail gate's family, so false REGRESSION verdicts are
controlled at ``alpha`` family-wise. Improvement p-values are adjusted as a second, separate
family (false IMPROVED verdicts also at most ``alpha``); IMPROVED never fails a test, and
pooling both directions into one family would halve the gate's power for nothing. When the
plugin knows the session will hold ``m`` comparisons but has seen only some, the unseen ones
count as p = 1: Holm's adjusted p-values only grow when any input grows, so this is an upper
bound of the final session-wide adjustment and a test may fail before the session ends.

The decision rule
-----------------
Verdicts, first match wins:

1. INSUFFICIENT: the data cannot support a claim. No p-value; a tail with fewer than 20 ITL
   samples above the quantile on a side (``n_tokens * (1 - q) < 20``); or the comparison is
   not significant and its p-value floor (the smallest p its run counts can produce:
   1 / C(n1 + n2, n1) for the exact U test) is not below Holm's first step ``alpha / m``.
2. REGRESSION: Holm-adjusted worse-direction p < alpha AND the worse end of the ratio's CI
   lies beyond the threshold (``ci_high > 1 + threshold`` for latencies,
   ``ci_low < 1 - threshold`` for throughputs): the change is real, and the data are
   consistent with a slowdown of practical size.
3. IMPROVED: the same, mirrored, with the improvement-direction p-value and the other end of
   the CI.
4. Otherwise UNCHANGED; a significant change whose whole CI lies inside the threshold is
   "significant but negligible" and says so in ``reason``.
5. UNSTABLE overrides 2-4 when either side's CV (per-run values; per-run mean ITL for tails)
   is >= 10%: a warning to re-run on a quieter machine, never a failure by default. Noise
   that large usually comes from interference that drifts (other processes, thermal or
   frequency changes), which breaks the i.i.d. assumption behind every p-value here. With
   ``fail_unstable=True`` a comparison that is a REGRESSION (or IMPROVED) by rules 2-3 keeps
   that verdict; the plugin may also count the remaining UNSTABLE ones as failures.

Why the CI, not the point estimate, meets the threshold: the project's targets are, at the
default run count and alpha 0.01 over a session of 20 tests x 5 metrics, power >= 95% for a
true 10% decode slowdown and >= 80% for a true 5% one, with <= 1% A/A sessions raising a false
alarm. A guard "median ratio > 1.05" passes a true 5% slowdown only about half the time (the
estimate lands on either side of the truth), so 80% power at 5% would be impossible at any
run count. With the CI guard, a true 5% slowdown passes ~97% of the time (a 95% CI reaches the
truth), power is that of the significance test, and the threshold still does its job:
significant changes shown to be smaller than it (CI entirely inside) are UNCHANGED, and as runs
grow and CIs narrow the rule converges to "significant and larger than the threshold".
``benchmarks/calibration.py`` compares this rule by simulation with no guard, the point
estimate, and half the threshold, and measures power and A/A false alarms by run count. In
its simulation (lognormal noise, 20 vs 20 runs, TPOT, Holm over m = 100): at CV 3% the CI
guard flags 83% of true +5% slowdowns (no guard: 83%, point estimate: 49%) and 2% of +2%
ones; at CV 1% it flags 99% at +5% and none at +1..+3%, where no guard flags 97% at +2%.
The run count, not the rule, then decides the targets: they hold at CV 3% with 20 runs a
side (power 80% at +5%, 100% at +10%, A/A sessions with a false alarm 0.5%); CV 5% needs
about 50 runs a side for the +5% target (30 suffice for +10%).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import scipy
import scipy.stats

#: A side whose per-run coefficient of variation reaches this is UNSTABLE.
UNSTABLE_CV = 0.10
#: Tails need at least this many ITL samples above the quantile on each side.
MIN_TAIL_SAMPLES = 20
#: Confidence level of the ratio's bootstrap CI.
CI_LEVEL = 0.95
#: Bootstrap resamples for CIs.
BOOTSTRAP_RESAMPLES = 2000
#: The exact U distribution is used up to this many runs a side (without ties).
EXACT_MAX_RUNS = 50
#: Run splits up to which the tail permutation test enumerates every split.
PERMUTATION_EXACT_MAX = 20_000
#: Monte Carlo permutations at most (p-value floor 1 / (this + 1)).
PERMUTATION_MAX = 99_999
#: Besag-Clifford: stop once this many permutations are at least as extreme as the data.
PERMUTATION_HITS = 20

_SCIPY = tuple(int(part) for part in scipy.__version__.split(".")[:2])
# SciPy 1.15 renamed bootstrap's ``random_state`` to ``rng``.
_RNG_KW = "rng" if _SCIPY >= (1, 15) else "random_state"


class Verdict(str, enum.Enum):
    """Outcome of one comparison; only REGRESSION fails a test by default."""

    REGRESSION = "REGRESSION"
    IMPROVED = "IMPROVED"
    UNCHANGED = "UNCHANGED"
    UNSTABLE = "UNSTABLE"
    INSUFFICIENT = "INSUFFICIENT"


@dataclass(frozen=True)
class MetricSpec:
    """A per-run metric family: how to name it and which way is worse."""

    name: str
    label: str
    unit: str
    phase: str
    higher_is_better: bool
    tail: bool = False


METRICS: dict[str, MetricSpec] = {
    s.name: s
    for s in (
        MetricSpec("ttft_ms", "TTFT", "ms", "prefill", higher_is_better=False),
        MetricSpec("prefill_tps", "prefill TPS", "t/s", "prefill", higher_is_better=True),
        MetricSpec("tpot_ms", "TPOT", "ms", "decode", higher_is_better=False),
        MetricSpec("decode_tps", "decode TPS", "t/s", "decode", higher_is_better=True),
        MetricSpec("itl_p95_ms", "ITL p95", "ms", "decode", higher_is_better=False, tail=True),
    )
}


@dataclass(frozen=True)
class Comparison:
    """One metric, candidate against baseline. ``ratio`` and the CI are always
    candidate/baseline of the value itself; which side is worse follows the metric."""

    metric: str
    label: str
    phase: str
    unit: str
    higher_is_better: bool
    #: Smallest relative change of the value that counts (0.05 = 5%).
    threshold: float
    #: Median over runs, or for a tail the pooled quantile.
    baseline_value: float
    candidate_value: float
    ratio: float
    ci_low: float | None
    ci_high: float | None
    #: Raw one-sided p-value in the worse direction.
    p_value: float | None
    #: Raw one-sided p-value in the improvement direction.
    p_value_better: float | None
    #: Smallest p-value these sample sizes can produce.
    p_floor: float | None
    n_baseline: int
    n_candidate: int
    cv_baseline: float | None
    cv_candidate: float | None
    verdict: Verdict
    reason: str
    #: Holm-adjusted p-values; None until :func:`decide`.
    p_adjusted: float | None = None
    p_adjusted_better: float | None = None
    #: Tails only: the quantile and the ITL sample counts.
    quantile: float | None = None
    n_tokens_baseline: int | None = None
    n_tokens_candidate: int | None = None

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    @property
    def failed(self) -> bool:
        return self.verdict is Verdict.REGRESSION

    def line(self) -> str:
        """One line for a failure message or a log, e.g. ``decode regression: TPOT 7.41 ms vs
        6.52 ms baseline (+13.6%, 95% CI +9.8..+17.2%, p=0.0004 Holm, 10 vs 10 runs)``."""
        word = {
            Verdict.REGRESSION: "regression",
            Verdict.IMPROVED: "improvement",
            Verdict.UNCHANGED: "unchanged",
            Verdict.UNSTABLE: "unstable",
            Verdict.INSUFFICIENT: "insufficient data",
        }[self.verdict]
        parts = [f"{self.change_pct:+.1f}%"]
        if self.ci_low is not None and self.ci_high is not None:
            parts.append(f"95% CI {(self.ci_low - 1) * 100:+.1f}..{(self.ci_high - 1) * 100:+.1f}%")
        p, adjusted = self._shown_p()
        if p is not None:
            parts.append(f"p={_fmt_p(p)}{' Holm' if adjusted else ''}")
        parts.append(f"{self.n_candidate} vs {self.n_baseline} runs")
        text = (
            f"{self.phase} {word}: {self.label} {_fmt_value(self.candidate_value)} {self.unit} "
            f"vs {_fmt_value(self.baseline_value)} {self.unit} baseline ({', '.join(parts)})"
        )
        if self.verdict in (Verdict.UNSTABLE, Verdict.INSUFFICIENT) and self.reason:
            text += f": {self.reason}"
        return text

    def _shown_p(self) -> tuple[float | None, bool]:
        """The p-value of the direction the data moved (the improvement one when it improved)."""
        better = self.verdict is Verdict.IMPROVED or (
            self.verdict is not Verdict.REGRESSION and self._improving
        )
        raw, adj = (
            (self.p_value_better, self.p_adjusted_better) if better else (self.p_value, self.p_adjusted)
        )
        return (adj, True) if adj is not None else (raw, False)

    @property
    def _improving(self) -> bool:
        return self.ratio > 1.0 if self.higher_is_better else self.ratio < 1.0


def _fmt_p(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def _fmt_value(v: float) -> str:
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


# ---------------------------------------------------------------------------------------------
# Medians over runs


def _values(name: str, values: Sequence[float]) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0:
        raise ValueError(f"{name}: no runs")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name}: values must be finite and positive")
    return a


def _cv(a: np.ndarray) -> float | None:
    return float(a.std(ddof=1) / a.mean()) if a.size > 1 else None


def mwu_method(n1: int, n2: int, ties: bool) -> str:
    """'exact' without ties up to ``EXACT_MAX_RUNS`` a side, else 'asymptotic'."""
    return "exact" if not ties and max(n1, n2) <= EXACT_MAX_RUNS else "asymptotic"


def mwu_p_floor(n_baseline: int, n_candidate: int, method: str) -> float:
    """Smallest one-sided U-test p-value these run counts can give (complete separation)."""
    if method == "exact":
        return 1.0 / math.comb(n_baseline + n_candidate, n_baseline)
    hi = np.arange(n_candidate, dtype=float) + n_baseline
    lo = np.arange(n_baseline, dtype=float)
    return float(scipy.stats.mannwhitneyu(hi, lo, alternative="greater", method=method).pvalue)


def _mwu_pvalues(base: np.ndarray, cand: np.ndarray, higher_is_better: bool) -> tuple[float, float, float]:
    """(worse-direction p, better-direction p, p floor)."""
    pooled = np.concatenate([base, cand])
    ties = np.unique(pooled).size < pooled.size
    method = mwu_method(base.size, cand.size, ties)
    worse, better = ("less", "greater") if higher_is_better else ("greater", "less")
    if np.all(pooled == pooled[0]):  # no information at all; scipy's normal approximation is 0/0
        p_worse = p_better = 1.0
    elif base.size == cand.size:
        # One vectorized call: "cand less than base" is "base greater than cand".
        greater = scipy.stats.mannwhitneyu(
            np.stack([cand, base]), np.stack([base, cand]), alternative="greater", method=method, axis=1
        ).pvalue
        p_up, p_down = float(greater[0]), float(greater[1])
        p_worse, p_better = (p_down, p_up) if higher_is_better else (p_up, p_down)
    else:
        p_worse = float(scipy.stats.mannwhitneyu(cand, base, alternative=worse, method=method).pvalue)
        p_better = float(scipy.stats.mannwhitneyu(cand, base, alternative=better, method=method).pvalue)
    return p_worse, p_better, mwu_p_floor(base.size, cand.size, method)


def _median_ratio(b: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(c, axis=axis) / np.median(b, axis=axis)


def _bootstrap_ci(data: tuple[np.ndarray, ...], statistic, seed: int) -> tuple[float | None, float | None]:
    """Seeded percentile-bootstrap CI; None where a side has fewer than 2 runs."""
    if min(len(d) for d in data) < 2:
        return None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate (constant) resamples: handled below
        res = scipy.stats.bootstrap(
            data,
            statistic,
            paired=False,
            vectorized=True,
            n_resamples=BOOTSTRAP_RESAMPLES,
            confidence_level=CI_LEVEL,
            method="percentile",
            **{_RNG_KW: np.random.default_rng(seed)},
        )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        return None, None
    return low, high


def compare_runs(
    spec: MetricSpec,
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    threshold: float,
    alpha: float,
    seed: int = 0,
) -> Comparison:
    """Medians of per-run values: one-sided Mann-Whitney U and a bootstrap CI of the ratio.

    The verdict is provisional (this comparison alone, m = 1); :func:`decide` sets the final one.
    """
    base, cand = _values(f"{spec.name} baseline", baseline), _values(f"{spec.name} candidate", candidate)
    p_worse, p_better, floor = _mwu_pvalues(base, cand, spec.higher_is_better)
    ci_low, ci_high = _bootstrap_ci((base, cand), _median_ratio, seed)
    return _provisional(
        spec,
        (float(np.median(base)), float(np.median(cand))),
        (ci_low, ci_high),
        (p_worse, p_better, floor),
        (int(base.size), int(cand.size)),
        (_cv(base), _cv(cand)),
        threshold=threshold,
        alpha=alpha,
    )


def _provisional(
    spec: MetricSpec,
    values: tuple[float, float],
    ci: tuple[float | None, float | None],
    p: tuple[float, float, float],
    n_runs: tuple[int, int],
    cv: tuple[float, float],
    *,
    threshold: float,
    alpha: float,
    **tail: Any,
) -> Comparison:
    """A Comparison decided on its own (m = 1); each pair is (baseline, candidate) and ``p`` is
    (p worse, p better, p floor). ``tail``: the extra fields of a tail comparison."""
    c = Comparison(
        metric=spec.name,
        label=spec.label,
        phase=spec.phase,
        unit=spec.unit,
        higher_is_better=spec.higher_is_better,
        threshold=threshold,
        baseline_value=values[0],
        candidate_value=values[1],
        ratio=values[1] / values[0],
        ci_low=ci[0],
        ci_high=ci[1],
        p_value=p[0],
        p_value_better=p[1],
        p_floor=p[2],
        n_baseline=n_runs[0],
        n_candidate=n_runs[1],
        cv_baseline=cv[0],
        cv_candidate=cv[1],
        verdict=Verdict.UNCHANGED,
        reason="",
        **tail,
    )
    return _decided(c, p[0], p[1], alpha=alpha, m=1, fail_unstable=False)


# ---------------------------------------------------------------------------------------------
# Tails: pooled quantiles, resampling whole runs


class _Pooled:
    """Tokens of several runs sorted once, so the pooled quantile of any multiset of runs
    (a permutation's group, a bootstrap resample) is a binary search over per-run counts."""

    def __init__(self, runs: Sequence[np.ndarray]) -> None:
        values = np.concatenate(runs)
        owner = np.repeat(np.arange(len(runs)), [len(r) for r in runs])
        order = np.argsort(values, kind="stable")
        self.values = values[order]
        # counts[i, r]: tokens of run r among the i + 1 smallest.
        # Counts and weights as floats (fast row-wise dots), float32 while every weighted count
        # (at most runs x tokens) is an exactly representable integer.
        self.dtype = np.float32 if len(runs) * values.size < 2**24 else np.float64
        self.counts = np.cumsum(np.eye(len(runs), dtype=self.dtype)[owner[order]], axis=0)
        self.sizes = self.counts[-1]

    def _index_of_rank(self, weights: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Per row, the sorted position of the element of 0-based ``rank`` in the weighted
        multiset: the first position whose weighted count exceeds ``rank``. Bisection with
        row-wise dots (einsum: no BLAS thread pool, which small products only keep busy)."""
        lo = np.zeros(len(weights), dtype=np.int64)
        hi = np.full(len(weights), len(self.values) - 1, dtype=np.int64)
        for _ in range(max(1, int(len(self.values)).bit_length())):
            mid = (lo + hi) // 2
            above = np.einsum("ij,ij->i", np.take(self.counts, mid, axis=0), weights) > rank
            hi = np.where(above, mid, hi)
            lo = np.where(above, lo, mid + 1)
        return hi

    def quantiles(self, weights: np.ndarray, q: float) -> np.ndarray:
        """Row-wise q-quantile (numpy's linear method) where run r counts ``weights[:, r]`` times."""
        weights = np.asarray(weights, dtype=self.dtype)
        n = np.rint(np.einsum("ij,j->i", weights, self.sizes)).astype(np.int64)
        h = (n - 1) * q
        lo = np.floor(h).astype(np.int64)
        frac = h - lo
        # Both order statistics in one search: fewer, larger numpy calls.
        both = self._index_of_rank(np.vstack([weights, weights]), np.concatenate([lo, np.minimum(lo + 1, n - 1)]))
        v_lo, v_hi = self.values[both[: len(weights)]], self.values[both[len(weights) :]]
        return v_lo + frac * (v_hi - v_lo)


def _tail_stat(pooled: _Pooled, labels: np.ndarray, q: float) -> np.ndarray:
    """log(candidate quantile / baseline quantile) for rows of run labels (1 = candidate)."""
    both = np.log(pooled.quantiles(np.vstack([labels, 1 - labels]), q))
    return both[: len(labels)] - both[len(labels) :]


def _permutation_pvalues(
    pooled: _Pooled,
    n_base: int,
    n_cand: int,
    q: float,
    worse_is_larger: bool,
    seed: int,
    certify_at: float | None = None,
) -> tuple[float, float, float]:
    """(worse-direction p, better-direction p, p floor) of the run-label permutation test.

    ``certify_at`` (for simulations that only need to know whether the worse-direction p
    could fall below a level): stop drawing as soon as it is certain to end at or above it,
    and return lower bounds of both p-values. The draws up to that point are the same as
    without it.
    """
    observed_labels = np.array([[0] * n_base + [1] * n_cand], dtype=np.int32)
    observed = float(_tail_stat(pooled, observed_labels, q)[0])
    tol = 1e-9 * max(1.0, abs(observed))
    sign = 1.0 if worse_is_larger else -1.0
    n_splits = math.comb(n_base + n_cand, n_cand)

    def hits(stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return sign * stats >= sign * observed - tol, sign * stats <= sign * observed + tol

    if n_splits <= PERMUTATION_EXACT_MAX:
        labels = np.zeros((n_splits, n_base + n_cand), dtype=np.int32)
        for i, chosen in enumerate(itertools.combinations(range(n_base + n_cand), n_cand)):
            labels[i, list(chosen)] = 1
        worse, better = hits(_tail_stat(pooled, labels, q))
        return float(worse.mean()), float(better.mean()), 1.0 / n_splits

    # Besag & Clifford (1991): sample until PERMUTATION_HITS permutations are as extreme as the
    # data (p = hits / permutations drawn) or PERMUTATION_MAX are drawn (p = (hits + 1) / (max + 1)).
    rng = np.random.default_rng(seed)
    base_labels = observed_labels[0]
    counts = [0, 0]
    p: list[float | None] = [None, None]
    drawn, batch = 0, 128
    def bound(k: int) -> float:  # the least p direction k can still end with
        return min(PERMUTATION_HITS / PERMUTATION_MAX, (counts[k] + 1) / (PERMUTATION_MAX + 1))

    while drawn < PERMUTATION_MAX and (p[0] is None or p[1] is None):
        if certify_at is not None and (p[0] is not None and p[0] >= certify_at or bound(0) >= certify_at):
            return tuple(p[k] if p[k] is not None else bound(k) for k in (0, 1)) + (  # type: ignore[return-value]
                max(1.0 / n_splits, 1.0 / (PERMUTATION_MAX + 1)),
            )
        size = min(batch, PERMUTATION_MAX - drawn)
        labels = rng.permuted(np.broadcast_to(base_labels, (size, base_labels.size)), axis=1)
        for k, h in enumerate(hits(_tail_stat(pooled, labels, q))):
            if p[k] is not None:
                continue
            running = counts[k] + np.cumsum(h)
            if running[-1] >= PERMUTATION_HITS:
                stop = int(np.argmax(running >= PERMUTATION_HITS)) + 1
                p[k] = PERMUTATION_HITS / (drawn + stop)
            counts[k] = int(running[-1])
        drawn += size
        batch = min(batch * 2, 8192)
    final = [pk if pk is not None else (counts[k] + 1) / (PERMUTATION_MAX + 1) for k, pk in enumerate(p)]
    floor = max(1.0 / n_splits, 1.0 / (PERMUTATION_MAX + 1))
    return final[0], final[1], floor


def _runs(name: str, runs: Sequence[Sequence[float]]) -> list[np.ndarray]:
    out = [np.asarray(r, dtype=float).ravel() for r in runs]
    out = [r for r in out if r.size]
    if not out:
        raise ValueError(f"{name}: no ITL samples")
    for r in out:
        if not np.all(np.isfinite(r)) or np.any(r <= 0):
            raise ValueError(f"{name}: ITL samples must be finite and positive")
    return out


def compare_tail(
    spec: MetricSpec,
    baseline_runs: Sequence[Sequence[float]],
    candidate_runs: Sequence[Sequence[float]],
    *,
    q: float = 0.95,
    threshold: float,
    alpha: float,
    seed: int = 0,
) -> Comparison:
    """Pooled ITL q-quantile, candidate against baseline, resampling whole runs.

    p-values: permutation of run labels (exact or sequential Monte Carlo, see the module
    docstring). CI: cluster bootstrap of runs on each side. CVs are of per-run mean ITL (the
    machine's run-to-run stability; a run's own p95 from ~60 tokens is mostly sampling noise).
    The verdict is provisional (m = 1); :func:`decide` sets the final one.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    base = _runs(f"{spec.name} baseline", baseline_runs)
    cand = _runs(f"{spec.name} candidate", candidate_runs)
    pooled = _Pooled(base + cand)
    worse_is_larger = not spec.higher_is_better
    p_worse, p_better, floor = _permutation_pvalues(pooled, len(base), len(cand), q, worse_is_larger, seed)

    b_pool, c_pool = _Pooled(base), _Pooled(cand)

    def ratio(ib: np.ndarray, ic: np.ndarray, axis: int = -1) -> np.ndarray:
        ib, ic = np.moveaxis(ib, axis, -1), np.moveaxis(ic, axis, -1)
        shape = ib.shape[:-1]
        ib, ic = ib.reshape(-1, ib.shape[-1]), ic.reshape(-1, ic.shape[-1])
        wb = (ib[:, :, None] == np.arange(len(base))).sum(axis=1)
        wc = (ic[:, :, None] == np.arange(len(cand))).sum(axis=1)
        return (c_pool.quantiles(wc, q) / b_pool.quantiles(wb, q)).reshape(shape)

    ci_low, ci_high = _bootstrap_ci((np.arange(len(base)), np.arange(len(cand))), ratio, seed)
    return _provisional(
        spec,
        (float(np.quantile(np.concatenate(base), q)), float(np.quantile(np.concatenate(cand), q))),
        (ci_low, ci_high),
        (p_worse, p_better, floor),
        (len(base), len(cand)),
        (_cv(np.array([r.mean() for r in base])), _cv(np.array([r.mean() for r in cand]))),
        threshold=threshold,
        alpha=alpha,
        quantile=q,
        n_tokens_baseline=int(sum(r.size for r in base)),
        n_tokens_candidate=int(sum(r.size for r in cand)),
    )


# ---------------------------------------------------------------------------------------------
# Across comparisons


def holm(p_values: Sequence[float], m: int | None = None) -> list[float]:
    """Holm step-down adjusted p-values (monotone, capped at 1), in input order.

    ``m`` > ``len(p_values)`` counts the missing comparisons as not yet seen, with p = 1.
    Holm's adjusted p-values never decrease when any input p-value increases, and 1 is the
    largest p-value there is, so the result is an upper bound of each one's adjustment once
    the unseen p-values are known, whatever they turn out to be: a comparison rejected now
    stays rejected in the session-wide adjustment.
    """
    p = np.asarray(p_values, dtype=float)
    k = p.size
    m = k if m is None else int(m)
    if m < k:
        raise ValueError(f"m ({m}) is smaller than the number of p-values ({k})")
    if np.any((p < 0) | (p > 1) | np.isnan(p)):
        raise ValueError("p-values must lie in [0, 1]")
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(k)
    running = 0.0
    # Unseen p = 1 sort after every seen one, so seen rank i keeps the multiplier m - i.
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return [float(v) for v in adjusted]


def runs_needed(alpha: float, m: int) -> int:
    """Fewest runs a side (equal counts) whose exact U-test floor is below alpha / m."""
    n = 1
    while 1.0 / math.comb(2 * n, n) >= alpha / m:
        n += 1
    return n


def _beyond(c: Comparison, worse: bool) -> bool:
    """Does the CI end in the given direction lie beyond the threshold (point estimate when no CI)?"""
    lo = c.ci_low if c.ci_low is not None else c.ratio
    hi = c.ci_high if c.ci_high is not None else c.ratio
    up = worse != c.higher_is_better  # the direction is "ratio goes up"
    return hi > 1.0 + c.threshold if up else lo < 1.0 - c.threshold


def _decided(
    c: Comparison, p_adj: float | None, p_adj_better: float | None, *, alpha: float, m: int, fail_unstable: bool
) -> Comparison:
    """The verdict of one comparison given its adjusted p-values (see the module docstring)."""
    unstable = [
        f"CV {cv * 100:.0f}% {side}"
        for side, cv in (("baseline", c.cv_baseline), ("candidate", c.cv_candidate))
        if cv is not None and cv >= UNSTABLE_CV
    ]

    def done(verdict: Verdict, reason: str) -> Comparison:
        return dataclasses.replace(c, verdict=verdict, reason=reason)

    if c.p_value is None or p_adj is None:
        return done(Verdict.INSUFFICIENT, c.reason or "no p-value")
    if c.quantile is not None:
        few = min(c.n_tokens_baseline or 0, c.n_tokens_candidate or 0)
        if few * (1.0 - c.quantile) < MIN_TAIL_SAMPLES:
            need = math.ceil(MIN_TAIL_SAMPLES / (1.0 - c.quantile))
            return done(
                Verdict.INSUFFICIENT,
                f"too few tokens for the p{c.quantile * 100:g} tail: {few} ITL samples on a side leave "
                f"{few * (1.0 - c.quantile):.1f} above the quantile; need >= {MIN_TAIL_SAMPLES} "
                f"(>= {need} samples a side)",
            )
    worse_sig = p_adj < alpha
    better_sig = p_adj_better is not None and p_adj_better < alpha
    if worse_sig and _beyond(c, worse=True):
        verdict, reason = Verdict.REGRESSION, f"significant and the CI reaches a {c.threshold:.0%} slowdown"
    elif better_sig and _beyond(c, worse=False):
        verdict, reason = Verdict.IMPROVED, f"significant and the CI reaches a {c.threshold:.0%} speed-up"
    elif worse_sig or better_sig:
        verdict, reason = Verdict.UNCHANGED, f"significant but negligible: the CI lies within {c.threshold:.0%}"
    elif c.p_floor is not None and c.p_floor >= alpha / m:
        extra = f"; also {', '.join(unstable)}" if unstable else ""
        if c.quantile is not None and alpha / m <= 1.0 / (PERMUTATION_MAX + 1):
            need = f"the tail's Monte Carlo floor is 1/{PERMUTATION_MAX + 1}"
        else:
            need = f"need >= {runs_needed(alpha, m)} runs a side"
        return done(
            Verdict.INSUFFICIENT,
            f"p-value floor: {c.n_candidate} vs {c.n_baseline} runs cannot give p below "
            f"{_fmt_p(c.p_floor)}, not below alpha/m = {_fmt_p(alpha / m)} (alpha {alpha:g}, "
            f"m={m}); {need}{extra}",
        )
    else:
        verdict, reason = Verdict.UNCHANGED, "not significant"
    if unstable and not (fail_unstable and verdict in (Verdict.REGRESSION, Verdict.IMPROVED)):
        would = f"; would be {verdict.value} ({reason})" if verdict is not Verdict.UNCHANGED else ""
        return done(
            Verdict.UNSTABLE,
            f"{', '.join(unstable)} >= {UNSTABLE_CV:.0%}: re-run on a quieter machine{would}",
        )
    if unstable:
        reason += f" ({', '.join(unstable)})"
    return done(verdict, reason)


def decide(
    comparisons: Sequence[Comparison], *, alpha: float, m: int | None = None, fail_unstable: bool = False
) -> list[Comparison]:
    """Holm-adjust the comparisons' p-values over a family of ``m`` (default: those given) and
    set final verdicts. Worse- and better-direction p-values are adjusted as separate families."""
    with_p = [i for i, c in enumerate(comparisons) if c.p_value is not None]
    family = len(with_p) if m is None else int(m)
    if family < len(with_p):
        raise ValueError(f"m ({family}) is smaller than the number of comparisons ({len(with_p)})")
    worse = holm([comparisons[i].p_value for i in with_p], m=family)
    better_idx = [i for i in with_p if comparisons[i].p_value_better is not None]
    better = dict(zip(better_idx, holm([comparisons[i].p_value_better for i in better_idx], m=family)))
    adjusted = dict(zip(with_p, worse))
    out = []
    for i, c in enumerate(comparisons):
        c = dataclasses.replace(c, p_adjusted=adjusted.get(i), p_adjusted_better=better.get(i))
        out.append(
            _decided(c, adjusted.get(i), better.get(i), alpha=alpha, m=max(family, 1), fail_unstable=fail_unstable)
        )
    return out


# ---------------------------------------------------------------------------------------------
# Planning


def lognormal_sigma(cv: float) -> float:
    """sigma of a lognormal with this coefficient of variation."""
    return math.sqrt(math.log1p(cv * cv))


def min_detectable_effect(
    n_runs: int,
    cv: float,
    *,
    alpha: float,
    m: int,
    power: float = 0.8,
    seed: int = 0,
    n_sim: int = 2000,
) -> float:
    """Smallest true slowdown (0.05 = 5%) detected with ``power`` by ``n_runs`` against
    ``n_runs`` runs with lognormal noise of this CV, as the only regression in a family of
    ``m``: the one-sided U test's p must pass Holm's first step, alpha / m (the worst case).

    By seeded simulation with common random numbers, so power rises monotonically with the
    effect and bisection is exact for the sample. This is the statistical limit; the
    threshold guard of :func:`decide` comes on top (effects well inside the threshold are
    UNCHANGED by design). ``inf`` when the p-value floor cannot pass alpha / m at all.
    """
    method = mwu_method(n_runs, n_runs, ties=False)
    if mwu_p_floor(n_runs, n_runs, method) >= alpha / m:
        return math.inf
    rng = np.random.default_rng(seed)
    z_base = rng.standard_normal((n_sim, n_runs))
    z_cand = rng.standard_normal((n_sim, n_runs))
    sigma = lognormal_sigma(cv)

    def power_at(effect: float) -> float:
        cand = z_cand + math.log1p(effect) / sigma  # U is rank-based: compare on the log scale
        p = scipy.stats.mannwhitneyu(cand, z_base, alternative="greater", method=method, axis=1).pvalue
        return float(np.mean(p < alpha / m))

    lo, hi = 0.0, 0.05
    while power_at(hi) < power:
        lo, hi = hi, hi * 2
        if hi > 100:
            return math.inf
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power_at(mid) >= power else (mid, hi)
        if hi - lo < 1e-4:
            break
    return hi
