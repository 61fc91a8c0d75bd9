"""E-divisive means (Matteson & James, 2014) with a permutation significance test: the change
point method of Apache Otava and MongoDB's CI, numpy only, seeded, deterministic.

For a segment ``x[a:b]`` and a split ``t``, the divergence between the two sides is

    Q(t) = m k / (m + k) * (2/(m k) sum|X - Y| - sum_{i<j}|X_i - X_j| / C(m,2) - sum_{i<j}|Y_i - Y_j| / C(k,2))

(energy distance with exponent 1: sensitive to any change of distribution, dominated by a shift
of location). The best split is significant when its Q is beaten by the best split of at most
``alpha`` of the segment's random permutations (p = (1 + beaten) / (1 + permutations)). A
significant split is kept and both sides are searched again (binary segmentation), so each
further segment is one more test at ``alpha``. Permutations keep the test exact for any noise
distribution as long as sessions without a change are exchangeable: the between-session drift
of a shared machine is such noise; a slow trend is not, and is found (as it should be).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Defaults, measured with ``benchmarks/changepoints.py`` (docs/history.md has the figures).
ALPHA = 0.01
PERMUTATIONS = 499
MIN_SIZE = 4
SEED = 20260


@dataclass(frozen=True)
class ChangePoint:
    """``index``: the first session of the new segment. ``p_value``: the permutation test's."""

    index: int
    p_value: float
    statistic: float


def split_statistics(x: np.ndarray, min_size: int) -> np.ndarray:
    """Q(t) for every split ``t`` in ``[min_size, n - min_size]`` of each row of ``x``
    (shape ``(rows, n)``); returns shape ``(rows, splits)``."""
    rows, n = x.shape
    d = np.abs(x[:, :, None] - x[:, None, :])
    p = np.zeros((rows, n + 1, n + 1))
    p[:, 1:, 1:] = d.cumsum(axis=1).cumsum(axis=2)
    t = np.arange(min_size, n - min_size + 1)
    square = p[:, t, t]  # sum of d over [0,t) x [0,t)
    top = p[:, t, n]  # [0,t) x [0,n)
    total = p[:, n, n][:, None]
    cross = top - square
    right = total - 2 * top + square
    m, k = t.astype(float), (n - t).astype(float)
    energy = 2 * cross / (m * k) - square / (m * (m - 1)) - right / (k * (k - 1))
    return m * k / n * energy


def best_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    q = split_statistics(x[None, :], min_size)[0]
    i = int(np.argmax(q))
    return i + min_size, float(q[i])


def e_divisive(
    values: Sequence[float] | np.ndarray,
    *,
    alpha: float = ALPHA,
    permutations: int = PERMUTATIONS,
    min_size: int = MIN_SIZE,
    seed: int = SEED,
) -> list[ChangePoint]:
    """Significant change points of ``values`` (in session order), sorted by index.

    Pass log values for effects as ratios. ``min_size``: the fewest sessions on each side of a
    change point (a step in the last ``min_size - 1`` sessions is found late, or early at the
    last allowed split when it is large). The same
    input always gives the same answer: each segment's permutations come from a generator
    seeded with ``seed`` and the segment's bounds."""
    x = np.asarray(values, dtype=float)
    if min_size < 2:
        raise ValueError("min_size must be >= 2 (a side needs a pair for its spread)")
    found: list[ChangePoint] = []
    segments = [(0, x.size)]
    while segments:
        a, b = segments.pop()
        if b - a < 2 * min_size:
            continue
        seg = x[a:b]
        if np.ptp(seg) == 0:
            continue
        t, q = best_split(seg, min_size)
        rng = np.random.default_rng([seed, a, b])
        shuffled = rng.permuted(np.broadcast_to(seg, (permutations, seg.size)), axis=1)
        beaten = 0
        for chunk in np.array_split(shuffled, max(1, permutations // 100)):
            beaten += int((split_statistics(chunk, min_size).max(axis=1) >= q).sum())
        p = (1 + beaten) / (1 + permutations)
        if p <= alpha:
            found.append(ChangePoint(a + t, p, q))
            segments += [(a, a + t), (a + t, b)]
    return sorted(found, key=lambda c: c.index)
