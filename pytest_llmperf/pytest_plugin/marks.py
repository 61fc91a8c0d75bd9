"""The llmperf marker: its keys (validation and help), the marker config merged on each item, which
items measure, xdist grouping, and what a side of an A/B may be.

The one description of the ``llmperf`` marker's keys: validation, help text and docs.

Budget keys map to a statistic of a Measurement (see ``catalog.BUDGETS``); workload keys
become fields of a ``Workload``.

Keep perf tests on one pytest-xdist worker: side by side they would measure each other.

xdist's own ``--dist loadgroup`` appends ``@group`` to a worker's node ids, which pytest 9
no longer lets it do (``nodeid`` became read-only), so groups silently spread. Instead each
worker writes the groups it collected (``nodeid<TAB>group``: llmperf tests under ``llmperf``,
and any ``xdist_group`` mark) to a file in a folder the controller made, and the controller's
scheduler, a ``LoadGroupScheduling``, reads them when it first splits scopes, which happens
after every worker has reported its collection. Ungrouped tests are spread as by ``load``.

The ``llmperf`` marker on pytest items, as plain functions the hooks call (as pytest-memray
keeps its marks): the merged marker config, which items measure, what collection does to them.

What a side of an A/B may be: llama.cpp settings, a model, a callable, an endpoint, an engine."""

from __future__ import annotations

import dataclasses
import os
import pytest
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TYPE_CHECKING

from ..core.catalog import BUDGETS
from ..core.errors import ConfigError
from ..core.workload import MAX_TOKENS, too_many

if TYPE_CHECKING:
    from ..judge.ab import Side
    from ..session import Session
    from .fixtures import LLMPerf


@dataclass(frozen=True)
class Key:
    name: str
    kind: str  # "budget", "workload", "engine" (llama.cpp settings), "setting" (comparison), "option", "ab"
    help: str
    check: Callable[[str, Any], Any]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"llmperf marker key {name!r} must be a number, got {value!r}")
    if not value > 0:
        raise ConfigError(f"llmperf marker key {name!r} must be > 0, got {value!r}")
    return float(value)


def _int_at_least(minimum: int, *, tokens: bool = False) -> Callable[[str, Any], int]:
    """An integer >= ``minimum``; ``tokens``: a llama.cpp token count (context, batch), bounded
    as a workload's (``workload.MAX_TOKENS``: llama.cpp keeps them in 32 bits)."""

    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"llmperf marker key {name!r} must be an integer, got {value!r}")
        if value < minimum:
            raise ConfigError(f"llmperf marker key {name!r} must be >= {minimum}, got {value}")
        if tokens and value > MAX_TOKENS:
            raise ConfigError(f"llmperf marker key {name!r} {too_many(value)}")
        return value

    return check


def _fraction(low: float, high: float) -> Callable[[str, Any], float]:
    def check(name: str, value: Any) -> float:
        if isinstance(value, str):  # "5%", as the options and `llmperf compare` take it
            from ..core.settings import parse_fraction

            try:
                value = parse_fraction(value, high=high)
            except ValueError as exc:
                raise ConfigError(f"llmperf marker key {name!r}: {exc}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"llmperf marker key {name!r} must be a number, got {value!r}")
        if not low < value < high:
            raise ConfigError(f"llmperf marker key {name!r} must be between {low} and {high}, got {value!r}")
        return float(value)

    return check


def _share(name: str, value: Any) -> float:
    from ..core.settings import parse_share

    try:
        return parse_share(value)
    except ValueError as exc:
        raise ConfigError(f"llmperf marker key {name!r} {exc}") from None


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"llmperf marker key {name!r} must be True or False, got {value!r}")
    return value


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"llmperf marker key {name!r} must be a non-empty string, got {value!r}")
    return value


def _cache_type(name: str, value: Any) -> str:
    from ..core.settings import CACHE_TYPES

    if not isinstance(value, str) or value.lower() not in CACHE_TYPES:
        raise ConfigError(f"llmperf marker key {name!r} must be one of {', '.join(CACHE_TYPES)}, got {value!r}")
    return value.lower()


def _gpu_layers(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ConfigError(f"llmperf marker key {name!r} must be an integer >= -1 (-1: all layers), got {value!r}")
    return value


def _side(name: str, value: Any) -> Any:
    return check_side(name, value)


def check_side(name: str, spec: Any) -> Any:
    """An A/B side as the marker or ``llmperf.compare`` gives it: llama.cpp settings (checked
    key by key, as the marker's own engine keys), a model or endpoint, a callable or an engine."""
    if isinstance(spec, Mapping):
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


def _relative(name: str, value: Any) -> Any:
    from ..judge.budgets import parse_budgets

    parse_budgets(**{name: value})  # raises a ConfigError naming what is wrong
    return value


KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        # Budget keys and their help come from the metric catalog.
        *(Key(b.key, "budget", b.help, _share if b.share else _number) for b in BUDGETS.values()),
        Key("prompt", "workload", "literal prompt text", _text),
        Key("prompt_tokens", "workload", "synthetic prompt of exactly N tokens", _int_at_least(1)),
        Key("max_tokens", "workload", "tokens generated per run (>= 2, EOS cannot end a run)", _int_at_least(2)),
        Key("runs", "workload", "measured runs (>= 1)", _int_at_least(1)),
        Key("warmup", "workload", "discarded warm-up runs before measuring (>= 0)", _int_at_least(0)),
        Key("concurrency", "workload", "load: requests in flight at once (served models)", _int_at_least(1)),
        Key("requests", "workload", "load: requests sent in all (default: runs)", _int_at_least(1)),
        Key("rate", "workload", "load: Poisson arrivals, requests per second (seeded)", _number),
        Key("shared_prefix_tokens", "workload", "served: the first N prompt tokens are the same in every request "
            "(measures prefix caching; default: unique prompts, server prompt cache off)", _int_at_least(1)),
        Key("model", "engine", "GGUF path or preset (tiny, small) for this test; one engine per distinct setting", _text),
        Key("threads", "engine", "llama.cpp threads for this test (prompt and generation)", _int_at_least(1)),
        Key("n_ctx", "engine", "llama.cpp context size for this test", _int_at_least(1, tokens=True)),
        Key("n_batch", "engine", "llama.cpp logical batch (prompt tokens per llama_decode call)",
            _int_at_least(1, tokens=True)),
        Key("n_ubatch", "engine", "llama.cpp physical micro-batch (<= n_batch; default n_batch)",
            _int_at_least(1, tokens=True)),
        Key("flash_attn", "engine", "llama.cpp flash attention on/off", _flag),
        Key("type_k", "engine", "K cache type: f16, q8_0, q4_0...", _cache_type),
        Key("type_v", "engine", "V cache type (quantized needs flash_attn=True)", _cache_type),
        Key("n_gpu_layers", "engine", "layers offloaded to a GPU (-1: all)", _gpu_layers),
        Key("mmap", "engine", "map the model file (llama.cpp use_mmap)", _flag),
        Key("mlock", "engine", "lock the model in RAM (llama.cpp use_mlock)", _flag),
        Key("a", "ab", "A/B: side A (llama.cpp settings dict, model, callable or endpoint URL); runs interleave with b", _side),
        Key("b", "ab", "A/B: side B, compared with A by paired statistics", _side),
        Key("max_slowdown", "ab", "A/B: max B/A time ratio - 1 per phase, e.g. 0.05, '5%' or {'prefill': 0.03}", _relative),
        Key("min_speedup", "ab", "A/B: min B/A speed ratio per phase, e.g. 1.5 or {'decode': 1.2}", _relative),
        Key("repack", "engine", "llama.cpp weight repacking (use_extra_bufts, llama-bench --repack; default: on, off "
            "for quantized models on AMX CPUs)", _flag),
        Key("sample", "engine", "greedy sampling inside the timed decode loop (False: as llama-bench's tg)", _flag),
        Key("max_runs", "option", "baseline comparisons: measure more runs, `runs` at a time, while a verdict "
            "is INCONCLUSIVE, up to this many (default 3 x runs; = runs turns it off)", _int_at_least(1)),
        Key("layers", "option", "also time each layer (llama.cpp eval callback; in-process only)", _flag),
        Key("alpha", "setting", "family-wise significance level for baseline comparisons", _fraction(0, 1)),
        Key("threshold", "setting", "smallest change of a median that counts: 0.05 or '5%'", _fraction(0, 10)),
        Key("tail_threshold", "setting", "smallest change of the ITL p95 that counts: 0.10 or '10%'", _fraction(0, 10)),
    ]
}

BUDGET_KEYS = tuple(k for k, v in KEYS.items() if v.kind == "budget")
#: One choice, not two keys: a closer marker's (or ``measure()``'s) prompt of either kind
#: replaces a farther one's.
PROMPT_KEYS = frozenset({"prompt", "prompt_tokens"})


@dataclass(frozen=True)
class MarkerConfig:
    """Validated marker arguments, split by kind."""

    budgets: Mapping[str, float]
    workload: Mapping[str, Any]
    settings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: llama.cpp settings for this test (``engines.llama_cpp_native.EngineConfig`` fields), over the session's.
    engine: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: A/B keys (a, b, max_slowdown, min_speedup): the test compares two sides interleaved.
    ab: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_ab(self) -> bool:
        return "a" in self.ab and "b" in self.ab

    def merged(self, overrides: Mapping[str, Any]) -> "MarkerConfig":
        extra = validate(overrides)
        workload = dict(self.workload)
        # A prompt given here replaces the marker's prompt of either kind.
        if PROMPT_KEYS & extra.workload.keys():
            for key in PROMPT_KEYS:
                workload.pop(key, None)
        return MarkerConfig(
            budgets={**self.budgets, **extra.budgets},
            workload={**workload, **extra.workload},
            settings={**self.settings, **extra.settings},
            options={**self.options, **extra.options},
            engine={**self.engine, **extra.engine},
            ab={**self.ab, **extra.ab},
        )


def validate(kwargs: Mapping[str, Any], args: tuple[Any, ...] = ()) -> MarkerConfig:
    """Check marker keys and values; a ConfigError names the key and the allowed keys."""
    if args:
        raise ConfigError(
            f"llmperf marker takes keyword arguments only, got positional {args!r}; "
            f"allowed keys: {', '.join(KEYS)}"
        )
    by_kind: dict[str, dict[str, Any]] = {"budget": {}, "workload": {}, "setting": {}, "option": {}, "engine": {}, "ab": {}}
    for name, value in kwargs.items():
        key = KEYS.get(name)
        if key is None:
            raise ConfigError(f"unknown llmperf marker key {name!r}; allowed keys: {', '.join(KEYS)}")
        by_kind[key.kind][name] = key.check(name, value)
    if "prompt" in by_kind["workload"] and "prompt_tokens" in by_kind["workload"]:
        raise ConfigError("llmperf marker: give either 'prompt' or 'prompt_tokens', not both")
    return MarkerConfig(
        budgets=by_kind["budget"],
        workload=by_kind["workload"],
        settings=by_kind["setting"],
        options=by_kind["option"],
        engine=by_kind["engine"],
        ab=by_kind["ab"],
    )


def marker_help() -> str:
    """The text registered for ``pytest --markers``."""
    return "llmperf(**keys): measure LLM inference for this test and enforce budgets. Keys: " + ", ".join(
        f"{k.name} ({k.help})" for k in KEYS.values()
    )


GROUP = "llmperf"


def item_group(item: Any, perf: bool) -> str | None:
    if perf:
        return GROUP
    names = sorted(
        str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")
    )
    return "_".join(names) or None


def write_groups(folder: str, worker_id: str, groups: Iterable[tuple[str, str]]) -> None:
    path = Path(folder) / f"{worker_id}.tsv"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{nodeid}\t{group}\n" for nodeid, group in groups), encoding="utf-8")
    os.replace(tmp, path)


def read_groups(folder: str) -> dict[str, str]:
    groups: dict[str, str] = {}
    for path in sorted(Path(folder).glob("*.tsv")):
        for line in path.read_text(encoding="utf-8").splitlines():
            nodeid, _, group = line.rpartition("\t")
            if nodeid:
                groups[nodeid] = group
    return groups


def make_scheduler(config: Any, log: Any, folder: str) -> Any:
    from xdist.scheduler import LoadGroupScheduling

    class GroupFileScheduling(LoadGroupScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = read_groups(folder)
            group = self._groups.get(nodeid)
            return f"@{group}" if group is not None else super()._split_scope(nodeid)

    return GroupFileScheduling(config, log)


MARKER = "llmperf"
XDIST_GROUP = "llmperf"
PLUGIN_NAME = "llmperf-manager"
MARKER_CONFIG = pytest.StashKey[MarkerConfig]()
FIXTURE = pytest.StashKey["LLMPerf"]()
SESSION = pytest.StashKey["Session"]()
#: The JUnit properties the plugin put on an item (replaced when pytest-rerunfailures runs it again).
PROPERTIES = pytest.StashKey[list]()


def session_of(config: pytest.Config) -> "Session":
    return config.stash[SESSION]


def marker_config(item: pytest.Item) -> MarkerConfig | None:
    """Module, class and function markers merged; the closest one wins per key."""
    marks = list(item.iter_markers(MARKER))
    if not marks:
        return None
    kwargs: dict[str, Any] = {}
    args: tuple[Any, ...] = ()
    for mark in reversed(marks):
        if PROMPT_KEYS & mark.kwargs.keys():  # prompt and prompt_tokens are one choice
            for key in PROMPT_KEYS:
                kwargs.pop(key, None)
        kwargs.update(mark.kwargs)
        args += mark.args
    return validate(kwargs, args)


def uses_llmperf(item: pytest.Item) -> bool:
    return any(name.startswith("llmperf") for name in getattr(item, "fixturenames", ()))


def is_perf(item: pytest.Item) -> bool:
    """Measures or loads a model: the marker, or an ``llmperf*`` fixture."""
    return MARKER_CONFIG in item.stash or uses_llmperf(item)


def stash_markers(report: pytest.CollectReport) -> None:
    """Each collected item's merged marker (a bad one fails its module's collection, one line
    per item); a fixture user gets the mark, so ``-m "not llmperf"`` deselects it."""
    errors = []
    for node in report.result:
        if isinstance(node, pytest.Item):
            try:
                config = marker_config(node)
            except ConfigError as exc:
                errors.append(f"{node.nodeid}: {exc}")
                continue
            if config is not None:
                node.stash[MARKER_CONFIG] = config
            elif uses_llmperf(node):
                node.add_marker(MARKER)
    if errors:
        report.outcome = "failed"
        report.longrepr = "\n".join(errors)
        report.result = []


def select(config: pytest.Config, items: list[pytest.Item], skip: bool, only: bool) -> list[pytest.Item]:
    """The perf items to run: a marker-only test gets the ``llmperf`` fixture (requested here,
    not by an autouse fixture every plain test pays for); ``--llmperf-skip``/``-only`` skip."""
    perf = [i for i in items if is_perf(i)]
    for item in perf:
        names = getattr(item, "fixturenames", None)
        if MARKER_CONFIG in item.stash and names is not None and "llmperf" not in names:
            names.append("llmperf")
    if skip:
        for item in perf:
            item.add_marker(pytest.mark.skip(reason="llmperf test (--llmperf-skip)"))
        return []
    if only:
        perf_ids = {id(i) for i in perf}
        for item in items:
            if id(item) not in perf_ids:
                item.add_marker(pytest.mark.skip(reason="not an llmperf test (--llmperf-only)"))
    return perf


def group_on_worker(config: pytest.Config, items: list[pytest.Item], perf: list[pytest.Item]) -> None:
    """An xdist worker: llmperf tests in one group (``xdist_groups``) under ``--dist
    loadgroup``, else a warning that they may run side by side."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    dist = workerinput.get("llmperf_dist")
    if dist == "loadgroup":

        perf_ids = {id(i) for i in perf}
        for item in perf:
            item.add_marker(pytest.mark.xdist_group(XDIST_GROUP))
        groups = [(i.nodeid, item_group(i, id(i) in perf_ids)) for i in items]
        folder = workerinput.get("llmperf_groups_dir")
        if folder:
            write_groups(folder, workerinput["workerid"], [(n, g) for n, g in groups if g])
    elif perf:
        warnings.warn(
            pytest.PytestWarning(
                f"llmperf: {len(perf)} perf test(s) under pytest-xdist --dist {dist} may run side by side "
                "and measure each other; use --dist loadgroup (or -p no:xdist)"
            )
        )


def planned(items: list[pytest.Item]) -> tuple[int, dict[str, Any]]:
    """(tests that will measure, ``{nodeid: llama.cpp keys}`` their markers name)."""
    running = [i for i in items if is_perf(i) and not i.get_closest_marker("skip")]
    engines = {}
    for item in running:
        config = item.stash.get(MARKER_CONFIG, None)
        if config is not None and config.engine:
            engines[item.nodeid] = config.engine
    return len(running), engines


def header(config: pytest.Config, session: "Session", engine_note: str | None) -> list[str]:
    """``pytest_report_header``: under xdist the controller collects nothing itself, so it says
    here what its workers will measure, and how they are spread."""
    dist = getattr(config.option, "dist", "no")
    lines = session.describe(engine_note) if dist not in ("no", None) else []
    if dist == "loadgroup":
        lines.append("llmperf: pytest-xdist --dist loadgroup: llmperf tests run on one worker, others spread")
    elif dist not in ("no", None):
        lines.append(f"llmperf: pytest-xdist --dist {dist} may run llmperf tests side by side; use loadgroup")
    return lines


def terminal_width(config: pytest.Config) -> int:
    """The terminal's width (``$COLUMNS``, else the tty's, else 80): tables fit it."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    try:
        return int(tr._tw.fullwidth)
    except (AttributeError, TypeError, ValueError):
        import shutil

        return shutil.get_terminal_size().columns


def resolve_side(name: str, spec: Any, engine_for: Callable[[Mapping[str, Any]], Any]) -> Side:
    """A ``Side`` ready to run; ``engine_for(settings)``: the plugin's (or the caller's) engine
    for llama.cpp settings over the session's."""
    from ..judge.ab import Side  # numpy and scipy only once a test compares two sides

    spec = check_side(name, spec)
    if isinstance(spec, Mapping):
        label = " ".join(f"{k}={v}" for k, v in spec.items()) or "session engine"
        return Side(label, engine_for(spec))
    if isinstance(spec, str):
        if spec.startswith(("http://", "https://")):
            from ..core.redact import display
            from ..engines.http import HttpEngine

            return Side(display(spec), HttpEngine(spec))  # named as shown: no password, no api_key=
        return Side(spec, engine_for({"model": spec}))
    if hasattr(spec, "run") and hasattr(spec, "info"):
        return Side(spec.info().model, spec)
    return Side(getattr(spec, "__name__", repr(spec)), spec)
