"""Settings facts light enough for every pytest start: defaults, names, the engine settings and
the model they name (each setting's declaration: ``SETTINGS`` below).

Every session setting, declared once: its parser, default, help, pytest option, ini key,
environment variable and ``llmperf`` command-line flag. A parser of a kind of value (a count,
seconds, a share, a llama.cpp setting's kind: ``VALUE_KINDS``) is that kind's ``parse``
(``core.values``), whose ``check`` the marker's keys of the kind use.

The pytest options and ini keys (``pytest_plugin/plugin.py``), the environment lookup, the
CLI arguments the commands share (``cli/common.add_setting``) and docs/settings.md's table all
come from ``SETTINGS``. Precedence: command line > environment > ini > default. Light: read
at every pytest start (no heavy import)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from .catalog import HEADLINE, SUMMARY_COLUMNS
from .errors import ConfigError, did_you_mean
from .redact import Url, display
from .values import COUNT, FLAG, GPU_LAYERS, LEVEL, POSITIVE, SECONDS, SHARE, THRESHOLD, TOKENS, Choice, Kind, arg_type
from .workload import LLAMA_SETTINGS, PROMPT_CACHE_MODES, LlamaSetting, ValueKind

DEFAULT_MODEL = "tiny"
#: Names of the synthetic presets (``gguf.PRESETS``), here so that reading the settings
#: does not import numpy (tests/test_plugin_cli.py checks the two agree).
PRESET_NAMES = ("tiny", "small")

#: K/V cache element types as llama.cpp's ``-ctk``/``-ctv`` name them.
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: Types that V may take without flash attention (llama.cpp refuses a quantized V otherwise).
UNQUANTIZED = ("f32", "f16", "bf16")

#: Context of a served model's slot when the session leaves n_ctx to the workload (a server
#: is started before any workload is known).
SERVER_N_CTX = 2048

#: llama.cpp engine defaults (``engines/llama_cpp_native.EngineConfig``), one definition each: the
#: table's (``workload.LLAMA_SETTINGS``, where each default's meaning is said).
ENGINE_DEFAULTS: dict[str, Any] = {s.name: s.default for s in LLAMA_SETTINGS.values()}
#: The llama.cpp settings the session sets too (pytest options, ini keys, environment, ``llmperf`` flags).
LLAMA_OPTIONS = tuple(s.name for s in LLAMA_SETTINGS.values() if s.option is not None)


#: Comparison defaults (``judge.regression.CompareSettings``, ``llmperf compare``), here so the
#: options' help text has them without importing scipy.
DEFAULT_ALPHA = 0.01
DEFAULT_THRESHOLD = 0.05
DEFAULT_TAIL_THRESHOLD = 0.10
#: ``--llmperf-against``'s budget of processes per side (``max_processes``): a measurement's pairs
#: run in blocks, each on a fresh process pair, the blocks' size chosen from the measured levels
#: (docs/against.md, "Processes"); 60 pairs of at least 3 per block fit in 20. 1: one process per
#: side, every pair on the test's own sides.
DEFAULT_MAX_PROCESSES = 20

#: ``--llmperf-columns`` names: summary table (the catalog's), then comparison table (``test``
#: and ``metric`` always shown). The defaults fit 80 columns; JSON, HTML and Markdown keep every column.
SUMMARY_COLUMN_NAMES = tuple(name for name, _, _ in SUMMARY_COLUMNS[1:])
COMPARISON_COLUMN_NAMES = ("baseline", "now", "change", "ci", "p", "verdict", "detects")
DEFAULT_SUMMARY_COLUMNS: tuple[str, ...] = (*(f.column for f in HEADLINE if f.column is not None), "budget")
DEFAULT_COMPARISON_COLUMNS = ("change", "ci", "verdict")
#: Names of several columns at once: ``--llmperf-columns ttft,memory,budget``.
COLUMN_SETS = {"memory": ("rss", "kv", "compute", "load"), "agreement": ("top1", "kl")}


@dataclass(frozen=True)
class EngineSettings:
    """What the session measures (the engine half of the settings; defaults, sources and
    parsing in ``settings.SETTINGS``, whose names these fields carry)."""

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


#: The argparse types of the ``llmperf`` commands (``cli/common``), from the value kinds.
share_arg = arg_type(THRESHOLD.parse)
alpha_arg = arg_type(LEVEL.parse)
share_of_one_arg = arg_type(SHARE.parse)


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


APIS = ("completions", "chat")
#: ``--llmperf-lost-baseline``: what a test that lost its committed baseline does.
LOST_BASELINE_MODES = ("fail", "warn")


#: The parsers of the settings below that are value kinds (``core.values``): one rule each,
#: the marker's keys of the same kind check by it too.
positive_int, seconds, positive_float = COUNT.parse, SECONDS.parse, POSITIVE.parse
share, alpha = THRESHOLD.parse, LEVEL.parse


def api(text: object) -> str:
    if text not in APIS:
        raise ValueError(f"must be {' or '.join(APIS)}, got {text!r}")
    return str(text)


def columns(text: object) -> tuple[str, ...]:
    given = [c.strip().lower() for c in str(text).split(",") if c.strip()]
    names = tuple(n for c in given for n in COLUMN_SETS.get(c, (c,)))
    allowed = SUMMARY_COLUMN_NAMES + COMPARISON_COLUMN_NAMES
    unknown = [c for c in names if c not in allowed]
    if unknown or not names:
        choices = ", ".join((*allowed, *COLUMN_SETS))
        hint = did_you_mean(unknown[0], (*allowed, *COLUMN_SETS)) if unknown else ""
        raise ValueError(f"unknown column(s) {', '.join(unknown) or '(none given)'}{hint}; choose from {choices}")
    return names


def text(value: object) -> str:
    return str(value)


def not_empty(problem: str) -> Callable[[object], str]:
    """A path's or a URL's parser: the value as text; an empty one is a ValueError, ``problem``."""

    def parse(value: object) -> str:
        if not str(value).strip():
            raise ValueError(problem)
        return str(value)

    return parse


#: A file an output is written to (``core.documents.write_output``): a path, a device or FIFO, or
#: ``-`` (standard output); never empty (before, an empty value wrote nothing, silently).
output_file = not_empty("is empty; give a file path, or - for standard output")
#: A file the session creates (``--llmperf-write-trace``): a path, never empty; one that exists
#: is refused before anything runs (``session.options``), never overwritten.
new_file = not_empty("is empty; give the path of a new file")


def endpoint_url(value: object) -> str:
    """An OpenAI-compatible server's API base URL: ``http(s)://HOST[:PORT][/PATH]``, the one
    check of the endpoint option and of an A/B side's URL (``engines.http``)."""
    text = str(value).strip()
    if not text:
        raise ValueError("is empty; give the server's API base URL, e.g. http://127.0.0.1:8000/v1")
    url = Url.split(text)
    example = "give the server's API base URL, e.g. http://127.0.0.1:8000/v1"
    if url is None or not text.startswith(("http://", "https://")):
        raise ValueError(f"{display(text)!r} is not an http(s) URL; {example}")
    try:
        host = urlsplit("http://" + url.host)
        host.port  # noqa: B018  (a port that is no number raises here)
    except ValueError as exc:
        raise ValueError(f"{display(text)!r} is not a valid URL ({exc}); {example}") from None
    if not host.hostname:
        raise ValueError(f"{display(text)!r} names no host; {example}")
    return text


#: A GGUF path or a preset's name, never empty (it would be the current folder).
model_text = not_empty(f"is empty; give a GGUF path or a preset: {', '.join(PRESET_NAMES)}")
#: ``--llmperf-against``'s REF, never empty (before, an empty one measured one side, silently);
#: its parts are read by ``session.refs.parse_reference``.
reference = not_empty("is empty; give git:REV, python:PATH or git:REV,python:PATH (docs/against.md)")
#: ``--llmperf-history``'s value, never empty (``history.connection.parse`` reads the rest).
history_text = not_empty("is empty; give a SQLite file path, a postgresql:// URL or off")
#: A folder under the rootdir; an empty value would be the rootdir itself.
folder = not_empty("is empty (that would be the rootdir itself); give a folder, e.g. baselines")


#: The parsers of settings whose value is a path or a URL: each refuses the empty value in one
#: line (tests/test_path_options.py checks every such setting, found by its parser or metavar).
PATH_PARSERS: tuple[Callable[[object], str], ...] = (
    output_file,
    endpoint_url,
    model_text,
    reference,
    history_text,
    folder,
    new_file,
)


@dataclass(frozen=True)
class Setting:
    """One setting. ``name`` gives the pytest option ``--llmperf-<name>`` (dest
    ``llmperf_<name>``) and, with ``ini``, the ini key ``llmperf_<name>``. ``shown``: how
    help texts write the default when the value alone says too little (None: "auto")."""

    name: str
    help: str
    default: Any = None
    parse: Callable[[str], object] = text
    env: str | None = None
    ini: bool = False
    switch: bool = False  # a flag (store_true): no value, no env, no ini
    cli: str | None = None  # the ``llmperf`` commands' flag for it; None: pytest only
    cli_env: bool = False  # the CLI's default is the environment variable's value
    metavar: str | None = None
    shown: str | None = None

    @property
    def option(self) -> str:
        return "--llmperf-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "llmperf_" + self.name

    @property
    def ini_key(self) -> str | None:
        return "llmperf_" + self.name if self.ini else None

    def default_text(self) -> str:
        """The default as every help text writes it."""
        if self.shown is not None:
            return self.shown
        if isinstance(self.default, float):
            return f"{self.default:.0%}" if self.parse is share else f"{self.default:g}"
        if isinstance(self.default, tuple):
            return ",".join(self.default)
        return str(self.default)

    def help_text(self, *, sources: bool = True) -> str:
        """``help (default X; env Y)``: pytest options (``sources``: env and ini named) and the CLI."""
        if self.switch:
            return self.help
        where = [f"default {self.default_text()}"]
        if sources and self.env or self.cli_env and self.env:
            where.append(f"env {self.env}")
        if sources and self.ini:
            where.append(f"ini {self.ini_key}")
        return f"{self.help} ({'; '.join(where)})"

    def arg_type(self) -> Callable[[str], object]:
        """``parse`` as an argparse type: a bad value is argparse's one-line error."""
        return arg_type(self.parse)


def switch(name: str, help: str) -> Setting:
    """A setting given or not (a flag: no value, environment variable or ini key), off by default."""
    return Setting(name, help, False, switch=True)


def report_file(name: str, help: str) -> Setting:
    """The setting of a report the end of a session writes (``reports.reporters``): the file
    it goes to, none by default."""
    return Setting(name, help, None, output_file, shown="not written", metavar="FILE")


#: Each kind of llama.cpp setting (``workload.ValueKind``): its one parser of an option's text and
#: checker of a marker's value (``core.values``).
VALUE_KINDS: dict[ValueKind, Kind[object]] = {
    "count": COUNT,
    "tokens": TOKENS,
    "gpu_layers": GPU_LAYERS,
    "flag": FLAG,
    "cache_type": Choice(CACHE_TYPES, "TYPE"),
}


@dataclass(frozen=True)
class NoKind:
    """A kind without its entry in VALUE_KINDS: a value given says so (tests/test_engine_keys.py too)."""

    kind: str
    metavar: str = "VALUE"

    def parse(self, text: str) -> NoReturn:
        self.check(text)

    def check(self, value: object) -> NoReturn:
        raise ValueError(f"kind {self.kind!r} has no entry in core/settings.py VALUE_KINDS")


def value_kind(kind: ValueKind) -> Kind[object]:
    """The parser and checker of a llama.cpp setting's kind of value."""
    return VALUE_KINDS.get(kind) or NoKind(kind)


def _llama_option(s: LlamaSetting) -> Setting:
    """A llama.cpp setting the session sets too (its ``option``): names derived from its name."""
    kind = value_kind(s.kind)
    return Setting(
        s.name,
        s.option or s.help,
        s.default,
        kind.parse,
        env="LLMPERF_" + s.name.upper(),
        ini=True,
        cli="--" + s.name.replace("_", "-"),
        shown=s.shown,
        metavar=kind.metavar,
    )


#: In the order ``pytest --help`` lists them.
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "model",
            "GGUF model path, or a synthetic preset: tiny, small",
            DEFAULT_MODEL,
            model_text,
            env="LLMPERF_MODEL",
            ini=True,
            metavar="PATH|PRESET",
        ),
        *(_llama_option(LLAMA_SETTINGS[name]) for name in LLAMA_OPTIONS),
        switch(
            "in_process",
            "run llama.cpp in the pytest process instead of one engine worker process per "
            "setting (a native crash then ends the session)",
        ),
        Setting(
            "engine_timeout",
            "seconds one model load or one run in an engine worker may take before the worker "
            "counts as hung and is killed",
            600.0,
            seconds,
            env="LLMPERF_ENGINE_TIMEOUT",
            ini=True,
            cli="--engine-timeout",
            cli_env=True,
            metavar="SECONDS",
        ),
        Setting(
            "max_engines",
            "llama.cpp engines (per-test settings) alive at once",
            2,
            positive_int,
            env="LLMPERF_MAX_ENGINES",
            ini=True,
            metavar="N",
        ),
        Setting(
            "baseline_dir",
            "folder of baseline JSON files, under the rootdir",
            "baselines",
            folder,
            ini=True,
            metavar="DIR",
        ),
        switch("update_baselines", "write or refresh the baselines of the tests that ran (others stay as they are)"),
        switch("require_baseline", "fail a measured test that has no baseline"),
        Setting(
            "lost_baseline",
            "a test that finds no baseline although the last commit (git HEAD) holds one for it on this "
            "machine: fail, so a gate never vanishes in silence, or warn (docs/baselines.md)",
            "fail",
            Choice(LOST_BASELINE_MODES, "fail|warn").parse,
            env="LLMPERF_LOST_BASELINE",
            ini=True,
            metavar="fail|warn",
        ),
        switch("strict_env", "fail a test whose baselines were all recorded on other hardware"),
        switch(
            "fail_other_hardware",
            "fail the session (exit 1) when any test was not compared because its "
            "baselines were all recorded on other hardware",
        ),
        switch("budgets_only", "only budgets gate: do not compare with baselines"),
        switch("baselines_only", "only baseline comparisons gate: budgets are measured and shown, never fail a test"),
        switch("skip", "skip the tests that measure with llmperf (marker or llmperf* fixtures)"),
        switch("only", "run only the tests that measure with llmperf; skip the others"),
        switch("disable", "smoke mode: run each measurement once, no warm-up, budgets, statistics or baselines"),
        Setting(
            "columns",
            "columns of the terminal tables, comma-separated, from: "
            + ", ".join(SUMMARY_COLUMN_NAMES + COMPARISON_COLUMN_NAMES)
            + ", or a set: "
            + ", ".join(f"{name} ({','.join(cols)})" for name, cols in COLUMN_SETS.items())
            + "; JSON/HTML/Markdown keep all",
            DEFAULT_SUMMARY_COLUMNS + DEFAULT_COMPARISON_COLUMNS,
            columns,
            metavar="COLS",
        ),
        Setting(
            "alpha",
            "family-wise significance level over the session's comparisons, e.g. 1% or 0.01",
            DEFAULT_ALPHA,
            alpha,
            cli="--alpha",
            metavar="LEVEL",
        ),
        Setting(
            "threshold",
            "smallest change of a median that counts, e.g. 5% or 0.05",
            DEFAULT_THRESHOLD,
            share,
            cli="--threshold",
            metavar="SHARE",
        ),
        Setting(
            "tail_threshold",
            "smallest change of the ITL p95 that counts",
            DEFAULT_TAIL_THRESHOLD,
            share,
            cli="--tail-threshold",
            metavar="SHARE",
        ),
        Setting(
            "endpoint",
            "the OpenAI-compatible server to measure instead of llama.cpp in process (API base "
            "URL, e.g. http://host:8000/v1)",
            None,
            endpoint_url,
            env="LLMPERF_ENDPOINT",
            ini=True,
            cli="--endpoint",
            cli_env=True,
            shown="none",
            metavar="URL",
        ),
        Setting(
            "api",
            "endpoint API: completions or chat",
            APIS[0],
            api,
            env="LLMPERF_API",
            ini=True,
            cli="--api",
            metavar="completions|chat",
        ),
        Setting(
            "api_model",
            "model name sent to the endpoint",
            None,
            env="LLMPERF_API_MODEL",
            ini=True,
            cli="--model",
            shown="the server's default",
            metavar="NAME",
        ),
        Setting(
            "api_key_env",
            "environment variable holding the endpoint's API key, never written anywhere",
            "LLMPERF_API_KEY",
            env="LLMPERF_API_KEY_ENV",
            ini=True,
            cli="--api-key-env",
            metavar="VAR",
        ),
        Setting(
            "request_timeout",
            "seconds one request to the endpoint may take in all",
            300.0,
            seconds,
            env="LLMPERF_REQUEST_TIMEOUT",
            ini=True,
            cli="--request-timeout",
            metavar="SECONDS",
        ),
        Setting(
            "token_timeout",
            "seconds without data from the endpoint before the stream counts as stalled",
            30.0,
            seconds,
            env="LLMPERF_TOKEN_TIMEOUT",
            ini=True,
            cli="--token-timeout",
            metavar="SECONDS",
        ),
        Setting(
            "prompt_cache",
            "a measured callable's Llamas between runs: cold (cleared, every run a new request) or warm "
            "(kept: measures what the prompt cache gives); a marker's prompt_cache wins",
            "cold",
            Choice(PROMPT_CACHE_MODES, "MODE").parse,
            ini=True,
            metavar="cold|warm",
        ),
        switch(
            "layers", "also time each layer of the in-process model (llama.cpp eval callback, after the plain runs)"
        ),
        switch(
            "attribution",
            "time every graph node of the in-process model by layer and op type after the runs, and compare "
            "both sides' (an A/B, --llmperf-against; a baseline that has one); runs by itself when llama.cpp's "
            "own time moved",
        ),
        switch(
            "roofline",
            "attach the roofline (MBU, MFU, bound) to every in-process measurement (probes the machine once)",
        ),
        Setting(
            "peak_bw",
            "the machine's peak memory bandwidth for the roofline",
            None,
            positive_float,
            cli="--peak-bw",
            metavar="GB/s",
            shown="measured by a probe, cached",
        ),
        Setting(
            "peak_tflops",
            "the machine's peak dense FLOP rate for the roofline",
            None,
            positive_float,
            cli="--peak-tflops",
            metavar="TFLOP/s",
            shown="CPU spec or measured GEMM",
        ),
        Setting(
            "against",
            "measure every llmperf test on two sides, interleaved pair by pair, and judge this tree "
            "against REF: git:REV (the code under test at another revision), python:PATH (another Python "
            "environment), or both as git:REV,python:PATH (docs/against.md)",
            None,
            reference,
            env="LLMPERF_AGAINST",
            shown="off",
            metavar="REF",
        ),
        switch("allow_not_compared", "pass a --llmperf-against session that compared nothing with REF"),
        Setting(
            "max_processes",
            "--llmperf-against: the most processes per side a measurement's pairs run in (the pairs in "
            "blocks, each on fresh processes, fresh placement, the blocks' size from the measured levels; "
            "1: one process per side); a marker's max_processes wins",
            DEFAULT_MAX_PROCESSES,
            COUNT.parse,
            env="LLMPERF_MAX_PROCESSES",
            ini=True,
            metavar="N",
        ),
        report_file("json", "write the session's results as JSON to this file"),
        report_file("markdown", "write a Markdown summary (also appended to $GITHUB_STEP_SUMMARY when set)"),
        report_file(
            "html", 'write a self-contained HTML report with plots (needs pip install "pytest-llmperf[report]")'
        ),
        Setting(
            "write_trace",
            "write every served request the session sent to this new file as a trace a test can replay "
            "(JSONL: arrival offsets, prompt or messages, max_tokens; never a header or API key)",
            None,
            new_file,
            shown="not written",
            metavar="FILE",
        ),
        Setting(
            "history",
            "where every session's results are appended: a SQLite file, a postgresql:// URL or off",
            None,
            history_text,
            env="LLMPERF_HISTORY",
            ini=True,
            metavar="PATH|URL|off",
            shown=".llmperf/history.sqlite under the rootdir",
        ),
    )
}


#: One name per concept (issue 24): old spelling -> the name everywhere a user writes it; an old one
#: is refused for one release (``renamed_line``). llama-cpp-python's names only where ``llama_cpp.Llama``
#: is built; stored records keep theirs (a baseline's ``subject``: ``n_threads``, ``n_gpu_layers``).
RENAMED = {"n_gpu_layers": "gpu_layers", "n_threads": "threads", "use_mmap": "mmap", "use_mlock": "mlock"}


def renamed_line(what: str, old: str, new: str) -> str:
    """``marker key 'n_gpu_layers' was renamed to 'gpu_layers'`` (callers add their prefix)."""
    return f"{what} {old!r} was renamed to {new!r}"


#: (old, new) per renamed session setting: the old one's option, ini key and flag, taken hidden and refused.
RENAMED_SETTINGS = tuple(
    (replace(s, name=old, env=None, cli=s.cli and "--" + old.replace("_", "-")), s)
    for old, s in ((old, SETTINGS[new]) for old, new in RENAMED.items() if new in SETTINGS)
)


@dataclass(frozen=True)
class Resolved:
    """A setting's value and where it came from (``--llmperf-threads``, ``$LLMPERF_THREADS``,
    ``ini llmperf_threads`` or ``default``), for the one line an error or warning names."""

    value: Any
    source: str


def _refuse_renamed(getoption: Callable[[str], object], getini: Callable[[str], str]) -> None:
    """An old spelling of a setting given: one line naming the new one."""
    for old, new in RENAMED_SETTINGS:
        if getoption(old.dest) is not None:
            raise ConfigError("llmperf: " + renamed_line("option", old.option, new.option))
        if old.ini_key is not None and new.ini_key is not None and getini(old.ini_key):
            raise ConfigError("llmperf: " + renamed_line("ini key", old.ini_key, new.ini_key))


def _text_of(s: Setting, getini: Callable[[str], str], environ: Mapping[str, str]) -> tuple[str, str] | None:
    """A setting's text from the environment or else the ini file, and where it came from
    (``$LLMPERF_THREADS``, ``ini llmperf_threads``); None: neither gives it."""
    if s.env and environ.get(s.env):
        return environ[s.env], f"${s.env}"
    if s.ini_key is not None and getini(s.ini_key):
        return getini(s.ini_key), f"ini {s.ini_key}"
    return None


def _resolve_one(
    s: Setting, getoption: Callable[[str], object], getini: Callable[[str], str], environ: Mapping[str, str]
) -> Resolved:
    given = getoption(s.dest)
    if s.switch:
        return Resolved(bool(given), s.option if given else "default")
    if given is not None:  # parsed already (the option's argparse type)
        return Resolved(given, s.option)
    text = _text_of(s, getini, environ)
    if text is None:
        return Resolved(s.default, "default")
    raw, source = text
    try:
        return Resolved(s.parse(raw), source)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def resolve(
    getoption: Callable[[str], object], getini: Callable[[str], str], environ: Mapping[str, str] | None = None
) -> dict[str, Resolved]:
    """Every setting, read once each: command line > environment > ini > default. A value
    from the command line is already parsed (argparse type); the others are parsed here.
    Raises ConfigError (one line naming the source) for a bad value."""
    _refuse_renamed(getoption, getini)
    env = os.environ if environ is None else environ
    return {s.name: _resolve_one(s, getoption, getini, env) for s in SETTINGS.values()}


def markdown_table() -> str:
    """docs/settings.md's table of every setting (tests/test_settings_table.py keeps it in step)."""
    lines = ["| option | environment | ini | `llmperf` flag | default |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        option = f"`{s.option}`" + (f" {s.metavar}" if s.metavar else "")
        default = "off" if s.switch else s.default_text()
        cells = [
            option.replace("|", "\\|"),
            f"`{s.env}`" if s.env else "",
            f"`{s.ini_key}`" if s.ini else "",
            f"`{s.cli}`" if s.cli else "",
            default.replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _given_options(args: Sequence[str], by_option: Mapping[str, Setting]) -> Iterator[tuple[Setting, str]]:
    """Each setting's option in ``args`` with its text (``--x=v`` or ``--x v``; a switch: "")."""
    it = iter(args)
    for arg in it:
        if arg == "--":
            return
        name, eq, value = arg.partition("=")
        s = by_option.get(name)
        if s is None:
            continue
        if s.switch:
            yield s, ""
        elif eq:
            yield s, value
        else:
            yield s, next(it, "")


def conflicting_option(args: Sequence[str], *, cli: bool = False) -> str | None:
    """One line when the command line gives one setting's option twice with different values
    (``--llmperf-threads 2 ... --llmperf-threads 4``): the last one counts, as argparse and
    every CLI reads it (a CI script appending an override to its defaults), and the line names
    both so it is never silent; None when there is none. ``cli``: the ``llmperf`` commands'
    flags (``--threads``)."""
    flags = ((s.cli if cli else s.option, s) for s in SETTINGS.values())
    by_option = {flag: s for flag, s in flags if flag}
    first: dict[str, tuple[str, object]] = {}
    last: dict[str, str] = {}
    for s, text in _given_options(args, by_option):
        flag = (s.cli if cli else None) or s.option
        first.setdefault(flag, (text, _parsed_or_text(s, text)))
        if _parsed_or_text(s, text) != first[flag][1]:
            last[flag] = text
    if not last:
        return None
    flag, text = next(iter(last.items()))
    return f"{flag} is given twice ({first[flag][0]!r} and {text!r}): the last one, {text!r}, counts; give it once"


def _parsed_or_text(s: Setting, text: str) -> object:
    try:
        return s.parse(text)
    except ValueError:
        return text
