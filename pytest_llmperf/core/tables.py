"""Plain-text tables: one renderer for every table the plugin prints (summary, comparison,
load curves, breakdowns, history), so columns line up the same way everywhere."""

from __future__ import annotations

from typing import Iterable, Sequence


def render_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """First column left-aligned, the others right-aligned, two spaces apart, a rule under the headers."""
    rows = [list(r) for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        return "  ".join([str(first).ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(rest, widths[1:])])

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
