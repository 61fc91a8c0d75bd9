"""The HTML report's charts of one test: its decode ITL distribution (ECDF), its runs, its
per-token timeline and, for a profiled test (``layers=True``: ``record.layers``,
``record.roofline``), time per layer and the roofline; ``charts_for`` lists them in page order.

Each function takes a test's record and its baseline's (``core.measurement.Measurement``, as stored) and the
marker's budgets and returns a matplotlib Figure, so ``llmperf report`` draws from a saved
``--llmperf-json`` file exactly what the plugin draws. Budgets are red dash-dot lines."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.catalog import BUDGETS, METRICS, pooled_itl
from ..core.measurement import Measurement

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..core.measurement import PhaseLayers, PhaseRoofline

from .charts import BASELINE, BUDGET, FIRST_RUN, NOW, WIDTH_IN, budget_label, chart_row, new_chart, plain_log


def layer_bars(record: Measurement, baseline: Measurement | None, budgets: Mapping[str, float]) -> Figure:
    """Median time per layer and phase, now vs baseline; outlier layers named in red."""
    assert record.layers is not None  # charts_for: only a record with layers
    phases = {"prefill": record.layers.prefill, "decode": record.layers.decode}
    names = list(phases)
    n_rows = max(len(phases[p].names) for p in names)
    longest = max(len(n) for p in names for n in phases[p].names)
    width = 2 * WIDTH_IN  # the page shows it across both columns
    label_in = 0.15 + 0.075 * longest
    axes_in = (width - label_in - 0.2 - label_in * (len(names) - 1)) / len(names)
    fig, axes = chart_row(
        1.2 + 0.2 * n_rows, len(names), width_in=width, margins_in=(label_in, 0.8, 0.2, 0.3), wspace=label_in / axes_in
    )
    base = baseline.layers if baseline is not None else None
    for ax, phase in zip(axes, names):
        _layer_panel(ax, phase, phases[phase], getattr(base, phase) if base is not None else None)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=2)
    return fig


def _layer_panel(ax: Axes, phase: str, now: PhaseLayers, base: PhaseLayers | None) -> None:
    """One phase's bars: each layer's median now (and the baseline's beside it), outliers in red."""
    y = np.arange(len(now.names))
    height = 0.4 if base else 0.7
    ax.barh(y - (height / 2 if base else 0), now.median_ms, height, color=NOW, label="now")
    if base:
        by_name = dict(zip(base.names, base.median_ms))
        ax.barh(y + height / 2, [by_name.get(n, 0.0) for n in now.names], height, color=BASELINE, label="baseline")
    ax.set_yticks(y, now.names)
    outliers = set(now.outliers)
    for tick, name in zip(ax.get_yticklabels(), now.names):
        if name in outliers:
            tick.set_color(BUDGET)
            tick.set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlabel("median time (ms)")
    ax.set_title(f"{phase}: step {now.step_ms:.3g} ms, {now.n_runs if now.has('n_runs') else '?'} runs")
    ax.grid(axis="y", visible=False)


def roofline(record: Measurement, baseline: Measurement | None, budgets: Mapping[str, float]) -> Figure:
    """Achieved vs attainable performance per phase on the machine's roofline."""
    rf = record.roofline
    assert rf is not None  # charts_for: only a record with a roofline
    fig, ax = new_chart(3.6, margins_in=(0.62, 1.2, 0.15, 0.3))
    bw, peak = rf.peak_bw.value, rf.peak_tflops.value * 1000  # GB/s, GFLOP/s
    base = baseline.roofline if baseline is not None else None
    phases = (
        ("prefill", rf.prefill, base.prefill if base else None),
        ("decode", rf.decode, base.decode if base else None),
    )
    points = [(p, d, b) for p, d, b in phases if d is not None]
    intensities = [d.intensity_flop_per_byte for _, d, _ in points] + [peak / bw]
    x = np.logspace(np.log10(min(intensities) / 4), np.log10(max(intensities) * 4), 200)
    ax.plot(
        x,
        np.minimum(peak, x * bw),
        color="black",
        lw=1.4,
        label=f"roof: {bw:.3g} GB/s ({rf.peak_bw.source if rf.has('peak_bw_source') else '?'}), "
        f"{peak:.3g} GFLOP/s ({rf.peak_tflops.source if rf.has('peak_tflops_source') else '?'})",
    )
    if "min_mbu" in budgets:  # an MBU floor: achieved bytes/s >= min_mbu x peak, i.e. GFLOP/s >= that x intensity
        floor = budgets["min_mbu"] * bw * x
        ax.plot(
            x[floor <= peak],
            floor[floor <= peak],
            color=BUDGET,
            ls="-.",
            lw=1.2,
            label=budget_label("min_mbu", budgets["min_mbu"], "of peak bandwidth"),
        )
    for phase, d, b in points:
        _roofline_phase(ax, phase, d, b)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log(ax.xaxis)
    plain_log(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (GFLOP/s)")
    ax.set_title("Roofline: achieved (filled) vs bound (hollow black)")
    fig.legend(loc="lower center", fontsize=6.5)
    return fig


def _roofline_phase(ax: Axes, phase: str, d: PhaseRoofline, b: PhaseRoofline | None) -> None:
    """One phase on the roofline: achieved now (filled), its bound (hollow black) and the
    baseline's achieved (hollow, when ``b`` is the baseline's phase)."""
    marker = "o" if phase == "decode" else "^"
    gflops = d.achieved_tps * d.flops_per_token / 1e9
    bound = d.bound_tps * d.flops_per_token / 1e9
    ax.plot([d.intensity_flop_per_byte] * 2, [gflops, bound], color=NOW, lw=0.8, ls=":")
    ax.plot(d.intensity_flop_per_byte, bound, marker, color="black", mfc="white", ms=6)
    ax.plot(
        d.intensity_flop_per_byte,
        gflops,
        marker,
        color=NOW,
        ms=7,
        label=f"{phase} now: {d.achieved_tps:.4g} t/s of {d.bound_tps:.4g} bound "
        f"({_bandwidth_use(d)}, MFU {d.mfu:.1%}, {d.verdict})",
    )
    if b is not None:  # a stored baseline's phase (none: null)
        ax.plot(
            b.intensity_flop_per_byte,
            b.achieved_tps * b.flops_per_token / 1e9,
            marker,
            color=BASELINE,
            mfc="none",
            ms=8,
            mew=1.5,
            label=f"{phase} baseline: {b.achieved_tps:.4g} t/s",
        )


def _bandwidth_use(d: PhaseRoofline) -> str:
    """``MBU 55%``; ``fits in cache`` or ``MBU n/a`` where the MBU means nothing."""
    if d.verdict == "cache-resident":
        return "fits in cache"
    return "MBU n/a" if d.note else "MBU " + format(d.mbu, ".0%")


#: ECDFs are drawn through at most this many quantiles per side (size, not shape, changes).
ECDF_POINTS = 160

#: Budget keys on pooled decode ITL (drawn on the ECDF and the timeline) -> their statistic.
ITL_BUDGETS = {b.key: b.statistic for b in BUDGETS.values() if b.metric == "itl_ms"}


def _pooled(record: Measurement | None) -> np.ndarray:
    return np.asarray(pooled_itl(record), dtype=float)


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ordered = np.sort(values)
    fraction = np.arange(1, ordered.size + 1) / ordered.size
    if ordered.size > ECDF_POINTS:
        q = np.linspace(0, 1, ECDF_POINTS)
        return np.quantile(ordered, q), q
    return ordered, fraction


def itl_ecdf(record: Measurement, baseline: Measurement | None, budgets: Mapping[str, float]) -> Figure:
    """Pooled decode ITL, ECDF now vs baseline, p50/p95/p99 marked on each curve."""
    fig, ax = new_chart(2.7, reuse=True)
    sides = [("baseline", baseline, BASELINE, "s"), ("now", record, NOW, "o")]
    top = 0.0
    for name, rec, colour, marker in sides:
        values = _pooled(rec)
        if values.size:
            _ecdf_side(ax, name, values, colour, marker)
            top = max(top, float(np.percentile(values, 99.9)))
    for key in (k for k in ITL_BUDGETS if k in budgets):
        ax.axvline(budgets[key], color=BUDGET, ls="-.", lw=1.2, label=budget_label(key, budgets[key], "ms"))
        top = max(top, budgets[key])
    low = min((float(np.percentile(_pooled(r), 0.1)) for _, r, _, _ in sides if _pooled(r).size), default=0.0)
    log = _latency_axis(ax, low, top)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"inter-token latency (ms{', log' if log else ''}); axis ends at p99.9 or the budget")
    ax.set_ylabel("fraction of tokens <= x")
    ax.set_title("Decode ITL distribution (ECDF), now vs baseline")
    ax.legend(loc="lower right")
    return fig


def _ecdf_side(ax: Axes, name: str, values: np.ndarray, colour: str, marker: str) -> None:
    """One side's ECDF with its p50/p95/p99 marked (and, for now, their values written)."""
    x, y = _ecdf(values)
    steps = "steps-post" if x.size < ECDF_POINTS else "default"  # quantiles of a big sample: a line
    ax.plot(x, y, color=colour, lw=1.6, label=f"{name} ({values.size} tokens)", drawstyle=steps)
    qs = np.percentile(values, [50, 95, 99])
    ax.plot(qs, [0.50, 0.95, 0.99], marker, color=colour, ms=4.5, mfc="white", mew=1.3, ls="none")
    if name != "now":  # values for now; the baseline's are in the table, its markers show where
        return
    for q, p, share in zip(qs, ("p50", "p95", "p99"), (0.5, 0.95, 0.99)):
        left = p == "p95"  # p95 left of its marker, p99 right: they sit close
        ax.annotate(
            f"{p} {q:.3g}",
            (q, share),
            xytext=(-5 if left else 5, -10 if left else 2),
            textcoords="offset points",
            ha="right" if left else "left",
            fontsize=6.5,
            color=colour,
        )


def _latency_axis(ax: Axes, low: float, top: float) -> bool:
    """The latency axis from ``low`` to ``top``: logarithmic (returns True) when they are over
    8x apart, else linear from 0."""
    log = low > 0 and top / low > 8
    if log:
        ax.set_xscale("log")
        ax.set_xlim(low * 0.9, top * 1.1)
        plain_log(ax.xaxis)
    elif top > 0:
        ax.set_xlim(0, top * 1.08)
    return log


def _strip(ax: Axes, runs: Sequence[Sequence[float] | None], colours: Sequence[str], names: Sequence[str]) -> None:
    rng = np.random.default_rng(0)
    for i, (values, colour) in enumerate(zip(runs, colours)):
        if not values:
            continue
        v = np.asarray(values, dtype=float)
        ax.plot(i + rng.uniform(-0.15, 0.15, v.size), v, "o", ms=3.8, color=colour, alpha=0.8, mew=0, zorder=3)
        ax.plot([i - 0.28, i + 0.28], [np.median(v)] * 2, color=colour, lw=2.2, zorder=4)
    ax.set_xticks(range(len(names)), [f"{n}\n({len(r or [])} runs)" for n, r in zip(names, runs)])
    ax.set_xlim(-0.6, len(names) - 0.4)


def run_strips(record: Measurement, baseline: Measurement | None, budgets: Mapping[str, float]) -> Figure:
    """Per-run TTFT and TPOT, baseline vs now (dots = runs, bar = median)."""
    fig, (left, right) = chart_row(2.6, 2, margins_in=(0.62, 0.45, 0.1, 0.3), wspace=0.45, reuse=True)
    base = baseline.run_columns if baseline is not None else {}
    now = record.run_columns
    names = ["baseline", "now"] if baseline else ["now"]
    colours = [BASELINE, NOW] if baseline else [NOW]
    # Each panel: a metric's runs and every budget bounding it; a decode TPS floor is a TPOT
    # ceiling (1000 / TPS), drawn on the TPOT panel.
    panels = ((left, METRICS["ttft_ms"], ()), (right, METRICS["tpot_ms"], METRICS["decode_tps"].budget_keys))
    for ax, metric, _ in panels:
        sides = [base.get(metric.name), now.get(metric.name)] if baseline else [now.get(metric.name)]
        _strip(ax, sides, colours, names)
        ax.set_title(f"{metric.label} per run")
        ax.set_ylabel(f"{metric.label} ({metric.unit})")
    for ax, metric, rates in panels:
        _budget_lines(ax, metric.budget_keys, rates, budgets)
    for ax in (left, right):
        ax.grid(axis="x", visible=False)
        ax.set_ylim(bottom=0)  # after the budget lines, so the axis reaches them
    return fig


def _budget_lines(ax: Axes, keys: Sequence[str], rates: Sequence[str], budgets: Mapping[str, float]) -> None:
    """The panel's budgets: its metric's (``keys``) and the rate floors drawn as ceilings on
    it (``rates``: at 1000 / the rate)."""
    for key in (k for k in (*keys, *rates) if k in budgets):
        value = budgets[key]
        _budget_line(ax, key, value, 1000 / value if key in rates else value)


def _budget_line(ax: Axes, key: str, value: float, y: float) -> None:
    """A budget at ``y``, labelled on the line: a legend per axes costs more than the plot."""
    ax.axhline(y, color=BUDGET, ls="-.", lw=1.2)
    ax.annotate(
        budget_label(key, value, BUDGETS[key].unit),
        (0, y),
        xycoords=ax.get_yaxis_transform(),
        xytext=(2, 2),
        textcoords="offset points",
        ha="left",
        va="bottom",
        fontsize=6.5,
        color=BUDGET,
        bbox={"fc": "white", "ec": "none", "alpha": 0.75, "pad": 0.5},
    )


def token_timeline(record: Measurement, baseline: Measurement | None, budgets: Mapping[str, float]) -> Figure:
    """Latency of every output token by position: token 1 is the TTFT, then the ITLs.

    The first token (prefill) and the first measured run (warm-up effects) stand out; the
    fitted slope of the ITL over position shows the cost of a growing context.
    """
    fig, ax = new_chart(3.2, margins_in=(0.62, 0.9, 0.15, 0.3), reuse=True)
    for name, rec, colour in (("baseline", baseline, BASELINE), ("now", record, NOW)):
        if rec is not None and any(r.itl_ms for r in rec.runs):
            _timeline_side(ax, name, rec, colour)
    for key in (k for k in ITL_BUDGETS if k in budgets):
        ax.axhline(budgets[key], color=BUDGET, ls="-.", lw=1.2, label=budget_label(key, budgets[key], "ms"))
    ax.set_yscale("log")
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top * 1.4)  # room for the first-token marker
    plain_log(ax.yaxis)
    ax.set_xlabel("output token position (1 = first token, after prefill)")
    ax.set_ylabel("latency of the token (ms, log)")
    ax.set_title("Per-token latency timeline")
    fig.legend(loc="lower center", ncols=2, fontsize=6.5)
    return fig


def _timeline_side(ax: Axes, name: str, rec: Measurement, colour: str) -> None:
    """One side's median latency by position (with its slope) and its TTFT marker; for now,
    also the p10-p90 band of its runs and its first measured run."""
    runs = [np.asarray(r.itl_ms, dtype=float) for r in rec.runs]
    n = min(len(r) for r in runs)
    ttft = rec.run_columns.get("ttft_ms")
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
        ax.annotate(
            f"TTFT {first:.3g}",
            (1, first),
            xytext=(6, 4 if name == "now" else -8),
            textcoords="offset points",
            fontsize=6.5,
            color=colour,
        )


def _by_length(rec: Measurement | None) -> tuple[np.ndarray, np.ndarray] | None:
    """A record's (prompt tokens, TTFT ms) of each run, where it keeps both for every run (a prompt set's)."""
    lengths = rec.requests.prompt_tokens if rec is not None and rec.requests is not None else None
    ttft = rec.run_columns.get("ttft_ms") if rec is not None else None
    if not lengths or not ttft or len(lengths) != len(ttft):
        return None
    return np.asarray(lengths, dtype=float), np.asarray(ttft, dtype=float)


def ttft_by_length(
    record: Measurement,
    baseline: Measurement | None,
    budgets: Mapping[str, float],
    names: tuple[str, str] = ("baseline", "now"),
) -> Figure:
    """TTFT of every run against its prompt's length, baseline and now (a prompt set: TTFT grows
    with the prompt), each side's median per length joined; axes logarithmic where they span
    over 8x, else linear from 0. ``names``: the sides' (``ttft_by_request``: REF, this tree)."""
    fig, ax = new_chart(2.9, reuse=True)
    sides = [
        (n, got, c, mk)
        for n, r, c, mk in ((names[0], baseline, BASELINE, "s"), (names[1], record, NOW, "o"))
        if (got := _by_length(r))
    ]
    for name, (x, y), colour, marker in sides:
        ax.plot(x, y, marker, color=colour, ms=4, alpha=0.7, mew=0, label=f"{name} ({x.size} runs)")
        lengths = np.unique(x)
        ax.plot(lengths, [float(np.median(y[x == n])) for n in lengths], color=colour, lw=1.3)
    limits = [budgets[key] for key in METRICS["ttft_ms"].budget_keys if key in budgets]
    _budget_lines(ax, METRICS["ttft_ms"].budget_keys, (), budgets)
    xs = np.concatenate([x for _, (x, _), _, _ in sides])
    ys = np.concatenate([*(y for _, (_, y), _, _ in sides), limits])  # the axis reaches the budgets
    for axis, values, scale in ((ax.xaxis, xs, ax.set_xscale), (ax.yaxis, ys, ax.set_yscale)):
        if values.min() > 0 and values.max() / values.min() > 8:
            scale("log")
            plain_log(axis)
    ax.set_ylim(0 if ax.get_yscale() == "linear" else ys.min() / 1.2, ys.max() * 1.2)
    ax.set_xlabel(f"prompt tokens{', log' if ax.get_xscale() == 'log' else ''}")
    ax.set_ylabel(f"TTFT (ms{', log' if ax.get_yscale() == 'log' else ''})")
    ax.set_title(f"TTFT against prompt length, {names[1]} vs {names[0]}")
    ax.legend(loc="lower right")
    return fig


def ttft_by_request(pairs: Mapping[str, Any], budgets: Mapping[str, float]) -> Figure:
    """``ttft_by_length`` of a prompt set's pairs under ``--llmperf-against`` (the session's
    ``against`` decision's ``by_request``: each side's runs' prompt tokens and TTFT), REF and
    this tree: neither side keeps a record there."""
    ref, current = request_sides(pairs)
    return ttft_by_length(current, ref, budgets, names=("REF", "this tree"))


def request_sides(pairs: Mapping[str, Any] | None) -> tuple[Measurement, Measurement]:
    """REF's and this tree's runs of ``by_request`` as records' ``requests`` and ``runs`` (what
    ``ttft_by_length`` reads)."""
    ref, current = (
        Measurement.read({"requests": side, "runs": side} if isinstance(side, Mapping) else {})
        for side in ((pairs or {}).get(name) for name in ("REF", "current"))
    )
    return ref, current


def draws_by_request(pairs: Mapping[str, Any] | None) -> bool:
    """``by_request`` keeps each run's prompt tokens and TTFT of a side at least."""
    return any(_by_length(side) is not None for side in request_sides(pairs))


#: The caption of ``ttft_by_request``'s chart.
TTFT_BY_REQUEST = (
    "TTFT of each run against its prompt's length (a prompt set), this tree vs REF, run i of each side "
    "the same request; line: the median per length"
)


#: (id, caption, function, needs): the charts of one test, in page order.
CHARTS = (
    ("itl-ecdf", "Decode ITL distribution now vs baseline, p50/p95/p99 marked", itl_ecdf, "itl_ms"),
    ("run-strips", "Per-run TTFT and TPOT now vs baseline (bar: median)", run_strips, "runs"),
    (
        "token-timeline",
        "Per-token latency by output position: token 1 is the first token (TTFT median, diamond "
        "now, square baseline), then each inter-token latency; shaded: p10-p90 of now's runs",
        token_timeline,
        "itl_ms",
    ),
    (
        "ttft-by-length",
        "TTFT of each run against its prompt's length (a prompt set), now vs baseline; line: the median per length",
        ttft_by_length,
        "prompt_lengths",
    ),
    ("layer-bars", "Time per layer now vs baseline", layer_bars, "layers"),
    ("roofline", "Roofline: achieved vs bound", roofline, "roofline"),
)


def charts_for(record: Measurement) -> Iterator[tuple[str, str, Any]]:
    """The charts a record has data for: (id, caption, function)."""
    for fig_id, caption, fn, needs in CHARTS:
        if getattr(record, needs):
            yield fig_id, caption, fn
