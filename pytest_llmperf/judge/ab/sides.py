"""What a side of an A/B may be: llama.cpp settings, a model, a callable, an endpoint, an engine."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..marker import check_side
from .run import Side


def resolve_side(name: str, spec: Any, engine_for: Callable[[Mapping[str, Any]], Any]) -> Side:
    """A ``Side`` ready to run; ``engine_for(settings)``: the plugin's (or the caller's) engine
    for llama.cpp settings over the session's."""
    spec = check_side(name, spec)
    if isinstance(spec, Mapping):
        label = " ".join(f"{k}={v}" for k, v in spec.items()) or "session engine"
        return Side(label, engine_for(spec))
    if isinstance(spec, str):
        if spec.startswith(("http://", "https://")):
            from ...core.redact import display
            from ...engines.http import HttpEngine

            return Side(display(spec), HttpEngine(spec))  # named as shown: no password, no api_key=
        return Side(spec, engine_for({"model": spec}))
    if hasattr(spec, "run") and hasattr(spec, "info"):
        return Side(spec.info().model, spec)
    return Side(getattr(spec, "__name__", repr(spec)), spec)
