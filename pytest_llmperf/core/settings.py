"""Session settings: command line > environment > ini > default, and the model they name."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError

DEFAULT_MODEL = "tiny"
#: Names of the synthetic presets (``synthetic.PRESETS``), here so that reading the settings
#: does not import numpy (tests/test_plugin_cli.py checks the two agree).
PRESET_NAMES = ("tiny", "small")

#: K/V cache element types as llama.cpp's ``-ctk``/``-ctv`` name them.
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: Types that V may take without flash attention (llama.cpp refuses a quantized V otherwise).
UNQUANTIZED = ("f32", "f16", "bf16")

#: Context of a served model's slot when the session leaves n_ctx to the workload (a server
#: is started before any workload is known).
SERVER_N_CTX = 2048

#: llama.cpp engine defaults (``engines/config.EngineConfig``), one definition each (here, so
#: reading the settings imports nothing heavy). ``n_ubatch`` None: ``n_batch``.
ENGINE_DEFAULTS: dict[str, Any] = {
    "threads": None,
    # None: sized to each workload (prompt + generated, rounded up to 256), as llama-bench does.
    "n_ctx": None,
    "n_batch": 512,
    "n_ubatch": None,
    # What llama-bench's default (auto) resolves to on the CPU backend.
    "flash_attn": True,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": 0,
    "mmap": True,
    "mlock": False,
    # Greedy sampling inside the timed decode loop (False: llama-bench's tg, which feeds seeded
    # tokens; sampling is then timed apart and reported as its own figure).
    "sample": False,
}


# Comparison defaults, as in ``regression`` (which imports scipy): the options' help text
# needs them at plugin load (tests/test_plugin_cli.py checks the two agree).
DEFAULT_ALPHA = 0.01
DEFAULT_THRESHOLD = 0.05
DEFAULT_TAIL_THRESHOLD = 0.10

#: ``--llmperf-columns`` names: summary table, then comparison table (``test`` and ``metric``
#: always shown). The defaults fit 80 columns; JSON, HTML and Markdown keep every column.
SUMMARY_COLUMN_NAMES = ("model", "prompt", "gen", "runs", "ttft", "prefill", "decode", "p50", "p95", "p99", "budget")
COMPARISON_COLUMN_NAMES = ("baseline", "now", "change", "ci", "p", "verdict")
DEFAULT_SUMMARY_COLUMNS = ("ttft", "decode", "p95", "budget")
DEFAULT_COMPARISON_COLUMNS = ("change", "ci", "verdict")

# (option dest, environment variable, ini name, parser, default)
_SOURCES: dict[str, tuple[str, str, Callable[[str], Any], Any]] = {
    "model": ("LLMPERF_MODEL", "llmperf_model", str, DEFAULT_MODEL),
    "threads": ("LLMPERF_THREADS", "llmperf_threads", int, None),
    "n_ctx": ("LLMPERF_N_CTX", "llmperf_n_ctx", int, ENGINE_DEFAULTS["n_ctx"]),
    "n_batch": ("LLMPERF_N_BATCH", "llmperf_n_batch", int, ENGINE_DEFAULTS["n_batch"]),
    "gpu_layers": ("LLMPERF_GPU_LAYERS", "llmperf_gpu_layers", int, ENGINE_DEFAULTS["n_gpu_layers"]),
    "max_engines": ("LLMPERF_MAX_ENGINES", "llmperf_max_engines", int, 2),
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
    "llmperf_n_ctx": "llama.cpp context size (default: each workload's prompt + generated tokens)",
    "llmperf_n_batch": "llama.cpp batch size for prompt evaluation (default 512)",
    "llmperf_gpu_layers": "layers offloaded to the GPU (default 0)",
    "llmperf_max_engines": "llama.cpp engines (per-test settings) alive at once (default 2)",
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
    n_ctx: int | None
    n_batch: int
    gpu_layers: int
    max_engines: int = 2
    endpoint: str | None = None
    api: str = "completions"
    api_model: str | None = None
    api_key_env: str = "LLMPERF_API_KEY"
    request_timeout: float = 300.0
    token_timeout: float = 30.0

    @property
    def preset(self) -> str | None:
        """The synthetic preset this names, unless a file of that name exists."""
        if self.model in PRESET_NAMES and not Path(self.model).exists():
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
    for name in ("threads", "n_ctx", "n_batch", "max_engines"):
        if values[name] is not None and values[name] < 1:
            raise ConfigError(f"llmperf setting {name} must be >= 1, got {values[name]}")
    for name in ("request_timeout", "token_timeout"):
        if not values[name] > 0:
            raise ConfigError(f"llmperf setting {name} must be > 0 seconds, got {values[name]}")
    if values["api"] not in ("completions", "chat"):
        raise ConfigError(f"llmperf setting api must be completions or chat, got {values['api']!r}")
    return EngineSettings(**values)


def parse_fraction(text: str | float, *, high: float = 10.0) -> float:
    """A share written ``5%`` or ``0.05`` (the same everywhere a threshold is given).

    Raises ValueError with a one-line message for anything else, or a value outside
    ``(0, high)``."""
    if isinstance(text, bool):
        raise ValueError(f"expected a share like 5% or 0.05, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = str(text).strip()
        try:
            value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            raise ValueError(f"expected a share like 5% or 0.05, got {text!r}") from None
    if not 0 < value < high:  # also rejects nan
        raise ValueError(f"expected a share between 0 and {high:g} (e.g. 5% or 0.05), got {text!r}")
    return value


def share_arg(text: str) -> float:
    """An argparse type (pytest options, the CLI) for thresholds: ``5%`` or ``0.05``."""
    import argparse

    try:
        return parse_fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def alpha_arg(text: str) -> float:
    """An argparse type for a significance level in (0, 1): ``1%`` or ``0.01``."""
    import argparse

    try:
        return parse_fraction(text, high=1.0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def usable_cpus() -> int:
    """CPUs this process may run on (affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_warning(threads: int | None, source: str = "--llmperf-threads") -> str | None:
    """One line when more threads are asked for than CPUs usable: they would time-slice and
    measure the scheduler, not the model."""
    cpus = usable_cpus()
    if threads is not None and threads > cpus:
        return (
            f"llmperf: warning: {source} {threads} exceeds the {cpus} usable CPU(s); threads will "
            f"time-slice and the timings measure the scheduler; use at most {cpus}"
        )
    return None
