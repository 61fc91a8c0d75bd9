"""The pytest_llmperf_* hooks: their specifications (docs/hooks.md) and the plugin's calls of them.

Hook specifications: how a conftest.py or another plugin extends pytest-llmperf.

Registered by the plugin's ``pytest_addhooks``; implement them as plain functions named like
the spec in a ``conftest.py`` (or a plugin). docs/hooks.md has a working example of each.
Light on purpose: loaded by every pytest run, so it imports nothing but pluggy.

The plugin's calls of its own hooks (after the specifications): each checks what comes back and turns a
wrong answer into one line that names the hook, not a traceback deep in a report writer."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pluggy

from ..core.errors import ConfigError, EngineError
from ..engines import CallableEngine
from ..engines.capabilities import Engine

if TYPE_CHECKING:
    import pytest

    from ..core.documents import JSONValue
    from ..core.settings import EngineSettings
    from ..core.workload import EngineInfo
    from ..engines.llama_cpp_native import EngineConfig
    from ..judge.result import Outcome

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_llmperf_fingerprint(
    config: pytest.Config, hardware: dict[str, JSONValue], subject: dict[str, JSONValue], info: EngineInfo
) -> None:
    """Add, change or remove environment fingerprint keys, in place (the return is ignored).

    Called once per engine the session measures, when its fingerprint is first built: before
    the first baseline comparison and before anything is recorded. ``info`` is the engine's
    ``EngineInfo``. Values must be JSON scalars (str, int, float, bool or None).

    ``hardware``: what must match for two measurements to be compared; every key is part of
    the hardware key the baselines are stored under, so a new value means "baselines exist
    only for other hardware" (the note names the key). ``subject``: what a change is tested
    for; recorded with the baseline, and a changed value is printed next to the verdict
    ("changed since the baseline: <key> old -> new") while the comparison still runs. A key
    the baseline does not have yet is not a change (adding a hook re-flags nothing).
    """


@hookspec(firstresult=True)
def pytest_llmperf_result(config: pytest.Config, item: pytest.Item, result: Outcome) -> Outcome | None:
    """See, or replace, each measurement's result before anything reports it.

    Called once per measurement (each ``llmperf.measure()``, the automatic one included) when
    the test's call report is made: after its budgets and baseline verdict are known, before
    the terminal section, JUnit properties, ``--llmperf-json``/HTML/Markdown reports and
    ``--llmperf-update-baselines`` see it. ``result`` is the measurement's frozen
    ``judge.result.Outcome`` (``pytest_llmperf.Result``): ``measurement``, ``failure``,
    ``baseline``, ``budgets``, ``extra_info``, and everything a report reads.

    Return None to keep it, or a replacement (``dataclasses.replace(result, ...)``): e.g.
    ``extra_info={...}`` (JSON values, written to the JSON report's entry) or ``failure=None``
    (waive the budget breach). The first non-None return wins; an implementation that only
    looks returns None, so every one sees each result unless an earlier one replaced it.
    """


@hookspec(firstresult=True)
def pytest_llmperf_make_engine(
    config: pytest.Config, settings: EngineSettings, engine_config: EngineConfig | None
) -> object:
    """Provide the engine the llmperf tests measure; None: the default one.

    Called when an engine is first needed: once for the session's engine, and once per
    distinct llama.cpp setting a test's marker names (``threads=``, ``flash_attn=``...).
    ``settings`` is the session's ``EngineSettings``; ``engine_config`` the ``EngineConfig``
    asked for (None when the session measures an ``--llmperf-endpoint``). Return an object
    with ``info() -> EngineInfo`` and ``run(workload, run_index) -> RunTrace`` (an
    ``engines.Engine``), or a callable ``fn(prompt, max_tokens)`` yielding tokens (wrapped in
    a ``CallableEngine``). The plugin calls its ``close()``, if any, when no test needs it.
    """


def _who(config: pytest.Config, name: str) -> str:
    impls = getattr(config.hook, name).get_hookimpls()
    return ", ".join(sorted({getattr(i.plugin, "__file__", None) or i.plugin_name for i in impls})) or "?"


def fingerprint(
    config: pytest.Config, hardware: dict[str, JSONValue], subject: dict[str, JSONValue], info: EngineInfo
) -> None:
    """Let ``pytest_llmperf_fingerprint`` edit both halves in place; JSON scalars only (they
    are stored in the baseline file and compared with ``!=``)."""
    config.hook.pytest_llmperf_fingerprint(config=config, hardware=hardware, subject=subject, info=info)
    for half, keys in (("hardware", hardware), ("subject", subject)):
        for key, value in keys.items():
            if not isinstance(key, str) or not (value is None or isinstance(value, (str, int, float, bool))):
                raise ConfigError(
                    f"pytest_llmperf_fingerprint ({_who(config, 'pytest_llmperf_fingerprint')}) set {half}[{key!r}] "
                    f"to {value!r}: fingerprint keys are strings and values str, int, float, bool or None"
                )


def result(config: pytest.Config, item: pytest.Item, r: Outcome) -> Outcome:
    """The outcome to report: ``pytest_llmperf_result``'s replacement, else ``r``."""
    new = config.hook.pytest_llmperf_result(config=config, item=item, result=r)
    if new is None:
        return r
    if not isinstance(new, type(r)):
        raise ConfigError(
            f"pytest_llmperf_result ({_who(config, 'pytest_llmperf_result')}) returned {type(new).__name__}; "
            "return None or a Result (dataclasses.replace(result, ...))"
        )
    try:
        json.dumps(dict(new.extra_info), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"pytest_llmperf_result ({_who(config, 'pytest_llmperf_result')}): extra_info must be a dict of JSON "
            f"values: {exc}"
        ) from None
    return new


def make_engine(config: pytest.Config, settings: EngineSettings, engine_config: EngineConfig | None) -> Engine | None:
    """``pytest_llmperf_make_engine``'s engine (a callable wrapped), or None for the default."""
    engine = config.hook.pytest_llmperf_make_engine(config=config, settings=settings, engine_config=engine_config)
    if engine is None:
        return None
    if isinstance(engine, Engine):
        return engine
    if callable(engine):
        from ..engines.user_llama import watch_llamas

        return CallableEngine(engine, watch=watch_llamas())
    raise EngineError(
        f"pytest_llmperf_make_engine ({_who(config, 'pytest_llmperf_make_engine')}) returned {type(engine).__name__}; "
        "return an engine (info() and run(workload, run_index)), a callable fn(prompt, max_tokens) or None"
    )


def engine_note(config: pytest.Config) -> str | None:
    """The header's word that a hook may measure another engine than the one it names."""
    if not config.hook.pytest_llmperf_make_engine.get_hookimpls():
        return None
    return (
        f"llmperf: pytest_llmperf_make_engine ({_who(config, 'pytest_llmperf_make_engine')}) may provide the engine "
        "measured; the reports name the engine each measurement used"
    )
