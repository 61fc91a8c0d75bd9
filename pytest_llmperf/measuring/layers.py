"""Per-layer timing through llama.cpp's eval callback (``cb_eval``).

llama.cpp's scheduler asks the callback about every graph node; answering yes only for each
layer's output (``l_out-N``) and the output head (``result_output``) makes it compute the graph
up to that node, synchronize and call back, so one clock read per layer splits each step into
per-layer segments. The first segment runs from the ``llama_decode`` call to ``l_out-0`` (token
embedding + layer 0), the last from the last layer's output to ``result_output`` (final norm +
output projection). Splitting the graph costs time of its own, so this runs on a second context
made for it, never inside a plain measurement, and says what it cost (``overhead_ratio``).
"""

from __future__ import annotations

import bisect
import ctypes
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..core.errors import EngineError
from ..core.measurement import HEAD_NAME, OUTLIER_MAD_FACTOR, OUTLIER_MIN_EXCESS, LayerProfile, PhaseLayers
from ..core.workload import Workload
from .metrics import run_metrics

if TYPE_CHECKING:
    from ..engines.capabilities import LayerTiming, TimedDecode
    from ..engines.llama_cpp_native import Context

#: What one event of the callback names (a node name; ``measuring.attribution``: the node's op too).
E = TypeVar("E")


def outlier_layers(names: Sequence[str], median_ms: Sequence[float]) -> tuple[str, ...]:
    """Blocks beyond the robust rule. The first segment also carries the token embedding and
    the step's setup, and the head is no block: both would skew or trip the rule, so they are
    left out of it (and shown apart in every report)."""
    values = np.asarray(median_ms, dtype=float)
    blocks = [i for i, n in enumerate(names) if n.startswith("layer ")]
    if len(blocks) < 3:
        return ()
    v = values[blocks]
    med = float(np.median(v))
    mad = float(np.median(np.abs(v - med)))
    limit = max(med + OUTLIER_MAD_FACTOR * mad, med * (1 + OUTLIER_MIN_EXCESS))
    return tuple(names[i] for i in blocks if values[i] > limit)


def ggml_function(lib_module: Any, name: str) -> Any:
    """A ``const char * f(const struct ggml_tensor *)`` of the libggml-base shipped inside
    llama_cpp/lib: ``ggml_get_name`` (a node's name), ``ggml_op_desc`` (its op: ``MUL_MAT``...)."""
    lib_dir = os.path.join(os.path.dirname(lib_module.__file__), "lib")
    for base in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        path = os.path.join(lib_dir, base)
        if os.path.exists(path):
            fn = getattr(ctypes.CDLL(path), name)
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_void_p]
            return fn
    raise EngineError(f"per-layer timing needs libggml-base from llama-cpp-python; not found in {lib_dir}")


#: One step: (start ns, [(node name, ns)...], end ns), as the engine's timed loop reads them.
Step = tuple[int, list[tuple[bytes, int]], int]


class LayerTimer:
    """A second llama.cpp context on the engine's model, with the eval callback installed,
    through the engine's layer-timing API (``engines.LayerTiming``).

    ``run()`` drives the engine's own timed loop (``timed_decode``) on that context: the same
    seeded tokens fed without sampling, or greedy sampling inside the loop when the engine
    samples, so the overhead ratio compares like with like. The callback only records
    (node name, clock) pairs; they are split into steps after the run, by the loop's own clock
    reads. The plain engine stays untouched (its context has no callback).
    """

    def __init__(self, engine: LayerTiming, workload: Workload) -> None:
        lib = engine.lib
        self._lib = lib
        self._engine = engine
        self._workload = workload
        self._events: list[tuple[Any, int]] = []
        self._callback = lib.ggml_backend_sched_eval_callback(self._make_callback())  # kept referenced
        self._prompt_ids = engine.prompt_ids(workload)
        self._feed = engine.decode_feed(workload)
        self._ctx: Context = engine.instrumented_context(self._callback, len(self._prompt_ids) + workload.max_tokens)
        self._sampler = engine.make_sampler() if self._feed is None else None

    def _make_callback(self) -> Callable[[int, bool, int], bool]:
        """The eval callback: yes to each layer's output and the output head, and a clock read
        after each (``(node name, ns)`` events; ``measuring.attribution`` asks for every node)."""
        get_name = ggml_function(self._lib, "ggml_get_name")
        events_append = self._events.append
        clock = time.perf_counter_ns

        def callback(tensor: int, ask: bool, _user: int) -> bool:
            name = get_name(tensor)
            if ask:
                return bool(name.startswith(b"l_out-") or name == b"result_output")
            events_append((name, clock()))
            return True

        return callback

    def close(self) -> None:
        if self._sampler is not None:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None
        if self._ctx:
            self._lib.llama_free(self._ctx)
            self._ctx = None

    def run(self) -> tuple[list[Step], list[Step], float]:
        """One run: prefill [(start, events, end)], decode steps [(start, events, end)...] and
        the run's TPOT (ms, token to token as the plain engine measures it)."""
        timed = self.timed()
        return (*steps_of(timed.start_ns, timed.prefill_done_ns, timed.token_ns, self._events), tpot_of(timed))

    def timed(self, tokens: int | None = None) -> TimedDecode:
        """One run of the engine's timed loop on the instrumented context (cleared first), of the
        workload's tokens or the first ``tokens``; the callback's events of the run are in ``_events``."""
        lib = self._lib
        lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
        if self._sampler is not None:
            lib.llama_sampler_reset(self._sampler)
        self._events.clear()
        feed = self._feed if tokens is None or self._feed is None else self._feed[:tokens]
        n = self._workload.max_tokens if tokens is None else tokens
        return self._engine.timed_decode(self._ctx, self._prompt_ids, n, feed=feed, sampler=self._sampler)


def tpot_of(timed: TimedDecode) -> float:
    """A run's TPOT (ms, token to token as the plain engine measures it)."""
    return (timed.token_ns[-1] - timed.token_ns[0]) / 1e6 / (len(timed.token_ns) - 1)


def steps_of(
    start_ns: int, prefill_done_ns: int, token_ns: Sequence[int], events: Sequence[tuple[E, int]]
) -> tuple[list[tuple[int, list[tuple[E, int]], int]], list[tuple[int, list[tuple[E, int]], int]]]:
    """The run's events split by its clock reads: prefill from the start to its end, decode step
    i from token i - 1 to token i (each event belongs to the step whose window holds its time)."""
    times = [t for _, t in events]

    def window(lo: int, hi: int) -> tuple[int, list[tuple[E, int]], int]:
        return (lo, list(events[bisect.bisect_right(times, lo) : bisect.bisect_right(times, hi)]), hi)

    prefill = [(start_ns, list(events[: bisect.bisect_right(times, prefill_done_ns)]), prefill_done_ns)]
    return prefill, [window(token_ns[i - 1], token_ns[i]) for i in range(1, len(token_ns))]


def segments(start_ns: int, events: Sequence[tuple[bytes, int]], n_layer: int) -> tuple[list[float], float]:
    """Per-segment ms of one step (repeated ubatches summed) and the step's last event time.

    Segment 0 runs from the step start to ``l_out-0``; segment i from ``l_out-(i-1)`` to
    ``l_out-i``; the head from the last layer output to ``result_output``.
    """
    seg = [0.0] * (n_layer + 1)
    prev = start_ns
    for name, t in events:
        if name == b"result_output":
            seg[n_layer] += (t - prev) / 1e6
        else:
            seg[int(name[6:])] += (t - prev) / 1e6
        prev = t
    return seg, prev


def _phase(phase: str, runs: list[list[tuple[int, list[tuple[bytes, int]], int]]], n_layer: int) -> PhaseLayers:
    names = tuple(["embd+layer 0"] + [f"layer {i}" for i in range(1, n_layer)] + [HEAD_NAME])
    per_run: list[tuple[float, ...]] = []
    steps_ms: list[float] = []
    all_steps: list[np.ndarray] = []
    for steps in runs:
        segs = np.array([segments(s, ev, n_layer)[0] for s, ev, _ in steps])
        per_run.append(tuple(float(v) for v in np.median(segs, axis=0)))
        all_steps.append(segs)
        steps_ms.extend((end - s) / 1e6 for s, _, end in steps)
    stacked = np.concatenate(all_steps)
    median_ms = tuple(float(v) for v in np.median(stacked, axis=0))
    return PhaseLayers(
        phase=phase,
        names=names,
        median_ms=median_ms,
        step_ms=float(np.median(steps_ms)),
        n_runs=len(runs),
        n_steps=len(stacked),
        per_run_ms=tuple(per_run),
        outliers=outlier_layers(names, median_ms),
        coverage=float(np.median(stacked.sum(axis=1) / np.asarray(steps_ms))),
    )


def _check_output_head(*phases: Sequence[Step]) -> None:
    """Every step of the phases' runs ends at the output head: the graph's nodes are named as
    this module reads them."""
    for steps in phases:
        for _, ev, _ in steps:
            if not ev or ev[-1][0] != b"result_output":
                raise EngineError(
                    "per-layer timing saw no output-head event; this llama.cpp build names its graph nodes differently"
                )


def profile_layers(engine: Any, workload: Workload) -> LayerProfile:
    """Time every layer over ``workload.runs`` runs after ``workload.warmup`` warm-up runs.

    Each instrumented run is paired with a plain run of the same workload on the engine's own
    context, interleaved, so the overhead ratio (instrumented / plain step time, medians) is
    not skewed by drift between two blocks of runs.
    """
    n_layer = engine.info().n_layer
    timer = LayerTimer(engine, workload)
    try:
        for i in range(max(workload.warmup, 1)):
            timer.run()
            engine.run(workload, -1 - i)
        prefill_runs, decode_runs, tpots, plain = [], [], [], []
        for i in range(workload.runs):
            prefill, decode, tpot_ms = timer.run()
            tpots.append(tpot_ms)
            _check_output_head(prefill, decode)
            prefill_runs.append(prefill)
            decode_runs.append(decode)
            plain.append(run_metrics(engine.run(workload, i)))
    finally:
        timer.close()
    prefills = [r.prefill_ms for r in plain if r.prefill_ms is not None]
    return LayerProfile(
        prefill=_phase("prefill", prefill_runs, n_layer),
        decode=_phase("decode", decode_runs, n_layer),
        tpot_ms=float(np.median(tpots)),
        plain_prefill_ms=float(np.median(prefills)) if prefills else None,
        plain_tpot_ms=float(np.median([r.tpot_ms for r in plain])),
    )
