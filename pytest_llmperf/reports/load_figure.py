"""The throughput-latency curve of served load tests, for the HTML report.

Each load measurement is one point (output tokens/s overall against per-request TTFT and TPOT
p50, p99 as a whisker), labelled with its concurrency; points of one test function
(parametrized over concurrency, or measured with several labels) are joined into a curve.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..core import formats as nodeids
from . import figures

if TYPE_CHECKING:
    from ..judge.result import MeasurementResult

_PARAMS = re.compile(r"\[.*\]$")


def curves(results: Sequence["MeasurementResult"]) -> dict[str, list[Mapping[str, Any]]]:
    """``{test function: load records sorted by throughput}`` of the results that have one."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in results:
        load = (r.record or {}).get("load")
        if load and load.get("output_tps") is not None:
            groups[_PARAMS.sub("", r.test)].append(load)
    return {k: sorted(v, key=lambda d: (d["concurrency"], d["output_tps"])) for k, v in groups.items()}


def throughput_latency(results: Sequence["MeasurementResult"]) -> Any:
    """Two panels sharing the x axis (output tok/s): TTFT and TPOT, p50 with p99 whiskers."""
    fig, (left, right) = figures.new_figure(3.4, ncols=2, margins_in=(0.62, 0.95, 0.15, 0.3), wspace=0.45)
    colours = ("#1f5fbf", "#c0392b", "#1e8449", "#7d3c98", "#b9770e", "#2e4053")
    for n, (test, points) in enumerate(sorted(curves(results).items())):
        colour = colours[n % len(colours)]
        x = [p["output_tps"] for p in points]
        for ax, key in ((left, "ttft"), (right, "tpot")):
            p50 = [p[f"{key}_p50_ms"] for p in points]
            p99 = [p[f"{key}_p99_ms"] for p in points]
            ax.plot(x, p50, "o-", color=colour, ms=5, lw=1.2, label=nodeids.last(test) if key == "ttft" else None)
            ax.vlines(x, p50, p99, color=colour, lw=0.8, alpha=0.6)
            for xi, yi, p in zip(x, p50, points):
                label = f"c{p['concurrency']}" + (f"@{p['rate_per_s']:g}/s" if p.get("rate_per_s") else "")
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


def section(results: Sequence["MeasurementResult"]) -> str | None:
    """The curve's SVG, or None when no result is a load test."""
    if not curves(results):
        return None
    return figures.render(throughput_latency, results)
