"""What a user sets: the session's settings, read once from the options (``core.settings``'
``SETTINGS``) into one frozen value, every later decision reading this, never the options
again; and the one description of the ``llmperf`` marker's keys (validation, help text and
docs), used by the pytest plugin and by a script that drives a session without pytest.

Budget keys map to a statistic of a Measurement (see ``catalog.BUDGETS``); workload keys
become fields of a ``Workload``. A key of a kind of value (a count, a number > 0, a share, a
llama.cpp setting's kind) is checked by that kind's ``check`` (``core.values``), the rule its
option's text is parsed by."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..core.catalog import AGREEMENT_BUDGETS, BUDGETS
from ..core.conversations import conversation
from ..core.documents import check_output, refused_output
from ..core.errors import ConfigError, unknown_name
from ..core.prompt_sets import prompt_set
from ..core.settings import (
    DEFAULT_MAX_PROCESSES,
    RENAMED,
    SETTINGS,
    UNQUANTIZED,
    EngineSettings,
    Resolved,
    renamed_line,
    resolve,
    value_kind,
)
from ..core.traces import trace
from ..core.values import COUNT, FLAG, LEVEL, POSITIVE, SHARE, THRESHOLD, TOKENS, Choice, Integer, Kind
from ..core.workload import (
    CHAT_ROLES,
    LLAMA_SETTINGS,
    MAX_TOKENS,
    MODEL_LOAD_KINDS,
    PROMPT_CACHE_MODES,
    Workload,
    chat_messages,
)
from ..engines.capabilities import Engine
from ..history.connection import Location
from ..history.connection import default as default_history
from ..history.connection import parse as parse_history
from ..reports.reporters import report_names

T = TypeVar("T")

#: Options that exclude each other: (one, other, the line that says so).
EXCLUSIVE = (
    ("skip", "only", "--llmperf-skip and --llmperf-only exclude each other"),
    (
        "budgets_only",
        "baselines_only",
        "--llmperf-budgets-only and --llmperf-baselines-only exclude each other; give neither to gate on both",
    ),
    (
        "against",
        "update_baselines",
        "--llmperf-against judges this tree against REF and neither reads nor writes baselines: record baselines "
        "in a session of their own (drop one of --llmperf-against, --llmperf-update-baselines)",
    ),
    (
        "against",
        "disable",
        "--llmperf-disable measures once without statistics: it cannot judge against REF (drop one of them)",
    ),
    (
        "against",
        "write_trace",
        "--llmperf-against runs the tests in processes of each side, whose requests this process does not "
        "send: write a trace in a session of its own (drop one of --llmperf-against, --llmperf-write-trace)",
    ),
    (
        "disable",
        "update_baselines",
        "--llmperf-disable measures once without statistics: it cannot record baselines "
        "(drop one of --llmperf-disable, --llmperf-update-baselines)",
    ),
)


@dataclass(frozen=True)
class SessionSettings:
    """Every setting of ``SETTINGS`` resolved (engine settings in ``engine``), with paths made
    absolute against the rootdir and the history location parsed."""

    rootdir: Path
    engine: EngineSettings
    threads_source: str  # where ``engine.threads`` came from, for the warning line
    baseline_dir: Path
    update_baselines: bool
    require_baseline: bool
    strict_env: bool
    fail_other_hardware: bool
    budgets_only: bool
    baselines_only: bool
    skip: bool
    only: bool
    disable: bool
    columns: tuple[str, ...]
    alpha: float
    threshold: float
    tail_threshold: float
    layers: bool
    attribution: bool
    roofline: bool
    peak_bw: float | None
    peak_tflops: float | None
    json: str | None
    markdown: str | None
    html: str | None
    history: Location | None
    #: ``--llmperf-against``'s REF as given (``session.refs.parse_reference`` reads it), or None.
    against: str | None = None
    #: ``--llmperf-allow-not-compared``: a session of ``--llmperf-against`` that compared nothing passes.
    allow_not_compared: bool = False
    #: ``--llmperf-max-processes``: ``--llmperf-against``'s budget of processes per side.
    max_processes: int = DEFAULT_MAX_PROCESSES
    #: ``--llmperf-prompt-cache``: a measured callable's Llamas between runs (cold | warm).
    prompt_cache: str = "cold"
    #: ``--llmperf-lost-baseline``: a test whose committed baseline is not found fails or warns (fail | warn).
    lost_baseline: str = "fail"
    #: ``--llmperf-write-trace``: the new file every served request the session sent is written to.
    write_trace: str | None = None
    #: The paths of the reports registered from outside (``reports.reporters.register``), by setting name.
    registered_reports: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def compare(self) -> bool:
        """Measurements are compared with their baselines (not ``--llmperf-budgets-only``/``-disable``)."""
        return not self.budgets_only and not self.disable

    @property
    def budgets_gate(self) -> bool:
        """A budget breach fails its test (not ``--llmperf-baselines-only``/``-disable``)."""
        return not self.baselines_only and not self.disable

    @property
    def reports(self) -> dict[str, str]:
        """Each report asked for, by its setting's name: the path as given."""
        given = {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, **self.registered_reports}
        return {name: given[name] for name in report_names() if given.get(name) is not None}

    @property
    def compare_values(self) -> dict[str, Any]:
        """``judge.regression.CompareSettings``' session-wide values (a marker may override them)."""
        return {"alpha": self.alpha, "threshold": self.threshold, "tail_threshold": self.tail_threshold}

    @classmethod
    def from_options(
        cls,
        getoption: Callable[[str], object],
        getini: Callable[[str], str],
        rootdir: Path | str,
        environ: Mapping[str, str] | None = None,
    ) -> SessionSettings:
        """Read every option once (``settings.resolve``). Raises ConfigError: one line."""
        return cls.from_resolved(resolve(getoption, getini, environ), rootdir)

    @classmethod
    def of(cls, rootdir: Path | str, environ: Mapping[str, str] | None = None, **values: object) -> SessionSettings:
        """Settings for a script (no pytest): ``SessionSettings.of(".", model="tiny", threads=1)``;
        values as the command line would give them (parsed again), the rest from env and defaults."""
        for name in values:
            if name in RENAMED and RENAMED[name] in SETTINGS:
                raise ConfigError("llmperf: " + renamed_line("setting", name, RENAMED[name]))
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise ConfigError(unknown_name("llmperf setting", unknown[0], SETTINGS, "docs/settings.md"))
        given = {SETTINGS[k].dest: SETTINGS[k].parse(v) if isinstance(v, str) else v for k, v in values.items()}
        return cls.from_options(lambda dest: given.get(dest), lambda key: "", rootdir, environ)

    @classmethod
    def from_resolved(cls, r: Mapping[str, Resolved], rootdir: Path | str) -> SessionSettings:
        for one, other, line in EXCLUSIVE:
            if r[one].value and r[other].value:
                raise ConfigError(line)
        _check_outputs(r)
        _check_new_trace(r)
        _check_timeouts(r)
        root = Path(rootdir)
        own = {
            f.name: r[f.name].value
            for f in dataclasses.fields(cls)
            if f.name in r and f.name not in ("baseline_dir", "history")
        }
        return cls(
            rootdir=root,
            engine=EngineSettings(**{f.name: r[f.name].value for f in dataclasses.fields(EngineSettings)}),
            threads_source=r["threads"].source,
            baseline_dir=root / r["baseline_dir"].value,
            history=_history(r, root),
            registered_reports={name: r[name].value for name in report_names() if name not in own},
            **own,
        )


def _check_outputs(r: Mapping[str, Resolved]) -> None:
    """Each report path the end of the session could not write (a directory, a file in the way
    of its folders, a folder not writable...): one line before anything runs, not after it."""

    for name in report_names():
        given = r[name]
        if given.value is None:
            continue
        try:
            check_output(given.value)
        except OSError as exc:
            raise ConfigError(f"{given.source}: {refused_output(given.value, exc, 'it')}") from None


def _check_new_trace(r: Mapping[str, Resolved]) -> None:
    """``--llmperf-write-trace``'s file: refused before anything runs when something is there
    already (a trace is never overwritten) or its folder is missing."""
    given = r["write_trace"]
    if given.value is None:
        return
    path = Path(given.value)
    if os.path.lexists(path):
        raise ConfigError(
            f"llmperf: {given.source} {path} exists: a trace is never overwritten; give a new path or remove it"
        )
    if not path.absolute().parent.is_dir():
        raise ConfigError(f"llmperf: {given.source} {path}: its folder {path.absolute().parent} does not exist")


def _check_timeouts(r: Mapping[str, Resolved]) -> None:
    """A wait for one token longer than the wait for the whole request never ends first: both
    given so (not a default), one line naming where each came from."""
    token, request = r["token_timeout"], r["request_timeout"]
    if "default" not in (token.source, request.source) and token.value > request.value:
        raise ConfigError(
            f"llmperf: {token.source} {token.value:g} s is longer than {request.source} {request.value:g} s "
            "(a token's wait within the request's); give a token timeout at most the request timeout"
        )


def _history(r: Mapping[str, Resolved], root: Path) -> Location | None:
    """Where the session's history is appended; None under ``--llmperf-against`` (the verdicts
    are against REF, not the history's; nothing is appended) or ``off``."""
    if r["against"].value:
        return None
    given = r["history"]
    return default_history(root) if given.value is None else parse_history(given.value, given.source, root)


#: The kinds of marker key ("engine": llama.cpp settings, "setting": the comparison's), in the
#: order of ``MarkerConfig``'s fields, one each.
KINDS = ("budget", "workload", "setting", "option", "engine", "ab")


@dataclass(frozen=True)
class Key:
    name: str
    kind: str  # one of KINDS
    help: str
    #: The value as the marker gives it (any Python value) -> the value kept, or a ConfigError.
    check: Callable[[str, object], object]


def marker_line(name: str, problem: str) -> str:
    """``llmperf marker key 'runs' must be >= 1, got 0`` (``problem``: a value kind's ValueError;
    one that says what was expected follows a colon)."""
    return f"llmperf marker key {name!r}{': ' if problem.startswith('expected') else ' '}{problem}"


def _marker(kind: Kind[T]) -> Callable[[str, object], T]:
    """A marker key's check: the value kind's (``core.values``), a ConfigError naming the key."""

    def check(name: str, value: object) -> T:
        try:
            return kind.check(value)
        except ValueError as exc:
            raise ConfigError(marker_line(name, str(exc))) from None

    return check


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"llmperf marker key {name!r} must be a non-empty string, got {value!r}")
    return value


def _read_by(read: Callable[[object], T]) -> Callable[[str, object], T]:
    """A marker key read by ``read`` (a chat request, a prompt set, a trace, a conversation): its
    ConfigError names the key."""

    def check(name: str, value: object) -> T:
        try:
            return read(value)
        except ConfigError as exc:
            raise ConfigError(f"llmperf marker key {name!r}: {exc}") from None

    return check


def _model_load(name: str, value: object) -> str:
    if value not in MODEL_LOAD_KINDS:
        raise ConfigError(f"llmperf marker key {name!r} must be one of {', '.join(MODEL_LOAD_KINDS)}, got {value!r}")
    return str(value)


def check_side(name: str, spec: object) -> object:
    """An A/B side as the marker or ``llmperf.compare`` gives it: llama.cpp settings (checked
    key by key, as the marker's own engine keys), a model or endpoint, a callable or an engine."""
    if isinstance(spec, Mapping):
        return {key: _side_setting(name, key, value) for key, value in spec.items()}
    if isinstance(spec, str) and spec:
        return spec
    if callable(spec) or isinstance(spec, Engine):
        return spec
    raise ConfigError(
        f"A/B side {name!r} must be llama.cpp settings (a dict such as {{'threads': 1}}), a model "
        f"(GGUF path or preset), an endpoint URL, a callable fn(prompt, max_tokens) or an engine; got {spec!r}"
    )


def _side_setting(side: str, key: str, value: object) -> object:
    """One llama.cpp setting of an A/B side, checked as the marker's own engine key."""
    if key in RENAMED:
        raise ConfigError(f"A/B side {side!r}: " + renamed_line("llama.cpp setting", key, RENAMED[key]))
    k = KEYS.get(key)
    if k is None or k.kind != "engine":
        allowed = [n for n, v in KEYS.items() if v.kind == "engine"]
        raise ConfigError(
            f"A/B side {side!r}: " + unknown_name("llama.cpp setting", key, allowed, "docs/engine-settings.md")
        )
    return k.check(key, value)


def _ab_budget(name: str, value: object) -> object:
    """An A/B's relative or agreement budget, as ``judge.budgets`` reads it (a ConfigError says
    what is wrong)."""
    from ..judge.budgets import parse_agreement_budgets, parse_budgets

    (parse_agreement_budgets if name in AGREEMENT_BUDGETS else parse_budgets)(**{name: value})
    return value


KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        # Budget keys and their help come from the metric catalog.
        *(Key(b.key, "budget", b.help, _marker(SHARE if b.share else POSITIVE)) for b in BUDGETS.values()),
        Key("prompt", "workload", "literal prompt text", _text),
        Key(
            "prompt_tokens",
            "workload",
            "synthetic prompt of exactly N tokens (a measured callable or a served model: N short words)",
            _marker(TOKENS),
        ),
        Key(
            "messages",
            "workload",
            f"chat request [{{'role': ..., 'content': ...}}, ...] (roles {', '.join(CHAT_ROLES)}): rendered "
            "through the model's chat template (served: sent to /v1/chat/completions)",
            _read_by(chat_messages),
        ),
        Key(
            "prompt_set",
            "workload",
            "requests the runs draw from (seeded, by weight): a JSONL file's path, one "
            '{"prompt": ...} or {"messages": [...]} a line (optional max_tokens, weight), or a list of them',
            _read_by(prompt_set),
        ),
        Key(
            "trace",
            "workload",
            "served: requests replayed at their arrival times, open loop: a JSONL file's path, one "
            '{"t_s": 0.25, "prompt": ...} (or "messages") a line (optional max_tokens), or a list of them',
            _read_by(trace),
        ),
        Key("trace_speed", "workload", "a trace's pace: 2.0 replays it twice as fast (default 1.0)", _marker(POSITIVE)),
        Key(
            "conversation",
            "workload",
            "a multi-turn conversation each run sends turn by turn (the model's replies fed back, the prompt "
            'cache kept between turns): a JSON file\'s path or inline, {"system": ..., "turns": [...]} or a list of turns',
            _read_by(conversation),
        ),
        Key(
            "turn",
            "workload",
            "a conversation's budgets and judged figures on this turn alone (1-based; default: all turns pooled)",
            _marker(COUNT),
        ),
        Key(
            "max_tokens",
            "workload",
            "tokens generated per run (>= 2, EOS cannot end a run)",
            _marker(Integer(2, MAX_TOKENS)),
        ),
        Key("runs", "workload", "measured runs (>= 1)", _marker(COUNT)),
        Key("warmup", "workload", "discarded warm-up runs before measuring (>= 0)", _marker(Integer(0))),
        Key("concurrency", "workload", "load: requests in flight at once (served models)", _marker(COUNT)),
        Key("requests", "workload", "load: requests sent in all (default: runs)", _marker(COUNT)),
        Key("rate", "workload", "load: Poisson arrivals, requests per second (seeded)", _marker(POSITIVE)),
        Key(
            "shared_prefix_tokens",
            "workload",
            "served: the first N prompt tokens are the same in every request "
            "(measures prefix caching; default: unique prompts, server prompt cache off)",
            _marker(COUNT),
        ),
        Key(
            "prompt_cache",
            "workload",
            "a measured callable's Llamas between runs: cold (default: cleared, every run a new request) "
            "or warm (kept: measures what the prompt cache gives; never compared with cold)",
            _marker(Choice(PROMPT_CACHE_MODES, "MODE")),
        ),
        Key(
            "model", "engine", "GGUF path or preset (tiny, small) for this test; one engine per distinct setting", _text
        ),
        *(Key(s.name, "engine", s.help, _marker(value_kind(s.kind))) for s in LLAMA_SETTINGS.values()),
        Key(
            "a",
            "ab",
            "A/B: side A (llama.cpp settings dict, model, callable or endpoint URL); runs interleave with b",
            check_side,
        ),
        Key("b", "ab", "A/B: side B, compared with A by paired statistics", check_side),
        Key(
            "max_slowdown",
            "ab",
            "A/B: max B/A time ratio - 1 per phase, e.g. 0.05, '5%' or {'prefill': 0.03}",
            _ab_budget,
        ),
        Key("min_speedup", "ab", "A/B: min B/A speed ratio per phase, e.g. 1.5 or {'decode': 1.2}", _ab_budget),
        *(Key(b.key, "ab", b.help, _ab_budget) for b in AGREEMENT_BUDGETS.values()),
        Key(
            "max_runs",
            "option",
            "measure more runs, `runs` at a time, while a baseline verdict is INCONCLUSIVE or a "
            "budget's CI straddles its limit, up to this many (default 3 x runs; = runs turns it off)",
            _marker(COUNT),
        ),
        Key(
            "max_processes",
            "option",
            "--llmperf-against: the most processes per side this test's pairs run in (the pairs in blocks, "
            "each on fresh processes, the blocks' size from the measured levels; 1 turns the process level "
            "off; default --llmperf-max-processes)",
            _marker(COUNT),
        ),
        Key("layers", "option", "also time each layer (llama.cpp eval callback; in-process only)", _marker(FLAG)),
        Key(
            "attribution",
            "option",
            "after the runs, time every graph node by layer and op type and compare both sides' "
            "(A/B, --llmperf-against, a baseline that has one; in-process llama.cpp only)",
            _marker(FLAG),
        ),
        Key(
            "model_load",
            "option",
            "after the runs, time fresh loads of the model (as many as runs, at most 5): 'warm' (file in the "
            "page cache) or 'cold' (evicted first, checked; max_load_ms alone: warm)",
            _model_load,
        ),
        Key("alpha", "setting", "family-wise significance level for baseline comparisons", _marker(LEVEL)),
        Key("threshold", "setting", "smallest change of a median that counts: 0.05 or '5%'", _marker(THRESHOLD)),
        Key(
            "tail_threshold", "setting", "smallest change of the ITL p95 that counts: 0.10 or '10%'", _marker(THRESHOLD)
        ),
    ]
}

BUDGET_KEYS = tuple(k for k, v in KEYS.items() if v.kind == "budget")
#: One choice, not two keys: a closer marker's (or ``measure()``'s) prompt of either kind
#: replaces a farther one's.
PROMPT_KEYS = frozenset({"prompt", "prompt_tokens", "messages", "prompt_set", "trace", "conversation"})


@dataclass(frozen=True)
class MarkerConfig:
    """Validated marker arguments, split by kind."""

    budgets: Mapping[str, float]
    workload: Mapping[str, Any]
    settings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: llama.cpp settings for this test (``engines.llama_cpp_native.EngineConfig`` fields), over the session's.
    engine: Mapping[str, object] = dataclasses.field(default_factory=dict)
    #: A/B keys (a, b, max_slowdown, min_speedup, the agreement budgets): the test compares two sides interleaved.
    ab: Mapping[str, object] = dataclasses.field(default_factory=dict)

    @property
    def is_ab(self) -> bool:
        return "a" in self.ab and "b" in self.ab

    def merged(self, overrides: Mapping[str, object]) -> MarkerConfig:
        extra = validate(overrides, together=False)
        # A prompt given here replaces the marker's prompt of either kind.
        dropped = PROMPT_KEYS | {"trace_speed"} if PROMPT_KEYS & extra.workload.keys() else frozenset()
        mine = dataclasses.replace(self, workload={k: v for k, v in self.workload.items() if k not in dropped})
        # Each field: the marker's keys of its kind, then the overrides'.
        return check_together(MarkerConfig(*({**getattr(mine, f.name), **getattr(extra, f.name)} for f in FIELDS)))


FIELDS = dataclasses.fields(MarkerConfig)

#: Where every marker key is listed (a bad key's line points there).
MARKER_KEYS_AT = "pytest --markers, or README.md's marker keys"


def validate(kwargs: Mapping[str, object], args: tuple[object, ...] = (), *, together: bool = True) -> MarkerConfig:
    """Check marker keys and values; a ConfigError names the key and the allowed keys. With
    ``together`` (a whole marker, not overrides still to be merged), keys that contradict each
    other too (``check_together``)."""
    if args:
        raise ConfigError(
            f"llmperf marker takes keyword arguments only, got positional {args!r}; its keys: {MARKER_KEYS_AT}"
        )
    checked: list[tuple[str, Any]] = [(name, _key(name).check(name, value)) for name, value in kwargs.items()]
    if {"prompt", "prompt_tokens"} <= kwargs.keys():
        raise ConfigError("llmperf marker: give either 'prompt' or 'prompt_tokens', not both")
    # Each key checked into its kind's field.
    config = MarkerConfig(*({n: v for n, v in checked if KEYS[n].kind == kind} for kind in KINDS))
    return check_together(config) if together else config


def _key(name: str) -> Key:
    """The marker key ``name``, or a ConfigError (a renamed key's new name, or the keys there are)."""
    key = KEYS.get(name)
    if key is None and name in RENAMED:
        raise ConfigError("llmperf: " + renamed_line("marker key", name, RENAMED[name]))
    if key is None:
        raise ConfigError(unknown_name("llmperf marker key", name, KEYS, MARKER_KEYS_AT))
    return key


def _max_runs_below_runs(c: MarkerConfig) -> str | None:
    max_runs, runs = c.options.get("max_runs"), c.workload.get("runs", Workload.runs)
    if max_runs is None or max_runs >= runs:
        return None
    return (
        f"max_runs {max_runs} is below runs {runs} (the runs measured at first); "
        "give max_runs >= runs (max_runs = runs measures no more)"
    )


def _requests_below_concurrency(c: MarkerConfig) -> str | None:
    w = c.workload
    concurrency, requests = w.get("concurrency"), w.get("requests", w.get("runs", Workload.runs))
    if concurrency is None or requests >= concurrency:
        return None
    return (
        f"concurrency {concurrency} is above the {requests} requests sent (requests, default runs): "
        "never that many in flight; give requests >= concurrency"
    )


def _context_below_workload(c: MarkerConfig) -> str | None:
    n_ctx, prompt = c.engine.get("n_ctx"), c.workload.get("prompt_tokens")
    if not isinstance(n_ctx, int) or prompt is None:
        return None
    generated = c.workload.get("max_tokens", Workload.max_tokens)
    if prompt + generated <= n_ctx:
        return None
    return f"n_ctx {n_ctx} is below prompt_tokens {prompt} + max_tokens {generated}; give n_ctx >= {prompt + generated}"


def _ubatch_above_batch(c: MarkerConfig) -> str | None:
    n_ubatch, n_batch = c.engine.get("n_ubatch"), c.engine.get("n_batch")
    if not isinstance(n_ubatch, int) or not isinstance(n_batch, int) or n_ubatch <= n_batch:
        return None
    return f"n_ubatch {n_ubatch} is above n_batch {n_batch} (llama.cpp splits a batch into ubatches); give n_ubatch <= n_batch"


def _quantized_v_without_flash_attn(c: MarkerConfig) -> str | None:
    type_v = c.engine.get("type_v")
    if type_v is None or type_v in UNQUANTIZED or c.engine.get("flash_attn") is not False:
        return None
    return f"type_v={type_v!r} (a quantized V cache) needs flash_attn=True in llama.cpp, and flash_attn=False is given"


#: What a conversation is not measured with yet: (key, why), in the order they are checked.
NOT_WITH_CONVERSATION = (
    ("a", "an A/B compares single requests"),
    ("concurrency", "a load test sends single requests"),
    ("requests", "a load test sends single requests"),
    ("rate", "a load test sends single requests"),
    ("layers", "per-layer timing times one request"),
    ("attribution", "the attribution pass times one request"),
    ("model_load", "model loads are timed on one request"),
)


def _conversation_alone(config: MarkerConfig) -> str | None:
    """A conversation with a key whose measurement sends single requests: not supported yet."""
    if "conversation" not in config.workload:
        if "turn" in config.workload:
            return "turn names a turn of a conversation: give a conversation too"
        return None
    given = {**config.workload, **config.options, **config.ab}
    for key, why in NOT_WITH_CONVERSATION:
        if given.get(key) not in (None, False):
            return f"a conversation with {key} is not supported yet ({why}); measure the conversation alone"
    return None


#: Marker keys that contradict each other: each rule says so in one line, or None.
CONTRADICTIONS: tuple[Callable[[MarkerConfig], str | None], ...] = (
    _max_runs_below_runs,
    _requests_below_concurrency,
    _context_below_workload,
    _ubatch_above_batch,
    _quantized_v_without_flash_attn,
    _conversation_alone,
)


def check_together(config: MarkerConfig) -> MarkerConfig:
    """``config``, unless some of its keys contradict each other (``CONTRADICTIONS``, and the
    workload's own rules: a shared prefix shorter than the prompt...): a ConfigError, one line."""
    for rule in CONTRADICTIONS:
        line = rule(config)
        if line is not None:
            raise ConfigError(f"llmperf marker: {line}")
    try:
        Workload(**config.workload)
    except ConfigError as exc:
        raise ConfigError(f"llmperf marker: {exc}") from None
    return config


def marker_help() -> str:
    """The text registered for ``pytest --markers``."""
    return "llmperf(**keys): measure LLM inference for this test and enforce budgets. Keys: " + ", ".join(
        f"{k.name} ({k.help})" for k in KEYS.values()
    )
