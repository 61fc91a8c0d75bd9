"""A measurement as it is stored (``stored``: what storing adds, computed by ``measuring`` and
read from the catalog, then the record as its file holds it), and the machine-speed reference
beside it.

The reference: a float32 matrix product through numpy's BLAS on all usable cores, timed 61
times (``measuring.roofline.probe_reference``); its figure is the fast end of those times
(``QUANTILE``): the machine's speed when it gets its cores, not how busy it is. It shares
nothing with llama.cpp, so a llama.cpp or model regression can never move it. Stored with every
record and shown beside a comparison, it decides no verdict: on this project's VM its drift did
not follow llama.cpp's (docs/verdicts.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..core import catalog
from ..core.fingerprint import Fingerprint
from ..core.formats import sig6
from ..core.measurement import (
    Machine,
    Measurement,
    Memory,
    PromptSeen,
    Requests,
    Summary,
    stored_run,
    workload_identity,
)
from ..core.workload import kv_cache_bytes
from ..measuring.metrics import diagnose
from ..measuring.roofline import REFERENCE_KIND


def stored(
    m: Measurement, fingerprint: Fingerprint | None = None, *, commit: str | None = None, recorded_at: str | None = None
) -> Measurement:
    """``m`` as it is stored: with what storing adds (the fingerprint, the commit, its stability
    (``measuring.metrics.diagnose``), its memory with the KV cache from the model's shape, the
    catalog's summary figures...), then read back from its stored form (``to_json``, ``from_json``),
    so what the judge and the reports read is what a file holds, six significant figures."""
    w = m.asked
    record = dataclasses.replace(
        m,
        runs=tuple(stored_run(r) for r in m.runs),
        recorded_at=recorded_at,
        commit=commit,
        hardware=dict(fingerprint.hardware) if fingerprint else {},
        subject=dict(fingerprint.subject) if fingerprint else {},
        identity=dataclasses.replace(workload_identity(m), runs=w.runs, warmup=w.warmup),
        summary=Summary(
            n_runs=m.n_runs, itl_count=m.itl.count, figures={key: sig6(f.read(m)) for key, f in catalog.SUMMARY.items()}
        ),
        stability=diagnose(m),
        memory=Memory.of(m, kv_cache_bytes(m.engine), catalog.BUFFER_SOURCE),
        prompt=PromptSeen.of(m),
        machine=Machine.of(m.system, len(m.runs) + len(m.warmup_runs)) if m.system is not None else None,
        requests=Requests.of(m),
    )
    return Measurement.from_json(record.to_json())


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
