"""The HTML report's key figure: the change of every compared metric with its CI, most notable
first.

Apart from the per-test figures because it draws the whole session (every test's verdicts) at
the top of the page, from the session's typed results (``judge.result.MeasurementResult``)
rather than one record.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Sequence

from ..core import formats as nodeids
from .figures import BASELINE, BUDGET, FIRST_RUN, new_figure

if TYPE_CHECKING:
    from ..judge.result import MeasurementResult


VERDICT_COLOURS = {"REGRESSION": BUDGET, "IMPROVED": "#1e8449", "MACHINE_SLOWER": FIRST_RUN,
                   "INCONCLUSIVE": "#7d3c98", "UNCHANGED": BASELINE}
VERDICT_ORDER = ("REGRESSION", "MACHINE_SLOWER", "IMPROVED", "INCONCLUSIVE", "UNCHANGED")
OVERVIEW_ROWS = 24


def change_overview(results: Sequence["MeasurementResult"]) -> Any:
    """Change of each compared metric with its 95% CI, the most notable first (capped)."""
    rows = []
    for r in results:
        for c in r.verdict.comparisons if r.verdict is not None else ():
            word = c.verdict.value
            rank = VERDICT_ORDER.index(word) if word in VERDICT_ORDER else len(VERDICT_ORDER)
            rows.append((rank, -abs(c.ratio - 1), r.test, c))
    rows.sort(key=lambda row: row[:2])
    shown = rows[:OVERVIEW_ROWS]
    fig, ax = new_figure(0.9 + 0.17 * len(shown), width_in=9.0, margins_in=(3.4, 0.45, 0.9, 0.3))
    for y, (_, _, test, c) in enumerate(shown):
        colour = VERDICT_COLOURS.get(c.verdict.value, BASELINE)
        change = (c.ratio - 1) * 100
        if c.ci_low is not None and c.ci_high is not None:
            ax.hlines(y, (c.ci_low - 1) * 100, (c.ci_high - 1) * 100, color=colour, lw=1.6)
        ax.plot(change, y, "o", color=colour, ms=5)
        ax.annotate(c.verdict.value, (1.0, y), xycoords=("axes fraction", "data"), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7, color=colour, fontweight="bold")
    labels = [f"{nodeids.last(test)[:38]} \u00b7 {c.phase} {c.label}" for _, _, test, c in shown]
    ax.set_yticks(range(len(shown)), labels)
    ax.invert_yaxis()
    thresholds = Counter(c.threshold for _, _, _, c in shown if c.threshold)
    if thresholds:
        common = thresholds.most_common(1)[0][0]
        others = sorted({f"{c.label} +-{c.threshold:.0%}" for _, _, _, c in shown
                         if c.threshold and c.threshold != common})
        label = f"threshold +-{common:.0%}" + (f" ({', '.join(others)})" if others else "")
        ax.axvspan(-common * 100, common * 100, color="#eeeeee", zorder=0, label=label)
        ax.legend(loc="lower right")
    ax.axvline(0, color="black", lw=0.8)
    ax.grid(axis="y", visible=False)
    more = f" ({len(rows) - len(shown)} more in the tables)" if len(rows) > len(shown) else ""
    ax.set_xlabel("change now vs baseline (%); + is slower for latencies, faster for throughputs")
    ax.set_title(f"Compared metrics, most notable first{more}")
    return fig

