"""The history database: the store (SQLite / PostgreSQL), the rows a session is collected into, and
the version-control facts recorded with it.

Tables (the same names, columns and meaning on both; only the column types are spelled per
backend): ``llmperf_schema`` (one row: the schema version), ``llmperf_sessions`` (one row per
pytest session), ``llmperf_measurements`` (per test and label: fingerprints, workload,
summary, the baseline verdict when a comparison ran) and ``llmperf_values`` (per metric: the
per-run values, their median, and the session's level: ``level`` in the metric's unit, for
plain SQL and Otava's PostgreSQL source, ``log_level`` with its standard error ``se``).

Every write is one transaction, taken under a lock that serialises writers (SQLite ``BEGIN
IMMEDIATE``; PostgreSQL an advisory transaction lock; every wait ends: ``connection``), so concurrent pytest
processes and the schema's creation never interleave: a session's rows land whole or not at
all. A history written by a newer pytest-llmperf (a higher schema version) is refused with one
line and never altered.

The rows one session appends are built from its ``Outcome.to_json()`` entries (the JSON
report's), so the history holds exactly what the session measured and judged.

The version-control facts (``revision``) come from CI variables first (a CI checkout is often
a detached HEAD), then ``git`` with a deadline; unknown: None (the row is still a row)."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shlex
import socket
import statistics
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from .. import __version__
from ..baselines.store import unique_test_id
from ..baselines.tracked import git_output
from ..core.catalog import METRICS, RUN_FIELDS
from ..core.measurement import Measurement, PerRun
from ..judge.verdict import level, stored_verdict
from .connection import Conn, HistoryError, LastingHistoryError, Location, connect, elsewhere, errors_of, transaction

if TYPE_CHECKING:
    from psycopg.rows import TupleRow

SCHEMA_VERSION = 1
#: Upgrades from an older schema version: version -> statements that bring it to version + 1.
MIGRATIONS: dict[int, tuple[str, ...]] = {}

TYPES = {
    "sqlite": {"pk": "INTEGER PRIMARY KEY AUTOINCREMENT", "float": "REAL", "time": "TEXT"},
    "postgresql": {"pk": "BIGSERIAL PRIMARY KEY", "float": "DOUBLE PRECISION", "time": "TIMESTAMPTZ"},
}

DDL = (
    "CREATE TABLE llmperf_schema (version INTEGER NOT NULL)",
    """CREATE TABLE llmperf_sessions (
        id {pk},
        uid TEXT NOT NULL UNIQUE,
        started_at {time} NOT NULL,
        finished_at {time} NOT NULL,
        commit_sha TEXT,
        dirty INTEGER,
        branch TEXT,
        host TEXT,
        compared INTEGER NOT NULL,
        llmperf_version TEXT
    )""",
    """CREATE TABLE llmperf_measurements (
        id {pk},
        session_id INTEGER NOT NULL REFERENCES llmperf_sessions(id),
        test TEXT NOT NULL,
        label TEXT NOT NULL,
        hardware_key TEXT NOT NULL,
        hardware TEXT NOT NULL,
        subject TEXT NOT NULL,
        workload TEXT NOT NULL,
        summary TEXT NOT NULL,
        baseline TEXT
    )""",
    """CREATE TABLE llmperf_values (
        measurement_id INTEGER NOT NULL REFERENCES llmperf_measurements(id),
        metric TEXT NOT NULL,
        phase TEXT NOT NULL,
        unit TEXT NOT NULL,
        n INTEGER NOT NULL,
        median {float} NOT NULL,
        level {float} NOT NULL,
        log_level {float} NOT NULL,
        se {float} NOT NULL,
        spread {float} NOT NULL,
        upper {float},
        runs TEXT NOT NULL,
        PRIMARY KEY (measurement_id, metric)
    )""",
    "CREATE INDEX llmperf_measurements_series ON llmperf_measurements (test, hardware_key)",
    "CREATE INDEX llmperf_measurements_session ON llmperf_measurements (session_id)",
)


class NewerSchemaError(HistoryError):
    pass


def _table_exists(conn: Conn, name: str) -> bool:
    if conn.kind == "sqlite":
        row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    else:
        row = conn.execute("SELECT to_regclass(?::text)", (name,)).fetchone()
        row = row if row and row[0] is not None else None
    return row is not None


def declared_columns() -> dict[str, frozenset[str]]:
    """Each table's columns, as ``DDL`` creates them."""
    out = {}
    for statement in DDL:
        found = re.match(r"CREATE TABLE (\w+) \((.*)\)$", statement, re.DOTALL)
        if found:
            parts = re.split(r",(?![^(]*\))", found.group(2))  # not the commas of PRIMARY KEY (a, b)
            names = (part.split()[0] for part in parts if part.strip())
            out[found.group(1)] = frozenset(n for n in names if n != "PRIMARY")
    return out


def _columns(conn: Conn, table: str) -> set[str]:
    if conn.kind == "sqlite":
        return {str(r[0]) for r in conn.execute("SELECT name FROM pragma_table_info(?)", (table,)).fetchall()}
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_name = ? AND table_schema = ANY(current_schemas(false))",
        (table,),
    ).fetchall()
    return {str(r[0]) for r in rows}


def _refuse_foreign(conn: Conn, loc: Location) -> None:
    """Another application's database at the history's place, never altered: a SQLite file
    whose tables are all someone else's, or a table of ours without the columns we made it
    with. ``LastingHistoryError``: one line, the session goes on without history."""
    ours = [t for t in declared_columns() if _table_exists(conn, t)]
    if not ours and conn.kind == "sqlite":
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' ORDER BY name LIMIT 4"
        ).fetchall()
        if rows:
            names = ", ".join(str(r[0]) for r in rows[:3]) + (", ..." if len(rows) > 3 else "")
            raise LastingHistoryError(
                f"{loc.display} is another application's SQLite database (tables {names}), not a pytest-llmperf "
                f"history; it was left as it is: move it away {elsewhere(loc)}"
            )
    for table, wanted in declared_columns().items():
        lacks = sorted(wanted - _columns(conn, table)) if table in ours else []
        if lacks:
            raise LastingHistoryError(
                f"the history {loc.display} has a table {table} without column(s) {', '.join(lacks)}: another "
                f"application's (or one edited by hand), not pytest-llmperf's; it was left as it is: {elsewhere(loc).removeprefix('or ')}"
            )


def _version(conn: Conn, loc: Location) -> int | None:
    _refuse_foreign(conn, loc)
    if not _table_exists(conn, "llmperf_schema"):
        return None
    row = conn.execute("SELECT MAX(version) FROM llmperf_schema").fetchone()
    if not row or row[0] is None:
        raise HistoryError(f"{loc.display}: llmperf_schema holds no version; not a usable pytest-llmperf history")
    return int(row[0])


def _check_newer(version: int, loc: Location) -> None:
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"the history {loc.display} has schema version {version}, newer than this pytest-llmperf's "
            f"({SCHEMA_VERSION}); upgrade pytest-llmperf to use it (it was left as it is)"
        )


#: The tables of rows, each referring to the one before it.
DATA_TABLES = ("llmperf_sessions", "llmperf_measurements", "llmperf_values")


def _tables(conn: Conn, loc: Location, *, reading: bool) -> bool:
    """Whether there are data tables (False: a new history). A table dropped by hand while
    others are left: a writer recreates it unless rows left refer to it (they would mismatch),
    a reader says so; either way one HistoryError line, never "no sessions"."""
    version = _version(conn, loc)
    if version is not None:
        _check_newer(version, loc)
    missing = [t for t in DATA_TABLES if not _table_exists(conn, t)]
    present = [t for t in DATA_TABLES if t not in missing]
    if missing and present:
        _some_tables_missing(conn, loc, missing, present, reading=reading)
    return bool(present)


def _some_tables_missing(
    conn: Conn, loc: Location, missing: Sequence[str], present: Sequence[str], *, reading: bool
) -> None:
    """Some data tables are gone, some are left: a HistoryError when rows left refer to a
    missing table, or when ``reading``; else (a writer) the missing ones are recreated."""
    later = DATA_TABLES[DATA_TABLES.index(missing[0]) + 1 :]
    if any(conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() for t in present if t in later):
        raise HistoryError(
            f"the history {loc.display} lacks table(s) {', '.join(missing)} that its other rows refer to (dropped?); "
            f"restore them from a backup, or DROP TABLE {', '.join(reversed(present))}, llmperf_schema to start anew"
        )
    if reading:
        raise HistoryError(
            f"the history {loc.display} lacks table(s) {', '.join(missing)} (dropped?); the next "
            "pytest session that writes to it recreates them"
        )


def ensure_schema(conn: Conn, loc: Location) -> None:
    """Create or migrate the schema, and recreate a table or index dropped by hand (``_tables``);
    inside a writer's transaction."""
    version = _version(conn, loc)
    _tables(conn, loc, reading=False)  # a newer schema, or a table that cannot be recreated: refused
    while version is not None and version < SCHEMA_VERSION:
        for statement in MIGRATIONS[version]:
            conn.execute(statement.format(**TYPES[conn.kind]))
        version += 1
        conn.execute("UPDATE llmperf_schema SET version = ?", (version,))
    for statement in DDL:
        statement = statement.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1)
        conn.execute(statement.replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ", 1).format(**TYPES[conn.kind]))
    if version is None:  # new, or its version table dropped: the tables are this version's
        conn.execute("INSERT INTO llmperf_schema (version) VALUES (?)", (SCHEMA_VERSION,))


# ---------------------------------------------------------------------------------------------
# Writing


class SessionRow(TypedDict):
    """One session as ``append`` writes it (``session_row``)."""

    uid: str
    started_at: str
    finished_at: str
    commit: str | None
    dirty: bool | None
    branch: str | None
    host: str
    compared: bool
    llmperf_version: str


class ValueRow(TypedDict):
    """One metric of a measurement as ``append`` writes it (``value_rows``)."""

    metric: str
    phase: str
    unit: str
    n: int
    median: float
    log_level: float
    se: float
    spread: float
    upper: float | None
    runs: list[float]


class MeasurementRow(TypedDict):
    """One measurement as ``append`` writes it (``measurement_rows``): its JSON columns as read
    from the result's record."""

    test: str
    label: str
    hardware_key: str
    hardware: object
    subject: object
    workload: object
    summary: object
    baseline: str | None
    values: list[ValueRow]


def _time(conn: Conn, iso: str) -> str | datetime.datetime:
    if conn.kind == "sqlite":
        return iso
    return datetime.datetime.fromisoformat(iso)


def append(loc: Location, session: SessionRow, measurements: Sequence[MeasurementRow]) -> int:
    """Append one session and its measurements (see ``database.session_rows``) in one
    transaction; returns the session's id. A session whose ``uid`` is stored already is not
    written twice."""
    conn = connect(loc, create=True)
    try:
        with transaction(conn):
            ensure_schema(conn, loc)
            found = conn.execute("SELECT id FROM llmperf_sessions WHERE uid = ?", (session["uid"],)).fetchone()
            if found:
                return int(found[0])
            session_id = conn.one(
                "INSERT INTO llmperf_sessions (uid, started_at, finished_at, commit_sha, dirty, branch, host, "
                "compared, llmperf_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (
                    session["uid"],
                    _time(conn, session["started_at"]),
                    _time(conn, session["finished_at"]),
                    session.get("commit"),
                    None if session["dirty"] is None else int(session["dirty"]),
                    session.get("branch"),
                    session.get("host"),
                    int(bool(session.get("compared"))),
                    session.get("llmperf_version"),
                ),
            )[0]
            for m in measurements:
                mid = conn.one(
                    "INSERT INTO llmperf_measurements (session_id, test, label, hardware_key, hardware, subject, "
                    "workload, summary, baseline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (
                        session_id,
                        m["test"],
                        m.get("label") or "",
                        m["hardware_key"],
                        _json(m["hardware"]),
                        _json(m["subject"]),
                        _json(m["workload"]),
                        _json(m["summary"]),
                        m.get("baseline"),
                    ),
                )[0]
                for v in m["values"]:
                    conn.execute(
                        "INSERT INTO llmperf_values (measurement_id, metric, phase, unit, n, median, level, log_level, "
                        "se, spread, upper, runs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            mid,
                            v["metric"],
                            v["phase"],
                            v["unit"],
                            v["n"],
                            v["median"],
                            math.exp(v["log_level"]),
                            v["log_level"],
                            v["se"],
                            v["spread"],
                            v.get("upper"),
                            _json(v["runs"]),
                        ),
                    )
            return int(session_id)
    except errors_of(conn.kind) as exc:
        raise conn.failure("write", exc) from None
    finally:
        conn.close()


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Reading


#: What ``read`` selects after the measurement's and the session's ids: each table's columns, by
#: its alias in the query (s: sessions, m: measurements, v: values), then the runs.
SELECTED = {
    "s": ("uid", "started_at", "commit_sha", "dirty", "branch", "host", "compared"),
    "m": ("test", "label", "hardware_key", "subject", "workload", "baseline"),
    "v": ("metric", "phase", "unit", "n", "median", "log_level", "se", "spread", "upper"),
}
#: The names of a row ``read`` returns, in the query's order.
COLUMNS = ("measurement_id", "session_id", *(c for columns in SELECTED.values() for c in columns), "runs")


def read(
    loc: Location,
    *,
    test: str | None = None,
    metrics: Sequence[str] | None = None,
    hardware_key: str | None = None,
    last_sessions: int | None = None,
    runs: bool = True,
    skipped: list[str] | None = None,
    uses: str = "",
) -> list[dict[str, Any]]:
    """Every stored value (one dict per session, measurement and metric), oldest session first.

    ``test``: a substring of the test id; ``metrics``: metric names; ``last_sessions``: only
    the last N sessions stored (with a measurement on ``hardware_key`` when given);
    ``runs=False``: without the per-run values (``runs`` reads as []). Never creates anything:
    a missing schema reads as an empty history, a newer one is refused. A measurement with a
    row that cannot be used (a figure not a finite number in its range, a subject that is not
    a JSON object...: edited by hand, a disk's fault) is left out whole; ``skipped`` gets the
    one line that names them, says what was done instead (``uses``) and how to delete them."""
    conn = connect(loc, create=False)
    try:
        if not _tables(conn, loc, reading=True):
            return []
        where, params = _filters(test, metrics, hardware_key, last_sessions)
        sql = (
            "SELECT m.id, s.id, "
            + "".join(f"{table}.{c}, " for table, columns in SELECTED.items() for c in columns)
            + ("v.runs " if runs else "'[]' ")
            + "FROM llmperf_values v JOIN llmperf_measurements m ON v.measurement_id = m.id "
            "JOIN llmperf_sessions s ON m.session_id = s.id"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY s.started_at, s.id, m.id, v.metric"
        )
        rows = conn.execute(sql, params).fetchall()
    except errors_of(conn.kind) as exc:
        raise conn.failure("read", exc) from None
    finally:
        conn.close()
    return _sound_rows(loc, rows, runs, skipped, uses)


def _filters(
    test: str | None, metrics: Sequence[str] | None, hardware_key: str | None, last_sessions: int | None
) -> tuple[list[str], list[object]]:
    """``read``'s WHERE conditions and their parameters, one per filter given."""
    where: list[str] = []
    params: list[object] = []
    if test:
        where.append("m.test LIKE ?")
        params.append(f"%{test}%")
    if metrics:
        where.append("v.metric IN (" + ", ".join("?" for _ in metrics) + ")")
        params += list(metrics)
    if hardware_key:
        where.append("m.hardware_key = ?")
        params.append(hardware_key)
    if last_sessions:
        where.append(
            "s.id IN (SELECT id FROM (SELECT DISTINCT m2.session_id AS id FROM llmperf_measurements m2"
            + (" WHERE m2.hardware_key = ?" if hardware_key else "")
            + " ORDER BY m2.session_id DESC LIMIT ?) AS recent)"
        )
        params += ([hardware_key] if hardware_key else []) + [int(last_sessions)]
    return where, params


def _sound_rows(
    loc: Location, rows: Sequence[TupleRow], runs: bool, skipped: list[str] | None, uses: str
) -> list[dict[str, Any]]:
    """The rows read, each checked (``_sound``); a measurement with a bad row is left out whole,
    and ``skipped`` gets the line that names them (``bad_rows_line``)."""
    out = []
    parsed: dict[object, object] = {}  # most rows share their subject and workload: parse each text once
    bad: dict[int, tuple[object, object, str]] = {}  # measurement id -> (session id, test, what is wrong)
    for row in rows:
        d = dict(zip(COLUMNS, row))
        try:
            out.append(_sound(d, parsed, runs))
        except BadRow as exc:
            bad.setdefault(d["measurement_id"], (d["session_id"], d["test"], f"{d['metric']}: {exc}"))
    if bad:
        out = [d for d in out if d["measurement_id"] not in bad]  # a measurement is whole or left out
        if skipped is not None:
            skipped.append(bad_rows_line(loc, bad, uses))
    return out


class BadRow(ValueError):
    """A stored row that cannot be used as it is (what is wrong with it, in a few words)."""


def _number(d: Mapping[str, object], key: str, *, low: float | None = None, whole: bool = False) -> float:
    value = d[key]
    number = _as_float(key, value)
    if not math.isfinite(number) or (low is not None and number < low) or (whole and number != int(number)):
        want = "a whole number" if whole else "a finite number"
        raise BadRow(f"{key} {value!r} is not {want}" + (f" >= {low:g}" if low is not None else ""))
    return number


def _as_float(key: str, value: object) -> float:
    """A stored number (or its text) as a float; ``BadRow`` when it is none."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadRow(f"{key} {value!r} is not a number")
    try:
        return float(value)
    except ValueError:
        raise BadRow(f"{key} {str(value)[:40]!r} is not a number") from None


def _object(d: Mapping[str, object], key: str, parsed: dict[object, object], kind: type) -> Any:
    text = d[key]
    if text not in parsed:
        try:
            parsed[text] = json.loads(text) if isinstance(text, (str, bytes)) else None
        except ValueError:
            parsed[text] = None
    value = parsed[text]
    if not isinstance(value, kind):
        raise BadRow(f"{key} {str(text)[:40]!r} is not a JSON {'object' if kind is dict else 'list'}")
    return value


def _sound(d: dict[str, Any], parsed: dict[object, object], runs: bool) -> dict[str, Any]:
    """One stored row as the readers use it, or ``BadRow``: every figure a finite number in
    its range, the subject and workload JSON objects, the runs a JSON list of numbers."""
    _sound_texts(d)
    d["n"] = int(_number(d, "n", low=1, whole=True))
    d["median"] = _number(d, "median", low=0)
    d["log_level"] = _number(d, "log_level")
    d["se"] = _number(d, "se", low=0)
    d["spread"] = _number(d, "spread", low=0)
    d["upper"] = None if d["upper"] is None else _number(d, "upper")
    d["subject"] = _object(d, "subject", parsed, dict)
    d["workload"] = _object(d, "workload", parsed, dict)
    d["runs"] = _runs(d) if runs else []
    return d


def _runs(d: Mapping[str, object]) -> list[float]:
    """The row's per-run values: a JSON list of finite numbers, else ``BadRow``."""
    values: list[float] = _object(d, "runs", {}, list)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise BadRow("runs holds a value that is not a finite number")
    return values


def _sound_texts(d: dict[str, object]) -> None:
    """The row's start time as ISO text (UTC), its names text (else ``BadRow``), its optional
    texts and flags normalised."""
    if isinstance(d["started_at"], datetime.datetime):
        d["started_at"] = d["started_at"].astimezone(datetime.timezone.utc).isoformat(timespec="seconds")
    d["started_at"] = str(d["started_at"])
    for key in ("test", "label", "hardware_key", "metric", "phase", "unit"):
        if not isinstance(d[key], str):
            raise BadRow(f"{key} {d[key]!r} is not text")
    for key in ("commit_sha", "branch", "baseline"):
        d[key] = None if d[key] is None else str(d[key])
    baseline = d["baseline"]
    d["verdict"] = stored_verdict(baseline if isinstance(baseline, str) else None)  # its word's verdict, read once
    d["dirty"] = None if d["dirty"] is None else bool(d["dirty"])
    d["compared"] = bool(d["compared"])


#: How many bad measurements the skipped-rows line names (the DELETE statement holds them all).
SHOWN_BAD = 3


def bad_rows_line(loc: Location, bad: Mapping[int, tuple[object, object, str]], uses: str = "") -> str:
    """The one line for stored measurements left out: which (id, session, test), what is wrong,
    and the statement that deletes them."""
    ids = sorted(bad)
    named = "; ".join(f"measurement #{i} (session #{bad[i][0]}, {bad[i][1]}, {bad[i][2]})" for i in ids[:SHOWN_BAD])
    more = f"; and {len(ids) - SHOWN_BAD} more" if len(ids) > SHOWN_BAD else ""
    where = ", ".join(str(i) for i in ids)
    sql = (
        f"DELETE FROM llmperf_values WHERE measurement_id IN ({where}); "
        f"DELETE FROM llmperf_measurements WHERE id IN ({where})"
    )
    fix = f'sqlite3 {shlex.quote(loc.target)} "{sql}"' if loc.kind == "sqlite" else f'run "{sql}" on it'
    return (
        f"llmperf: the history {loc.display} holds {len(ids)} unreadable measurement(s), left out: {named}{more}; "
        f"{uses + '; ' if uses else ''}to delete them: {fix}"
    )


def counts(loc: Location) -> dict[str, int]:
    """Rows per table (tests and the CLI's summary line)."""
    conn = connect(loc, create=False)
    try:
        if not _tables(conn, loc, reading=True):
            return {"sessions": 0, "measurements": 0, "values": 0}
        return {
            name: int(conn.one(f"SELECT COUNT(*) FROM llmperf_{name}")[0])
            for name in ("sessions", "measurements", "values")
        }
    except errors_of(conn.kind) as exc:
        raise conn.failure("read", exc) from None
    finally:
        conn.close()


def phase_of(metric: str) -> str:
    spec = METRICS.get(metric)
    return spec.phase if spec else ("prefill" if metric.startswith(("ttft", "prefill")) else "decode")


def unit_of(metric: str) -> str:
    spec = METRICS.get(metric)
    return spec.unit if spec else ("t/s" if metric.endswith("_tps") else "ms")


def value_rows(runs: PerRun) -> list[ValueRow]:
    """Per metric: the per-run values, their median and the session's level (``verdict.level``:
    the robust location on the log scale and its standard error)."""
    out: list[ValueRow] = []
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
                "metric": metric,
                "phase": phase_of(metric),
                "unit": unit_of(metric),
                "n": lv.n,
                "median": float(statistics.median(values)),
                "log_level": lv.log_level,
                "se": lv.se,
                "spread": lv.spread,
                "upper": lv.upper,
                "runs": [float(v) for v in values],
            }
        )
    return out


def measurement_rows(results: Iterable[Mapping[str, Any]]) -> list[MeasurementRow]:
    rows: list[MeasurementRow] = []
    for r in results:
        rec = Measurement.from_json(r["record"])
        verdict = r.get("verdict")
        rows.append(
            {
                "test": unique_test_id(r.get("nodeid") or r["test"], r.get("baseline_file") or ""),
                "label": r.get("label") or "",
                "hardware_key": r["hardware_key"],
                "hardware": dict(rec.hardware),
                "subject": dict(rec.subject),
                "workload": dict(rec.identity or {}),
                "summary": dict(rec.summary or {}),
                "baseline": None if not verdict else verdict.get("short") or verdict.get("status"),
                "values": value_rows(rec.run_columns),
            }
        )
    return rows


def session_row(started_at: str, rootdir: Path | str, compared: bool) -> SessionRow:
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


GIT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Revision:
    commit: str | None
    dirty: bool | None
    branch: str | None


def _git(root: Path, *args: str) -> str | None:
    out = git_output(root, *args, timeout_s=GIT_TIMEOUT_S)
    return None if out is None else out.decode().strip()


def commit_sha(root: Path | str) -> str | None:
    """The commit under test: ``$GITHUB_SHA`` / ``$CI_COMMIT_SHA``, else git's HEAD, else None."""
    commit = next((os.environ[v] for v in ("GITHUB_SHA", "CI_COMMIT_SHA") if os.environ.get(v)), None)
    return commit or _git(Path(root), "rev-parse", "HEAD")


def revision(root: Path | str) -> Revision:
    root = Path(root)
    commit = commit_sha(root)
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    branch = next(
        (os.environ[v] for v in ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME") if os.environ.get(v)), None
    )
    if branch is None and commit:
        branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
        branch = None if branch == "HEAD" else branch  # detached
    return Revision(commit[:40] if commit else None, None if status is None else bool(status), branch)
