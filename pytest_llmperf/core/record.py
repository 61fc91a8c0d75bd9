"""A measurement as it is stored: a baseline file's entry, a session file's ``record``.

``Record`` is what a baseline or session file holds, written by ``Record.of`` from a
``core.measurement.Measurement`` (the one place a measurement becomes its stored form): fewer
per-run fields than a fresh measurement (each run's judged metrics, ITL samples and parts, no
traces, no E2E per run), the summary, and the sections of where the time went. The workload
identity and the summary are typed parts of the Record (``StoredWorkload``, ``Summary``: frozen
dataclasses that write and read their own stored form, and read as its mapping too); the other
sections are typed by their stored form (``StoredLoad`` here, ``StabilityJson``,
``LayersJson``... beside the Measurement's section classes that write them), but for those a
record computes from the Measurement (``Machine``, ``Memory``, ``PromptSeen``, ``Requests``:
typed parts of ``core.measurement``, each read by its lenient ``read``). ``to_json`` writes the stored form
(the keys of today's entries, in their order) and ``from_json`` reads it back, checked against
``schemas/baselines.schema.json#/$defs/record`` first; ``read`` is that reader without the check
(a hand-made record, a damaged one the judge judges in part): the one place a stored record's
JSON is read as a mapping. The judge, the baselines, the history and the reports read the
``Record``. A key this version does not know (a newer pytest-llmperf's) is kept as it
came, in ``extra``, so a record read and written again is the record that was read (but for a
hand-made one without ``commit``: it is written ``null``)."""

from __future__ import annotations

import json
import statistics
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, TypeAlias, TypedDict

from . import catalog
from .documents import validate
from .formats import JSONValue, sig6
from .workload import ChatMessage, conversation_digest, prompt_set_digest, trace_digest

if TYPE_CHECKING:
    from .fingerprint import Fingerprint
    from .measurement import (
        JsonObject,
        LayersJson,
        LoadStats,
        Machine,
        Measurement,
        Memory,
        ModelLoadsJson,
        PromptLengthsJson,
        PromptSeen,
        Requests,
        RooflineJson,
        Stability,
        StabilityJson,
        TraceReplay,
    )

#: Per-run values by field (``runs``, ``parts``): one number per run.
PerRun: TypeAlias = "Mapping[str, Sequence[float]]"


class StoredForm(Mapping[str, JSONValue]):
    """A typed stored form that also reads as the read-only mapping of what its ``to_json``
    writes (``record["summary"]``, ``dict(record)``, ``"turn" in record.workload``): how a
    hook and the catalog's readers read a record before it was typed."""

    @abstractmethod
    def to_json(self) -> dict[str, JSONValue]: ...

    def __getitem__(self, key: str) -> JSONValue:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(frozen=True, kw_only=True)
class StoredWorkload(StoredForm):
    """What must match for two records to be compared (``WORKLOAD_KEYS``), with the run and
    warm-up counts (which may differ). ``shared_prefix_tokens`` and ``prompt_cache`` only when
    set, ``messages`` (a chat request's, as JSON text), ``prompt_set``, ``trace`` and
    ``conversation`` (their content hashes, a trace with its ``trace_speed``, a conversation with
    its judged ``turn``) too (so older baselines keep matching). The first six keys are written
    even where None (``null``); the others only where set. Read back by ``from_json``: a key of
    the wrong kind, or one this version does not know, is kept as it came in ``extra``, and a
    first-six key the stored workload lacked (a hand-made record's) in ``absent``, so it is
    written again as it was read."""

    prompt: str | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    concurrency: int | None = None
    rate: float | None = None
    shared_prefix_tokens: int | None = None
    prompt_cache: str | None = None
    messages: str | None = None
    prompt_set: str | None = None
    trace: str | None = None
    trace_speed: float | None = None
    conversation: str | None = None
    turn: int | None = None
    runs: int | None = None
    warmup: int | None = None
    #: Keys written even where None that the stored workload lacked.
    absent: frozenset[str] = frozenset()
    #: Stored keys of the wrong kind or that this version does not know, as they came.
    extra: JsonObject = field(default_factory=dict)

    def to_json(self) -> dict[str, JSONValue]:
        out: dict[str, JSONValue] = {}
        for name in _WORKLOAD_FIELDS:
            value = getattr(self, name)
            if value is not None or (name in _NULLABLE_IDENTITY and name not in self.absent):
                out[name] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> StoredWorkload:
        typed = {k: v for k, v in d.items() if k in _WORKLOAD_FIELDS and _holds(_WORKLOAD_FIELDS[k], v, k)}
        return cls(
            **typed,  # type: ignore[arg-type]  # each of its field's kind (_holds)
            absent=_NULLABLE_IDENTITY - set(d),
            extra={k: v for k, v in d.items() if k not in typed},  # type: ignore[misc]  # JSON as it came
        )


@dataclass(frozen=True, kw_only=True)
class Summary(StoredForm):
    """A record's ``summary``: ``n_runs``, ``itl_count`` and the catalog's ``SUMMARY`` figures
    (``figures``, by key, six significant figures; None where the measurement has none), written
    in this order. Read back by ``from_json``: a value of the wrong kind, or a key this version
    does not know, is kept as it came in ``extra``; a key the stored summary lacked (an older
    record's) is not written."""

    n_runs: int | None = None
    itl_count: int | None = None
    figures: Mapping[str, float | None] = field(default_factory=dict)
    #: Stored keys of the wrong kind or that this version does not know, as they came.
    extra: JsonObject = field(default_factory=dict)

    @classmethod
    def of(cls, m: Measurement) -> Summary:
        return cls(
            n_runs=m.n_runs, itl_count=m.itl.count, figures={key: sig6(f.read(m)) for key, f in catalog.SUMMARY.items()}
        )

    def to_json(self) -> dict[str, JSONValue]:
        counts = {"n_runs": self.n_runs, "itl_count": self.itl_count}
        return {**{k: v for k, v in counts.items() if v is not None}, **self.figures, **self.extra}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Summary:
        counts = {k: v for k, v in d.items() if k in ("n_runs", "itl_count") and _holds("int", v, k)}
        figures = {k: v for k, v in d.items() if k in catalog.SUMMARY and (v is None or _holds("float", v, k))}
        return cls(
            **counts,  # type: ignore[arg-type]  # ints (_holds)
            figures=figures,  # type: ignore[arg-type]  # numbers or None (_holds)
            extra={k: v for k, v in d.items() if k not in counts and k not in figures},  # type: ignore[misc]
        )


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
    memory: Memory | None = None
    prompt: PromptSeen | None = None
    model_loads: ModelLoadsJson | None = None
    agreement: JsonObject | None = None
    load: StoredLoad | None = None
    machine: Machine | None = None
    # (before ``reference`` and ``sessions``, which are added to the stored dict after ``to_json``,
    # so a record read and written again keeps its keys' order)
    #: A prompt set's: each run's request and prompt tokens (a comparison pairs runs of the same request).
    requests: Requests | None = None
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
        from .measurement import Machine, Memory, PromptSeen, Requests

        loads, agreement, system = m.model_loads, m.agreement, m.system
        return cls(
            recorded_at=recorded_at,
            commit=commit,
            hardware=dict(fingerprint.hardware) if fingerprint else {},
            subject=dict(fingerprint.subject) if fingerprint else {},
            workload=replace(workload_identity(m), runs=m.workload.runs, warmup=m.workload.warmup),
            runs=_per_run_values(m, catalog.RUN_FIELDS, whole=False),
            itl_ms=tuple(tuple(sig6(v) for v in r.itl_ms) for r in m.runs),
            summary=Summary.of(m),
            stability=stability.as_dict(),
            parts=_per_run_values(m, tuple(p.name for p in catalog.PARTS), whole=True) or None,
            layers=m.layers.as_dict() if m.layers is not None else None,
            # Asked for (``attribution=True``): compared when the baseline has one.
            attribution=m.attribution.to_json() if m.attribution is not None else None,
            roofline=m.roofline.as_dict() if m.roofline is not None else None,
            memory=Memory.of(m, kv_cache_bytes, catalog.BUFFER_SOURCE),
            prompt=PromptSeen.of(m),
            model_loads=loads.as_dict() if loads is not None else None,
            agreement=agreement.as_dict() if agreement is not None else None,  # against --llmperf-against's REF
            load=_load(m.load) if m.load is not None else None,
            machine=Machine.of(system, len(m.runs) + len(m.warmup_runs)) if system is not None else None,
            requests=Requests.of(m),
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
    if name in _MEASURED:
        return _measured_section(name, value)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()} if name in ("runs", "parts") else value


#: The sections typed by their own stored form, each read by its ``from_json``.
_TYPED = {"workload": StoredWorkload.from_json, "summary": Summary.from_json}
#: The sections ``core.measurement`` types (``Machine``...), each read by its ``read``: a damaged
#: one as it came, a value of the wrong kind or a key this version does not know in its ``extra``.
_MEASURED = frozenset({"machine", "memory", "prompt", "requests"})


def _measured_section(name: str, value: Mapping[str, object]) -> object:
    from . import measurement  # lazy: only a record that holds such a section needs it

    readers: dict[str, Callable[[Mapping[str, object]], object]] = {
        "machine": measurement.Machine.read,
        "memory": measurement.Memory.read,
        "prompt": measurement.PromptSeen.read,
        "requests": measurement.Requests.read,
    }
    return readers[name](value)


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


#: ``StoredWorkload``'s stored keys and the kind each holds (its field's annotation), in the
#: order they are written.
_WORKLOAD_FIELDS = {f.name: str(f.type) for f in fields(StoredWorkload) if f.name not in ("absent", "extra")}
#: What must match for two records' workloads to be compared (the run counts may differ).
WORKLOAD_KEYS = tuple(k for k in _WORKLOAD_FIELDS if k not in ("runs", "warmup"))
#: The identity's keys a record writes even where None (``null``).
_NULLABLE_IDENTITY = frozenset(WORKLOAD_KEYS[:6])
_KINDS: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float)}


def _holds(annotation: str, value: object, key: str) -> bool:
    """Whether ``value`` is of the kind a field annotated ``annotation`` (``int | None``...)
    holds (a bool is no number); None only where it is written as ``null``."""
    if value is None:
        return key in _NULLABLE_IDENTITY
    return isinstance(value, _KINDS.get(annotation.split(" ")[0], ())) and not isinstance(value, bool)


def workload_changes(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    """Differences between two records' workloads (``WORKLOAD_KEYS``), as ``key a -> b``."""
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in WORKLOAD_KEYS if a.get(k) != b.get(k)]


def workload_identity(m: Measurement) -> StoredWorkload:
    w = m.workload
    return StoredWorkload(
        prompt=w.prompt,
        # The workload's prompt as the engine tokenized it; a measured callable's is the one the
        # test gives it (what the callable builds from it, a system prompt added, is the user's
        # code under test: a change of it is judged and named, not a new workload). A prompt set's
        # lengths vary by run: its content hash names its prompts (none here, whatever the run count).
        prompt_tokens=w.prompt_tokens
        if m.engine.engine == "callable" or (w.prompt_set, w.trace, w.conversation) != (None, None, None)
        else m.prompt_tokens,
        max_tokens=w.max_tokens,
        seed=w.seed,
        # Load tests: a run under concurrency 4 is not comparable with one under concurrency 1.
        concurrency=w.concurrency,
        rate=w.rate,
        # Each of the rest only where set, so older baselines keep matching.
        shared_prefix_tokens=w.shared_prefix_tokens or None,  # served: a shared prefix measures the prompt cache
        prompt_cache=w.prompt_cache if w.prompt_cache != "cold" else None,  # a callable's warm prompt cache
        messages=chat_identity(w.messages) if w.messages is not None else None,  # a chat request's messages
        prompt_set=prompt_set_digest(w.prompt_set) if w.prompt_set is not None else None,  # its content hash
        # A trace: its content hash and the pace it is replayed at.
        trace=trace_digest(w.trace) if w.trace is not None else None,
        trace_speed=(w.trace_speed or 1.0) if w.trace is not None else None,
        conversation=conversation_digest(w.conversation) if w.conversation is not None else None,
        turn=w.turn,  # a conversation judged on one turn
    )


def chat_identity(messages: Sequence[ChatMessage]) -> str:
    """Chat messages as a workload's identity holds them: ``[[role, content], ...]`` as JSON."""
    return json.dumps([list(m) for m in messages], ensure_ascii=False)


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
