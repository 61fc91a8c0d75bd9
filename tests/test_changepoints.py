"""The change-point detector (E-divisive means, permutation test): finds a step where it is,
stays quiet on noise, gives the same answer every time, and sizes the step honestly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_llmperf.history.changepoints import e_divisive, split_statistics
from pytest_llmperf.history.series import shift_ci


def drifting(seed: int, n: int = 60, step_at: int | None = None, step: float = 0.05, sd: float = 0.016) -> np.ndarray:
    """Log session levels with the verdicts' between-session drift (~1.6%)."""
    x = np.random.default_rng(seed).normal(0, sd, n)
    if step_at is not None:
        x[step_at:] += math.log(1 + step)
    return x


def test_a_step_is_found_at_its_session() -> None:
    found = [e_divisive(drifting(seed, step_at=40)) for seed in range(20)]
    assert sum(len(f) == 1 and abs(f[0].index - 40) <= 1 for f in found) >= 18
    assert all(f and f[0].p_value <= 0.01 for f in found)


def test_noise_alone_rarely_makes_one() -> None:
    found = [e_divisive(drifting(seed)) for seed in range(100, 150)]
    assert sum(bool(f) for f in found) <= 3  # alpha 0.01 per series: 0.5 expected


def test_the_same_input_gives_the_same_answer() -> None:
    x = drifting(3, step_at=25, step=0.03)
    assert e_divisive(x) == e_divisive(x.copy()) == e_divisive(list(x))
    assert e_divisive(x, seed=1) != [] and e_divisive(np.full(30, 2.0)) == []


def test_min_size_and_short_series() -> None:
    x = drifting(4, n=30, step_at=27, step=0.5)  # a huge step, 3 sessions from the end
    assert all(c.index <= 26 for c in e_divisive(x, min_size=4))  # at most at 26: 4 sessions after it
    assert [c.index for c in e_divisive(x, min_size=3)] == [27]
    assert e_divisive(drifting(5, n=7)) == []
    with pytest.raises(ValueError, match="min_size"):
        e_divisive(x, min_size=1)


def test_statistic_peaks_at_the_split() -> None:
    x = np.r_[np.zeros(10), np.ones(10)]
    q = split_statistics(x[None, :], 2)[0]
    assert int(np.argmax(q)) + 2 == 10


def matrix_statistics(x: np.ndarray, min_size: int) -> np.ndarray:
    """Q(t) straight from the definition, with the n x n distance matrix (the former code)."""
    n = x.size
    d = np.abs(x[:, None] - x[None, :])
    out = []
    for t in range(min_size, n - min_size + 1):
        m, k = t, n - t
        within_left = d[:t, :t].sum() / (m * (m - 1))
        within_right = d[t:, t:].sum() / (k * (k - 1))
        out.append(m * k / n * (2 * d[:t, t:].sum() / (m * k) - within_left - within_right))
    return np.array(out)


@pytest.mark.parametrize("n", [8, 9, 31, 64, 200])
def test_statistic_is_the_definition(n: int) -> None:
    rng = np.random.default_rng(n)
    rows = rng.normal(size=(4, n))
    rows[1, : n // 2] = 0.5  # ties
    rows[2] = np.round(rows[2], 1)  # many ties
    got = split_statistics(rows, 2)
    for row, q in zip(rows, got):
        assert np.allclose(q, matrix_statistics(row, 2), rtol=1e-9, atol=1e-9)


def test_statistic_memory_is_linear_in_the_series() -> None:
    """Before, a chunk of 100 permutations of 1000 sessions took 100 x 1001^2 x 8 bytes per
    array (about 3 GB at peak); now the arrays are rows x n."""
    import tracemalloc

    x = np.random.default_rng(0).normal(size=(20, 1000))
    tracemalloc.start()
    try:
        split_statistics(x, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak  # the n x n way: 20 x 1001^2 x 8 bytes = 160 MB per array


def test_shift_ci_covers_the_step() -> None:
    covered = 0
    for seed in range(200):
        x = drifting(seed, n=40, step_at=20, step=0.10)
        shift, lo, hi = shift_ci(x[:20], x[20:])
        assert lo <= shift <= hi
        covered += lo < math.log(1.10) < hi
    assert 180 <= covered <= 200  # a 95% interval: 190 expected


def _series(logs, busy=()):
    from pytest_llmperf.history.series import Point, Series
    from pytest_llmperf.judge.verdict import Verdict

    points = tuple(
        Point(
            i,
            f"2026-12-07T00:{i:02d}:00+00:00",
            None,
            None,
            None,
            10,
            math.exp(x),
            float(x),
            0.01,
            0.01,
            None,
            "MACHINE_SLOWER" if i in busy else None,
            verdict=Verdict.MACHINE_SLOWER if i in busy else None,
        )
        for i, x in enumerate(logs)
    )
    return Series("t.py::test_a", "", "tpot_ms", "decode", "ms", "hw", points)


def test_a_run_of_busy_sessions_is_no_change_point_and_a_real_step_keeps_its_session() -> None:
    """Sessions whose verdict blamed the machine (MACHINE_SLOWER: x3 here, a neighbour on the
    cores) measured the neighbour: ``llmperf detect`` leaves them out, so the last five busy
    sessions do not fail a CI job that gates on it; a real step after them is found at the
    session where it happened, numbered in the whole series."""
    from pytest_llmperf.history.series import recent_regressions, steps

    logs = drifting(3, n=30)
    logs[25:] += math.log(3.0)
    busy = _series(logs, busy=range(25, 30))
    assert not recent_regressions(steps(busy), 5)
    with_busy = _series(logs)  # the same levels, not blamed on the machine: a step, and it gates
    assert [s.index for s in recent_regressions(steps(with_busy), 5)] == [25]
    stepped = drifting(4, n=40)
    stepped[30:] += math.log(1.2)
    found = steps(_series(stepped, busy=range(10, 15)))
    assert [s.index for s in found] == [30] and found[0].regression
