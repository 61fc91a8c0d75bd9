"""Session settings: command line > environment > ini > default, and the model they name."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError
from .synthetic import PRESETS

DEFAULT_MODEL = "tiny"

# (option dest, environment variable, ini name, parser, default)
_SOURCES: dict[str, tuple[str, str, Callable[[str], Any], Any]] = {
    "model": ("LLMPERF_MODEL", "llmperf_model", str, DEFAULT_MODEL),
    "threads": ("LLMPERF_THREADS", "llmperf_threads", int, None),
    "n_ctx": ("LLMPERF_N_CTX", "llmperf_n_ctx", int, 2048),
    "n_batch": ("LLMPERF_N_BATCH", "llmperf_n_batch", int, 512),
    "gpu_layers": ("LLMPERF_GPU_LAYERS", "llmperf_gpu_layers", int, 0),
    # Served models (engines/http.py): set an endpoint and the session measures it instead.
    "endpoint": ("LLMPERF_ENDPOINT", "llmperf_endpoint", str, None),
    "api": ("LLMPERF_API", "llmperf_api", str, "completions"),
    "api_model": ("LLMPERF_API_MODEL", "llmperf_api_model", str, None),
    "api_key_env": ("LLMPERF_API_KEY_ENV", "llmperf_api_key_env", str, "LLMPERF_API_KEY"),
    "request_timeout": ("LLMPERF_REQUEST_TIMEOUT", "llmperf_request_timeout", float, 300.0),
    "token_timeout": ("LLMPERF_TOKEN_TIMEOUT", "llmperf_token_timeout", float, 30.0),
}

INI_HELP = {
    "llmperf_model": "model for llmperf tests: a GGUF path or a synthetic preset (tiny, small)",
    "llmperf_threads": "llama.cpp threads (default: all usable CPUs)",
    "llmperf_n_ctx": "llama.cpp context size (default 2048)",
    "llmperf_n_batch": "llama.cpp batch size for prompt evaluation (default 512)",
    "llmperf_gpu_layers": "layers offloaded to the GPU (default 0)",
    "llmperf_endpoint": "OpenAI-compatible API base URL to measure instead of llama.cpp in process",
    "llmperf_api": "API of the endpoint: completions (default) or chat",
    "llmperf_api_model": "model name sent to the endpoint (default: the server's default)",
    "llmperf_api_key_env": "environment variable holding the endpoint's API key (default LLMPERF_API_KEY)",
    "llmperf_request_timeout": "seconds one request may take in all (default 300)",
    "llmperf_token_timeout": "seconds without data before a stream counts as stalled (default 30)",
}


@dataclass(frozen=True)
class EngineSettings:
    model: str
    threads: int | None
    n_ctx: int
    n_batch: int
    gpu_layers: int
    endpoint: str | None = None
    api: str = "completions"
    api_model: str | None = None
    api_key_env: str = "LLMPERF_API_KEY"
    request_timeout: float = 300.0
    token_timeout: float = 30.0

    @property
    def preset(self) -> str | None:
        """The synthetic preset this names, unless a file of that name exists."""
        if self.model in PRESETS and not Path(self.model).exists():
            return self.model
        return None

    @property
    def model_label(self) -> str:
        return f"synthetic-{self.preset}" if self.preset else Path(self.model).stem


def resolve(getoption: Callable[[str], Any], getini: Callable[[str], Any]) -> EngineSettings:
    values: dict[str, Any] = {}
    for name, (env, ini, parse, default) in _SOURCES.items():
        cli = getoption(f"llmperf_{name}")
        if cli is not None:
            raw, source = cli, f"--llmperf-{name.replace('_', '-')}"
        elif os.environ.get(env):
            raw, source = os.environ[env], f"${env}"
        elif getini(ini):
            raw, source = getini(ini), f"ini {ini}"
        else:
            values[name] = default
            continue
        try:
            values[name] = parse(raw)
        except ValueError:
            raise ConfigError(f"{source}: expected {parse.__name__}, got {raw!r}") from None
    for name in ("threads", "n_ctx", "n_batch"):
        if values[name] is not None and values[name] < 1:
            raise ConfigError(f"llmperf setting {name} must be >= 1, got {values[name]}")
    for name in ("request_timeout", "token_timeout"):
        if not values[name] > 0:
            raise ConfigError(f"llmperf setting {name} must be > 0 seconds, got {values[name]}")
    if values["api"] not in ("completions", "chat"):
        raise ConfigError(f"llmperf setting api must be completions or chat, got {values['api']!r}")
    return EngineSettings(**values)
