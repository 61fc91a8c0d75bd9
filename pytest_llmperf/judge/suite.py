"""The session-end check: each measurement against the median shift of the rest of the suite.

Apart from the per-test comparison because it needs the whole session's comparisons at once
(it runs after every test's verdict, in the controller under pytest-xdist) and spends its own
share of the session's alpha; it only ever adds REGRESSION verdicts (docs/verdicts.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy.special import stdtr

from .compare import JUDGED, METRICS, mirrored
from .levels import MAD_SCALE
from .verdict import Comparison, Verdict, fmt_p, holm

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
    measurement's comparisons, as ``compare.decide`` left them; returned in the same shape.
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
                f"shift of {peers} other measurements ({(suite - 1) * 100:+.1f}%), p={fmt_p(p_adj)} Holm "
                f"(suite-relative)"
            ),
        )
        out[t] = [
            new if k == i else
            mirrored(new, METRICS[m.metric], (m.baseline_value, m.candidate_value)) if m.mirror_of == c.metric else m
            for k, m in enumerate(out[t])
        ]
    return out

