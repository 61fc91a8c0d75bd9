"""Regression or noise: the statistics that compare a candidate measurement with its baseline.

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

At the end of a session, :func:`suite_relative` also judges each measurement against the
median shift of the others (the shared part of the session's drift), and adds REGRESSION
verdicts for those significantly slower than the rest of the suite.

No dispersion flag overrides a verdict: noise widens the standard error, so noisy data end
INCONCLUSIVE unless the effect is larger than the noise can explain.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy.special import ndtri, stdtr, stdtrit

from ..core import catalog

#: Confidence of the reported CI of the ratio.
CI_LEVEL = 0.95
#: UNCHANGED needs the change bounded inside the threshold at this one-sided confidence, on
#: both sides. Between sessions of a shared machine the level itself moves by ~1.5%, so a 5%
#: threshold can be shown with about this confidence from one session (docs/verdicts.md).
EQUIVALENCE_CONFIDENCE = 0.80
#: Relative efficiency factor of the Hodges-Lehmann location: se = this * sigma / sqrt(n).
HL_SE_FACTOR = math.sqrt(math.pi / 3.0)
#: MAD -> standard deviation for normal noise.
MAD_SCALE = 1.4826
#: A robust level hides a slowdown of a minority of runs (30% of runs 1.5x slower barely moves
#: it). This quantile of the runs moves with such a minority; UNCHANGED also needs its distance
#: above the level (shape, not position: session drift moves both) to grow by less than
#: ``UPPER_FACTOR`` x the threshold over the latest baseline session's.
UPPER_QUANTILE = 0.90
UPPER_FACTOR = 2.0
#: Runs further than this many MADs from the median do not count in the spread.
OUTLIER_MADS = 3.5
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


class Verdict(str, enum.Enum):
    """Outcome of one comparison; only REGRESSION fails a test by default."""

    REGRESSION = "REGRESSION"
    IMPROVED = "IMPROVED"
    UNCHANGED = "UNCHANGED"
    INCONCLUSIVE = "INCONCLUSIVE"
    MACHINE_SLOWER = "MACHINE_SLOWER"


@dataclass(frozen=True)
class MetricSpec:
    """A per-run metric family: how to name it and which way is worse. ``mirror_of``: a rate
    computed from the same runs as another metric, reported with that metric's verdict."""

    name: str
    label: str
    unit: str
    phase: str
    higher_is_better: bool
    tail: bool = False
    mirror_of: str | None = None


def _spec(name: str, *, tail: bool = False, mirror_of: str | None = None) -> MetricSpec:
    """A compared metric: name, label, unit, phase and direction from the metric catalog."""
    m = catalog.METRICS[name]
    return MetricSpec(m.name, m.label, m.unit, m.phase, m.higher_is_better, tail=tail, mirror_of=mirror_of)


METRICS: dict[str, MetricSpec] = {
    s.name: s
    for s in (
        _spec("ttft_ms"),
        _spec("prefill_tps", mirror_of="ttft_ms"),
        _spec("tpot_ms"),
        _spec("decode_tps", mirror_of="tpot_ms"),
        _spec("itl_p95_ms", tail=True),
    )
}
#: The metrics that are tested (one per phase and tail); each counts once in Holm's family.
JUDGED: tuple[MetricSpec, ...] = tuple(s for s in METRICS.values() if s.mirror_of is None)


# ---------------------------------------------------------------------------------------------
# One session's level


@dataclass(frozen=True)
class Level:
    """A session's typical value of one metric on the log scale, and how precisely it is known."""

    log_level: float
    se: float
    n: int
    #: Robust standard deviation of the runs' log values (about the CV of the values).
    spread: float
    #: Log of the runs' 90th percentile: a slowdown of part of the runs shows here first.
    upper: float | None = None

    @property
    def value(self) -> float:
        return math.exp(self.log_level)

    def to_json(self) -> dict[str, float | int]:
        return {"log_level": round(self.log_level, 9), "se": round(self.se, 9), "n": self.n,
                "spread": round(self.spread, 9), "upper": None if self.upper is None else round(self.upper, 9)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Level":
        upper = d.get("upper")
        level = cls(float(d["log_level"]), float(d["se"]), int(d["n"]), float(d["spread"]),
                    None if upper is None else float(upper))
        if not (math.isfinite(level.log_level) and math.isfinite(level.se) and level.se >= 0 and level.n >= 1):
            raise ValueError(f"not a session level: {dict(d)!r}")
        return level


def _positive(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0:
        raise ValueError(f"{name}: no runs")
    if not (np.isfinite(a).all() and (a > 0).all()):
        raise ValueError(f"{name}: values must be finite and positive")
    return a


@functools.lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n)


def _median(a: np.ndarray) -> float:
    """Median of a 1-d array (numpy's median, without its per-call overhead)."""
    return _sorted_quantile(np.sort(a), 0.5)


def _sorted_quantile(s: np.ndarray, q: float) -> float:
    """numpy's default (linear) quantile of an already sorted 1-d array."""
    h = (s.size - 1) * q
    lo = int(h)
    hi = min(lo + 1, s.size - 1)
    return float(s[lo] + (h - lo) * (s[hi] - s[lo]))


def _hodges_lehmann(x: np.ndarray) -> float:
    """Median of the Walsh averages (x_i + x_j) / 2, i <= j."""
    i, j = _pairs(x.size)
    return _median((x[i] + x[j]) * 0.5)


def level(values: Sequence[float], name: str = "values") -> Level:
    """The session level of positive per-run values (robust location and its standard error)."""
    x = np.sort(np.log(_positive(name, values)))
    med = _sorted_quantile(x, 0.5)
    mad = MAD_SCALE * _median(np.abs(x - med))
    # The plain deviation of the runs within 3.5 MADs of the median: as stable as the
    # standard deviation on clean runs (the MAD alone is 37% efficient, and an unstable
    # standard error makes false alarms), yet one wild run does not inflate it.
    kept = x[np.abs(x - med) <= OUTLIER_MADS * mad] if mad > 0 else x
    spread = float(kept.std(ddof=1)) if kept.size > 2 else mad
    upper = _sorted_quantile(x, UPPER_QUANTILE)
    return Level(_hodges_lehmann(x), HL_SE_FACTOR * spread / math.sqrt(x.size), int(x.size), spread, upper)


# ---------------------------------------------------------------------------------------------
# Between sessions


@dataclass(frozen=True)
class NoiseModel:
    """What a session's level may do between sessions on the same hardware.

    ``between_sd``: the prior standard deviation of a session's level (log scale, 0.08 = 8%)
    for one metric of one test, for as long as the baseline's own history cannot say. Measured
    on this project's shared 2-vCPU VM with other work running: separate A/A sessions against
    one recorded baseline moved +1% to +27% (TTFT), sd about 5% around a mean of +13%, the
    recorded session itself being one draw (docs/verdicts.md). A smaller prior turns such a
    baseline into false alarms; a quiet machine earns a smaller figure from its history.
    ``prior_sessions``: how many sessions' worth of evidence the prior counts as, so that a
    baseline with a few recorded sessions is soon judged by its own spread.
    """

    between_sd: float = 0.08
    prior_sessions: float = 1.0

    def between_df(self, sessions: int) -> float:
        """Degrees of freedom of the between-session estimate: the prior alone is a stated
        figure (infinite); with history, the stored sessions plus the prior's weight."""
        return math.inf if sessions < 2 else self.prior_sessions + sessions - 1

    def between(self, sessions: Sequence[Level]) -> float:
        """Estimated between-session sd: the prior, pooled with the stored levels' spread beyond
        what their own runs explain."""
        k = len(sessions)
        prior = self.prior_sessions * self.between_sd**2
        if k < 2:
            return self.between_sd
        levels = [s.log_level for s in sessions]
        mean = sum(levels) / k
        within = sum(s.se**2 for s in sessions) / k
        excess = max(0.0, sum((v - mean) ** 2 for v in levels) / (k - 1) - within)
        return math.sqrt((prior + (k - 1) * excess) / (self.prior_sessions + k - 1))


# ---------------------------------------------------------------------------------------------
# One comparison


@dataclass(frozen=True)
class Comparison:
    """One metric, candidate against baseline. ``ratio`` and the CI are candidate/baseline of
    the value itself; which side is worse follows the metric."""

    metric: str
    label: str
    phase: str
    unit: str
    higher_is_better: bool
    #: Smallest relative change of the value that counts (0.05 = 5%).
    threshold: float
    #: Typical values (Hodges-Lehmann location; the baseline's over its stored sessions).
    baseline_value: float
    candidate_value: float
    ratio: float
    ci_low: float | None
    ci_high: float | None
    #: Raw one-sided p-value in the worse direction.
    p_value: float | None
    #: Raw one-sided p-value in the improvement direction.
    p_value_better: float | None
    n_baseline: int
    n_candidate: int
    #: Robust run-to-run spread (about the CV) of each side's latest session.
    cv_baseline: float | None
    cv_candidate: float | None
    verdict: Verdict
    reason: str
    #: Standard error of log(ratio), with the between-session part.
    se_log: float = 0.0
    #: The between-session sd used, and how many recorded sessions the baseline holds.
    between_sd: float = 0.0
    baseline_sessions: int = 1
    #: Holm-adjusted p-values; None until :func:`decide`.
    p_adjusted: float | None = None
    p_adjusted_better: float | None = None
    #: INCONCLUSIVE: candidate runs that would decide at this effect (None: runs cannot).
    runs_needed: int | None = None
    #: The judged metric this one mirrors (a rate of the same runs), else None.
    mirror_of: str | None = None
    #: How much further above its level the candidate's slowest runs (p90) lie than the latest
    #: baseline session's, as a ratio (1.0: the same shape).
    upper_ratio: float | None = None
    #: Standard error of log(ratio) from the runs alone (without the between-session part).
    se_within_log: float = 0.0
    #: Suite-relative REGRESSION: the other measurements' median ratio this one was judged
    #: against (:func:`suite_relative`), else None.
    suite_ratio: float | None = None

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the session JSON, pytest-xdist's wire), with the verdict's name and line."""
        return {**dataclasses.asdict(self), "verdict": self.verdict.value, "line": self.line()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Comparison":
        """The inverse of ``dataclasses.asdict`` (results cross pytest-xdist's wire as dicts)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and k != "verdict"}, verdict=Verdict(d["verdict"]))

    @property
    def failed(self) -> bool:
        return self.verdict is Verdict.REGRESSION

    @property
    def worth_more_runs(self) -> bool:
        """INCONCLUSIVE and more runs may decide it: the runs alone would (``runs_needed``), or
        it leans slower by half the threshold or more (more runs sharpen the shape check and
        the session-end suite-relative check). Leaning faster or level with runs that cannot
        decide: stop, a slowdown is not in sight."""
        if self.verdict is not Verdict.INCONCLUSIVE:
            return False
        worse = -math.log(self.ratio) if self.higher_is_better else math.log(self.ratio)
        return self.runs_needed is not None or worse >= math.log1p(self.threshold / 2)

    def line(self) -> str:
        """One line for a failure message or a log, e.g. ``decode regression: TPOT 7.41 ms vs
        6.52 ms baseline (+13.6%, 95% CI +9.8..+17.2%, p=0.0004 Holm, 20 vs 20 runs)``."""
        word = {
            Verdict.REGRESSION: "regression",
            Verdict.IMPROVED: "improvement",
            Verdict.UNCHANGED: "unchanged",
            Verdict.INCONCLUSIVE: "inconclusive",
            Verdict.MACHINE_SLOWER: "slower machine",
        }[self.verdict]
        parts = [f"{self.change_pct:+.1f}%"]
        if self.ci_low is not None and self.ci_high is not None:
            parts.append(f"95% CI {(self.ci_low - 1) * 100:+.1f}..{(self.ci_high - 1) * 100:+.1f}%")
        p, adjusted = self._shown_p()
        if p is not None:
            parts.append(f"p={_fmt_p(p)}{' Holm' if adjusted else ''}")
        parts.append(f"{self.n_candidate} vs {self.n_baseline} runs")
        if self.baseline_sessions > 1:
            parts.append(f"{self.baseline_sessions} baseline sessions")
        text = (
            f"{self.phase} {word}: {self.label} {_fmt_value(self.candidate_value)} {self.unit} "
            f"vs {_fmt_value(self.baseline_value)} {self.unit} baseline ({', '.join(parts)})"
        )
        if (self.verdict in (Verdict.INCONCLUSIVE, Verdict.MACHINE_SLOWER) or self.suite_ratio is not None) and self.reason:
            text += f": {self.reason}"
        return text

    def _shown_p(self) -> tuple[float | None, bool]:
        """The p-value of the direction the data moved."""
        better = self.verdict is Verdict.IMPROVED or (self.verdict is not Verdict.REGRESSION and self._improving)
        raw, adj = (self.p_value_better, self.p_adjusted_better) if better else (self.p_value, self.p_adjusted)
        return (adj, True) if adj is not None else (raw, False)

    @property
    def _improving(self) -> bool:
        return self.ratio > 1.0 if self.higher_is_better else self.ratio < 1.0


def _fmt_p(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def _fmt_value(v: float) -> str:
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def compare_levels(
    spec: MetricSpec,
    baseline: Sequence[Level],
    candidate: Level,
    *,
    threshold: float,
    alpha: float,
    noise: NoiseModel = NoiseModel(),
    provisional: bool = True,
) -> Comparison:
    """Candidate session level against the baseline's recorded session levels (newest last).

    The verdict is provisional (this comparison alone, m = 1; left INCONCLUSIVE without
    ``provisional``); :func:`decide` sets the final one.
    """
    if not baseline:
        raise ValueError(f"{spec.name}: the baseline holds no session")
    k = len(baseline)
    base_log = sum(s.log_level for s in baseline) / k
    between = noise.between(baseline)
    parts = (  # (variance, degrees of freedom) of each term of the standard error
        (candidate.se**2, candidate.n - 1),
        (sum(s.se**2 for s in baseline) / k**2, sum(s.n - 1 for s in baseline)),
        (between**2 * (1.0 + 1.0 / k), noise.between_df(k)),
    )
    se = math.sqrt(sum(v for v, _ in parts))
    # Welch-Satterthwaite: run spreads are estimated from a few runs, so the statistic is
    # Student's t, not normal (a spread that came out small must not make a false alarm).
    df = se**4 / sum(v * v / f for v, f in parts if f > 0 and v > 0) if se > 0 else math.inf
    d = candidate.log_level - base_log
    worse = -d if spec.higher_is_better else d
    if se > 0:
        p_worse, p_better = float(stdtr(df, -worse / se)), float(stdtr(df, worse / se))
    else:  # constant values on both sides: only an exact difference is evidence
        p_worse, p_better = (0.0 if worse > 0 else 1.0), (0.0 if worse < 0 else 1.0)
    z = float(stdtrit(df, 0.5 + CI_LEVEL / 2)) if math.isfinite(df) else float(ndtri(0.5 + CI_LEVEL / 2))
    latest = baseline[-1]
    c = Comparison(
        metric=spec.name,
        label=spec.label,
        phase=spec.phase,
        unit=spec.unit,
        higher_is_better=spec.higher_is_better,
        threshold=threshold,
        baseline_value=math.exp(base_log),
        candidate_value=candidate.value,
        ratio=math.exp(d),
        ci_low=math.exp(d - z * se),
        ci_high=math.exp(d + z * se),
        p_value=p_worse,
        p_value_better=p_better,
        n_baseline=latest.n,
        n_candidate=candidate.n,
        cv_baseline=latest.spread,
        cv_candidate=candidate.spread,
        verdict=Verdict.INCONCLUSIVE,
        reason="",
        se_log=se,
        se_within_log=math.sqrt(parts[0][0] + parts[1][0]),
        between_sd=between,
        baseline_sessions=k,
        upper_ratio=(
            math.exp((candidate.upper - candidate.log_level) - (latest.upper - latest.log_level))
            if candidate.upper is not None and latest.upper is not None else None
        ),
    )
    return _decided(c, p_worse, p_better, alpha=alpha) if provisional else c


def compare_runs(
    spec: MetricSpec,
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


def mirrored(c: Comparison, spec: MetricSpec, values: tuple[float, float] | None = None) -> Comparison:
    """The rate view of a judged comparison (prefill TPS of TTFT's runs, decode TPS of TPOT's):
    the reciprocal ratio and CI, the same p-values and verdict, so both always agree.
    ``values``: the rate's own typical (baseline, candidate) values to show."""
    shown = values or (1.0 / c.baseline_value, 1.0 / c.candidate_value)
    return dataclasses.replace(
        c,
        metric=spec.name,
        label=spec.label,
        unit=spec.unit,
        higher_is_better=spec.higher_is_better,
        baseline_value=shown[0],
        candidate_value=shown[1],
        ratio=1.0 / c.ratio,
        ci_low=None if c.ci_high is None else 1.0 / c.ci_high,
        ci_high=None if c.ci_low is None else 1.0 / c.ci_low,
        mirror_of=c.metric,
    )


# ---------------------------------------------------------------------------------------------
# Across comparisons


def holm(p_values: Sequence[float], m: int | None = None) -> list[float]:
    """Holm step-down adjusted p-values (monotone, capped at 1), in input order.

    ``m`` > ``len(p_values)`` counts the missing comparisons as not yet seen, with p = 1:
    Holm's adjusted p-values never decrease when an input grows, so the result bounds each
    one's final session-wide adjustment from above, and a comparison rejected now stays
    rejected once the session is complete.
    """
    p = np.asarray(p_values, dtype=float)
    k = p.size
    m = k if m is None else int(m)
    if m < k:
        raise ValueError(f"m ({m}) is smaller than the number of p-values ({k})")
    if np.any((p < 0) | (p > 1) | np.isnan(p)):
        raise ValueError("p-values must lie in [0, 1]")
    order = np.argsort(p, kind="stable")
    steps = np.minimum(1.0, (m - np.arange(k)) * p[order])
    adjusted = np.empty(k)
    adjusted[order] = np.maximum.accumulate(steps) if k else steps
    return [float(v) for v in adjusted]


def _q(alpha: float) -> float:
    return float(ndtri(1.0 - alpha))


def _runs_needed(c: Comparison, alpha_step: float) -> int | None:
    """Candidate runs at which this estimate would be decided (REGRESSION/IMPROVED at the
    current Holm step, or UNCHANGED), keeping the run spread and the baseline as they are.
    None when the between-session part alone leaves it undecided."""
    d = abs(math.log(c.ratio))
    t = math.log1p(c.threshold)
    rest = c.se_log**2 - (HL_SE_FACTOR * (c.cv_candidate or 0.0)) ** 2 / max(c.n_candidate, 1)
    rest = max(rest, 0.0)
    if d > t:
        target = d / _q(alpha_step)
    else:
        target = (t - d) / _q(1.0 - EQUIVALENCE_CONFIDENCE)
    room = target**2 - rest
    if room <= 0:
        return None
    spread = c.cv_candidate or 0.0
    return max(c.n_candidate + 1, math.ceil((HL_SE_FACTOR * spread) ** 2 / room))


def _part_slower(c: Comparison) -> str:
    """Why the robust level cannot be trusted to call this unchanged or better: the slowest
    runs moved (a minority of runs slowed down), else ''."""
    if c.upper_ratio is None or c.higher_is_better:
        return ""
    if math.log(c.upper_ratio) <= math.log1p(UPPER_FACTOR * c.threshold):
        return ""
    return (
        f"cannot decide: the typical run moved {c.change_pct:+.1f}% but the slowest runs "
        f"(p{UPPER_QUANTILE * 100:.0f}) {(c.upper_ratio - 1) * 100:+.1f}% more than that: part of the runs "
        f"slowed down; re-run, and look at the per-run values"
    )


def _decided(
    c: Comparison, p_adj: float | None, p_adj_better: float | None, *, alpha: float, m: int = 1, **fields: Any
) -> Comparison:
    """The verdict of one comparison given its adjusted p-values (see the module docstring);
    ``fields``: more fields to set in the same copy."""
    if c.p_value is None or p_adj is None:
        return dataclasses.replace(c, **fields, verdict=Verdict.INCONCLUSIVE, reason=c.reason or "no p-value")
    t = math.log1p(c.threshold)
    log_ratio = math.log(c.ratio)
    worse = -log_ratio if c.higher_is_better else log_ratio
    q_eq = _q(1.0 - EQUIVALENCE_CONFIDENCE)
    pct = f"{c.threshold:.0%}"
    if p_adj < alpha and worse > t:
        return dataclasses.replace(c, **fields, verdict=Verdict.REGRESSION, reason=f"significant and beyond {pct}")
    if p_adj_better is not None and p_adj_better < alpha and -worse > t:
        return dataclasses.replace(c, **fields, verdict=Verdict.IMPROVED, reason=f"significant and beyond {pct}")
    part = _part_slower(c)
    if part:
        return dataclasses.replace(c, **fields, verdict=Verdict.INCONCLUSIVE, reason=part)
    if abs(log_ratio) + q_eq * c.se_log < t:
        note = "significant but " if min(p_adj, p_adj_better or 1.0) < alpha else ""
        return dataclasses.replace(
            c, **fields, verdict=Verdict.UNCHANGED, reason=f"{note}within {pct} ({EQUIVALENCE_CONFIDENCE:.0%} confidence)"
        )
    lean = "slower" if worse > 0 else "faster"
    need = _runs_needed(c, alpha / max(m, 1))
    if need is None:
        how = (
            f"more runs cannot decide it: the baseline and the between-session noise (about "
            f"{c.between_sd:.1%} here) leave too much; record more baseline sessions "
            f"(--llmperf-update-baselines) or compare both sides in one session"
        )
    else:
        how = f"about {need} runs would decide it"
    return dataclasses.replace(
        c,
        **fields,
        verdict=Verdict.INCONCLUSIVE,
        reason=f"cannot decide: {abs(c.change_pct):.1f}% {lean}, not shown beyond or within {pct}; {how}",
        runs_needed=need,
    )


def decide(comparisons: Sequence[Comparison], *, alpha: float, m: int | None = None) -> list[Comparison]:
    """Holm-adjust the judged comparisons' p-values over a family of ``m`` (default: those
    given; mirrors excluded) and set final verdicts; mirrors take their metric's verdict.
    Worse- and better-direction p-values are adjusted as separate families."""
    judged = [i for i, c in enumerate(comparisons) if c.mirror_of is None and c.p_value is not None]
    family = len(judged) if m is None else int(m)
    if family < len(judged):
        raise ValueError(f"m ({family}) is smaller than the number of comparisons ({len(judged)})")
    worse = dict(zip(judged, holm([comparisons[i].p_value for i in judged], m=family)))
    better = dict(zip(judged, holm([comparisons[i].p_value_better for i in judged], m=family)))
    out: list[Comparison] = []
    by_metric: dict[str, Comparison] = {}
    for i, c in enumerate(comparisons):
        if c.mirror_of is None:
            c = _decided(c, worse.get(i), better.get(i), alpha=alpha, m=max(family, 1),
                         p_adjusted=worse.get(i), p_adjusted_better=better.get(i))
            by_metric[c.metric] = c
        out.append(c)
    # Mirrors follow their judged metric (computed from the same runs).
    return [
        mirrored(by_metric[c.mirror_of], METRICS[c.metric], (c.baseline_value, c.candidate_value))
        if c.mirror_of in by_metric
        else c
        for c in out
    ]


def _leave_one_out_medians(d: np.ndarray) -> np.ndarray:
    """The median of all values but the j-th, for every j (O(n log n))."""
    n = d.size
    order = np.argsort(d, kind="stable")
    s = d[order]
    pos = np.empty(n, dtype=int)
    pos[order] = np.arange(n)
    m = n - 1
    lo, hi = (m - 1) // 2, m // 2  # the middle of the n - 1 remaining, sorted
    at = lambda k: np.where(k < pos, s[k], s[np.minimum(k + 1, n - 1)])  # noqa: E731
    return (at(lo) + at(hi)) / 2.0


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
    measurement's comparisons, as :func:`decide` left them; returned in the same shape.
    """
    out = [list(cs) for cs in tests]
    #: (test, index, departure, p, peers' median shift, peers)
    candidates: list[tuple[int, int, float, float, float, int]] = []
    for spec in JUDGED:
        found = [(t, i, c) for t, cs in enumerate(out) for i, c in enumerate(cs)
                 if c.metric == spec.name and c.mirror_of is None and c.p_value is not None and c.ratio > 0]
        if len(found) < MIN_PEERS:
            continue
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
        for j, (t, i, c) in enumerate(found):
            shift = float(shifts[j])
            se = math.sqrt(w[j] + tau2 + float(var_shifts[j]))
            p = float(stdtr(max(c.n_candidate - 1, 1), -(d[j] - shift) / se))
            candidates.append((t, i, float(d[j] - shift), p, shift, n - 1))
    if not candidates:
        return out
    adjusted = holm([cand[3] for cand in candidates])
    for (t, i, departure, _, shift, peers), p_adj in zip(candidates, adjusted):
        c = out[t][i]
        own = -math.log(c.ratio) if c.higher_is_better else math.log(c.ratio)
        if p_adj >= alpha or departure <= math.log1p(c.threshold) or own <= 0:
            continue
        if c.verdict in (Verdict.REGRESSION, Verdict.MACHINE_SLOWER, Verdict.IMPROVED):
            continue
        suite = math.exp(-shift if c.higher_is_better else shift)
        new = dataclasses.replace(
            c,
            verdict=Verdict.REGRESSION,
            suite_ratio=suite,
            reason=(
                f"slower than the rest of the suite: {math.expm1(departure) * 100:+.1f}% beyond the median "
                f"shift of {peers} other measurements ({(suite - 1) * 100:+.1f}%), p={_fmt_p(p_adj)} Holm "
                f"(suite-relative)"
            ),
        )
        out[t] = [
            new if k == i else
            mirrored(new, METRICS[m.metric], (m.baseline_value, m.candidate_value)) if m.mirror_of == c.metric else m
            for k, m in enumerate(out[t])
        ]
    return out


def judged_family(comparisons: Iterable[Comparison]) -> int:
    """How many comparisons count in Holm's family (mirrors do not)."""
    return sum(1 for c in comparisons if c.mirror_of is None and c.p_value is not None)


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
    between_sd: float = NoiseModel().between_sd,
    baseline_sessions: int = 1,
) -> float:
    """Smallest true slowdown (0.05 = 5%) flagged with ``power`` by ``n_runs`` candidate runs
    against a baseline of ``baseline_sessions`` sessions of as many runs, as the only
    regression in a family of ``m`` (Holm's first step, alpha / m), under the noise model.
    Analytic (normal approximation of the log-level estimate)."""
    k = baseline_sessions
    within = HL_SE_FACTOR * lognormal_sigma(cv) / math.sqrt(n_runs)
    se = math.sqrt(within**2 * (1 + 1 / k) + between_sd**2 * (1 + 1 / k))
    return math.expm1(se * (_q(alpha / m) + _q(1.0 - power)))
