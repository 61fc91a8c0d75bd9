"""The commands on models, engines and servers: write a synthetic model, build llama.cpp's tools, a
served load curve, a model's profile.

``llmperf model [PRESET]``: write (once) a synthetic model and print its path.

``llmperf server build``: llama.cpp's llama-server (and llama-bench) of the installed
llama-cpp-python's version, built once per version into the user cache.

``llmperf load``: the latency-throughput curve of a served model (``--endpoint``, or a server
on loopback started with ``--serve MODEL``), one row per concurrency; exit 1 when
``--min-goodput`` is given and a level misses it.

``llmperf profile [MODEL]``: where one model's inference time goes, in one report."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from ..core.settings import LLAMA_OPTIONS, threads_warning
from ..core.values import COUNT, POSITIVE, TOKENS, Integer, arg_type
from ..core.workload import Workload
from ..engines import servers  # servers.build_tools read on each call (tests/test_native_tools.py replaces it)
from ..engines.http import HttpEngine
from ..engines.servers import LLAMA_SERVER_PARALLEL, BuildRoute, serve, serve_llama_server
from ..models.gguf import PRESETS, ensure_model, model_path
from .common import add_setting, check_writable, output_file, positive_int, share_of_one, write_output
from .common import model as model_arg

if TYPE_CHECKING:
    from ..core.measurement import Measurement

MODEL_HELP = "write (once) and print the path of a synthetic model"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", nargs="?", default="tiny", choices=sorted(PRESETS))


def run_model(args: argparse.Namespace) -> int:
    print(ensure_model(args.preset))
    return 0


SERVER_HELP = "build llama.cpp's llama-server and llama-bench for the installed llama-cpp-python"


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser(
        "build",
        help="build (or find cached) llama-server and llama-bench; prints their paths",
        description="Builds llama-server and llama-bench from the llama.cpp sources in the installed "
        "llama-cpp-python's sdist, linked to the libraries that llama-cpp-python ships (cmake and a C++ "
        "compiler needed; a few minutes, once per version; its steps and percentage on stderr).",
    )


def run_server(args: argparse.Namespace) -> int:
    tty = sys.stderr.isatty()

    def line(text: str) -> None:  # the build's steps, to stderr (a status line first cleared)
        sys.stderr.write(("\r\x1b[K" if tty else "") + text + "\n")
        sys.stderr.flush()

    def status(text: str) -> None:  # the running step's percentage, rewritten in place
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()

    try:
        tools = servers.build_tools(progress=line, status=status if tty else None)
    finally:
        if tty:
            sys.stderr.write("\r\x1b[K")
    for name, path in tools.paths.items():
        print(f"{name}: {path}")
    if tools.build_s is None:
        print(f"llmperf: llama.cpp tools of llama-cpp-python {tools.version} were cached (log: {tools.log})")
    else:
        how = (
            f"linked to its libraries in {tools.linked_to}"
            if tools.route is BuildRoute.LINKED
            else "all of llama.cpp compiled"
        )
        print(f"llmperf: built for llama-cpp-python {tools.version} in {tools.build_s:.0f} s, {how} (log: {tools.log})")
    return 0


LOAD_HELP = "latency-throughput curve of an OpenAI-compatible server at rising concurrency"


#: The value kinds of the commands' own numbers (``core.values``: the marker keys' rules).
_count, _tokens, _positive = arg_type(COUNT.parse), arg_type(TOKENS.parse), arg_type(POSITIVE.parse)
_at_least_0 = arg_type(Integer(0).parse)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4,8, got {text!r}") from None
    if not levels:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    for level in levels:
        try:
            COUNT.check(level)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"concurrency levels {exc}") from None
    return levels


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    add_setting(where, "endpoint")
    where.add_argument(
        "--serve", type=model_arg, metavar="MODEL", help="start a server with this preset or GGUF for the run"
    )
    parser.add_argument(
        "--server",
        choices=("llama-server", "llama-cpp-python"),
        default="llama-server",
        help="which server --serve starts (llama-server: continuous batching, built on first use)",
    )
    parser.add_argument(
        "--parallel",
        type=positive_int,
        default=None,
        help="llama-server slots with --serve (default: the highest concurrency level, at least 4)",
    )
    add_setting(parser, "threads")  # of the server --serve starts
    parser.add_argument(
        "--shared-prefix-tokens",
        type=positive_int,
        default=None,
        help="the first N prompt words the same in every request (measures prefix caching)",
    )
    for name in ("api", "api_model", "api_key_env"):
        add_setting(parser, name)
    parser.add_argument("--concurrency", type=_levels, default=[1, 2, 4, 8], help="levels, e.g. 1,2,4,8")
    parser.add_argument("--requests", type=_count, default=16, help="requests per level")
    parser.add_argument("--rate", type=_positive, default=None, help="Poisson arrivals, requests/s (seeded)")
    parser.add_argument("--prompt-tokens", type=_tokens, default=64, help="synthetic prompt length (words)")
    parser.add_argument("--max-tokens", type=_tokens, default=64, help="tokens generated per request")
    parser.add_argument("--warmup", type=_at_least_0, default=1, help="discarded requests before each level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ttft-ms", type=_positive, default=None, help="TTFT SLO per request (for goodput)")
    parser.add_argument("--tpot-ms", type=_positive, default=None, help="TPOT SLO per request (for goodput)")
    parser.add_argument(
        "--min-goodput",
        type=share_of_one,
        default=None,
        metavar="SHARE",
        help="exit 1 if a level's goodput is below this share in (0, 1], e.g. 0.95 or 95%%",
    )
    for name in ("request_timeout", "token_timeout"):
        add_setting(parser, name)


def run_load(args: argparse.Namespace) -> int:
    from ..measuring.served import SLO_KEYS, sweep

    if not args.endpoint and not args.serve:
        raise ConfigError("give --endpoint URL (or set LLMPERF_ENDPOINT), or --serve MODEL to start a local server")
    workload = Workload(
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        requests=args.requests,
        rate=args.rate,
        warmup=args.warmup,
        seed=args.seed,
        shared_prefix_tokens=args.shared_prefix_tokens,
    )
    slo = {k: getattr(args, k) for k in SLO_KEYS if getattr(args, k) is not None}
    with contextlib.ExitStack() as stack:
        endpoint, model = _local_server(args, stack) if args.serve else (args.endpoint, args.model)
        engine = HttpEngine.from_settings(endpoint, args, model)
        stack.callback(engine.close)
        pace = f"Poisson arrivals at {args.rate:g}/s" if args.rate else "closed loop"
        _say(
            f"llmperf load: {args.requests} requests per level ({pace}, +{args.warmup} warm-up), "
            f"{args.prompt_tokens}-word prompts, {args.max_tokens} tokens each; {args.api} at {engine.endpoint}"
        )
        _say(f"llmperf load: {workload.served_cache_note}")
        results = sweep(engine, workload, args.concurrency, slo=slo)
    return _sweep_report(args, results)


def _local_server(args: argparse.Namespace, stack: contextlib.ExitStack) -> tuple[str, str | None]:
    """``--serve MODEL``: a llama-server (or llama-cpp-python's server) on loopback until
    ``stack`` closes; its (endpoint, model name)."""
    path, alias = model_path(args.serve)
    if args.server == "llama-server":
        parallel = args.parallel or max(LLAMA_SERVER_PARALLEL, *args.concurrency)
        server = stack.enter_context(serve_llama_server(path, parallel=parallel, threads=args.threads, alias=alias))
    else:
        server = stack.enter_context(serve(path, threads=args.threads, alias=alias))
    _say(
        f"llmperf: serving {path} with {server.kind} at {server.url}, threads {server.threads}, "
        f"{server.parallel} slot(s)"
    )
    return server.url, args.model or server.model


def _say(line: str) -> None:
    """A line on standard output, wrapped to the terminal's width (a hanging indent)."""
    from ..reports.text import wrap_text

    print(wrap_text(line, shutil.get_terminal_size().columns))


def _sweep_report(args: argparse.Namespace, results: Sequence[Measurement]) -> int:
    """The load curve, the server's own figures and the first errors; 1 when a level's goodput
    is under ``--min-goodput``."""
    from ..reports.text import curve_lines, curve_table, wrap_text

    width = shutil.get_terminal_size().columns
    print(curve_table(results, width))
    for line in curve_lines(results):
        print(wrap_text(line, width))
    levels = [m.load for m in results if m.load is not None]  # every level of a sweep
    failed = [e for s in levels for e in s.errors]
    for line in failed[:5]:
        print(line)
    floor = args.min_goodput
    low = [] if floor is None else [s for s in levels if s.goodput < floor]
    for s in low:  # each level named
        print(f"goodput {s.goodput:.1%} < {floor:.1%} at concurrency {s.concurrency}")
    return 1 if low else 0


PROFILE_HELP = "profile a model: prefill/decode speed, per-layer time, roofline, stability, memory"


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default=None, type=model_arg, help="GGUF path or preset (tiny, small); default: tiny"
    )
    parser.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    parser.add_argument("--prompt-tokens", type=_tokens, default=128, help="synthetic prompt length (default 128)")
    parser.add_argument("--max-tokens", type=_tokens, default=64, help="tokens generated per run (default 64)")
    parser.add_argument("--runs", type=_count, default=10, help="measured runs (default 10)")
    parser.add_argument("--warmup", type=_at_least_0, default=1, help="discarded warm-up runs (default 1)")
    for name in (*LLAMA_OPTIONS, "peak_bw", "peak_tflops", "engine_timeout"):  # as the pytest options
        add_setting(parser, name)
    parser.add_argument("--reprobe-peaks", action="store_true", help="measure the machine's peaks again (else cached)")
    parser.add_argument(
        "-o", "--output", default=None, type=output_file, help="write the report here instead of stdout"
    )


def run_profile(args: argparse.Namespace) -> int:
    from ..reports.profile import profile, render

    sizes = {name: getattr(args, name) for name in ("prompt_tokens", "max_tokens", "runs", "warmup")}
    Workload(**sizes)  # checked before the model loads
    if args.output:
        check_writable(args.output, "-o")  # before minutes of profiling, not after
    warning = threads_warning(args.threads, "--threads")
    if warning:
        print(warning, file=sys.stderr)
    report = profile(
        args.model,
        **sizes,
        **{name: getattr(args, name) for name in LLAMA_OPTIONS},
        peak_bw_gbs=args.peak_bw,
        peak_tflops=args.peak_tflops,
        reprobe_peaks=args.reprobe_peaks,
        engine_timeout_s=args.engine_timeout,
    )
    # On standard output (a terminal, or piped: 80 unless $COLUMNS says) the tables fit its width.
    width = None if args.output else shutil.get_terminal_size().columns
    text = render(report, args.format, width)
    if args.output:
        write_output(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


#: name -> (help line, add its arguments, run it -> exit status): read by ``cli.main``.
COMMANDS = {
    "model": (MODEL_HELP, add_model_arguments, run_model),
    "server": (SERVER_HELP, add_server_arguments, run_server),
    "load": (LOAD_HELP, add_load_arguments, run_load),
    "profile": (PROFILE_HELP, add_profile_arguments, run_profile),
}
