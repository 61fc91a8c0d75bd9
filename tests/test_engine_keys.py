"""A llama.cpp setting is a marker key of kind "engine": this names the place it does not reach
yet (an ``EngineConfig`` field, its default in ``settings.ENGINE_DEFAULTS``, the mapping onto
``LlamaCppEngine``'s keywords in ``from_config``), rather than failing deep in a session."""

from __future__ import annotations

import dataclasses
import inspect

from pytest_llmperf.core.settings import ENGINE_DEFAULTS
from pytest_llmperf.engines.llama_cpp_native import EngineConfig
from pytest_llmperf.session.options import KEYS


def test_every_engine_key_reaches_the_engine_config_and_the_llama_construction() -> None:
    from pytest_llmperf.engines.llama_cpp import LlamaCppEngine

    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    mapping = inspect.getsource(LlamaCppEngine.from_config)
    for name, key in KEYS.items():
        if key.kind != "engine":
            continue
        assert name in fields, (
            f"engine marker key {name!r} is not a field of EngineConfig (engines/llama_cpp_native.py)"
        )
        if name == "model":
            continue
        assert name in ENGINE_DEFAULTS, (
            f"engine marker key {name!r} has no default in core/settings.py's ENGINE_DEFAULTS"
        )
        assert f"config.{name}" in mapping, f"engine marker key {name!r} is not passed on in LlamaCppEngine.from_config"
    extra = fields - {n for n, k in KEYS.items() if k.kind == "engine"}
    assert not extra, f"EngineConfig fields no engine marker key sets: {sorted(extra)}"
