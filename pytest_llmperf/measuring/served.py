"""What serving adds: the same test measured in process and through a server, side by side.

A test that measures the same workload on the in-process engine and on an HTTP endpoint gets
one line in the session summary: both TTFT and TPOT medians and the server's added latency per
token (TPOT served minus TPOT in process), the figure users ask for.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from ..core.catalog import METRICS
from ..core.formats import fmt


def overhead_lines(rows: Iterable[dict[str, Any]]) -> list[str]:
    """One line per test with both an in-process and an ``http`` measurement (report rows)."""
    by_test: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_test[str(row.get("test", "")).split("[", 1)[0]].append(row)
    ttft, tpot = METRICS["ttft_ms"], METRICS["tpot_ms"]

    def both(r: dict[str, Any]) -> str:
        return ", ".join(f"{x.label} {fmt(r[x.name])} {x.unit}" for x in (ttft, tpot))

    lines = []
    for test, group in by_test.items():
        local = [r for r in group if r.get("engine") == "llama.cpp" and r.get(tpot.name) is not None]
        served = [r for r in group if str(r.get("engine", "")).startswith("http") and r.get(tpot.name) is not None]
        if not local or not served:
            continue
        a, b = local[0], served[0]
        lines.append(
            f"{test}: in process {both(a)}; served {both(b)}; server overhead "
            f"{b[tpot.name] - a[tpot.name]:+.3g} {tpot.unit}/token, {b[ttft.name] - a[ttft.name]:+.3g} {ttft.unit} {ttft.label}"
        )
    return lines
