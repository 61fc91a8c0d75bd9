"""The history shown: terminal tables, trend plots (value per session with its 95% CI, change
points marked with the subject change that coincides), the HTML report's recent trend per
test, and a CSV export that Apache Otava reads."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..core.catalog import METRICS
from ..core.formats import render_table
from .detect import Step, steps
from .series import Series

if TYPE_CHECKING:
    from ..judge.result import MeasurementResult

#: Sessions drawn in the pytest HTML report's per-test trend.
RECENT_SESSIONS = 20


def label_of(metric: str) -> str:
    """The metric's label in the catalog (a metric the catalog no longer has: its name)."""
    spec = METRICS.get(metric)
    return spec.label if spec else metric


def title(s: Series) -> str:
    return f"{s.name}  {label_of(s.metric)} ({s.phase}, {s.unit})  on {s.hardware_key}: {len(s.points)} session(s)"


def table(s: Series, found: Sequence[Step] = ()) -> str:
    at = {step.index: step for step in found}
    rows = []
    for i, p in enumerate(s.points):
        lo, hi = p.ci
        step = at.get(i)
        mark = ""
        if step is not None:
            mark = f"<- {'REGRESSION' if step.regression else 'change'} {step.change:+.1%}"
        changes = s.changes_at(i)
        if changes:
            mark = (mark + "; " if mark else "") + ", ".join(changes)
        rows.append([str(i + 1), p.started_at.replace("+00:00", "Z"), p.short_commit, p.branch or "-",
                     f"{p.value:.4g}", f"{lo:.4g}..{hi:.4g}", str(p.n), p.baseline or "-", mark])
    return render_table(("#", "started", "commit", "branch", "level", "95% CI", "runs", "baseline", "change"), rows)


def trend_data(s: Series, found: Sequence[Step] = ()) -> dict[str, Any]:
    """One series as plain data (crosses to the HTML report's drawing processes as JSON)."""
    return {
        "test": s.name, "metric": s.metric, "label": f"{s.phase} {label_of(s.metric)}", "unit": s.unit,
        "points": [[p.value, *p.ci, p.short_commit] for p in s.points],
        "steps": [{"index": st.index, "text": _step_text(st), "regression": st.regression} for st in found],
    }


def _step_text(st: Step) -> str:
    named = "; ".join(c.split(" (session")[0] for c in st.coinciding)
    return f"{st.change:+.1%}" + (f" {named}" if named else "")



def attach(
    results: Sequence["MeasurementResult"], loc: Any, last: int = RECENT_SESSIONS
) -> dict[str, list[dict[str, Any]]]:
    """Each test's recent trend, for the HTML report beside the results: ``{result.test:
    [trend_data of TTFT, of TPOT]}`` over its last ``last`` sessions on this hardware (a test
    with fewer than two sessions has none)."""
    from .series import read_series

    def key_of(r: "MeasurementResult") -> tuple[str, str, str]:
        return (r.nodeid or r.test, r.label, r.hardware_key)

    wanted = {key_of(r) for r in results}
    found: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for s in read_series(loc, metrics=("ttft_ms", "tpot_ms"), last=last):
        key = (s.test, s.label, s.hardware_key)
        if key in wanted and len(s.points) >= 2:
            found.setdefault(key, []).append(trend_data(s, steps(s)))
    out = {}
    for r in results:
        trend = sorted(found.get(key_of(r), []), key=lambda t: t["metric"], reverse=True)  # ttft_ms, then tpot_ms
        if trend:
            out[r.test] = trend
    return out


def metric_order(s: Series) -> int:
    """Prefill first, then decode: the order of ``records.RUN_FIELDS``."""
    from ..baselines.records import RUN_FIELDS

    return RUN_FIELDS.index(s.metric) if s.metric in RUN_FIELDS else len(RUN_FIELDS)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120] or "test"


#: Otava's PostgreSQL source: one row per session, one column per metric (the stored level), of
#: the branch given to ``otava analyze --branch`` (Otava 0.8.0 with its pg8000 fails on a query
#: without the ``%{BRANCH}`` parameter: "object of type 'NoneType' has no len()").
OTAVA_PG_QUERY = """SELECT s.started_at AS time, s.commit_sha AS commit, s.branch AS branch,
{columns}
FROM llmperf_sessions s
JOIN llmperf_measurements m ON m.session_id = s.id
JOIN llmperf_values v ON v.measurement_id = m.id
WHERE m.test = '{test}' AND m.label = '{label}' AND m.hardware_key = '{hardware_key}'
  AND s.branch = %{{BRANCH}}
GROUP BY s.id, s.started_at, s.commit_sha, s.branch
ORDER BY s.started_at, s.id"""


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


def export_csv(series: Sequence[Series], folder: Path, postgres: bool = False) -> list[Path]:
    """One CSV per test, label and hardware (a row per session: time, commit, branch, subject
    and one column per metric, the session's level) and an ``otava.yaml`` that names them:
    ``OTAVA_CONFIG=DIR/otava.yaml otava analyze TEST`` reads them as they are. ``postgres``:
    also ``otava-postgres.yaml``, the same tests read straight from a PostgreSQL history."""
    folder.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str], list[Series]] = {}
    for s in series:
        groups.setdefault((s.name, s.hardware_key), []).append(s)
    written, tests, pg_tests = [], [], []
    for (name, hw), members in groups.items():
        slug = _slug(f"{name}-{hw}")
        rows: dict[int, dict[str, Any]] = {}
        for s in members:
            for i, p in enumerate(s.points):
                row = rows.setdefault(p.session_id, {
                    "time": p.started_at, "commit": p.commit or "", "branch": p.branch or "",
                    "subject": _subject_text(p.subject),
                })
                row[s.metric] = f"{p.value:.6g}"
        metrics = [s.metric for s in members]
        path = folder / f"{slug}.csv"
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, ["time", "commit", "branch", "subject", *metrics])
            w.writeheader()
            for sid in sorted(rows, key=lambda k: (rows[k]["time"], k)):
                w.writerow(rows[sid])
        written.append(path)
        # Otava's direction: 1 when higher is better, -1 when lower is.
        metric_lines = "".join(
            f"      {s.metric}:\n        direction: {1 if s.higher_is_better else -1}\n" for s in members
        )
        tests.append(
            f"  {slug}:\n    type: csv\n    file: {path.resolve()}\n    time_column: time\n"
            f"    attributes: [commit, branch, subject]\n    metrics:\n{metric_lines}"
        )
        s0 = members[0]
        columns = ",\n".join(f"MAX(CASE WHEN v.metric = '{m}' THEN v.level END) AS {m}" for m in metrics)
        query = OTAVA_PG_QUERY.format(columns=columns, test=_sql_text(s0.test), label=_sql_text(s0.label),
                                      hardware_key=_sql_text(hw))
        pg_tests.append(
            f"  {slug}:\n    type: postgres\n    time_column: time\n    attributes: [commit, branch]\n"
            f"    metrics:\n{metric_lines}    query: |\n" + "".join(f"      {q}\n" for q in query.splitlines())
        )
    (folder / "otava.yaml").write_text("# written by llmperf history --csv\ntests:\n" + "".join(tests), encoding="utf-8")
    if postgres:
        (folder / "otava-postgres.yaml").write_text(
            "# written by llmperf history --csv; connection: otava --postgres-hostname ... (docs/history.md)\n"
            "tests:\n" + "".join(pg_tests), encoding="utf-8")
    return written


def _subject_text(subject: Mapping[str, Any]) -> str:
    keys = ("backend_version", "model", "quantization", "n_threads", "n_gpu_layers")
    return " ".join(f"{k}={subject.get(k)}" for k in keys if subject.get(k) is not None)

