"""workload -> engine -> traces -> Measurement: the measuring path, without pytest.

Peak resident memory of this process over a measurement.

Linux keeps the peak (VmHWM) and lets a process reset it (write "5" to /proc/self/clear_refs),
so the peak can be taken over the measurement alone; elsewhere, or when the reset is refused,
the process-lifetime peak from getrusage is reported, and ``scope`` says which.

A production profiler for services: rolling-window token latencies and TTFTs, no pytest.

Memory is fixed by the window sizes (preallocated ring buffers, O(1) in the number of
recordings); recording is thread-safe (one lock, held only to store a value); percentiles are
linearly interpolated over the window (numpy's default method), so p99 of 50 samples is not
just the maximum.

    profiler = InferenceProfiler(window=10_000)
    with profiler.request() as req:        # one generation
        for token in stream:
            req.token()                    # after each token arrives
    profiler.stats().p95_ms"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..core.workload import Workload
from ..engines import CallableEngine, Engine
from .metrics import Measurement, RunMetrics, SystemDelta, sample_system, summarize, summarize_runs


def as_engine(obj: Any) -> Engine:
    """An Engine as is; a plain callable ``fn(prompt, max_tokens)`` wrapped."""
    if isinstance(obj, Engine):
        return obj
    return CallableEngine(obj)


def measure(
    engine: Any,
    workload: Workload | None = None,
    label: str = "",
    slo: Mapping[str, float] | None = None,
    *,
    layers: bool = False,
    peaks: tuple[Any, Any] | None = None,
) -> Measurement:
    """Run ``workload.warmup`` discarded runs, then ``workload.runs`` measured ones; a load
    workload (concurrency/requests/rate) goes to ``load.measure_load`` with ``slo``.

    System counters and peak RSS are read around the runs, never between a run's clock reads.
    ``layers``: afterwards, time each layer on an instrumented context (in-process llama.cpp
    only); ``peaks`` (bandwidth, TFLOP/s ``roofline.Peak``): attach the roofline."""
    workload = workload or Workload()
    engine = as_engine(engine)
    if workload.is_load:
        from .served import measure_load

        return measure_load(engine, workload, label=label, slo=slo)
    was_reset = reset_peak_rss()
    before = sample_system()
    warmup = [engine.run(workload, -1 - i) for i in range(workload.warmup)]
    traces = [engine.run(workload, i) for i in range(workload.runs)]
    system = SystemDelta(before, sample_system())
    m = summarize(traces, workload, engine.info(), label=label)
    m = dataclasses.replace(
        m, warmup_runs=tuple(RunMetrics.of(t) for t in warmup), system=system, peak_rss=peak_rss(was_reset)
    )
    if layers:
        from .layers import profile_layers

        remote = getattr(engine, "profile_layers", None)  # an engine worker times them in its process
        if remote is None and not getattr(engine, "supports_layer_timing", False):
            raise ConfigError("per-layer timing (layers=True) needs the in-process llama.cpp engine (or its worker)")
        m = dataclasses.replace(m, layers=remote(workload) if remote else profile_layers(engine, workload))
    if peaks is not None:
        from .roofline import roofline

        m = dataclasses.replace(m, roofline=roofline(m, *peaks))
    return m


def extend(engine: Any, m: Measurement, extra_runs: int) -> Measurement:
    """``m`` with ``extra_runs`` more measured runs of its workload (no warm-up: the engine is
    warm), for a sequential measurement. Per-layer timing and the roofline stay those of the
    first runs; system counters and peak RSS cover the added runs too."""
    engine = as_engine(engine)
    before = sample_system()
    start = m.n_runs
    traces = [engine.run(m.workload, start + i) for i in range(extra_runs)]
    system = SystemDelta(before, sample_system())
    runs = m.runs + tuple(RunMetrics.of(t) for t in traces)
    grown = summarize_runs(runs, dataclasses.replace(m.workload, runs=len(runs)), m.engine, label=m.label)
    return dataclasses.replace(
        grown,
        warmup_runs=m.warmup_runs,
        peak_rss=m.peak_rss,
        layers=m.layers,
        roofline=m.roofline,
        # One span over all the runs (steal and load of the whole measurement).
        system=SystemDelta(m.system.before, system.after) if m.system is not None else system,
    )


@dataclass(frozen=True)
class PeakRss:
    bytes: int
    scope: str  # "measurement" (peak reset before it) or "process" (lifetime peak)


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _vm_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss(was_reset: bool) -> PeakRss:
    hwm = _vm_hwm_bytes()
    if hwm is not None:
        return PeakRss(hwm, "measurement" if was_reset else "process")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return PeakRss(maxrss if sys.platform == "darwin" else maxrss * 1024, "process")


class _Ring:
    """The last ``size`` values, in a preallocated array."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"window must be >= 1, got {size}")
        self._data = np.empty(size, dtype=np.float64)
        self._next = 0
        self.count = 0  # values ever recorded

    def add(self, value: float) -> None:
        self._data[self._next] = value
        self._next = (self._next + 1) % len(self._data)
        self.count += 1

    def values(self) -> np.ndarray:
        """Oldest first (a copy: safe to use outside the lock)."""
        n = min(self.count, len(self._data))
        if n < len(self._data):
            return np.array(self._data[:n])  # a copy
        return np.concatenate((self._data[self._next :], self._data[: self._next]))

    @property
    def nbytes(self) -> int:
        return self._data.nbytes


@dataclass(frozen=True)
class ProfilerStats:
    """Per-token latency summary over the window, and the recent TTFTs (oldest first)."""

    token_count: int  # samples in the window
    tokens_recorded: int  # ever
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    ttft_count: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_history_ms: tuple[float, ...]


class InferenceProfiler:
    """Thread-safe rolling statistics of a running service's generation latencies."""

    def __init__(self, window: int = 10_000, ttft_window: int = 1_000) -> None:
        self._tokens = _Ring(window)
        self._ttfts = _Ring(ttft_window)
        self._lock = threading.Lock()

    def record_token(self, latency_ms: float) -> None:
        """One inter-token latency (time since the previous token of the same request)."""
        with self._lock:
            self._tokens.add(latency_ms)

    def record_ttft(self, ttft_ms: float) -> None:
        with self._lock:
            self._ttfts.add(ttft_ms)

    @contextlib.contextmanager
    def request(self) -> Iterator[RequestTimer]:
        """Times one request: call ``token()`` as each token arrives (the first gives TTFT)."""
        yield RequestTimer(self)

    def stats(self) -> ProfilerStats:
        with self._lock:
            tokens = self._tokens.values()
            ttfts = self._ttfts.values()
            recorded = self._tokens.count

        def pct(values: np.ndarray, q: float) -> float | None:
            return float(np.percentile(values, q)) if values.size else None

        return ProfilerStats(
            token_count=int(tokens.size),
            tokens_recorded=recorded,
            mean_ms=float(tokens.mean()) if tokens.size else None,
            p50_ms=pct(tokens, 50),
            p95_ms=pct(tokens, 95),
            p99_ms=pct(tokens, 99),
            ttft_count=int(ttfts.size),
            ttft_p50_ms=pct(ttfts, 50),
            ttft_p95_ms=pct(ttfts, 95),
            ttft_history_ms=tuple(float(v) for v in ttfts),
        )

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the windows: fixed at construction."""
        return self._tokens.nbytes + self._ttfts.nbytes


class RequestTimer:
    """Clock reads for one request; the profiler's lock is taken only to store a value."""

    def __init__(self, profiler: InferenceProfiler) -> None:
        self._profiler = profiler
        self._start_ns = time.perf_counter_ns()
        self._last_ns: int | None = None

    def token(self) -> None:
        now = time.perf_counter_ns()
        if self._last_ns is None:
            self._profiler.record_ttft((now - self._start_ns) / 1e6)
        else:
            self._profiler.record_token((now - self._last_ns) / 1e6)
        self._last_ns = now
