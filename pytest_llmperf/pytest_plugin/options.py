"""The plugin's command-line options and ini keys, declared in one place."""

from __future__ import annotations

import argparse

import pytest

from ..core.settings import COMPARISON_COLUMN_NAMES, DEFAULT_ALPHA, DEFAULT_COMPARISON_COLUMNS, DEFAULT_SUMMARY_COLUMNS, DEFAULT_TAIL_THRESHOLD, DEFAULT_THRESHOLD, INI_HELP, SUMMARY_COLUMN_NAMES, alpha_arg, share_arg

DEFAULT_COLUMNS = DEFAULT_SUMMARY_COLUMNS + DEFAULT_COMPARISON_COLUMNS


def add_options(parser: pytest.Parser) -> None:
    """Every --llmperf-* option and llmperf_* ini key (precedence: see settings.py)."""
    group = parser.getgroup("llmperf", "LLM inference performance (pytest-llmperf)")
    group.addoption(
        "--llmperf-model",
        dest="llmperf_model",
        default=None,
        help="GGUF model path, or a synthetic preset: tiny (default), small. Env: LLMPERF_MODEL",
    )
    group.addoption("--llmperf-threads", dest="llmperf_threads", default=None, help="llama.cpp threads")
    group.addoption("--llmperf-n-ctx", dest="llmperf_n_ctx", default=None, help="llama.cpp context size")
    group.addoption("--llmperf-n-batch", dest="llmperf_n_batch", default=None, help="prompt batch size")
    group.addoption(
        "--llmperf-gpu-layers", dest="llmperf_gpu_layers", default=None, help="layers offloaded to a GPU"
    )
    group.addoption(
        "--llmperf-max-engines", dest="llmperf_max_engines", default=None,
        help="llama.cpp engines (per-test settings) alive at once (default 2)",
    )
    group.addoption(
        "--llmperf-baseline-dir",
        dest="llmperf_baseline_dir",
        default=None,
        help="folder of baseline JSON files (default: baselines/ under the rootdir; ini llmperf_baseline_dir)",
    )
    group.addoption(
        "--llmperf-update-baselines",
        action="store_true",
        help="write or refresh the baselines of the tests that ran (others stay as they are)",
    )
    group.addoption(
        "--llmperf-require-baseline", action="store_true", help="fail a measured test that has no baseline"
    )
    group.addoption(
        "--llmperf-strict-env",
        action="store_true",
        help="fail a test whose baselines were all recorded on other hardware",
    )
    group.addoption(
        "--llmperf-budgets-only", dest="llmperf_budgets_only", action="store_true",
        help="only budgets gate: do not compare with baselines",
    )
    group.addoption(
        "--llmperf-baselines-only", dest="llmperf_baselines_only", action="store_true",
        help="only baseline comparisons gate: budgets are measured and shown, never fail a test",
    )
    group.addoption(
        "--llmperf-skip", dest="llmperf_skip", action="store_true",
        help="skip the tests that measure with llmperf (marker or llmperf* fixtures)",
    )
    group.addoption(
        "--llmperf-only", dest="llmperf_only", action="store_true",
        help="run only the tests that measure with llmperf; skip the others",
    )
    group.addoption(
        "--llmperf-disable", dest="llmperf_disable", action="store_true",
        help="smoke mode: run each measurement once, no warm-up, budgets, statistics or baselines",
    )
    group.addoption(
        "--llmperf-columns", dest="llmperf_columns", type=_columns, default=None, metavar="COLS",
        help="columns of the terminal tables, comma-separated, from: "
        + ", ".join(SUMMARY_COLUMN_NAMES + COMPARISON_COLUMN_NAMES)
        + " (default " + ",".join(DEFAULT_COLUMNS) + "; JSON/HTML/Markdown keep all)",
    )
    group.addoption(
        "--llmperf-alpha", dest="llmperf_alpha", type=alpha_arg, default=None,
        help=_escape(f"family-wise significance level over the session's comparisons (default {DEFAULT_ALPHA})"),
    )
    group.addoption(
        "--llmperf-threshold", dest="llmperf_threshold", type=share_arg, default=None,
        help=_escape(f"smallest change of a median that counts, e.g. 5% or 0.05 (default {DEFAULT_THRESHOLD:.0%})"),
    )
    group.addoption(
        "--llmperf-tail-threshold", dest="llmperf_tail_threshold", type=share_arg, default=None,
        help=_escape(f"smallest change of the ITL p95 that counts (default {DEFAULT_TAIL_THRESHOLD:.0%})"),
    )
    group.addoption(
        "--llmperf-endpoint", dest="llmperf_endpoint", default=None,
        help="measure this OpenAI-compatible server (API base URL, e.g. http://host:8000/v1) instead of "
        "llama.cpp in process. Env: LLMPERF_ENDPOINT",
    )
    group.addoption("--llmperf-api", dest="llmperf_api", default=None, help="endpoint API: completions (default) or chat")
    group.addoption("--llmperf-api-model", dest="llmperf_api_model", default=None, help="model name sent to the endpoint")
    group.addoption(
        "--llmperf-api-key-env", dest="llmperf_api_key_env", default=None,
        help="environment variable holding the endpoint's API key (default LLMPERF_API_KEY; never written anywhere)",
    )
    group.addoption(
        "--llmperf-request-timeout", dest="llmperf_request_timeout", default=None,
        help="seconds one request to the endpoint may take in all (default 300)",
    )
    group.addoption(
        "--llmperf-token-timeout", dest="llmperf_token_timeout", default=None,
        help="seconds without data from the endpoint before the stream counts as stalled (default 30)",
    )
    group.addoption(
        "--llmperf-layers", dest="llmperf_layers", action="store_true",
        help="also time each layer of the in-process model (llama.cpp eval callback, after the plain runs)",
    )
    group.addoption(
        "--llmperf-roofline", dest="llmperf_roofline", action="store_true",
        help="attach the roofline (MBU, MFU, bound) to every in-process measurement (probes the machine once)",
    )
    group.addoption(
        "--llmperf-peak-bw", dest="llmperf_peak_bw", type=float, default=None, metavar="GB/s",
        help="the machine's peak memory bandwidth for the roofline (default: measured by a probe, cached)",
    )
    group.addoption(
        "--llmperf-peak-tflops", dest="llmperf_peak_tflops", type=float, default=None, metavar="TFLOP/s",
        help="the machine's peak dense FLOP rate for the roofline (default: CPU spec or measured GEMM)",
    )
    group.addoption("--llmperf-json", dest="llmperf_json", default=None, help="write the session's results as JSON")
    group.addoption(
        "--llmperf-markdown", dest="llmperf_markdown", default=None,
        help="write a Markdown summary (also appended to $GITHUB_STEP_SUMMARY when set)",
    )
    group.addoption(
        "--llmperf-html", dest="llmperf_html", default=None,
        help='write a self-contained HTML report with plots (needs pip install "pytest-llmperf[report]")',
    )
    group.addoption(
        "--llmperf-history", dest="llmperf_history", default=None, metavar="PATH|URL|off",
        help="where every session's results are appended: a SQLite file, a postgresql:// URL or off "
        "(default .llmperf/history.sqlite under the rootdir; env LLMPERF_HISTORY; ini llmperf_history)",
    )
    for name, text in INI_HELP.items():
        parser.addini(name, text)
    parser.addini("llmperf_history", "session history: SQLite file, postgresql:// URL or off (default .llmperf/history.sqlite)")
    parser.addini("llmperf_baseline_dir", "folder of baseline JSON files (default: baselines)")


def _escape(text: str) -> str:
    """argparse %-formats help strings: a literal ``%`` must be written ``%%``."""
    return text.replace("%", "%%")


def _columns(text: str) -> tuple[str, ...]:
    names = tuple(c.strip().lower() for c in text.split(",") if c.strip())
    allowed = SUMMARY_COLUMN_NAMES + COMPARISON_COLUMN_NAMES
    unknown = [c for c in names if c not in allowed]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown column(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(allowed)}"
        )
    return names
