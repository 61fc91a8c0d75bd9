"""The engines a session measures: the session's own (loaded once), one per llama.cpp setting
a test names (``engines.llama_cpp_native``), or what a hook provides; and the header lines that say what
they are without loading anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..core.errors import EngineError, LLMPerfError
from ..core.settings import EngineSettings, threads_warning

#: ``fn(settings, engine_config)``: an engine, or None for the default (the pytest layer's
#: ``pytest_llmperf_make_engine``); raises LLMPerfError for a wrong answer.
MakeEngineHook = Callable[[EngineSettings, Any], Any]


def load_engine(settings: EngineSettings) -> Any:
    """The session's engine by its settings: the endpoint's HttpEngine, else llama.cpp."""
    if settings.endpoint:
        from ..engines.http import HttpEngine

        return HttpEngine.from_settings(settings.endpoint, settings, settings.api_model)
    from ..engines.llama_cpp import LlamaCppEngine
    from ..models.gguf import ensure_model

    path: str | Path = ensure_model(settings.preset) if settings.preset else settings.model
    return LlamaCppEngine(
        path,
        n_ctx=settings.n_ctx,
        n_threads=settings.threads,
        n_batch=settings.n_batch,
        n_gpu_layers=settings.gpu_layers,
        name=settings.model_label,
    )


def engine_config(settings: EngineSettings, overrides: Any = None) -> Any:
    """``engines.llama_cpp_native.EngineConfig`` of the session's settings with a test's own over them
    (imported here: the engine layer loads once an llmperf test runs)."""
    from ..engines.llama_cpp_native import EngineConfig

    return EngineConfig.from_settings(settings, overrides)


class Engines:
    """The session's engines, each loaded on first use; ``close`` frees them all."""

    def __init__(self, settings: EngineSettings, make_engine: MakeEngineHook) -> None:
        self.settings = settings
        self.make_engine = make_engine
        self.endpoint_engine: Any = None
        self.endpoint_error: str | None = None
        self.pool: Any = None
        self.planned_by_id: dict[str, Any] = {}
        self.local_engine: Any = None  # the session's engine in this process (local()), loaded once
        self.local_error: str | None = None

    def get(self, overrides: Any = None) -> Any:
        """The engine a test measures: the session's, or with a test's own llama.cpp settings
        (marker keys ``threads``, ``flash_attn``...) one from the pool (engines/pool.py).
        Raises EngineError (one line)."""
        s = self.settings
        if overrides:
            if s.endpoint:
                raise EngineError(
                    f"llama.cpp settings ({', '.join(overrides)}) need the in-process engine; this session "
                    f"measures the endpoint {s.endpoint}"
                )
            return self.engine_pool().get(engine_config(s, overrides))
        if s.endpoint:
            if self.endpoint_engine is None and self.endpoint_error is None:
                try:
                    self.endpoint_engine = self.make_engine(s, None) or load_engine(s)
                except LLMPerfError as exc:
                    self.endpoint_error = str(exc)
            if self.endpoint_error is not None:
                raise EngineError(self.endpoint_error)
            return self.endpoint_engine
        base = engine_config(s)
        pool = self.engine_pool()
        pool.pin(base)  # the llmperf_engine fixture may hold it for the whole session
        return pool.get(base)

    def local(self) -> Any:
        """The session's engine in this process, for tests that hold the engine or its
        ``llama_cpp.Llama`` object (``llmperf_engine``, ``llmperf_llm``). Unless the session
        measures in process anyway, a throw-away engine worker first loads the same setting and
        runs two tokens: a setting that crashes llama.cpp fails here, with the worker's line,
        instead of ending the session. Raises EngineError (one line)."""
        s = self.settings
        if s.endpoint or s.in_process:
            return self.get()
        if self.local_engine is None and self.local_error is None:
            base = engine_config(s)
            try:
                self.local_engine = self.make_engine(s, base)
                if self.local_engine is None:
                    from ..engines.pool import load_config
                    from ..measuring.worker import preflight

                    preflight(base, timeout_s=s.engine_timeout)
                    self.local_engine = load_config(base)
            except LLMPerfError as exc:
                self.local_error = str(exc)
        if self.local_error is not None:
            raise EngineError(self.local_error)
        return self.local_engine

    def engine_pool(self) -> Any:
        if self.pool is None:
            from ..engines.pool import EnginePool, load_config

            def load(config: Any) -> Any:  # a conftest's engine first (pytest_llmperf_make_engine)
                engine = self.make_engine(self.settings, config)
                if engine is not None:
                    return engine
                if self.settings.in_process:
                    return load_config(config)
                from ..measuring.worker import load_worker

                return load_worker(config, timeout_s=self.settings.engine_timeout)

            self.pool = EnginePool(load, self.settings.max_engines)
            self.pool.plan(list(self.planned_by_id.values()))
        return self.pool

    def plan(self, planned: dict[str, Any]) -> None:
        """``{nodeid: marker engine keys}`` of the tests to run: the pool frees an engine after
        the last test that names its settings. A bad setting is skipped here: its test fails
        with that line when it runs."""
        if self.settings.endpoint:
            return
        self.planned_by_id = {}
        for nodeid, overrides in planned.items():
            try:
                self.planned_by_id[nodeid] = engine_config(self.settings, overrides)
            except LLMPerfError:
                continue
        if self.pool is not None:
            self.pool.plan(list(self.planned_by_id.values()))

    def finished(self, nodeid: str) -> None:
        if self.pool is not None:
            self.pool.finished(self.planned_by_id.get(nodeid))

    def close(self) -> None:
        if self.local_engine is not None:
            getattr(self.local_engine, "close", lambda: None)()
            self.local_engine = None
        if self.endpoint_engine is not None:
            getattr(self.endpoint_engine, "close", lambda: None)()  # a hook's engine may have none
            self.endpoint_engine = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def describe(settings: EngineSettings, threads_source: str, disabled: bool, engine_note: str | None) -> list[str]:
    """What the llmperf tests measure (model or endpoint, threads), and a warning when the
    threads asked for exceed the CPUs usable. Loads nothing but file metadata."""
    from ..core.settings import usable_cpus
    from ..engines.llama_cpp_native import llama_cpp_version
    from ..models.gguf import describe_model

    s = settings
    if s.endpoint:
        from ..core.workload import PROMPT_CACHE_NOTE

        lines = [f"llmperf: endpoint {s.endpoint} ({s.api}), model {s.api_model or '(server default)'}",
                 f"llmperf: {PROMPT_CACHE_NOTE}"]
    else:
        lines = [
            f"llmperf: model {describe_model(s)}, threads {s.threads or usable_cpus()}, "
            f"n_ctx {s.n_ctx or 'auto'}, llama-cpp-python {llama_cpp_version() or 'NOT INSTALLED'}"
        ]
    if disabled:
        lines.append("llmperf: --llmperf-disable: each measurement runs once; no budgets, statistics or baselines")
    warning = None if s.endpoint else threads_warning(s.threads, threads_source)
    return lines + ([engine_note] if engine_note else []) + ([warning] if warning else [])
