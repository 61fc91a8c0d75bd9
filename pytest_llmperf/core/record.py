"""A measurement as it is stored: a baseline file's entry, a session file's ``record``.

``Record`` is what a baseline or session file holds, written by ``Record.of`` from a
``core.measurement.Measurement`` (the one place a measurement becomes its stored form): fewer
per-run fields than a fresh measurement (each run's judged metrics, ITL samples and parts, no
traces, no E2E per run), the summary, and the sections of where the time went. The workload
identity and the summary are typed parts of the Record (``StoredWorkload``, ``Summary``: frozen
dataclasses that write and read their own stored form, and read as its mapping too); the other
sections are typed by their stored form (``StoredMemory``... here, ``StabilityJson``,
``LayersJson``... beside the Measurement's section classes that write them). ``to_json`` writes the stored form
(the keys of today's entries, in their order) and ``from_json`` reads it back, checked against
``schemas/baselines.schema.json#/$defs/record`` first; ``read`` is that reader without the check
(a hand-made record, a damaged one the judge judges in part): the one place a stored record's
JSON is read as a mapping. The judge, the baselines, the history and the reports read the
``Record``. A key this version does not know (a newer pytest-llmperf's) is kept as it
came, in ``extra``, so a record read and written again is the record that was read (but for a
hand-made one without ``commit``: it is written ``null``)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, TypeAlias, TypedDict

from . import catalog
from .documents import validate
from .formats import JSONValue, sig6
from .measurement import StoredForm, StoredWorkload, Summary, workload_identity
from .workload import MEMORY_FIELDS, drawn

if TYPE_CHECKING:
    from .fingerprint import Fingerprint
    from .measurement import (
        JsonObject,
        LayersJson,
        LoadStats,
        MachineJson,
        Measurement,
        ModelLoadsJson,
        PromptLengthsJson,
        RooflineJson,
        Stability,
        StabilityJson,
        TraceReplay,
        TurnFigures,
    )

#: Per-run values by field (``runs``, ``parts``): one number per run.
PerRun: TypeAlias = "Mapping[str, Sequence[float]]"


class StoredMemory(TypedDict, total=False):
    """Memory, each figure from its most direct source: peak RSS of the engine's process over
    the runs, llama.cpp's reported buffers (``MEMORY_FIELDS``, MiB, with ``buffer_source``),
    the model file's mapping; the KV cache computed from the model's shape beside them."""

    kv_cache_bytes: int | None
    peak_rss_bytes: int
    peak_rss_scope: str
    rss_mib: float
    kv_mib: float
    compute_mib: float
    output_mib: float
    model_buffer_mib: float
    mapped_mib: float
    mapped_resident_mib: float
    buffer_source: str


class StoredPrompt(TypedDict, total=False):
    """A measured callable's prompt as llama.cpp saw it (the cache state, its tokens in the
    median run, those evaluated and reused) and its stream as the caller got it."""

    prompt_cache: str
    prompt_tokens: int | None
    evaluated_prompt_tokens: int | None
    prompt_reused_tokens: int | None
    sampler: str
    delivered_items: int
    delivered_ttft_ms: float | None
    delivered_e2e_ms: float | None
    delivered_burst_tokens: int | None
    turns: list[dict[str, JSONValue]]


class StoredLoad(TypedDict, total=False):
    """A load level's figures (the HTML report's throughput-latency curve); ``server``: the
    server's own (``ServerSide``'s fields, ``metrics`` as a plain object)."""

    concurrency: int
    rate_per_s: float | None
    n_requests: int
    n_ok: int
    output_tps: float
    requests_per_s: float
    goodput: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    prompt_cache: str | None
    server: dict[str, JSONValue]
    trace: StoredTrace


class StoredTrace(TypedDict):
    """A replayed trace (``TraceReplay``), only where one was: its requests, its arrival span on
    its own clock, the pace it was replayed at, and how late the client sent its requests
    against their schedule (sent - scheduled: the client's own lag), median and worst."""

    requests: int
    span_s: float
    speed: float
    send_lag_p50_ms: float
    send_lag_max_ms: float


@dataclass(frozen=True, kw_only=True)
class Record(StoredForm):
    """One stored measurement (module docstring). The fields are the stored keys in the order
    they are written; a section the measurement did not have is None (and not written). It is
    also a read-only mapping of its stored form (``record["summary"]``, ``dict(record)``: what
    ``to_json`` gives), as a ``pytest_llmperf_result`` hook read ``result.record`` before it was
    typed."""

    recorded_at: str | None = None
    commit: str | None = None
    hardware: JsonObject
    subject: JsonObject
    #: What must match for two records to be compared, with the run and warm-up counts.
    workload: StoredWorkload
    #: Per-run values of the judged metrics (the statistics' sampling unit), by run field.
    runs: PerRun
    #: Each run's inter-token latencies (ms).
    itl_ms: tuple[tuple[float, ...], ...] | None = None
    summary: Summary | None = None
    stability: StabilityJson | None = None
    #: Per-run values of each phase's parts (``catalog.PARTS``), by part.
    parts: PerRun | None = None
    layers: LayersJson | None = None
    #: ``Attribution.to_json`` (any value is accepted here: ``judge.attribution.readable``).
    attribution: JSONValue = None
    roofline: RooflineJson | None = None
    memory: StoredMemory | None = None
    prompt: StoredPrompt | None = None
    model_loads: ModelLoadsJson | None = None
    agreement: JsonObject | None = None
    load: StoredLoad | None = None
    machine: MachineJson | None = None
    # (before ``reference`` and ``sessions``, which are added to the stored dict after ``to_json``,
    # so a record read and written again keeps its keys' order)
    #: A prompt set's: each run's request and prompt tokens (a comparison pairs runs of the same request).
    requests: JsonObject | None = None
    #: Where the runs' prompts had different lengths: the figures by length (``PromptLengths``).
    prompt_lengths: PromptLengthsJson | None = None
    #: The machine's reference figure (``measuring.roofline.probe_reference``), after the runs.
    reference: JsonObject | None = None
    #: The levels of the baseline's last recorded sessions, per judged metric (a re-recorded
    #: baseline keeps them: the verdict's between-session noise).
    sessions: Mapping[str, Sequence[JsonObject]] | None = None
    #: Stored keys this version does not know, as they came.
    extra: JsonObject = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        m: Measurement,
        stability: Stability,
        kv_cache_bytes: int | None,
        fingerprint: Fingerprint | None = None,
        *,
        commit: str | None = None,
        recorded_at: str | None = None,
    ) -> Record:
        """``m`` as it is stored, with what ``measuring`` computed from it: its ``stability``
        (``measuring.metrics.diagnose``) and the KV cache from the model's shape."""
        loads, agreement, system = m.model_loads, m.agreement, m.system
        return cls(
            recorded_at=recorded_at,
            commit=commit,
            hardware=dict(fingerprint.hardware) if fingerprint else {},
            subject=dict(fingerprint.subject) if fingerprint else {},
            workload=replace(workload_identity(m), runs=m.asked.runs, warmup=m.asked.warmup),
            runs=_per_run_values(m, catalog.RUN_FIELDS, whole=False),
            itl_ms=tuple(tuple(sig6(v) for v in r.itl_ms) for r in m.runs),
            summary=summary_of(m),
            stability=stability.as_dict(),
            parts=_per_run_values(m, tuple(p.name for p in catalog.PARTS), whole=True) or None,
            layers=m.layers.as_dict() if m.layers is not None else None,
            # Asked for (``attribution=True``): compared when the baseline has one.
            attribution=m.attribution.to_json() if m.attribution is not None else None,
            roofline=m.roofline.as_dict() if m.roofline is not None else None,
            memory=_memory(m, kv_cache_bytes),
            prompt=stored_prompt(m) or None,
            model_loads=loads.as_dict() if loads is not None else None,
            agreement=agreement.as_dict() if agreement is not None else None,  # against --llmperf-against's REF
            load=_load(m.load) if m.load is not None else None,
            machine=system.as_dict(len(m.runs) + len(m.warmup_runs)) if system is not None else None,
            requests=stored_requests(m),
            prompt_lengths=m.prompt_lengths.as_dict() if m.prompt_lengths is not None else None,
        )

    def diagnosis(self) -> dict[str, JSONValue]:
        """Where the time went (the sections from ``stability`` to ``machine`` this record
        has): ``llmperf profile``'s JSON beside its figures."""
        names = [f.name for f in fields(self)]
        first, last = names.index("stability"), names.index("machine")
        return {k: v for k, v in self.to_json().items() if k in names[first : last + 1]}

    def to_json(self) -> dict[str, JSONValue]:
        """The stored form: every field that is not None, in order, then ``extra``."""
        out: dict[str, JSONValue] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.name not in _ALWAYS):
                continue
            out[f.name] = _plain(value)
        out.update({k: _plain(v) for k, v in self.extra.items()})
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str = "record") -> Record:
        """A stored record, checked against the schema first (``where``: its place in its file,
        for the one-line ``SchemaViolation``)."""
        validate(d, "baselines", "record", where)
        return cls.read(d)

    @classmethod
    def read(cls, d: Mapping[str, object]) -> Record:
        """A record as it came, unchecked (a hand-made one, a session file's checked by its own
        schema): a section of the wrong kind (not an object where one belongs) reads as None (an
        empty object for the four every record has), so the judge judges what it can and names
        the rest; the values inside a section are the judge's to check. Keys this version does
        not know are kept in ``extra``."""
        values = {k: _section(k, v) for k, v in d.items() if k in _NAMES}
        values.update({k: _section(k, {}) for k in _REQUIRED if values.get(k) is None})
        extra = {k: v for k, v in d.items() if k not in _NAMES}
        return cls(**{k: v for k, v in values.items() if v is not None}, extra=extra)  # type: ignore[arg-type]

    def at(self, *path: str) -> object:
        """The stored value at ``path`` (a section, then keys inside it), None where a step is
        missing or not an object: ``record.at("memory", "rss_mib")`` (the catalog's readers)."""
        value: object = getattr(self, path[0], None) if path[0] in _NAMES else self.extra.get(path[0])
        for part in path[1:]:
            value = value.get(part) if isinstance(value, Mapping) else None
        return value


#: The sections every record has (an empty object where a hand-made one lacks it).
_REQUIRED = ("hardware", "subject", "workload", "runs")
#: The sections stored as text (else an object), and the one that takes any value.
_TEXT = frozenset({"recorded_at", "commit"})
_NAMES = frozenset(f.name for f in fields(Record)) - {"extra"}


def _section(name: str, value: object) -> object:
    """A stored section as ``Record`` holds it, None where it is of the wrong kind: per-run
    lists as tuples (``runs``, ``parts``, ``itl_ms``)."""
    if name == "attribution":
        return value
    if name in _TEXT:
        return value if isinstance(value, str) else None
    if name == "itl_ms":
        return tuple(tuple(run) if isinstance(run, list) else run for run in value) if isinstance(value, list) else None
    if not isinstance(value, Mapping):
        return None
    if name in _TYPED:
        return _TYPED[name](value)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()} if name in ("runs", "parts") else value


#: The sections typed by their own stored form, each read by its ``from_json``.
_TYPED = {"workload": StoredWorkload.from_json, "summary": Summary.from_json}


#: Written even when None (a record holds ``"commit": null`` outside a git checkout).
_ALWAYS = frozenset({"commit"})


def _plain(value: object) -> JSONValue:
    """A field's value as JSON: a typed section as it writes itself, tuples as lists, mappings as dicts."""
    if isinstance(value, StoredForm):
        return value.to_json()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"not a JSON value: {value!r}")


def _per_run_values(m: Measurement, names: Sequence[str], *, whole: bool) -> dict[str, tuple[float, ...]]:
    """Per-run values by field, six significant figures; a field some run lacks (None: the
    engine cannot observe it) is left out; ``whole``: also one no run has (a part)."""
    out: dict[str, tuple[float, ...]] = {}
    for name in names:
        values = [getattr(r, name) for r in m.runs]
        if (values or not whole) and all(v is not None for v in values):
            out[name] = tuple(sig6(v) for v in values)
    return out


def stored_requests(m: Measurement) -> dict[str, JSONValue] | None:
    """A prompt set's runs (not a load test's: its requests overlap): run i's request, as
    ``Workload.request(i)`` drew it, and its prompt's tokens; None without a set, or where a
    run's prompt tokens are unknown."""
    w = m.asked
    lengths = [r.prompt_tokens for r in m.runs]
    if w.prompt_set is None or w.is_load or any(n is None for n in lengths):
        return None
    return {
        "request": [drawn(w.prompt_set, w.seed, i) for i in range(len(m.runs))],
        "prompt_tokens": [n for n in lengths if n is not None],
    }


def stored_turn(t: TurnFigures) -> dict[str, JSONValue]:
    return {
        "turn": t.turn,
        "runs": t.runs,
        "prompt_tokens": t.prompt_tokens,
        "evaluated_prompt_tokens": t.evaluated_tokens,
        "prompt_reused_tokens": t.reused_tokens,
        "ttft_p50_ms": sig6(t.ttft_p50_ms),
        "ttft_p95_ms": sig6(t.ttft_p95_ms),
        "tpot_ms": sig6(t.tpot_ms),
    }


def stored_prompt(m: Measurement) -> StoredPrompt:
    """Empty when the engine is the plugin's own (its prompt is the workload's), but for a
    conversation (its reuse and its turns)."""
    if m.prompt_reused_tokens is None and m.delivered_items is None and not m.turns:
        return {}
    out: StoredPrompt = {
        "prompt_cache": m.asked.prompt_cache,
        "prompt_tokens": m.prompt_tokens,
        "evaluated_prompt_tokens": m.evaluated_prompt_tokens,
        "prompt_reused_tokens": m.prompt_reused_tokens,
        "sampler": next((r.sampler for r in m.runs if r.sampler), ""),
    }
    if m.turns:  # a conversation: its figures turn by turn
        out["turns"] = [stored_turn(t) for t in m.turns]
    if m.delivered_items is not None:
        out.update(
            {
                "delivered_items": m.delivered_items,
                "delivered_ttft_ms": sig6(m.delivered_ttft_ms),
                "delivered_e2e_ms": sig6(m.delivered_e2e_ms),
                "delivered_burst_tokens": m.delivered_burst_tokens,
            }
        )
    return out


def _memory(m: Measurement, computed_kv_bytes: int | None) -> StoredMemory:
    memory: StoredMemory = {"kv_cache_bytes": computed_kv_bytes}
    if m.peak_rss is not None:
        rss = m.peak_rss
        memory.update({"peak_rss_bytes": rss.bytes, "peak_rss_scope": rss.scope, "rss_mib": sig6(rss.bytes / 2**20)})
    reported = {k: sig6(v) for k in MEMORY_FIELDS if (v := getattr(m.engine, k)) is not None}
    if reported:
        memory.update(reported)  # type: ignore[typeddict-item]
        memory["buffer_source"] = catalog.BUFFER_SOURCE
    return memory


def _load(s: LoadStats) -> StoredLoad:
    out: StoredLoad = {
        "concurrency": s.concurrency,
        "rate_per_s": s.rate_per_s,
        "n_requests": s.n_requests,
        "n_ok": s.n_ok,
        "output_tps": sig6(s.output_tps),
        "requests_per_s": sig6(s.requests_per_s),
        "goodput": sig6(s.goodput),
        "ttft_p50_ms": sig6(s.ttft.p50_ms),
        "ttft_p99_ms": sig6(s.ttft.p99_ms),
        "tpot_p50_ms": sig6(s.tpot.p50_ms),
        "tpot_p99_ms": sig6(s.tpot.p99_ms),
        "prompt_cache": s.prompt_cache,
    }
    if s.server is not None:
        server: dict[str, JSONValue] = {
            k: sig6(v) if isinstance(v, float) else v for k, v in vars(s.server).items() if k != "metrics"
        }
        server["metrics"] = dict(s.server.metrics or {})
        out["server"] = server
    if s.trace is not None:  # a trace replay: its summary (other load tests store as before)
        out["trace"] = stored_trace(s.trace)
    return out


def stored_trace(t: TraceReplay) -> StoredTrace:
    lags = t.lags_ms
    return {
        "requests": t.n_requests,
        "span_s": sig6(t.span_s),
        "speed": t.speed,
        "send_lag_p50_ms": sig6(statistics.median(lags)),
        "send_lag_max_ms": sig6(max(lags)),
    }


def summary_of(m: Measurement) -> Summary:
    return Summary(
        n_runs=m.n_runs,
        itl_count=m.itl.count if m.itl else None,
        figures={key: sig6(f.read(m)) for key, f in catalog.SUMMARY.items()},
    )
