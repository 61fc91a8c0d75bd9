"""``llmperf history --html``: one self-contained page of the history's trends, per test and
hardware (the session report's styles, inline SVG)."""

from __future__ import annotations

import html
from typing import Any, Sequence

from . import figures
from .html import CSS, scope_ids


def history_page(series: Sequence[Any]) -> str:
    """``llmperf history --html``: per test and hardware, the trend plots and the tables."""
    from ..history.series import steps
    from ..history.series import metric_order, table, title, trend_data
    from .trend_figure import trend_figure

    groups: dict[tuple[str, str], list[Any]] = {}
    for s in sorted(series, key=metric_order):
        groups.setdefault((s.name, s.hardware_key), []).append(s)
    body = []
    for n, ((name, hw), members) in enumerate(groups.items()):
        found = {id(s): steps(s) for s in members}
        svg = figures.render(trend_figure, [trend_data(s, found[id(s)]) for s in members])
        lines = [step.line() for s in members for step in found[id(s)]]
        body.append(
            f'<section class="test" data-test="{html.escape(name)}"><h2>{html.escape(name)}</h2>'
            f'<p class="notes">{html.escape(hw)}; {len(members[0].points)} session(s)</p>'
            f'<figure class="plot" data-figure="trend">{scope_ids(svg, f"h{n}-")}<figcaption>'
            "Level per session with its 95% CI; dashed: change points (E-divisive, permutation test), "
            "labelled with the step and the subject change that coincides</figcaption></figure>"
            + ("<ul class='notes'>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>" if lines else "")
            + "".join(f"<pre>{html.escape(title(s))}\n{html.escape(table(s, found[id(s)]))}</pre>" for s in members)
            + "</section>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>pytest-llmperf history</title>'
        f"<style>{CSS}</style></head><body><main><h1>pytest-llmperf history</h1>\n" + "\n".join(body)
        + "\n</main></body></html>\n"
    )
