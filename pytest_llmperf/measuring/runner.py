"""workload -> engine -> traces -> Measurement: the measuring path, without pytest."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..engines import CallableEngine, Engine
from .diagnostics import SystemDelta, sample_system
from ..core.errors import ConfigError
from .memory import peak_rss, reset_peak_rss
from .metrics import Measurement, RunMetrics, summarize, summarize_runs
from ..core.workload import Workload


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
    only); ``peaks`` (bandwidth, TFLOP/s ``machine_peak.Peak``): attach the roofline."""
    workload = workload or Workload()
    engine = as_engine(engine)
    if workload.is_load:
        from .load import measure_load

        return measure_load(engine, workload, label=label, slo=slo)
    was_reset = reset_peak_rss()
    before = sample_system()
    warmup = [engine.run(workload, -1 - i) for i in range(workload.warmup)]
    traces = [engine.run(workload, i) for i in range(workload.runs)]
    system = SystemDelta(before, sample_system())
    m = summarize(traces, workload, engine.info(), label=label)
    m = dataclasses.replace(
        m,
        warmup_runs=tuple(RunMetrics.of(t) for t in warmup),
        system=system,
        peak_rss=peak_rss(was_reset),
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
        grown, warmup_runs=m.warmup_runs,
        peak_rss=m.peak_rss, layers=m.layers, roofline=m.roofline,
        # One span over all the runs (steal and load of the whole measurement).
        system=SystemDelta(m.system.before, system.after) if m.system is not None else system,
    )
