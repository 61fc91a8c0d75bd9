"""Engines turn a workload into run traces. They know nothing of pytest.

What an engine is and what it may offer: ``capabilities`` (the ``Engine`` protocol and one
protocol per further ability), named here too.

Measure any token stream: a callable ``fn(prompt, max_tokens)`` returning an iterable.

This is how users plug in an engine we do not ship: each item the iterable yields counts as
one generated token, stamped when the item arrives."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from ..core.errors import EngineError
from ..core.workload import EngineInfo, RunTrace, Workload
from .capabilities import (
    CAPABILITIES,
    AsyncRuns,
    Closable,
    ConcurrentRuns,
    Engine,
    EngineProcess,
    FreshEngine,
    FreshLoads,
    LayerTiming,
    LlamaObject,
    NeedsPromptIds,
    ProcessMemory,
    RemoteLayerTiming,
    ServerMetrics,
    TokenProbabilities,
    times_layers,
)

__all__ = [
    "CAPABILITIES",
    "AsyncRuns",
    "CallableEngine",
    "Closable",
    "ConcurrentRuns",
    "Engine",
    "EngineProcess",
    "FreshEngine",
    "FreshLoads",
    "LayerTiming",
    "LlamaObject",
    "NeedsPromptIds",
    "ProcessMemory",
    "RemoteLayerTiming",
    "ServerMetrics",
    "TokenProbabilities",
    "times_layers",
]


TokenStream = Callable[[str, int], Iterable[Any]]


def synthetic_text(n_words: int, seed: int) -> str:
    """A seeded prompt of ``n_words`` short words (about one token each for most tokenizers)."""
    import numpy as np  # not at import: the engines package is read at every pytest start

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return " ".join("".join(rng.choice(letters, size=3)) for _ in range(n_words))


class CallableEngine(Engine):
    """Wraps ``fn(prompt, max_tokens) -> iterable of tokens`` as an engine (``info`` and
    ``run``, none of the abilities of ``engines.capabilities``)."""

    def __init__(self, fn: TokenStream, name: str | None = None) -> None:
        if not callable(fn):
            raise EngineError(f"engine must be callable as fn(prompt, max_tokens), got {fn!r}")
        self._fn = fn
        self._info = EngineInfo(engine="callable", model=name or str(getattr(fn, "__name__", "callable")))

    def info(self) -> EngineInfo:
        return self._info

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        prompt = workload.prompt
        if prompt is None:
            prompt = synthetic_text(workload.synthetic_prompt_tokens or 0, workload.seed)
        clock = time.perf_counter_ns
        stamps: list[int] = []
        append = stamps.append
        start = clock()
        for _ in self._fn(prompt, workload.max_tokens):
            append(clock())
        if len(stamps) < 2:
            raise EngineError(f"engine {self._info.model!r} yielded {len(stamps)} token(s); at least 2 are needed")
        return RunTrace(start_ns=start, prefill_done_ns=None, token_ns=tuple(stamps), prompt_tokens=None)
