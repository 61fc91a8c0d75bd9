"""Engines per distinct setting: each loaded once, freed when no later test needs it, bounded.

A test (or a parametrized case) may ask for its own threads, context, flash attention... Loading
a model takes from milliseconds to minutes and holds its weights and KV cache in memory, so:

- one engine per distinct ``EngineConfig``, loaded on first use and reused;
- ``plan`` counts how many collected tests name each setting in their marker; when the last
  of them has run (``finished``), its engine is freed. Settings given only to
  ``llmperf.measure()`` are not known before the test runs: their engine is freed when that
  test ends, unless a later test's marker names the same setting;
- at most ``max_alive`` engines live at once; the least recently used is freed first. The
  session's default engine (the ``llmperf_engine`` fixture hands it out for the whole session)
  is pinned and never freed before the end. The running test's own engines are never freed
  under it (an A/B comparison alternates two), so one test may exceed the bound by what it
  needs at once.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

from ..core.errors import EngineError
from ..core.settings import SETTINGS
from ..models.gguf import model_path
from .capabilities import Closable, Engine, EngineProcess
from .llama_cpp_native import EngineConfig

#: Engines alive at once, unless the session says otherwise (``--llmperf-max-engines``).
DEFAULT_MAX_ALIVE: int = SETTINGS["max_engines"].default


class EnginePool:
    def __init__(self, load: Callable[[EngineConfig], Engine], max_alive: int = DEFAULT_MAX_ALIVE) -> None:
        if max_alive < 1:
            raise ValueError(f"max_alive must be >= 1, got {max_alive}")
        self._load = load
        self.max_alive = max_alive
        self._alive: OrderedDict[EngineConfig, Engine] = OrderedDict()
        self._errors: dict[EngineConfig, str] = {}
        self._planned: Counter[EngineConfig] = Counter()
        self._pinned: set[EngineConfig] = set()
        self._used_by_current: set[EngineConfig] = set()
        #: How often each setting was loaded (a setting loaded twice was freed in between).
        self.loads: Counter[EngineConfig] = Counter()

    def plan(self, configs: Iterable[EngineConfig | None]) -> None:
        """The settings named by the markers of the tests still to run, in order (None: the
        session default)."""
        self._planned = Counter(c for c in configs if c is not None)

    def pin(self, config: EngineConfig) -> None:
        self._pinned.add(config)

    def get(self, config: EngineConfig) -> Engine:
        """The engine for ``config``: the live one, else loaded now (freeing the least recently
        used unpinned engines beyond the bound first). A failed load is remembered: later
        tests asking for the same setting fail with the same line, without retrying."""
        if config in self._alive and _died(self._alive[config]):
            self._free(config)  # its worker crashed in an earlier test: this test gets a fresh one
        if config in self._alive:
            self._used_by_current.add(config)
            self._alive.move_to_end(config)
            return self._alive[config]
        if config in self._errors:
            raise EngineError(self._errors[config])
        self._make_room(self.max_alive - 1)
        self._used_by_current.add(config)
        try:
            engine = self._load(config)
        except EngineError as exc:
            self._errors[config] = str(exc)
            raise
        self.loads[config] += 1
        self._alive[config] = engine
        return engine

    def finished(self, planned: EngineConfig | None) -> None:
        """A test ended: its marker's setting has one use fewer; free every engine no later
        test names (the test's own measure() settings included), except pinned ones."""
        if planned is not None and self._planned[planned] > 0:
            self._planned[planned] -= 1
        for config in list(self._alive):
            if config not in self._pinned and self._planned[config] <= 0:
                self._free(config)
        self._used_by_current.clear()

    def release(self, model_path: str) -> None:
        """Free every live engine of the model file ``model_path`` (pinned ones too: ``get``
        loads them again when asked)."""
        for config, engine in list(self._alive.items()):
            if engine.info().model_path == model_path:
                self._free(config)

    def alive(self) -> list[EngineConfig]:
        return list(self._alive)

    def close(self) -> None:
        for config in list(self._alive):
            self._free(config)

    def _make_room(self, keep: int) -> None:
        # The running test's engines stay (an A/B test alternates two of them): the bound may
        # be exceeded by what one test needs at once, never by what earlier tests left.
        unpinned = [c for c in self._alive if c not in self._pinned and c not in self._used_by_current]
        while len(self._alive) > keep and unpinned:
            self._free(unpinned.pop(0))

    def _free(self, config: EngineConfig) -> None:
        engine = self._alive.pop(config)
        if isinstance(engine, Closable):
            engine.close()


def _died(engine: Engine) -> bool:
    """Whether the process an engine runs llama.cpp in (``EngineProcess``) is gone."""
    return isinstance(engine, EngineProcess) and not engine.alive


def load_config(config: EngineConfig) -> Engine:
    """A LlamaCppEngine for ``config`` (a preset name is written once, then cached)."""
    from .llama_cpp import LlamaCppEngine

    path, name = model_path(config.model)
    return LlamaCppEngine.from_config(config.replace({"model": str(path)}), name=name or path.stem)
