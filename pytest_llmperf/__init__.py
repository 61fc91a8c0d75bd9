"""pytest-llmperf: performance regression testing of LLM inference.

The core works without pytest::

    from pytest_llmperf import LlamaCppEngine, Workload, measure, ensure_model
    engine = LlamaCppEngine(ensure_model("tiny"))
    m = measure(engine, Workload(prompt_tokens=64, max_tokens=32, runs=5))
    print(m.ttft_ms, m.decode_tps, m.itl.p95_ms)
"""

from __future__ import annotations

import importlib
from typing import Any, TYPE_CHECKING

__version__ = "0.1.0"

# Public names and the module that defines each. Imported on first use: pytest loads this
# package for every run of every project where the plugin is installed, and numpy, scipy and
# llama_cpp must cost nothing in a run that collects no llmperf test.
_EXPORTS = {
    "BudgetFailure": "judge.budgets",
    "check_budgets": "judge.budgets",
    "EngineInfo": "core.workload",
    "CallableEngine": "engines",
    "Engine": "engines",
    "ConfigError": "core.errors",
    "EngineError": "core.errors",
    "LLMPerfError": "core.errors",
    "LatencyStats": "measuring.metrics",
    "Measurement": "measuring.metrics",
    "RunMetrics": "measuring.metrics",
    "summarize": "measuring.metrics",
    "InferenceProfiler": "measuring.runner",
    "ProfilerStats": "measuring.runner",
    "measure": "measuring.runner",
    "PRESETS": "models.gguf",
    "ModelSpec": "models.gguf",
    "ensure_model": "models.gguf",
    "write_gguf": "models.gguf",
    "NativeCounters": "core.workload",
    "RunTrace": "core.workload",
    "Workload": "core.workload",
    "LlamaCppEngine": "engines.llama_cpp",
    "EngineConfig": "engines.llama_cpp_native",
    "ABResult": "judge.ab",
    "Side": "judge.ab",
    "compare_ab": "judge.ab",
}

if TYPE_CHECKING:
    from .judge.budgets import BudgetFailure, check_budgets
    from .core.workload import EngineInfo
    from .engines import CallableEngine, Engine
    from .engines.llama_cpp import LlamaCppEngine
    from .engines.llama_cpp_native import EngineConfig
    from .judge.ab import ABResult, Side, compare_ab
    from .core.errors import ConfigError, EngineError, LLMPerfError
    from .measuring.metrics import LatencyStats, Measurement, RunMetrics, summarize
    from .measuring.runner import InferenceProfiler, ProfilerStats
    from .measuring.runner import measure
    from .models.gguf import PRESETS, ModelSpec, ensure_model, write_gguf
    from .core.workload import NativeCounters, RunTrace
    from .core.workload import Workload


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = sorted(_EXPORTS)
