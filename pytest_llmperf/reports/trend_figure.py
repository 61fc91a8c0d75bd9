"""The HTML report's and `llmperf history --html`'s trend plot: one series per axes from
history/series.trend_data (drawing only; the history layer reads, this layer draws)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .figures import BUDGET, NOW, new_figure

def trend_figure(trends: Sequence[Mapping[str, Any]]) -> Any:
    """Value per session with its 95% CI, one axes per series; change points dashed, labelled
    with the step and the coinciding subject change; the latest session filled."""
    fig, axes = new_figure(2.3, ncols=len(trends), width_in=max(5.4, 3.2 * len(trends)), squeeze=False,
                        margins_in=(0.62, 0.45, 0.15, 0.3))
    for ax, t in zip(axes[0], trends):
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
            ax.text(at + (0.3 if right else -0.3), top, st["text"], fontsize=7, va="top",
                    ha="left" if right else "right", color=colour,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.0})
        ax.set_title(f"{t['label']} ({t['unit']})")
        ax.set_xlabel("session")
        ax.set_xlim(0.5, len(pts) + 0.5)
    return fig
