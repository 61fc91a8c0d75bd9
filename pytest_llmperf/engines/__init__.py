"""Engines turn a workload into run traces. They know nothing of pytest.

What an engine is and what it may offer: ``capabilities`` (the ``Engine`` protocol and one
protocol per further ability), named here too.

Measure any token stream: a callable ``fn(prompt, max_tokens)`` returning an iterable.

This is how users plug in an engine we do not ship: each item the iterable yields counts as
one generated token, stamped when the item arrives. A callable that drives a model whose
llama.cpp counters can be read (the fixtures' ``llama_cpp.Llama``: ``engines.llama_cpp.LlamaCounters``)
is given them as its ``counters``: read around each run, they split its time into llama.cpp's
and the rest (the parts of each phase) as for the plugin's own engine."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from ..core.errors import EngineError, NotSteppable
from ..core.workload import EngineInfo, NativeCounters, RunTrace, Workload
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
    SteppedRuns,
    TokenProbabilities,
    times_layers,
)

__all__ = [
    "CAPABILITIES",
    "AsyncRuns",
    "CallableEngine",
    "Closable",
    "ConcurrentRuns",
    "CounterSource",
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
    "SteppedCallableEngine",
    "SteppedRuns",
    "TokenProbabilities",
    "times_layers",
]


TokenStream = Callable[[str, int], Iterable[Any]]

Reading = TypeVar("Reading")


class CounterSource(Protocol[Reading]):
    """llama.cpp's own counters of a model that a callable drives, read around each of its runs:
    ``read()`` just before the run's first clock read and just after its last one (never between
    them), ``between(before, after)`` the run's ``NativeCounters`` (None: the counters did not
    move, the callable did not drive that model)."""

    def read(self) -> Reading: ...

    def between(self, before: Reading, after: Reading) -> NativeCounters | None: ...

    def memory(self) -> Mapping[str, float | None]:
        """The model's memory figures (``core.workload.MEMORY_FIELDS``: llama.cpp's buffers,
        the file mapping) as its engine reports them; empty when unknown."""
        ...


def synthetic_text(n_words: int, seed: int) -> str:
    """A seeded prompt of ``n_words`` short words (about one token each for most tokenizers)."""
    import numpy as np  # not at import: the engines package is read at every pytest start

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return " ".join("".join(rng.choice(letters, size=3)) for _ in range(n_words))


class CallableEngine(Engine):
    """Wraps ``fn(prompt, max_tokens) -> iterable of tokens`` as an engine (``info`` and
    ``run``, none of the abilities of ``engines.capabilities``). ``counters``: the llama.cpp
    counters of the model ``fn`` may drive, read around each run into its trace's ``native``
    (None: a run's time is not split)."""

    def __init__(self, fn: TokenStream, name: str | None = None, *, counters: CounterSource[Any] | None = None) -> None:
        if not callable(fn):
            raise EngineError(f"engine must be callable as fn(prompt, max_tokens), got {fn!r}")
        self._fn = fn
        self.counters = counters
        self._info = EngineInfo(engine="callable", model=name or str(getattr(fn, "__name__", "callable")))

    def info(self) -> EngineInfo:
        """The callable's name; with ``counters``, the memory figures of the model it drives."""
        if self.counters is None:
            return self._info
        memory: dict[str, Any] = dict(self.counters.memory())  # MEMORY_FIELDS: MiB figures
        return dataclasses.replace(self._info, **memory)

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        prompt = self._prompt(workload)
        counters = self.counters
        before = counters.read() if counters is not None else None  # before the first clock read
        clock = time.perf_counter_ns
        stamps: list[int] = []
        append = stamps.append
        start = clock()
        for _ in self._fn(prompt, workload.max_tokens):
            append(clock())
        native = counters.between(before, counters.read()) if counters is not None else None  # after the last
        return self._trace(start, stamps, native)

    def _trace(self, start: int, stamps: list[int], native: NativeCounters | None) -> RunTrace:
        if len(stamps) < 2:
            raise EngineError(f"engine {self._info.model!r} yielded {len(stamps)} token(s); at least 2 are needed")
        return RunTrace(start_ns=start, prefill_done_ns=None, token_ns=tuple(stamps), prompt_tokens=None, native=native)

    def _prompt(self, workload: Workload) -> str:
        if workload.prompt is not None:
            return workload.prompt
        return synthetic_text(workload.synthetic_prompt_tokens or 0, workload.seed)


class SteppedCallableEngine(CallableEngine, SteppedRuns):
    """A callable that drives a model whose counters it was given (the fixtures' Llama), run
    token by token (``SteppedRuns``): the iterable is asked for each next token only after
    ``pause()`` returned. Whether the callable computed while paused is not assumed, it is
    checked: the counters are read around every pause (outside the clock reads), and a run
    whose counters moved during one (tokens made ahead of the reader, in a thread or a server)
    or never moved at all raises ``NotSteppable``."""

    counters: CounterSource[Any]

    def __init__(self, fn: TokenStream, name: str | None = None, *, counters: CounterSource[Any]) -> None:
        super().__init__(fn, name, counters=counters)

    def run_stepped(self, workload: Workload, run_index: int, pause: Callable[[], None]) -> RunTrace:
        prompt = self._prompt(workload)
        counters = self.counters
        before = counters.read()  # before the first clock read
        self._hold(pause)
        clock = time.perf_counter_ns
        stamps: list[int] = []
        paused_ns = 0
        start = clock()
        for _ in self._fn(prompt, workload.max_tokens):
            arrived = clock()
            stamps.append(arrived - paused_ns)
            self._hold(pause)
            paused_ns += clock() - arrived
        native = counters.between(before, counters.read())  # after the last
        if native is None:
            raise NotSteppable(f"{self._info.model!r} did not call the fixtures' Llama: its pauses cannot be checked")
        return self._trace(start, stamps, native)

    def _hold(self, pause: Callable[[], None]) -> None:
        """One pause, the counters read around it: llama.cpp must not have worked meanwhile."""
        before = self.counters.read()
        pause()
        if self.counters.between(before, self.counters.read()) is not None:
            raise NotSteppable(
                f"{self._info.model!r} ran llama.cpp while paused between tokens (its tokens are made ahead "
                "of the reader: a thread or a server)"
            )
