"""One session's level of one metric: the robust location of its runs and its standard error.

Apart from the comparison because everything that stores or reads a session's level needs it
alone: the baseline's recorded sessions, the history (``history.collect``, ``history.series``)
and the paired A/B statistics, none of which compares or judges.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

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
