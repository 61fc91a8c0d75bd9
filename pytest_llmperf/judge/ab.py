"""Interleaved A/B comparisons with paired statistics and relative budgets (docs/ab.md).

The runs, interleaved in seeded AB/BA pairs, are ``measuring.interleave``'s; the statistics are
``judge.paired`` (on the level estimator), the relative budgets (max_slowdown, min_speedup;
min_top1_agreement, max_kl, max_kl_p99) ``judge.budgets``, the output agreement of the sides
``measuring.agreement`` (after every timed run); what a side may be:
``session.results.resolve_side``. No pytest.

A/B results on a pytest report: a section per comparison, one failure line per breached
budget, JUnit properties. Plain attribute work: no pytest import."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.catalog import PHASE_METRIC
from ..core.documents import JSONValue
from ..core.errors import ConfigError
from ..core.formats import finite, sig6
from ..core.measurement import Agreement, Measurement
from ..core.settings import DEFAULT_ALPHA
from ..core.workload import Workload
from ..measuring.agreement import compare_outputs
from ..measuring.attribution import side_figures
from ..measuring.interleave import Interleaved, Pairs, SoFar, interleave, measured, pass_orders, turns
from ..measuring.roofline import machine_peaks
from ..measuring.runner import as_engine
from .attribution import attribute_sides, moved_phases, why
from .budgets import (
    AgreementOutcome,
    BudgetOutcome,
    RelativeBudget,
    judge,
    judge_agreement,
    parse_agreement_budgets,
    parse_budgets,
)
from .paired import (
    FIRST_BLOCK,
    PAIRED_METRICS,
    PAIRS_PER_PROCESS,
    Levels,
    PairedComparison,
    grouped,
    observed_log_ratios,
    pair_levels,
    paired,
    pairs_per_process,
    two_level_ci,
)
from .parts import (
    PartChange,
    gated,
    paired_explained_phases,
    paired_parts,
    paired_why_lines,
    part_properties,
    prompt_changes,
)
from .verdict import exp_clamped

if TYPE_CHECKING:
    from ..core.measurement import RunMetrics
    from ..engines import TokenStream
    from ..engines.capabilities import Engine
    from .attribution import AttributionChange


@dataclass(frozen=True)
class Side:
    name: str
    engine: Engine | TokenStream


@dataclass(frozen=True)
class ABResult:
    """B against A: both sides' measurements, the pair orders, a paired comparison per metric
    and the relative budgets' outcomes."""

    label: str
    a_name: str
    b_name: str
    orders: tuple[str, ...]
    a: Measurement
    b: Measurement
    comparisons: tuple[PairedComparison, ...]
    budgets: tuple[BudgetOutcome, ...] = ()
    #: B's outputs against A's, computed after every timed run (None: not computed, a smoke run).
    agreement: Agreement | None = None
    agreement_budgets: tuple[AgreementOutcome, ...] = ()
    #: Where the change went: each phase's parts over the same pairs (``judge.parts``).
    parts: tuple[PartChange, ...] = ()
    #: Where llama.cpp's time went, both sides' passes compared after every timed run
    #: (``judge.attribution``): when asked, or when llama.cpp's part of a phase moved; else None.
    attribution: AttributionChange | None = None
    attribution_note: str = ""  # why the pass that was due did not run
    #: How the pairs' runs took turns: token by token where both engines pause between tokens.
    interleaved: Interleaved = Interleaved.RUN
    unstepped: str | None = None  # run by run: why not token by token
    #: The second level (docs/ab.md, "Instances: the second level"): the engine instance pairs
    #: the pairs ran on (each later block on a fresh pair), their build seconds (outside every
    #: timed region, not in the pairs'), the pairs of each block, what each level contributed to
    #: each comparison (two or more instance pairs: the comparisons are the two-level model's),
    #: and why one instance pair only (a side that cannot be built again, or one block).
    instance_pairs: int = 1
    build_s: float = 0.0
    blocks: tuple[int, ...] = ()
    levels: tuple[Levels, ...] = ()
    one_instance: str = ""

    def why(self) -> list[str]:
        """One line per phase whose headline moved, naming the parts that moved and did not."""
        lines = paired_why_lines(self.comparisons, self.parts)
        changed = prompt_changes(self.a.prompt_tokens, self.b.prompt_tokens)
        return [f"{line}; {', '.join(changed)}" for line in lines] if changed else lines

    def get(self, name: str) -> PairedComparison:
        """The comparison of a phase (``"decode"``) or a metric (``"tpot_ms"``)."""
        metric = PHASE_METRIC.get(name, name)
        for c in self.comparisons:
            if c.metric == metric:
                return c
        raise KeyError(f"no paired comparison of {name!r}; have {', '.join(c.metric for c in self.comparisons)}")

    @property
    def prefill(self) -> PairedComparison:
        return self.get("prefill")

    @property
    def decode(self) -> PairedComparison:
        return self.get("decode")

    @property
    def failed(self) -> tuple[BudgetOutcome | AgreementOutcome, ...]:
        """The budgets that fail the test: breached ones, and agreement budgets on sides that
        expose no token probabilities."""
        every: tuple[BudgetOutcome | AgreementOutcome, ...] = (*self.budgets, *self.agreement_budgets)
        return tuple(o for o in every if o.status.fails)

    def failure_lines(self) -> list[str]:
        prefix = f"[{self.label}] " if self.label else ""
        return [prefix + o.line(self.a_name, self.b_name) for o in self.failed]

    def lines(self, verbose: bool = False) -> list[str]:
        """The report section: the sides, every comparison, every budget; ``verbose`` (``-v``):
        what each level of the pairs contributed to each comparison."""
        n_ab = sum(1 for o in self.orders if o == "AB")
        out = [
            f"A: {self.a_name}",
            f"B: {self.b_name}",
            f"{len(self.orders)} pairs interleaved ({n_ab} AB, {len(self.orders) - n_ab} BA, seeded) "
            f"{turns(self.interleaved, self.unstepped)} after {self.a.asked.warmup} warm-up run(s) each; {self.a.asked.describe()}",
        ]
        out += self.instances_lines(verbose)
        out += [c.line() for c in self.comparisons]
        out += [f"where it went: {line}" for line in self.why()]
        out += [o.line(self.a_name, self.b_name) for o in self.budgets]
        if self.agreement is not None:
            out += self.agreement.lines()
        out += [o.line(self.a_name, self.b_name) for o in self.agreement_budgets]
        if self.attribution is not None:
            out += self.attribution.lines()
        elif self.attribution_note:
            out.append(self.attribution_note)
        return out

    def instances_lines(self, verbose: bool = False) -> list[str]:
        """The second level: how many instance pairs and their build seconds, or why one; with
        ``verbose``, what each level contributed to each comparison (``Levels.line``'s words, its
        upper level the engine instance pair: ``levels: decode TPOT: between 3 instance pairs sd
        0.81%, within their 20 pairs sd 2.10% (the instance level 40% of the CI's variance)``)."""
        if self.instance_pairs < 2:
            return (
                [f"the CI holds one instance pair (no second level): {self.one_instance}"] if self.one_instance else []
            )
        head = (
            f"{self.instance_pairs} engine instance pairs (blocks of {', '.join(map(str, self.blocks))} pairs, "
            f"each block after the first on a fresh pair built in {self.build_s:.1f} s in all, outside the timed "
            "runs); each CI from the two-level model over them"
        )
        return [head, *(f"levels: {one.line('instance')}" for one in self.levels)] if verbose else [head]


def first_blocks(runs: int) -> int:
    """The pairs of each of an A/B's first two blocks: a third of its ``runs``, within 3
    (``PAIRS_PER_PROCESS``' least) and ``FIRST_BLOCK`` (5, as ``--llmperf-against``'s), so that
    10 pairs run on three instance pairs: over two, Student's t has one degree of freedom and the
    CI is 12.7 standard errors wide on each side."""
    return min(FIRST_BLOCK, max(PAIRS_PER_PROCESS[0], runs // 3))


def block_size(so_far: SoFar) -> int:
    """The next block's pairs (``measuring.interleave.interleave``'s ``sizes``): the first two
    blocks ``first_blocks`` of the A/B's runs, each later one Kalibera-Jones' optimum from the
    levels measured so far and the costs (``pairs_per_process``: a fresh instance pair's build
    against a pair); a block that would leave fewer pairs than a block's least takes them too."""
    low = PAIRS_PER_PROCESS[0]
    n = len(so_far.groups)
    size = first_blocks(so_far.runs)
    if len(set(so_far.groups)) > 1:
        costs = so_far.build_s / max(so_far.fresh, 1), so_far.pairs_s / max(n, 1)
        size = pairs_per_process(pair_levels(so_far.a, so_far.b, so_far.groups, PAIRED_METRICS), *costs)
    left = so_far.runs - n
    return left if left - size < low else size


def two_level(
    c: PairedComparison, a: Sequence[RunMetrics], b: Sequence[RunMetrics], groups: Sequence[int]
) -> PairedComparison:
    """``c`` with the two-level model's estimate, CI and p (``judge.paired.two_level_ci`` over
    the instance pairs), as ``--llmperf-against`` judges its process pairs: never bolder than the
    pairs' own signed-rank CI and p (the CI spans both, p is the larger)."""
    d = observed_log_ratios(a, b, c.metric)
    assert d is not None  # ``c`` was compared: every run observed it
    t = two_level_ci(grouped(d, groups))
    return dataclasses.replace(
        c,
        ratio=exp_clamped(t.estimate),
        ci_low=min(exp_clamped(t.low), c.ci_low),
        ci_high=max(exp_clamped(t.high), c.ci_high),
        p_value=max(min(1.0, 2.0 * min(t.greater, t.less)), c.p_value),
    )


def compare_ab(
    a: Side,
    b: Side,
    workload: Workload,
    *,
    max_slowdown: object = None,
    min_speedup: object = None,
    label: str = "",
    min_top1_agreement: object = None,
    max_kl: object = None,
    max_kl_p99: object = None,
    agreement: bool = True,
    attribution: bool | None = False,
) -> ABResult:
    """Measure A and B interleaved (``workload.runs`` pairs, seeded by ``workload.seed``) and
    compare them per metric; then, after every timed run, compare their outputs
    (``measuring.agreement``; ``agreement=False``: not); judge the relative budgets; then, when
    ``attribution`` asks for it (True) or a phase moved (False: by itself; None: never), both
    sides' attribution passes (``judge.attribution``)."""
    _check_workload(workload)
    budgets = parse_budgets(max_slowdown, min_speedup)  # bad budgets fail before any run
    agreement_budgets = parse_agreement_budgets(
        min_top1_agreement=min_top1_agreement, max_kl=max_kl, max_kl_p99=max_kl_p99
    )
    if agreement_budgets and not agreement:
        raise ConfigError(f"{agreement_budgets[0][0].key} needs the output agreement (agreement=True)")
    ea, eb = as_engine(a.engine), as_engine(b.engine)
    pairs = interleave(ea, eb, workload, workload.seed, (a.name, b.name), sizes=block_size)
    # Every timed run is done: the outputs are compared on the same engines, untimed.
    outputs = compare_outputs(ea, eb, workload, a_name=a.name, b_name=b.name) if agreement else None
    ma = measured(pairs.a, pairs.a_warm, workload, ea.info(), "A")
    mb = measured(pairs.b, pairs.b_warm, workload, eb.info(), "B")
    own = _paired_comparisons(ma, mb)  # the pairs' own (one level): the parts' gate, as before
    comparisons, second = _instance_levels(ma, mb, pairs, own)
    outcomes = _judged_budgets(budgets, comparisons)
    judged = tuple(judge_agreement(budget, limit, outputs) for budget, limit in agreement_budgets if outputs)
    parts = gated(paired_parts(ma.runs, mb.runs, alpha=DEFAULT_ALPHA), paired_explained_phases(own))
    result = ABResult(
        *(label, a.name, b.name, pairs.orders, ma, mb, tuple(comparisons), tuple(outcomes), outputs, judged),
        parts=parts,
        interleaved=pairs.interleaved,
        unstepped=pairs.unstepped,
        **second,
    )
    return _attributed(result, ea, eb, workload, attribution)


def _instance_levels(
    ma: Measurement, mb: Measurement, pairs: Pairs, own: list[PairedComparison]
) -> tuple[list[PairedComparison], dict[str, Any]]:
    """The paired comparisons: the pairs' own (``own``), or over two or more instance pairs the
    two-level model's; and the ``ABResult``'s second-level fields."""
    groups = pairs.groups
    blocks = tuple(len(g) for g in grouped(np.asarray(groups), groups)) if groups else ()
    second: dict[str, Any] = {"instance_pairs": pairs.instance_pairs, "build_s": pairs.build_s, "blocks": blocks}
    if pairs.instance_pairs < 2:
        why = pairs.single or f"its {len(groups)} pairs are one block"
        return own, {**second, "one_instance": why}
    comparisons = [two_level(c, ma.runs, mb.runs, groups) for c in own]
    return comparisons, {**second, "levels": pair_levels(ma.runs, mb.runs, groups, [c.metric for c in own])}


def _attributed(result: ABResult, ea: Engine, eb: Engine, workload: Workload, asked: bool | None) -> ABResult:
    """``result`` with both sides' attribution passes compared, when asked or llama.cpp's part of
    a phase moved (``judge.parts.llama_cpp_moved``)."""
    reason = None if asked is None else why(asked, moved_phases(result.parts))
    if reason is None:
        return result
    peaks = machine_peaks()  # cached per machine: probed once
    sides = {"A": side_figures(result.a, peaks), "B": side_figures(result.b, peaks)}
    names = {"a_name": result.a_name, "b_name": result.b_name}
    orders = pass_orders(workload.seed)
    got = attribute_sides(ea, eb, workload, asked=bool(asked), reason=reason, sides=sides, orders=orders, **names)
    if got is None:
        return result
    if isinstance(got, str):
        return dataclasses.replace(result, attribution_note=got)
    return dataclasses.replace(result, attribution=got)


def _check_workload(workload: Workload) -> None:
    """A workload an A/B comparison can run: one request at a time, at least 3 pairs."""
    if workload.is_load:
        raise ConfigError("an A/B comparison runs one request at a time; drop concurrency/requests/rate/trace")
    if workload.runs < 3:
        raise ConfigError(f"an A/B comparison needs runs >= 3 pairs for a CI, got {workload.runs}")


def _paired_comparisons(ma: Measurement, mb: Measurement) -> list[PairedComparison]:
    """A against B per paired metric both sides observed in every run (a callable's prefill time is not)."""
    values = {m: ([getattr(r, m) for r in ma.runs], [getattr(r, m) for r in mb.runs]) for m in PAIRED_METRICS}
    return [paired(m, va, vb) for m, (va, vb) in values.items() if all(v is not None and v > 0 for v in va + vb)]


def _judged_budgets(budgets: Sequence[RelativeBudget], comparisons: Sequence[PairedComparison]) -> list[BudgetOutcome]:
    """Each relative budget's outcome on the comparison of its metric."""
    by_metric = {c.metric: c for c in comparisons}
    outcomes = []
    for budget in budgets:
        if budget.metric not in by_metric:
            raise ConfigError(f"{budget.kind}: {budget.target} is not observed for these sides")
        outcomes.append(judge(budget, by_metric[budget.metric]))
    return outcomes


def properties(results: Sequence[ABResult]) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for r in results:
        prefix = f"llmperf.ab[{r.label}]." if r.label else "llmperf.ab."
        for c in r.comparisons:
            out += [
                (f"{prefix}{c.metric}.ratio", round(c.ratio, 6)),
                (f"{prefix}{c.metric}.ci", f"{c.ci_low:.6g}..{c.ci_high:.6g}"),
            ]
        out.append((f"{prefix}interleaved", r.interleaved.value))
        out += _instance_properties(prefix, r)
        out += part_properties(prefix, r.parts)
        out += [(f"{prefix}budget.{o.budget.kind}.{o.budget.target}", o.status.value) for o in r.budgets]
        if r.agreement is not None:
            out += _agreement_properties(prefix, r.agreement)
        out += [(f"{prefix}budget.{o.budget.key}", o.status.value) for o in r.agreement_budgets]
        if r.attribution is not None:
            out += [(f"{prefix}attribution.{p}", r.attribution.phase(p).reading) for p in ("prefill", "decode")]
    return out


def _instance_properties(prefix: str, r: ABResult) -> list[tuple[str, object]]:
    """The second level as properties: the instance pairs, their build seconds, each level's sds
    (only where it ran on two or more instance pairs)."""
    if r.instance_pairs < 2:
        return []
    sds = [
        (f"{prefix}{one.metric}.{name}", round(sd, 6))
        for one in r.levels
        for name, sd in (("between_sd", one.between_sd), ("within_sd", one.within_sd))
    ]
    return [(f"{prefix}instance_pairs", r.instance_pairs), (f"{prefix}build_s", round(r.build_s, 3)), *sds]


def _agreement_properties(prefix: str, g: Agreement) -> list[tuple[str, object]]:
    """The output agreement's figures as properties, or why it is not available."""
    if not g.available:
        return [(f"{prefix}agreement", f"not available ({g.reason})")]
    out: list[tuple[str, object]] = [
        (f"{prefix}agreement.{name}", sig6(value))
        for name, value in (
            ("top1_agreement", g.top1_agreement),
            ("kl_mean", g.kl_mean),
            ("kl_p99", g.kl_p99),
            ("greedy_parity", g.greedy_parity),
        )
        if value is not None
    ]
    return [*out, (f"{prefix}agreement.positions", g.n_positions), (f"{prefix}agreement.method", g.method)]


def attach(report: Any, results: Sequence[ABResult], verbose: bool = False) -> Any:
    """Sections and failure lines on ``report`` (a pytest TestReport of the call phase);
    ``verbose`` (``-v``): each comparison's levels in the section."""
    lines: list[str] = []
    for r in results:
        section = "\n".join(r.lines(verbose))
        report.sections.append(("llmperf A/B" + (f" [{r.label}]" if r.label else ""), section))
        lines += r.failure_lines()
    if lines and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(lines)
    elif lines and report.failed and isinstance(report.longrepr, str):
        report.longrepr += "\n" + "\n".join(lines)
    return report


def as_dict(r: ABResult) -> dict[str, object]:
    """One A/B comparison as JSON values (the session JSON's ``ab`` entries): both sides'
    medians, every paired comparison and every relative budget's outcome."""

    def side(name: str, m: Measurement) -> dict[str, JSONValue]:
        figures = {k: finite(getattr(m, k)) for k in ("ttft_ms", "tpot_ms", "decode_tps", "e2e_ms")}
        return {"name": name, "engine": m.engine.describe(), "runs": m.n_runs, **figures}

    return {
        "label": r.label,
        "a": side(r.a_name, r.a),
        "b": side(r.b_name, r.b),
        "orders": list(r.orders),
        "interleaved": r.interleaved.value,  # token or run (plain data: xdist's wire takes no enum)
        "unstepped": r.unstepped,
        "comparisons": [{k: finite(v) for k, v in dataclasses.asdict(c).items()} for c in r.comparisons],
        "budgets": [
            {
                "kind": o.budget.kind,
                "target": o.budget.target,
                "metric": o.budget.metric,
                "value": o.budget.value,
                "status": o.status.value,  # plain data (xdist's wire takes no enum)
                "line": o.line(r.a_name, r.b_name),
            }
            for o in r.budgets
        ],
        "agreement": None if r.agreement is None else {k: finite(v) for k, v in r.agreement.to_json().items()},
        "agreement_budgets": [
            {
                "key": o.budget.key,
                "figure": o.budget.figure,
                "value": o.limit,
                "measured": finite(o.measured),
                "status": o.status.value,  # plain data (xdist's wire takes no enum)
                "line": o.line(r.a_name, r.b_name),
            }
            for o in r.agreement_budgets
        ],
        "parts": [p.to_json() for p in r.parts],
        "why": r.why(),
        "failures": r.failure_lines(),
        "attribution": None if r.attribution is None else r.attribution.to_json(),
        "attribution_note": r.attribution_note,
        # The second level (docs/ab.md): levels' "process_pairs" count instance pairs here.
        "instance_pairs": r.instance_pairs,
        "build_s": round(r.build_s, 3),
        "blocks": list(r.blocks),
        "levels": [one.to_json() for one in r.levels],
        "one_instance": r.one_instance,
    }
