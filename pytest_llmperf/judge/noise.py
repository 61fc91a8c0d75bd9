"""Between sessions: what a session's level may do from one session to the next on the same
hardware, and what that leaves a test able to detect.

Apart from the verdict rule because it is the noise model's one free figure (the prior, with
the measurements behind it) and its estimate from a baseline's recorded sessions: planning
(``min_detectable_effect``) and the history read it without judging anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from scipy.special import ndtri, stdtrit

from .levels import HL_SE_FACTOR, Level

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
        prior = self.prior_sessions * self.between_sd**2
        if k < 2:
            return self.between_sd
        levels = [s.log_level for s in sessions]
        mean = sum(levels) / k
        within = sum(s.se**2 for s in sessions) / k
        excess = max(0.0, sum((v - mean) ** 2 for v in levels) / (k - 1) - within)
        return math.sqrt((prior + (k - 1) * excess) / (self.prior_sessions + k - 1))


    def window(self, sessions: Sequence[Level]) -> tuple[float, float]:
        """Between-session sd and its degrees of freedom from a history window of
        ``WINDOW_MIN_SESSIONS`` or more sessions: the levels' own spread beyond what their runs
        explain, with ``k - 1`` degrees of freedom (no prior: the t statistic carries the
        uncertainty of a spread estimated from few sessions). Fewer: ``between`` (the prior)."""
        k = len(sessions)
        if k < WINDOW_MIN_SESSIONS:
            return self.between(sessions), self.between_df(k)
        levels = [s.log_level for s in sessions]
        mean = sum(levels) / k
        within = sum(s.se**2 for s in sessions) / k
        return math.sqrt(max(0.0, sum((v - mean) ** 2 for v in levels) / (k - 1) - within)), float(k - 1)


def detectable(se: float, df: float, *, alpha: float, threshold: float, power: float = POWER) -> float:
    """The smallest true change (0.14 = 14% slower) that a comparison with this standard error
    of log(ratio) and degrees of freedom flags with ``power`` at one-sided level ``alpha`` (its
    Holm step as the only change of the session). The estimate must pass both the critical
    value and the threshold, so the reach is the larger of the two plus ``power``'s margin."""
    q = (lambda p: float(stdtrit(df, p))) if math.isfinite(df) else (lambda p: float(ndtri(p)))
    return math.expm1(max(math.log1p(threshold), se * q(1.0 - alpha)) + se * q(power))


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
