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

Cost: each tested segment of n sessions takes O(permutations x n log n) time and memory
linear in n (``split_statistics``): on a 2-core x86-64 VM, 499 permutations of a 200-session
segment take about 0.1 s and of a 1000-session one about 0.5 s (docs/history.md has the
figures of the commands).
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
#: Values (permutations x sessions) whose statistics are computed at once: with the arrays of
#: ``split_statistics``, some 100 MB at most, whatever the series' length.
CHUNK_VALUES = 2**20


@dataclass(frozen=True)
class ChangePoint:
    """``index``: the first session of the new segment. ``p_value``: the permutation test's."""

    index: int
    p_value: float
    statistic: float


def split_statistics(x: np.ndarray, min_size: int) -> np.ndarray:
    """Q(t) for every split ``t`` in ``[min_size, n - min_size]`` of each row of ``x``
    (shape ``(rows, n)``); returns shape ``(rows, splits)``.

    Linear memory, O(rows n log n) time: every sum of distances is built from ``A[s]``, the
    summed distance of session ``s`` to the sessions before it (a Fenwick tree over the
    values' ranks, one per row), and ``D[s]``, its summed distance to all (from the sorted
    values), instead of the n x n distance matrix (at n = 1000 and 100 rows: 2.4 GB)."""
    rows, n = x.shape
    order = np.argsort(x, axis=1, kind="stable")
    ranks = np.empty((rows, n), dtype=np.int64)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(1, n + 1), (rows, n)), axis=1)
    ahead = _prefix_distances(x, ranks)
    ordered = np.take_along_axis(x, order, axis=1)
    below = np.cumsum(ordered, axis=1) - ordered  # sum of the smaller values, by rank
    r = np.arange(n, dtype=float)
    to_all_sorted = ordered * r - below + (ordered.sum(axis=1, keepdims=True) - below - ordered) - ordered * (n - 1 - r)
    to_all = np.empty_like(to_all_sorted)
    np.put_along_axis(to_all, order, to_all_sorted, axis=1)
    behind = to_all - ahead  # summed distance to the sessions after it
    left = np.zeros((rows, n + 1))  # within [0, t): sum over s < t of ahead[s]
    left[:, 1:] = np.cumsum(ahead, axis=1)
    right = np.zeros((rows, n + 1))  # within [t, n): sum over s >= t of behind[s]
    right[:, :n] = np.cumsum(behind[:, ::-1], axis=1)[:, ::-1]
    t = np.arange(min_size, n - min_size + 1)
    within_left, within_right = left[:, t], right[:, t]
    cross = left[:, n][:, None] - within_left - within_right
    m, k = t.astype(float), (n - t).astype(float)
    energy = 2 * cross / (m * k) - 2 * within_left / (m * (m - 1)) - 2 * within_right / (k * (k - 1))
    return m * k / n * energy


def _prefix_distances(x: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """``out[:, s] = sum_{i < s} |x[:, s] - x[:, i]|``: per row a Fenwick tree over the ranks
    (1..n) of the values seen so far, each node a complex number (count + 1j * sum: one gather
    and one scatter per step for both); all rows at once, flat (row-major) for fast indexing."""
    rows, n = x.shape
    size = 1 << n.bit_length()  # a power of two > n: the tree's nodes are 1..size
    steps = size.bit_length()
    width = size + 2  # node size + 1: where updates past the tree land, never read
    tree = np.zeros(rows * width, dtype=complex)
    base = np.arange(rows) * width
    seen = np.zeros(rows)  # sum of the values before s
    out = np.empty((rows, n))
    values, value_ranks = np.ascontiguousarray(x.T), np.ascontiguousarray(ranks.T)
    for s in range(n):
        v, r = values[s], value_ranks[s]
        i = r - 1  # the ranks below this value (node 0 stays 0)
        below = np.zeros(rows, dtype=complex)
        for _ in range(steps):
            below += tree[base + i]
            i = i - (i & -i)
        out[:, s] = v * (2 * below.real - s) + seen - 2 * below.imag
        seen += v
        add = 1 + 1j * v
        i = r
        for _ in range(steps):
            tree[base + i] += add
            i = np.minimum(i + (i & -i), size + 1)
    return out


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
        chunks = np.array_split(shuffled, -(-permutations * seg.size // CHUNK_VALUES))
        beaten = sum(int((split_statistics(chunk, min_size).max(axis=1) >= q).sum()) for chunk in chunks)
        p = (1 + beaten) / (1 + permutations)
        if p <= alpha:
            found.append(ChangePoint(a + t, p, q))
            segments += [(a, a + t), (a + t, b)]
    return sorted(found, key=lambda c: c.index)
