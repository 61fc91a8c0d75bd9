"""Where a change went: the parts of each phase (``catalog.PARTS``), B against A.

A phase's judged metric (TTFT, TPOT) decides the verdict; its parts explain it. Each part is
compared like the headline, on the same runs:

- **paired** (``--llmperf-against`` and an in-process A/B: pair i is A's run i and B's run i):
  the Hodges-Lehmann estimate of the per-pair differences B - A (in the part's unit) and its
  exact Wilcoxon signed-rank CI, the same statistics the headline's pairs use
  (``paired.location_ci``); for llama.cpp's own parts also the ratio B / A from the log
  differences;
- **unpaired** (a stored baseline): the two-sample Hodges-Lehmann shift (the median of every
  difference b_j - a_i) with the standard error its Mann-Whitney CI implies, widened by the
  between-session noise the headline's comparison used (``Comparison.between_sd``: the
  baseline's sessions or the history window), scaled to the part: a whole session that ran
  slower moves every part by the same factor, and that must not read as a part that moved.

A part **moved** when its phase moved (``explained_phases``: the verdict of its headline or of
the decode tail is REGRESSION, IMPROVED or MACHINE_SLOWER; an A/B's ``paired_explained_phases``:
its headline's CI excludes 1),
its two-sided p-value, Holm-adjusted over its phase's parts (a phase's line is one family), is
under alpha, and the change is material: at least ``MATERIAL_SHARE`` of A's phase time (a part
that moved 0.01 ms of a 20 ms TPOT explains nothing). The headline is the gate (a fixed
sequence: the phase first, then its parts): parts never add a false alarm to a phase that did
not move, so an A/A flags a part no more often than its headline flags the phase, whatever
two processes' llama.cpp time differs by (``gated``). Parts never decide: a phase's verdict is
its headline's; the parts are named in its line (``why_line``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import ndtr, ndtri

from ..core import catalog
from ..core.documents import JSONValue
from ..core.formats import finite
from ..core.measurement import RunMetrics
from .paired import PairedComparison, location_ci, signed_rank_p
from .verdict import CI_LEVEL, Comparison, Verdict, exp_clamped, fmt_pct, fmt_value, holm

if TYPE_CHECKING:
    from ..core.catalog import Metric

#: A part moved only when its change is at least this share of A's phase time (TTFT, TPOT).
MATERIAL_SHARE = 0.01


@dataclass(frozen=True)
class PartChange:
    """One part of a phase, B against A (A: the baseline, REF, or an A/B's A)."""

    metric: str  # the catalog metric: "decode_outside_ms_per_token"
    label: str  # "outside llama.cpp"
    phase: str
    unit: str
    source: str
    inside_llama_cpp: bool
    a_median: float
    b_median: float
    #: B - A in the part's unit: the estimate and its CI.
    delta: float
    delta_low: float
    delta_high: float
    #: B / A (llama.cpp's own parts, every value > 0), else None.
    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    #: Two-sided p-value of "no change", Holm-adjusted over its phase's parts.
    p_value: float
    n_a: int
    n_b: int
    paired: bool
    #: Its phase's headline moved, and the part is significant after Holm and material
    #: (``MATERIAL_SHARE`` of A's phase time).
    moved: bool

    def text(self) -> str:
        """``llama.cpp eval x1.00 (0.99..1.01)``, ``outside llama.cpp +1.9 ms/token (+1.7..+2.1)``."""
        return f"{self.label} {self.change_text()} ({self.ci_text()})"

    def change_text(self, unit: bool = True) -> str:
        """The change as every report shows it: ``x1.00`` (the ratio B/A, llama.cpp's own parts),
        else ``+1.9 ms/token`` (B - A; ``unit=False``: ``+1.9``)."""
        if self.ratio is not None and self.ratio_low is not None and self.ratio_high is not None:
            return f"x{self.ratio:.2f}"
        return f"{_signed(self.delta)} {self.unit}" if unit else _signed(self.delta)

    def ci_text(self) -> str:
        """The change's 95% CI as every report shows it: ``0.99..1.01`` (ratio), ``+1.7..+2.1`` (delta)."""
        if self.ratio is not None and self.ratio_low is not None and self.ratio_high is not None:
            return f"{self.ratio_low:.2f}..{self.ratio_high:.2f}"
        return f"{_signed(self.delta_low)}..{_signed(self.delta_high)}"

    def line(self) -> str:
        """The part with both sides' medians and its p, for a report's table or log."""
        return (
            f"{self.phase} {self.text()}: A {fmt_value(self.a_median)}, B {fmt_value(self.b_median)} {self.unit}, "
            f"p={self.p_value:.2g} Holm, {self._sample()}{'; moved' if self.moved else ''}"
        )

    def _sample(self) -> str:
        return f"{self.n_b} pairs" if self.paired else f"{self.n_b} vs {self.n_a} runs"

    def to_json(self) -> dict[str, JSONValue]:
        return {f.name: finite(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartChange:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


def _signed(x: float) -> str:
    return f"{x:+.3g}"


# --- one part: paired and unpaired -----------------------------------------------------------------


@dataclass(frozen=True)
class _Estimate:
    """A location with its CI, and the two-sided p of "0"."""

    value: float
    low: float
    high: float
    p: float


def _paired_estimate(d: np.ndarray) -> _Estimate:
    value, low, high = location_ci(d)
    return _Estimate(value, low, high, signed_rank_p(d))


def _unpaired_estimate(a: np.ndarray, b: np.ndarray, between_sd: float, scale: float) -> _Estimate:
    """The two-sample Hodges-Lehmann shift b - a, its standard error from the Mann-Whitney CI
    (normal approximation) and the between-session term (``between_sd`` x ``scale``: the log-scale
    sd of a session's level times the part's size), with a normal CI and p."""
    diffs = np.sort(np.subtract.outer(b, a).ravel())
    n, m = a.size, b.size
    z = float(ndtri(1.0 - (1.0 - CI_LEVEL) / 2.0))
    # Moses' CI: the C-th smallest and largest differences (1-based), C from the U statistic's null.
    k = math.floor(n * m / 2.0 - z * math.sqrt(n * m * (n + m + 1) / 12.0)) - 1
    k = min(max(k, 0), diffs.size - 1)
    within_se = (diffs[diffs.size - 1 - k] - diffs[k]) / (2.0 * z) if diffs.size > 1 else 0.0
    se = math.hypot(within_se, between_sd * scale)
    value = float(np.median(diffs))
    p = 1.0 if se <= 0 else float(2.0 * ndtr(-abs(value) / se))
    return _Estimate(value, value - z * se, value + z * se, p)


def _by_request_estimate(d: np.ndarray, between: float) -> _Estimate:
    """Per-pair differences ``d`` of runs that sent the same request in two sessions: their
    Hodges-Lehmann location with the standard error its signed-rank CI implies, widened by the
    between-session term ``between`` (in ``d``'s unit), a normal CI and p; without that term
    the exact paired statistics (``_paired_estimate``)."""
    if between <= 0:
        return _paired_estimate(d)
    value, low, high = location_ci(d)
    z = float(ndtri(1.0 - (1.0 - CI_LEVEL) / 2.0))
    se = math.hypot((high - low) / (2.0 * z), between)
    return _Estimate(value, value - z * se, value + z * se, float(2.0 * ndtr(-abs(value) / se)))


def _ratio_of(estimate: _Estimate) -> tuple[float, float, float]:
    return exp_clamped(estimate.value), exp_clamped(estimate.low), exp_clamped(estimate.high)


@dataclass(frozen=True)
class _Raw:
    """One part before Holm: its estimates, and whether its size is material."""

    spec: Metric
    a: np.ndarray
    b: np.ndarray
    delta: _Estimate
    ratio: tuple[float, float, float] | None
    material: bool
    #: Compared pair by pair on the runs that sent the same request (``_raw_by_request``).
    by_request: bool = False


def _phase_ms(runs: Sequence[RunMetrics], phase_metric: str) -> float:
    values = [getattr(r, phase_metric) for r in runs]
    return float(np.median(values)) if values else 0.0


def _observed(runs: Sequence[RunMetrics], name: str) -> np.ndarray | None:
    values = [getattr(r, name, None) for r in runs]
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return np.asarray(values, dtype=float)


def _measured(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Both sides observed the part in every run, in at least 2 runs, and it was not 0 throughout
    (a synthetic prompt is not tokenized: its tokenization is 0 on both sides, nothing to say)."""
    return a is not None and b is not None and min(a.size, b.size) >= 2 and bool(np.any(a != 0) or np.any(b != 0))


def _raw_paired(spec: Metric, a: np.ndarray, b: np.ndarray, phase_ms: float) -> _Raw:
    delta = _paired_estimate(b - a)
    ratio = None
    if spec.inside_llama_cpp and (a > 0).all() and (b > 0).all():
        ratio = _ratio_of(_paired_estimate(np.log(b) - np.log(a)))
    return _Raw(spec, a, b, delta, ratio, abs(delta.value) >= MATERIAL_SHARE * phase_ms)


def _raw_unpaired(spec: Metric, a: np.ndarray, b: np.ndarray, phase_ms: float, between_sd: float) -> _Raw:
    scale = abs(float(np.median(a)))
    delta = _unpaired_estimate(a, b, between_sd, scale)
    ratio = None
    if spec.inside_llama_cpp and (a > 0).all() and (b > 0).all():
        ratio = _ratio_of(_unpaired_estimate(np.log(a), np.log(b), between_sd, 1.0))
    return _Raw(spec, a, b, delta, ratio, abs(delta.value) >= MATERIAL_SHARE * phase_ms)


def _raw_by_request(spec: Metric, a: np.ndarray, b: np.ndarray, phase_ms: float, between_sd: float) -> _Raw:
    """A part of two sessions' runs paired by request (pair i: both sent the same request), so
    the mix of prompt lengths cancels: where every value is positive, B / A pair by pair (a part
    of a long prompt and of a short one change by the same factor, not by the same ms), the
    between-session sd on its log scale, its change in ms at A's median (that ratio applied to
    it); else B - A pair by pair, the between-session term scaled to the part as unpaired."""
    scale = abs(float(np.median(a)))
    if (a > 0).all() and (b > 0).all():
        log = _by_request_estimate(np.log(b) - np.log(a), between_sd)
        ratio = _ratio_of(log)
        value, low, high = (scale * (r - 1.0) for r in ratio)
        delta = _Estimate(value, low, high, log.p)
        kept = ratio if spec.inside_llama_cpp else None
    else:
        delta, kept = _by_request_estimate(b - a, between_sd * scale), None
    return _Raw(spec, a, b, delta, kept, abs(delta.value) >= MATERIAL_SHARE * phase_ms, by_request=True)


def _holm_by_phase(raws: Sequence[_Raw]) -> list[float]:
    """Each part's p-value Holm-adjusted over its phase's parts (a phase's line is one family)."""
    adjusted = [1.0] * len(raws)
    for phase in {r.spec.phase for r in raws}:
        at = [i for i, r in enumerate(raws) if r.spec.phase == phase]
        for i, p in zip(at, holm([raws[i].delta.p for i in at])):
            adjusted[i] = p
    return adjusted


def _changes(raws: Sequence[_Raw], alpha: float, paired: bool, sampler: str = "") -> tuple[PartChange, ...]:
    """The parts with their p-values Holm-adjusted over their phase's parts; ``sampler``: what
    the sampling part's chain held, named in its label where it held more than the usual
    samplers (``"sampling (llama.cpp: grammar)"``; else the catalog's label)."""
    adjusted = _holm_by_phase(raws)
    named = f"sampling (llama.cpp: {sampler})" if sampler else None
    out = []
    for r, p in zip(raws, adjusted):
        ratio, low, high = r.ratio if r.ratio is not None else (None, None, None)
        out.append(
            PartChange(
                metric=r.spec.name,
                label=named if named and r.spec.name == "sampling_ms_per_token" else r.spec.label,
                phase=r.spec.phase,
                unit=r.spec.unit,
                source=r.spec.source,
                inside_llama_cpp=r.spec.inside_llama_cpp,
                a_median=float(np.median(r.a)),
                b_median=float(np.median(r.b)),
                delta=r.delta.value,
                delta_low=r.delta.low,
                delta_high=r.delta.high,
                ratio=ratio,
                ratio_low=low,
                ratio_high=high,
                p_value=float(p),
                n_a=int(r.a.size),
                n_b=int(r.b.size),
                paired=paired or r.by_request,
                moved=bool(p < alpha and r.material),
            )
        )
    return tuple(out)


def paired_parts(a_runs: Sequence[RunMetrics], b_runs: Sequence[RunMetrics], *, alpha: float) -> tuple[PartChange, ...]:
    """Every part both sides observed in every run, pair by pair (``measuring.metrics.RunMetrics``;
    pair i = A's run i and B's run i)."""
    if len(a_runs) != len(b_runs):
        raise ValueError(f"parts: {len(a_runs)} A runs but {len(b_runs)} B runs; pairs need both")
    raws = []
    for spec in catalog.PARTS:
        a, b = _observed(a_runs, spec.name), _observed(b_runs, spec.name)
        if a is not None and b is not None and _measured(a, b):
            raws.append(_raw_paired(spec, a, b, _phase_ms(a_runs, spec.part_of or "")))
    sampler = next((str(r.sampler) for r in (*b_runs, *a_runs) if getattr(r, "sampler", "")), "")
    return _changes(raws, alpha, paired=True, sampler=sampler)


def unpaired_parts(
    baseline: Mapping[str, object],
    candidate: Mapping[str, object],
    phase_ms: Mapping[str, float],
    *,
    alpha: float,
    between_sd: Mapping[str, float],
    sampler: str = "",
    pairs: Sequence[int] = (),
) -> tuple[PartChange, ...]:
    """Every part both records hold (``record["parts"]``: part -> per-run values), the candidate
    against the baseline's runs, with each phase's between-session sd (``between_sd``: phase ->
    log-scale sd, the headline comparison's) and A's phase time (``phase_ms``: judged metric ->
    median ms); ``sampler``: what either side's sampler chain held (``_changes``).
    ``pairs``: the runs that sent the same request on both sides (a prompt set's,
    ``regression.request_pairs``): each part is then compared on those runs pair by pair, so a
    phase's "where the time went" is not the mix of prompt lengths; none: unpaired."""
    raws = []
    for spec in catalog.PARTS:
        a, b = baseline.get(spec.name), candidate.get(spec.name)
        if not a or not b:
            continue
        va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if not (np.isfinite(va).all() and np.isfinite(vb).all() and _measured(va, vb)):
            continue
        ms, between = phase_ms.get(spec.part_of or "", 0.0), between_sd.get(spec.phase, 0.0)
        if len(pairs) >= 2 and max(pairs) < min(va.size, vb.size):  # a value at every paired run
            at = np.asarray(pairs)
            raws.append(_raw_by_request(spec, va[at], vb[at], ms, between))
        else:
            raws.append(_raw_unpaired(spec, va, vb, ms, between))
    return _changes(raws, alpha, paired=False, sampler=sampler)


# --- what the parts say about a phase -------------------------------------------------------------


def of_phase(parts: Sequence[PartChange], phase: str) -> tuple[PartChange, ...]:
    """The phase's parts, those that moved first (the largest change first), then the rest in
    the catalog's order."""
    mine = [p for p in parts if p.phase == phase]
    moved = sorted((p for p in mine if p.moved), key=lambda p: -abs(p.delta))
    return (*moved, *(p for p in mine if not p.moved))


def llama_cpp_moved(parts: Sequence[PartChange], phase: str | None = None) -> bool:
    """llama.cpp's own time moved (a part inside llama.cpp moved) in ``phase`` (None: either)."""
    return any(p.moved and p.inside_llama_cpp and (phase is None or p.phase == phase) for p in parts)


def beyond_the_machine(parts: Sequence[PartChange], phase: str, phase_ms: float, threshold: float) -> str | None:
    """Why a busy machine does not explain ``phase``'s slowdown, else None: a part of it other
    than llama.cpp's evaluation (``catalog.EVAL_PARTS``) that moved and rose, at the low end of
    its CI, by more than the machine explains by at least ``threshold`` of the phase's time
    (``phase_ms``). The machine explains a part's rise up to the factor by which it slowed
    llama.cpp's evaluation in the same runs (the high end of that ratio's CI): those threads
    meet at a barrier every node, so a neighbour costs them more than it costs one thread of
    the code around them (a spinner here: llama.cpp eval x2.6-3.7, outside llama.cpp x1.5-1.6)."""
    mine = of_phase(parts, phase)
    gauge = next((p for p in mine if p.metric == catalog.EVAL_PARTS.get(phase) and p.ratio_high is not None), None)
    if gauge is None or gauge.ratio_high is None:
        return None
    allowed = max(gauge.ratio_high - 1.0, 0.0)
    over = [
        p for p in mine if p.moved and p is not gauge and p.delta_low - allowed * p.a_median >= threshold * phase_ms
    ]
    if not over:
        return None
    worst = max(over, key=lambda p: p.delta_low - allowed * p.a_median)
    return (
        f"{worst.text()} is more than the machine explains: it slowed {gauge.text()}, which takes "
        f"{worst.label} from {fmt_value(worst.a_median)} to {fmt_value(worst.a_median * (1.0 + allowed))} "
        f"{worst.unit} at most"
    )


#: A phase's headline comparison, B against A: a ``verdict.Comparison`` (baseline, REF) or a
#: ``paired.PairedComparison`` (an in-process A/B).
Headline = Comparison | PairedComparison


#: The verdicts whose line names the parts: the phase moved.
EXPLAINED = (Verdict.REGRESSION, Verdict.IMPROVED, Verdict.MACHINE_SLOWER)


def why_line(c: Headline, parts: Sequence[PartChange]) -> str | None:
    """``decode TPOT +8.8% (1.059..1.113): moved: outside llama.cpp +1.9 ms/token (+1.7..+2.1);
    unchanged: llama.cpp eval x1.00 (0.99..1.01), sampling x1.01 (0.99..1.02)``: the headline's
    change and the parts that moved and those that did not. None when the phase has no parts."""
    mine = of_phase(parts, c.phase)
    if not mine:
        return None
    head = f"{c.phase} {c.label} {fmt_pct((c.ratio - 1.0) * 100.0)}"
    if c.ci_low is not None and c.ci_high is not None:
        head += f" ({c.ci_low:.3f}..{c.ci_high:.3f})"
    moved = [p.text() for p in mine if p.moved]
    still = [p.text() for p in mine if not p.moved]
    said = [f"moved: {', '.join(moved)}" if moved else "no part moved on its own"]
    if still:
        said.append(f"unchanged: {', '.join(still)}")
    return f"{head}: {'; '.join(said)}"


def prompt_changes(a_tokens: object, b_tokens: object) -> tuple[str, ...]:
    """``("prompt tokens 22 -> 170",)`` where the two sides gave llama.cpp prompts of different
    lengths (a wrapper that builds a longer prompt: its TTFT's change is that prompt's), else ()."""
    if a_tokens is None or b_tokens is None or a_tokens == b_tokens:
        return ()
    return (f"prompt tokens {a_tokens} -> {b_tokens}",)


def is_headline(c: Headline) -> bool:
    """The comparison is its phase's judged headline (TTFT, TPOT), not a tail or a mirrored rate."""
    return catalog.PHASE_METRIC.get(c.phase) == c.metric


def explained_phases(comparisons: Sequence[Comparison]) -> frozenset[str]:
    """The phases one of whose judged comparisons moved (its verdict in ``EXPLAINED``): a
    baseline's or REF's, the headline or the decode tail (each one test of its phase in Holm's
    family, so either is a gate at alpha; mirrored rates follow their headline). Their parts are
    tested and named; the other phases' parts are not (``gated``). A tail REGRESSION whose whole
    CI lies beyond its threshold stops ``--llmperf-against``'s pairs while TPOT may still be
    INCONCLUSIVE: its red line says where decode's time went all the same."""
    return frozenset(c.phase for c in comparisons if c.mirror_of is None and c.verdict in EXPLAINED)


def paired_explained_phases(comparisons: Sequence[Headline]) -> frozenset[str]:
    """An A/B's (no verdict): the phases whose headline's CI excludes 1."""
    return frozenset(
        c.phase
        for c in comparisons
        if is_headline(c) and c.ci_low is not None and c.ci_high is not None and (c.ci_low > 1.0 or c.ci_high < 1.0)
    )


def gated(parts: Sequence[PartChange], phases: Collection[str]) -> tuple[PartChange, ...]:
    """``parts`` with ``moved`` kept only in ``phases`` (those whose headline moved): the
    headline is tested first and its parts only after it moved, so the parts add no false alarm
    to the headline's (a fixed-sequence procedure: the family's error rate stays alpha)."""
    return tuple(p if p.phase in phases or not p.moved else dataclasses.replace(p, moved=False) for p in parts)


def _why_lines(comparisons: Sequence[Headline], parts: Sequence[PartChange], phases: Collection[str]) -> list[str]:
    lines = (why_line(c, parts) for c in comparisons if is_headline(c) and c.phase in phases)
    return [line for line in lines if line is not None]


def why_lines(comparisons: Sequence[Comparison], parts: Sequence[PartChange]) -> list[str]:
    """One ``why_line`` per phase whose judged comparison moved (``explained_phases``)."""
    return _why_lines(comparisons, parts, explained_phases(comparisons))


def paired_why_lines(comparisons: Sequence[Headline], parts: Sequence[PartChange]) -> list[str]:
    """An A/B's: one ``why_line`` per phase whose headline moved (``paired_explained_phases``)."""
    return _why_lines(comparisons, parts, paired_explained_phases(comparisons))


def part_properties(prefix: str, parts: Sequence[PartChange]) -> list[tuple[str, object]]:
    """JUnit properties (``report.user_properties``) of each part, as every report shows it:
    ``<prefix>part.<metric>.change`` (``x1.01``, ``+0.903 ms/token``), ``.ci`` (its 95% CI) and
    ``.moved`` (``true`` or ``false``)."""
    out: list[tuple[str, object]] = []
    for p in parts:
        name = f"{prefix}part.{p.metric}"
        out += [
            (f"{name}.change", p.change_text()),
            (f"{name}.ci", p.ci_text()),
            (f"{name}.moved", str(p.moved).lower()),
        ]
    return out
