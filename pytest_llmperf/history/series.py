"""The one reader of the history: stored rows -> one series per test, label, metric and
hardware, oldest session first. ``llmperf history``, ``llmperf detect``, the HTML report's
trends and the verdicts' between-session spread (``levels``) all read through here.

Change points are named here (session, commit, the subject change that coincides, step size
and significance); the history is shown as terminal tables, trend data and Otava's CSV."""

from __future__ import annotations

import csv
import datetime
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from ..baselines.store import unique_test_id
from ..core.catalog import METRICS, RUN_FIELDS
from ..core.documents import write_output
from ..core.fingerprint import subject_changes
from ..core.formats import render_table
from ..core.measurement import Measurement, workload_changes
from ..core.progress import task
from ..judge.verdict import WINDOW_SESSIONS, Level, Verdict
from . import changepoints
from . import database as store
from .connection import Location

if TYPE_CHECKING:
    from ..judge.result import Outcome


#: Two-sided 95% normal quantile: the CI drawn and printed around a session's level.
Z95 = 1.959964


@dataclass(frozen=True)
class Point:
    """One session's value of one series: its level (robust location of the runs) and CI."""

    session_id: int
    started_at: str
    commit: str | None
    dirty: bool | None
    branch: str | None
    n: int
    median: float
    log_level: float
    se: float
    spread: float
    upper: float | None
    baseline: str | None
    subject: Mapping[str, object] = field(default_factory=dict, compare=False)
    workload: Mapping[str, object] = field(default_factory=dict, compare=False)
    runs: tuple[float, ...] = field(default=(), compare=False)
    #: The metric's verdict in that session (None: not compared).
    verdict: Verdict | None = field(default=None, compare=False)

    @property
    def busy(self) -> bool:
        """The verdict blamed the machine (MACHINE_SLOWER): the level measured its neighbours."""
        return self.verdict is Verdict.MACHINE_SLOWER

    @property
    def value(self) -> float:
        return math.exp(self.log_level)

    @property
    def ci(self) -> tuple[float, float]:
        return math.exp(self.log_level - Z95 * self.se), math.exp(self.log_level + Z95 * self.se)

    @property
    def short_commit(self) -> str:
        return (self.commit or "-")[:10] + ("*" if self.dirty else "")

    def level(self) -> Level:
        return Level(self.log_level, self.se, self.n, self.spread, self.upper)


@dataclass(frozen=True)
class Series:
    test: str
    label: str
    metric: str
    phase: str
    unit: str
    hardware_key: str
    points: tuple[Point, ...]

    @property
    def name(self) -> str:
        return self.test + (f"[{self.label}]" if self.label else "")

    @property
    def higher_is_better(self) -> bool:
        spec = METRICS.get(self.metric)
        return spec.higher_is_better if spec else self.metric.endswith("_tps")

    def changes_at(self, index: int) -> list[str]:
        """What changed in the subject or workload from session ``index - 1`` to ``index``."""
        if index <= 0 or index >= len(self.points):
            return []
        a, b = self.points[index - 1], self.points[index]
        return subject_changes(a.subject, b.subject) + workload_changes(a.workload, b.workload)


def group(rows: Sequence[Mapping[str, Any]]) -> list[Series]:
    """Rows (``store.read``) -> series, in the order their first session appears."""
    by_key: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((r["test"], r["label"], r["metric"], r["hardware_key"]), []).append(r)
    out = []
    for (test, label, metric, hw), rs in by_key.items():
        points = tuple(
            Point(
                r["session_id"],
                r["started_at"],
                r["commit_sha"],
                r["dirty"],
                r["branch"],
                int(r["n"]),
                float(r["median"]),
                float(r["log_level"]),
                float(r["se"]),
                float(r["spread"]),
                None if r["upper"] is None else float(r["upper"]),
                r["baseline"],
                r["subject"],
                r["workload"],
                tuple(r["runs"]),
                r.get("verdict"),
            )
            for r in rs
        )
        out.append(Series(test, label, metric, rs[0]["phase"], rs[0]["unit"], hw, points))
    first: dict[tuple[str, str, str], int] = {}
    for s in out:
        first.setdefault((s.test, s.label, s.hardware_key), len(first))
    return sorted(out, key=lambda s: (first[(s.test, s.label, s.hardware_key)], metric_order(s)))


def read_series(
    loc: Location,
    *,
    test: str | None = None,
    metrics: Sequence[str] | None = None,
    hardware_key: str | None = None,
    last: int | None = None,
    skipped: list[str] | None = None,
) -> list[Series]:
    """The stored series (``test``: a substring of the test id), each cut to its ``last``
    sessions; ``skipped`` gets the line about unreadable rows left out (``store.read``)."""
    series = group(store.read(loc, test=test, metrics=metrics, hardware_key=hardware_key, skipped=skipped))
    if last:
        series = [Series(s.test, s.label, s.metric, s.phase, s.unit, s.hardware_key, s.points[-last:]) for s in series]
    return series


def levels(loc: Location, test: str, label: str, metric: str, hardware_key: str, *, last: int = 10) -> list[Level]:
    """The last ``last`` sessions' levels of one series since its subject or workload last
    changed (oldest first): the between-session spread that a stored baseline's own recorded
    sessions give ``verdict.NoiseModel.between`` today, from every session of the history."""
    found = [
        s
        for s in read_series(loc, test=test, metrics=[metric], hardware_key=hardware_key)
        if s.test == test and s.label == label
    ]
    if not found:
        return []
    s = found[0]
    start = max((i for i in range(1, len(s.points)) if s.changes_at(i)), default=0)
    return [p.level() for p in s.points[start:]][-last:]


#: Sessions read for the verdicts' windows: the last ones stored with a measurement on this
#: hardware (a window holds a test's last ``verdict.WINDOW_SESSIONS``; tests that run in
#: subsets of the sessions reach further back).
WINDOW_READ_SESSIONS = 50
#: A measurement judged one of these is not noise: it stays out of the window (a regression
#: the gate caught must not widen the next sessions' noise estimate).
NOT_NOISE = frozenset({Verdict.REGRESSION, Verdict.MACHINE_SLOWER})


def _instant(iso: str) -> datetime.datetime | None:
    try:
        t = datetime.datetime.fromisoformat(str(iso))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=datetime.timezone.utc)


@dataclass(frozen=True)
class Windows:
    """The history's recent sessions of every test on one hardware, read once per session
    (``read_windows``); ``levels`` picks one test's window for the verdict."""

    #: (test, label) -> rows of that measurement (``store.read``, without runs), oldest first.
    rows: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]
    #: The line about unreadable rows left out of the windows (``store.read``), else None.
    skipped: str | None = None

    def levels(self, test: str, label: str, entry: Measurement) -> dict[str, list[Level]]:
        """Per metric, the last ``verdict.WINDOW_SESSIONS`` sessions of this test since the
        baseline ``entry`` was recorded (its ``recorded_at``), with its subject and workload,
        leaving out measurements judged REGRESSION or MACHINE_SLOWER: the window the verdict
        judges against (docs/verdicts.md)."""
        since = _instant(entry.recorded_at or "")
        out: dict[str, list[Level]] = {}
        same: dict[tuple[int, int], bool] = {}  # rows share their parsed subject and workload
        for r in self.rows.get((test, label), ()):
            if _same_subject_and_workload(entry, r, same) and _in_window(r, since):
                out.setdefault(r["metric"], []).append(_stored_level(r))
        return {metric: lv[-WINDOW_SESSIONS:] for metric, lv in out.items()}


def _same_subject_and_workload(entry: Measurement, r: Mapping[str, Any], memo: dict[tuple[int, int], bool]) -> bool:
    """Whether the row measured the baseline ``entry``'s subject and workload (``memo``: by the
    row's parsed subject and workload objects, which rows share)."""
    key = id(r["subject"]), id(r["workload"])
    if key not in memo:
        memo[key] = not subject_changes(entry.subject, r["subject"]) and not workload_changes(
            entry.identity or {}, r["workload"]
        )
    return memo[key]


def _in_window(r: Mapping[str, Any], since: datetime.datetime | None) -> bool:
    """Whether the row counts as noise for the verdict: not judged ``NOT_NOISE``, and started
    no earlier than the baseline (``since``)."""
    if r["verdict"] in NOT_NOISE:
        return False
    started = _instant(r["started_at"])
    return since is None or (started is not None and started >= since)


def _stored_level(r: Mapping[str, Any]) -> Level:
    """A row's stored level, standard error, sample count, spread and upper bound."""
    return Level(
        float(r["log_level"]),
        float(r["se"]),
        int(r["n"]),
        float(r["spread"]),
        None if r["upper"] is None else float(r["upper"]),
    )


def read_windows(loc: Location, hardware_key: str, metrics: Sequence[str]) -> Windows:
    """One read of the history for a whole session: the last ``WINDOW_READ_SESSIONS``
    sessions' levels of ``metrics`` on ``hardware_key`` (no per-run values). Raises
    ``store.HistoryError`` (one line) when the history cannot be read."""
    rows: dict[tuple[str, str], list[Mapping[str, object]]] = {}
    if loc.kind == "sqlite" and not Path(loc.target).is_file():
        return Windows(rows)
    skipped: list[str] = []
    for r in store.read(
        loc,
        metrics=metrics,
        hardware_key=hardware_key,
        last_sessions=WINDOW_READ_SESSIONS,
        runs=False,
        skipped=skipped,
        uses="the verdicts used the other sessions",
    ):
        rows.setdefault((r["test"], r["label"]), []).append(r)
    return Windows(rows, skipped[0] if skipped else None)


@dataclass(frozen=True)
class Step:
    series: Series
    index: int  # the first point of the new segment
    p_value: float
    median_before: float
    median_after: float
    change: float  # after / before - 1 (Hodges-Lehmann shift of the log levels)
    ci_low: float
    ci_high: float
    coinciding: tuple[str, ...]  # subject/workload changes at the change point (+-1 session)

    @property
    def regression(self) -> bool:
        return self.change < 0 if self.series.higher_is_better else self.change > 0

    @property
    def point(self):
        return self.series.points[self.index]

    def line(self) -> str:
        s, p = self.series, self.point
        where = f"session {self.index + 1} of {len(s.points)} (#{p.session_id}, {p.started_at}, commit {p.short_commit}"
        where += f", {p.branch})" if p.branch else ")"
        kind = "REGRESSION" if self.regression else "improvement"
        named = "; ".join(self.coinciding) if self.coinciding else "no subject change recorded"
        return (
            f"{s.name} {s.metric} ({s.phase}, {s.hardware_key}): {kind} at {where}: "
            f"median {self.median_before:.4g} -> {self.median_after:.4g} {s.unit} "
            f"({self.change:+.1%}, 95% CI {self.ci_low:+.1%}..{self.ci_high:+.1%}), p = {self.p_value:.3g}; {named}"
        )


def shift_ci(before: np.ndarray, after: np.ndarray) -> tuple[float, float, float]:
    """Hodges-Lehmann shift (after - before) with Moses' distribution-free 95% CI."""
    d = np.sort((after[:, None] - before[None, :]).ravel())
    m, k = before.size, after.size
    reach = Z95 * math.sqrt(m * k * (m + k + 1) / 12.0)
    lo = max(0, math.floor(m * k / 2.0 - reach))
    return float(np.median(d)), float(d[lo]), float(d[d.size - 1 - lo])


def coinciding(series: Series, index: int) -> tuple[str, ...]:
    """Subject/workload changes at ``index``, else one session either side (the change point's
    own uncertainty)."""
    for i in (index, index + 1, index - 1):
        found = series.changes_at(i)
        if found:
            return tuple(found) if i == index else tuple(f"{c} (session {i + 1})" for c in found)
    return ()


def steps(
    series: Series,
    *,
    alpha: float = changepoints.ALPHA,
    permutations: int = changepoints.PERMUTATIONS,
    min_size: int = changepoints.MIN_SIZE,
    seed: int = changepoints.SEED,
) -> list[Step]:
    # A session whose verdict blamed the machine (MACHINE_SLOWER) measured its neighbours: a run
    # of them is no change of the subject, so the detector never sees them.
    kept = [i for i, p in enumerate(series.points) if not p.busy]
    logs = np.array([series.points[i].log_level for i in kept])
    found = changepoints.e_divisive(logs, alpha=alpha, permutations=permutations, min_size=min_size, seed=seed)
    bounds = [0] + [c.index for c in found] + [logs.size]
    out = []
    for j, c in enumerate(found):
        before, after = logs[bounds[j] : c.index], logs[c.index : bounds[j + 2]]
        shift, lo, hi = shift_ci(before, after)
        out.append(
            Step(
                series,
                kept[c.index],
                c.p_value,
                float(np.exp(np.median(before))),
                float(np.exp(np.median(after))),
                math.expm1(shift),
                math.expm1(lo),
                math.expm1(hi),
                coinciding(series, kept[c.index]),
            )
        )
    return out


def detect(
    series_list: Sequence[Series],
    *,
    alpha: float = changepoints.ALPHA,
    permutations: int = changepoints.PERMUTATIONS,
    min_size: int = changepoints.MIN_SIZE,
) -> list[Step]:
    found: list[Step] = []
    with task("change points") as progress:
        progress.step("series", 0, len(series_list))
        for i, s in enumerate(series_list):
            found += steps(s, alpha=alpha, permutations=permutations, min_size=min_size)
            progress.advance(i + 1)
    return found


def recent_regressions(found: Sequence[Step], last: int, threshold: float = 0.0) -> list[Step]:
    """Regression change points within the last ``last`` sessions of their series, at least
    ``threshold`` (a share) in size."""
    return [s for s in found if s.regression and s.index >= len(s.series.points) - last and abs(s.change) >= threshold]


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
        mark = f"<- {'REGRESSION' if step.regression else 'change'} {step.change:+.1%}" if step is not None else ""
        changes = s.changes_at(i)
        if changes:
            mark = (mark + "; " if mark else "") + ", ".join(changes)
        rows.append(
            [
                str(i + 1),
                p.started_at.replace("+00:00", "Z"),
                p.short_commit,
                p.branch or "-",
                f"{p.value:.4g}",
                f"{lo:.4g}..{hi:.4g}",
                str(p.n),
                p.baseline or "-",
                mark,
            ]
        )
    return render_table(("#", "started", "commit", "branch", "level", "95% CI", "runs", "baseline", "change"), rows)


class TrendStep(TypedDict):
    """A change point on a trend chart: the segment's first point, its label, a regression or not."""

    index: int
    text: str
    regression: bool


class Trend(TypedDict):
    """One series as plain data for the HTML report's trend chart (``trend_data``)."""

    test: str
    metric: str
    label: str
    unit: str
    points: list[tuple[float, float, float, str]]  # value, 95% CI low and high, short commit
    steps: list[TrendStep]


def trend_data(s: Series, found: Sequence[Step] = ()) -> Trend:
    """One series as plain data (crosses to the HTML report's drawing processes as JSON)."""
    return {
        "test": s.name,
        "metric": s.metric,
        "label": f"{s.phase} {label_of(s.metric)}",
        "unit": s.unit,
        "points": [(p.value, *p.ci, p.short_commit) for p in s.points],
        "steps": [{"index": st.index, "text": _step_text(st), "regression": st.regression} for st in found],
    }


def _step_text(st: Step) -> str:
    named = "; ".join(c.split(" (session")[0] for c in st.coinciding)
    return f"{st.change:+.1%}" + (f" {named}" if named else "")


def attach(results: Sequence[Outcome], loc: Location, last: int = RECENT_SESSIONS) -> dict[str, list[Trend]]:
    """Each test's recent trend, for the HTML report beside the results: ``{result.test:
    [trend_data of TTFT, of TPOT]}`` over its last ``last`` sessions on this hardware (a test
    with fewer than two sessions has none)."""

    def key_of(r: Outcome) -> tuple[str, str, str]:
        return (unique_test_id(r.nodeid or r.test, r.baseline_file), r.label, r.hardware_key)

    wanted = {key_of(r) for r in results}
    found: dict[tuple[str, str, str], list[Trend]] = {}
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
    """Prefill first, then decode: the order of ``catalog.RUN_FIELDS``."""
    return RUN_FIELDS.index(s.metric) if s.metric in RUN_FIELDS else len(RUN_FIELDS)


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
    folder.mkdir(parents=True, exist_ok=True)  # checked by the caller (``check_output_folder``)
    groups: dict[tuple[str, str], list[Series]] = {}
    for s in series:
        groups.setdefault((s.name, s.hardware_key), []).append(s)
    written, tests, pg_tests = [], [], []
    for (name, hw), members in groups.items():
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}-{hw}").strip("_")[:120] or "test"
        path = folder / f"{slug}.csv"
        _write_csv(path, members)
        written.append(path)
        # Otava's direction: 1 when higher is better, -1 when lower is.
        metric_lines = "".join(
            f"      {s.metric}:\n        direction: {1 if s.higher_is_better else -1}\n" for s in members
        )
        tests.append(
            f"  {slug}:\n    type: csv\n    file: {path.resolve()}\n    time_column: time\n"
            f"    attributes: [commit, branch, subject]\n    metrics:\n{metric_lines}"
        )
        pg_tests.append(_otava_postgres_test(slug, members, hw, metric_lines))
    _write(folder / "otava.yaml", "# written by llmperf history --csv\ntests:\n" + "".join(tests))
    if postgres:
        _write(
            folder / "otava-postgres.yaml",
            "# written by llmperf history --csv; connection: otava --postgres-hostname ... (docs/history.md)\n"
            "tests:\n" + "".join(pg_tests),
        )
    return written


def _write_csv(path: Path, members: Sequence[Series]) -> None:
    """One test's CSV: a row per session (time, commit, branch, subject), a column per metric."""
    rows: dict[int, dict[str, object]] = {}
    for s in members:
        for p in s.points:
            row = rows.setdefault(
                p.session_id,
                {
                    "time": p.started_at,
                    "commit": p.commit or "",
                    "branch": p.branch or "",
                    "subject": _subject_text(p.subject),
                },
            )
            row[s.metric] = f"{p.value:.6g}"
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, ["time", "commit", "branch", "subject", *(s.metric for s in members)])
    w.writeheader()
    for sid in sorted(rows, key=lambda k: (rows[k]["time"], k)):
        w.writerow(rows[sid])
    _write(path, text.getvalue())


def _write(path: Path, text: str) -> None:
    """One file of the export, as every output is written (``write_output``: atomically, a
    device or FIFO in place); ``OSError`` names the file."""
    try:
        write_output(path, text)
    except OSError as exc:
        raise OSError(exc.errno, f"{path.name}: {exc.strerror or exc}") from None


def _otava_postgres_test(slug: str, members: Sequence[Series], hw: str, metric_lines: str) -> str:
    """One test of ``otava-postgres.yaml``: its metrics and the query (``OTAVA_PG_QUERY``)."""
    s0 = members[0]
    columns = ",\n".join(f"MAX(CASE WHEN v.metric = '{s.metric}' THEN v.level END) AS {s.metric}" for s in members)
    query = OTAVA_PG_QUERY.format(
        columns=columns, test=_sql_text(s0.test), label=_sql_text(s0.label), hardware_key=_sql_text(hw)
    )
    return (
        f"  {slug}:\n    type: postgres\n    time_column: time\n    attributes: [commit, branch]\n"
        f"    metrics:\n{metric_lines}    query: |\n" + "".join(f"      {q}\n" for q in query.splitlines())
    )


def _subject_text(subject: Mapping[str, object]) -> str:
    keys = ("backend_version", "model", "quantization", "n_threads", "n_gpu_layers")
    return " ".join(f"{k}={subject.get(k)}" for k in keys if subject.get(k) is not None)
