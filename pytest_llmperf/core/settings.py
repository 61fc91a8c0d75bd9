"""Settings facts light enough for every pytest start: defaults, names, the engine settings and
the model they name (each setting's declaration: ``settings_table.SETTINGS``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .catalog import HEADLINE, SUMMARY_COLUMNS

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
    # llama.cpp's use_extra_bufts (llama-bench --repack): None (auto) is on, except for quantized
    # weights on a CPU with AMX, whose kernel dies with SIGILL (engines/llama_cpp_native.py).
    "repack": None,
}


#: Comparison defaults (``judge.regression.CompareSettings``, ``llmperf compare``), here so the
#: options' help text has them without importing scipy.
DEFAULT_ALPHA = 0.01
DEFAULT_THRESHOLD = 0.05
DEFAULT_TAIL_THRESHOLD = 0.10

#: ``--llmperf-columns`` names: summary table (the catalog's), then comparison table (``test``
#: and ``metric`` always shown). The defaults fit 80 columns; JSON, HTML and Markdown keep every column.
SUMMARY_COLUMN_NAMES = tuple(name for name, _, _ in SUMMARY_COLUMNS[1:])
COMPARISON_COLUMN_NAMES = ("baseline", "now", "change", "ci", "p", "verdict", "detects")
DEFAULT_SUMMARY_COLUMNS = (*(f.column for f in HEADLINE), "budget")
DEFAULT_COMPARISON_COLUMNS = ("change", "ci", "verdict")


@dataclass(frozen=True)
class EngineSettings:
    """What the session measures (the engine half of the settings; defaults, sources and
    parsing in ``settings_table.SETTINGS``, whose names these fields carry)."""

    model: str
    threads: int | None
    n_ctx: int | None
    n_batch: int
    gpu_layers: int
    in_process: bool
    engine_timeout: float
    max_engines: int
    endpoint: str | None
    api: str
    api_model: str | None
    api_key_env: str
    request_timeout: float
    token_timeout: float

    @property
    def preset(self) -> str | None:
        """The synthetic preset this names, unless a file of that name exists."""
        if self.model in PRESET_NAMES and not Path(self.model).exists():
            return self.model
        return None

    @property
    def model_label(self) -> str:
        return f"synthetic-{self.preset}" if self.preset else Path(self.model).stem


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


def parse_share(value: str | float) -> float:
    """A share of a whole in (0, 1] (``min_goodput``, ``min_mbu``): ``0.95`` or ``95%``, the
    marker's and ``llmperf load --min-goodput``'s alike. Raises ValueError (one line)."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        raw = value.strip()
        try:
            number = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            number = None
    if number is None or not 0 < number <= 1:  # also rejects nan
        raise ValueError(f"must be a share in (0, 1], e.g. 0.95, got {value!r}")
    return number


def share_arg(text: str) -> float:
    """An argparse type (pytest options, the CLI) for thresholds: ``5%`` or ``0.05``."""
    import argparse

    try:
        return parse_fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def share_of_one_arg(text: str) -> float:
    """An argparse type for a share of a whole in (0, 1] (``parse_share``)."""
    import argparse

    try:
        return parse_share(text)
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
