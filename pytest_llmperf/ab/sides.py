"""What a side of an A/B may be: llama.cpp settings, a model, a callable, an endpoint, an engine."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import ConfigError
from .run import Side


def check_side(name: str, spec: Any) -> Any:
    """Validate a side as the marker gives it (settings are checked key by key)."""
    if isinstance(spec, Mapping):
        from ..schema import KEYS

        out = {}
        for key, value in spec.items():
            k = KEYS.get(key)
            if k is None or k.kind != "engine":
                allowed = ", ".join(n for n, v in KEYS.items() if v.kind == "engine")
                raise ConfigError(f"A/B side {name!r}: unknown llama.cpp setting {key!r}; allowed: {allowed}")
            out[key] = k.check(key, value)
        return out
    if isinstance(spec, str) and spec:
        return spec
    if callable(spec) or hasattr(spec, "run"):
        return spec
    raise ConfigError(
        f"A/B side {name!r} must be llama.cpp settings (a dict such as {{'threads': 1}}), a model "
        f"(GGUF path or preset), an endpoint URL, a callable fn(prompt, max_tokens) or an engine; got {spec!r}"
    )


def resolve_side(name: str, spec: Any, engine_for: Callable[[Mapping[str, Any]], Any]) -> Side:
    """A ``Side`` ready to run; ``engine_for(settings)``: the plugin's (or the caller's) engine
    for llama.cpp settings over the session's."""
    spec = check_side(name, spec)
    if isinstance(spec, Mapping):
        label = " ".join(f"{k}={v}" for k, v in spec.items()) or "session engine"
        return Side(label, engine_for(spec))
    if isinstance(spec, str):
        if spec.startswith(("http://", "https://")):
            from ..engines.http import HttpEngine

            return Side(spec, HttpEngine(spec))
        return Side(spec, engine_for({"model": spec}))
    if hasattr(spec, "run") and hasattr(spec, "info"):
        return Side(spec.info().model, spec)
    return Side(getattr(spec, "__name__", repr(spec)), spec)
