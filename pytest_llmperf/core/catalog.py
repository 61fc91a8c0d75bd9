"""The metric catalog: every metric once, with the budget keys that bound it.

Each metric: its name, label, unit, phase, direction (``higher_is_better``), the budget keys
that bound it (``BUDGETS``), how it is read from a measurement and from a stored record, and
whether the baseline comparison judges it (``judged``, ``tail``, ``mirror_of``). ``SUMMARY``:
the figures of a measurement's summary (a record's ``summary``, the session table's columns).
``FIGURES``: a measurement's headline figures (the JUnit properties, ``judge.result.Figures``,
the session schema's ``figures``, the per-test metrics table), each declared with its type in
``HeadlineFigures`` beside them; a budgeted figure (``Figure.bound``) is also its budget key, so
a new headline figure with its budget, read from what a Measurement holds, is its entry and
its field here, in this one package file (the session schema's ``figures`` are filled in from
``FIGURES`` when the package loads it; an older session file without it writes back as it was),
then its rows in docs/report.md's figure table and the README's marker-key table, each of which
tests/test_catalog.py checks and names when missing. Every budget, comparison,
report, table and history label reads it, so a metric cannot mean one thing in a budget and
another in a report. No numpy at import (the plugin stays cheap to load).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the catalog imports nothing from the package at run time (tests/test_catalog.py)
    from .measurement import Measurement

#: How a figure is read from a measurement.
Reader = Callable[["Measurement"], float | None]
#: A headline figure's value: a number, or text (the model, the engine...), or None.
FigureValue = str | float | None

#: Phases a metric belongs to.
PHASES = ("prefill", "decode", "request", "delivery", "load", "roofline", "memory", "startup", "agreement")


@dataclass(frozen=True)
class Budget:
    """A marker key that bounds one statistic of a metric (a ceiling or a floor)."""

    key: str
    metric: str  # Metric.name
    label: str  # as a budget breach prints it: "TTFT median"
    help: str  # the marker key's help text (``pytest --markers``, error messages)
    #: The statistic, read from a Measurement / recomputed from a stored record.
    read: Reader
    from_record: Callable[[Measurement], float | None]
    pooled_tokens: bool = False  # the sample is pooled tokens (ITL), not runs
    share: bool = False  # the value is a share in (0, 1]
    statistic: str = "median"  # which statistic of the metric: "median", "p95", ...

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit

    @property
    def ceiling(self) -> bool:
        """True: the measured value must stay at or under the budget (lower is better)."""
        return not METRICS[self.metric].higher_is_better

    def holds(self, measured: float | None, limit: float) -> bool:
        """The budget's pass rule: measured, and at or under a ceiling / at or over a floor."""
        return measured is not None and (measured <= limit if self.ceiling else measured >= limit)


@dataclass(frozen=True)
class Metric:
    """One measured quantity: how it is named, which way is better, where it is stored."""

    name: str
    label: str  # short, without the phase, as comparisons print it: "TTFT", "TPS"
    unit: str
    phase: str
    higher_is_better: bool
    #: The Measurement's summary of this metric (median over runs unless said otherwise).
    read: Reader
    #: Per-run field of ``RunMetrics`` stored in a record's ``runs`` (None: not stored per run).
    run_field: str | None = None
    #: Elsewhere in a record (a load level's or the roofline's figures), as an attribute path of
    #: its typed sections (``_at``).
    record_path: tuple[str, ...] = ()
    #: Judged against the baseline: one comparison per phase (and the decode tail), each
    #: counting once in Holm's family; ``tail``: against the tail threshold.
    judged: bool = False
    tail: bool = False
    #: A rate of the same runs as this judged metric, reported with its verdict.
    mirror_of: str | None = None
    #: Attribute of a load test's ``LoadStats`` that holds this metric's per-request percentiles.
    load_stat: str | None = None
    #: A part of a phase (``PARTS``): the judged metric it is a part of ("ttft_ms", "tpot_ms"),
    #: where its value comes from, and whether it is llama.cpp's own time (compared as a
    #: ratio; the parts outside it as a difference in its unit). Its per-run values are the
    #: ``RunMetrics`` field of its name.
    part_of: str | None = None
    source: str = ""
    inside_llama_cpp: bool = False

    @property
    def budget_keys(self) -> tuple[str, ...]:
        return tuple(b.key for b in BUDGETS.values() if b.metric == self.name)

    @property
    def summary_key(self) -> str | None:
        """Key of a record's ``summary`` that holds ``read``'s value (None: not in the summary)."""
        return next((f.key for f in SUMMARY.values() if f.metric == self.name and f.reader is None), None)

    def from_record(self, record: Measurement) -> float | None:
        """The value ``read`` gives, from a stored record (None: the record lacks it)."""
        if self.part_of is not None:
            values = _runs(record, self.name, "parts")
            return float(statistics.median(values)) if values else None
        if self.summary_key is not None:
            return _summary(self.summary_key)(record)
        if self.run_field is not None:
            return _median_of(self.run_field)(record)
        return _at(*self.record_path)(record) if self.record_path else None


@dataclass(frozen=True)
class SummaryField:
    """One figure of a measurement's summary: a key of a record's ``summary`` and of a session
    row, and with ``column``, a column of the session summary table (``--llmperf-columns``)."""

    key: str
    metric: str  # Metric.name
    label: str  # before the unit in the session table's header: "TTFT" -> "TTFT ms"
    column: str | None = None
    #: None: the metric's own ``read``; else another statistic of it (a pooled ITL percentile).
    reader: Reader | None = None
    #: Shown by the short tables: the terminal's default columns, the Markdown summary.
    headline: bool = False

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit

    @property
    def header(self) -> str:
        return f"{self.label} {self.unit}"

    def read(self, m: Measurement) -> float | None:
        return (self.reader or METRICS[self.metric].read)(m)


# --- readers from a stored record (a Measurement read from a file: its per-run values and
# sections; numpy imported only when a percentile is needed) ----------------------------------


def _runs(record: Measurement, field: str, section: str = "runs") -> Sequence[float]:
    values = (record.run_columns if section == "runs" else record.part_columns).get(field)
    return values if isinstance(values, Sequence) and not isinstance(values, str) and values else []


def _median_of(field: str) -> Callable[[Measurement], float | None]:
    def read(record: Measurement) -> float | None:
        values = _runs(record, field)
        return float(statistics.median(values)) if values else None

    return read


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not len(values):
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


def pooled_itl(record: Measurement | None) -> list[float]:
    """Every run's inter-token latencies of a record, pooled."""
    return [float(v) for run in record.runs for v in run.itl_ms] if record is not None else []


def _pooled_percentile(q: float) -> Callable[[Measurement], float | None]:
    return lambda record: _percentile(pooled_itl(record), q)


def _summary(key: str) -> Callable[[Measurement], float | None]:
    """The reader of a record's summary figure ``key``."""
    return lambda record: record.summary.figures.get(key) if record.summary is not None else None


def _at(*path: str) -> Callable[[Measurement], float | None]:
    """The reader of the figure a record's typed sections hold at ``path`` (``("roofline",
    "decode", "mbu")``: ``record.roofline.decode.mbu``), where it is a number."""

    def read(record: Measurement) -> float | None:
        value: object = record
        for name in path:
            value = getattr(value, name, None)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return read


# --- readers from a Measurement ---------------------------------------------------------------


def _mbu(m: Measurement) -> float | None:
    return m.roofline.decode.mbu if m.roofline is not None else None


def _goodput(m: Measurement) -> float | None:
    return m.load.goodput if m.load is not None else None


def _rss_mib(m: Measurement) -> float | None:
    return m.peak_rss.bytes / 2**20 if m.peak_rss is not None else None


def _engine(field: str) -> Reader:
    """A memory figure of the engine (``EngineInfo``: llama.cpp's reports, the file mapping)."""
    return lambda m: getattr(m.engine, field)


def _loads(field: str) -> Reader:
    """A figure of the test's fresh model loads (``runner.ModelLoads``), None when none ran."""
    return lambda m: getattr(m.model_loads, field) if m.model_loads is not None else None


def _agreement(field: str) -> Reader:
    """A figure of this tree's output agreement with REF (``--llmperf-against``), else None."""
    return lambda m: getattr(m.agreement, field) if m.agreement is not None and m.agreement.available else None


#: What llama.cpp's buffer sizes are read from, as records and reports name it.
BUFFER_SOURCE = "llama.cpp log"


def direct_sample(metric: str, m: Measurement) -> str | None:
    """What a memory, start-up or agreement figure comes from (budget lines, the metrics table): a
    direct reading, not a statistic; None for a statistic over runs or tokens."""
    phase = METRICS[metric].phase
    if metric == "rss_mib":
        whole = m.peak_rss is not None and m.peak_rss.scope != "measurement"
        return f"peak over {m.n_runs} runs" + (", process lifetime" if whole else "")
    if phase == "memory":
        return "/proc/self/smaps" if metric == "mapped_mib" else BUFFER_SOURCE
    if phase == "startup":
        loads = m.model_loads
        return f"{len(loads.samples)} loads, {loads.page_cache}" if loads is not None else "no fresh loads"
    if phase == "agreement":
        g = m.agreement
        return "not compared with REF" if g is None else g.sample if g.available else "not available"
    return None


def _itl(q: int) -> Reader:
    """A pooled decode ITL percentile of a Measurement."""
    return lambda m: getattr(m.itl, f"p{q}_ms")


def _read(name: str) -> Reader:
    """A Measurement's median over runs of one of its per-run fields."""
    return lambda m: getattr(m, name)


#: The parts of TTFT and TPOT: (name, label, phase, source, llama.cpp's own), each in its phase's
#: unit and a part of its judged metric (``_PART_UNIT``, ``_PART_OF``). A served model's "llama.cpp" counters
#: are llama-server's ``timings`` (its sampling is inside them), so its "outside llama.cpp" is the
#: queue, the network and the client.
_PART_SPECS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("tokenize_ms", "tokenization", "prefill", "clock around the tokenizer, before the run", False),
    (
        "native_prefill_ms",
        "llama.cpp prompt eval",
        "prefill",
        "llama.cpp's t_p_eval_ms (llama_perf_context), or llama-server's timings.prompt_ms",
        True,
    ),
    ("prefill_outside_ms", "outside llama.cpp", "prefill", "TTFT - tokenization - llama.cpp prompt eval", False),
    (
        "native_decode_ms_per_token",
        "llama.cpp eval",
        "decode",
        "llama.cpp's t_eval_ms / n_eval (llama_perf_context), or llama-server's timings.predicted_ms / predicted_n",
        True,
    ),
    (
        "sampling_ms_per_token",
        "sampling (llama.cpp)",
        "decode",
        "llama.cpp's t_sample_ms / n_sample (llama_perf_sampler); a callable's Llama: the clock around its "
        "sampler chain (grammar, penalties, top-k/p, temperature, dist), less the Python logits processors",
        True,
    ),
    (
        "python_sampling_ms_per_token",
        "logits processors / stopping criteria (Python)",
        "decode",
        "the clock around a callable's Python logits processors and stopping criteria, per generated token",
        False,
    ),
    (
        "decode_outside_ms_per_token",
        "outside llama.cpp",
        "decode",
        "TPOT - llama.cpp eval - sampling inside the run - Python logits processors and stopping criteria",
        False,
    ),
)
#: Each phase's parts: their unit, and the judged metric they are a part of.
_PART_UNIT = {"prefill": "ms", "decode": "ms/token"}
_PART_OF = {"prefill": "ttft_ms", "decode": "tpot_ms"}


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        # Order: prefill first, then decode (the order of a record's per-run fields).
        Metric(
            "ttft_ms", "TTFT", "ms", "prefill", False, lambda m: m.ttft_ms, "ttft_ms", judged=True, load_stat="ttft"
        ),
        Metric(
            "prefill_tps", "TPS", "t/s", "prefill", True, lambda m: m.prefill_tps, "prefill_tps", mirror_of="ttft_ms"
        ),
        Metric("tpot_ms", "TPOT", "ms", "decode", False, lambda m: m.tpot_ms, "tpot_ms", judged=True, load_stat="tpot"),
        Metric("decode_tps", "TPS", "t/s", "decode", True, lambda m: m.decode_tps, "decode_tps", mirror_of="tpot_ms"),
        # Each run's own ITL percentiles (the sampling unit for comparisons is the run).
        Metric(
            "itl_p50_ms",
            "ITL p50",
            "ms",
            "decode",
            False,
            lambda m: statistics.median(r.itl_p50_ms for r in m.runs),
            "itl_p50_ms",
        ),
        Metric(
            "itl_p95_ms",
            "ITL p95",
            "ms",
            "decode",
            False,
            lambda m: statistics.median(r.itl_p95_ms for r in m.runs),
            "itl_p95_ms",
            judged=True,
            tail=True,
        ),
        # Every run's inter-token latencies pooled (budgets and display).
        Metric("itl_ms", "ITL", "ms", "decode", False, _itl(50)),
        Metric("prefill_ms", "prefill", "ms", "prefill", False, lambda m: m.prefill_ms),
        Metric("e2e_ms", "E2E", "ms", "request", False, lambda m: m.e2e_ms, load_stat="e2e"),
        # A measured callable's stream as the caller received it (its tokens are timed where
        # llama.cpp made them): the first delivered item, per run.
        Metric(
            "delivered_ttft_ms",
            "delivered TTFT",
            "ms",
            "delivery",
            False,
            lambda m: m.delivered_ttft_ms,
            "delivered_ttft_ms",
        ),
        Metric("goodput", "goodput", "share", "load", True, _goodput, record_path=("load", "goodput")),
        Metric(
            "decode_mbu",
            "decode MBU",
            "of peak bandwidth",
            "roofline",
            True,
            _mbu,
            record_path=("roofline", "decode", "mbu"),
        ),
        # Memory (docs/measurement.md): each from its most direct source, near-deterministic.
        Metric("rss_mib", "peak RSS", "MiB", "memory", False, _rss_mib, record_path=("memory", "rss_mib")),
        *(
            Metric(name, label, "MiB", "memory", False, _engine(name), record_path=("memory", name))
            for name, label in (
                ("kv_mib", "KV buffer"),
                ("compute_mib", "compute buffer"),
                ("model_buffer_mib", "model buffer"),
                ("mapped_mib", "model mapping"),
            )
        ),
        # Start-up: fresh loads of the model after the runs, when a test asks (``model_load``).
        *(
            Metric(name, label, "ms", "startup", False, _loads(name), record_path=("model_loads", name))
            for name, label in (("load_ms", "model load"), ("fresh_ttft_ms", "fresh TTFT"))
        ),
        # The parts of each phase (``PARTS``): where the time of TTFT and of TPOT went.
        *(
            Metric(
                name,
                label,
                _PART_UNIT[phase],
                phase,
                False,
                _read(name),
                part_of=_PART_OF[phase],
                source=source,
                inside_llama_cpp=inside,
            )
            for name, label, phase, source, inside in _PART_SPECS
        ),
        # Output agreement with --llmperf-against's REF (REF is A; measuring.agreement), after the pairs.
        *(
            Metric(name, label, unit, "agreement", higher, _agreement(name), record_path=("agreement", name))
            for name, label, unit, higher in (
                ("top1_agreement", "top-1 agreement", "share", True),
                ("kl_mean", "KL(REF||this) mean", "nats", False),
                ("kl_p99", "KL(REF||this) p99", "nats", False),
            )
        ),
    )
}

#: A record's ``summary`` and the session table's metric columns, in this order.
SUMMARY: dict[str, SummaryField] = {
    f.key: f
    for f in (
        SummaryField("ttft_ms", "ttft_ms", "TTFT", "ttft", headline=True),
        SummaryField("prefill_ms", "prefill_ms", "prefill"),
        SummaryField("prefill_tps", "prefill_tps", "prefill", "prefill"),
        SummaryField("tpot_ms", "tpot_ms", "decode per token (TPOT)"),
        SummaryField("decode_tps", "decode_tps", "decode", "decode", headline=True),
        SummaryField("e2e_ms", "e2e_ms", "E2E"),
        SummaryField("itl_p50_ms", "itl_ms", "ITL p50", "p50"),
        SummaryField("itl_p95_ms", "itl_ms", "ITL p95", "p95", _itl(95), headline=True),
        SummaryField("itl_p99_ms", "itl_ms", "ITL p99", "p99", _itl(99)),
        # The memory column set (``--llmperf-columns memory``) and the fresh loads' median.
        SummaryField("rss_mib", "rss_mib", "RSS", "rss"),
        SummaryField("kv_mib", "kv_mib", "KV", "kv"),
        SummaryField("compute_mib", "compute_mib", "compute", "compute"),
        SummaryField("load_ms", "load_ms", "load", "load"),
        # The agreement column set (``--llmperf-columns agreement``): against REF.
        SummaryField("top1_agreement", "top1_agreement", "top-1", "top1"),
        SummaryField("kl_mean", "kl_mean", "KL", "kl"),
    )
}


def is_ceiling(budget_key: str) -> bool:
    """True: the measured value must stay at or under the budget (lower is better)."""
    return BUDGETS[budget_key].ceiling


#: Per-run fields a record stores (and comparisons resample), prefill first, then decode.
RUN_FIELDS: tuple[str, ...] = tuple(m.run_field for m in METRICS.values() if m.run_field)

#: Judged against the baseline, in this order (``llmperf history``'s default metrics).
JUDGED: tuple[str, ...] = tuple(n for n, m in METRICS.items() if m.judged)
#: Each phase's judged time metric (an A/B phase budget, ``max_slowdown={"decode": 0.05}``).
PHASE_METRIC: dict[str, str] = {m.phase: n for n, m in METRICS.items() if m.judged and not m.tail}
#: The parts of each phase, prefill first (``Metric.part_of``): compared beside the judged
#: metric they are a part of, never deciding a verdict.
PARTS: tuple[Metric, ...] = tuple(m for m in METRICS.values() if m.part_of)
#: Each phase's part that is llama.cpp's graph evaluation on all its threads (they meet at a
#: barrier every node, so a busy machine slows it most: ``judge.parts.beyond_the_machine``).
EVAL_PARTS: dict[str, str] = {"prefill": "native_prefill_ms", "decode": "native_decode_ms_per_token"}

#: What an interleaved A/B compares pair by pair, in its report's order (times: b/a ratios).
PAIRED: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_p95_ms", "prefill_ms")


@dataclass(frozen=True)
class Figure:
    """A measurement's headline figure: a JUnit property (``llmperf.<name>``), a key of a
    session result's ``figures`` (its JSON type: ``json``), of the typed result's ``Figures``
    and of its terminal summary row; docs/report.md's figure table has a row for each. With
    ``metric``: a statistic of that catalog metric, a row of the per-test metrics table under
    ``label``. With ``bound`` (the help text): also a budget key, ``budget_key``, bounding it."""

    name: str
    read: Callable[[Measurement], FigureValue]
    metric: str | None = None
    label: str = ""  # "TTFT median"
    statistic: str = ""  # "median", "p95"
    pooled_tokens: bool = False  # the sample is pooled tokens (ITL), not runs
    #: JSON Schema types of its value in a session file.
    json: tuple[str, ...] = ("number",)
    #: A budget: its marker key's help text, how a stored record recomputes the figure, and
    #: its key when not the default (the name for a ceiling, ``min_<name>`` for a floor).
    bound: str = ""
    from_record: Callable[[Measurement], float | None] | None = None
    key: str = ""
    budget_label: str = ""  # as a budget breach prints it, when not ``label``

    @property
    def unit(self) -> str:
        return METRICS[self.metric].unit if self.metric else ""

    @property
    def budget_key(self) -> str:
        """The marker key that bounds this figure ("" when none does)."""
        if not self.bound:
            return ""
        return self.key or (f"min_{self.name}" if self.metric and METRICS[self.metric].higher_is_better else self.name)

    def number(self, m: Measurement) -> float | None:
        """The value of a figure of a metric (``read``'s, a number or None, never text)."""
        value = self.read(m)
        if isinstance(value, str):
            raise TypeError(f"figure {self.name!r} is text, not a number: {value!r}")
        return value

    def budget(self) -> Budget:
        assert self.metric is not None and self.from_record is not None, self.name
        return Budget(
            self.budget_key,
            self.metric,
            self.budget_label or self.label,
            self.bound,
            self.number,
            self.from_record,
            pooled_tokens=self.pooled_tokens,
            statistic=self.statistic,
        )


def _run_figure(name: str, metric: str, label: str, statistic: str, bound: str = "", key: str = "") -> Figure:
    """A statistic over runs of a per-run metric: "median" (the metric's own ``read``) or
    "p<q>" (the q-th percentile of the runs' values, numpy's linear interpolation), read from a
    Measurement's runs and recomputed from a record's ``runs``."""
    m = METRICS[metric]
    assert m.run_field is not None, metric
    field = m.run_field
    q = None if statistic == "median" else float(statistic.removeprefix("p"))

    def read(x: Measurement) -> float | None:
        return m.read(x) if q is None else _percentile([getattr(r, field) for r in x.runs], q)

    def from_record(record: Measurement) -> float | None:
        return _median_of(field)(record) if q is None else _percentile(_runs(record, field), q)

    return Figure(name, read, metric, label, statistic, bound=bound, from_record=from_record, key=key)


def _itl_figure(q: int) -> Figure:
    return Figure(
        f"itl_p{q}_ms",
        _itl(q),
        "itl_ms",
        f"ITL p{q}",
        f"p{q}",
        pooled_tokens=True,
        budget_label=f"decode ITL p{q}",
        bound=f"max pooled decode ITL p{q} (ms)",
        from_record=_pooled_percentile(q),
        key=f"p{q}_ms",
    )


_NULLABLE_INT, _NULLABLE = ("integer", "null"), ("number", "null")


def _memory_figure(
    name: str, label: str, statistic: str, bound: str = "", key: str = "", path: tuple[str, ...] = ("memory",)
) -> Figure:
    """A memory or start-up figure: its metric's value, stored under ``path`` in a record."""
    return Figure(
        name,
        METRICS[name].read,
        name,
        label,
        statistic,
        json=_NULLABLE,
        bound=bound,
        from_record=_at(*path, name),
        key=key,
    )


#: (name, label, statistic, budget help, budget key) of the memory figures.
_MEMORY_FIGURES = (
    (
        "rss_mib",
        "peak RSS",
        "peak",
        "max peak resident memory of the engine's process over the runs (MiB)",
        "max_rss_mib",
    ),
    ("kv_mib", "KV buffer", "llama.cpp", "max KV cache buffer as llama.cpp reports it (MiB)", "max_kv_mib"),
    (
        "compute_mib",
        "compute buffer",
        "llama.cpp",
        "max compute buffer as llama.cpp reports it (MiB)",
        "max_compute_mib",
    ),
    ("model_buffer_mib", "model buffer", "llama.cpp", "", ""),
    ("mapped_mib", "model file mapping", "smaps", "", ""),
)


def _agreement_method(m: Measurement) -> str | None:
    """How the agreement with REF was computed ("exact, full vocabulary"), or why it was not."""
    g = m.agreement
    return None if g is None else g.method if g.available else f"not available: {g.reason}"


#: The headline figures, in the order of the JUnit properties.
FIGURES: dict[str, Figure] = {
    f.name: f
    for f in (
        Figure("model", lambda m: m.engine.model, json=("string",)),
        Figure("engine", lambda m: m.engine.engine, json=("string",)),
        Figure("prompt_tokens", lambda m: m.prompt_tokens, json=_NULLABLE_INT),
        Figure("output_tokens", lambda m: m.output_tokens, json=("integer",)),
        Figure("runs", lambda m: m.n_runs, json=("integer",)),
        _run_figure("ttft_ms", "ttft_ms", "TTFT median", "median", "max median time to first token over runs (ms)"),
        _run_figure("ttft_p95_ms", "ttft_ms", "TTFT p95", "p95", "max p95 over runs of time to first token (ms)"),
        Figure(
            "prefill_ms",
            METRICS["prefill_ms"].read,
            "prefill_ms",
            f"{METRICS['prefill_ms'].label} median",
            "median",
            json=_NULLABLE,
        ),
        dataclasses.replace(
            _run_figure(
                "prefill_tps", "prefill_tps", "prefill TPS median", "median", "min median prefill (prompt) tokens/s"
            ),
            json=_NULLABLE,
        ),
        _run_figure("tpot_ms", "tpot_ms", "decode TPOT median", "median", "max median time per output token (ms)"),
        _run_figure(
            "tpot_p99_ms", "tpot_ms", "decode TPOT p99", "p99", "max p99 over runs of time per output token (ms)"
        ),
        _run_figure(
            "decode_tps", "decode_tps", "decode TPS median", "median", "min median decode tokens/s", key="min_tps"
        ),
        Figure(
            "e2e_ms",
            METRICS["e2e_ms"].read,
            "e2e_ms",
            "E2E median",
            "median",
            bound="max median end-to-end request time (ms)",
            from_record=_summary("e2e_ms"),
        ),
        dataclasses.replace(
            _run_figure(
                "delivered_ttft_ms",
                "delivered_ttft_ms",
                "delivered TTFT median",
                "median",
                "max median time to the first item a measured callable's stream delivered (ms; ttft_ms reads the "
                "first token llama.cpp made)",
            ),
            json=_NULLABLE,
        ),
        Figure("itl_count", lambda m: m.itl.count, json=("integer",)),
        *(_itl_figure(q) for q in (50, 90, 95, 99)),
        Figure("itl_cv", lambda m: m.itl.cv),
        Figure("native_prefill_ms", lambda m: m.native_prefill_ms, json=_NULLABLE),
        Figure("native_decode_ms_per_token", lambda m: m.native_decode_ms_per_token, json=_NULLABLE),
        Figure("overhead_ms_per_token", lambda m: m.overhead_ms_per_token, json=_NULLABLE),
        *(_memory_figure(*spec) for spec in _MEMORY_FIGURES),
        _memory_figure(
            "load_ms",
            "model load median",
            "median",
            "max median model load time over fresh loads (ms; model_load: warm or cold)",
            "max_load_ms",
            path=("model_loads",),
        ),
        Figure(
            "load_page_cache",
            lambda m: m.model_loads.page_cache if m.model_loads is not None else None,
            json=("string", "null"),
        ),
        Figure("load_samples", lambda m: len(m.model_loads.samples) if m.model_loads else None, json=_NULLABLE_INT),
        _memory_figure("fresh_ttft_ms", "fresh-engine TTFT median", "median", path=("model_loads",)),
        *(
            Figure(name, _agreement(name), name, METRICS[name].label, statistic, json=_NULLABLE)
            for name, statistic in (("top1_agreement", "share"), ("kl_mean", "mean"), ("kl_p99", "p99"))
        ),
        Figure("greedy_parity", _agreement("greedy_parity"), json=_NULLABLE),
        Figure("agreement_positions", _agreement("n_positions"), json=_NULLABLE_INT),
        Figure("agreement", _agreement_method, json=("string", "null")),
    )
}


@dataclass(frozen=True)
class HeadlineFigures:
    """The headline figures' declaration: one field per ``FIGURES`` entry, in its order, of the
    Python type of its JSON type (``Figure.json``; or None too where the session schema does not
    require it: an older session file may lack it), so that mypy reads each figure's type. The
    Outcome's ``judge.result.Figures`` is these with a load test's, and what reads and writes
    them; tests/test_catalog.py checks this declaration against ``FIGURES`` and the session
    schema and names a missing field."""

    model: str
    engine: str
    prompt_tokens: int | None
    output_tokens: int
    runs: int
    ttft_ms: float
    ttft_p95_ms: float
    prefill_ms: float | None
    prefill_tps: float | None
    tpot_ms: float
    tpot_p99_ms: float | None
    decode_tps: float
    e2e_ms: float
    delivered_ttft_ms: float | None
    itl_count: int
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p95_ms: float
    itl_p99_ms: float
    itl_cv: float
    native_prefill_ms: float | None
    native_decode_ms_per_token: float | None
    overhead_ms_per_token: float | None
    rss_mib: float | None
    kv_mib: float | None
    compute_mib: float | None
    model_buffer_mib: float | None
    mapped_mib: float | None
    load_ms: float | None
    load_page_cache: str | None
    load_samples: int | None
    fresh_ttft_ms: float | None
    top1_agreement: float | None
    kl_mean: float | None
    kl_p99: float | None
    greedy_parity: float | None
    agreement_positions: int | None
    agreement: str | None


#: Every budget key, in the order the marker's help lists them: the pooled ITL percentiles,
#: the other figures' (``Figure.bound``), then a load test's and the roofline's.
BUDGETS: dict[str, Budget] = {
    b.key: b
    for b in (
        *sorted((f.budget() for f in FIGURES.values() if f.bound), key=lambda b: not b.pooled_tokens),
        # A share each, as its metric reads it and a record stores it.
        *(
            Budget(key, m.name, m.label, help, m.read, _at(*m.record_path), share=True, statistic="share")
            for key, m, help in (
                ("min_goodput", METRICS["goodput"], "load: min share of requests meeting the ttft_ms and tpot_ms SLOs"),
                ("min_mbu", METRICS["decode_mbu"], "min decode memory-bandwidth utilization, e.g. 0.5 (roofline)"),
            )
        ),
    )
}

#: The session summary table: (``--llmperf-columns`` name, header, row field); ``test`` always
#: comes first; the metric columns are the summary fields that name a column.
SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("test", "test", "test"),
    ("model", "model", "model"),
    ("prompt", "prompt", "prompt_tokens"),
    ("gen", "gen", "output_tokens"),
    ("runs", "runs", "runs"),
    *((f.column, f.header, f.key) for f in SUMMARY.values() if f.column),
    ("budget", "budget", "budget"),
)
#: The short tables' metrics: the terminal's default columns, the Markdown summary.
HEADLINE: tuple[SummaryField, ...] = tuple(f for f in SUMMARY.values() if f.headline)


@dataclass(frozen=True)
class AgreementBudget:
    """A relative budget on an A/B's output agreement (``measuring.agreement``): a floor or a
    ceiling on one of its figures (an ``Agreement`` field), B against A, A the base. A marker
    key and a ``compare()`` keyword of kind ``ab``, like max_slowdown; judged exactly (the
    figures are deterministic, no CI), and an A/B whose sides expose no token probabilities
    fails it with a line that says so."""

    key: str
    figure: str  # the Agreement field it bounds
    label: str  # as its line prints it
    ceiling: bool
    help: str
    share: bool = False  # a share in [0, 1] (else a number >= 0)

    def holds(self, measured: float, limit: float) -> bool:
        return measured <= limit if self.ceiling else measured >= limit


#: The output-agreement budgets of an A/B, in the marker's help order.
AGREEMENT_BUDGETS: dict[str, AgreementBudget] = {
    b.key: b
    for b in (
        AgreementBudget(
            "min_top1_agreement",
            "top1_agreement",
            "top-1 agreement",
            False,
            "A/B: min share of positions where B's most likely next token is A's "
            "(teacher-forced on A's greedy tokens), e.g. 0.9",
            share=True,
        ),
        AgreementBudget(
            "max_kl",
            "kl_mean",
            "mean KL(A||B)",
            True,
            "A/B: max mean KL divergence of B's next-token distribution from A's (nats), e.g. 0.01",
        ),
        AgreementBudget(
            "max_kl_p99",
            "kl_p99",
            "KL(A||B) p99",
            True,
            "A/B: max p99 over positions of the KL divergence of B's next-token distribution from A's (nats)",
        ),
    )
}
