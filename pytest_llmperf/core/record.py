"""A measurement as it is stored: a baseline file's entry, a session file's ``record``.

``Record`` is what a baseline or session file holds, written by ``Record.of`` from a
``core.measurement.Measurement`` (the one place a measurement becomes its stored form): fewer
per-run fields than a fresh measurement (each run's judged metrics, ITL samples and parts, no
traces, no E2E per run), the summary, and the sections of where the time went. The workload
identity and the summary are typed parts of the Record (``StoredWorkload``, ``Summary``: frozen
dataclasses that write and read their own stored form, and read as its mapping too); the load
level, the model loads, the agreement and the figures by prompt length are the Measurement's
section classes (``LoadStats``... each writes and reads its stored form); the other
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

import json
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import TYPE_CHECKING, TypeAlias, TypedDict, TypeVar

from . import catalog
from .documents import validate
from .formats import JSONValue, sig6
from .workload import MEMORY_FIELDS, ChatMessage, conversation_digest, drawn, prompt_set_digest, trace_digest

if TYPE_CHECKING:
    from .fingerprint import Fingerprint
    from .measurement import (
        Agreement,
        JsonObject,
        LayersJson,
        LoadStats,
        MachineJson,
        Measurement,
        ModelLoads,
        PromptLengths,
        RooflineJson,
        Stability,
        StabilityJson,
        TurnFigures,
    )

#: A section ``Record`` holds typed (each reads and writes its stored form).
_Section = TypeVar("_Section", "ModelLoads", "Agreement", "LoadStats", "PromptLengths")

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
    model_loads: ModelLoads | None = None
    agreement: Agreement | None = None
    load: LoadStats | None = None
    machine: MachineJson | None = None
    # (before ``reference`` and ``sessions``, which are added to the stored dict after ``to_json``,
    # so a record read and written again keeps its keys' order)
    #: A prompt set's: each run's request and prompt tokens (a comparison pairs runs of the same request).
    requests: JsonObject | None = None
    #: Where the runs' prompts had different lengths: the figures by length (``PromptLengths``).
    prompt_lengths: PromptLengths | None = None
    #: The machine's reference figure (``measuring.roofline.probe_reference``), after the runs.
    reference: JsonObject | None = None
    #: The levels of the baseline's last recorded sessions, per judged metric (a re-recorded
    #: baseline keeps them: the verdict's between-session noise).
    sessions: Mapping[str, Sequence[JsonObject]] | None = None
    #: Sections of a Measurement's section class (``_SECTIONS``) that did not read into it, as
    #: they came, written in their place (the judge names what it cannot judge in them: ``at``
    #: reads them).
    unread: JsonObject = field(default_factory=dict)
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
            memory=_memory(m, kv_cache_bytes),
            prompt=stored_prompt(m) or None,
            model_loads=_stored(loads),
            agreement=_stored(agreement),  # against --llmperf-against's REF
            load=_stored(m.load),
            machine=system.as_dict(len(m.runs) + len(m.warmup_runs)) if system is not None else None,
            requests=stored_requests(m),
            prompt_lengths=_stored(m.prompt_lengths),
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
            value = self.unread.get(f.name, getattr(self, f.name))
            if f.name in ("unread", "extra") or (value is None and f.name not in _ALWAYS):
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
        the rest; the values inside a section are the judge's to check (a typed section that
        does not read, ``_SECTIONS``, is kept as it came in ``unread``). Keys this version does
        not know are kept in ``extra``."""
        values, unread = {}, {}
        for k, v in d.items():
            if k in _NAMES:
                try:
                    values[k] = _section(k, v)
                except (KeyError, TypeError, ValueError):  # a typed section it cannot read: kept as it came
                    unread[k] = v
        values.update({k: _section(k, {}) for k in _REQUIRED if values.get(k) is None})
        extra = {k: v for k, v in d.items() if k not in _NAMES}
        kept = {k: v for k, v in values.items() if v is not None}
        return cls(**kept, unread=unread, extra=extra)  # type: ignore[arg-type]

    def at(self, *path: str) -> object:
        """The stored value at ``path`` (a section, then keys inside it), None where a step is
        missing or not an object: ``record.at("memory", "rss_mib")`` (the catalog's readers)."""
        if path[0] in self.unread:
            value: object = self.unread[path[0]]
        else:
            value = getattr(self, path[0], None) if path[0] in _NAMES else self.extra.get(path[0])
        for part in path[1:]:
            value = value.get(part) if isinstance(value, Mapping) else _attribute(value, part)
        return value


def _attribute(value: object, name: str) -> object:
    """A typed section's field (or property) ``name``, None where it has none (or is not one)."""
    return getattr(value, name, None) if is_dataclass(value) and not isinstance(value, type) else None


def _stored(section: _Section | None) -> _Section | None:
    """A Measurement's section as a record holds it: as its stored form reads back (rounded)."""
    return None if section is None else type(section).from_json(section.to_json())


#: The sections every record has (an empty object where a hand-made one lacks it).
_REQUIRED = ("hardware", "subject", "workload", "runs")
#: The sections stored as text (else an object), and the one that takes any value.
_TEXT = frozenset({"recorded_at", "commit"})
_NAMES = frozenset(f.name for f in fields(Record)) - {"unread", "extra"}


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
    if name in _SECTIONS:
        return _section_reader(name)(value)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()} if name in ("runs", "parts") else value


#: The sections typed by their own stored form, each read by its ``from_json``.
_TYPED = {"workload": StoredWorkload.from_json, "summary": Summary.from_json}
#: The sections typed by a Measurement's section class, each read by its ``from_json``
#: (``_section_reader``); KeyError, TypeError, ValueError: it does not read (``Record.unread``).
_SECTIONS = frozenset({"model_loads", "agreement", "load", "prompt_lengths"})


def _section_reader(name: str) -> Callable[[Mapping[str, object]], object]:
    """The ``from_json`` of one of ``_SECTIONS``: imported here, as a record is read, so that
    importing this module does not import ``core.measurement`` (tests/test_architecture.py)."""
    from . import measurement

    readers: dict[str, Callable[[Mapping[str, object]], object]] = {
        "model_loads": measurement.ModelLoads.from_json,
        "agreement": measurement.Agreement.from_json,
        "load": measurement.LoadStats.from_json,
        "prompt_lengths": measurement.PromptLengths.from_json,
    }
    return readers[name]


#: Written even when None (a record holds ``"commit": null`` outside a git checkout).
_ALWAYS = frozenset({"commit"})


def _plain(value: object) -> JSONValue:
    """A field's value as JSON: a typed section as it writes itself, tuples as lists, mappings as dicts."""
    if isinstance(value, StoredForm):
        return value.to_json()
    if is_dataclass(value) and hasattr(value, "to_json"):  # a Measurement's section class (``_SECTIONS``)
        return _plain(value.to_json())
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


def stored_requests(m: Measurement) -> dict[str, JSONValue] | None:
    """A prompt set's runs (not a load test's: its requests overlap): run i's request, as
    ``Workload.request(i)`` drew it, and its prompt's tokens; None without a set, or where a
    run's prompt tokens are unknown."""
    w = m.workload
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
        "prompt_cache": m.workload.prompt_cache,
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
