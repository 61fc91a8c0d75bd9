"""pytest-llmperf: performance regression testing of LLM inference.

The core works without pytest::

    from pytest_llmperf import LlamaCppEngine, Workload, measure, ensure_model
    engine = LlamaCppEngine(ensure_model("tiny"))
    m = measure(engine, Workload(prompt_tokens=64, max_tokens=32, runs=5))
    print(m.ttft_ms, m.decode_tps, m.itl.p95_ms)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .budgets import BudgetFailure, check_budgets
from .engine_info import EngineInfo
from .engines import CallableEngine, Engine
from .errors import ConfigError, EngineError, LLMPerfError
from .metrics import LatencyStats, Measurement, RunMetrics, summarize
from .profiler import InferenceProfiler, ProfilerStats
from .runner import measure
from .synthetic import PRESETS, ModelSpec, ensure_model, write_gguf
from .trace import NativeCounters, RunTrace
from .workload import Workload

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .engines.llama_cpp import LlamaCppEngine


def __getattr__(name: str) -> Any:
    # llama_cpp is imported only when its engine is asked for.
    if name == "LlamaCppEngine":
        from .engines.llama_cpp import LlamaCppEngine

        return LlamaCppEngine
    raise AttributeError(name)


__all__ = [
    "BudgetFailure",
    "CallableEngine",
    "ConfigError",
    "Engine",
    "EngineError",
    "EngineInfo",
    "InferenceProfiler",
    "LLMPerfError",
    "LatencyStats",
    "LlamaCppEngine",
    "Measurement",
    "ModelSpec",
    "NativeCounters",
    "PRESETS",
    "ProfilerStats",
    "RunMetrics",
    "RunTrace",
    "Workload",
    "check_budgets",
    "ensure_model",
    "measure",
    "summarize",
    "write_gguf",
]
