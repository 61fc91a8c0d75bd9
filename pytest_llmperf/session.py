"""One session's results: baselines to write, the JSON report, the Markdown summary.

Results arrive as plain dicts (they cross pytest-xdist's wire on the test reports), and only
the process that owns the session (the xdist controller, or the single process) writes files,
so workers never race on a baseline file.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import baseline_store
from .budgets import fmt
from .report import render_table

SESSION_SCHEMA = "pytest-llmperf/session"
SESSION_SCHEMA_VERSION = 1


def comparison_dict(c: Any) -> dict[str, Any]:
    d = dataclasses.asdict(c)
    d["verdict"] = c.verdict.value
    d["line"] = c.line()
    return d


def verdict_dict(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    return {
        "status": v.status,
        "note": v.note,
        "changes": list(v.changes),
        "short": v.short(),
        "failures": v.failure_lines(),
        "comparisons": [comparison_dict(c) for c in v.comparisons],
        "layer_changes": [c.as_dict() for c in getattr(v, "layer_changes", ())],
    }


def write_baselines(
    baseline_dir: Path, results: Iterable[Mapping[str, Any]], errors: list[str] | None = None
) -> list[tuple[Path, Path | None]]:
    """Merge each result's record into its module's file; returns (file, moved-aside corrupt file).

    ``errors``: a file that cannot be written adds its one-line reason there and the others
    are still written (without it, the ``BaselineError`` is raised)."""
    by_file: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in results:
        by_file[r["baseline_file"]].setdefault(r["key"], {})[r["hardware_key"]] = r["record"]
    written = []
    for rel, entries in sorted(by_file.items()):
        path = baseline_dir / rel
        try:
            written.append((path, baseline_store.update(path, entries)))
        except baseline_store.BaselineError as exc:
            if errors is None:
                raise
            errors.append(f"llmperf: {exc}")
    return written


def session_json(results: list[Mapping[str, Any]], created_at: str) -> str:
    return json.dumps(
        {
            "schema": SESSION_SCHEMA,
            "schema_version": SESSION_SCHEMA_VERSION,
            "created_at": created_at,
            "results": results,
        },
        indent=1,
        sort_keys=True,
        allow_nan=False,
    )


def load_session(path: Path) -> list[dict[str, Any]]:
    """Results of a saved ``--llmperf-json`` report; a one-line error if it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise baseline_store.BaselineError(f"session report not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise baseline_store.BaselineError(f"{path} is not a readable JSON session report: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SESSION_SCHEMA:
        raise baseline_store.BaselineError(
            f"{path} is not a pytest-llmperf session report (write one with --llmperf-json)"
        )
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise baseline_store.BaselineError(f"{path}: schema_version is not an integer")
    if version > SESSION_SCHEMA_VERSION:
        raise baseline_store.BaselineError(f"{path} is from a newer pytest-llmperf; upgrade to read it")
    results = data.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) and "record" in r for r in results):
        raise baseline_store.BaselineError(f"{path}: \"results\" is not a list of measurement records")
    for i, r in enumerate(results):  # a hand-edited file: one line naming the field, not a traceback
        for key in ("test", "hardware_key"):
            if not isinstance(r.get(key), str):
                raise baseline_store.BaselineError(f"{path}: results[{i}].{key} is missing or not a string")
        baseline_store.check_record(
            f"{path}: results[{i}].record", r["record"], "write the report again with pytest --llmperf-json"
        )
    return results


COMPARISON_HEADERS = ("test", "metric", "baseline", "now", "change", "95% CI", "p (Holm)", "verdict")


def comparison_rows(results: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        verdict = r.get("verdict") or {}
        for c in verdict.get("comparisons", []):
            ci = (
                f"{(c['ci_low'] - 1) * 100:+.1f}..{(c['ci_high'] - 1) * 100:+.1f}%"
                if c.get("ci_low") is not None and c.get("ci_high") is not None
                else "n/a"
            )
            p = c.get("p_adjusted") if c.get("p_adjusted") is not None else c.get("p_value")
            rows.append(
                [
                    r["test"],
                    f"{c['phase']} {c['label']} ({c['unit']})",
                    fmt(c["baseline_value"]),
                    fmt(c["candidate_value"]),
                    f"{(c['ratio'] - 1) * 100:+.1f}%",
                    ci,
                    "n/a" if p is None else f"{p:.3g}",
                    c["verdict"],
                ]
            )
    return rows


def comparison_table(results: Iterable[Mapping[str, Any]]) -> str:
    rows = comparison_rows(results)
    return render_table(COMPARISON_HEADERS, rows) if rows else ""


def markdown(results: list[Mapping[str, Any]], extra: Iterable[str] = ()) -> str:
    """A GitHub-flavoured summary: one line per test, then the comparison table.

    ``extra``: Markdown lines after the headline (the HTML report's link and key figure)."""
    lines = ["## pytest-llmperf", ""]
    regressions = [f for r in results for f in ((r.get("verdict") or {}).get("failures") or [])]
    lines.append(
        f"**{len(regressions)} regression(s)** in {len(results)} measurement(s)." if regressions
        else f"No regression in {len(results)} measurement(s)."
    )
    for line in extra:
        lines += ["", line]
    lines += ["", "| test | TTFT ms | decode t/s | ITL p95 ms | budget | baseline |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        s = r["record"]["summary"]
        verdict = r.get("verdict") or {}
        lines.append(
            f"| `{r['test']}` | {fmt(s['ttft_ms'])} | {fmt(s['decode_tps'])} | {fmt(s['itl_p95_ms'])} "
            f"| {r.get('budget', '-')} | {verdict.get('short', 'not compared')} |"
        )
    if regressions:
        lines += ["", "### Regressions", ""] + [f"- {line}" for line in regressions]
    rows = comparison_rows(results)
    if rows:
        lines += ["", "### Comparisons", "", "| " + " | ".join(COMPARISON_HEADERS) + " |",
                  "|" + " --- |" * len(COMPARISON_HEADERS)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
