"""The rule: estimate a change against the noise model and decide a verdict; the session-end suite-
relative check.

Pure numpy/scipy, analytic (no resampling: 1,000 comparisons take well under a second, and the
same inputs always give the same verdict). The model and the rule are explained, with the
measurements behind them, in ``docs/verdicts.md``; in short:

Noise model (log scale, one metric of one test)::

    log value of run i in session s = mu + change + S_s + ramp_s(i) + e_i

``e_i`` is run-to-run noise inside a session (what the runs show); ``S_s`` is the session's
level: a shared VM's speed moves between sessions (other tenants, frequency, memory placement),
and that cannot be seen inside one session. A session's typical value is the Hodges-Lehmann
location of its log values (robust: a few outlier runs barely move it; 95% efficient on
normal noise), its standard error from the MAD of the log values. The baseline keeps the levels
of its last K recorded sessions (``Level``), so the between-session spread is estimated from
them, shrunk towards a documented prior (``NoiseModel``); with one recorded session the prior
alone stands for it. The standard error of the change then holds both parts::

    se^2 = se_candidate^2 + mean(se_baseline^2) / K + sigma_between^2 * (1 + 1 / K)

More runs shrink only the first two terms: a change smaller than the between-session noise
cannot be shown by one session, however many runs it makes (the verdict says so).

Decision rule, per judged comparison (one per phase and test: TTFT for prefill, TPOT for
decode, ITL p95 for the decode tail; prefill and decode TPS are the same runs seen as rates and
mirror those verdicts, so each phase counts once in the family):

* REGRESSION: Holm-adjusted p (worse direction, over the session's family) < alpha AND the
  estimated change is beyond the threshold. A comparison whose whole CI lies beyond the
  threshold always meets both, however noisy the machine.
* IMPROVED: the mirror image.
* UNCHANGED: shown within the threshold: the one-sided bounds at ``EQUIVALENCE_CONFIDENCE`` on
  both sides lie inside +-threshold.
* INCONCLUSIVE: anything else. The reason says which way the data lean and how many runs would
  decide, or that runs cannot (between-session noise) and what can (more recorded baseline
  sessions, an interleaved A/B).
* MACHINE_SLOWER: set by ``regression.judge`` when steal time or context switches show the
  machine was not the engine's during the runs; a slowdown is then not blamed on the subject.

No dispersion flag overrides a verdict: noise widens the standard error, so noisy data end
INCONCLUSIVE unless the effect is larger than the noise can explain.

At the end of a session, ``suite_relative`` also judges each measurement against the median
shift of the others (the shared part of the session's drift): it needs the whole session's
comparisons at once (in the controller under pytest-xdist), spends its own share of the
session's alpha and only ever adds REGRESSION verdicts. What this builds on is ``verdict`` (one
session's level, the noise between sessions, the result and the rule)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr, stdtr

from ..core import catalog
from ..core.catalog import Metric
from .verdict import (
    CI_LEVEL,
    MAD_SCALE,
    WINDOW_MIN_SESSIONS,
    Comparison,
    Level,
    NoiseModel,
    NoiseSource,
    Shown,
    Verdict,
    decided,
    exp_clamped,
    fmt_p,
    fmt_pct,
    holm,
    level,
    t_quantile,
)

#: The compared metrics (from the catalog: those judged, and the rates that mirror them).
METRICS: dict[str, Metric] = {m.name: m for m in catalog.METRICS.values() if m.judged or m.mirror_of}
#: The metrics that are tested (one per phase and tail); each counts once in Holm's family.
JUDGED: tuple[Metric, ...] = tuple(m for m in METRICS.values() if m.judged)


def _t_cdf(df: float, x: float) -> float:
    """Student's t CDF; the normal one for infinite degrees of freedom."""
    return float(stdtr(df, x)) if math.isfinite(df) else float(ndtr(x))


def compare_levels(
    spec: Metric,
    baseline: Sequence[Level],
    candidate: Level,
    *,
    threshold: float,
    alpha: float,
    noise: NoiseModel = NoiseModel(),
    provisional: bool = True,
    window: Sequence[Level] = (),
) -> Comparison:
    """Candidate session level against the baseline's recorded session levels (newest last).

    ``window``: the history's last sessions of this test since the baseline was recorded
    (oldest first). From ``verdict.WINDOW_MIN_SESSIONS`` sessions on they are the reference and
    their spread the between-session noise (``NoiseModel.window``); with fewer, the baseline's
    recorded sessions are, pooled with the prior (``NoiseModel.between``).

    The verdict is provisional (this comparison alone, m = 1; left INCONCLUSIVE without
    ``provisional``); :func:`decide` sets the final one.
    """
    ref, source = _reference(spec, baseline, window)
    history = source is NoiseSource.HISTORY
    k = len(ref)
    base_log = sum(s.log_level for s in ref) / k
    within_ref = sum(s.se**2 for s in ref) / k**2
    between, parts = _noise_terms(ref, candidate, within_ref, noise, history=history)
    se, df = _welch(parts)
    d = candidate.log_level - base_log
    worse = -d if spec.higher_is_better else d
    p_worse, p_better = _p_values(worse, se, df)
    z = t_quantile(df, 0.5 + CI_LEVEL / 2)
    latest = ref[-1]
    c = Comparison(
        metric=spec.name,
        label=spec.label,
        phase=spec.phase,
        unit=spec.unit,
        higher_is_better=spec.higher_is_better,
        threshold=threshold,
        baseline_value=exp_clamped(base_log),
        candidate_value=candidate.value,
        ratio=exp_clamped(d),
        ci_low=exp_clamped(d - z * se),
        ci_high=exp_clamped(d + z * se),
        p_value=p_worse,
        p_value_better=p_better,
        n_baseline=latest.n,
        n_candidate=candidate.n,
        cv_baseline=latest.spread,
        cv_candidate=candidate.spread,
        verdict=Verdict.INCONCLUSIVE,
        reason="",
        se_log=se,
        se_within_log=math.sqrt(candidate.se**2 + within_ref),
        between_sd=between,
        baseline_sessions=k,
        upper_ratio=_upper_ratio(candidate, ref if history else [latest]),
        df=df if math.isfinite(df) else None,
        noise_source=source,
        noise_sessions=k if source is not NoiseSource.PRIOR else 0,
        shown=Shown.LEVEL,
        whole_ratio=None if candidate.whole is None else exp_clamped(candidate.whole - base_log),
    )
    return decided(c, p_worse, p_better, alpha=alpha) if provisional else c


def _reference(spec: Metric, baseline: Sequence[Level], window: Sequence[Level]) -> tuple[list[Level], NoiseSource]:
    """The sessions a candidate is compared against, and where the between-session noise comes
    from: the history (a window of at least ``WINDOW_MIN_SESSIONS``), else the baseline's recorded
    sessions (the prior with only one)."""
    history = len(window) >= WINDOW_MIN_SESSIONS
    ref = list(window) if history else list(baseline)
    if not ref:
        raise ValueError(f"{spec.name}: the baseline holds no session")
    return ref, NoiseSource.HISTORY if history else NoiseSource.BASELINE if len(ref) >= 2 else NoiseSource.PRIOR


def _noise_terms(
    ref: Sequence[Level], candidate: Level, within_ref: float, noise: NoiseModel, *, history: bool
) -> tuple[float, tuple[tuple[float, float], ...]]:
    """The between-session sd, and the (variance, degrees of freedom) of each term of the
    change's standard error: against a history window, or the baseline's recorded sessions
    pooled with the prior."""
    k = len(ref)
    if history:
        # The window's levels vary by between + their own within-session error: that whole
        # variance, estimated with k - 1 degrees of freedom, stands for the reference's and
        # the candidate's session terms together; only the candidate's within-session error
        # beyond the window's typical one is added. (Subtracting the within part first, and
        # giving the small remainder k - 1 degrees of freedom, made the total look precise
        # whenever the window came out quiet by chance: false alarms.)
        total = sum((s.log_level - sum(r.log_level for r in ref) / k) ** 2 for s in ref) / (k - 1)
        return noise.window(ref)[0], (
            (max(0.0, candidate.se**2 - within_ref * k), candidate.n - 1),
            (total * (1.0 + 1.0 / k), k - 1.0),
        )
    between = noise.between(ref)
    return between, (  # (variance, degrees of freedom) of each term of the standard error
        (candidate.se**2, candidate.n - 1),
        (within_ref, sum(s.n - 1 for s in ref)),
        (between**2 * (1.0 + 1.0 / k), noise.between_df(k)),
    )


def _welch(parts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(standard error, degrees of freedom) of a sum of estimated variances.

    Welch-Satterthwaite: run spreads are estimated from a few runs, so the statistic is
    Student's t, not normal (a spread that came out small must not make a false alarm)."""
    se = math.sqrt(sum(v for v, _ in parts))
    weights = sum(v * v / f for v, f in parts if f > 0 and v > 0)
    # No term with finite degrees of freedom (one run a side, the prior alone): normal.
    return se, se**4 / weights if se > 0 and weights > 0 else math.inf


def _p_values(worse: float, se: float, df: float) -> tuple[float, float]:
    """One-sided p-values (worse, better) of a change ``worse`` (log scale, worse direction)."""
    if se > 0:
        return _t_cdf(df, -worse / se), _t_cdf(df, worse / se)
    # constant values on both sides: only an exact difference is evidence
    return (0.0 if worse > 0 else 1.0), (0.0 if worse < 0 else 1.0)


def _upper_ratio(candidate: Level, shaped: Sequence[Level]) -> float | None:
    """How much further the candidate's slowest runs (p90) sit above its level than the
    reference's did: ``shaped`` is the latest recorded session, or a history window (a steadier
    reference for the shape check), whose mean shape is taken."""
    uppers = [s.upper - s.log_level for s in shaped if s.upper is not None]
    shape = sum(uppers) / len(uppers) if uppers else None
    if candidate.upper is None or shape is None:
        return None
    return exp_clamped((candidate.upper - candidate.log_level) - shape)


def compare_runs(
    spec: Metric,
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    threshold: float,
    alpha: float,
    noise: NoiseModel = NoiseModel(),
    baseline_history: Sequence[Level] = (),
) -> Comparison:
    """Per-run values of one baseline session (plus older recorded levels) against a candidate's."""
    base = level(baseline, f"{spec.name} baseline")
    cand = level(candidate, f"{spec.name} candidate")
    return compare_levels(spec, [*baseline_history, base], cand, threshold=threshold, alpha=alpha, noise=noise)


#: A mirror's own change: (ratio, CI low, CI high) of the rate, candidate / baseline.
Change = tuple[float, float | None, float | None]


def mirrored(
    c: Comparison,
    spec: Metric,
    values: tuple[float, float],
    *,
    shown: Shown | None = None,
    change: Change | None = None,
) -> Comparison:
    """The rate view of a judged comparison (prefill TPS of TTFT's runs, decode TPS of TPOT's):
    the same p-values and verdict, so both always agree, shown with the rate's own figures
    ``values`` (baseline, candidate) of the statistic ``shown`` (default: the judged one's).
    ``change``: the rate's own ratio and CI, whose percentage the line shows beside its figures
    (its medians; against REF the pairs' ratio of the rate); None: the rate is the reciprocal of
    the judged figure run by run (decode TPS = 1000 / TPOT), so its ratio and CI are the judged
    ones turned over, and ``values`` are the judged figures turned over too."""
    ratio, low, high = change or (
        1.0 / c.ratio,
        None if c.ci_high is None else 1.0 / c.ci_high,
        None if c.ci_low is None else 1.0 / c.ci_low,
    )
    return dataclasses.replace(
        c,
        metric=spec.name,
        label=spec.label,
        unit=spec.unit,
        higher_is_better=spec.higher_is_better,
        baseline_value=values[0],
        candidate_value=values[1],
        ratio=ratio,
        ci_low=low,
        ci_high=high,
        mirror_of=c.metric,
        shown=c.shown if shown is None else shown,
    )


def followed(c: Comparison, mirror: Comparison) -> Comparison:
    """``mirror`` (a rate shown beside ``c``, ``mirrored``) taking ``c``'s verdict, p-values and
    reason, its own figures and change kept."""
    return mirrored(
        c,
        METRICS[mirror.metric],
        (mirror.baseline_value, mirror.candidate_value),
        shown=mirror.shown,
        change=(mirror.ratio, mirror.ci_low, mirror.ci_high),
    )


def _p(p_value: float | None) -> float:
    """A p-value for Holm: a missing one is no evidence (1.0)."""
    return 1.0 if p_value is None else p_value


def _holm_family(comparisons: Sequence[Comparison], m: int | None) -> tuple[int, dict[int, float], dict[int, float]]:
    """The family's size (``m``; default: the judged comparisons given) and the judged
    comparisons' Holm-adjusted worse- and better-direction p-values, by index."""
    judged = [i for i, c in enumerate(comparisons) if c.mirror_of is None and c.p_value is not None]
    family = len(judged) if m is None else int(m)
    if family < len(judged):
        raise ValueError(f"m ({family}) is smaller than the number of comparisons ({len(judged)})")
    worse = dict(zip(judged, holm([_p(comparisons[i].p_value) for i in judged], m=family)))
    better = dict(zip(judged, holm([_p(comparisons[i].p_value_better) for i in judged], m=family)))
    return family, worse, better


def decide(comparisons: Sequence[Comparison], *, alpha: float, m: int | None = None) -> list[Comparison]:
    """Holm-adjust the judged comparisons' p-values over a family of ``m`` (default: those
    given; mirrors excluded) and set final verdicts; mirrors take their metric's verdict.
    Worse- and better-direction p-values are adjusted as separate families."""
    family, worse, better = _holm_family(comparisons, m)
    out: list[Comparison] = []
    by_metric: dict[str, Comparison] = {}
    for i, c in enumerate(comparisons):
        if c.mirror_of is None:
            c = decided(
                c,
                worse.get(i),
                better.get(i),
                alpha=alpha,
                m=max(family, 1),
                p_adjusted=worse.get(i),
                p_adjusted_better=better.get(i),
            )
            by_metric[c.metric] = c
        out.append(c)
    # Mirrors follow their judged metric (computed from the same runs).
    return [followed(by_metric[c.mirror_of], c) if c.mirror_of in by_metric else c for c in out]


#: Suite-relative check (:func:`suite_relative`): with at least this many compared
#: measurements in a session, each is also judged against the median shift of the others.
MIN_PEERS = 6
#: Share of the session's alpha spent on the suite-relative check (the rest on the
#: per-test comparisons against the baseline), so both together keep the family-wise rate.
SUITE_ALPHA_SHARE = 0.5
#: Prior sd (log scale) of one measurement's session level around the suite's shared shift:
#: what the other tests cannot explain (the calibration model has 0.5%; the estimate from the
#: session's own residuals can only raise it).
TEST_BETWEEN_SD = 0.01


def _leave_one_out_medians(d: np.ndarray) -> np.ndarray:
    """The median of all values but the j-th, for every j (O(n log n))."""
    n = d.size
    order = np.argsort(d, kind="stable")
    s = d[order]
    pos = np.empty(n, dtype=int)
    pos[order] = np.arange(n)
    m = n - 1
    lo, hi = (m - 1) // 2, m // 2  # the middle of the n - 1 remaining, sorted

    def at(k: int) -> np.ndarray:
        return np.asarray(np.where(k < pos, s[k], s[np.minimum(k + 1, n - 1)]))

    middle: np.ndarray = (at(lo) + at(hi)) / 2.0
    return middle


def suite_relative(tests: Sequence[Sequence[Comparison]], *, alpha: float) -> list[list[Comparison]]:
    """Each measurement of a session against the others' shared shift (docs/verdicts.md).

    Most of a session's drift is shared by all its tests (the machine that day), and it is
    what limits a comparison against a stored baseline. The median shift of the *other*
    measurements of the same metric estimates it, so one measurement's departure from it is
    known far more precisely than its own shift. A departure significant at ``alpha`` (Holm
    over every such comparison of the session) and beyond the threshold, on a measurement
    that is itself slower than its baseline, is a REGRESSION ("slower than the rest of the
    suite"). A change that slows every test alike leaves the departures at zero and is
    judged by the per-test comparisons, never normalised away: this check only adds
    REGRESSION verdicts. Needs ``MIN_PEERS`` compared measurements; ``tests``: each
    measurement's comparisons, as ``rule.decide`` left them; returned in the same shape.
    """
    out = [list(cs) for cs in tests]
    candidates = [found for spec in JUDGED for found in _departures(spec, out)]
    if not candidates:
        return out
    adjusted = holm([cand[3] for cand in candidates])
    for (t, i, departure, _, shift, peers), p_adj in zip(candidates, adjusted):
        new = _slower_than_suite(out[t][i], departure, p_adj, shift, peers, alpha=alpha)
        if new is not None:
            out[t] = _with_mirrors(out[t], i, new)
    return out


def _compared(c: Comparison, spec: Metric) -> bool:
    """``c`` is a judged comparison of ``spec`` with a p-value and a ratio (a suite peer)."""
    return c.metric == spec.name and c.mirror_of is None and c.p_value is not None and c.ratio > 0


def _departures(spec: Metric, tests: Sequence[Sequence[Comparison]]) -> list[tuple[int, int, float, float, float, int]]:
    """(test, index, departure, p, peers' median shift, peers) of each compared measurement of
    ``spec``: its shift (log scale, worse direction) beyond the median shift of the others,
    and the one-sided p-value of that departure; none with fewer than ``MIN_PEERS``."""
    found = [(t, i, c) for t, cs in enumerate(tests) for i, c in enumerate(cs) if _compared(c, spec)]
    if len(found) < MIN_PEERS:
        return []
    sign = -1.0 if spec.higher_is_better else 1.0
    d = np.array([sign * math.log(c.ratio) for _, _, c in found])
    w = np.array([c.se_within_log**2 for _, _, c in found])
    n = d.size
    # What the shared shift leaves per measurement, from the session itself (robust to the
    # few that really changed); never below the prior.
    resid = d - float(np.median(d))
    tau2 = max(TEST_BETWEEN_SD**2, (MAD_SCALE * float(np.median(np.abs(resid)))) ** 2 - float(np.median(w)))
    shifts = _leave_one_out_medians(d)
    var_shifts = (math.pi / 2.0) * ((w.sum() - w) / (n - 1) + tau2) / (n - 1)
    out = []
    for j, (t, i, c) in enumerate(found):
        shift = float(shifts[j])
        se = math.sqrt(w[j] + tau2 + float(var_shifts[j]))
        p = float(stdtr(max(c.n_candidate - 1, 1), -(d[j] - shift) / se))
        out.append((t, i, float(d[j] - shift), p, shift, n - 1))
    return out


def _slower_than_suite(
    c: Comparison, departure: float, p_adj: float, shift: float, peers: int, *, alpha: float
) -> Comparison | None:
    """``c`` as a suite-relative REGRESSION, when its departure is significant (Holm-adjusted
    ``p_adj``), beyond the threshold and itself a slowdown, and no verdict already stands for
    it (REGRESSION, MACHINE_SLOWER, IMPROVED); else None."""
    if p_adj >= alpha or departure <= math.log1p(c.threshold) or c.worse_log <= 0:
        return None
    if c.verdict in (Verdict.REGRESSION, Verdict.MACHINE_SLOWER, Verdict.IMPROVED):
        return None
    suite = exp_clamped(-shift if c.higher_is_better else shift)
    return dataclasses.replace(
        c,
        verdict=Verdict.REGRESSION,
        suite_ratio=suite,
        reason=(
            f"slower than the rest of the suite: {fmt_pct((exp_clamped(departure) - 1) * 100)} beyond the "
            f"median shift of {peers} other measurements ({fmt_pct((suite - 1) * 100)}), p={fmt_p(p_adj)} Holm "
            f"(suite-relative)"
        ),
    )


def _with_mirrors(comparisons: Sequence[Comparison], i: int, new: Comparison) -> list[Comparison]:
    """One measurement's comparisons with the ``i``-th replaced by ``new``, and the rates that
    mirror it following it."""
    out = []
    for k, m in enumerate(comparisons):
        if k == i:
            out.append(new)
        elif m.mirror_of == new.metric:
            out.append(followed(new, m))
        else:
            out.append(m)
    return out
