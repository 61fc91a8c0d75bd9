"""A machine-speed reference that does not depend on the subject under test.

A float32 matrix product through numpy's BLAS, on all usable cores like the engine's threads,
timed 61 times; its figure is the fast end of those times (``QUANTILE``): the machine's speed
when it gets its cores (a slower host CPU, a lower clock), not how busy it is. It shares
nothing with llama.cpp, so a llama.cpp or model regression can never move it. Taken after
each measurement, outside its timed region; stored with every record and shown beside a
comparison, but it decides no verdict: on this project's VM its drift did not follow
llama.cpp's (docs/verdicts.md). Steal time and context switches name a busy machine.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

#: Identifies the probe; two references of different kinds are never compared.
KIND = "numpy-sgemm-384"
SIZE = 384
REPS = 61
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


#: The probe's figure is this low quantile of its products' times: the machine's speed when
#: it gets its cores. The median reads scheduling instead: with another process on one core,
#: BLAS threads that sleep between products wait a whole time slice (seen here: a median of
#: 16.0 ms against 1.1 ms, p10 1.2 ms, while llama.cpp's spinning threads lost 10-20%).
#: Contention is read from steal time and the runs' own spread, not from the probe.
QUANTILE = 0.10


def _figure(runs_ms: list[float]) -> float:
    s = sorted(float(v) for v in runs_ms)
    return s[int(QUANTILE * (len(s) - 1))]


def slowdown(baseline: Mapping[str, Any] | None, candidate: Mapping[str, Any] | None) -> float | None:
    """Candidate/baseline ratio of the reference's figure (``QUANTILE`` of its times); None
    when either lacks one of the same kind or the data are not usable."""
    if not isinstance(baseline, Mapping) or not isinstance(candidate, Mapping):
        return None
    if baseline.get("kind") != KIND or candidate.get("kind") != KIND:
        return None
    try:
        b = _figure(baseline["runs_ms"])
        c = _figure(candidate["runs_ms"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return c / b if b > 0 and c > 0 else None
