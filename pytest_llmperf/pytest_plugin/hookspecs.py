"""Hook specifications: how a conftest.py or another plugin extends pytest-llmperf.

Registered by the plugin's ``pytest_addhooks``; implement them as plain functions named like
the spec in a ``conftest.py`` (or a plugin). docs/hooks.md has a working example of each.
Light on purpose: loaded by every pytest run, so it imports nothing but pluggy.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_llmperf_fingerprint(config: Any, hardware: dict[str, Any], subject: dict[str, Any], info: Any) -> None:
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
def pytest_llmperf_result(config: Any, item: Any, result: Any) -> Any:
    """See, or replace, each measurement's result before anything reports it.

    Called once per measurement (each ``llmperf.measure()``, the automatic one included) when
    the test's call report is made: after its budgets and baseline verdict are known, before
    the terminal section, JUnit properties, ``--llmperf-json``/HTML/Markdown reports and
    ``--llmperf-update-baselines`` see it. ``result`` is a frozen ``session.results.Result``
    (``measurement``, ``failure``, ``baseline``, ``budgets``, ``extra_info``).

    Return None to keep it, or a replacement (``dataclasses.replace(result, ...)``): e.g.
    ``extra_info={...}`` (JSON values, written to the JSON report's entry) or ``failure=None``
    (waive the budget breach). The first non-None return wins; an implementation that only
    looks returns None, so every one sees each result unless an earlier one replaced it.
    """


@hookspec(firstresult=True)
def pytest_llmperf_make_engine(config: Any, settings: Any, engine_config: Any) -> Any:
    """Provide the engine the llmperf tests measure; None: the default one.

    Called when an engine is first needed: once for the session's engine, and once per
    distinct llama.cpp setting a test's marker names (``threads=``, ``flash_attn=``...).
    ``settings`` is the session's ``EngineSettings``; ``engine_config`` the ``EngineConfig``
    asked for (None when the session measures an ``--llmperf-endpoint``). Return an object
    with ``info() -> EngineInfo`` and ``run(workload, run_index) -> RunTrace`` (an
    ``engines.Engine``), or a callable ``fn(prompt, max_tokens)`` yielding tokens (wrapped in
    a ``CallableEngine``). The plugin calls its ``close()``, if any, when no test needs it.
    """
