"""The HTML report's breakdown figures of a profiled test: time per layer and the roofline.

Apart from the per-test latency figures because they draw what only ``layers=True`` and a
roofline record (``record["layers"]``, ``record["roofline"]``), with their own scales.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .figures import BASELINE, BUDGET, NOW, WIDTH_IN, budget_label, new_figure, plain_log


def layer_bars(record: Mapping[str, Any], baseline: Mapping[str, Any] | None, budgets: Mapping[str, float]) -> Any:
    """Median time per layer and phase, now vs baseline; outlier layers named in red."""
    phases = record["layers"]["phases"]
    names = [p for p in ("prefill", "decode") if p in phases]
    n_rows = max(len(phases[p]["names"]) for p in names)
    longest = max(len(n) for p in names for n in phases[p]["names"])
    width = 2 * WIDTH_IN  # the page shows it across both columns
    label_in = 0.15 + 0.075 * longest
    axes_in = (width - label_in - 0.2 - label_in * (len(names) - 1)) / len(names)
    fig, axes = new_figure(1.2 + 0.2 * n_rows, len(names), width_in=width, margins_in=(label_in, 0.8, 0.2, 0.3),
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
    fig, ax = new_figure(3.6, margins_in=(0.62, 1.2, 0.15, 0.3))
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
                label=budget_label("min_mbu", budgets["min_mbu"], "of peak bandwidth"))
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
    plain_log(ax.xaxis)
    plain_log(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (GFLOP/s)")
    ax.set_title("Roofline: achieved (filled) vs bound (hollow black)")
    fig.legend(loc="lower center", fontsize=6.5)
    return fig
