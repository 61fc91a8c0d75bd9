"""The one outcome of a test's measurement (``Outcome``), the verdict it carries
(``BaselineVerdict``), and the per-layer baseline diff in that verdict.

An ``Outcome`` is typed: its headline figures, its budgets, its record and the verdict against
its baseline (or ``--llmperf-against``'s REF), built here (``outcome``; the assessor builds the
judged part: ``session.assess``) and only read above. While it is live it also carries its
measurement and budget failure (what a ``pytest_llmperf_result`` hook sees). It travels as
itself within one process; ``to_json()`` is pytest-xdist's wire format (``from_json`` rebuilds
it), each entry of the ``--llmperf-json`` session file (``schemas/session.schema.json``), the
HTML report's input and ``llmperf compare`` / ``llmperf report``'s. The JUnit properties and the
terminal summary rows are the reports' views of it (``reports.session_file``), never parsed back.

The verdict is the judge's own object (``regression.judge`` decides it), kept as reported
(``BaselineVerdict.decided``: its short word and failure lines as they were at the time), with
its comparisons as ``verdict.Comparison`` objects.

Per-layer diff between two records that both carry layer timing: which layers got slower. A
layer counts as slower when its share of the step grew: each run's per-layer medians divided by
their sum are the samples (runs are independent, tokens within a run are not), a one-sided
Mann-Whitney U test on them (exact up to 50 runs a side) is significant at ``alpha`` after Holm
over all layers of both phases, and the median share grew by more than ``threshold``
(relative). Shares, not ms: the two sessions may run on a machine that got uniformly slower or
faster in between, which would move every layer's ms and say nothing about which layer changed;
a uniform slowdown is the phase verdicts' business. This is a diagnosis next to those verdicts,
which stay the gate."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
from scipy.stats import mannwhitneyu

from ..core.catalog import FIGURES, HeadlineFigures
from ..core.documents import JSONValue, SchemaViolation, validate
from ..core.errors import LLMPerfError
from ..core.measurement import LoadStats, Measurement, PhaseLayers, PromptSeen
from ..core.settings import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from .attribution import AttributionChange
from .budgets import BudgetFailure, BudgetStatus
from .parts import PartChange, why_lines
from .verdict import BaselineStatus, Comparison, Verdict, headline, holm, regression_cell


@dataclass(frozen=True)
class LayerChange:
    phase: str
    name: str
    baseline_ms: float
    now_ms: float
    baseline_share: float
    now_share: float
    p_value: float  # Holm-adjusted, one-sided (share now larger)
    slower: bool

    @property
    def change_pct(self) -> float:
        return (self.now_ms / self.baseline_ms - 1) * 100 if self.baseline_ms else 0.0

    def line(self) -> str:
        return (
            f"{self.phase} {self.name}: median {self.now_ms:.3g} ms vs {self.baseline_ms:.3g} ms "
            f"({self.change_pct:+.1f}%), {self.now_share:.1%} of the step vs {self.baseline_share:.1%} "
            f"(p={self.p_value:.2g} Holm)"
        )


def compare_layers(
    baseline: Measurement, candidate: Measurement, *, alpha: float = DEFAULT_ALPHA, threshold: float = DEFAULT_THRESHOLD
) -> tuple[LayerChange, ...]:
    """Every layer of both phases, baseline vs now; () when either record has no layer data or
    the models' layers differ."""
    rows = [row for phase, b, c in _matched_phases(baseline, candidate) for row in _phase_rows(phase, b, c)]
    adjusted = holm([r[-1] for r in rows]) if rows else []
    return tuple(
        LayerChange(phase, name, b_ms, c_ms, b_sh, c_sh, p, p < alpha and c_sh > b_sh * (1 + threshold))
        for (phase, name, b_ms, c_ms, b_sh, c_sh, _), p in zip(rows, adjusted)
    )


def _matched_phases(baseline: Measurement, candidate: Measurement) -> list[tuple[str, PhaseLayers, PhaseLayers]]:
    """(phase, baseline's, candidate's layer timing) of both phases; none when either record has
    no layer data (or none per run), or a phase's layers differ."""
    base, cand = baseline.layers, candidate.layers
    if base is None or cand is None:
        return []
    phases = [(phase, getattr(base, phase), getattr(cand, phase)) for phase in ("prefill", "decode")]
    if any(not b.per_run_ms or not c.per_run_ms or b.names != c.names for _, b, c in phases):
        return []
    return phases


def _phase_rows(phase: str, b: PhaseLayers, c: PhaseLayers) -> list[tuple[Any, ...]]:
    """Each layer of one phase: (phase, name, baseline ms, now ms, baseline share, now share,
    the one-sided p-value that its share grew, before Holm)."""
    b_share, c_share = _shares(b.per_run_ms), _shares(c.per_run_ms)
    rows = []
    for i, name in enumerate(b.names):
        if len(b_share) > 1 and len(c_share) > 1:
            method = "exact" if max(len(b_share), len(c_share)) <= EXACT_UP_TO_RUNS else "asymptotic"
            p = float(mannwhitneyu(c_share[:, i], b_share[:, i], alternative="greater", method=method).pvalue)
        else:
            p = 1.0
        shares = float(np.median(b_share[:, i])), float(np.median(c_share[:, i]))
        rows.append((phase, name, float(b.median_ms[i]), float(c.median_ms[i]), *shares, p))
    return rows


def _shares(per_run_ms: object) -> np.ndarray:
    runs = np.asarray(per_run_ms, dtype=float)
    shares: np.ndarray = runs / runs.sum(axis=1, keepdims=True)
    return shares


#: Up to this many runs on a side the U test's p-value is computed exactly (milliseconds): the
#: run counts tests use. The normal approximation overstates small p-values about tenfold at 10
#: runs a side (9e-5 against the exact 5e-6 for complete separation), and with Holm over every
#: layer of both phases a layer that clearly got slower would then miss ``alpha`` whenever a
#: busy machine lets one or two runs overlap.
EXACT_UP_TO_RUNS = 50


State = TypeVar("State", BaselineStatus, BudgetStatus)


class ResultError(LLMPerfError):
    """A result document that does not match ``schemas/session.schema.json``."""


#: Comparison fields added after session files were first published, written together unless
#: every one is at its default: a file an older pytest-llmperf wrote (without them) reads back
#: and writes the same, and every other comparison reads back equal (``comparison_from_json``).
LATER_FIELDS = ("df", "noise_source", "noise_sessions", "detectable")


def _at_default(c: Comparison, name: str) -> bool:
    f = next(f for f in dataclasses.fields(c) if f.name == name)
    return bool(getattr(c, name) == f.default)


def comparison_json(c: Comparison) -> dict[str, object]:
    """A comparison's fields, with the verdict's name and its line (for people reading the file);
    ``reference`` only for a comparison against ``--llmperf-against``'s REF, ``shown`` only where
    the figures' statistic is named."""
    later = not all(_at_default(c, name) for name in LATER_FIELDS)
    out = {
        f.name: getattr(c, f.name)
        for f in dataclasses.fields(c)
        if (later or f.name not in LATER_FIELDS)
        and (f.name != "reference" or c.reference)
        and f.name not in ("shown", "whole_ratio")
    }
    # The statistic of the figures shown, as its word (plain data); absent where not named (an
    # older file); the location over every run only where the level left runs out.
    shown = {"shown": c.shown.value} if c.shown is not None else {}
    if "noise_source" in out:
        out["noise_source"] = c.noise_source.value  # plain data for every wire (xdist's too)
    whole = {"whole_ratio": c.whole_ratio} if c.whole_ratio is not None else {}
    return {**out, **shown, **whole, "verdict": c.verdict.value, "line": c.line()}


def comparison_from_json(d: Mapping[str, Any]) -> Comparison:
    names = {f.name for f in dataclasses.fields(Comparison)}
    return Comparison(**{k: v for k, v in d.items() if k in names and k != "verdict"}, verdict=Verdict(d["verdict"]))


def layer_change_json(c: LayerChange) -> dict[str, object]:
    return {**{f.name: getattr(c, f.name) for f in dataclasses.fields(c)}, "change_pct": c.change_pct}


def layer_change_from_json(d: Mapping[str, Any]) -> LayerChange:
    return LayerChange(**{f.name: d[f.name] for f in dataclasses.fields(LayerChange)})


@dataclass(frozen=True)
class BaselineVerdict:
    """What the baseline (or ``--llmperf-against``'s REF) said about one measurement: its
    comparisons and the diagnoses beside them (``regression.judge`` decides it). ``short`` (one
    cell) and ``failures`` (the regression lines) are kept as they were decided (``decided()``),
    so a later reader (the session-end steps, a session file) shows what the run showed."""

    status: BaselineStatus
    note: str = ""
    comparisons: tuple[Comparison, ...] = ()
    #: What changed in the subject since the baseline (other-hardware: the hardware fields
    #: that differ from the closest recorded machine).
    changes: tuple[str, ...] = ()
    #: Per-layer diff when both records carry layer timing (a diagnosis, not a gate).
    layer_changes: tuple[LayerChange, ...] = ()
    #: Machine reference, candidate/baseline (None: not measured on both sides); shown only, not stored.
    machine_ratio: float | None = None
    #: Why the machine, not the subject, explains a slowdown (``regression.machine_blame``), else "".
    machine: str = ""
    #: Memory figures grown beyond ``regression.MEMORY_RULE`` since the baseline, one line each
    #: (stored as its lines in ``failures`` and its phase in ``short``).
    memory_changes: tuple[str, ...] = ()
    #: Where the change went: each phase's parts, compared like the headline (``judge.parts``).
    parts: tuple[PartChange, ...] = ()
    #: Where llama.cpp's time went (``judge.attribution``), when both sides had a pass.
    attribution: AttributionChange | None = None
    short: str = ""
    failures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", BaselineStatus(self.status))  # a word read from JSON, typed

    @property
    def slower_layers(self) -> tuple[LayerChange, ...]:
        return tuple(c for c in self.layer_changes if c.slower)

    @property
    def regressions(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.verdict is Verdict.REGRESSION)

    def decided(self) -> BaselineVerdict:
        """This verdict with its cell and failure lines as they read now (``short``, ``failures``)."""
        return dataclasses.replace(self, short=self._cell(), failures=tuple(self.failure_lines()))

    def failure_lines(self) -> list[str]:
        suffix = f"; {', '.join(self.changes)}" if self.changes else ""
        lines = [c.line() + suffix for c in self.regressions] + [m + suffix for m in self.memory_changes]
        lines += [f"where it went: {line}" for line in why_lines(self.regressions, self.parts)]
        if self.regressions and self.slower_layers:
            lines.append("slower layers: " + "; ".join(c.line() for c in self.slower_layers))
        return lines

    def _cell(self) -> str:
        """One cell for the summary table."""
        if self.status is not BaselineStatus.COMPARED:
            return str(self.status)
        if self.regressions or (self.memory_changes and self.comparisons):
            return regression_cell({c.phase for c in self.regressions} | ({"memory"} if self.memory_changes else set()))
        return headline(c.verdict for c in self.comparisons).value  # none: INCONCLUSIVE (the note says why)

    def why(self) -> list[str]:
        """One line per phase that moved, naming the parts that moved and those that did not, and
        what changed between the sides (a setting, the prompt's length)."""
        lines = why_lines(self.comparisons, self.parts)
        return [f"{line}; {', '.join(self.changes)}" for line in lines] if self.changes else lines

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status.value,
            "note": self.note,
            "changes": list(self.changes),
            "machine": self.machine,
            "short": self.short,
            "failures": list(self.failures),
            "comparisons": [comparison_json(c) for c in self.comparisons],
            "layer_changes": [layer_change_json(c) for c in self.layer_changes],
            # Only when measured: a session file written before the parts reads back and writes the same.
            **({"parts": [p.to_json() for p in self.parts], "why": self.why()} if self.parts else {}),
            # Only when there is one: older readers and files stay as they were.
            **({"attribution": self.attribution.to_json()} if self.attribution is not None else {}),
        }

    @property
    def reference(self) -> str:
        """``--llmperf-against``'s REF the comparisons were judged against (``Comparison.reference``,
        e.g. ``git:main (3f2a1b9c0d1e)``); "" for a stored baseline."""
        return next((c.reference for c in self.comparisons if c.reference), "")

    @property
    def pairs(self) -> int:
        """How many interleaved pairs the comparisons against REF used (0 for a stored baseline)."""
        return max((c.n_candidate for c in self.comparisons if c.reference), default=0)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BaselineVerdict:
        return cls(
            d["status"],
            d.get("note", ""),
            tuple(comparison_from_json(c) for c in d.get("comparisons", ())),
            tuple(d.get("changes", ())),
            tuple(layer_change_from_json(c) for c in d.get("layer_changes", ())),
            machine=d.get("machine", ""),
            parts=tuple(PartChange.from_json(p) for p in d.get("parts", ())),
            attribution=AttributionChange.from_json(a)
            if isinstance(a := d.get("attribution"), Mapping) and a
            else None,
            short=d.get("short", d["status"]),
            failures=tuple(d.get("failures", ())),
        )


@dataclass(frozen=True)
class LoadFigures:
    """A load test's headline figures (``LoadStats``)."""

    concurrency: int
    requests: int
    failed_requests: int
    requests_per_s: float
    output_tps: float
    goodput: float | None

    @classmethod
    def of(cls, load: LoadStats) -> LoadFigures:
        return cls(load.concurrency, load.n_requests, load.n_failed, load.requests_per_s, load.output_tps, load.goodput)


@dataclass(frozen=True)
class Figures(HeadlineFigures):
    """A measurement's headline figures, the Outcome's: the catalog's ``HeadlineFigures`` (one
    field per ``catalog.FIGURES`` entry, in its order, declared beside it), unrounded, as the
    JUnit properties and the terminal summary show them (the record's ``summary`` is the rounded
    subset kept in files), then ``load``. ``absent``: the figures a stored ``figures`` lacked (an
    older session file's, added to the catalog since): None here, and not written back, so the
    file is written as it was read."""

    load: LoadFigures | None = None
    absent: InitVar[frozenset[str]] = frozenset()
    #: ``absent`` as given (a fresh one's: none); not a field, so two Figures of the same values
    #: are equal however they were read.
    absent_figures: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self, absent: frozenset[str]) -> None:
        if absent:
            object.__setattr__(self, "absent_figures", absent)

    @classmethod
    def of(cls, m: Measurement) -> Figures:
        """From a ``Measurement``, each figure read as the catalog says (the fields are in its order)."""
        load = None if m.load is None else LoadFigures.of(m.load)
        figures: list[Any] = [*(f.read(m) for f in FIGURES.values()), load]  # each of its field's type
        return cls(*figures)

    def values(self) -> dict[str, Any]:
        """Flat name -> value of every figure but ``load``, in the catalog's order."""
        return {name: getattr(self, name) for name in FIGURES}

    def to_json(self) -> dict[str, JSONValue]:
        figures = {k: v for k, v in self.values().items() if k not in self.absent_figures}
        return {**figures, "load": None if self.load is None else dataclasses.asdict(self.load)}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Figures:
        """A figure a session file of an older pytest-llmperf lacks (added to the catalog since)
        reads as None (and is not written back: ``absent``)."""
        load = d.get("load")
        figures: dict[str, Any] = {k: d.get(k) for k in FIGURES}
        if isinstance(load, Mapping):
            figures["load"] = LoadFigures(**{f.name: load[f.name] for f in dataclasses.fields(LoadFigures)})
        return cls(**figures, absent=frozenset(FIGURES) - set(d))


@dataclass(frozen=True)
class Outcome:
    """The outcome of one measurement of one test: its figures and budgets, and (``assessed``)
    its record, the baseline file and entry it belongs to, and the verdict against that entry
    (built by ``outcome``; stored and loaded by ``to_json`` / ``from_json``)."""

    test: str  # node id, plus ``[label]`` for a labelled measurement
    nodeid: str = ""
    label: str = ""
    budget: BudgetStatus = BudgetStatus.NONE
    budget_failures: tuple[str, ...] = ()  # one line per breached budget
    breached_budgets: tuple[str, ...] = ()  # their marker keys (min_tps...)
    budgets: Mapping[str, float] = field(default_factory=dict)  # the marker's
    #: What a ``pytest_llmperf_result`` hook attached (JSON values).
    extra_info: Mapping[str, object] = field(default_factory=dict)
    figures: Figures | None = None  # None: read from a session file that predates them
    key: str = ""  # the baseline entry's key, e.g. ``test_decode[q4]#warm``
    baseline_file: str = ""  # relative to the baseline folder
    hardware_key: str = ""
    record: Measurement | None = None  # the stored record (schemas/baselines.schema.json)
    verdict: BaselineVerdict | None = None
    baseline_record: Measurement | None = None  # the entry the verdict compared against
    #: One line per budget whose CI straddles its limit (undecided: passes, and says so).
    budget_notes: tuple[str, ...] = ()
    #: A measured callable's prompt as llama.cpp saw it and its stream as the caller received it
    #: (``core.measurement.PromptSeen``: the cache state, prompt tokens evaluated and reused,
    #: the delivered figures); None for the plugin's own engine.
    prompt: PromptSeen | None = None
    # Live only (a hook's view): the measurement and the budgets it broke of its ``n_budgets``, whose
    # lines its budget words then are (``failure=None`` waives them). Init-only, so the fields stay
    # the schema's; kept as attributes that ``dataclasses.replace`` carries over; unset when read.
    if TYPE_CHECKING:
        measurement: Measurement | None = None
        failure: BudgetFailure | None = None
        n_budgets: int = 0
    else:
        measurement: InitVar[Measurement | None] = None
        failure: InitVar[BudgetFailure | None] = None
        n_budgets: InitVar[int] = 0

    def __post_init__(  # the type checker sees no init-only variables, so they take its defaults
        self,
        measurement: Measurement | None = None,  # noqa: RUF033
        failure: BudgetFailure | None = None,  # noqa: RUF033
        n_budgets: int = 0,  # noqa: RUF033
    ) -> None:
        object.__setattr__(self, "budget", BudgetStatus(self.budget))  # a word read from JSON, typed
        for name, value in (("measurement", measurement), ("failure", failure), ("n_budgets", n_budgets)):
            object.__setattr__(self, name, value)
        if measurement is not None:
            breaches = failure.breaches if failure is not None else ()
            object.__setattr__(self, "budget", BudgetStatus.of(n_budgets, failure is not None))
            object.__setattr__(self, "budget_failures", tuple(b.line() for b in breaches))
            object.__setattr__(self, "breached_budgets", tuple(b.key for b in breaches))

    @property
    def baseline(self) -> Outcome | None:
        """The judged part (record, key, verdict) as hooks read it before; None: not judged."""
        return self if self.assessed or self.verdict is not None else None

    @property
    def over_budget(self) -> bool:
        """A budget of the marker was breached (fails the test unless ``--llmperf-baselines-only``)."""
        return self.budget is BudgetStatus.FAIL

    @property
    def regressed(self) -> bool:
        """The verdict against the baseline (or REF) has failure lines: a regression."""
        return self.verdict is not None and bool(self.verdict.failures)

    @property
    def failed(self) -> bool:
        """This measurement fails its test: it regressed or went over budget (a session with
        ``--llmperf-baselines-only`` fails on regressions alone: ``regressed``)."""
        return self.regressed or self.over_budget

    @property
    def reference(self) -> str:
        """``--llmperf-against``'s REF this result was judged against, else "" (``BaselineVerdict.reference``)."""
        return self.verdict.reference if self.verdict is not None else ""

    @property
    def assessed(self) -> bool:
        """Recorded for the baselines (a smoke run or a failed load test is not)."""
        return self.record is not None

    def to_json(self) -> dict[str, object]:
        """Plain JSON data (``schemas/session.schema.json#/$defs/result``); ``from_json`` inverts it."""
        return {
            "test": self.test,
            "nodeid": self.nodeid,
            "label": self.label,
            "key": self.key,
            "baseline_file": self.baseline_file,
            "hardware_key": self.hardware_key,
            "record": None if self.record is None else self.record.to_json(),
            "budget": self.budget.value,
            "budget_failures": list(self.budget_failures),
            "budget_notes": list(self.budget_notes),
            "breached_budgets": list(self.breached_budgets),
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "baseline_record": None if self.baseline_record is None else self.baseline_record.to_json(),
            "budgets": dict(self.budgets),
            "extra_info": dict(self.extra_info),
            "figures": None if self.figures is None else self.figures.to_json(),
            **({"prompt": self.prompt.to_json()} if self.prompt else {}),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "result", *, check: bool = True) -> Outcome:
        """A result from its JSON data; a ``ResultError`` naming the JSON path (``where`` is
        its root) and the problem when ``d`` does not match the schema (``check=False``: the
        caller validated it already). Keys a session file of an older pytest-llmperf lacks
        take their defaults."""
        if check:
            try:
                validate(d, "session", "result", where)
            except SchemaViolation as exc:
                raise ResultError(str(exc)) from None
        verdict, figures = d.get("verdict"), d.get("figures")
        if verdict is not None:
            _state(BaselineStatus, verdict["status"], f"{where}.verdict.status")
        return cls(
            d["test"],
            d.get("nodeid", ""),
            d.get("label", ""),
            _state(BudgetStatus, d.get("budget", "-"), f"{where}.budget"),
            tuple(d.get("budget_failures", ())),
            tuple(d.get("breached_budgets", ())),
            dict(d.get("budgets") or {}),
            dict(d.get("extra_info") or {}),
            None if figures is None else Figures.from_json(figures),
            d.get("key", ""),
            d.get("baseline_file", ""),
            d.get("hardware_key", ""),
            None if (record := d.get("record")) is None else Measurement.read(record),
            None if verdict is None else BaselineVerdict.from_json(verdict),
            None if (base := d.get("baseline_record")) is None else Measurement.read(base),
            tuple(d.get("budget_notes", ())),
            PromptSeen.read(p) if isinstance(p := d.get("prompt"), Mapping) and p else None,
        )


def outcome(
    m: Measurement,
    test: str,
    nodeid: str,
    failure: BudgetFailure | None,
    n_budgets: int,
    *,
    budgets: Mapping[str, float] | None = None,
    budget_notes: Sequence[str] = (),
    judged: Outcome | None = None,
) -> Outcome:
    """The outcome of measurement ``m`` of test ``test`` (node ``nodeid``): its figures, its
    budgets (``failure``: those it broke, of ``n_budgets``; ``budget_notes``: those it could not
    decide) and, once assessed, what ``judged`` holds: its record, its baseline entry and the
    verdict against it (``session.assess.Assessor.assess``)."""
    return dataclasses.replace(
        judged if isinstance(judged, Outcome) else Outcome(test),
        test=test + (f"[{m.label}]" if m.label else ""),
        nodeid=nodeid,
        label=m.label or "",
        budget_notes=tuple(budget_notes),
        budgets=dict(budgets or {}),
        figures=Figures.of(m),
        prompt=PromptSeen.of(m),
        measurement=m,
        failure=failure,
        n_budgets=n_budgets,
    )


#: Its public names before it was the one outcome: ``pytest_llmperf.MeasurementResult`` (docs/api.md)
#: and ``pytest_llmperf.Result``, what a ``pytest_llmperf_result`` hook received (docs/hooks.md).
MeasurementResult = Result = Outcome


def _state(kind: type[State], word: object, path: str) -> State:
    """``word`` as a state of ``kind``; a ``ResultError`` naming ``path`` when it is none."""
    try:
        return kind(word)
    except ValueError:
        shown = ", ".join(s.value for s in kind)
        raise ResultError(f"{path} is {json.dumps(word)[:60]}, not one of {shown}") from None
