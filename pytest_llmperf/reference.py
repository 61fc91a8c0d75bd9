"""A machine-speed reference that does not depend on the subject under test.

A float32 matrix product through numpy's BLAS, on all usable cores like the engine's threads:
llama.cpp's threads meet at a barrier every graph node, and so do BLAS threads, so a busy core
slows both by a similar factor (measured here: 0.36x vs 0.31x-0.44x; docs/verdicts.md). It
shares nothing with llama.cpp, so a llama.cpp or model regression can never move it. Taken
around each measurement, outside its timed region; stored with every record.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

#: Identifies the probe; two references of different kinds are never compared.
KIND = "numpy-sgemm-384"
SIZE = 384
REPS = 61
#: The reference slower than at baseline by this factor or more: the machine changed, and no
#: slowdown is blamed on the subject.
MACHINE_SLOWER_RATIO = 1.25
#: Measurably slower (beyond the probe's own session-to-session noise, ~3% here): a slowdown
#: no larger than the probe's (within the threshold) is blamed on the machine.
MACHINE_NOTE_RATIO = 1.05


def measure(reps: int = REPS) -> dict[str, Any]:
    """Milliseconds per product, ``reps`` times after one warm-up."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((SIZE, SIZE), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, a, out=out)
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        np.matmul(a, a, out=out)
        runs.append((time.perf_counter_ns() - t0) / 1e6)
    return {"kind": KIND, "runs_ms": [round(v, 5) for v in runs]}


def slowdown(baseline: Mapping[str, Any] | None, candidate: Mapping[str, Any] | None) -> float | None:
    """Candidate/baseline ratio of the reference's median time; None when either lacks one of
    the same kind or the data are not usable."""
    if not isinstance(baseline, Mapping) or not isinstance(candidate, Mapping):
        return None
    if baseline.get("kind") != KIND or candidate.get("kind") != KIND:
        return None
    try:
        b = statistics.median(float(v) for v in baseline["runs_ms"])
        c = statistics.median(float(v) for v in candidate["runs_ms"])
    except (KeyError, TypeError, ValueError, statistics.StatisticsError):
        return None
    return c / b if b > 0 and c > 0 else None
