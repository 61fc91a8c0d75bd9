"""The HTML report's chart primitives (style, colours, blank charts, SVG output) and the
session-wide charts: the trend plot, the change overview, the served-load curve.

Matplotlib Figure objects (no pyplot, no GUI backend) saved as SVG text, all sharing one style,
one colour per side (now, baseline, budget), fixed margins instead of a layout pass, blank
charts kept for reuse and small SVG. The charts of one test's record are ``record_charts``.
("Figure": a number, as ``catalog.FIGURES``; matplotlib's ``Figure`` keeps its name.)

The change overview is the HTML report's key figure, the whole session at the top of the page.
A served load curve joins the points of one test function (one per concurrency or label).
The parts chart: where each phase's time went, A's parts and B's side by side."""

from __future__ import annotations

import functools
import io
import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import formats as nodeids
from ..core.errors import LLMPerfError
from ..judge.verdict import Verdict

if TYPE_CHECKING:
    from collections.abc import Callable

    from matplotlib.axes import Axes
    from matplotlib.axis import XAxis, YAxis
    from matplotlib.figure import Figure
    from matplotlib.ticker import Locator

    from ..core.measurement import LoadStats
    from ..history.series import Trend
    from ..judge.parts import PartChange
    from ..judge.result import Outcome
    from ..judge.verdict import Comparison


NOW = "#1f5fbf"
BASELINE = "#8c8c8c"
BUDGET = "#c0392b"
FIRST_RUN = "#e67e22"
WIDTH_IN = 5.4
#: The charts' font size (points), their tick labels' too.
TICK_FONT_PT = 8.5

RC = {
    "svg.fonttype": "none",  # text stays text: small files, searchable, selectable
    "svg.hashsalt": "pytest-llmperf",  # deterministic ids
    "font.family": "sans-serif",
    "font.size": TICK_FONT_PT,
    "axes.titlesize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e3e3",
    "grid.linewidth": 0.6,
    "legend.fontsize": 7.5,
    "legend.frameon": False,
    "path.simplify": True,
    "text.parse_math": False,  # test names may hold "$"; mathtext parsing is also the slow part
    "font.sans-serif": ["DejaVu Sans"],
    "axes.titley": 1.0,  # a fixed title position: placing it measures every tick label
}


class ReportError(LLMPerfError):
    """The HTML report cannot be drawn (matplotlib, the ``report`` extra, is not installed)."""


def require_matplotlib() -> ModuleType:
    """The matplotlib module, or a one-line error that says what to install."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401  (the part we use)
    except ImportError:
        raise ReportError('the HTML report needs matplotlib: pip install "pytest-llmperf[report]"') from None
    return matplotlib


#: Blank charts kept for reuse, by shape: creating axes and their ticks is half the cost of
#: drawing one, and every test of a report draws the same few shapes.
_BLANK: dict[tuple[object, ...], Figure] = {}


def _reset(fig: Figure) -> None:
    """Back to blank: the data artists, legends and limits go; axes and ticks stay."""
    fig.legends.clear()
    for ax in fig.axes:
        for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts]:
            artist.remove()
        if ax.legend_ is not None:
            ax.legend_.remove()
        ax.set_xscale("linear")  # also restores the default locators and formatters
        ax.set_yscale("linear")
        ax.set_title("")
        ax.set_xlabel("")
        ax.set_ylabel("")
        ax.grid(True)
        ax.relim()
        ax.set_autoscale_on(True)
        ax.ignore_existing_data_limits = True


def new_chart(
    height_in: float,
    width_in: float = WIDTH_IN,
    margins_in: tuple[float, float, float, float] = (0.62, 0.5, 0.15, 0.3),
    reuse: bool = False,
) -> tuple[Figure, Axes]:
    """A figure of one axes (``chart_row``)."""
    fig, (ax,) = chart_row(height_in, 1, width_in, margins_in, reuse=reuse)
    return fig, ax


def chart_row(
    height_in: float,
    ncols: int,
    width_in: float = WIDTH_IN,
    margins_in: tuple[float, float, float, float] = (0.62, 0.5, 0.15, 0.3),
    wspace: float = 0.3,
    reuse: bool = False,
) -> tuple[Figure, list[Axes]]:
    """A figure with fixed margins (left, bottom, right, top in inches) and its row of
    ``ncols`` axes: a constrained layout would draw every chart twice, and 200 tests x 4
    charts must render in seconds.

    ``reuse``: hand out the same blank figure again for the same shape (only for figure
    functions that set every property they change, whatever the data)."""
    from matplotlib.figure import Figure

    key = (height_in, ncols, width_in, margins_in, wspace)
    if reuse and key in _BLANK:
        fig = _BLANK[key]
        _reset(fig)
    else:
        fig = Figure(figsize=(width_in, height_in))
        left, bottom, right, top = margins_in
        fig.subplots_adjust(
            left=left / width_in,
            bottom=bottom / height_in,
            right=1 - right / width_in,
            top=1 - top / height_in,
            wspace=wspace,
        )
        fig.subplots(1, ncols, squeeze=False)
        if reuse:
            _BLANK[key] = fig
    for ax in fig.axes:
        ax.locator_params(nbins=4)
    return fig, fig.axes


_NUMBER = re.compile(r"(\d+\.\d)\d+")
_FONT = re.compile(r"font-family: [^;\"]*;? ?")
_ID = re.compile(r'\sid="([^"]+)"')
_NOOP_ROTATE = re.compile(r' transform="rotate\(-?0 [\d.]+ [\d.]+\)"')


_TAG = re.compile(r"<[^>]+>")
#: One font rule per figure instead of a font list on every text element.
FONT_CSS = "text{font-family:'DejaVu Sans',Verdana,Geneva,sans-serif}"


def _minify_tag(match: re.Match[str]) -> str:
    tag = _NUMBER.sub(r"\1", match.group(0))  # inside tags only: text keeps its digits
    tag = re.sub(r"\s+", " ", tag)
    tag = _FONT.sub("", tag)
    return _NOOP_ROTATE.sub("", tag)


def minify(svg: str) -> str:
    """Smaller SVG, same picture: coordinates to 0.1 pt (1/720 inch), no layout whitespace,
    one font rule instead of a font list per text, no ids that nothing references."""
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = _TAG.sub(_minify_tag, svg)
    svg = re.sub(r">\s+<", "><", svg)
    svg = svg.replace("stroke-linecap: butt}", "stroke-linecap: butt}" + FONT_CSS, 1)
    used = set(re.findall(r"#([\w.-]+)", svg))
    svg = _ID.sub(lambda m: m.group(0) if m.group(1) in used else "", svg)
    return svg.replace(' style=""', "").strip()


def _svg(fig: Figure) -> str:
    """The figure as a minified SVG element: no XML prolog, DOCTYPE, comment or metadata."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    return minify(buf.getvalue())


def plain_log(axis: XAxis | YAxis) -> None:
    """Log axis with plain tick labels (0.5, 1, 2) instead of 10^x, as many as fit without
    overlapping (``log_ticks``, at draw time: the axis's limits and length then)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

    axis.set_major_locator(_spaced_log_locator()(axis.axis_name == "x"))
    axis.set_major_formatter(FuncFormatter(lambda v, _: tick_label(v)))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def tick_label(value: float) -> str:
    """A log axis's tick label: ``0.5``, ``20``, ``1e+04``."""
    return f"{value:g}"


#: The ladders of a log axis's ticks, densest first: the multiples of each decade it marks,
#: then one decade in 1, 2, 3, 5 or 10.
TICK_LADDERS: tuple[tuple[tuple[float, ...], int], ...] = (
    ((1.0, 2.0, 5.0), 1),
    ((1.0, 3.0), 1),
    ((1.0,), 1),
    ((1.0,), 2),
    ((1.0,), 3),
    ((1.0,), 5),
    ((1.0,), 10),
)

#: The least room between two tick labels (inches), and a digit's width and a line's height
#: as a share of the font size (DejaVu Sans).
TICK_GAP_IN = 0.08
DIGIT_EM = 0.64
LINE_EM = 1.25


def tick_size_in(label: str, horizontal: bool, font_pt: float = TICK_FONT_PT) -> float:
    """How far a tick label reaches along its axis (inches): its width on an x axis, its
    height on a y axis."""
    return (len(label) * DIGIT_EM if horizontal else LINE_EM) * font_pt / 72.0


def log_ticks(low: float, high: float, length_in: float, horizontal: bool) -> list[float]:
    """The ticks of a log axis from ``low`` to ``high`` drawn ``length_in`` inches long: the
    densest ladder (``TICK_LADDERS``) whose neighbouring labels keep ``TICK_GAP_IN`` apart;
    at least the one tick nearest the middle where even one per 10 decades is too many."""
    if not (0 < low < high) or not np.isfinite(high) or length_in <= 0:
        return []
    span = np.log10(high / low)
    for subs, every in TICK_LADDERS:
        ticks = _ladder(low, high, subs, every)
        if len(ticks) >= 2 and _apart(ticks, span, length_in, horizontal):
            return ticks
        if len(ticks) < 2 and subs == TICK_LADDERS[0][0]:
            return ticks  # a range too narrow for two: its one tick (or none) never overlaps
    middle = np.sqrt(low * high)
    return [min(_ladder(low, high, (1.0,), 1) or [middle], key=lambda t: abs(np.log10(t / middle)))]


def _ladder(low: float, high: float, subs: Sequence[float], every: int) -> list[float]:
    """The values ``sub * 10**k`` between ``low`` and ``high`` (``k`` a multiple of ``every``)."""
    first, last = int(np.floor(np.log10(low))), int(np.ceil(np.log10(high)))
    return [
        float(f"{sub * 10.0**k:.12g}")
        for k in range(first, last + 1)
        if k % every == 0
        for sub in subs
        if low <= sub * 10.0**k <= high
    ]


def _apart(ticks: Sequence[float], span: float, length_in: float, horizontal: bool) -> bool:
    """Neighbouring tick labels keep ``TICK_GAP_IN`` apart on an axis ``span`` decades long."""
    for a, b in itertools.pairwise(ticks):
        room = length_in * np.log10(b / a) / span
        reach = (tick_size_in(tick_label(a), horizontal) + tick_size_in(tick_label(b), horizontal)) / 2
        if room < reach + TICK_GAP_IN:
            return False
    return True


@functools.cache
def _spaced_log_locator() -> Callable[[bool], Locator]:
    """The class of a log axis's major locator that places ``log_ticks`` (made once: it
    subclasses matplotlib's Locator, imported only when a chart is drawn)."""
    from matplotlib.ticker import Locator

    class SpacedLogLocator(Locator):
        def __init__(self, horizontal: bool) -> None:
            self.horizontal = horizontal

        def __call__(self) -> list[float]:
            axis: Any = self.axis
            low, high = axis.get_view_interval()
            return self.tick_values(low, high)

        def tick_values(self, vmin: float, vmax: float) -> list[float]:
            axes: Any = getattr(self.axis, "axes", None)
            if axes is None:  # not on an axis yet: no length to fit
                return []
            box = axes.get_position()
            width_in, height_in = axes.get_figure(root=True).get_size_inches()
            length = box.width * width_in if self.horizontal else box.height * height_in
            return log_ticks(min(vmin, vmax), max(vmin, vmax), float(length), self.horizontal)

    return SpacedLogLocator


def _place_axis_labels(fig: Figure) -> None:
    """Axis labels at fixed distances from the axes (inches): matplotlib would otherwise
    measure every tick label of every axes to place them, a third of the drawing time."""
    width_in, height_in = fig.get_size_inches()
    for ax in fig.axes:
        box = ax.get_position()
        if ax.get_xlabel():
            ax.xaxis.set_label_coords(0.5, -0.3 / (box.height * height_in))
        if ax.get_ylabel():
            ax.yaxis.set_label_coords(-0.4 / (box.width * width_in), 0.5)


def render(fn: Callable[..., Figure], *args: object) -> str:
    """Draw with the report's style and return the SVG."""
    matplotlib = require_matplotlib()
    with matplotlib.rc_context(RC):
        fig = fn(*args)
        _place_axis_labels(fig)
        return _svg(fig)


def budget_label(key: str, value: float, unit: str) -> str:
    """How a budget line is labelled on every figure."""
    return f"budget {key}={value:g} {unit}"


def trend_chart(trends: Sequence[Trend]) -> Figure:
    """Value per session with its 95% CI, one axes per series; change points dashed, labelled
    with the step and the coinciding subject change; the latest session filled."""
    fig, axes = chart_row(
        2.3, ncols=len(trends), width_in=max(5.4, 3.2 * len(trends)), margins_in=(0.62, 0.45, 0.15, 0.3)
    )
    for ax, t in zip(axes, trends):
        pts = t["points"]
        x = list(range(1, len(pts) + 1))
        y = [p[0] for p in pts]
        err = [[p[0] - p[1] for p in pts], [p[2] - p[0] for p in pts]]
        ax.errorbar(x, y, yerr=err, fmt="o-", color=NOW, ms=3, lw=0.8, elinewidth=0.8, capsize=1.5)
        ax.plot([x[-1]], [y[-1]], "o", color=NOW, ms=6)
        top = max(p[2] for p in pts)
        for st in t["steps"]:
            at = st["index"] + 0.5
            colour = BUDGET if st["regression"] else "#1e8449"
            ax.axvline(at, color=colour, ls="--", lw=1)
            right = at < (len(pts) + 1) / 2  # the label on the side with more room
            ax.text(
                at + (0.3 if right else -0.3),
                top,
                st["text"],
                fontsize=7,
                va="top",
                ha="left" if right else "right",
                color=colour,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.0},
            )
        ax.set_title(f"{t['label']} ({t['unit']})")
        ax.set_xlabel("session")
        ax.set_xlim(0.5, len(pts) + 0.5)
    return fig


VERDICT_COLOURS = {
    Verdict.REGRESSION: BUDGET,
    Verdict.IMPROVED: "#1e8449",
    Verdict.MACHINE_SLOWER: FIRST_RUN,
    Verdict.INCONCLUSIVE: "#7d3c98",
    Verdict.UNCHANGED: BASELINE,
}
#: Every verdict, the most notable first (the overview's order).
VERDICT_ORDER = (Verdict.REGRESSION, Verdict.MACHINE_SLOWER, Verdict.IMPROVED, Verdict.INCONCLUSIVE, Verdict.UNCHANGED)
OVERVIEW_ROWS = 24


def change_overview(results: Sequence[Outcome]) -> Figure:
    """Change of each compared metric with its 95% CI, the most notable first (capped)."""
    rows = _ranked_comparisons(results)
    shown = rows[:OVERVIEW_ROWS]
    fig, ax = new_chart(0.9 + 0.17 * len(shown), width_in=9.0, margins_in=(3.4, 0.45, 0.9, 0.3))
    for y, (test, c) in enumerate(shown):
        _change_row(ax, y, c)
    labels = [f"{nodeids.last(test)[:38]} \u00b7 {c.phase} {c.label}" for test, c in shown]
    ax.set_yticks(range(len(shown)), labels)
    ax.invert_yaxis()
    _threshold_band(ax, [c for _, c in shown])
    ax.axvline(0, color="black", lw=0.8)
    ax.grid(axis="y", visible=False)
    more = f" ({len(rows) - len(shown)} more in the tables)" if len(rows) > len(shown) else ""
    ax.set_xlabel("change now vs baseline (%); + is slower for latencies, faster for throughputs")
    ax.set_title(f"Compared metrics, most notable first{more}")
    return fig


def _ranked_comparisons(results: Sequence[Outcome]) -> list[tuple[str, Comparison]]:
    """Every (test, comparison), the most notable first: by verdict (``VERDICT_ORDER``), then
    by the size of the change."""
    rows = [(r.test, c) for r in results for c in (r.verdict.comparisons if r.verdict is not None else ())]
    return sorted(rows, key=lambda row: (VERDICT_ORDER.index(row[1].verdict), -abs(row[1].ratio - 1)))


def _change_row(ax: Axes, y: int, c: Comparison) -> None:
    """One comparison's change (%) with its 95% CI, labelled with its verdict on the right."""
    colour = VERDICT_COLOURS[c.verdict]
    change = (c.ratio - 1) * 100
    if c.ci_low is not None and c.ci_high is not None:
        ax.hlines(y, (c.ci_low - 1) * 100, (c.ci_high - 1) * 100, color=colour, lw=1.6)
    ax.plot(change, y, "o", color=colour, ms=5)
    ax.annotate(
        c.verdict.value,
        (1.0, y),
        xycoords=("axes fraction", "data"),
        xytext=(4, 0),
        textcoords="offset points",
        va="center",
        fontsize=7,
        color=colour,
        fontweight="bold",
    )


def _threshold_band(ax: Axes, shown: Sequence[Comparison]) -> None:
    """The most common threshold as a grey band, the others named in its legend entry."""
    thresholds = Counter(c.threshold for c in shown if c.threshold)
    if not thresholds:
        return
    common = thresholds.most_common(1)[0][0]
    others = sorted({f"{c.label} +-{c.threshold:.0%}" for c in shown if c.threshold and c.threshold != common})
    label = f"threshold +-{common:.0%}" + (f" ({', '.join(others)})" if others else "")
    ax.axvspan(-common * 100, common * 100, color="#eeeeee", zorder=0, label=label)
    ax.legend(loc="lower right")


_PARAMS = re.compile(r"\[.*\]$")


def curves(results: Sequence[Outcome]) -> dict[str, list[LoadStats]]:
    """``{test function: load records sorted by throughput}`` of the results that have one."""
    groups: dict[str, list[LoadStats]] = defaultdict(list)
    for r in results:
        load = r.record.load if r.record else None
        if load is not None:
            groups[_PARAMS.sub("", r.test)].append(load)
    return {k: sorted(v, key=lambda d: (d.concurrency, d.output_tps)) for k, v in groups.items()}


def throughput_latency(results: Sequence[Outcome]) -> Figure:
    """Two panels sharing the x axis (output tok/s): TTFT and TPOT, p50 with p99 whiskers."""
    fig, (left, right) = chart_row(3.4, ncols=2, margins_in=(0.62, 0.95, 0.15, 0.3), wspace=0.45)
    colours = ("#1f5fbf", "#c0392b", "#1e8449", "#7d3c98", "#b9770e", "#2e4053")
    for n, (test, points) in enumerate(sorted(curves(results).items())):
        colour = colours[n % len(colours)]
        x = np.array([p.output_tps for p in points], dtype=float)
        for ax, key in ((left, "ttft"), (right, "tpot")):
            p50 = np.array([getattr(p, f"{key}_p50_ms") for p in points], dtype=float)
            p99 = np.array([getattr(p, f"{key}_p99_ms") for p in points], dtype=float)
            ax.plot(x, p50, "o-", color=colour, ms=5, lw=1.2, label=nodeids.last(test) if key == "ttft" else None)
            ax.vlines(x, p50, p99, color=colour, lw=0.8, alpha=0.6)
            for xi, yi, p in zip(x, p50, points):
                label = f"c{p.concurrency}" + (f"@{p.rate_per_s:g}/s" if p.rate_per_s else "")
                ax.annotate(label, (xi, yi), textcoords="offset points", xytext=(3, 4), fontsize=6.5, color=colour)
    left.set_ylabel("TTFT p50 (ms), whisker to p99")
    right.set_ylabel("TPOT p50 (ms), whisker to p99")
    for ax in (left, right):
        ax.set_xlabel("output tokens/s (all requests)")
        ax.set_ylim(bottom=0)
    left.set_title("Throughput vs time to first token")
    right.set_title("Throughput vs time per output token")
    fig.legend(loc="lower center", fontsize=6.5, ncol=2)
    return fig


def section(results: Sequence[Outcome]) -> str | None:
    """The curve's SVG, or None when no result is a load test."""
    return render(throughput_latency, results) if curves(results) else None


#: A part's colour on the parts chart, by what it is (``catalog.PARTS``): tokenization,
#: llama.cpp's own time, sampling, the time outside llama.cpp; a part not named here takes
#: ``OTHER_PART_COLOURS`` in turn.
PART_COLOURS = {
    "tokenize_ms": "#7d3c98",
    "native_prefill_ms": NOW,
    "native_decode_ms_per_token": NOW,
    "sampling_ms_per_token": "#b9770e",
    "python_sampling_ms_per_token": "#d35400",
    "prefill_outside_ms": "#1e8449",
    "decode_outside_ms_per_token": "#1e8449",
}
OTHER_PART_COLOURS = ("#2e4053", "#c0392b", "#16a085")


def parts_chart(parts: Sequence[PartChange], sides: tuple[str, str] = ("A", "B")) -> Figure:
    """The parts of each phase side by side (``judge.parts``): per phase a panel of two stacked
    bars, A's medians and B's, one segment per part in the catalog's order; a part that moved
    is hatched on B's bar and marked in the legend with its change."""
    phases = list(dict.fromkeys(p.phase for p in parts))
    fig, axes = chart_row(2.3, ncols=len(phases), width_in=2 * WIDTH_IN, margins_in=(0.8, 1.05, 0.2, 0.3), wspace=0.35)
    for ax, phase in zip(axes, phases):
        _parts_panel(ax, [p for p in parts if p.phase == phase], sides)
    return fig


def _parts_panel(ax: Axes, parts: Sequence[PartChange], sides: tuple[str, str]) -> None:
    """One phase: A's bar above B's, each part a segment; its total at the end of each bar."""
    left = np.zeros(2)
    others = iter(OTHER_PART_COLOURS * len(parts))
    for p in parts:
        colour = PART_COLOURS.get(p.metric) or next(others)
        widths = np.array([p.a_median, p.b_median])
        label = f"{p.label} {p.change_text()}" + (" (moved)" if p.moved else "")
        ax.barh([0, 1], widths, 0.6, left=left, color=colour, edgecolor="white", lw=0.5, label=label)
        if p.moved:
            ax.barh([1], widths[1:], 0.6, left=left[1:], color="none", edgecolor="black", lw=0.8, hatch="///")
        left += widths
    for y, total in enumerate(left):
        ax.annotate(f"{total:.3g}", (total, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks([0, 1], [s if len(s) <= 12 else s[:11] + "\u2026" for s in sides])
    ax.invert_yaxis()
    ax.set_xlim(0, max(float(left.max()), 1e-9) * 1.15)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(f"median {parts[0].unit}")
    ax.set_title(f"{parts[0].phase}: where the time went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncols=1, fontsize=6.5)
