"""Change points of stored series, named: the session, its commit and branch, the subject or
workload change that coincides (``threads 2 -> 1``), the step's size (median before vs after
and the Hodges-Lehmann shift with its distribution-free 95% CI) and its significance."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import changepoints
from .series import Series

Z95 = 1.959964


@dataclass(frozen=True)
class Step:
    series: Series
    index: int  # the first point of the new segment
    p_value: float
    median_before: float
    median_after: float
    change: float  # after / before - 1 (Hodges-Lehmann shift of the log levels)
    ci_low: float
    ci_high: float
    coinciding: tuple[str, ...]  # subject/workload changes at the change point (+-1 session)

    @property
    def regression(self) -> bool:
        worse = self.change < 0 if self.series.higher_is_better else self.change > 0
        return worse

    @property
    def point(self):  # noqa: ANN201 (series.Point)
        return self.series.points[self.index]

    def line(self) -> str:
        s, p = self.series, self.point
        where = f"session {self.index + 1} of {len(s.points)} (#{p.session_id}, {p.started_at}, commit {p.short_commit}"
        where += f", {p.branch})" if p.branch else ")"
        kind = "REGRESSION" if self.regression else "improvement"
        named = "; ".join(self.coinciding) if self.coinciding else "no subject change recorded"
        return (
            f"{s.name} {s.metric} ({s.phase}, {s.hardware_key}): {kind} at {where}: "
            f"median {self.median_before:.4g} -> {self.median_after:.4g} {s.unit} "
            f"({self.change:+.1%}, 95% CI {self.ci_low:+.1%}..{self.ci_high:+.1%}), p = {self.p_value:.3g}; {named}"
        )


def shift_ci(before: np.ndarray, after: np.ndarray) -> tuple[float, float, float]:
    """Hodges-Lehmann shift (after - before) with Moses' distribution-free 95% CI."""
    d = np.sort((after[:, None] - before[None, :]).ravel())
    m, k = before.size, after.size
    reach = Z95 * math.sqrt(m * k * (m + k + 1) / 12.0)
    lo = max(0, int(math.floor(m * k / 2.0 - reach)))
    return float(np.median(d)), float(d[lo]), float(d[d.size - 1 - lo])


def coinciding(series: Series, index: int) -> tuple[str, ...]:
    """Subject/workload changes at ``index``, else one session either side (the change point's
    own uncertainty)."""
    for i in (index, index + 1, index - 1):
        found = series.changes_at(i)
        if found:
            return tuple(found) if i == index else tuple(f"{c} (session {i + 1})" for c in found)
    return ()


def steps(
    series: Series,
    *,
    alpha: float = changepoints.ALPHA,
    permutations: int = changepoints.PERMUTATIONS,
    min_size: int = changepoints.MIN_SIZE,
    seed: int = changepoints.SEED,
) -> list[Step]:
    logs = np.array([p.log_level for p in series.points])
    found = changepoints.e_divisive(logs, alpha=alpha, permutations=permutations, min_size=min_size, seed=seed)
    bounds = [0] + [c.index for c in found] + [logs.size]
    out = []
    for j, c in enumerate(found):
        before, after = logs[bounds[j]:c.index], logs[c.index:bounds[j + 2]]
        shift, lo, hi = shift_ci(before, after)
        out.append(
            Step(
                series, c.index, c.p_value,
                float(np.exp(np.median(before))), float(np.exp(np.median(after))),
                math.expm1(shift), math.expm1(lo), math.expm1(hi), coinciding(series, c.index),
            )
        )
    return out


def detect(series_list: Sequence[Series], **kw: float) -> list[Step]:
    return [step for s in series_list for step in steps(s, **kw)]  # type: ignore[arg-type]


def recent_regressions(found: Sequence[Step], last: int, threshold: float = 0.0) -> list[Step]:
    """Regression change points within the last ``last`` sessions of their series, at least
    ``threshold`` (a share) in size."""
    return [
        s for s in found
        if s.regression and s.index >= len(s.series.points) - last and abs(s.change) >= threshold
    ]
