"""The one record of a measurement: pure frozen data, at the bottom of the house.

``Measurement`` holds all runs of one workload on one engine (``RunMetrics`` each, pooled ITL
as ``LatencyStats``) and what was measured around them: a load test's ``LoadStats`` (with the
server's own ``ServerSide``), the system counters (``SystemDelta``), peak RSS, fresh model
loads, per-layer timing (``LayerProfile``), the attribution pass (``Attribution``), the
roofline and the output agreement with REF; and what storing adds (``baselines.records.stored``:
the fingerprint, the workload's identity ``StoredWorkload``, the ``Summary``, ``Stability``,
``Memory``, ``PromptSeen``, ``Machine``, ``Requests``). It writes its stored form itself
(``Measurement.to_json``: a baseline file's entry, a session file's record) and reads it back
(``from_json``, checked against ``schemas/baselines.schema.json``; ``read``, lenient), each
section by its own class's ``to_json`` / ``from_json``. Each type holds its fields and the small
properties that read only them; how they are computed from traces, the machine and the engine
stays in ``measuring/`` (``measuring.metrics.run_metrics``, ``summarize``, ``diagnose``...), and
no module here imports numpy, so the plugin loads this cheaply."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar, NamedTuple, Protocol, TypeAlias, TypedDict, TypeVar, cast

from .formats import JSONValue, fmt, sig6
from .schemas import validate_schema_file
from .workload import (
    MEMORY_FIELDS,
    ChatMessage,
    EngineInfo,
    Workload,
    conversation_digest,
    drawn,
    prompt_set_digest,
    trace_digest,
)

#: A JSON object: a stored section held as it came (the fingerprint's halves, what a file holds
#: that this version cannot read).
JsonObject: TypeAlias = "Mapping[str, JSONValue]"


class StoredForm(Mapping[str, JSONValue]):
    """A typed stored form that also reads as the read-only mapping of what its ``to_json``
    writes (``record["summary"]``, ``dict(record)``, ``"turn" in record.identity``): how a
    hook read a record before it was typed."""

    @abstractmethod
    def to_json(self) -> dict[str, JSONValue]: ...

    def __getitem__(self, key: str) -> JSONValue:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(frozen=True)
class LatencyStats:
    """Distribution summary of latency samples in milliseconds."""

    count: int
    mean_ms: float
    stdev_ms: float
    cv: float
    min_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float


@dataclass(frozen=True)
class RunMetrics:
    """One run (one request). ``None`` where the engine cannot observe the quantity, Read from a file
    (``Measurement.read``): a record keeps each run's ``RUN_COLUMNS``, ``PART_COLUMNS`` and ITLs
    (its output tokens and E2E follow from them); a value it does not keep is None, or NaN for the
    figures every fresh run has (0 output tokens without ITLs), and is not written back."""

    prompt_tokens: int | None
    output_tokens: int
    tokenize_ms: float
    ttft_ms: float
    prefill_ms: float | None
    prefill_tps: float | None
    tpot_ms: float
    decode_tps: float
    e2e_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    itl_ms: tuple[float, ...]
    native_prefill_ms: float | None = None
    native_decode_ms_per_token: float | None = None
    overhead_ms_per_token: float | None = None
    #: llama.cpp's sampler time per sampled token (inside the decode loop, or timed apart
    #: after the run when the engine does not sample between clock reads).
    sampling_ms_per_token: float | None = None
    #: TTFT less tokenization and llama.cpp's prompt evaluation: before the first token reaches
    #: the caller, the time outside llama.cpp (the caller's code, Python, a server's queue and
    #: network, the stream).
    prefill_outside_ms: float | None = None
    #: TPOT less llama.cpp's evaluation, the sampling inside the run and the user's Python
    #: logits processors and stopping criteria, per token: the time between tokens outside
    #: llama.cpp (never below zero: ``clock_gaps`` says where clock and counters disagree).
    decode_outside_ms_per_token: float | None = None
    #: The prompt's tokens llama.cpp did not evaluate (a prompt cache held them); None: unknown.
    prompt_reused_tokens: int | None = None
    #: The user's Python logits processors and stopping criteria per generated token.
    python_sampling_ms_per_token: float | None = None
    #: What the caller received, where the tokens were stamped where llama.cpp made them (a
    #: callable on a Llama the plugin sees): items, its TTFT, its E2E, and the most tokens one
    #: item carried (held-back text released in a burst). None: the items are the tokens.
    delivered_items: int | None = None
    delivered_ttft_ms: float | None = None
    delivered_e2e_ms: float | None = None
    delivered_burst_tokens: int | None = None
    #: (part, ms below zero) where llama.cpp's counters exceed the clock's time of a phase.
    clock_gaps: tuple[tuple[str, float], ...] = ()
    #: What llama.cpp's sampler chain held beyond the usual ("grammar"; "": nothing more).
    sampler: str = ""
    #: Which turn of a conversation this run is (1-based; None: not a conversation).
    turn: int | None = None
    #: llama.cpp generations the run made tokens in (``RunTrace.generations``): its figures are
    #: the one's that made the most.
    generations: int = 1


@dataclass(frozen=True)
class SystemSample:
    load_1m: float | None
    cpu_mhz: float | None
    minor_faults: int
    major_faults: int
    involuntary_switches: int
    #: (steal, total) CPU ticks of the whole machine so far (/proc/stat), None where unknown.
    cpu_ticks: tuple[int, int] | None = None
    #: (on-CPU ns, runqueue-wait ns) summed over the engine process's threads
    #: (/proc/PID/task/*/schedstat), None where the kernel does not say.
    engine_sched_ns: tuple[int, int] | None = None
    #: (busy ticks of the whole machine, of the engine process, of this process), None where unknown.
    busy_ticks: tuple[int, int, int] | None = None


#: The engine's threads waiting for a CPU, or preempted, are other processes' doing only where
#: those used at least this share of the machine's CPU time (more than at baseline, for a
#: verdict); where none did, the engine's threads took turns with each other: more threads than
#: cores is the subject's setting (threads 2 -> 4 on 2 cores: TPOT x2.2, the run queue 42%,
#: others 0%), never a busy machine.
OTHERS_PRESENT = 0.05


@dataclass(frozen=True)
class SystemDelta:
    before: SystemSample
    after: SystemSample

    @property
    def major_faults(self) -> int:
        return self.after.major_faults - self.before.major_faults

    @property
    def minor_faults(self) -> int:
        return self.after.minor_faults - self.before.minor_faults

    @property
    def involuntary_switches(self) -> int:
        return self.after.involuntary_switches - self.before.involuntary_switches

    @property
    def steal_share(self) -> float | None:
        """Share of all CPUs' time between the samples that the hypervisor gave to others."""
        if self.before.cpu_ticks is None or self.after.cpu_ticks is None:
            return None
        steal = self.after.cpu_ticks[0] - self.before.cpu_ticks[0]
        total = self.after.cpu_ticks[1] - self.before.cpu_ticks[1]
        return steal / total if total > 0 and steal >= 0 else None

    @property
    def cpu_wait_share(self) -> float | None:
        """Share of the engine threads' runnable time spent waiting for a CPU (the run queue:
        other processes, or more threads than CPUs) during the runs; None where unknown."""
        if self.before.engine_sched_ns is None or self.after.engine_sched_ns is None:
            return None
        run = self.after.engine_sched_ns[0] - self.before.engine_sched_ns[0]
        wait = self.after.engine_sched_ns[1] - self.before.engine_sched_ns[1]
        return wait / (run + wait) if run >= 0 and wait >= 0 and run + wait > 0 else None

    @property
    def others_cpu_share(self) -> float | None:
        """Share of the machine's CPU time (all CPUs) that processes other than the engine and
        this one used during the runs; None where unknown."""
        if self.before.busy_ticks is None or self.after.busy_ticks is None or self.before.cpu_ticks is None:
            return None
        if self.after.cpu_ticks is None:
            return None
        machine, engine, own = (a - b for a, b in zip(self.after.busy_ticks, self.before.busy_ticks))
        total = self.after.cpu_ticks[1] - self.before.cpu_ticks[1]
        if total <= 0:
            return None
        return min(1.0, max(0.0, (machine - engine - own) / total))


# -- reading a stored section back (``from_json``): each value of its kind, else TypeError ------


def _object(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise TypeError(f"not an object: {type(value).__name__}")
    return value


def _array(value: object) -> list[object]:
    """An array (a hand-made record's may be any iterable of values: a numpy array)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"not an array: {type(value).__name__}")
    return list(value)


def _wrong_kind(value: object, what: str) -> Exception:
    """A text where a number belongs is a ValueError (as ``float("fast")``), another kind a TypeError."""
    if isinstance(value, str):
        return ValueError(f"not {what}: {value[:40]!r}")
    return TypeError(f"not {what}: {type(value).__name__}")


def _number(value: object) -> float:
    """A stored number, kept as it came (an integer stays one, so it is written back as it was)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_kind(value, "a number")
    return value


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_kind(value, "an integer")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not a string: {type(value).__name__}")
    return value


def _pair(value: object) -> tuple[int, int]:
    lo, hi = _array(value)
    return _count(lo), _count(hi)


#: A stored scalar's reader by the annotation of the field that holds it.
_SCALARS: dict[str, Callable[[object], object]] = {"int": _count, "float": _number, "str": _text}


def _as(annotation: str, value: object) -> object:
    """A stored value as a field annotated ``annotation`` holds it (this module writes its
    annotations as text): ``X | None``, ``tuple[X, ...]``, ``tuple[int, int]``, ``Mapping[str, X]``,
    a scalar, or a section class of this module read by its ``from_json``."""
    if annotation.endswith(" | None"):
        return None if value is None else _as(annotation.removesuffix(" | None"), value)
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        return tuple(_as(annotation[6:-6], v) for v in _array(value))
    if annotation == "tuple[int, int]":
        return _pair(value)
    if annotation.startswith("Mapping[str, "):
        return {str(k): _as(annotation[13:-1], v) for k, v in _object(value).items()}
    if annotation in _SCALARS:
        return _SCALARS[annotation](value)
    return globals()[annotation].from_json(_object(value))


_D = TypeVar("_D")


def _stored_section(cls: type[_D], d: Mapping[str, object], **keys: str) -> _D:
    """A section class from its stored form ``d``: each field from its key (``keys``: where that is
    not the field's name), read as its annotation says (``_as``); a field with a default (one a
    record does not keep) may be absent. KeyError, TypeError or ValueError where ``d`` is not one."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # a dataclass of this module
        key = keys.get(f.name, f.name)
        if key in d or _required(f):
            values[f.name] = _as(str(f.type), d[key])
    return cls(**values)


def _required(f: dataclasses.Field[object]) -> bool:
    """A field without a default."""
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _written(annotation: str, value: object) -> JSONValue:
    """A field's value as a record stores it, as its annotation ``annotation`` says (``_as`` reads
    it back): a float to six significant figures, a tuple as a list, a section by its ``to_json``."""
    annotation = annotation.removesuffix(" | None")
    if value is not None and annotation == "float":
        return sig6(cast("float", value))
    if value is not None and annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        return [_written(annotation[6:-6], v) for v in cast("tuple[object, ...]", value)]
    return _plain(value)


_F = TypeVar("_F", bound="_Fields")


class _Fields:
    """A section whose stored form is its fields in order: ``to_json`` writes each as its annotation
    says (``_written``), ``from_json`` reads them back (``_stored_section``). ``KEYS``: a field's
    stored key where it is not its name; ``UNSTORED``: the fields ``to_json`` does not write (a
    record read back holds their defaults; one without a default is given by the caller, or the
    class writes it itself); ``EXACT``: numbers written as they are (not to six significant
    figures); ``WHERE_SET``: the fields written only where they are not None. ``ServerSide`` and
    ``LoadSample`` write their own: a number kept as its kind (an int in a float field stays one)."""

    KEYS: ClassVar[Mapping[str, str]] = {}
    UNSTORED: ClassVar[frozenset[str]] = frozenset()
    EXACT: ClassVar[frozenset[str]] = frozenset()
    WHERE_SET: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, JSONValue]:
        out: dict[str, JSONValue] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # a dataclass of this module
            value = getattr(self, f.name)
            if f.name not in self.UNSTORED and (value is not None or f.name not in self.WHERE_SET):
                out[self.KEYS.get(f.name, f.name)] = (
                    _plain(value) if f.name in self.EXACT else _written(str(f.type), value)
                )
        return out

    @classmethod
    def from_json(cls: type[_F], d: Mapping[str, object]) -> _F:  # noqa: PYI019 (typing.Self: Python 3.11)
        """``to_json`` read back (every key it writes, but ``WHERE_SET``'s where None); KeyError,
        TypeError or ValueError where a key is missing or of the wrong kind. A key of an
        ``UNSTORED`` field with a default is not read (a record never holds it); one without a
        default is the caller's (a phase: its key)."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # a dataclass of this module
        written = {f.name for f in fields} - cls.UNSTORED - cls.WHERE_SET
        if missing := [key for name in written if (key := cls.KEYS.get(name, name)) not in d]:
            raise KeyError(", ".join(sorted(missing)))
        unread = {f.name for f in fields if f.name in cls.UNSTORED and not _required(f)}
        return _stored_section(cls, {k: v for k, v in d.items() if k not in unread}, **cls.KEYS)


@dataclass(frozen=True)
class Stability(_Fields):
    """What the runs say about their own steadiness; ``warnings`` are plain-words sentences."""

    n_runs: int
    tpot_cv: float
    tpot_spread_pct: float  # (max - min) / median of per-run TPOT
    ttft_cv: float
    first_run_slowdown: float | None  # warm-up run TPOT / median TPOT of the measured runs
    first_run_ttft_slowdown: float | None
    first_token_slowdown: float  # median over runs of (first ITL / that run's median ITL)
    context_slope_us_per_token: float | None  # ITL growth per token of context (decode)
    context_span: tuple[int, int] | None  # context positions the slope was fitted over
    far_runs: tuple[int, ...]  # indices of runs far off the others
    warnings: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class LoadStats(_Fields):
    """What only a load test shows; ``Measurement.runs`` holds the successful requests. The
    fields down to ``trace`` are what a record stores (``to_json``: a level's figures, the HTML
    report's throughput-latency curve); the rest are not stored: None (``errors``: empty) when
    read from a file (``from_json``). It is also equal to its stored form (a mapping)."""

    concurrency: int
    rate_per_s: float | None
    n_requests: int
    n_ok: int
    output_tps: float  # all output tokens / duration
    requests_per_s: float  # successful requests / duration
    goodput: float  # share of all requests meeting the SLOs (and not failed)
    ttft_p50_ms: float  # the successful requests' TTFT median and p99 (``ttft``'s)
    ttft_p99_ms: float
    tpot_p50_ms: float  # ... and their TPOT's (``tpot``'s)
    tpot_p99_ms: float
    prompt_cache: str | None = None  # served: what the server's prompt cache was allowed to do
    server: ServerSide | None = None  # llama-server's own timings and /metrics, when it gave them
    trace: TraceReplay | None = None  # a trace replay's schedule and how late the client sent
    # Not stored: None (``errors``: empty) when read from a file.
    errors: tuple[str, ...] = ()  # "request 3: <reason>", one per failed request
    duration_s: float | None = None  # first send to last token
    ttft: LatencyStats | None = None
    tpot: LatencyStats | None = None
    e2e: LatencyStats | None = None
    output_tps_per_request: float | None = None  # median over requests of output tokens / E2E
    slo: Mapping[str, float] | None = None

    UNSTORED = frozenset({"errors", "duration_s", "ttft", "tpot", "e2e", "output_tps_per_request", "slo"})
    EXACT = frozenset({"rate_per_s"})
    WHERE_SET = frozenset({"server", "trace"})  # a trace replay: its summary (other load tests store as before)

    @property
    def n_failed(self) -> int:
        return self.n_requests - self.n_ok

    def __eq__(self, other: object) -> bool:
        """Equal to a ``LoadStats`` of equal fields, or to its stored form (``to_json``)."""
        if isinstance(other, Mapping):
            return self.to_json() == other
        if not isinstance(other, LoadStats):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(self))


@dataclass(frozen=True)
class TraceReplay(_Fields):
    """A replayed trace (``Workload.trace``): its length and pace, and when each request was
    sent against its schedule, seconds from the first send's planned time. The lag (sent -
    scheduled) is the client's own: a request sent late is this process's delay, not the
    server's (every request is sent at its time whatever the server's backlog). A record
    stores the lag's median and worst (``send_lag_p50_ms``, ``send_lag_max_ms``: computed when
    built, ``of``), not the schedule: ``scheduled_s`` and ``sent_s`` are not stored (empty when
    read from a file)."""

    n_requests: int
    span_s: float  # the trace's arrival span on its own clock (last t_s - first t_s)
    speed: float  # replayed ``speed`` times faster than recorded
    send_lag_p50_ms: float
    send_lag_max_ms: float
    scheduled_s: tuple[float, ...] = ()  # each request's send time (its t_s from the first, / speed)
    sent_s: tuple[float, ...] = ()  # when the client began each request, on the same clock

    KEYS: ClassVar[Mapping[str, str]] = {"n_requests": "requests"}
    UNSTORED = frozenset({"scheduled_s", "sent_s"})
    EXACT = frozenset({"speed"})

    @classmethod
    def of(
        cls, n_requests: int, span_s: float, speed: float, scheduled_s: Sequence[float], sent_s: Sequence[float]
    ) -> TraceReplay:
        lags = [(sent - due) * 1000 for sent, due in zip(sent_s, scheduled_s)]
        return cls(
            n_requests, span_s, speed, float(statistics.median(lags)), max(lags), tuple(scheduled_s), tuple(sent_s)
        )

    @property
    def lags_ms(self) -> tuple[float, ...]:
        return tuple((sent - due) * 1000 for sent, due in zip(self.sent_s, self.scheduled_s))


@dataclass(frozen=True)
class ServerSide(_Fields):
    """Medians over the requests that carried timings; ``metrics``: /metrics over the level."""

    n_timed: int
    prompt_tokens_median: float | None  # the prompt's length (usage.prompt_tokens)
    prompt_n_min: int | None  # prompt tokens the server evaluated (the rest came from its cache)
    prompt_n_median: float | None
    prompt_n_max: int | None
    server_prompt_ms_p50: float | None
    ttft_gap_ms_p50: float | None  # client TTFT - server prompt_ms
    server_ms_per_token_p50: float | None  # predicted_ms / predicted_n
    tpot_gap_ms_p50: float | None  # client TPOT - server ms per predicted token
    metrics: Mapping[str, float] | None = None  # llamacpp:* counters' change over the level
    # Sum over requests of prompt length - prompt_n: prompt tokens the server took from its cache.
    prompt_tokens_from_cache: int | None = None

    @property
    def tokens_per_decode(self) -> float | None:
        """Generated tokens per llama_decode call (> 1: requests were batched together)."""
        m = self.metrics or {}
        n = m.get("n_decode_total")
        return m["tokens_predicted_total"] / n if n and "tokens_predicted_total" in m else None

    def to_json(self) -> dict[str, JSONValue]:
        """Each field (a float to six significant figures), ``metrics`` last, as a plain object."""
        out: dict[str, JSONValue] = {
            k: sig6(v) if isinstance(v, float) else v for k, v in vars(self).items() if k != "metrics"
        }
        out["metrics"] = dict(self.metrics or {})
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> ServerSide:
        """``to_json`` read back; ``metrics`` is always written as an object, so a null one is
        not a stored server side (TypeError: the load section is kept unread, as it came)."""
        _object(d["metrics"])
        return super().from_json(d)


@dataclass(frozen=True)
class PeakRss:
    bytes: int
    scope: str  # "measurement" (peak reset before it) or "process" (lifetime peak)


#: A load counts as cold when at most this share of the model file was in the page cache just
#: before it; otherwise it is warm, whatever was asked.
COLD_RESIDENT_MAX = 0.05


EVICTION_FAILED = "eviction did not take: another process maps the model file, or the file system keeps it"


@dataclass(frozen=True)
class LoadSample(_Fields):
    """One fresh engine: its load (``EngineInfo.load_ms``, llama.cpp's ``t_load_ms``), its time
    to first token (load + the first, slow evaluation + its first request's TTFT: llama.cpp's
    start-up, not the engine's own bookkeeping nor a worker process's start), and the share of
    the model file resident in the page cache just before loading (None: unknown)."""

    load_ms: float
    native_load_ms: float | None
    fresh_ttft_ms: float | None
    resident_share: float | None

    @property
    def cold(self) -> bool:
        return self.resident_share is not None and self.resident_share <= COLD_RESIDENT_MAX

    def to_json(self) -> dict[str, JSONValue]:
        """Each field, a float to six significant figures."""
        return {k: sig6(v) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class ModelLoads(_Fields):
    """Fresh loads of the engine's model (``asked``: "warm" or "cold") and what they were,
    computed from the samples when built (``of``) and stored as they are (a median of rounded
    samples is not the rounded median): ``page_cache`` "cold" only when every eviction took,
    "warm" when none did; ``evidence`` ("at most 0% of the file resident before each load",
    mincore); ``note``: a cold load asked for that did not get one; the load and fresh-engine
    TTFT medians."""

    asked: str
    page_cache: str
    evidence: str
    note: str
    load_ms: float
    fresh_ttft_ms: float | None
    samples: tuple[LoadSample, ...]

    @classmethod
    def of(cls, asked: str, samples: Sequence[LoadSample]) -> ModelLoads:
        cold = sum(s.cold for s in samples)
        page_cache = (
            "cold" if cold == len(samples) else "warm" if cold == 0 else f"mixed ({cold} of {len(samples)} cold)"
        )
        shares = [s.resident_share for s in samples if s.resident_share is not None]
        ttfts = [s.fresh_ttft_ms for s in samples if s.fresh_ttft_ms is not None]
        return cls(
            asked,
            page_cache,
            f"at most {max(shares):.0%} of the file resident before each load" if shares else "residency unknown",
            EVICTION_FAILED if asked == "cold" and page_cache != "cold" else "",
            float(statistics.median(s.load_ms for s in samples)),
            float(statistics.median(ttfts)) if ttfts else None,
            tuple(samples),
        )

    def describe(self) -> str:
        """The page-cache state with its evidence: "cold (at most 0% of the file resident before
        each load)"; a cold load asked for that did not get one says so."""
        text = f"{self.page_cache} ({self.evidence})"
        if self.asked == "cold" and self.page_cache != "cold":
            text += f"; {EVICTION_FAILED}"
        return text


@dataclass(frozen=True)
class Peak:
    """A peak figure and where it came from: "measured" (with the probe's details) or "given"."""

    value: float
    source: str
    detail: str = ""


#: A memory-bound phase that moved its bytes faster than the measured DRAM peak: its working
#: set (weights + KV) stays in the CPU caches between tokens, so DRAM bandwidth does not bound
#: it and a "utilisation" above 100% would be no utilisation at all.
CACHE_RESIDENT = "cache-resident"


@dataclass(frozen=True)
class PhaseRoofline(_Fields):
    phase: str
    bytes_per_token: float
    flops_per_token: float
    intensity_flop_per_byte: float
    bound_tps: float
    achieved_tps: float
    achieved_bw_gbs: float
    mbu: float
    mfu: float
    verdict: str  # "memory-bound" | "compute-bound" | "cache-resident"
    note: str = ""  # why the DRAM roofline does not apply (cache-resident), else ""
    #: Stored keys the stored phase lacked (a hand-made record's ``note``): not written.
    absent: tuple[str, ...] = ()

    UNSTORED = frozenset({"phase", "absent"})  # phase: its key

    def line(self) -> str:
        mbu = (
            "MBU n/a (fits in cache)"
            if self.verdict == CACHE_RESIDENT
            else "MBU n/a"
            if self.note
            else f"MBU {self.mbu:.2f}"
        )
        text = (
            f"{self.phase}: {self.verdict} (intensity {self.intensity_flop_per_byte:.3g} FLOP/byte), "
            f"achieved {self.achieved_tps:.1f} t/s of bound {self.bound_tps:.1f} t/s, "
            f"{self.achieved_bw_gbs:.1f} GB/s, {mbu}, MFU {self.mfu:.2f}"
        )
        return text + (f"; {self.note}" if self.note else "")

    def to_json(self) -> dict[str, JSONValue]:
        return {k: v for k, v in super().to_json().items() if k not in self.absent}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> PhaseRoofline:
        """``to_json`` read back, with its ``phase`` (its key); only ``note`` may be missing."""
        return _stored_section(cls, {**d, "absent": _absent(d, ("note",))})


def _absent(d: Mapping[str, object], optional: Sequence[str]) -> tuple[str, ...]:
    """The ``optional`` keys a stored section lacks (a hand-made record's), in order."""
    return tuple(k for k in optional if k not in d)


class PhaseRooflineJson(TypedDict):
    """A ``PhaseRoofline`` as a record stores it (without its phase: its key)."""

    bytes_per_token: float
    flops_per_token: float
    intensity_flop_per_byte: float
    bound_tps: float
    achieved_tps: float
    achieved_bw_gbs: float
    mbu: float
    mfu: float
    verdict: str
    note: str


class RooflineJson(TypedDict):
    """``Roofline`` as a record stores it."""

    peak_bw_gbs: float
    peak_bw_source: str
    peak_bw_detail: str
    peak_tflops: float
    peak_tflops_source: str
    peak_tflops_detail: str
    machine_balance_flop_per_byte: float
    context_tokens: float
    weights_bytes: int
    decode: PhaseRooflineJson | None
    prefill: PhaseRooflineJson | None


#: ``Roofline``'s stored keys a hand-made record may lack (read as "", 0 or None; not written):
#: all but the peaks and the decode phase.
ROOFLINE_OPTIONAL = tuple(k for k in RooflineJson.__annotations__ if k not in ("peak_bw_gbs", "peak_tflops", "decode"))


@dataclass(frozen=True)
class Roofline:
    peak_bw: Peak
    peak_tflops: Peak
    context_tokens: float  # mean context position of the decoded tokens
    weights_bytes: int
    #: Not stored: None when read from a file.
    kv_bytes_per_token_of_context: float | None
    decode: PhaseRoofline
    prefill: PhaseRoofline | None
    #: The machine balance as stored (read from a file); None: computed from the peaks.
    stored_balance: float | None = None
    #: Stored keys the stored roofline lacked (``ROOFLINE_OPTIONAL``, a hand-made record's): not written.
    absent: tuple[str, ...] = ()

    @property
    def machine_balance_flop_per_byte(self) -> float:
        if self.stored_balance is not None:
            return self.stored_balance
        return self.peak_tflops.value * 1e12 / (self.peak_bw.value * 1e9)

    def has(self, key: str) -> bool:
        """Whether the stored form holds ``key`` (a hand-made record's may lack one)."""
        return key not in self.absent

    def to_json(self) -> RooflineJson:
        out = {
            "peak_bw_gbs": sig6(self.peak_bw.value),
            "peak_bw_source": self.peak_bw.source,
            "peak_bw_detail": self.peak_bw.detail,
            "peak_tflops": sig6(self.peak_tflops.value),
            "peak_tflops_source": self.peak_tflops.source,
            "peak_tflops_detail": self.peak_tflops.detail,
            "machine_balance_flop_per_byte": sig6(self.machine_balance_flop_per_byte),
            "context_tokens": sig6(self.context_tokens),
            "weights_bytes": self.weights_bytes,
            "decode": self.decode.to_json(),
            "prefill": self.prefill.to_json() if self.prefill is not None else None,
        }
        return cast("RooflineJson", {k: v for k, v in out.items() if k not in self.absent})

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Roofline:
        """``to_json`` read back (the peaks and the decode phase at least: ``ROOFLINE_OPTIONAL``
        may be missing); KeyError, TypeError or ValueError where a value is missing or of the
        wrong kind."""
        prefill = d.get("prefill")
        balance = d.get("machine_balance_flop_per_byte")
        return cls(
            Peak(_number(d["peak_bw_gbs"]), _text(d.get("peak_bw_source", "")), _text(d.get("peak_bw_detail", ""))),
            Peak(
                _number(d["peak_tflops"]),
                _text(d.get("peak_tflops_source", "")),
                _text(d.get("peak_tflops_detail", "")),
            ),
            _number(d.get("context_tokens", 0.0)),
            _count(d.get("weights_bytes", 0)),
            None,
            PhaseRoofline.from_json({**_object(d["decode"]), "phase": "decode"}),
            None if prefill is None else PhaseRoofline.from_json({**_object(prefill), "phase": "prefill"}),
            stored_balance=None if balance is None else _number(balance),
            absent=_absent(d, ROOFLINE_OPTIONAL),
        )


#: Outlier rule: a layer slower than median + OUTLIER_MAD_FACTOR x MAD of the layers (and
#: at least OUTLIER_MIN_EXCESS above the median, so a model of identical layers with a tiny MAD
#: does not flag noise).
OUTLIER_MAD_FACTOR = 5.0


OUTLIER_MIN_EXCESS = 0.25


OUTLIER_RULE = (
    f"median + {OUTLIER_MAD_FACTOR:g} x MAD of layers 1..N-1 (and > {1 + OUTLIER_MIN_EXCESS:g} x median); "
    "the first segment (embedding, step setup) and the output head are reported apart"
)


HEAD_NAME = "output"


@dataclass(frozen=True)
class PhaseLayers:
    """Per-segment medians of one phase (prefill or decode) over the instrumented runs.

    ``names``: "embd+layer 0", "layer 1", ..., "output"; ``median_ms`` per segment (per step
    for decode); ``step_ms``: median instrumented step, between the engine's timed loop's
    clock reads (prefill: start to logits ready; decode: token to token, so with sampling
    inside the loop the sampling is in the step and in no segment);
    ``per_run_ms``: per run, each segment's median (the sampling unit for comparisons).
    """

    phase: str
    names: tuple[str, ...]
    median_ms: tuple[float, ...]
    # 0 or empty where a hand-made record lacks them (``LAYERS_PHASE_OPTIONAL``):
    step_ms: float = 0.0
    n_runs: int = 0
    n_steps: int = 0
    per_run_ms: tuple[tuple[float, ...], ...] = ()
    outliers: tuple[str, ...] = ()
    coverage: float = 0.0  # median over steps of (sum of the step's segments / its step time)
    #: Each segment's share as stored (read from a file); None: computed from ``median_ms``.
    stored_share: tuple[float, ...] | None = None
    #: Stored keys the stored phase lacked (``LAYERS_PHASE_OPTIONAL``, a hand-made record's): not written.
    absent: tuple[str, ...] = ()

    @property
    def share(self) -> tuple[float, ...]:
        if self.stored_share is not None:
            return self.stored_share
        total = sum(self.median_ms)
        return tuple(v / total if total else 0.0 for v in self.median_ms)

    @property
    def n_layers(self) -> int:
        """Transformer blocks reported (the head is not one)."""
        return sum(1 for n in self.names if n != HEAD_NAME)

    def has(self, key: str) -> bool:
        """Whether the stored form holds ``key`` (a hand-made record's may lack one)."""
        return key not in self.absent

    def to_json(self) -> PhaseLayersJson:
        """``PhaseLayersJson``'s keys (``share`` computed where not stored) but those ``absent``."""
        kinds = {f.name: str(f.type) for f in fields(self)} | {"share": "tuple[float, ...]"}
        out = {k: _written(kinds[k], getattr(self, k)) for k in PhaseLayersJson.__annotations__ if k not in self.absent}
        return cast("PhaseLayersJson", out)

    @classmethod
    def from_json(cls, phase: str, d: Mapping[str, object]) -> PhaseLayers:
        """``to_json`` read back (``phase``: its key); ``names`` and ``median_ms`` at least
        (``LAYERS_PHASE_OPTIONAL`` may be missing: 0 or empty); KeyError, TypeError or ValueError
        where a value is missing or of the wrong kind."""
        absent = _absent(d, LAYERS_PHASE_OPTIONAL)
        read = _stored_section(cls, {**d, "phase": phase, "stored_share": d.get("share"), "absent": absent})
        if any(len(v) != len(read.names) for v in (read.median_ms, read.stored_share or read.names, *read.per_run_ms)):
            raise ValueError("a segment's figures do not match its names")
        return read


#: ``PhaseLayers``' stored keys a hand-made record may lack.
LAYERS_PHASE_OPTIONAL = ("share", "step_ms", "n_runs", "n_steps", "per_run_ms", "outliers", "coverage")


class PhaseLayersJson(TypedDict):
    """A ``PhaseLayers`` as a record stores it (without its phase: its key)."""

    names: list[str]
    median_ms: list[float]
    share: list[float]
    step_ms: float
    n_runs: int
    n_steps: int
    per_run_ms: list[list[float]]
    outliers: list[str]
    coverage: float


class LayersJson(TypedDict):
    """``LayerProfile`` as a record stores it."""

    phases: dict[str, PhaseLayersJson]
    outlier_rule: str
    overhead_ratio: float | None
    prefill_overhead_ratio: float | None


class _Stepped(Protocol):
    @property
    def step_ms(self) -> float: ...


class InstrumentedCost:
    """What an instrumented pass cost against interleaved plain runs of the same engine
    (``Attribution``, ``LayerProfile``): instrumented / plain, per phase."""

    prefill: _Stepped
    tpot_ms: float | None  # instrumented runs, median
    plain_prefill_ms: float | None  # interleaved plain runs, medians
    plain_tpot_ms: float | None

    @property
    def prefill_overhead_ratio(self) -> float | None:
        return self.prefill.step_ms / self.plain_prefill_ms if self.plain_prefill_ms else None

    @property
    def decode_overhead_ratio(self) -> float | None:
        return self.tpot_ms / self.plain_tpot_ms if self.plain_tpot_ms and self.tpot_ms is not None else None


#: ``LayerProfile``'s stored keys a hand-made record may lack.
LAYERS_OPTIONAL = ("outlier_rule", "overhead_ratio", "prefill_overhead_ratio")


@dataclass(frozen=True)
class LayerProfile(InstrumentedCost):
    """Both phases, plus what the instrumentation cost against the plain engine (instrumented /
    plain, per phase: computed from the medians when measured, as stored when read)."""

    prefill: PhaseLayers
    decode: PhaseLayers
    #: Instrumented runs' median TPOT. Not stored: None when read from a file.
    tpot_ms: float | None = None
    #: Interleaved plain runs, medians. Not stored: None when read from a file.
    plain_prefill_ms: float | None = None
    plain_tpot_ms: float | None = None
    #: The overhead ratios as stored (decode, prefill: read from a file; None when measured).
    stored_ratios: tuple[float | None, float | None] | None = None
    #: The outlier rule as stored (a hand-made record may name another).
    outlier_rule: str = OUTLIER_RULE
    #: Stored keys the stored profile lacked (``LAYERS_OPTIONAL``, a hand-made record's): not written.
    absent: tuple[str, ...] = ()

    @property
    def prefill_overhead_ratio(self) -> float | None:
        return super().prefill_overhead_ratio if self.stored_ratios is None else self.stored_ratios[1]

    @property
    def decode_overhead_ratio(self) -> float | None:
        return super().decode_overhead_ratio if self.stored_ratios is None else self.stored_ratios[0]

    def has(self, key: str) -> bool:
        """Whether the stored form holds ``key`` (a hand-made record's may lack one)."""
        return key not in self.absent

    def to_json(self) -> LayersJson:
        """The record's ``layers`` entry (baselines, session reports)."""
        out = {
            "phases": {"prefill": self.prefill.to_json(), "decode": self.decode.to_json()},
            "outlier_rule": self.outlier_rule,
            "overhead_ratio": sig6(self.decode_overhead_ratio),
            "prefill_overhead_ratio": sig6(self.prefill_overhead_ratio),
        }
        return cast("LayersJson", {k: v for k, v in out.items() if k not in self.absent})

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> LayerProfile:
        """``to_json`` read back (both phases at least: ``LAYERS_OPTIONAL`` may be missing);
        KeyError, TypeError or ValueError where a value is missing or of the wrong kind."""
        phases = _object(d["phases"])
        ratios = tuple(_as("float | None", d.get(k)) for k in ("overhead_ratio", "prefill_overhead_ratio"))
        return cls(
            PhaseLayers.from_json("prefill", _object(phases["prefill"])),
            PhaseLayers.from_json("decode", _object(phases["decode"])),
            stored_ratios=cast("tuple[float | None, float | None]", ratios),
            outlier_rule=_text(d.get("outlier_rule", OUTLIER_RULE)),
            absent=_absent(d, LAYERS_OPTIONAL),
        )


GROUP_RULE = (
    "attention: SOFT_MAX, FLASH_ATTN_EXT and every node llama.cpp names kq* (K x Q, softmax, x V); "
    "matrix multiplication: the other MUL_MAT*/OUT_PROD; normalisation: *_NORM ops and the nodes named *norm "
    "(the norm's weight); rope: ROPE; copies: CPY, CONT, DUP, SET_ROWS (KV cache writes), GET_ROWS, CONCAT; "
    "elementwise: ADD, MUL, SCALE, GLU and unary ops; other: the rest"
)


LAYER_RULE = (
    "a node's layer is its name's suffix (-N; the KV cache's _lN); an unnamed node (node_N: "
    "FLASH_ATTN_EXT, the last layer's row selection) is its graph predecessor's; "
    "result* and the final norm: output; other named nodes (embd, inp_*): input"
)


KINDS = ("layers", "ops", "groups")


PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Slice(_Fields):
    """One layer, op type or group of a phase: median ms per step over all steps, and per run
    (each run's median over its steps: the unit of comparisons)."""

    name: str
    median_ms: float
    per_run_ms: tuple[float, ...]


@dataclass(frozen=True)
class PhaseAttribution(_Fields):
    """One phase (prefill: the prompt's step; decode: per token step): its layers, op types and
    groups; ``step_ms``: median instrumented step; ``nodes_ms``: median sum of the node times
    per step; ``coverage``: median over steps of (node times / step time); ``nodes``: nodes
    computed apart per step (median)."""

    phase: str
    layers: tuple[Slice, ...]
    ops: tuple[Slice, ...]
    groups: tuple[Slice, ...]
    step_ms: float
    nodes_ms: float
    coverage: float
    nodes: int
    n_runs: int
    n_steps: int
    #: All transformer blocks together, per step (a median of sums, not a sum of medians).
    blocks: Slice | None = None

    UNSTORED = frozenset({"phase"})  # its key
    WHERE_SET = frozenset({"blocks"})

    def slices(self, kind: str) -> tuple[Slice, ...]:
        """``layers``, ``ops`` or ``groups``."""
        slices: tuple[Slice, ...] = getattr(self, kind)
        return slices


@dataclass(frozen=True)
class Attribution(InstrumentedCost, _Fields):
    """Both phases of one side, what the instrumentation cost (interleaved plain runs) and the
    pass's wall time (warm-up, instrumented and plain runs)."""

    prefill: PhaseAttribution
    decode: PhaseAttribution
    tpot_ms: float  # instrumented runs, median
    plain_prefill_ms: float | None  # interleaved plain runs, medians
    plain_tpot_ms: float | None
    wall_s: float

    UNSTORED = frozenset(PHASES)  # in ``phases``

    def phase(self, name: str) -> PhaseAttribution:
        return self.prefill if name == "prefill" else self.decode

    def cost(self) -> dict[str, float | None]:
        """What the pass cost and how its node times add up to the step, per phase."""
        return {
            "wall_s": sig6(self.wall_s),
            "prefill_overhead_ratio": sig6(self.prefill_overhead_ratio),
            "decode_overhead_ratio": sig6(self.decode_overhead_ratio),
            "prefill_coverage": sig6(self.prefill.coverage),
            "decode_coverage": sig6(self.decode.coverage),
        }

    def to_json(self) -> dict[str, JSONValue]:
        phases: dict[str, JSONValue] = {p: self.phase(p).to_json() for p in PHASES}
        return {"phases": phases, **super().to_json(), "layer_rule": LAYER_RULE, "group_rule": GROUP_RULE}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Attribution:
        """``to_json`` read back (the plain runs' medians may be missing: None); KeyError, TypeError
        or ValueError where a value is missing or of the wrong kind (a text where a number belongs:
        ValueError)."""
        phases = _object(_object(d)["phases"])
        read = {p: {**(ph := _object(phases[p])), "phase": p, "blocks": ph.get("blocks") or None} for p in PHASES}
        return _stored_section(cls, {"plain_prefill_ms": None, "plain_tpot_ms": None, **d, **read})

    def lines(self) -> list[str]:
        """How the node times add up, and what the pass cost (80 columns)."""
        out = []
        for p in PHASES:
            ph = self.phase(p)
            ratio = self.prefill_overhead_ratio if p == "prefill" else self.decode_overhead_ratio
            cost = f" (x{ratio:.2f} the plain step)" if ratio else ""
            out.append(f"{p}: {ph.nodes} nodes timed, {ph.coverage:.0%} of the {ph.step_ms:.3g} ms step{cost}")
        out.append(f"attribution pass: {self.wall_s:.1f} s ({self.prefill.n_runs} instrumented + plain runs)")
        return out


#: What the figures are when both sides give full-vocabulary logits.
EXACT = "exact, full vocabulary"


@dataclass(frozen=True)
class Agreement:
    """B's outputs against A's (module docstring); ``reason`` set: not available, and why."""

    reason: str = ""
    method: str = EXACT
    n_prompts: int = 0
    n_positions: int = 0
    top1_agreement: float | None = None
    kl_mean: float | None = None
    kl_p99: float | None = None
    kl_max: float | None = None
    greedy_parity: float | None = None  # share of identical greedy tokens (over every position)
    #: Positions left out of top-1 and KL: a server sent no probabilities for them (llama-server
    #: holds back a byte token that leaves the text an incomplete UTF-8 character).
    n_unscored: int = 0
    #: Per prompt: the first generated position where B's greedy token differs from A's (None: none).
    first_divergence: tuple[int | None, ...] = ()

    @property
    def available(self) -> bool:
        return not self.reason

    @property
    def sample(self) -> str:
        return f"{self.n_positions} positions over {self.n_prompts} prompt{'s' if self.n_prompts != 1 else ''}"

    @property
    def earliest_divergence(self) -> int | None:
        return min((d for d in self.first_divergence if d is not None), default=None)

    def divergence(self) -> str:
        """Where the greedy tokens first part: ``none`` or ``token 3 (2 of 4 prompts part)``."""
        diverged = sum(d is not None for d in self.first_divergence)
        first = self.earliest_divergence
        return "none" if first is None else f"token {first} ({diverged} of {self.n_prompts} prompts part)"

    def against_lines(self) -> list[str]:
        """Under ``--llmperf-against``, after the metrics table (whose rows hold top-1 and KL;
        each line within 80 columns but for a long reason)."""
        if not self.available:
            return [f"output against REF: not available ({self.reason})"]
        return [
            f"output against REF (A: REF, B: this tree; {self.method})",
            f"  greedy parity {self.greedy_parity:.4f}; first divergence: {self.divergence()}",
        ]

    def lines(self) -> list[str]:
        """The report section's lines (each within 80 columns)."""
        if not self.available:
            return [f"agreement: not available ({self.reason})"]
        assert self.kl_mean is not None and self.kl_p99 is not None and self.kl_max is not None
        where = self.divergence()
        held = [f"  {self.n_unscored} more positions without a server's probabilities"] if self.n_unscored else []
        return [
            f"agreement ({self.method}): {self.sample}",
            *held,
            f"  teacher-forced on A's tokens: top-1 {self.top1_agreement:.4f}",
            f"  KL(A||B) mean {self.kl_mean:.4g}, p99 {self.kl_p99:.4g}, max {self.kl_max:.4g}",
            f"  greedy parity {self.greedy_parity:.4f}; first divergence: {where}",
        ]

    def to_json(self) -> dict[str, JSONValue]:
        """Each field as it is (nothing rounded), then ``available``."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)} | {"available": self.available}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Agreement:
        """``to_json`` read back (``available`` is computed, and checked against ``reason``);
        KeyError, TypeError, ValueError: not an agreement (every key is written)."""
        out = _stored_section(cls, {f.name: d[f.name] for f in fields(cls)})
        if d["available"] is not out.available:
            raise ValueError(f"available: {d['available']!r} with reason {out.reason!r}")
        return out


@dataclass(frozen=True)
class LengthBucket(_Fields):
    """The runs whose prompts had ``low_tokens`` to ``high_tokens`` tokens (both included): their
    count, TTFT median and p95, prefill median (None: the engine does not see the prefill end)."""

    low_tokens: int
    high_tokens: int
    n_runs: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    prefill_p50_ms: float | None


@dataclass(frozen=True)
class PromptLengths(_Fields):
    """A measurement whose runs' prompts had different lengths (a prompt set), by length:
    ``buckets`` (``measuring.metrics.length_buckets``' ``rule``), and the prefill per evaluated
    prompt token over all ``n_runs``: the median of each run's prefill / its tokens, the same
    from llama.cpp's own counters, and the least-squares line of prefill against tokens (slope
    ms per token, intercept ms). None where the engine does not see it."""

    rule: str
    n_runs: int
    buckets: tuple[LengthBucket, ...]
    ms_per_prompt_token: float | None
    native_ms_per_prompt_token: float | None
    slope_ms_per_token: float | None
    intercept_ms: float | None


class TurnFigures(NamedTuple):
    """One turn of a conversation over a measurement's runs (``measuring.metrics.turn_figures``): how many runs,
    the prompt's tokens, those llama.cpp evaluated and reused (medians; None: not counted), TTFT
    p50 and p95, and the decode time per token (median TPOT)."""

    turn: int
    runs: int
    prompt_tokens: int | None
    evaluated_tokens: int | None
    reused_tokens: int | None
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_ms: float


@dataclass(frozen=True, kw_only=True)
class Measurement(StoredForm):
    """All runs of one workload on one engine, with the summaries budgets and reports use: the
    one record of a measurement, written and read back by its own ``to_json`` / ``from_json``.

    Summaries over runs are medians (``ttft_ms`` is the median TTFT); ``itl`` pools every
    run's inter-token latencies. What storing adds (the machine and subject it ran on, the
    commit, its stability, memory, summary... : ``baselines.records.stored``) are its fields
    too, None until then. A record keeps less than a fresh measurement has (``to_json``):
    read from a file (``read``), the fields it does not keep are None (``workload``, ``itl``,
    a run's prefill, the warm-up runs, the system's samples...), the engine is what its
    ``subject`` and ``memory`` say, and the medians are its ``summary``'s (NaN where a
    hand-made record has none). It also reads as the read-only mapping of its stored form
    (``record["summary"]``: what a ``pytest_llmperf_result`` hook read before it was typed).
    """

    label: str = ""
    #: What was measured; None: read from a file (``identity`` is what a file keeps of it).
    workload: Workload | None = None
    engine: EngineInfo
    runs: tuple[RunMetrics, ...]
    itl: LatencyStats
    ttft_ms: float
    ttft_p95_ms: float
    tpot_ms: float
    decode_tps: float
    e2e_ms: float
    tokenize_ms: float
    prefill_ms: float | None
    prefill_tps: float | None
    native_prefill_ms: float | None
    native_decode_ms_per_token: float | None
    overhead_ms_per_token: float | None
    prompt_tokens: int | None
    output_tokens: int
    sampling_ms_per_token: float | None = None
    prefill_outside_ms: float | None = None
    decode_outside_ms_per_token: float | None = None
    prompt_reused_tokens: int | None = None  # median over runs
    python_sampling_ms_per_token: float | None = None
    delivered_items: int | None = None  # the fewest over runs
    delivered_ttft_ms: float | None = None
    delivered_e2e_ms: float | None = None
    delivered_burst_tokens: int | None = None  # the most over runs
    load: LoadStats | None = None  # a load test's (concurrency/requests/rate), else None
    # Filled by runner.measure (None / empty when a Measurement is built from traces alone):
    warmup_runs: tuple[RunMetrics, ...] = ()
    system: SystemDelta | None = None  # around the runs
    peak_rss: PeakRss | None = None  # over the runs
    layers: LayerProfile | None = None  # when per-layer timing was asked for
    attribution: Attribution | None = None  # when the per-node pass was asked for (``attribution``)
    roofline: Roofline | None = None  # when peaks were known or asked for
    model_loads: ModelLoads | None = None  # fresh loads, when asked for (``model_load``)
    #: Under ``--llmperf-against``: this tree's outputs against REF's (REF is A), after the pairs.
    agreement: Agreement | None = None
    #: Where the runs' prompts had different lengths (a prompt set): the figures by length.
    prompt_lengths: PromptLengths | None = None
    #: A conversation's figures turn by turn (``measuring.metrics.turn_figures``); empty: not one.
    turns: tuple[TurnFigures, ...] = ()
    # What storing adds (``baselines.records.stored``; read back from a file):
    recorded_at: str | None = None
    commit: str | None = None
    #: The fingerprint's halves (``core.fingerprint``): what must match, and what is judged.
    hardware: JsonObject = field(default_factory=dict)
    subject: JsonObject = field(default_factory=dict)
    #: What must match for two records to be compared, with the run and warm-up counts.
    identity: StoredWorkload | None = None
    summary: Summary | None = None
    stability: Stability | None = None
    memory: Memory | None = None
    #: A measured callable's prompt as llama.cpp saw it and its stream as the caller got it.
    prompt: PromptSeen | None = None
    #: The machine around the runs (``system``'s shares), with its preemptions per run.
    machine: Machine | None = None
    #: A prompt set's: each run's request and prompt tokens (a comparison pairs runs of the same request).
    requests: Requests | None = None
    #: The machine's reference figure (``measuring.roofline.probe_reference``), after the runs.
    reference: JsonObject | None = None
    #: The levels of the baseline's last recorded sessions, per judged metric (a re-recorded
    #: baseline keeps them: the verdict's between-session noise).
    sessions: Mapping[str, Sequence[JsonObject]] | None = None
    #: What a file held that this version does not read into the fields above, as it came: keys it
    #: does not know (a newer pytest-llmperf's), per-run values of the wrong kind (``unread_runs``)...
    extra: JsonObject = field(default_factory=dict)
    unread_runs: JsonObject = field(default_factory=dict)
    unread_parts: JsonObject = field(default_factory=dict)
    #: Sections a file held whose insides this version cannot read, as they came (the judge names them).
    unread: JsonObject = field(default_factory=dict)

    @property
    def n_runs(self) -> int:
        return len(self.runs)

    # --- the stored form -----------------------------------------------------------------------

    @property
    def run_columns(self) -> PerRun:
        """Each run's value of every ``RUN_COLUMNS`` field all runs have, then the per-run values a
        file held that are not finite numbers, as they came."""
        return {**_columns(self.runs, RUN_COLUMNS), **self.unread_runs}  # type: ignore[dict-item]  # as it came

    @property
    def part_columns(self) -> PerRun:
        """Each run's value of every part (``PART_COLUMNS``) all runs have, as ``run_columns``."""
        return {**_columns(self.runs, PART_COLUMNS), **self.unread_parts}  # type: ignore[dict-item]  # as it came

    @property
    def itl_ms(self) -> tuple[tuple[float, ...], ...] | None:
        """Each run's inter-token latencies (ms), as a record keeps them; None: no run has any."""
        itl = tuple(r.itl_ms for r in self.runs)
        return itl if any(itl) else None

    def to_json(self) -> dict[str, JSONValue]:
        """The stored form (``schemas/baselines.schema.json#/$defs/record``): each section this
        measurement has (``_SECTIONS``: the attribute of its name, but these three), then ``extra``."""
        held = {
            "workload": self.identity if self.identity is not None else StoredWorkload.from_json({}),
            "runs": self.run_columns,
            "parts": self.part_columns or None,
        }
        sections = {k: held[k] if k in held else getattr(self, k) for k in _SECTIONS}
        out = {
            k: _plain(self.unread.get(k, v))
            for k, v in sections.items()
            if v is not None or k in _ALWAYS or k in self.unread
        }
        out.update({k: _plain(v) for k, v in self.extra.items()})
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str = "record") -> Measurement:
        """A stored record, checked against the schema first (``where``: its place in its file,
        for the one-line ``SchemaViolation``)."""
        validate_schema_file(d, "baselines", "record", where)
        return cls.read(d)

    @classmethod
    def read(cls, d: Mapping[str, object]) -> Measurement:
        """A record as it came, unchecked (a hand-made one, a session file's checked by its own
        schema): what it does not hold reads as None, a section or per-run value of the wrong
        kind is kept as it came (``unread``, ``unread_runs``...; written back so, and the judge
        names what it cannot judge), a key this version does not know in ``extra``."""
        sections, unread = _stored_sections(d)
        runs, unread_runs, unread_parts = _stored_runs(d)
        summary = sections.get("summary") or Summary.from_json({})
        assert isinstance(summary, Summary)
        identity = sections.pop("workload", None)
        if not isinstance(identity, StoredWorkload):
            identity = StoredWorkload.from_json({})
        median = functools.partial(_stored_median, summary, runs=runs)
        ttfts = sorted(r.ttft_ms for r in runs if not math.isnan(r.ttft_ms))
        return cls(
            engine=_stored_engine(
                cast("JsonObject", sections.get("subject") or {}), cast("Memory | None", sections.get("memory"))
            ),
            runs=runs,
            itl=_stored_itl([v for r in runs for v in r.itl_ms], summary),
            ttft_ms=median("ttft_ms"),
            ttft_p95_ms=_percentile(ttfts, 95),
            tpot_ms=median("tpot_ms"),
            decode_tps=median("decode_tps"),
            e2e_ms=median("e2e_ms"),
            tokenize_ms=median("tokenize_ms"),
            prefill_ms=summary.figures.get("prefill_ms"),
            prefill_tps=summary.figures.get("prefill_tps"),
            native_prefill_ms=_optional(median("native_prefill_ms")),
            native_decode_ms_per_token=_optional(median("native_decode_ms_per_token")),
            overhead_ms_per_token=None,
            prompt_tokens=identity.prompt_tokens,
            output_tokens=min((r.output_tokens for r in runs), default=0),
            identity=identity,
            unread_runs=unread_runs,
            unread_parts=unread_parts,
            unread=unread,
            extra={k: v for k, v in d.items() if k not in _SECTIONS},  # type: ignore[misc]  # JSON as it came
            **sections,  # type: ignore[arg-type]  # each of its field's kind (_stored_sections)
        )

    def diagnosis(self) -> dict[str, JSONValue]:
        """Where the time went (the sections from ``stability`` to ``machine`` this record
        has): ``llmperf profile``'s JSON beside its figures."""
        return {k: v for k, v in self.to_json().items() if k in DIAGNOSIS}

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @property
    def asked(self) -> Workload:
        """The workload a fresh measurement ran (``ValueError`` for one read from a file, which
        keeps its ``identity``, not its prompts)."""
        if self.workload is None:
            raise ValueError("a measurement read from a file keeps its workload's identity, not the workload")
        return self.workload

    @property
    def tokens_per_run(self) -> str:
        """The runs' generated tokens: ``32``, or ``4 to 32`` where they differ."""
        return _span([r.output_tokens for r in self.runs] or [self.output_tokens])

    @property
    def evaluated_prompt_tokens(self) -> int | None:
        """The prompt's tokens llama.cpp evaluated (median run), where the reused ones are known."""
        if self.prompt_tokens is None or self.prompt_reused_tokens is None:
            return None
        return self.prompt_tokens - self.prompt_reused_tokens

    @property
    def token_notes(self) -> list[str]:
        """One line each where a figure is not what its name says on its face: a cold prompt
        llama.cpp did not evaluate whole, a warm cache, a stream whose items are not its tokens,
        llama.cpp's counters above the clock's time."""
        lines = []
        cache = self.asked.prompt_cache
        reused, evaluated = self.prompt_reused_tokens, self.evaluated_prompt_tokens
        if cache == "warm" and reused is not None:
            lines.append(
                f"prompt cache warm (kept between runs): {reused} of {self.prompt_tokens} prompt tokens reused, "
                f"{evaluated} evaluated (median run); never compared with a cold measurement"
            )
        elif reused and self.asked.conversation is None:  # a conversation's turns reuse on purpose
            why = (
                "an earlier generation of the same run left them in the KV cache (llama-cpp-python reuses a "
                "prompt's prefix that is still there)"
                if max(r.generations for r in self.runs) > 1
                else "your code cached or trimmed the prompt (a LlamaCache, a state it loaded, or a second Llama)"
            )
            lines.append(
                f"cold, yet llama.cpp evaluated {evaluated} of the {self.prompt_tokens} prompt tokens your code "
                f"passed (median run): {why}"
            )
        lines += self._generation_notes()
        lines += self._early_notes()
        lines += self._delivery_notes()
        lines += self.clock_gap_lines
        return lines

    def _early_notes(self) -> list[str]:
        """Where a callable's Llama made fewer tokens than asked in some runs (its stop sequences,
        the end of its text): how many, since E2E follows the count (TPOT and ITL are per token)."""
        asked = self.asked.max_tokens
        short = sum(1 for r in self.runs if r.output_tokens < asked)
        if not short or self.delivered_items is None:
            return []
        return [
            f"{short} of {self.n_runs} runs made fewer than the {asked} tokens asked ({self.tokens_per_run} per run): "
            "your code's stop sequences or the end of its text ended them; TPOT and ITL are per token, E2E "
            "follows the count"
        ]

    def _generation_notes(self) -> list[str]:
        counts = [r.generations for r in self.runs]
        if max(counts, default=1) <= 1:
            return []
        return [
            f"your code ran {_span(counts)} llama.cpp generations per run: TTFT, TPOT and ITL are the one that made the most "
            f"tokens ({self.tokens_per_run} per run, its prompt {self.prompt_tokens} tokens); llama.cpp's time in the "
            "others before its first token is in its prompt eval, the rest of theirs outside llama.cpp"
        ]

    def _delivery_notes(self) -> list[str]:
        items, asked = self.delivered_items, self.asked.max_tokens
        if items is not None and (items != self.output_tokens or (self.delivered_burst_tokens or 1) > 1):
            burst = self.delivered_burst_tokens or 1
            how = (
                f"up to {burst} tokens in one (held-back text released in bursts)"
                if burst > 1
                else "one token or none in each (a last chunk with no new token)"
            )
            return [
                f"tokens timed where llama.cpp made them ({self.tokens_per_run} per run); your stream delivered "
                f"{items} items, {how}: delivered TTFT {fmt(self.delivered_ttft_ms or 0.0)} ms, "
                f"E2E {fmt(self.delivered_e2e_ms or 0.0)} ms"
            ]
        if items is None and self.engine.engine == "callable" and self.output_tokens != asked:
            return [
                f"items timed as tokens: the callable yielded {self.output_tokens} items for max_tokens={asked}, "
                "so its items are chunks, not tokens (ITL and TPOT are per item); it drives no Llama the plugin sees"
            ]
        return []

    @property
    def clock_gap_lines(self) -> list[str]:
        """Where llama.cpp's counters exceed the clock's time of a phase: which, by how much."""
        gaps: dict[str, list[float]] = {}
        for run in self.runs:
            for part, ms in run.clock_gaps:
                gaps.setdefault(part, []).append(ms)
        return [
            f"{part.removesuffix('_gap')}: llama.cpp's counters exceed the clock's time by "
            f"{fmt(statistics.median(values))} ms (median of {len(values)} of {self.n_runs} runs); shown as 0"
            for part, values in gaps.items()
        ]


#: Per-run values by field (``Measurement.run_columns``, ``part_columns``): one number per run.
PerRun: TypeAlias = "Mapping[str, Sequence[float]]"

#: The per-run fields a record keeps (its ``runs``), in the order it writes them: the metrics
#: with a per-run value (``catalog.RUN_FIELDS``, which tests/test_catalog.py holds to these).
RUN_COLUMNS = ("ttft_ms", "prefill_tps", "tpot_ms", "decode_tps", "itl_p50_ms", "itl_p95_ms", "delivered_ttft_ms")
#: Each phase's parts a record keeps per run (its ``parts``), prefill first (``catalog.PARTS``).
PART_COLUMNS = (
    "tokenize_ms",
    "native_prefill_ms",
    "prefill_outside_ms",
    "native_decode_ms_per_token",
    "sampling_ms_per_token",
    "python_sampling_ms_per_token",
    "decode_outside_ms_per_token",
)
#: A record's sections, in the order records have always been written (``Measurement.to_json``).
_SECTIONS = (
    "recorded_at",
    "commit",
    "hardware",
    "subject",
    "workload",
    "runs",
    "itl_ms",
    "summary",
    "stability",
    "parts",
    "layers",
    "attribution",
    "roofline",
    "memory",
    "prompt",
    "model_loads",
    "agreement",
    "load",
    "machine",
    "requests",
    "prompt_lengths",
    "reference",
    "sessions",
)
#: The sections of where the time went, ``stability`` to ``machine`` (``Measurement.diagnosis``:
#: ``llmperf profile``'s JSON).
DIAGNOSIS = frozenset(_SECTIONS[_SECTIONS.index("stability") : _SECTIONS.index("machine") + 1])
#: Written even when None (a record holds ``"commit": null`` outside a git checkout), and the
#: per-run values every record has.
_ALWAYS = frozenset({"commit", "runs"})


def _columns(runs: Sequence[RunMetrics], names: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Per-run values by field; a field some run lacks (None, or NaN: a record without it) is left out."""
    out: dict[str, tuple[float, ...]] = {}
    for name in names:
        values = [getattr(r, name) for r in runs]
        if values and all(v is not None and not math.isnan(v) for v in values):
            out[name] = tuple(values)
    return out


def stored_run(run: RunMetrics) -> RunMetrics:
    """``run`` as a record keeps it: its kept values (``RUN_COLUMNS``, ``PART_COLUMNS``, ITLs) to
    six significant figures (``baselines.records.stored``, before it is written)."""
    kept = {name: sig6(v) for name in (*RUN_COLUMNS, *PART_COLUMNS) if (v := getattr(run, name)) is not None}
    return dataclasses.replace(run, itl_ms=tuple(sig6(v) for v in run.itl_ms), **kept)


def _plain(value: object) -> JSONValue:
    """A section's value as JSON: a typed section as it writes itself, tuples as lists, mappings as dicts."""
    if hasattr(value, "to_json"):  # a section's own stored form
        return cast("JSONValue", value.to_json())
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"not a JSON value: {value!r}")


def _numbers(value: object, n: int | None) -> tuple[float, ...] | None:
    """A stored list of ``n`` numbers (any length for None) as a tuple, else None (a bool is no number)."""
    if not isinstance(value, list) or (n is not None and len(value) != n):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        return None
    return tuple(value)


def _itls(value: object) -> tuple[tuple[float, ...], ...] | None:
    """A record's ``itl_ms``: a list per run of numbers, else None."""
    if not isinstance(value, list) or not value:
        return None
    runs = [_numbers(run, None) for run in value]
    return None if any(r is None for r in runs) else tuple(r for r in runs if r is not None)


def _typed_columns(
    stored: object, names: Sequence[str], n: int
) -> tuple[dict[str, tuple[float, ...]], dict[str, JSONValue]]:
    """A stored ``runs`` or ``parts``: the known fields held as ``n`` numbers each, and the rest as they came."""
    typed: dict[str, tuple[float, ...]] = {}
    unread: dict[str, JSONValue] = {}
    for name, value in stored.items() if isinstance(stored, Mapping) else ():
        numbers = _numbers(value, n) if n else None
        if name in names and numbers is not None:
            typed[name] = numbers
        else:
            unread[name] = value
    return typed, unread


def _run_count(d: Mapping[str, object], itl: tuple[tuple[float, ...], ...] | None) -> int:
    """How many runs a record holds: its ITL lists', else its longest list of per-run values."""
    if itl is not None:
        return len(itl)
    columns = [c for k in ("runs", "parts") if isinstance(c := d.get(k), Mapping)]
    return max((len(v) for c in columns for v in c.values() if isinstance(v, list)), default=0)


def _stored_run(i: int, columns: Mapping[str, tuple[float, ...]], itl: tuple[float, ...]) -> RunMetrics:
    """Run ``i`` of a record: its kept values (None, or NaN for a figure every fresh run has, where
    the record has none), its output tokens and E2E from its ITLs (one between each two tokens)."""

    def at(name: str) -> float | None:
        column = columns.get(name)
        return None if column is None else column[i]

    def known(name: str) -> float:
        value = at(name)
        return math.nan if value is None else value

    return RunMetrics(
        prompt_tokens=None,
        output_tokens=len(itl) + 1 if itl else 0,
        tokenize_ms=known("tokenize_ms"),
        ttft_ms=known("ttft_ms"),
        prefill_ms=None,
        prefill_tps=at("prefill_tps"),
        tpot_ms=known("tpot_ms"),
        decode_tps=known("decode_tps"),
        e2e_ms=ttft + sum(itl) if (ttft := at("ttft_ms")) is not None and itl else math.nan,
        itl_p50_ms=known("itl_p50_ms"),
        itl_p95_ms=known("itl_p95_ms"),
        itl_ms=itl,
        **{name: at(name) for name in (*PART_COLUMNS[1:], "delivered_ttft_ms")},  # type: ignore[arg-type]
    )


def _stored_runs(d: Mapping[str, object]) -> tuple[tuple[RunMetrics, ...], dict[str, JSONValue], dict[str, JSONValue]]:
    """A record's runs, and the per-run values of ``runs`` and ``parts`` it holds that are not ``n`` numbers."""
    itl = _itls(d.get("itl_ms"))
    n = _run_count(d, itl)
    runs, unread_runs = _typed_columns(d.get("runs"), RUN_COLUMNS, n)
    parts, unread_parts = _typed_columns(d.get("parts"), PART_COLUMNS, n)
    columns = {**runs, **parts}
    return tuple(_stored_run(i, columns, itl[i] if itl else ()) for i in range(n)), unread_runs, unread_parts


def _stored_median(summary: Summary, name: str, runs: Sequence[RunMetrics]) -> float:
    """A median a record keeps in its ``summary``, else its runs' median, else NaN (a hand-made record)."""
    value = summary.figures.get(name)
    if value is not None:
        return value
    values = [v for r in runs if (v := getattr(r, name, None)) is not None and not math.isnan(v)]
    return float(statistics.median(values)) if values else math.nan


def _stored_engine(subject: JsonObject, memory: Memory | None) -> EngineInfo:
    """The engine as a record's ``subject`` (its fingerprint) and ``memory`` name it."""

    def text(key: str) -> str | None:
        value = subject.get(key)
        return value if isinstance(value, str) else None

    mib = {k: v for k in MEMORY_FIELDS if memory is not None and (v := memory.figure(k)) is not None}
    return EngineInfo(
        engine=text("engine") or "",
        model=text("model") or "",
        quantization=text("quantization"),
        backend_version=text("backend_version"),
        **mib,  # type: ignore[arg-type]  # the memory figures, numbers
    )


#: The sections a record holds as they are: text, and objects.
_TEXT = ("recorded_at", "commit")
_OBJECTS = ("hardware", "subject", "reference", "sessions")


def _section_readers() -> dict[str, Callable[[Mapping[str, object]], object]]:
    """Each typed section's reader: strict (a damaged section is kept as it came, in ``unread``),
    but the ``_StoredSection``s a record computes when it is stored (``read``) and the workload's
    identity and the summary, whose readers keep what they cannot read inside the section."""
    return {
        "workload": StoredWorkload.from_json,
        "summary": Summary.from_json,
        "stability": Stability.from_json,
        "layers": LayerProfile.from_json,
        "attribution": Attribution.from_json,
        "roofline": Roofline.from_json,
        "memory": Memory.read,
        "prompt": PromptSeen.read,
        "model_loads": ModelLoads.from_json,
        "agreement": Agreement.from_json,
        "load": LoadStats.from_json,
        "machine": Machine.read,
        "requests": Requests.read,
        "prompt_lengths": PromptLengths.from_json,
    }


def _stored_sections(d: Mapping[str, object]) -> tuple[dict[str, object], dict[str, JSONValue]]:
    """A record's sections as the Measurement's fields hold them, and those its section classes
    cannot read, as they came; a section of the wrong kind (not an object where one belongs) is
    left out, but an attribution pass (kept as it came: the judge names why it cannot read it)."""
    readers = _section_readers()
    fields_: dict[str, object] = {}
    unread: dict[str, JSONValue] = {}
    for name, value in d.items():
        if name in _TEXT and isinstance(value, str) or name in _OBJECTS and isinstance(value, Mapping):
            fields_[name] = value
        elif name in readers and isinstance(value, Mapping) and (name != "attribution" or value):
            try:
                fields_[name] = readers[name](value)
            except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError, IndexError):
                unread[name] = cast("JSONValue", value)  # damaged inside: as it came
        elif name == "attribution" and value is not None:
            unread[name] = cast("JSONValue", value)
    return fields_, unread


def _stored_itl(samples: Sequence[float], summary: Summary) -> LatencyStats:
    """The pooled ITLs a record keeps, summarized as ``measuring.metrics.latency_stats`` does (its
    percentiles the summary's where it holds them); NaN for a record without any."""
    values = sorted(samples)
    mean = statistics.fmean(values) if values else math.nan
    stdev = statistics.stdev(values) if len(values) > 1 else 0.0 if values else math.nan
    p50, p90, p95, p99 = (summary.figures.get(f"itl_p{q}_ms") or _percentile(values, q) for q in (50, 90, 95, 99))
    return LatencyStats(
        count=len(values),
        mean_ms=mean,
        stdev_ms=stdev,
        cv=stdev / mean if mean > 0 else 0.0,
        min_ms=values[0] if values else math.nan,
        max_ms=values[-1] if values else math.nan,
        p50_ms=p50,
        p90_ms=p90,
        p95_ms=p95,
        p99_ms=p99,
    )


def _optional(value: float) -> float | None:
    return None if math.isnan(value) else value


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The linear-interpolation percentile (numpy's default) of sorted values; NaN for none."""
    if not ordered:
        return math.nan
    h = (len(ordered) - 1) * q / 100
    lo = int(h)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo]))


# --- the sections a record computes from the Measurement when it is stored --------------------
#
# ``Machine``, ``Memory``, ``PromptSeen`` (with its ``Turn``s) and ``Requests``, and the workload's
# identity (``StoredWorkload``, written by ``stored`` too): each holds the figures as they are
# stored, written by ``to_json`` in the order the fields are declared (a section read back: in the
# order its keys came, ``order``), and read back by ``from_json`` (every value of its kind, else KeyError/TypeError/ValueError) or by ``read``
# (a hand-made or damaged section, the judge's to judge in part: a value of the wrong kind, or a key
# this version does not know, is kept as it came in ``extra`` and written again after the fields).
# A key written even where None (``NULLABLE``) that the stored section lacked is in ``absent``, so
# it is not written; any other field is written only where it is not None.


@dataclass(frozen=True, kw_only=True, eq=False)
class _StoredSection(StoredForm):
    """What the sections share: ``to_json``, ``from_json`` and ``read`` by their fields
    (``stored_keys``: each value read as its field's annotation says, ``_as``) and ``NULLABLE``. Each also reads
    as the read-only mapping of what its ``to_json`` writes, and equals it (``record["memory"]``,
    ``record.memory == {"kv_cache_bytes": None}``: how a hook read a record before it was typed)."""

    #: Keys written even where None that the stored section lacked.
    absent: frozenset[str] = frozenset()
    #: Stored values of the wrong kind, or keys this version does not know, as they came.
    extra: JsonObject = dataclasses.field(default_factory=dict)
    #: Not stored: the stored keys in the order they came (a section read is written again in
    #: it, byte for byte); empty for a fresh one (the fields' order).
    order: tuple[str, ...] = ()

    NULLABLE: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def stored_keys(cls) -> dict[str, str]:
        """Each stored key (a field but ``absent``, ``extra`` and ``order``), in order, and the kind
        its value reads as (its field's annotation, a null apart: ``NULLABLE``)."""
        skip = {"absent", "extra", "order"}
        return {f.name: str(f.type).removesuffix(" | None") for f in dataclasses.fields(cls) if f.name not in skip}

    def to_json(self) -> dict[str, JSONValue]:
        out: dict[str, JSONValue] = {}
        for name in self.stored_keys():
            value = getattr(self, name)
            if value is not None or (name in self.NULLABLE and name not in self.absent):
                out[name] = _plain(value)
        out.update(self.extra)
        return {k: out[k] for k in self.order if k in out} | out if self.order else out

    @classmethod
    def read(cls: type[_S], d: Mapping[str, object]) -> _S:  # noqa: PYI019 (typing.Self: Python 3.11)
        """``d`` as it came: a value of the wrong kind, or a key this version does not know, in ``extra``."""
        if not isinstance(d, Mapping):
            raise TypeError(f"not an object: {d!r}")
        kinds = cls.stored_keys()
        typed: dict[str, object] = {}
        extra: dict[str, JSONValue] = {}
        for key, value in d.items():
            try:  # KeyError: a key this version does not know
                typed[key] = None if value is None and key in cls.NULLABLE else _as(kinds[key], value)
            except (KeyError, TypeError, ValueError):
                extra[key] = cast("JSONValue", value)
        return cls(**typed, absent=cls.NULLABLE - set(d), extra=extra, order=tuple(d))

    @classmethod
    def from_json(cls: type[_S], d: Mapping[str, object]) -> _S:  # noqa: PYI019 (typing.Self: Python 3.11)
        """``d`` as ``to_json`` writes it; KeyError/TypeError where it holds what this section does not."""
        read = cls.read(d)
        if read.extra:
            raise TypeError(f"{cls.__name__}: not of its kind or not known: {', '.join(map(str, read.extra))}")
        return read


_S = TypeVar("_S", bound=_StoredSection)


@dataclass(frozen=True, kw_only=True, eq=False)
class StoredWorkload(_StoredSection):
    """What must match for two records to be compared (``WORKLOAD_KEYS``), with the run and
    warm-up counts (which may differ). ``shared_prefix_tokens`` and ``prompt_cache`` only when
    set, ``messages`` (a chat request's, as JSON text), ``prompt_set``, ``trace`` and
    ``conversation`` (their content hashes, a trace with its ``trace_speed``, a conversation with
    its judged ``turn``) too (so older baselines keep matching). The first six keys are written
    even where None (``null``); the others only where set. Read back by ``from_json`` (as ``read``,
    but written again in its fields' order): a key of the wrong kind, or one this version does not
    know, is kept as it came in ``extra``, and a first-six key the stored workload lacked (a
    hand-made record's) in ``absent``, so it is written again as it was read."""

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

    NULLABLE: ClassVar[frozenset[str]] = frozenset(
        {"prompt", "prompt_tokens", "max_tokens", "seed", "concurrency", "rate"}
    )

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> StoredWorkload:
        return dataclasses.replace(cls.read(d), order=())


@dataclass(frozen=True, kw_only=True)
class Summary(StoredForm):
    """A record's ``summary``: ``n_runs``, ``itl_count`` and the catalog's ``SUMMARY`` figures
    (``figures``, by key, six significant figures; None where the measurement has none; written
    by ``baselines.records.stored``), in this order. Read back by ``from_json``: a figure is a
    number (or null) by key; a value of the wrong kind is kept as it came in ``extra``; a key the
    stored summary lacked (an older record's) is not written."""

    n_runs: int | None = None
    itl_count: int | None = None
    figures: Mapping[str, float | None] = field(default_factory=dict)
    #: Stored keys of the wrong kind or that this version does not know, as they came.
    extra: JsonObject = field(default_factory=dict)

    def to_json(self) -> dict[str, JSONValue]:
        counts = {"n_runs": self.n_runs, "itl_count": self.itl_count}
        return {**{k: v for k, v in counts.items() if v is not None}, **self.figures, **self.extra}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Summary:
        counts = {k: v for k, v in d.items() if k in ("n_runs", "itl_count") and _holds("int", v)}
        figures = {k: v for k, v in d.items() if k not in counts and (v is None or _holds("float", v))}
        return cls(
            **counts,  # type: ignore[arg-type]  # ints (_holds)
            figures=figures,  # type: ignore[arg-type]  # numbers or None (_holds)
            extra={k: v for k, v in d.items() if k not in counts and k not in figures},  # type: ignore[misc]
        )


#: What must match for two records' workloads to be compared (the run counts may differ).
WORKLOAD_KEYS = tuple(k for k in StoredWorkload.stored_keys() if k not in ("runs", "warmup"))


def _holds(kind: str, value: object) -> bool:
    """Whether ``value`` is of ``kind`` (``int``, ``float``: a bool is no number; None is not)."""
    try:
        _SCALARS[kind](value)
    except (TypeError, ValueError):
        return False
    return True


def workload_changes(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    """Differences between two records' workloads (``WORKLOAD_KEYS``), as ``key a -> b``."""
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in WORKLOAD_KEYS if a.get(k) != b.get(k)]


def workload_identity(m: Measurement) -> StoredWorkload:
    """What must match for ``m`` to be compared with a record (``WORKLOAD_KEYS``); one read from
    a file: the identity it keeps."""
    w = m.workload
    if w is None:
        return m.identity or StoredWorkload.from_json({})
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


def _span(counts: Sequence[int]) -> str:
    """``32``, or ``4 to 32`` where the counts differ."""
    low, high = min(counts), max(counts)
    return f"{low}" if low == high else f"{low} to {high}"


@dataclass(frozen=True, kw_only=True, eq=False)
class Machine(_StoredSection):
    """The machine around the runs (``SystemDelta``) as a record stores it (``machine``): the
    shares of CPU time (five decimals), the load, the engine's involuntary context switches and,
    where the run count was given (warm-ups included), their count per run (two decimals)."""

    steal_share: float | None = None
    load_1m: float | None = None
    involuntary_switches: int | None = None
    cpu_wait_share: float | None = None
    others_cpu_share: float | None = None
    involuntary_switches_per_run: float | None = None

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"steal_share", "load_1m", "cpu_wait_share", "others_cpu_share"})

    @classmethod
    def of(cls, system: SystemDelta, runs: int | None = None) -> Machine:
        share, wait, others = system.steal_share, system.cpu_wait_share, system.others_cpu_share
        switches = system.involuntary_switches
        return cls(
            steal_share=None if share is None else round(share, 5),
            load_1m=system.after.load_1m,
            involuntary_switches=switches,
            cpu_wait_share=None if wait is None else round(wait, 5),
            others_cpu_share=None if others is None else round(others, 5),
            involuntary_switches_per_run=None if runs is None else round(switches / max(1, runs), 2),
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Memory(_StoredSection):
    """Memory as a record stores it (``memory``), each figure from its most direct source: peak
    RSS of the engine's process over the runs (bytes, its scope, MiB), llama.cpp's reported
    buffers (``MEMORY_FIELDS``, MiB, with ``buffer_source``), the model file's mapping; the KV
    cache computed from the model's shape beside them (``kv_cache_bytes``, written even where None)."""

    kv_cache_bytes: int | None = None
    peak_rss_bytes: int | None = None
    peak_rss_scope: str | None = None
    rss_mib: float | None = None
    kv_mib: float | None = None
    compute_mib: float | None = None
    output_mib: float | None = None
    model_buffer_mib: float | None = None
    mapped_mib: float | None = None
    mapped_resident_mib: float | None = None
    buffer_source: str | None = None

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"kv_cache_bytes"})

    @classmethod
    def of(cls, m: Measurement, kv_cache_bytes: int | None, buffer_source: str) -> Memory:
        """``m``'s memory with the KV cache computed from the model's shape; ``buffer_source``:
        where llama.cpp's buffers come from (``catalog.BUFFER_SOURCE``), stored where it reported one."""
        rss = m.peak_rss
        reported = {k: sig6(v) for k in MEMORY_FIELDS if (v := getattr(m.engine, k)) is not None}
        return cls(
            kv_cache_bytes=kv_cache_bytes,
            peak_rss_bytes=rss.bytes if rss is not None else None,
            peak_rss_scope=rss.scope if rss is not None else None,
            rss_mib=sig6(rss.bytes / 2**20) if rss is not None else None,
            **reported,
            buffer_source=buffer_source if reported else None,
        )

    def figure(self, name: str) -> float | None:
        """The figure ``name`` (a field: ``rss_mib``, ``kv_mib``...), where it is a number."""
        value = getattr(self, name, None) if name in self.stored_keys() else None
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True, kw_only=True, eq=False)
class Turn(_StoredSection):
    """One turn of a conversation as a record stores it (``prompt.turns``, ``TurnFigures``):
    its runs, the prompt's tokens, those llama.cpp evaluated and reused (None: not counted),
    TTFT p50 and p95 and the decode time per token, six significant figures."""

    turn: int | None = None
    runs: int | None = None
    prompt_tokens: int | None = None
    evaluated_prompt_tokens: int | None = None
    prompt_reused_tokens: int | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tpot_ms: float | None = None

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"prompt_tokens", "evaluated_prompt_tokens", "prompt_reused_tokens"})

    @classmethod
    def of(cls, t: TurnFigures) -> Turn:
        return cls(
            turn=t.turn,
            runs=t.runs,
            prompt_tokens=t.prompt_tokens,
            evaluated_prompt_tokens=t.evaluated_tokens,
            prompt_reused_tokens=t.reused_tokens,
            ttft_p50_ms=sig6(t.ttft_p50_ms),
            ttft_p95_ms=sig6(t.ttft_p95_ms),
            tpot_ms=sig6(t.tpot_ms),
        )


#: ``PromptSeen``'s delivered figures: written, None too, where the stream's items were counted.
_DELIVERED = frozenset({"delivered_ttft_ms", "delivered_e2e_ms", "delivered_burst_tokens"})


@dataclass(frozen=True, kw_only=True, eq=False)
class PromptSeen(_StoredSection):
    """A measured callable's prompt as llama.cpp saw it (``prompt``): the cache state, its
    tokens in the median run, those evaluated and reused, the sampler's extras; a conversation's
    figures turn by turn; and its stream as the caller got it (``delivered_*``, where counted)."""

    prompt_cache: str | None = None
    prompt_tokens: int | None = None
    evaluated_prompt_tokens: int | None = None
    prompt_reused_tokens: int | None = None
    sampler: str | None = None
    turns: tuple[Turn, ...] | None = None
    delivered_items: int | None = None
    delivered_ttft_ms: float | None = None
    delivered_e2e_ms: float | None = None
    delivered_burst_tokens: int | None = None

    NULLABLE: ClassVar[frozenset[str]] = (
        frozenset({"prompt_tokens", "evaluated_prompt_tokens", "prompt_reused_tokens"}) | _DELIVERED
    )

    @classmethod
    def of(cls, m: Measurement) -> PromptSeen | None:
        """None when the engine is the plugin's own (its prompt is the workload's), but for a
        conversation (its reuse and its turns)."""
        if m.prompt_reused_tokens is None and m.delivered_items is None and not m.turns:
            return None
        return cls(
            prompt_cache=m.asked.prompt_cache,
            prompt_tokens=m.prompt_tokens,
            evaluated_prompt_tokens=m.evaluated_prompt_tokens,
            prompt_reused_tokens=m.prompt_reused_tokens,
            sampler=next((r.sampler for r in m.runs if r.sampler), ""),
            turns=tuple(Turn.of(t) for t in m.turns) or None,  # a conversation: its figures turn by turn
            delivered_items=m.delivered_items,
            delivered_ttft_ms=sig6(m.delivered_ttft_ms),
            delivered_e2e_ms=sig6(m.delivered_e2e_ms),
            delivered_burst_tokens=m.delivered_burst_tokens,
            absent=_DELIVERED if m.delivered_items is None else frozenset(),
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Requests(_StoredSection):
    """A prompt set's runs as a record stores them (``requests``; not a load test's: its
    requests overlap): run i's request, as ``Workload.request(i)`` drew it (its index in the
    set), and its prompt's tokens (a comparison pairs the runs of the same request)."""

    request: tuple[int, ...] | None = None
    prompt_tokens: tuple[int, ...] | None = None

    @classmethod
    def of(cls, m: Measurement) -> Requests | None:
        """None without a prompt set, for a load test, or where a run's prompt tokens are unknown."""
        w = m.asked
        lengths = tuple(r.prompt_tokens for r in m.runs)
        if w.prompt_set is None or w.is_load or any(n is None for n in lengths):
            return None
        return cls(
            request=tuple(drawn(w.prompt_set, w.seed, i) for i in range(len(m.runs))),
            prompt_tokens=tuple(n for n in lengths if n is not None),
        )

    @property
    def sent(self) -> tuple[tuple[int, int], ...] | None:
        """Each run's (request, prompt tokens), where both are kept."""
        if self.request is None or self.prompt_tokens is None:
            return None
        return tuple(zip(self.request, self.prompt_tokens))
