"""Change-point detection on synthetic session histories (seeded): does ``llmperf detect``
find a real step, stay quiet on an unchanged series, and catch a slow creep?

Each session is simulated like a real one: 20 per-run values with 2% run-to-run noise, the
verdicts' drift model (docs/verdicts.md: a 1.5% per-session offset shared by the session's
tests, 0.5% per test, a ramp of up to +-2% within the measurement), and the session's value is
its level (``verdict.level``, the robust location the history stores). Series of 60 sessions:

* step: +5% from session 40 on (0-based) -> exactly one change point, at 40 +/- 1;
* A/A: no change -> any change point is a false alarm;
* creep: +1% every 10 sessions, linearly (+0.1% per session, 6% over the series) -> found.

Run: ``python benchmarks/changepoints.py [--series 200] [--seed 1]``; prints the figures.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_llmperf.history import changepoints
from pytest_llmperf.judge.verdict import level

SESSIONS = 60
RUNS = 20
RUN_CV = 0.02
SESSION_SD = 0.015  # shared by the session's tests
TEST_SD = 0.005  # this test's own
RAMP = 0.02  # within a measurement, up to +-2% from first to last run


def session_runs(rng: np.random.Generator, shift: np.ndarray, base: float = 100.0) -> np.ndarray:
    """Per-run values (shape sessions x RUNS) of a series with ``shift`` (log) per session."""
    out = np.empty((shift.size, RUNS))
    for s in range(shift.size):
        offset = rng.normal(0, SESSION_SD) + rng.normal(0, TEST_SD)
        ramp = rng.uniform(-RAMP, RAMP) * np.linspace(-0.5, 0.5, RUNS)
        out[s] = np.exp(shift[s] + offset + ramp + rng.normal(0, RUN_CV, RUNS)) * base
    return out


def session_values(rng: np.random.Generator, shift: np.ndarray) -> np.ndarray:
    """The stored level of each session (log scale), as the history keeps it."""
    return np.array([level(runs).log_level for runs in session_runs(rng, shift)])


STEP = np.where(np.arange(SESSIONS) >= 40, math.log(1.05), 0.0)
CREEP = np.log(1 + 0.001 * np.arange(SESSIONS))  # +1% per 10 sessions, 6% in all


def scenario(name: str, n: int, seed: int, shift: np.ndarray, **kw) -> list[list[int]]:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    found = []
    for _ in range(n):
        found.append([c.index for c in changepoints.e_divisive(session_values(rng, shift), **kw)])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--alpha", type=float, default=changepoints.ALPHA)
    ap.add_argument("--permutations", type=int, default=changepoints.PERMUTATIONS)
    ap.add_argument("--min-size", type=int, default=changepoints.MIN_SIZE)
    args = ap.parse_args()
    kw = {"alpha": args.alpha, "permutations": args.permutations, "min_size": args.min_size}
    n = args.series
    t0 = time.perf_counter()
    res = scenario("step", n, args.seed, STEP, **kw)
    exact = sum(1 for f in res if len(f) == 1 and abs(f[0] - 40) <= 1)
    near = sum(1 for f in res if any(abs(i - 40) <= 1 for i in f))
    extra = sum(1 for f in res if len(f) > 1)
    missed = sum(1 for f in res if not f)
    misplaced = sum(1 for f in res if len(f) == 1 and abs(f[0] - 40) > 1)
    where = sorted(f[0] for f in res if len(f) == 1 and abs(f[0] - 40) > 1)
    print(f"step +5% at session 40, drift 1.5%/session, {n} series of {SESSIONS}:")
    print(f"  exactly one change point at 40 +/- 1: {exact}/{n} = {exact / n:.1%} (target >= 95%)")
    print(
        f"  a change point at 40 +/- 1 (any count): {near}/{n}; more than one: {extra}; none: {missed}; "
        f"one, misplaced: {misplaced} (at {where})"
    )
    aa = scenario("aa", n, args.seed, np.zeros(SESSIONS), **kw)
    false = sum(1 for f in aa if f)
    print(f"A/A: a change point in {false}/{n} = {false / n:.1%} of series (target <= 2%)")
    cr = scenario("creep", n, args.seed, CREEP, **kw)
    hit = sum(1 for f in cr if f)
    counts = np.bincount([len(f) for f in cr])
    print(
        f"creep +1%/10 sessions (6% in all): found in {hit}/{n} = {hit / n:.1%}; change points per series: "
        + ", ".join(f"{k}: {c}" for k, c in enumerate(counts) if c)
    )
    print(
        f"(alpha {args.alpha}, {args.permutations} permutations, min size {args.min_size}, seed {args.seed}; "
        f"{time.perf_counter() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
