"""The HTML report's figures: matplotlib Figure objects (no pyplot, no GUI backend) saved
as SVG text.

Each function takes the session report's plain dicts (a record, its baseline record, the
marker's budgets) and returns one SVG document, so ``llmperf report`` draws from a saved
``--llmperf-json`` file exactly what the plugin draws at the end of a session. Now and
baseline share one axis and keep one colour each; budgets are red dash-dot lines.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..core.catalog import BUDGETS
from ..core.errors import LLMPerfError

NOW = "#1f5fbf"
BASELINE = "#8c8c8c"
BUDGET = "#c0392b"
FIRST_RUN = "#e67e22"
#: ECDFs are drawn through at most this many quantiles per side (size, not shape, changes).
ECDF_POINTS = 160
WIDTH_IN = 5.4

RC = {
    "svg.fonttype": "none",  # text stays text: small files, searchable, selectable
    "svg.hashsalt": "pytest-llmperf",  # deterministic ids
    "font.family": "sans-serif",
    "font.size": 8.5,
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

#: Budget keys on pooled decode ITL (drawn on the ECDF and the timeline) -> their statistic.
ITL_BUDGETS = {b.key: b.statistic for b in BUDGETS.values() if b.metric == "itl_ms"}


class ReportError(LLMPerfError):
    """The HTML report cannot be drawn (matplotlib, the ``report`` extra, is not installed)."""


def require_matplotlib() -> Any:
    """The matplotlib module, or a one-line error that says what to install."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401  (the part we use)
    except ImportError:
        raise ReportError(
            'the HTML report needs matplotlib: pip install "pytest-llmperf[report]"'
        ) from None
    return matplotlib


#: Blank figures kept for reuse, by shape: creating axes and their ticks is half the cost of
#: drawing one, and every test of a report draws the same few shapes.
_BLANK: dict[tuple[Any, ...], Any] = {}


def _reset(fig: Any) -> None:
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


def _figure(
    height_in: float,
    ncols: int = 1,
    width_in: float = WIDTH_IN,
    margins_in: tuple[float, float, float, float] = (0.62, 0.5, 0.15, 0.3),
    wspace: float = 0.3,
    reuse: bool = False,
    **kw: Any,
) -> tuple[Any, Any]:
    """A figure with fixed margins (left, bottom, right, top in inches): a constrained layout
    would draw every figure twice, and 200 tests x 4 figures must render in seconds.

    ``reuse``: hand out the same blank figure again for the same shape (only for figure
    functions that set every property they change, whatever the data)."""
    from matplotlib.figure import Figure

    key = (height_in, ncols, width_in, margins_in, wspace, tuple(sorted(kw.items())))
    if reuse and key in _BLANK:
        fig = _BLANK[key]
        _reset(fig)
        axes = fig.axes[0] if ncols == 1 and kw.get("squeeze", True) else np.array(fig.axes)
    else:
        fig = Figure(figsize=(width_in, height_in))
        left, bottom, right, top = margins_in
        fig.subplots_adjust(left=left / width_in, bottom=bottom / height_in, right=1 - right / width_in,
                            top=1 - top / height_in, wspace=wspace)
        axes = fig.subplots(1, ncols, **kw)
        if reuse:
            _BLANK[key] = fig
    for ax in np.ravel(axes):
        ax.locator_params(nbins=4)
    return fig, axes


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
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = _TAG.sub(_minify_tag, svg)
    svg = re.sub(r">\s+<", "><", svg)
    svg = svg.replace("stroke-linecap: butt}", "stroke-linecap: butt}" + FONT_CSS, 1)
    used = set(re.findall(r"#([\w.-]+)", svg))
    svg = _ID.sub(lambda m: m.group(0) if m.group(1) in used else "", svg)
    return svg.replace(' style=""', "").strip()


def _svg(fig: Any) -> str:
    """The figure as a minified SVG element: no XML prolog, DOCTYPE, comment or metadata."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    return minify(buf.getvalue())


def _plain_log(axis: Any) -> None:
    """Log axis with plain tick labels (0.5, 1, 2) instead of 10^x."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _place_axis_labels(fig: Any) -> None:
    """Axis labels at fixed distances from the axes (inches): matplotlib would otherwise
    measure every tick label of every axes to place them, a third of the drawing time."""
    width_in, height_in = fig.get_size_inches()
    for ax in fig.axes:
        box = ax.get_position()
        if ax.get_xlabel():
            ax.xaxis.set_label_coords(0.5, -0.3 / (box.height * height_in))
        if ax.get_ylabel():
            ax.yaxis.set_label_coords(-0.4 / (box.width * width_in), 0.5)


def render(fn: Any, *args: Any) -> str:
    """Draw with the report's style and return the SVG."""
    matplotlib = require_matplotlib()
    with matplotlib.rc_context(RC):
        fig = fn(*args)
        _place_axis_labels(fig)
        return _svg(fig)


def _pooled(record: Mapping[str, Any] | None) -> np.ndarray:
    if not record or not record.get("itl_ms"):
        return np.empty(0)
    return np.concatenate([np.asarray(r, dtype=float) for r in record["itl_ms"] if r] or [np.empty(0)])


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ordered = np.sort(values)
    fraction = np.arange(1, ordered.size + 1) / ordered.size
    if ordered.size > ECDF_POINTS:
        q = np.linspace(0, 1, ECDF_POINTS)
        return np.quantile(ordered, q), q
    return ordered, fraction


def _budget_label(key: str, value: float, unit: str) -> str:
    return f"budget {key}={value:g} {unit}"


def itl_ecdf(record: Mapping[str, Any], baseline: Mapping[str, Any] | None, budgets: Mapping[str, float]) -> Any:
    """Pooled decode ITL, ECDF now vs baseline, p50/p95/p99 marked on each curve."""
    fig, ax = _figure(2.7, reuse=True)
    sides = [("baseline", baseline, BASELINE, "s"), ("now", record, NOW, "o")]
    top = 0.0
    for name, rec, colour, marker in sides:
        values = _pooled(rec)
        if not values.size:
            continue
        x, y = _ecdf(values)
        steps = "steps-post" if x.size < ECDF_POINTS else "default"  # quantiles of a big sample: a line
        ax.plot(x, y, color=colour, lw=1.6, label=f"{name} ({values.size} tokens)", drawstyle=steps)
        qs = np.percentile(values, [50, 95, 99])
        ax.plot(qs, [0.50, 0.95, 0.99], marker, color=colour, ms=4.5, mfc="white", mew=1.3, ls="none")
        if name == "now":  # values for now; the baseline's are in the table, its markers show where
            for q, p, y in zip(qs, ("p50", "p95", "p99"), (0.5, 0.95, 0.99)):
                left = p == "p95"  # p95 left of its marker, p99 right: they sit close
                ax.annotate(f"{p} {q:.3g}", (q, y), xytext=(-5 if left else 5, -10 if left else 2),
                            textcoords="offset points", ha="right" if left else "left", fontsize=6.5, color=colour)
        top = max(top, float(np.percentile(values, 99.9)))
    for key, label in ITL_BUDGETS.items():
        if key in budgets:
            ax.axvline(budgets[key], color=BUDGET, ls="-.", lw=1.2, label=_budget_label(key, budgets[key], "ms"))
            top = max(top, budgets[key])
    low = min((float(np.percentile(_pooled(r), 0.1)) for _, r, _, _ in sides if _pooled(r).size), default=0.0)
    log = low > 0 and top / low > 8
    if log:
        ax.set_xscale("log")
        ax.set_xlim(low * 0.9, top * 1.1)
        _plain_log(ax.xaxis)
    elif top > 0:
        ax.set_xlim(0, top * 1.08)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"inter-token latency (ms{', log' if log else ''}); axis ends at p99.9 or the budget")
    ax.set_ylabel("fraction of tokens <= x")
    ax.set_title("Decode ITL distribution (ECDF), now vs baseline")
    ax.legend(loc="lower right")
    return fig


def _strip(ax: Any, runs: Sequence[Sequence[float] | None], colours: Sequence[str], names: Sequence[str]) -> None:
    rng = np.random.default_rng(0)
    for i, (values, colour) in enumerate(zip(runs, colours)):
        if not values:
            continue
        v = np.asarray(values, dtype=float)
        ax.plot(i + rng.uniform(-0.15, 0.15, v.size), v, "o", ms=3.8, color=colour, alpha=0.8, mew=0, zorder=3)
        ax.plot([i - 0.28, i + 0.28], [np.median(v)] * 2, color=colour, lw=2.2, zorder=4)
    ax.set_xticks(range(len(names)), [f"{n}\n({len(r or [])} runs)" for n, r in zip(names, runs)])
    ax.set_xlim(-0.6, len(names) - 0.4)


def run_strips(record: Mapping[str, Any], baseline: Mapping[str, Any] | None, budgets: Mapping[str, float]) -> Any:
    """Per-run TTFT and TPOT, baseline vs now (dots = runs, bar = median)."""
    fig, (left, right) = _figure(2.6, 2, margins_in=(0.62, 0.45, 0.1, 0.3), wspace=0.45, reuse=True)
    base = (baseline or {}).get("runs", {})
    now = record.get("runs", {})
    names = ["baseline", "now"] if baseline else ["now"]
    colours = [BASELINE, NOW] if baseline else [NOW]
    for ax, metric, title in ((left, "ttft_ms", "TTFT per run"), (right, "tpot_ms", "TPOT per run")):
        sides = [base.get(metric), now.get(metric)] if baseline else [now.get(metric)]
        _strip(ax, sides, colours, names)
        ax.set_title(title)
        ax.set_ylabel(f"{metric.split('_')[0].upper()} (ms)")
    lines = [(left, "ttft_ms", budgets.get("ttft_ms"), "ms"), (left, "ttft_p95_ms", budgets.get("ttft_p95_ms"), "ms"),
             (right, "tpot_ms", budgets.get("tpot_ms"), "ms")]
    if "min_tps" in budgets:  # a decode TPS floor is a TPOT ceiling
        lines.append((right, "min_tps", budgets["min_tps"], "t/s"))
    for ax, key, value, unit in lines:
        if value is not None:  # labelled on the line: a legend per axes costs more than the plot
            y = 1000 / value if key == "min_tps" else value
            ax.axhline(y, color=BUDGET, ls="-.", lw=1.2)
            ax.annotate(_budget_label(key, value, unit), (0, y), xycoords=ax.get_yaxis_transform(), xytext=(2, 2),
                        textcoords="offset points", ha="left", va="bottom", fontsize=6.5, color=BUDGET,
                        bbox={"fc": "white", "ec": "none", "alpha": 0.75, "pad": 0.5})
    for ax in (left, right):
        ax.grid(axis="x", visible=False)
        ax.set_ylim(bottom=0)  # after the budget lines, so the axis reaches them
    return fig


def token_timeline(record: Mapping[str, Any], baseline: Mapping[str, Any] | None, budgets: Mapping[str, float]) -> Any:
    """Latency of every output token by position: token 1 is the TTFT, then the ITLs.

    The first token (prefill) and the first measured run (warm-up effects) stand out; the
    fitted slope of the ITL over position shows the cost of a growing context.
    """
    fig, ax = _figure(3.2, margins_in=(0.62, 0.9, 0.15, 0.3), reuse=True)
    for name, rec, colour in (("baseline", baseline, BASELINE), ("now", record, NOW)):
        if not rec or not rec.get("itl_ms"):
            continue
        runs = [np.asarray(r, dtype=float) for r in rec["itl_ms"]]
        n = min(len(r) for r in runs)
        ttft = rec.get("runs", {}).get("ttft_ms")
        matrix = np.stack([r[:n] for r in runs])
        position = np.arange(2, n + 2)
        median = np.median(matrix, axis=0)
        if name == "now":
            if len(runs) >= 3:  # a band, not one line per run: the file stays small at 200 tests
                low, high = np.percentile(matrix, [10, 90], axis=0)
                ax.fill_between(position, low, high, color=colour, alpha=0.15, lw=0)  # named in the caption
            ax.plot(position, matrix[0], color=FIRST_RUN, lw=0.9, label="now: first measured run")
        slope = f", slope {np.polyfit(position, median, 1)[0] * 1000:+.2f} us/token" if n >= 3 else ""
        ax.plot(position, median, color=colour, lw=1.8, label=f"{name}: median over {len(runs)} runs{slope}")
        if ttft:  # labelled on the plot: each legend entry costs more to draw than the data
            first = float(np.median(ttft))
            ax.plot([1], [first], "D" if name == "now" else "s", color=colour, ms=6)
            ax.annotate(f"TTFT {first:.3g}", (1, first), xytext=(6, 4 if name == "now" else -8),
                        textcoords="offset points", fontsize=6.5, color=colour)
    for key, label in ITL_BUDGETS.items():
        if key in budgets:
            ax.axhline(budgets[key], color=BUDGET, ls="-.", lw=1.2, label=_budget_label(key, budgets[key], "ms"))
    ax.set_yscale("log")
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top * 1.4)  # room for the first-token marker
    _plain_log(ax.yaxis)
    ax.set_xlabel("output token position (1 = first token, after prefill)")
    ax.set_ylabel("latency of the token (ms, log)")
    ax.set_title("Per-token latency timeline")
    fig.legend(loc="lower center", ncols=2, fontsize=6.5)
    return fig


def layer_bars(record: Mapping[str, Any], baseline: Mapping[str, Any] | None, budgets: Mapping[str, float]) -> Any:
    """Median time per layer and phase, now vs baseline; outlier layers named in red."""
    phases = record["layers"]["phases"]
    names = [p for p in ("prefill", "decode") if p in phases]
    n_rows = max(len(phases[p]["names"]) for p in names)
    longest = max(len(n) for p in names for n in phases[p]["names"])
    width = 2 * WIDTH_IN  # the page shows it across both columns
    label_in = 0.15 + 0.075 * longest
    axes_in = (width - label_in - 0.2 - label_in * (len(names) - 1)) / len(names)
    fig, axes = _figure(1.2 + 0.2 * n_rows, len(names), width_in=width, margins_in=(label_in, 0.8, 0.2, 0.3),
                        wspace=label_in / axes_in, squeeze=False)
    base_phases = ((baseline or {}).get("layers") or {}).get("phases", {})
    for ax, phase in zip(axes[0], names):
        now = phases[phase]
        y = np.arange(len(now["names"]))
        base = base_phases.get(phase)
        height = 0.4 if base else 0.7
        ax.barh(y - (height / 2 if base else 0), now["median_ms"], height, color=NOW, label="now")
        if base:
            by_name = dict(zip(base["names"], base["median_ms"]))
            ax.barh(y + height / 2, [by_name.get(n, 0.0) for n in now["names"]], height, color=BASELINE,
                    label="baseline")
        ax.set_yticks(y, now["names"])
        outliers = set(now.get("outliers", ()))
        for tick, name in zip(ax.get_yticklabels(), now["names"]):
            if name in outliers:
                tick.set_color(BUDGET)
                tick.set_fontweight("bold")
        ax.invert_yaxis()
        ax.set_xlabel("median time (ms)")
        ax.set_title(f"{phase}: step {now.get('step_ms', 0):.3g} ms, {now.get('n_runs', '?')} runs")
        ax.grid(axis="y", visible=False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=2)
    return fig


def roofline(record: Mapping[str, Any], baseline: Mapping[str, Any] | None, budgets: Mapping[str, float]) -> Any:
    """Achieved vs attainable performance per phase on the machine's roofline."""
    rf = record["roofline"]
    fig, ax = _figure(3.6, margins_in=(0.62, 1.2, 0.15, 0.3))
    bw, peak = rf["peak_bw_gbs"], rf["peak_tflops"] * 1000  # GB/s, GFLOP/s
    points = [(p, rf[p]) for p in ("prefill", "decode") if isinstance(rf.get(p), Mapping)]
    intensities = [d["intensity_flop_per_byte"] for _, d in points] + [peak / bw]
    x = np.logspace(np.log10(min(intensities) / 4), np.log10(max(intensities) * 4), 200)
    ax.plot(x, np.minimum(peak, x * bw), color="black", lw=1.4,
            label=f"roof: {bw:.3g} GB/s ({rf.get('peak_bw_source', '?')}), {peak:.3g} GFLOP/s "
                  f"({rf.get('peak_tflops_source', '?')})")
    if "min_mbu" in budgets:  # an MBU floor: achieved bytes/s >= min_mbu x peak, i.e. GFLOP/s >= that x intensity
        floor = budgets["min_mbu"] * bw * x
        ax.plot(x[floor <= peak], floor[floor <= peak], color=BUDGET, ls="-.", lw=1.2,
                label=_budget_label("min_mbu", budgets["min_mbu"], "of peak bandwidth"))
    base_rf = (baseline or {}).get("roofline") or {}
    for phase, d in points:
        marker = "o" if phase == "decode" else "^"
        gflops = d["achieved_tps"] * d["flops_per_token"] / 1e9
        bound = d["bound_tps"] * d["flops_per_token"] / 1e9
        ax.plot([d["intensity_flop_per_byte"]] * 2, [gflops, bound], color=NOW, lw=0.8, ls=":")
        ax.plot(d["intensity_flop_per_byte"], bound, marker, color="black", mfc="white", ms=6)
        ax.plot(d["intensity_flop_per_byte"], gflops, marker, color=NOW, ms=7,
                label=f"{phase} now: {d['achieved_tps']:.4g} t/s of {d['bound_tps']:.4g} bound "
                      f"({'fits in cache' if d['verdict'] == 'cache-resident' else 'MBU n/a' if d.get('note') else 'MBU ' + format(d['mbu'], '.0%')}, "
                      f"MFU {d['mfu']:.1%}, {d['verdict']})")
        b = base_rf.get(phase)
        if isinstance(b, Mapping):
            ax.plot(b["intensity_flop_per_byte"], b["achieved_tps"] * b["flops_per_token"] / 1e9, marker,
                    color=BASELINE, mfc="none", ms=8, mew=1.5, label=f"{phase} baseline: {b['achieved_tps']:.4g} t/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log(ax.xaxis)
    _plain_log(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (GFLOP/s)")
    ax.set_title("Roofline: achieved (filled) vs bound (hollow black)")
    fig.legend(loc="lower center", fontsize=6.5)
    return fig


VERDICT_COLOURS = {"REGRESSION": BUDGET, "IMPROVED": "#1e8449", "MACHINE_SLOWER": FIRST_RUN,
                   "INCONCLUSIVE": "#7d3c98", "UNCHANGED": BASELINE}
VERDICT_ORDER = ("REGRESSION", "MACHINE_SLOWER", "IMPROVED", "INCONCLUSIVE", "UNCHANGED")
OVERVIEW_ROWS = 24


def change_overview(results: Sequence[Mapping[str, Any]]) -> Any:
    """Change of each compared metric with its 95% CI, the most notable first (capped)."""
    rows = []
    for r in results:
        for c in (r.get("verdict") or {}).get("comparisons", []):
            rank = VERDICT_ORDER.index(c["verdict"]) if c["verdict"] in VERDICT_ORDER else len(VERDICT_ORDER)
            rows.append((rank, -abs(c["ratio"] - 1), r["test"], c))
    rows.sort(key=lambda row: row[:2])
    shown = rows[:OVERVIEW_ROWS]
    fig, ax = _figure(0.9 + 0.17 * len(shown), width_in=9.0, margins_in=(3.4, 0.45, 0.9, 0.3))
    for y, (_, _, test, c) in enumerate(shown):
        colour = VERDICT_COLOURS.get(c["verdict"], BASELINE)
        change = (c["ratio"] - 1) * 100
        if c.get("ci_low") is not None and c.get("ci_high") is not None:
            ax.hlines(y, (c["ci_low"] - 1) * 100, (c["ci_high"] - 1) * 100, color=colour, lw=1.6)
        ax.plot(change, y, "o", color=colour, ms=5)
        ax.annotate(c["verdict"], (1.0, y), xycoords=("axes fraction", "data"), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7, color=colour, fontweight="bold")
    labels = [f"{test.split('::')[-1][:38]} \u00b7 {c['phase']} {c['label']}" for _, _, test, c in shown]
    ax.set_yticks(range(len(shown)), labels)
    ax.invert_yaxis()
    thresholds = Counter(c.get("threshold") for _, _, _, c in shown if c.get("threshold"))
    if thresholds:
        common = thresholds.most_common(1)[0][0]
        others = sorted({f"{c['label']} +-{c['threshold']:.0%}" for _, _, _, c in shown
                         if c.get("threshold") and c["threshold"] != common})
        label = f"threshold +-{common:.0%}" + (f" ({', '.join(others)})" if others else "")
        ax.axvspan(-common * 100, common * 100, color="#eeeeee", zorder=0, label=label)
        ax.legend(loc="lower right")
    ax.axvline(0, color="black", lw=0.8)
    ax.grid(axis="y", visible=False)
    more = f" ({len(rows) - len(shown)} more in the tables)" if len(rows) > len(shown) else ""
    ax.set_xlabel("change now vs baseline (%); + is slower for latencies, faster for throughputs")
    ax.set_title(f"Compared metrics, most notable first{more}")
    return fig


#: (id, caption, function, needs): the figures of one test, in page order.
FIGURES = (
    ("itl-ecdf", "Decode ITL distribution now vs baseline, p50/p95/p99 marked", itl_ecdf, "itl_ms"),
    ("run-strips", "Per-run TTFT and TPOT now vs baseline (bar: median)", run_strips, "runs"),
    ("token-timeline", "Per-token latency by output position: token 1 is the first token (TTFT median, diamond "
     "now, square baseline), then each inter-token latency; shaded: p10-p90 of now's runs", token_timeline, "itl_ms"),
    ("layer-bars", "Time per layer now vs baseline", layer_bars, "layers"),
    ("roofline", "Roofline: achieved vs bound", roofline, "roofline"),
)


def figures_for(record: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """The figures a record has data for: (id, caption, function)."""
    for fig_id, caption, fn, needs in FIGURES:
        if record.get(needs):
            yield fig_id, caption, fn
