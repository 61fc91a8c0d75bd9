"""The one reader of the history: stored rows -> one series per test, label, metric and
hardware, oldest session first. ``llmperf history``, ``llmperf detect``, the HTML report's
trends and the verdicts' between-session spread (``levels``) all read through here."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.catalog import METRICS
from ..judge.verdict import Level
from ..core.fingerprint import subject_changes
from ..baselines.records import RUN_FIELDS, same_workload
from . import store
from .location import Location

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
    subject: Mapping[str, Any] = field(default_factory=dict, compare=False)
    workload: Mapping[str, Any] = field(default_factory=dict, compare=False)
    runs: tuple[float, ...] = field(default=(), compare=False)

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
        return subject_changes(a.subject, b.subject) + same_workload({"workload": a.workload}, {"workload": b.workload})


def group(rows: Sequence[Mapping[str, Any]]) -> list[Series]:
    """Rows (``store.read``) -> series, in the order their first session appears."""
    by_key: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((r["test"], r["label"], r["metric"], r["hardware_key"]), []).append(r)
    out = []
    for (test, label, metric, hw), rs in by_key.items():
        points = tuple(
            Point(
                r["session_id"], r["started_at"], r["commit_sha"], r["dirty"], r["branch"], int(r["n"]),
                float(r["median"]), float(r["log_level"]), float(r["se"]), float(r["spread"]),
                None if r["upper"] is None else float(r["upper"]), r["baseline"], r["subject"], r["workload"],
                tuple(r["runs"]),
            )
            for r in rs
        )
        out.append(Series(test, label, metric, rs[0]["phase"], rs[0]["unit"], hw, points))
    first = {}
    for s in out:
        first.setdefault((s.test, s.label, s.hardware_key), len(first))
    order = {m: i for i, m in enumerate(RUN_FIELDS)}  # prefill first, then decode
    return sorted(out, key=lambda s: (first[(s.test, s.label, s.hardware_key)], order.get(s.metric, len(order))))


def read_series(
    loc: Location,
    *,
    test: str | None = None,
    metrics: Sequence[str] | None = None,
    hardware_key: str | None = None,
    last: int | None = None,
) -> list[Series]:
    """The stored series (``test``: a substring of the test id), each cut to its ``last``
    sessions."""
    series = group(store.read(loc, test=test, metrics=metrics, hardware_key=hardware_key))
    if last:
        series = [Series(s.test, s.label, s.metric, s.phase, s.unit, s.hardware_key, s.points[-last:]) for s in series]
    return series


def levels(
    loc: Location, test: str, label: str, metric: str, hardware_key: str, *, last: int = 10
) -> list[Level]:
    """The last ``last`` sessions' levels of one series since its subject or workload last
    changed (oldest first): the between-session spread that a stored baseline's own recorded
    sessions give ``noise.NoiseModel.between`` today, from every session of the history."""
    found = [
        s for s in read_series(loc, test=test, metrics=[metric], hardware_key=hardware_key)
        if s.test == test and s.label == label
    ]
    if not found:
        return []
    s = found[0]
    start = max((i for i in range(1, len(s.points)) if s.changes_at(i)), default=0)
    return [p.level() for p in s.points[start:]][-last:]


#: Sessions read for the verdicts' windows: the last ones stored with a measurement on this
#: hardware (a window holds a test's last ``noise.WINDOW_SESSIONS``; tests that run in
#: subsets of the sessions reach further back).
WINDOW_READ_SESSIONS = 50
#: A measurement whose stored verdict starts with one of these is not noise: it stays out of
#: the window (a regression the gate caught must not widen the next sessions' noise estimate).
NOT_NOISE = ("REGRESSION", "MACHINE_SLOWER")


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

    def levels(self, test: str, label: str, entry: Mapping[str, Any]) -> dict[str, list[Level]]:
        """Per metric, the last ``noise.WINDOW_SESSIONS`` sessions of this test since the
        baseline ``entry`` was recorded (its ``recorded_at``), with its subject and workload,
        leaving out measurements judged REGRESSION or MACHINE_SLOWER: the window the verdict
        judges against (docs/verdicts.md)."""
        from ..judge.verdict import WINDOW_SESSIONS

        since = _instant(entry.get("recorded_at") or "")
        subject, workload = entry.get("subject") or {}, {"workload": entry.get("workload") or {}}
        out: dict[str, list[Level]] = {}
        same: dict[tuple[int, int], bool] = {}  # rows share their parsed subject and workload
        for r in self.rows.get((test, label), ()):
            key = id(r["subject"]), id(r["workload"])
            ok = same.get(key)
            if ok is None:
                ok = same[key] = not subject_changes(subject, r["subject"]) and not same_workload(
                    workload, {"workload": r["workload"]})
            if not ok or str(r.get("baseline") or "").startswith(NOT_NOISE):
                continue
            started = _instant(r["started_at"])
            if since is not None and (started is None or started < since):
                continue
            out.setdefault(r["metric"], []).append(
                Level(float(r["log_level"]), float(r["se"]), int(r["n"]), float(r["spread"]),
                      None if r["upper"] is None else float(r["upper"]))
            )
        return {metric: lv[-WINDOW_SESSIONS:] for metric, lv in out.items()}


def read_windows(loc: Location, hardware_key: str, metrics: Sequence[str]) -> Windows:
    """One read of the history for a whole session: the last ``WINDOW_READ_SESSIONS``
    sessions' levels of ``metrics`` on ``hardware_key`` (no per-run values). Raises
    ``store.HistoryError`` (one line) when the history cannot be read."""
    rows: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    if loc.kind == "sqlite" and not Path(loc.target).is_file():
        return Windows(rows)
    for r in store.read(loc, metrics=metrics, hardware_key=hardware_key, last_sessions=WINDOW_READ_SESSIONS, runs=False):
        rows.setdefault((r["test"], r["label"]), []).append(r)
    return Windows(rows)
