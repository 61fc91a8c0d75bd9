"""workload -> engine -> traces -> Measurement: the measuring path, without pytest.

Peak resident memory over a measurement: Linux keeps the peak (VmHWM) and lets a process reset it (write "5" to /proc/self/clear_refs),
so the peak can be taken over the measurement alone; elsewhere, or when the reset is refused,
the process-lifetime peak from getrusage is reported, and ``scope`` says which. An engine that
runs llama.cpp in another process (the engine worker) reads its own process's peak.

Model loads (``model_load``): fresh engines loaded after the runs (``with_model_loads``).

``InferenceProfiler``, a production profiler for services: rolling-window token latencies and
TTFTs. Memory is fixed by the window sizes (preallocated ring buffers, O(1) in the number of
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
import ctypes
import dataclasses
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import ConfigError
from ..core.measurement import LoadSample, Measurement, ModelLoads, PeakRss, SystemDelta
from ..core.progress import Progress, task, timed
from ..core.workload import MODEL_LOAD_KINDS, RunTrace, Workload
from ..engines import CallableEngine
from ..engines.capabilities import (
    Engine,
    EngineProcess,
    FreshLoads,
    LayerTiming,
    ProcessMemory,
    RemoteLayerTiming,
    layer_timing,
)
from ..engines.user_llama import watch_llamas
from .attribution import AttributionPass, run_pass, side_figures
from .layers import profile_layers
from .metrics import of_turn, run_metrics, sample_system, summarize, summarize_runs
from .roofline import machine_peaks, roofline
from .served import measure_load

if TYPE_CHECKING:
    from ..core.measurement import Attribution, LayerProfile, Peak
    from ..engines import TokenStream
    from .attribution import Stepping


def as_engine(obj: Engine | TokenStream) -> Engine:
    """An Engine as is; a plain callable ``fn(prompt, max_tokens)`` wrapped."""
    if isinstance(obj, Engine):
        return obj
    return CallableEngine(obj, watch=watch_llamas())


def engine_pid(engine: object) -> int | None:
    """The process llama.cpp's threads run in: an engine worker's, else None (this one)."""
    return engine.pid if isinstance(engine, EngineProcess) else None


def measure(
    engine: Engine | TokenStream,
    workload: Workload | None = None,
    label: str = "",
    slo: Mapping[str, float] | None = None,
    *,
    layers: bool = False,
    attribution: bool = False,
    peaks: tuple[Peak, Peak] | None = None,
    model_load: str | None = None,
) -> Measurement:
    """Run ``workload.warmup`` discarded runs, then ``workload.runs`` measured ones; a load
    workload (concurrency/requests/rate) goes to ``load.measure_load`` with ``slo``.

    System counters and peak RSS are read around the runs, never between a run's clock reads.
    ``layers``: afterwards, time each layer on an instrumented context (in-process llama.cpp
    only); ``attribution``: afterwards, time each graph node by layer and op type
    (``measuring.attribution``, in-process llama.cpp only); ``peaks`` (bandwidth, TFLOP/s ``roofline.Peak``): attach the roofline; ``model_load``
    ("warm" / "cold"): afterwards, time fresh loads of the engine's model (``with_model_loads``)."""
    workload = workload or Workload()
    engine = as_engine(engine)
    if workload.is_load:
        return measure_load(engine, workload, label=label, slo=slo)
    m = _measure_runs(engine, workload, label)
    if workload.turn is not None:  # a conversation judged on one turn (the ``turn`` key)
        m = of_turn(m, workload.turn)
    if layers:
        m = dataclasses.replace(m, layers=layer_profile(engine, workload))
    if attribution:
        m = dataclasses.replace(m, attribution=attribution_of(engine, workload))
    if peaks is not None:
        m = dataclasses.replace(m, roofline=roofline(m, *peaks))
    if model_load is not None:
        m = with_model_loads(engine, m, model_load)
    return m


def _measure_runs(engine: Engine, workload: Workload, label: str) -> Measurement:
    """The warm-up and measured runs, with the system counters and the peak RSS of the
    process the model lives in read around them."""
    memory = engine if isinstance(engine, ProcessMemory) else THIS_PROCESS
    was_reset = memory.reset_peak_rss()
    pid = engine_pid(engine)
    before = sample_system(pid)
    with task("timed runs") as progress:
        one = whole_run(engine, workload)
        warmup = counted(progress, "warm-up runs", workload.warmup, lambda i: one(-1 - i))
        traces = counted(progress, "runs", workload.runs, lambda i: one(i))
    system = SystemDelta(before, sample_system(pid))
    m = summarize(traces, workload, engine.info(), label=label)
    return dataclasses.replace(
        m, warmup_runs=tuple(run_metrics(t) for t in warmup), system=system, peak_rss=memory.peak_rss(was_reset)
    )


def counted(progress: Progress, name: str, n: int, one: Callable[[int], list[RunTrace]]) -> list[RunTrace]:
    """``one(i)``'s traces for i in 0..n-1, each run counted on the task's line (between runs,
    never inside one)."""
    progress.step(name, 0, n)
    got = []
    for i in range(n):
        with timed():  # the heartbeat says nothing inside a run
            got.extend(one(i))
        progress.advance(i + 1)
    return got


def whole_run(engine: Engine, workload: Workload) -> Callable[[int], list[RunTrace]]:
    """Run ``i``'s traces: the engine's one run, or a conversation's turns in order, turn k
    sent ``workload.at_turn(k)`` and its trace marked with its turn (the engine keeps its
    replies and its prompt cache between the turns of a run)."""
    if workload.conversation is None:
        return lambda i: [engine.run(workload, i)]
    turns = [workload.at_turn(k) for k in range(1, workload.turns + 1)]
    return lambda i: [dataclasses.replace(engine.run(w, i), turn=k) for k, w in enumerate(turns, 1)]


def layer_profile(engine: Engine, workload: Workload) -> LayerProfile:
    """Each layer timed (``measuring.layers``): by an engine worker in its own process, or by
    driving an in-process engine's instrumented context here."""
    timed = layer_timing(engine) or engine  # a callable: the Llama it drove
    if isinstance(timed, RemoteLayerTiming):
        with task("per-layer timing") as progress:  # one wait on the worker: the heartbeat says it lasts
            progress.step("instrumented runs in the engine worker")
            remote: LayerProfile = timed.profile_layers(workload)  # an engine worker times them in its process
        return remote
    if isinstance(timed, LayerTiming):
        with task("per-layer timing") as progress:
            progress.step("instrumented runs")
            return profile_layers(timed, workload)
    raise ConfigError("per-layer timing (layers=True) needs the in-process llama.cpp engine (or its worker)")


def attribution_of(engine: Engine, workload: Workload) -> Attribution:
    """Each graph node timed by layer and op type (``measuring.attribution``), after the runs."""
    return run_pass(pass_of(engine, workload))


def traces_figures(engine: Engine | TokenStream, workload: Workload, traces: Sequence[RunTrace]) -> dict[str, float]:
    """A side's roofline and memory figures over its runs (``--llmperf-against``: in the side's
    process, after the pairs; ``attribution.side_figures``, the machine's peaks probed once and cached)."""
    m = summarize(list(traces), dataclasses.replace(workload, runs=len(traces)), as_engine(engine).info())
    return side_figures(m, machine_peaks())


def pass_of(engine: Engine, workload: Workload) -> Stepping:
    """The engine's attribution pass, run by run: by an engine worker in its own process, or on
    an in-process engine's instrumented context here."""
    timed = layer_timing(engine) or engine  # a callable: the Llama it drove
    if isinstance(timed, RemoteLayerTiming):
        remote: Stepping = timed.attribution_pass(workload)
        return remote
    if isinstance(timed, LayerTiming):
        return AttributionPass(timed, workload)
    raise ConfigError("the attribution pass (attribution=True) needs the in-process llama.cpp engine (or its worker)")


def extend(engine: Engine | TokenStream, m: Measurement, extra_runs: int) -> Measurement:
    """``m`` with ``extra_runs`` more measured runs of its workload (no warm-up: the engine is
    warm), for a sequential measurement. Per-layer timing and the roofline stay those of the
    first runs; system counters and peak RSS cover the added runs too."""
    engine = as_engine(engine)
    pid = engine_pid(engine)
    before = sample_system(pid)
    # Runs so far (a conversation's run: a trace per turn, or its judged turn's only).
    start = m.asked.runs if m.asked.conversation is not None else m.n_runs
    one = whole_run(engine, m.asked)
    with task("more runs (the verdict or a budget undecided)") as progress:
        traces = counted(progress, "runs", extra_runs, lambda i: one(start + i))
    system = SystemDelta(before, sample_system(pid))
    turn = m.asked.turn  # judged on one turn: that turn's runs
    runs = m.runs + tuple(run_metrics(t) for t in traces if turn is None or t.turn == turn)
    grown = summarize_runs(runs, dataclasses.replace(m.asked, runs=start + extra_runs), m.engine, label=m.label)
    return dataclasses.replace(
        grown,
        warmup_runs=m.warmup_runs,
        peak_rss=m.peak_rss,
        layers=m.layers,
        attribution=m.attribution,
        roofline=m.roofline,
        model_loads=m.model_loads,
        # One span over all the runs (steal and load of the whole measurement).
        system=SystemDelta(m.system.before, system.after) if m.system is not None else system,
    )


class _ThisProcess(ProcessMemory):
    """The peak RSS of this process: where an engine's model lives unless the engine says
    otherwise (``ProcessMemory``)."""

    def reset_peak_rss(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    def peak_rss(self, was_reset: bool) -> PeakRss:
        hwm = _vm_hwm_bytes()
        if hwm is not None:
            return PeakRss(hwm, "measurement" if was_reset else "process")
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return PeakRss(maxrss if sys.platform == "darwin" else maxrss * 1024, "process")


THIS_PROCESS = _ThisProcess()


def _vm_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- model loads: warm and cold, each load checked ----------------------------------------------

#: Fresh loads a test asks for (``model_load``): as many as its runs, at most this many.
MODEL_LOADS = 5


def evict(path: str) -> None:
    """Ask the kernel to drop ``path`` from the page cache (no root needed; pages another
    process maps stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_through(path: str) -> None:
    """Read the whole file once, so a warm load finds it in the page cache."""
    with open(path, "rb", buffering=0) as fh:
        while fh.read(1 << 24):
            pass


def resident_share(path: str) -> float | None:
    """Share of ``path``'s pages in the page cache (``mincore`` on a mapping that touches none)."""
    size = os.path.getsize(path)
    if size == 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    page = os.sysconf("SC_PAGE_SIZE")
    pages = -(-size // page)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return None
            return sum(b & 1 for b in vec) / pages
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def with_model_loads(
    engine: object, m: Measurement, kind: str, release: Callable[[str], None] | None = None
) -> Measurement:
    """``m`` with ``min(runs, MODEL_LOADS)`` fresh loads of its engine's model (``engine.fresh()``),
    after every run. "cold": the file evicted before each load (``release(path)`` first closes
    the engines that map it, as a mapped page cannot be evicted); each load's residency is
    checked, so a load that found the file cached counts as warm."""
    if kind not in MODEL_LOAD_KINDS:
        raise ConfigError(f"model_load must be one of {', '.join(MODEL_LOAD_KINDS)}, got {kind!r}")
    path = m.engine.model_path
    if not isinstance(engine, FreshLoads) or path is None:
        raise ConfigError("model_load (and max_load_ms) time llama.cpp loading: it needs the plugin's llama.cpp engine")
    if kind == "cold" and release is not None:
        release(path)
    samples = []
    n = min(m.asked.runs, MODEL_LOADS)
    with task(f"{kind} model loads") as progress:
        progress.step("loads", 0, n)
        for i in range(n):
            samples.append(_fresh_load(engine, m.asked, path, kind))
            progress.advance(i + 1)
    return dataclasses.replace(m, model_loads=ModelLoads.of(kind, samples))


def _fresh_load(engine: FreshLoads, workload: Workload, path: str, kind: str) -> LoadSample:
    """One fresh engine loaded (the file evicted first, or read through), timed and asked once."""
    if kind == "cold":
        evict(path)
    else:
        read_through(path)
    share = resident_share(path)
    loaded = engine.fresh()
    try:
        trace = loaded.run(workload, 0)
        info = loaded.info()
    finally:
        loaded.close()
    load_ms = float(info.load_ms or 0.0)
    first = None if info.first_eval_ms is None else load_ms + info.first_eval_ms + run_metrics(trace).ttft_ms
    return LoadSample(load_ms, info.native_load_ms, first, share)


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
