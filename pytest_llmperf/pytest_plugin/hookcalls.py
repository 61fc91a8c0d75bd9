"""The plugin's calls of its own hooks (hookspecs.py): each checks what comes back and turns a
wrong answer into one line that names the hook, not a traceback deep in a report writer."""

from __future__ import annotations

import json
from typing import Any

from ..core.errors import ConfigError, EngineError


def _who(config: Any, name: str) -> str:
    impls = getattr(config.hook, name).get_hookimpls()
    return ", ".join(sorted({getattr(i.plugin, "__file__", None) or i.plugin_name for i in impls})) or "?"


def fingerprint(config: Any, hardware: dict[str, Any], subject: dict[str, Any], info: Any) -> None:
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


def result(config: Any, item: Any, r: Any) -> Any:
    """The result to report: ``pytest_llmperf_result``'s replacement, else ``r``."""
    from ..session.results import Result

    new = config.hook.pytest_llmperf_result(config=config, item=item, result=r)
    if new is None:
        return r
    if not isinstance(new, Result):
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


def make_engine(config: Any, settings: Any, engine_config: Any) -> Any:
    """``pytest_llmperf_make_engine``'s engine (a callable wrapped), or None for the default."""
    engine = config.hook.pytest_llmperf_make_engine(config=config, settings=settings, engine_config=engine_config)
    if engine is None:
        return None
    if hasattr(engine, "run") and hasattr(engine, "info"):
        return engine
    if callable(engine):
        from ..engines import CallableEngine

        return CallableEngine(engine)
    raise EngineError(
        f"pytest_llmperf_make_engine ({_who(config, 'pytest_llmperf_make_engine')}) returned {type(engine).__name__}; "
        "return an engine (info() and run(workload, run_index)), a callable fn(prompt, max_tokens) or None"
    )


def engine_note(config: Any) -> str | None:
    """The header's word that a hook may measure another engine than the one it names."""
    if not config.hook.pytest_llmperf_make_engine.get_hookimpls():
        return None
    return (
        f"llmperf: pytest_llmperf_make_engine ({_who(config, 'pytest_llmperf_make_engine')}) may provide the engine "
        "measured; the reports name the engine each measurement used"
    )
