"""What serving adds: the same test measured in process and through a server, side by side.

A test that measures the same workload on the in-process engine and on an HTTP endpoint gets
one line in the session summary: both TTFT and TPOT medians and the server's added latency per
token (TPOT served minus TPOT in process), the figure users ask for.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from ..core.numbers import fmt


def overhead_lines(rows: Iterable[dict[str, Any]]) -> list[str]:
    """One line per test with both an in-process and an ``http`` measurement (report rows)."""
    by_test: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_test[str(row.get("test", "")).split("[", 1)[0]].append(row)
    lines = []
    for test, group in by_test.items():
        local = [r for r in group if r.get("engine") == "llama.cpp" and r.get("tpot_ms") is not None]
        served = [r for r in group if str(r.get("engine", "")).startswith("http") and r.get("tpot_ms") is not None]
        if not local or not served:
            continue
        a, b = local[0], served[0]
        lines.append(
            f"{test}: in process TTFT {fmt(a['ttft_ms'])} ms, TPOT {fmt(a['tpot_ms'])} ms; served TTFT "
            f"{fmt(b['ttft_ms'])} ms, TPOT {fmt(b['tpot_ms'])} ms; server overhead "
            f"{b['tpot_ms'] - a['tpot_ms']:+.3g} ms/token, {b['ttft_ms'] - a['ttft_ms']:+.3g} ms TTFT"
        )
    return lines
