"""A measurement's stored record (``core.record.Record.of``) with what ``measuring`` computes
for it, and the machine-speed reference beside it.

The reference: a float32 matrix product through numpy's BLAS on all usable cores, timed 61
times (``measuring.roofline.probe_reference``); its figure is the fast end of those times
(``QUANTILE``): the machine's speed when it gets its cores, not how busy it is. It shares
nothing with llama.cpp, so a llama.cpp or model regression can never move it. Stored with every
record and shown beside a comparison, it decides no verdict: on this project's VM its drift did
not follow llama.cpp's (docs/verdicts.md)."""

from __future__ import annotations

from collections.abc import Mapping

from ..core.fingerprint import Fingerprint
from ..core.measurement import Measurement
from ..core.record import Record
from ..core.workload import kv_cache_bytes
from ..measuring.metrics import diagnose
from ..measuring.roofline import REFERENCE_KIND


def stored(
    m: Measurement, fingerprint: Fingerprint | None = None, *, commit: str | None = None, recorded_at: str | None = None
) -> Record:
    """``m`` as it is stored (``Record.of``), with its stability and KV cache computed."""
    return Record.of(m, diagnose(m), kv_cache_bytes(m.engine), fingerprint, commit=commit, recorded_at=recorded_at)


#: The probe's figure is this low quantile of its products' times: the machine's speed when
#: it gets its cores. The median reads scheduling instead: with another process on one core,
#: BLAS threads that sleep between products wait a whole time slice (seen here: a median of
#: 16.0 ms against 1.1 ms, p10 1.2 ms, while llama.cpp's spinning threads lost 10-20%).
#: Contention is read from steal time and the runs' own spread, not from the probe.
QUANTILE = 0.10


def _figure(runs_ms: list[float]) -> float:
    s = sorted(float(v) for v in runs_ms)
    return s[int(QUANTILE * (len(s) - 1))]


def slowdown(baseline: object, candidate: object) -> float | None:
    """Candidate/baseline ratio of the reference's figure (``QUANTILE`` of its times); None
    when either lacks one of the same kind or the data are not usable."""
    if not isinstance(baseline, Mapping) or not isinstance(candidate, Mapping):
        return None
    if baseline.get("kind") != REFERENCE_KIND or candidate.get("kind") != REFERENCE_KIND:
        return None
    try:
        b = _figure(baseline["runs_ms"])
        c = _figure(candidate["runs_ms"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return c / b if b > 0 and c > 0 else None
