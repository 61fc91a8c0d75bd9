"""Traces -> metrics, exactly as docs/measurement.md defines them.

Per run: TTFT, prefill time and TPS, TPOT, decode TPS, E2E, the run's ITL p50/p95, and the
engine overhead per token against llama.cpp's own counters. Pooled over runs: ITL
percentiles. Percentiles interpolate linearly between order statistics (numpy's default).
The run, not the token, is the sampling unit for statistics; pooled ITL is for display and
budgets.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..core.workload import EngineInfo
from ..core.workload import RunTrace
from ..core.workload import Workload

if TYPE_CHECKING:  # these modules build on this one: types only, no import at run time
    from .diagnostics import Stability, SystemDelta
    from .layers import LayerProfile
    from .load import LoadStats
    from .memory import PeakRss
    from .roofline import Roofline

NS_PER_MS = 1e6


@dataclass(frozen=True)
class LatencyStats:
    """Distribution summary of latency samples in milliseconds."""

    count: int
    mean_ms: float
    stdev_ms: float
    cv: float
    min_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> "LatencyStats":
        values = np.asarray(samples_ms, dtype=float)
        if values.size == 0:
            raise ValueError("no latency samples")
        mean = float(values.mean())
        stdev = float(values.std(ddof=1)) if values.size > 1 else 0.0
        p50, p90, p95, p99 = (float(v) for v in np.percentile(values, [50, 90, 95, 99]))
        return cls(
            count=int(values.size),
            mean_ms=mean,
            stdev_ms=stdev,
            cv=stdev / mean if mean > 0 else 0.0,
            min_ms=float(values.min()),
            max_ms=float(values.max()),
            p50_ms=p50,
            p90_ms=p90,
            p95_ms=p95,
            p99_ms=p99,
        )


@dataclass(frozen=True)
class RunMetrics:
    """One run (one request). ``None`` where the engine cannot observe the quantity."""

    prompt_tokens: int | None
    output_tokens: int
    tokenize_ms: float
    ttft_ms: float
    prefill_ms: float | None
    prefill_tps: float | None
    tpot_ms: float
    decode_tps: float
    e2e_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    itl_ms: tuple[float, ...]
    native_prefill_ms: float | None = None
    native_decode_ms_per_token: float | None = None
    overhead_ms_per_token: float | None = None
    #: llama.cpp's sampler time per sampled token (inside the decode loop, or timed apart
    #: after the run when the engine does not sample between clock reads).
    sampling_ms_per_token: float | None = None

    @classmethod
    def of(cls, trace: RunTrace) -> "RunMetrics":
        tokens = trace.token_ns
        if len(tokens) < 2:
            raise ValueError(f"a run needs at least 2 generated tokens, got {len(tokens)}")
        itl = np.diff(np.asarray(tokens, dtype=np.int64)) / NS_PER_MS
        tokenize_ms = trace.tokenize_ns / NS_PER_MS
        ttft_ms = tokenize_ms + (tokens[0] - trace.start_ns) / NS_PER_MS
        e2e_ms = tokenize_ms + (tokens[-1] - trace.start_ns) / NS_PER_MS
        tpot_ms = (e2e_ms - ttft_ms) / (len(tokens) - 1)
        prefill_ms = None
        prefill_tps = None
        if trace.prefill_done_ns is not None:
            prefill_ms = (trace.prefill_done_ns - trace.start_ns) / NS_PER_MS
            if trace.prompt_tokens and prefill_ms > 0:
                prefill_tps = trace.prompt_tokens / prefill_ms * 1000.0
        native = trace.native
        native_decode = native.decode_ms_per_token if native else None
        p50, p95 = (float(v) for v in np.percentile(itl, [50, 95]))
        return cls(
            prompt_tokens=trace.prompt_tokens,
            output_tokens=len(tokens),
            tokenize_ms=tokenize_ms,
            ttft_ms=ttft_ms,
            prefill_ms=prefill_ms,
            prefill_tps=prefill_tps,
            tpot_ms=tpot_ms,
            decode_tps=1000.0 / tpot_ms if tpot_ms > 0 else float("inf"),
            e2e_ms=e2e_ms,
            itl_p50_ms=p50,
            itl_p95_ms=p95,
            itl_ms=tuple(float(v) for v in itl),
            native_prefill_ms=native.prefill_ms if native else None,
            native_decode_ms_per_token=native_decode,
            overhead_ms_per_token=tpot_ms - native_decode if native_decode is not None else None,
            sampling_ms_per_token=native.sample_ms_per_token if native else None,
        )


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


@dataclass(frozen=True)
class Measurement:
    """All runs of one workload on one engine, with the summaries budgets and reports use.

    Summaries over runs are medians (``ttft_ms`` is the median TTFT); ``itl`` pools every
    run's inter-token latencies.
    """

    label: str
    workload: Workload
    engine: EngineInfo
    runs: tuple[RunMetrics, ...]
    itl: LatencyStats
    ttft_ms: float
    ttft_p95_ms: float
    tpot_ms: float
    decode_tps: float
    e2e_ms: float
    tokenize_ms: float
    prefill_ms: float | None
    prefill_tps: float | None
    native_prefill_ms: float | None
    native_decode_ms_per_token: float | None
    overhead_ms_per_token: float | None
    prompt_tokens: int | None
    output_tokens: int
    sampling_ms_per_token: float | None = None
    load: LoadStats | None = None  # a load test's (concurrency/requests/rate), else None
    # Filled by runner.measure (None / empty when a Measurement is built from traces alone):
    warmup_runs: tuple[RunMetrics, ...] = ()
    system: SystemDelta | None = None  # around the runs
    peak_rss: PeakRss | None = None  # over the runs
    layers: LayerProfile | None = None  # when per-layer timing was asked for
    roofline: Roofline | None = None  # when peaks were known or asked for

    @property
    def n_runs(self) -> int:
        return len(self.runs)

    @functools.cached_property
    def stability(self) -> Stability:
        """CV, spread, first-run/first-token effects, context slope."""
        from .diagnostics import diagnose

        return diagnose(self, self.system, self.warmup_runs)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(
    traces: Sequence[RunTrace], workload: Workload, engine: EngineInfo, label: str = ""
) -> Measurement:
    """Per-run metrics, pooled ITL and medians over runs."""
    if not traces:
        raise ValueError("no runs to summarize")
    return summarize_runs(tuple(RunMetrics.of(t) for t in traces), workload, engine, label)


def summarize_runs(
    runs: tuple[RunMetrics, ...], workload: Workload, engine: EngineInfo, label: str = ""
) -> Measurement:
    """Pooled ITL and medians over already computed runs (a measurement extended by more)."""
    ttfts = [r.ttft_ms for r in runs]

    def med(field: str) -> float | None:
        return _median([getattr(r, field) for r in runs])

    return Measurement(
        label=label,
        workload=workload,
        engine=engine,
        runs=runs,
        itl=LatencyStats.of([v for r in runs for v in r.itl_ms]),
        ttft_ms=float(statistics.median(ttfts)),
        ttft_p95_ms=float(np.percentile(ttfts, 95)),
        tpot_ms=med("tpot_ms"),
        decode_tps=med("decode_tps"),
        e2e_ms=med("e2e_ms"),
        tokenize_ms=med("tokenize_ms"),
        prefill_ms=med("prefill_ms"),
        prefill_tps=med("prefill_tps"),
        native_prefill_ms=med("native_prefill_ms"),
        native_decode_ms_per_token=med("native_decode_ms_per_token"),
        overhead_ms_per_token=med("overhead_ms_per_token"),
        prompt_tokens=runs[0].prompt_tokens,
        output_tokens=min(r.output_tokens for r in runs),
        sampling_ms_per_token=med("sampling_ms_per_token"),
    )
