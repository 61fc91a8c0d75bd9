"""Two attributions compared (``measuring.attribution``): which layers and which ops moved.

A (REF, A of an A/B, the baseline) against B (this tree, B, now), per layer, per raw op type
and per group, prefill and decode apart. The unit is the run: each side's per-run medians of a
slice are the samples (tokens within a run are not independent). The ratio B/A is the
Hodges-Lehmann estimate on the log scale (the median of every log(b_j) - log(a_i), unpaired: a
baseline's pass ran in another session, so the two sides' runs are compared as two samples even
where they were interleaved) with its distribution-free 95% CI from the exact Mann-Whitney null
(Moses' interval: the k-th smallest and largest of those differences); five runs a side give it
at all, and a pass takes ``measuring.attribution.ATTRIBUTION_RUNS`` (8). A slice ``moved`` when its CI excludes 1 and the ratio is at least
``threshold`` away from 1. These explain a verdict, they decide nothing: no multiplicity
correction, and the reading names only what is beyond the threshold.

The reading of a phase, one line (``reading``):
- layers: the blocks' median ratio m; a block stands out when its CI excludes m and its ratio is
  more than ``UNIFORM_TOLERANCE`` off m ("layer 3 +900%, the rest unchanged"); with none standing
  out and the blocks' sum moved (its own ratio and CI, per run): "uniform across layers (+80%):
  a kernel or memory change", else "no layer moved";
- ops: the groups that moved, largest change in ms first ("matrix multiplication -18%,
  attention +3%"), and the op types only one side has ("FLASH_ATTN_EXT only in A").
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from scipy.stats import norm

from ..core.documents import JSONValue
from ..core.formats import sig6, stored_fields
from ..core.measurement import KINDS, PHASES, Attribution, Measurement, PhaseAttribution, Slice
from ..core.settings import DEFAULT_THRESHOLD
from ..core.workload import Workload
from ..engines.capabilities import times_layers
from ..measuring.attribution import interleaved
from ..measuring.runner import pass_of
from .parts import PartChange, llama_cpp_moved
from .verdict import CI_LEVEL, fmt_pct

#: A block whose ratio is more than this far off the blocks' median ratio (its CI excluding that
#: median) stands out; within it every block moved alike.
UNIFORM_TOLERANCE = 0.15
#: The reading names at most this many layers and groups.
NAMED = 3
#: The terminal block's width.
WIDTH = 80
#: A per-run value at or below this (ms) is taken as this: a slice absent from a run.
FLOOR_MS = 1e-6


@functools.cache
def _u_cdf(m: int, n: int) -> np.ndarray:
    """P(U <= u) under the null, u = 0..m*n: the coefficients of the Gaussian binomial
    [m+n choose m]_q over C(m+n, m), built as prod_i (1 - q^(n+i)) / (1 - q^i)."""
    size = m * n + 1
    c = np.zeros(size)
    c[0] = 1.0
    for i in range(1, m + 1):
        shift = n + i
        if shift < size:
            c[shift:] -= c[: size - shift].copy()
        for k in range(i, size):
            c[k] += c[k - i]
    cdf: np.ndarray = np.cumsum(c) / math.comb(m + n, m)
    return cdf


#: Up to this many runs a side the interval is exact; beyond, the normal approximation of U.
EXACT_UP_TO = 50


def _rank_k(m: int, n: int, alpha: float) -> int:
    """How many of the m*n differences each end of the CI leaves out (0: no CI at this level)."""
    if max(m, n) <= EXACT_UP_TO:
        cdf = _u_cdf(m, n)
        return int(np.searchsorted(cdf, alpha / 2, side="right"))
    z = float(norm.ppf(1 - alpha / 2))
    return max(0, math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12)))


def ratio_ci(
    a: Sequence[float], b: Sequence[float], level: float = CI_LEVEL
) -> tuple[float, float | None, float | None]:
    """B/A from per-run values: (HL ratio, CI low, CI high); the CI is None when the runs are
    too few for ``level``."""
    la = np.log(np.maximum(np.asarray(a, dtype=float), FLOOR_MS))
    lb = np.log(np.maximum(np.asarray(b, dtype=float), FLOOR_MS))
    d = np.sort((lb[None, :] - la[:, None]).ravel())
    ratio = math.exp(float(np.median(d)))
    k = _rank_k(la.size, lb.size, 1 - level)
    if k == 0:
        return ratio, None, None
    return ratio, math.exp(float(d[k - 1])), math.exp(float(d[d.size - k]))


@dataclass(frozen=True)
class SliceChange:
    """One layer, op type or group, B against A: medians over all steps (ms per step), the
    ratio of the runs (HL) and its CI; None where one side has no such slice."""

    name: str
    a_ms: float
    b_ms: float
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    moved: bool

    @property
    def only_in(self) -> str | None:
        """ "A" or "B" when one side alone has the slice."""
        if self.ratio is not None:
            return None
        return "A" if self.a_ms > 0 else "B"

    def change(self) -> str:
        """``+40%``, ``only in A``."""
        if self.ratio is None:
            return f"only in {self.only_in}"
        return fmt_pct((self.ratio - 1) * 100)

    def excludes(self, value: float) -> bool:
        return self.ci_low is not None and self.ci_high is not None and (self.ci_low > value or self.ci_high < value)

    def to_json(self) -> dict[str, JSONValue]:
        return cast("dict[str, JSONValue]", stored_fields(self))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SliceChange:
        def opt(key: str) -> float | None:
            return None if d.get(key) is None else float(d[key])

        return cls(
            str(d["name"]), float(d["a_ms"]), float(d["b_ms"]), opt("ratio"), opt("ci_low"), opt("ci_high"), d["moved"]
        )


def slice_change(a: Slice | None, b: Slice | None, threshold: float) -> SliceChange:
    name = (a or b).name  # type: ignore[union-attr]  # one of them is there
    if a is None or b is None or not any(a.per_run_ms) or not any(b.per_run_ms):
        a_ms, b_ms = (a.median_ms if a else 0.0), (b.median_ms if b else 0.0)
        return SliceChange(name, a_ms, b_ms, None, None, None, moved=True)
    ratio, lo, hi = ratio_ci(a.per_run_ms, b.per_run_ms)
    moved = lo is not None and hi is not None and (lo > 1 or hi < 1) and abs(ratio - 1) >= threshold
    return SliceChange(name, a.median_ms, b.median_ms, ratio, lo, hi, moved)


@dataclass(frozen=True)
class PhaseChange:
    """One phase: every layer, op type and group compared, and its reading."""

    phase: str
    layers: tuple[SliceChange, ...]
    ops: tuple[SliceChange, ...]
    groups: tuple[SliceChange, ...]
    reading: str
    a_step_ms: float
    b_step_ms: float

    def changes(self, kind: str) -> tuple[SliceChange, ...]:
        got: tuple[SliceChange, ...] = getattr(self, kind)
        return got

    def to_json(self) -> dict[str, JSONValue]:
        return {
            **{k: [c.to_json() for c in self.changes(k)] for k in KINDS},
            "reading": self.reading,
            "a_step_ms": sig6(self.a_step_ms),
            "b_step_ms": sig6(self.b_step_ms),
        }

    @classmethod
    def from_json(cls, phase: str, d: Mapping[str, Any]) -> PhaseChange:
        kinds = {k: tuple(SliceChange.from_json(c) for c in d.get(k, ())) for k in KINDS}
        a_ms, b_ms = (float(d.get(k) or 0.0) for k in ("a_step_ms", "b_step_ms"))
        return cls(phase, **kinds, reading=str(d.get("reading", "")), a_step_ms=a_ms, b_step_ms=b_ms)


def compare_phase(a: PhaseAttribution, b: PhaseAttribution, threshold: float = DEFAULT_THRESHOLD) -> PhaseChange:
    """Every slice of each kind that either side has, in A's order then B's new ones; where the
    two sides' transformer blocks differ (models of other layer counts or names), no block is
    compared: the reading says so in one line (``block_mismatch``)."""
    mismatch = block_mismatch(a, b)
    kinds = {}
    for kind in KINDS:
        by_a = {s.name: s for s in a.slices(kind)}
        by_b = {s.name: s for s in b.slices(kind)}
        names = list(by_a) + [n for n in by_b if n not in by_a]
        if kind == "layers" and mismatch:
            names = [n for n in names if not _is_block(n) and n in by_a and n in by_b]
        kinds[kind] = tuple(slice_change(by_a.get(n), by_b.get(n), threshold) for n in names)
    blocks = None if mismatch else slice_change(_blocks(a), _blocks(b), threshold)
    read = reading(kinds["layers"], kinds["groups"], kinds["ops"], threshold, blocks)
    read = f"{mismatch}; {read}" if mismatch else read
    return PhaseChange(a.phase, **kinds, reading=read, a_step_ms=a.step_ms, b_step_ms=b.step_ms)


def _is_block(name: str) -> bool:
    return name.startswith("layer ")


def block_mismatch(a: PhaseAttribution, b: PhaseAttribution) -> str | None:
    """One line when the two sides' transformer blocks are not the same blocks (another layer
    count, other names): blocks of different models are not compared one by one, nor as a
    whole ("uniform across layers" would compare 2 layers' time with 6's); None when they match."""
    names_a = [s.name for s in a.layers if _is_block(s.name)]
    names_b = [s.name for s in b.layers if _is_block(s.name)]
    if names_a == names_b:
        return None
    if len(names_a) != len(names_b):
        return f"layers not compared: A has {len(names_a)} layers, B {len(names_b)} (different models)"
    return "layers not compared: A's and B's layers are named differently (different models)"


def _blocks(p: PhaseAttribution) -> Slice:
    """All transformer blocks together: the pass's per-step sums (``PhaseAttribution.blocks``),
    or, from a pass that kept none, the sum of the blocks' per-run values."""
    if p.blocks is not None:
        return p.blocks
    blocks = [s for s in p.layers if _is_block(s.name)]
    per_run = tuple(float(v) for v in np.sum([s.per_run_ms for s in blocks], axis=0)) if blocks else ()
    return Slice("blocks", sum(s.median_ms for s in blocks), per_run)


def reading(
    layers: Sequence[SliceChange],
    groups: Sequence[SliceChange],
    ops: Sequence[SliceChange],
    threshold: float,
    blocks: SliceChange | None = None,
) -> str:
    """The phase's one line (module docstring); ``blocks``: all blocks together (their sum per run)."""
    return "; ".join(filter(None, (layer_reading(layers, threshold, blocks), op_reading(groups, ops))))


def layer_reading(layers: Sequence[SliceChange], threshold: float, together: SliceChange | None = None) -> str:
    """``together``: the blocks' sum compared (the uniform change's ratio and CI); None: the
    blocks' median ratio, moved when most blocks moved."""
    blocks = [c for c in layers if _is_block(c.name) and c.ratio is not None]
    if not blocks:
        return ""
    m = float(np.median([c.ratio for c in blocks]))
    out = [c for c in blocks if c.excludes(m) and abs(c.ratio / m - 1) > UNIFORM_TOLERANCE]  # type: ignore[operator]
    if out:
        out.sort(key=lambda c: -abs(math.log(c.ratio)))  # type: ignore[arg-type]
        rest = [c for c in blocks if c not in out]
        named = ", ".join(f"{c.name} {c.change()}" for c in out[:NAMED]) + (" ..." if len(out) > NAMED else "")
        if not rest:
            return named
        rest_m = float(np.median([c.ratio for c in rest]))
        moved = abs(rest_m - 1) >= threshold and sum(c.moved for c in rest) * 2 > len(rest)
        return f"{named}, the rest {fmt_pct((rest_m - 1) * 100) if moved else 'unchanged'}"
    if together is not None and together.ratio is not None:
        moved, m = together.moved, together.ratio
    else:
        moved = abs(m - 1) >= threshold and sum(c.moved for c in blocks) * 2 > len(blocks)
    if moved:
        return f"uniform across layers ({fmt_pct((m - 1) * 100)}): a kernel or memory change"
    return f"no layer moved (blocks {fmt_pct((m - 1) * 100)})"


def op_reading(groups: Sequence[SliceChange], ops: Sequence[SliceChange]) -> str:
    moved = sorted((c for c in groups if c.moved and c.ratio is not None), key=lambda c: -abs(c.b_ms - c.a_ms))
    named = [f"{c.name} {c.change()}" for c in moved[:NAMED]]
    named += [f"{c.name} {c.change()}" for c in ops if c.ratio is None]
    return ", ".join(named) if named else "no op group moved"


@dataclass(frozen=True)
class AttributionChange:
    """B against A: why the pass ran, both phases, what each side's pass cost, and each side's
    roofline and memory figures where known (``measuring.attribution.side_figures``)."""

    reason: str
    a_name: str
    b_name: str
    prefill: PhaseChange
    decode: PhaseChange
    cost: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)  # "A"/"B": Attribution.cost()
    sides: Mapping[str, Mapping[str, float]] = field(
        default_factory=dict
    )  # "A"/"B": measuring.attribution.side_figures()

    def phase(self, name: str) -> PhaseChange:
        return self.prefill if name == "prefill" else self.decode

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "reason": self.reason,
            "a": self.a_name,
            "b": self.b_name,
            "phases": {p: self.phase(p).to_json() for p in PHASES},
            "cost": {k: dict(v) for k, v in self.cost.items()},
            "sides": {k: dict(v) for k, v in self.sides.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AttributionChange:
        phases = d["phases"]
        return cls(
            str(d.get("reason", "")),
            str(d.get("a", "A")),
            str(d.get("b", "B")),
            PhaseChange.from_json("prefill", phases["prefill"]),
            PhaseChange.from_json("decode", phases["decode"]),
            {k: dict(v) for k, v in (d.get("cost") or {}).items()},
            {k: dict(v) for k, v in (d.get("sides") or {}).items()},
        )

    def lines(self) -> list[str]:
        """The terminal's block (80 columns): each phase's reading and its largest changes,
        each side's cost and roofline."""
        out = _wrapped(f"where llama.cpp's time went ({self.reason}): A {self.a_name}, B {self.b_name}")
        for p in PHASES:
            phase = self.phase(p)
            out += [*_wrapped(f"{p}: {phase.reading}"), *_table(phase)]
        for who in ("A", "B"):
            out += _wrapped(_side_line(who, self.cost.get(who) or {}, self.sides.get(who) or {}))
        return out


def _wrapped(text: str) -> list[str]:
    """``text`` in lines of the terminal's width, the later ones indented; none for ''."""
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def _table(ph: PhaseChange) -> list[str]:
    """The layers and the groups, one row each, and the op types that moved (80 columns); a
    side that lacks a slice shows ``-`` for it, never ``0``."""
    rows = [f"  {'':<24}{'A ms':>9}{'B ms':>9}  {'B/A':>9}  {'95% CI':<13}"]
    shown = [*ph.layers, *ph.groups, *(c for c in ph.ops if c.moved)]
    for c in shown:
        ratio = f"{c.ratio:.2f}" if c.ratio is not None else c.change()
        ci = f"{c.ci_low:.2f}..{c.ci_high:.2f}" if c.ci_low is not None and c.ci_high is not None else ""
        mark = " *" if c.moved else ""
        a_ms, b_ms = (_ms(c, side) for side in "AB")
        rows.append(f"  {c.name[:24]:<24}{a_ms:>9}{b_ms:>9}  {ratio:>9}  {ci:<13}{mark}".rstrip())
    return rows


def _ms(c: SliceChange, side: str) -> str:
    """One side's median ms per step of a slice; ``-`` where only the other side has it."""
    if c.only_in is not None and c.only_in != side:
        return "-"
    return f"{c.a_ms if side == 'A' else c.b_ms:.3g}"


def _side_line(who: str, cost: Mapping[str, float | None], figures: Mapping[str, float]) -> str:
    parts = []
    if (wall_s := cost.get("wall_s")) is not None:
        parts.append(f"pass {float(wall_s):.1f} s")
    for p in PHASES:
        ratio, cover = cost.get(f"{p}_overhead_ratio"), cost.get(f"{p}_coverage")
        if ratio is not None and cover is not None:
            parts.append(f"{p} x{float(ratio):.2f} instrumented, nodes {float(cover):.0%}")
    for key, label, unit in SIDE_FIGURES:
        if (value := figures.get(key)) is not None:
            parts.append(f"{label} {float(value):.3g}{unit}")
    return f"{who}: " + "; ".join(parts) if parts else ""


#: Each side's roofline and memory figures shown beside its attribution: key, label, unit.
SIDE_FIGURES = (
    ("decode_bw_gbs", "decode", " GB/s"),
    ("decode_mbu", "MBU", ""),
    ("peak_rss_mib", "peak RSS", " MiB"),
    ("kv_mib", "KV", " MiB"),
    ("compute_mib", "compute", " MiB"),
)


def compare_attributions(
    a: Attribution,
    b: Attribution,
    *,
    reason: str,
    a_name: str = "A",
    b_name: str = "B",
    threshold: float = DEFAULT_THRESHOLD,
    sides: Mapping[str, Mapping[str, float]] | None = None,
) -> AttributionChange:
    """B against A, both phases."""
    return AttributionChange(
        reason,
        a_name,
        b_name,
        compare_phase(a.prefill, b.prefill, threshold),
        compare_phase(a.decode, b.decode, threshold),
        {"A": a.cost(), "B": b.cost()},
        dict(sides or {}),
    )


# -- when the pass runs ------------------------------------------------------------------------


def why(asked: bool, moved: Sequence[str]) -> str | None:
    """Why the pass runs (the block's reason), or None: it does not. ``moved``: the phases whose
    llama.cpp time moved."""
    if asked:
        return "asked: attribution=True"
    if moved:
        return f"llama.cpp's {' and '.join(moved)} time moved"
    return None


def moved_phases(parts: Sequence[PartChange]) -> tuple[str, ...]:
    """The phases whose llama.cpp time moved: a part inside llama.cpp (its prompt evaluation,
    its evaluation per token) moved, B against A (``judge.parts.llama_cpp_moved``)."""
    return tuple(p for p in PHASES if llama_cpp_moved(parts, p))


def attribute_sides(
    a: object,
    b: object,
    workload: Workload,
    *,
    asked: bool,
    reason: str,
    a_name: str,
    b_name: str,
    sides: Mapping[str, Mapping[str, float]],
    orders: tuple[str, Sequence[str]],
) -> AttributionChange | str | None:
    """Both engines' passes (interleaved run by run in ``orders``: the warm-ups', each run's;
    ``measuring.interleave.pass_orders``), after every timed run, compared; or, when a side is no in-process llama.cpp engine, the one line why there is none
    (``asked``) or None (due by itself: a callable's test says nothing of a pass it cannot have)."""
    for name, engine in (("A", a), ("B", b)):
        if not times_layers(engine):
            return f"attribution not run ({reason}): side {name} is not in-process llama.cpp" if asked else None
    passes = {"A": pass_of(a, workload)}  # type: ignore[arg-type]  # times_layers: a llama.cpp engine
    try:
        passes["B"] = pass_of(b, workload)  # type: ignore[arg-type]
    except BaseException:
        passes["A"].close()
        raise
    got = interleaved(passes, *orders)
    return compare_attributions(got["A"], got["B"], reason=reason, a_name=a_name, b_name=b_name, sides=sides)


def record_figures(record: Measurement) -> dict[str, float]:
    """A stored record's roofline and memory figures, as ``measuring.attribution.side_figures``
    names them."""
    decode = record.roofline.decode if record.roofline is not None else None
    out = {
        "decode_bw_gbs": decode.achieved_bw_gbs if decode is not None else None,
        "decode_mbu": None if decode is None or decode.note else decode.mbu,
        "peak_rss_mib": memory.rss_mib if (memory := record.memory) is not None else None,
        "kv_mib": memory.kv_mib if memory is not None else None,
        "compute_mib": memory.compute_mib if memory is not None else None,
    }
    return {k: v for k, v in out.items() if isinstance(v, (int, float))}


#: A baseline's attribution pass that cannot be read: what to do about it.
UNREADABLE_FIX = "not compared (a diagnosis, never a gate); re-record the baseline with --llmperf-update-baselines"


def compare_records(
    baseline: Measurement, candidate: Measurement, threshold: float = DEFAULT_THRESHOLD
) -> AttributionChange | str | None:
    """The baseline's attribution against now's, when both records keep one (a test that asks
    for it: ``attribution=True``); else None; the line why not when the baseline's cannot be
    read (``readable``). A diagnosis beside the verdict, never a gate."""
    a, b = baseline.attribution or baseline.unread.get("attribution"), candidate.attribution
    if a is None or b is None:
        return None
    base = a if isinstance(a, Attribution) else readable(a)
    if isinstance(base, str):
        return base
    return compare_attributions(
        base,
        b,
        reason="asked: attribution=True",
        a_name="baseline",
        b_name="now",
        threshold=threshold,
        sides={"A": record_figures(baseline), "B": record_figures(candidate)},
    )


def readable(stored: object) -> Attribution | str:
    """A stored attribution pass (``Attribution.to_json``), or the one line why it cannot be
    read (not an object, empty, a field missing or of the wrong kind)."""
    if not isinstance(stored, Mapping) or not stored:
        what = "empty" if isinstance(stored, Mapping) else f"{type(stored).__name__}, not an object"
        return f"the baseline's attribution pass is {what}: {UNREADABLE_FIX}"
    try:
        return Attribution.from_json(stored)
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        cause = f"no {exc}" if isinstance(exc, KeyError) else type(exc).__name__
        return f"the baseline's attribution pass is damaged ({cause}): {UNREADABLE_FIX}"
