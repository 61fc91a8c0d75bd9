"""Verdicts: one session's level and its standard error, the between-session noise model, and the
verdict with its decision thresholds and Holm's correction.

One session's level of one metric: the robust location of its runs and its standard error.

Apart from the comparison because everything that stores or reads a session's level needs it
alone: the baseline's recorded sessions, the history (``history.series``)
and the paired A/B statistics, none of which compares or judges.

Between sessions: what a session's level may do from one session to the next on the same
hardware, and what that leaves a test able to detect.

Apart from the verdict rule because it is the noise model's one free figure (the prior, with
the measurements behind it) and its estimate from a baseline's recorded sessions: planning
(``min_detectable_effect``) and the history read it without judging anything.

The decision rule: one comparison's verdict from its estimate, its standard error and its
Holm-adjusted p-values (the rule itself is described in ``rule``'s docstring and in
docs/verdicts.md).

Apart from the estimate (``rule``) because everything downstream reads only this: the
``Comparison`` result and its one-line text, the ``Verdict`` names, Holm's adjustment (also
used by the per-layer diff) and the rule that turns numbers into REGRESSION, IMPROVED,
UNCHANGED or INCONCLUSIVE with the reason a person reads."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtri, stdtrit

from ..core.catalog import METRICS
from ..core.documents import JSONValue
from ..core.formats import EXPONENT_FROM, StrEnum

#: Relative efficiency factor of the Hodges-Lehmann location: se = this * sigma / sqrt(n).
HL_SE_FACTOR = math.sqrt(math.pi / 3.0)
#: MAD -> standard deviation for normal noise.
MAD_SCALE = 1.4826
#: A robust level hides a slowdown of a minority of runs (30% of runs 1.5x slower barely moves
#: it). This quantile of the runs moves with such a minority, so a level keeps it too
#: (``Level.upper``; the verdict's shape check, ``verdict.UPPER_FACTOR``, reads it).
UPPER_QUANTILE = 0.90
#: Runs further than this many MADs from the median do not count in the spread.
OUTLIER_MADS = 3.5
#: The largest |log| of a value (a float64 reaches exp(709.78)); a level of a ratio of two such
#: values reaches twice that.
LOG_MAX = 709.0


def exp_clamped(x: float) -> float:
    """exp(x) for a log ratio or bound, within the floats (+-``LOG_MAX``): two levels at the
    ends of the float range differ by more than ``math.exp`` can return."""
    return math.exp(max(-LOG_MAX, min(LOG_MAX, x)))


def _is_log_value(x: float) -> bool:
    """A log value a level may hold: finite, within twice the floats' log range."""
    return math.isfinite(x) and abs(x) <= 2 * LOG_MAX


def _is_spread(x: float) -> bool:
    """A standard error or spread: finite and not negative."""
    return math.isfinite(x) and x >= 0


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
    #: The Hodges-Lehmann location of every run, where the level left runs out (None: it left
    #: none out, or a stored level): a slowdown of part of the runs that the level leaves out
    #: moves it (the verdict's shape check reads it). Not stored.
    whole: float | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        """A level is a finite location with a finite, non-negative error and spread from at
        least one run: anything else (a stored level of ``inf``, a negative se, no runs) is not
        one, and is refused here, where it is read, rather than turned into a verdict."""
        upper_ok = all(v is None or _is_log_value(v) for v in (self.upper, self.whole))
        if not (
            _is_log_value(self.log_level)
            and _is_spread(self.se)
            and _is_spread(self.spread)
            and self.n >= 1
            and upper_ok
        ):
            raise ValueError(
                f"not a session level: log_level={self.log_level!r}, se={self.se!r}, n={self.n!r}, "
                f"spread={self.spread!r}, upper={self.upper!r}"
            )

    @property
    def value(self) -> float:
        return exp_clamped(self.log_level)

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "log_level": round(self.log_level, 9),
            "se": round(self.se, 9),
            "n": self.n,
            "spread": round(self.spread, 9),
            "upper": None if self.upper is None else round(self.upper, 9),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Level:
        upper = d.get("upper")
        try:
            return cls(
                float(d["log_level"]),
                float(d["se"]),
                int(d["n"]),
                float(d["spread"]),
                None if upper is None else float(upper),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"not a session level: {d!r} ({exc})") from None


def positive_values(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
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
    """The session level of positive per-run values (robust location and its standard error);
    ValueError (naming ``name``) for values that are not finite and positive."""
    return log_level(np.log(positive_values(name, values)))


def log_level(log_values: Sequence[float] | np.ndarray) -> Level:
    """The session level of per-run log values (finite, at least one): the Hodges-Lehmann
    location of the runs within ``OUTLIER_MADS`` MADs of their median, whose spread is also
    the level's."""
    x = np.sort(np.asarray(log_values, dtype=float).ravel())
    med = _sorted_quantile(x, 0.5)
    mad = MAD_SCALE * _median(np.abs(x - med))
    # The plain deviation of the runs within 3.5 MADs of the median: as stable as the
    # standard deviation on clean runs (the MAD alone is 37% efficient, and an unstable
    # standard error makes false alarms), yet one wild run does not inflate it.
    kept = x[np.abs(x - med) <= OUTLIER_MADS * mad] if mad > 0 else x
    spread = float(kept.std(ddof=1)) if kept.size > 2 else mad
    upper = _sorted_quantile(x, UPPER_QUANTILE)
    # The location of those same runs: the Hodges-Lehmann location alone breaks down beyond
    # 29% of wild runs (2 fast runs of 5 pulled a baseline's level to 0.62 ms where 3 runs
    # and the median sat at 0.99), the median and the MAD at 50%. With no spread at all
    # (half the runs or more equal), those equal runs are the level.
    core = kept if mad > 0 else x[x == med] if np.any(x == med) else x
    whole = _hodges_lehmann(x) if core.size < x.size else None
    se = HL_SE_FACTOR * spread / math.sqrt(core.size)
    return Level(_hodges_lehmann(core), se, int(x.size), spread, upper, whole)


#: Sessions of a test kept in the history window (the last ones since its baseline was
#: recorded, same hardware, subject and workload; docs/verdicts.md).
WINDOW_SESSIONS = 10
#: From this many sessions on, the history window is the reference level and its own spread
#: the between-session noise (Student's t with ``k - 1`` degrees of freedom, no prior); below
#: it, the baseline file's recorded sessions are the reference and the prior is pooled in.
WINDOW_MIN_SESSIONS = 5
#: Power at which the minimum detectable effect is stated (``detectable``).
POWER = 0.8


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
        if k < 2:
            return self.between_sd
        prior = self.prior_sessions * self.between_sd**2
        return math.sqrt((prior + (k - 1) * _excess(sessions)) / (self.prior_sessions + k - 1))

    def window(self, sessions: Sequence[Level]) -> tuple[float, float]:
        """Between-session sd and its degrees of freedom from a history window of
        ``WINDOW_MIN_SESSIONS`` or more sessions: the levels' own spread beyond what their runs
        explain, with ``k - 1`` degrees of freedom (no prior: the t statistic carries the
        uncertainty of a spread estimated from few sessions). Fewer: ``between`` (the prior)."""
        k = len(sessions)
        if k < WINDOW_MIN_SESSIONS:
            return self.between(sessions), self.between_df(k)
        return math.sqrt(_excess(sessions)), float(k - 1)


def _excess(sessions: Sequence[Level]) -> float:
    """The variance of two or more sessions' levels beyond what their own runs explain (never below 0)."""
    k = len(sessions)
    levels = [s.log_level for s in sessions]
    mean = sum(levels) / k
    within = sum(s.se**2 for s in sessions) / k
    return max(0.0, sum((v - mean) ** 2 for v in levels) / (k - 1) - within)


#: A reach beyond this (as a change: 99.99 = +9999%, a 100x slowdown) is not a figure a person
#: can use: the comparison has too few runs (or pairs, or sessions) to state one.
REACH_CAP = 99.99


def detectable(se: float, df: float, *, alpha: float, threshold: float, power: float = POWER) -> float | None:
    """The smallest true change (0.14 = 14% slower) that a comparison with this standard error
    of log(ratio) and degrees of freedom flags with ``power`` at one-sided level ``alpha`` (its
    Holm step as the only change of the session). The estimate must pass both the critical
    value and the threshold, so the reach is the larger of the two plus ``power``'s margin.

    None: too few runs to state a reach (beyond ``REACH_CAP``; Student's t with about one
    degree of freedom puts the critical value in the hundreds), or inputs that state none."""
    if not (math.isfinite(se) and se >= 0 and df > 0 and 0 < alpha < 1 and 0 < power < 1):
        return None
    if not (math.isfinite(threshold) and threshold > -1):
        return None

    log_reach = max(math.log1p(threshold), se * t_quantile(df, 1.0 - alpha)) + se * t_quantile(df, power)
    if not math.isfinite(log_reach) or log_reach > math.log1p(REACH_CAP):
        return None
    return math.expm1(log_reach)


def t_quantile(df: float | None, p: float) -> float:
    """Student's t quantile; the normal one for no (None) or infinite degrees of freedom, and
    infinity where there are none at all (one pair: nothing is known of the spread)."""
    if df is None or not math.isfinite(df):
        return float(ndtri(p))
    return float(stdtrit(df, p)) if df > 0 else math.inf


def z_one_sided(alpha: float) -> float:
    """The standard normal quantile that leaves ``alpha`` above it."""
    return float(ndtri(1.0 - alpha))


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
    return math.expm1(se * (z_one_sided(alpha / m) + z_one_sided(1.0 - power)))


#: What a comparison with too few runs says instead of a reach (``detectable``: None).
TOO_FEW_FOR_REACH = "too few runs to state a reach (more runs, or steadier ones, state one)"

#: Confidence of the reported CI of the ratio.
CI_LEVEL = 0.95
#: UNCHANGED needs the change bounded inside the threshold at this one-sided confidence, on
#: both sides. Between sessions of a shared machine the level itself moves by ~1.5%, so a 5%
#: threshold can be shown with about this confidence from one session (docs/verdicts.md).
EQUIVALENCE_CONFIDENCE = 0.80
#: UNCHANGED also needs the slowest runs' distance above the level (``verdict.UPPER_QUANTILE``;
#: shape, not position: session drift moves both) to grow by less than this x the threshold
#: over the latest baseline session's.
UPPER_FACTOR = 2.0


class Verdict(StrEnum):
    """Outcome of one comparison; only REGRESSION fails a test by default."""

    REGRESSION = "REGRESSION"
    IMPROVED = "IMPROVED"
    UNCHANGED = "UNCHANGED"
    INCONCLUSIVE = "INCONCLUSIVE"
    MACHINE_SLOWER = "MACHINE_SLOWER"


#: Every verdict, the one that names a measurement first (``headline``): a regression, then
#: what a reader must weigh before it is settled, then what is settled.
HEADLINE_ORDER = (Verdict.REGRESSION, Verdict.MACHINE_SLOWER, Verdict.INCONCLUSIVE, Verdict.IMPROVED, Verdict.UNCHANGED)

#: The verdict as a comparison's line says it (``Comparison.line``).
VERDICT_WORDS = {
    Verdict.REGRESSION: "regression",
    Verdict.IMPROVED: "improvement",
    Verdict.UNCHANGED: "unchanged",
    Verdict.INCONCLUSIVE: "inconclusive",
    Verdict.MACHINE_SLOWER: "slower machine",
}


def headline(verdicts: Iterable[Verdict]) -> Verdict:
    """The one verdict of a compared measurement, from its comparisons' (``HEADLINE_ORDER``'s
    first they hold); INCONCLUSIVE when there are none (nothing could be judged)."""
    return min(verdicts, key=HEADLINE_ORDER.index, default=Verdict.INCONCLUSIVE)


def regression_cell(phases: Iterable[str]) -> str:
    """A regression's cell of the summary table: ``REGRESSION decode+prefill``."""
    return f"{Verdict.REGRESSION} " + "+".join(sorted(phases))


def stored_verdict(word: str | None) -> Verdict | None:
    """The verdict a stored verdict cell names (``REGRESSION decode``, ``MACHINE_SLOWER``: the
    ``short`` a session wrote, its history row's ``baseline``); None for a baseline status
    (``no-baseline``) or none. The one reader of such a cell, where its file is read."""
    first = (word or "").split(" ", 1)[0]
    return next((v for v in Verdict if v.value == first), None)


class BaselineStatus(StrEnum):
    """What a measurement was held against (``result.BaselineVerdict``):
    its comparisons are judged only when COMPARED; the others say why there are none."""

    COMPARED = "compared"
    NO_BASELINE = "no-baseline"
    OTHER_HARDWARE = "other-hardware"
    WORKLOAD_CHANGED = "workload-changed"
    ERROR = "error"  # the baseline file could not be read (the note says why)
    #: ``--llmperf-against``: REF could not run this measurement; measured on this tree alone.
    NOT_COMPARED = "not-compared"


class Shown(StrEnum):
    """The statistic of the two figures a comparison shows (``Comparison.baseline_value`` and
    ``candidate_value``), named in its line so a reader can find them."""

    #: The levels compared (``level``): the ratio shown is theirs.
    LEVEL = "level"
    #: The medians of each side's runs: against REF, whose change is the pairs' ratio; or a rate
    #: that is not the reciprocal of the figure it mirrors (prefill TPS of TTFT's runs).
    MEDIAN = "median"


class NoiseSource(StrEnum):
    """Where a comparison's between-session sd came from (``Comparison.noise_source``)."""

    #: The stated figure alone (``NoiseModel``: too few sessions to estimate it).
    PRIOR = "prior"
    #: The baseline file's recorded sessions, pooled with the prior.
    BASELINE = "baseline"
    #: The history's window of sessions.
    HISTORY = "history"
    #: The pairs themselves: ``--llmperf-against``'s REF, measured pair by pair in the same session.
    PAIRED = "paired"


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
    #: The figures shown, of the statistic ``shown`` names: the levels compared (the baseline's
    #: the mean of its sessions' levels), or the medians of the runs.
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
    #: Degrees of freedom of the t statistic (Welch-Satterthwaite); None: normal.
    df: float | None = None
    #: Where the between-session sd came from, and from how many sessions.
    noise_source: NoiseSource = NoiseSource.PRIOR
    noise_sessions: int = 0
    #: The smallest slowdown (0.14 = 14%) this comparison flags with 80% power, given its
    #: noise estimate, runs and Holm step (``verdict.detectable``); None before it is decided.
    detectable: float | None = None
    #: What the candidate was measured against, when not a stored baseline: ``--llmperf-against``'s
    #: REF (``git:main (3f2a1b9c0d1e)``), measured pair by pair in the same session (``noise_source``
    #: "paired"); "" for a baseline.
    reference: str = ""
    #: The statistic of ``baseline_value`` and ``candidate_value``; None: not named (a file written
    #: before it was).
    shown: Shown | None = None
    #: Where the candidate's level left runs out (far from its median): the candidate's
    #: Hodges-Lehmann location over every run against the same reference, as a ratio; else None.
    whole_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.shown is not None:
            object.__setattr__(self, "shown", Shown(self.shown))  # a word read from JSON, typed
        object.__setattr__(self, "noise_source", NoiseSource(self.noise_source))  # the same

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    @property
    def failed(self) -> bool:
        return self.verdict is Verdict.REGRESSION

    @property
    def worse_log(self) -> float:
        """The change on the log scale, in the worse direction (> 0: slower)."""
        return -math.log(self.ratio) if self.higher_is_better else math.log(self.ratio)

    @property
    def worth_more_runs(self) -> bool:
        """INCONCLUSIVE and more runs may decide it: the runs alone would (``runs_needed``), or
        it leans slower by half the threshold or more (more runs sharpen the shape check and
        the session-end suite-relative check). Leaning faster or level with runs that cannot
        decide: stop, a slowdown is not in sight."""
        if self.verdict is not Verdict.INCONCLUSIVE:
            return False
        return self.runs_needed is not None or self.worse_log >= math.log1p(self.threshold / 2)

    def line(self) -> str:
        """One line for a failure message or a log, e.g. ``decode regression: TPOT level 7.41 ms
        vs 6.52 ms baseline (+13.6%, 95% CI +9.8..+17.2%, p=0.0004 Holm, 20 vs 20 runs)``.

        Every figure in it is one a reader can find, its statistic named (``shown``: the levels
        compared, or the medians of the runs), and the percentage is computed from the figures
        beside it: the two figures shown, or against REF the pairs' ratio shown before it."""
        text = f"{self.phase} {VERDICT_WORDS[self.verdict]}: {self.label} {self._figures()} ({', '.join(self._statistics())})"
        if (
            self.verdict in (Verdict.INCONCLUSIVE, Verdict.MACHINE_SLOWER) or self.suite_ratio is not None
        ) and self.reason:
            text += f": {self.reason}"
        return text

    def _figures(self) -> str:
        """``level 7.41 ms vs 6.52 ms baseline``; ``..., the mean of 3 baseline sessions``;
        ``median 9.84 ms vs 5.10 ms at REF, paired ratio 1.931``."""
        statistic = f"{self.shown.value} " if self.shown is not None else ""
        text = (
            f"{statistic}{fmt_value(self.candidate_value)} {self.unit} vs {fmt_value(self.baseline_value)} {self.unit}"
        )
        if self.reference:
            return f"{text} at {self.reference}, paired ratio {fmt_ratio(self.ratio)}"
        if self.shown is Shown.LEVEL and self.baseline_sessions > 1:
            where = "sessions in the history" if self.noise_source is NoiseSource.HISTORY else "baseline sessions"
            return f"{text}, the mean of {self.baseline_sessions} {where}"
        return f"{text} baseline"

    def _statistics(self) -> list[str]:
        """The change, its CI, the p-value and the runs (or pairs) of the line's parentheses."""
        parts = [fmt_pct(self.change_pct)]
        if self.ci_low is not None and self.ci_high is not None:
            parts.append(
                f"{CI_LEVEL:.0%} CI {fmt_pct((self.ci_low - 1) * 100)[:-1]}..{fmt_pct((self.ci_high - 1) * 100)}"
            )
        p, adjusted = self._shown_p()
        if p is not None:
            parts.append(f"p={fmt_p(p)}{' Holm' if adjusted else ''}")
        parts.append(f"{self.n_candidate} pairs" if self.reference else f"{self.n_candidate} vs {self.n_baseline} runs")
        if self.shown is None and self.baseline_sessions > 1:  # a file written before ``shown``
            parts.append(f"{self.baseline_sessions} baseline sessions")
        if self.mirror_of is not None:  # named by its label (``tpot_ms``: ``TPOT``)
            spec = METRICS.get(self.mirror_of)
            parts[-1] += f"; {self.mirror_of if spec is None else spec.label}'s verdict"
        return parts

    def reach(self) -> str:
        """What this gate can detect here, e.g. ``detects >= 14% here; between-session sd 6.1%
        from 10 sessions of the history``; ``too few runs to state a reach; ...`` where the
        comparison was decided with noise to speak of but states none (``detectable``)."""
        if self.detectable is None and not (self.reason and self.se_log > 0):
            return ""
        head = TOO_FEW_FOR_REACH if self.detectable is None else f"detects >= {self.detectable:.0%} here"
        if self.noise_source is NoiseSource.PAIRED:
            return f"{head}; from {self.n_candidate} interleaved pairs against {self.reference}"
        source = {
            NoiseSource.HISTORY: f"from {self.noise_sessions} session(s) of the history",
            NoiseSource.BASELINE: f"from {self.noise_sessions} recorded baseline session(s) and the prior",
            NoiseSource.PRIOR: "the prior (too few sessions to estimate it)",
        }[self.noise_source]
        return f"{head}; between-session sd {self.between_sd:.1%} {source}"

    def _shown_p(self) -> tuple[float | None, bool]:
        """The p-value of the direction the data moved."""
        better = self.verdict is Verdict.IMPROVED or (self.verdict is not Verdict.REGRESSION and self._improving)
        raw, adj = (self.p_value_better, self.p_adjusted_better) if better else (self.p_value, self.p_adjusted)
        return (adj, True) if adj is not None else (raw, False)

    @property
    def _improving(self) -> bool:
        return self.ratio > 1.0 if self.higher_is_better else self.ratio < 1.0


def fmt_p(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def fmt_value(v: float) -> str:
    a = abs(v)
    if not math.isfinite(v) or a >= EXPONENT_FROM:
        return f"{v:.3g}"
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def fmt_ratio(x: float) -> str:
    """A ratio near 1 to 3 decimals (``1.072``), one far from it to 3 significant digits
    (``340``, ``0.00294``)."""
    return f"{x:.3f}" if 0.1 <= x < 10 else f"{x:.3g}"


#: A change beyond this many percent is shown as beyond it: no reader needs the digits.
PCT_SHOWN_MAX = 9999.0


def fmt_pct(pct: float) -> str:
    """``+7.0%``; a change beyond +-``PCT_SHOWN_MAX`` percent as ``>+9999%``."""
    if not math.isfinite(pct) or abs(pct) > PCT_SHOWN_MAX:
        return f">+{PCT_SHOWN_MAX:.0f}%" if pct > 0 else f"<-{PCT_SHOWN_MAX:.0f}%" if pct < 0 else "n/a"
    return f"{pct:+.1f}%"


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


#: Beyond this many runs, "about N runs would decide it" is no advice: more runs cannot.
RUNS_NEEDED_CAP = 1_000_000


def _runs_needed(c: Comparison, alpha_step: float) -> int | None:
    """Candidate runs at which this estimate would be decided (REGRESSION/IMPROVED at the
    current Holm step, or UNCHANGED), keeping the run spread and the baseline as they are.
    None when the between-session part alone leaves it undecided."""
    d = abs(math.log(c.ratio))
    t = math.log1p(c.threshold)
    spread = c.cv_candidate or 0.0
    rest = max(c.se_log**2 - (HL_SE_FACTOR * spread) ** 2 / max(c.n_candidate, 1), 0.0)
    target = d / z_one_sided(alpha_step) if d > t else (t - d) / z_one_sided(1.0 - EQUIVALENCE_CONFIDENCE)
    room = target**2 - rest
    if not room > 0:
        return None
    runs = (HL_SE_FACTOR * spread) ** 2 / room
    if not runs < RUNS_NEEDED_CAP:
        return None  # runs cannot decide it in any practical number
    return max(c.n_candidate + 1, math.ceil(runs))


def _part_slower(c: Comparison) -> str:
    """Why the robust level cannot be trusted to call this unchanged or better: the slowest
    runs moved (a minority of runs slowed down), or the runs the candidate's level left out
    move its location over every run beyond the threshold; else ''."""
    if c.higher_is_better:
        return ""
    if c.whole_ratio is not None and math.log(c.whole_ratio / c.ratio) > math.log1p(c.threshold):
        return (
            f"cannot decide: {c.label}'s level moved {fmt_pct(c.change_pct)} but with every run counted "
            f"{fmt_pct((c.whole_ratio - 1) * 100)} (the level leaves out runs far from the median): part of "
            f"the runs slowed down; re-run, and look at the per-run values"
        )
    if c.upper_ratio is None or math.log(c.upper_ratio) <= math.log1p(UPPER_FACTOR * c.threshold):
        return ""
    return (
        f"cannot decide: {c.label}'s level moved {fmt_pct(c.change_pct)} but its slowest runs "
        f"(p{UPPER_QUANTILE * 100:.0f}) {fmt_pct((c.upper_ratio - 1) * 100)} more than that: part of the runs "
        f"slowed down; re-run, and look at the per-run values"
    )


def decided(
    c: Comparison, p_adj: float | None, p_adj_better: float | None, *, alpha: float, m: int = 1, **fields: Any
) -> Comparison:
    """The verdict of one comparison given its adjusted p-values (the rule: ``rule``'s docstring);
    ``fields``: more fields to set in the same copy."""
    if c.p_value is None or p_adj is None:
        return dataclasses.replace(c, **fields, verdict=Verdict.INCONCLUSIVE, reason=c.reason or "no p-value")
    m = max(m, 1)
    if c.se_log > 0:
        df = math.inf if c.df is None else c.df
        fields.setdefault("detectable", detectable(c.se_log, df, alpha=alpha / m, threshold=c.threshold))
    shown = _shown(c, p_adj, p_adj_better, alpha=alpha)
    beyond = _ci_beyond(c)
    held, fewest = (
        _held_back(c, p_adj if beyond == "slower" else p_adj_better, alpha=alpha, m=m) if beyond else ("", None)
    )
    if shown is not None and shown[0] is Verdict.INCONCLUSIVE and beyond is not None:  # part of the runs slower
        reason = f"{shown[1]}; also its {CI_LEVEL:.0%} CI lies wholly beyond {c.threshold:.0%} {beyond} but {held}"
        return dataclasses.replace(c, **fields, verdict=shown[0], reason=reason)
    if shown is not None:
        return dataclasses.replace(c, **fields, verdict=shown[0], reason=shown[1])
    lean = "slower" if c.worse_log > 0 else "faster"
    need = _runs_needed(c, alpha / m)
    change = f"{c.label} {fmt_pct(abs(c.change_pct)).lstrip('+>')} {lean}"
    if beyond is None:
        why = f"{change}, not shown beyond or within {c.threshold:.0%}"
    else:
        need = None if need is None and fewest is None else max(need or 0, fewest or 0)
        why = f"{change}, its {CI_LEVEL:.0%} CI wholly beyond {c.threshold:.0%} {beyond} but {held}"
    return dataclasses.replace(
        c,
        **fields,
        verdict=Verdict.INCONCLUSIVE,
        reason=f"cannot decide: {why}; {_what_decides(c, need)}",
        runs_needed=need,
    )


def _ci_beyond(c: Comparison) -> str | None:
    """ "slower" ("faster") when the whole CI of the change lies beyond the threshold in the
    worse (better) direction, else None."""
    if c.ci_low is None or c.ci_high is None:
        return None
    low, high = (1.0 / c.ci_high, 1.0 / c.ci_low) if c.higher_is_better else (c.ci_low, c.ci_high)
    bound = 1.0 + c.threshold
    return "slower" if low > bound else "faster" if high < 1.0 / bound else None


def _held_back(c: Comparison, p_adj: float | None, *, alpha: float, m: int) -> tuple[str, int | None]:
    """What kept a change whose whole CI lies beyond the threshold from being decided (its p-value
    at the session's level: alpha per look, Holm over ``m``; the fewest p-value that few pairs can
    give), and the fewest pairs that could decide it (None: more runs need not)."""
    p = "no p-value" if p_adj is None else f"p={fmt_p(p_adj)}"
    held = f"{p} after Holm over {m} comparison(s) does not reach this look's alpha {fmt_p(alpha)}"
    if c.noise_source is not NoiseSource.PAIRED or c.n_candidate < 1:
        return held, None
    # The signed-rank test's smallest one-sided p-value is 2^-n (every pair one way): with Holm's
    # first step at alpha / m, fewer pairs than log2(m / alpha) cannot decide anything.
    fewest = math.floor(math.log2(m / alpha)) + 1
    if c.n_candidate >= fewest:
        return held, None
    floor = 2.0**-c.n_candidate
    return (
        f"{held}: {c.n_candidate} pairs give no p below {fmt_p(floor)} (every pair one way), and Holm's "
        f"first step multiplies it by {m}",
        fewest,
    )


def _shown(c: Comparison, p_adj: float, p_adj_better: float | None, *, alpha: float) -> tuple[Verdict, str] | None:
    """The verdict the data show, and why: beyond the threshold and significant either way
    (REGRESSION, IMPROVED), part of the runs slower (INCONCLUSIVE), or within the threshold
    (UNCHANGED); None when they show none of these."""
    pct = f"{c.threshold:.0%}"
    beyond = _significant_beyond(c, p_adj, p_adj_better, alpha=alpha)
    if beyond is not None:
        return beyond, f"significant and beyond {pct}"
    part = _part_slower(c)
    if part:
        return Verdict.INCONCLUSIVE, part
    if _within(c):
        note = "significant but " if min(p_adj, p_adj_better or 1.0) < alpha else ""
        return Verdict.UNCHANGED, f"{note}within {pct} ({EQUIVALENCE_CONFIDENCE:.0%} confidence)"
    return None


def _significant_beyond(c: Comparison, p_adj: float, p_adj_better: float | None, *, alpha: float) -> Verdict | None:
    """REGRESSION (IMPROVED) when the change is significant in the worse (better) direction
    and beyond the threshold; else None."""
    t, worse = math.log1p(c.threshold), c.worse_log
    if p_adj < alpha and worse > t:
        return Verdict.REGRESSION
    if p_adj_better is not None and p_adj_better < alpha and -worse > t:
        return Verdict.IMPROVED
    return None


def _within(c: Comparison) -> bool:
    """The change is shown within +-threshold: both one-sided bounds at
    ``EQUIVALENCE_CONFIDENCE`` lie inside it."""
    # Student's t with the comparison's degrees of freedom: a standard error estimated from a
    # few runs is itself uncertain (the normal quantile called a +45% change within 5% when the
    # Welch degrees of freedom were below one).
    q_eq = t_quantile(c.df, EQUIVALENCE_CONFIDENCE)
    return abs(math.log(c.ratio)) + q_eq * c.se_log < math.log1p(c.threshold)


def _what_decides(c: Comparison, need: int | None) -> str:
    """What would decide an inconclusive comparison: about how many more runs (pairs), or, when
    runs cannot, what can."""
    if need is not None:
        return f"about {need} {'pairs' if c.noise_source is NoiseSource.PAIRED else 'runs'} would decide it"
    if c.noise_source is NoiseSource.HISTORY:
        return (
            f"more runs cannot decide it: the between-session noise of the last {c.noise_sessions} sessions "
            f"in the history (about {c.between_sd:.1%} here) leaves too much; compare both sides in one session"
        )
    return (
        f"more runs cannot decide it: the baseline and the between-session noise (about "
        f"{c.between_sd:.1%} here) leave too much; record more baseline sessions "
        f"(--llmperf-update-baselines) or compare both sides in one session"
    )
