"""workload -> engine -> traces -> Measurement: the measuring path, without pytest."""

from __future__ import annotations

from typing import Any

from .engines import CallableEngine, Engine
from .metrics import Measurement, summarize
from .workload import Workload


def as_engine(obj: Any) -> Engine:
    """An Engine as is; a plain callable ``fn(prompt, max_tokens)`` wrapped."""
    if isinstance(obj, Engine):
        return obj
    return CallableEngine(obj)


def measure(engine: Any, workload: Workload | None = None, label: str = "") -> Measurement:
    """Run ``workload.warmup`` discarded runs, then ``workload.runs`` measured ones."""
    workload = workload or Workload()
    engine = as_engine(engine)
    for i in range(workload.warmup):
        engine.run(workload, -1 - i)
    traces = [engine.run(workload, i) for i in range(workload.runs)]
    return summarize(traces, workload, engine.info(), label=label)
