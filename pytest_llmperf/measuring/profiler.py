"""A production profiler for services: rolling-window token latencies and TTFTs, no pytest.

Memory is fixed by the window sizes (preallocated ring buffers, O(1) in the number of
recordings); recording is thread-safe (one lock, held only to store a value); percentiles are
linearly interpolated over the window (numpy's default method), so p99 of 50 samples is not
just the maximum.

    profiler = InferenceProfiler(window=10_000)
    with profiler.request() as req:        # one generation
        for token in stream:
            req.token()                    # after each token arrives
    profiler.stats().p95_ms
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

import contextlib

import numpy as np


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
            return self._data[:n].copy()
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
    def request(self) -> Iterator["RequestTimer"]:
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
