"""pytest-llmperf: performance regression testing of LLM inference.

The core works without pytest::

    from pytest_llmperf import LlamaCppEngine, Workload, measure, ensure_model
    engine = LlamaCppEngine(ensure_model("tiny"))
    m = measure(engine, Workload(prompt_tokens=64, max_tokens=32, runs=5))
    print(m.ttft_ms, m.decode_tps, m.itl.p95_ms)

The public API is the names imported in the ``TYPE_CHECKING`` block below (docs/api.md), and
nothing else: everything under the layer packages is internal. Each name is imported on first
use: pytest loads this package for every run of every project where the plugin is installed,
and numpy, scipy and llama_cpp must cost nothing in a run that collects no llmperf test.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

#: The one place the version is written (pyproject.toml reads it; the fingerprint and the
#: history record it).
__version__ = "0.1.0"

if TYPE_CHECKING:  # the one list of public names: type checkers read it, and so does _exports()
    from .core.errors import ConfigError, EngineError, LLMPerfError
    from .core.measurement import LatencyStats, Measurement, RunMetrics
    from .core.workload import EngineInfo, NativeCounters, RunTrace, Workload
    from .engines import CallableEngine
    from .engines.capabilities import (
        AsyncRuns,
        Closable,
        ConcurrentRuns,
        DrivenLlama,
        Engine,
        EngineProcess,
        FreshInstances,
        FreshLoads,
        LayerTiming,
        LlamaObject,
        NeedsPromptIds,
        ProcessMemory,
        RemoteLayerTiming,
        SentRequests,
        ServerMetrics,
        SteppedRuns,
        TokenProbabilities,
    )
    from .engines.http import HttpEngine
    from .engines.llama_cpp import LlamaCppEngine
    from .engines.llama_cpp_native import EngineConfig
    from .engines.servers import serve, tool_path
    from .judge.ab import ABResult, Side, compare_ab
    from .judge.budgets import BudgetFailure, check_budgets
    from .judge.result import MeasurementResult, Outcome, Result, ResultError
    from .measuring.metrics import summarize
    from .measuring.runner import InferenceProfiler, ProfilerStats, measure
    from .models.gguf import PRESETS, ModelSpec, ensure_model, write_gguf
    from .reports.session_file import load_session

_FOUND: dict[str, str] = {}


def _exports() -> dict[str, str]:
    """Public name -> the module that defines it (relative to this package), read once from
    the ``TYPE_CHECKING`` block of this file."""
    if not _FOUND:
        tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
        block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
        _FOUND.update(
            {
                a.name: node.module
                for node in block.body
                if isinstance(node, ast.ImportFrom)
                for a in node.names
                if node.module
            }
        )
    return _FOUND


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return sorted(_exports())
    module = _exports().get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_exports()))
