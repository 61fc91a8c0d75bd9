"""The rows one session appends: built from the plugin's results (``MeasurementResult.to_json()``
of judge/result.py: the entries of the JSON report, also what crosses pytest-xdist's wire), so
the history holds exactly what the session measured and judged."""

from __future__ import annotations

import datetime
import socket
import statistics
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..core.catalog import METRICS
from ..judge.verdict import level
from ..baselines.records import RUN_FIELDS
from .vcs import revision


def phase_of(metric: str) -> str:
    spec = METRICS.get(metric)
    return spec.phase if spec else ("prefill" if metric.startswith(("ttft", "prefill")) else "decode")


def unit_of(metric: str) -> str:
    spec = METRICS.get(metric)
    return spec.unit if spec else ("t/s" if metric.endswith("_tps") else "ms")


def value_rows(runs: Mapping[str, list[float]]) -> list[dict[str, Any]]:
    """Per metric: the per-run values, their median and the session's level (``levels.level``:
    the robust location on the log scale and its standard error)."""
    out = []
    for metric in RUN_FIELDS:
        values = runs.get(metric)
        if not values:
            continue
        try:
            lv = level(values, metric)
        except ValueError:
            continue  # a zero or missing value (e.g. a one-token answer): no level to keep
        out.append(
            {
                "metric": metric, "phase": phase_of(metric), "unit": unit_of(metric), "n": lv.n,
                "median": float(statistics.median(values)), "log_level": lv.log_level, "se": lv.se,
                "spread": lv.spread, "upper": lv.upper, "runs": [float(v) for v in values],
            }
        )
    return out


def measurement_rows(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        rec = r["record"]
        verdict = r.get("verdict")
        rows.append(
            {
                "test": r.get("nodeid") or r["test"],
                "label": r.get("label") or "",
                "hardware_key": r["hardware_key"],
                "hardware": rec.get("hardware", {}),
                "subject": rec.get("subject", {}),
                "workload": rec.get("workload", {}),
                "summary": rec.get("summary", {}),
                "baseline": None if not verdict else verdict.get("short") or verdict.get("status"),
                "values": value_rows(rec.get("runs", {})),
            }
        )
    return rows


def session_row(started_at: str, rootdir: Path | str, compared: bool) -> dict[str, Any]:
    from .. import __version__

    rev = revision(rootdir)
    return {
        "uid": uuid.uuid4().hex,
        "started_at": started_at,
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": rev.commit,
        "dirty": rev.dirty,
        "branch": rev.branch,
        "host": socket.gethostname(),
        "compared": compared,
        "llmperf_version": __version__,
    }
