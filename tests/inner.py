"""Helpers shared by the tests that drive inner pytest sessions and edit stored baselines."""

from __future__ import annotations

import pytest


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An inner pytest session in this process (no cache folder left behind)."""
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def scale(entry: dict, factor: float) -> None:
    """Make a stored baseline entry ``factor`` times faster than what was measured."""
    runs = entry["runs"]
    for key in ("ttft_ms", "tpot_ms", "itl_p50_ms", "itl_p95_ms"):
        runs[key] = [v / factor for v in runs[key]]
    for key in ("prefill_tps", "decode_tps"):
        runs[key] = [v * factor for v in runs[key]]
    entry["itl_ms"] = [[v / factor for v in run] for run in entry["itl_ms"]]
