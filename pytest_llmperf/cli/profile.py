"""``llmperf profile [MODEL]``: where one model's inference time goes, in one report."""

from __future__ import annotations

import argparse
import sys
import time

from .common import add_setting, check_writable, write_output

HELP = "profile a model: prefill/decode speed, per-layer time, roofline, stability, memory"

STEPS = {
    "model": "preparing the model",
    "load": "loading it into llama.cpp",
    "peaks": "finding the machine's peak bandwidth and FLOP rate (probed once, then cached)",
    "runs": "measuring: plain runs, then per-layer runs",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None, help="GGUF path or preset (tiny, small); default: tiny")
    parser.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="synthetic prompt length (default 128)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per run (default 64)")
    parser.add_argument("--runs", type=int, default=10, help="measured runs (default 10)")
    parser.add_argument("--warmup", type=int, default=1, help="discarded warm-up runs (default 1)")
    for name in ("threads", "gpu_layers", "n_ctx", "n_batch", "peak_bw", "peak_tflops"):  # as the pytest options
        add_setting(parser, name)
    parser.add_argument("--reprobe-peaks", action="store_true", help="measure the machine's peaks again (else cached)")
    parser.add_argument("-o", "--output", default=None, help="write the report here instead of stdout")


def _progress() -> "callable":
    """One updating line on a terminal's stderr; silent when stderr is not a TTY."""
    if not sys.stderr.isatty():
        return lambda step: None
    started = time.monotonic()

    def show(step: str) -> None:
        sys.stderr.write(f"\r\x1b[Kllmperf profile [{time.monotonic() - started:5.1f}s] {STEPS.get(step, step)}...")
        sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    from ..reports.profile import profile, render
    from ..core.workload import Workload

    from ..core.settings import threads_warning

    Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.runs, warmup=args.warmup)
    if args.output:
        check_writable(args.output, "-o")  # before minutes of profiling, not after
    warning = threads_warning(args.threads, "--threads")
    if warning:
        print(warning, file=sys.stderr)
    progress = _progress()
    try:
        report = profile(
            args.model,
            prompt_tokens=args.prompt_tokens,
            max_tokens=args.max_tokens,
            runs=args.runs,
            warmup=args.warmup,
            threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
            n_ctx=args.n_ctx,
            n_batch=args.n_batch,
            peak_bw_gbs=args.peak_bw,
            peak_tflops=args.peak_tflops,
            reprobe_peaks=args.reprobe_peaks,
            progress=progress,
        )
    finally:
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K")
    text = render(report, args.format)
    if args.output:
        write_output(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
