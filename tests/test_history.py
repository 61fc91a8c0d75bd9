"""The session history on both backends: a SQLite file and a real PostgreSQL server (a
throw-away cluster, tests/pgserver.py). Every test taking ``location`` runs on both and
expects the same answers; the store never loses, interleaves or rewrites rows it cannot own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from pgserver import PgServer, bindir, unavailable

from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.history import append_session
from pytest_llmperf.history import database as store
from pytest_llmperf.history import series as detect
from pytest_llmperf.history.connection import parse
from pytest_llmperf.history.series import levels, read_series
from pytest_llmperf.judge.verdict import level

CHECKOUT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pg_server():
    if bindir() is None or importlib.util.find_spec("psycopg") is None:
        unavailable()
    with PgServer() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty history on each backend (a file path, or a new database's URL)."""
    if request.param == "sqlite":
        return str(tmp_path / "hist" / "history.sqlite")
    return request.getfixturevalue("pg_server").new_database()


def result(test: str, tpot_ms: float, *, threads: int = 2, label: str = "", runs: int = 8, seed: int = 0) -> dict:
    """A plugin result (the plain dict the plugin ships) with steady runs around ``tpot_ms``."""
    rng = np.random.default_rng(seed)
    noise = np.exp(rng.normal(0, 0.01, runs))
    return {
        "test": test + (f"[{label}]" if label else ""),
        "nodeid": test,
        "label": label,
        "hardware_key": "linux-x86_64-2cpu-abcd",
        "record": {
            "hardware": {"cpu": "test cpu", "logical_cpus": 2},
            "subject": {"engine": "llama.cpp", "n_threads": threads, "backend_version": "0.3.16"},
            "workload": {"prompt_tokens": 64, "max_tokens": 16, "runs": runs},
            "summary": {"tpot_ms": tpot_ms, "n_runs": runs},
            "runs": {
                "ttft_ms": list(5 * tpot_ms * noise),
                "tpot_ms": list(tpot_ms * noise),
                "decode_tps": list(1000 / (tpot_ms * noise)),
                "itl_p95_ms": list(1.2 * tpot_ms * noise),
            },
        },
        "verdict": {"status": "compared", "short": "UNCHANGED"} if seed % 2 else None,
    }


def stamp(i: int) -> str:
    return f"2026-01-{1 + i // 24:02d}T{i % 24:02d}:00:00+00:00"


def fill(loc, sessions: list[list[dict]], root: Path) -> None:
    for i, results in enumerate(sessions):
        append_session(loc, results, stamp(i), root, compared=True)


def switch_history(n_before: int = 12, n_after: int = 8) -> list[list[dict]]:
    """Threads 2 for ``n_before`` sessions (TPOT ~10 ms), then threads 1 (~19 ms)."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n_before + n_after):
        after = i >= n_before
        tpot = (19.0 if after else 10.0) * math.exp(rng.normal(0, 0.02))
        out.append([result("t.py::test_decode", tpot, threads=1 if after else 2, seed=i)])
    return out


def test_roundtrip_keeps_runs_summary_fingerprints_and_commit(location: str, tmp_path: Path) -> None:
    loc = parse(location, "test", tmp_path)
    first = [result("t.py::test_a", 10.0, seed=2), result("t.py::test_a", 20.0, label="long", seed=4)]
    append_session(loc, first, stamp(0), CHECKOUT, compared=True)
    append_session(loc, [result("t.py::test_a", 11.0, seed=3)], stamp(1), tmp_path, compared=False)
    assert store.counts(loc) == {"sessions": 2, "measurements": 3, "values": 12}
    series = {(s.label, s.metric): s for s in read_series(loc)}
    tpot = series[("", "tpot_ms")]
    assert [p.started_at for p in tpot.points] == [stamp(0), stamp(1)]
    runs = first[0]["record"]["runs"]["tpot_ms"]
    assert tpot.points[0].runs == tuple(runs) and tpot.points[0].n == 8
    assert tpot.points[0].log_level == pytest.approx(level(runs).log_level)
    assert tpot.phase == "decode" and tpot.unit == "ms" and series[("", "ttft_ms")].phase == "prefill"
    assert tpot.points[0].subject["n_threads"] == 2 and tpot.points[0].workload["prompt_tokens"] == 64
    # The checkout is a git repository: its commit (and a dirty flag and branch) are kept;
    # tmp_path is none: no commit, and the row is still there.
    git_head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert tpot.points[0].commit == git_head and tpot.points[0].dirty in (True, False)
    assert tpot.points[1].commit is None and tpot.points[1].dirty is None
    assert tpot.points[1].baseline == "UNCHANGED" and tpot.points[0].baseline is None
    assert series[("long", "tpot_ms")].name == "t.py::test_a[long]"
    # The one reader also gives the verdicts' between-session levels (levels.Level).
    assert [lv.n for lv in levels(loc, "t.py::test_a", "", "tpot_ms", tpot.hardware_key)] == [8, 8]


def test_schema_version_table_and_newer_schema_refused_untouched(location: str, tmp_path: Path) -> None:
    loc = parse(location, "test", tmp_path)
    append_session(loc, [result("t.py::test_a", 10.0)], stamp(0), tmp_path, compared=True)
    conn = store.connect(loc, create=False)
    assert conn.execute("SELECT version FROM llmperf_schema").fetchall() == [(store.SCHEMA_VERSION,)]
    conn.execute("UPDATE llmperf_schema SET version = 99")
    conn.raw.close()
    before = snapshot(loc)
    with pytest.raises(store.NewerSchemaError) as err:
        append_session(loc, [result("t.py::test_a", 10.0)], stamp(1), tmp_path, compared=True)
    assert "schema version 99, newer than this pytest-llmperf's (1); upgrade pytest-llmperf" in str(err.value)
    assert "\n" not in str(err.value)
    assert cli_main(["history", "--history", location]) == 2
    assert snapshot(loc) == before  # never altered: not a row, not a byte


def snapshot(loc) -> str:
    if loc.kind == "sqlite":
        return hashlib.sha256(Path(loc.target).read_bytes()).hexdigest()
    conn = store.connect(loc, create=False)
    try:
        rows = [
            conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
            for t in ("llmperf_schema", "llmperf_sessions", "llmperf_measurements", "llmperf_values")
        ]
    finally:
        conn.raw.close()
    return repr(rows)


def test_a_failed_write_leaves_nothing_behind(location: str, tmp_path: Path) -> None:
    loc = parse(location, "test", tmp_path)
    append_session(loc, [result("t.py::test_a", 10.0)], stamp(0), tmp_path, compared=True)
    broken = result("t.py::test_b", 10.0)
    del broken["hardware_key"]  # fails after the session row and the first measurement are written
    with pytest.raises(KeyError):
        append_session(loc, [result("t.py::test_a", 10.0), broken], stamp(1), tmp_path, compared=True)
    assert store.counts(loc) == {"sessions": 1, "measurements": 1, "values": 4}


WRITER = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}
    from test_history import result, stamp
    from pytest_llmperf.history import append_session
    from pytest_llmperf.history.connection import parse
    loc = parse(sys.argv[1], "test", sys.argv[3])
    for i in range(int(sys.argv[2])):
        append_session(loc, [result("t.py::test_a", 10.0, seed=i), result("t.py::test_b", 12.0, seed=i)],
                       stamp(i), sys.argv[3], compared=True)
""")


def test_concurrent_writers_lose_no_rows(location: str, tmp_path: Path) -> None:
    """Three processes appending at once (the schema created by whichever comes first)."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(paths=[str(Path(__file__).parent), *sys.path]))
    procs = [subprocess.Popen([sys.executable, str(script), location, "15", str(tmp_path)]) for _ in range(3)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0, 0]
    loc = parse(location, "test", tmp_path)
    assert store.counts(loc) == {"sessions": 45, "measurements": 90, "values": 360}


def test_detect_names_the_switch_and_gates_on_recent_sessions(
    location: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = parse(location, "test", tmp_path)
    fill(loc, switch_history(), tmp_path)
    assert cli_main(["detect", "--history", location, "--last", "8"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "tpot_ms" in x)
    assert "REGRESSION at session 13 of 20" in line and "threads 2 -> 1" in line, out
    assert re.search(r"median (9\.9|10\.0)\d* -> 1[89]\.\d+ ms \(\+\d\d\.\d%, 95% CI \+\d\d\.\d%\.\.", line), line
    assert "p = 0.002" in line  # (1 + 0) / (1 + 499): no permutation came close
    assert cli_main(["detect", "--history", location, "--last", "5"]) == 0  # the switch is older
    # The verdicts' reader: only the sessions since the subject last changed (threads 2 -> 1).
    after = levels(loc, "t.py::test_decode", "", "tpot_ms", "linux-x86_64-2cpu-abcd")
    assert len(after) == 8 and all(math.exp(lv.log_level) > 15 for lv in after)
    capsys.readouterr()
    assert cli_main(["history", "t.py::test_decode", "--history", location, "--metric", "tpot_ms"]) == 0
    table = capsys.readouterr().out
    assert "<- REGRESSION +8" in table and "threads 2 -> 1" in table and table.count("\n") > 20


def test_both_backends_give_the_same_answers(pg_server, tmp_path: Path) -> None:
    locs = [parse(str(tmp_path / "h.sqlite"), "t", tmp_path), parse(pg_server.new_database(), "t", tmp_path)]
    history = switch_history(10, 6)
    for loc in locs:
        fill(loc, history, tmp_path)
    sqlite, pg = (read_series(loc) for loc in locs)
    assert sqlite == pg and len(sqlite) == 4
    assert [s.line() for s in detect.detect(sqlite)] == [s.line() for s in detect.detect(pg)]


def test_bad_locations_say_what_to_do(tmp_path: Path) -> None:
    from pytest_llmperf.core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a supported history location"):
        parse("mysql://u:secret@h/db", "--llmperf-history", tmp_path)
    try:
        parse("mysql://u:secret@h/db", "x", tmp_path)
    except ConfigError as exc:
        assert "secret" not in str(exc)  # a password is never printed
    with pytest.raises(ConfigError, match="is a folder"):
        parse(str(tmp_path), "x", tmp_path)
    assert parse("off", "x", tmp_path) is None
    assert cli_main(["history", "--history", str(tmp_path / "none.sqlite")]) == 2


def test_otava_export_reads_the_same_levels_from_csv_and_sql(location: str, tmp_path: Path) -> None:
    """``llmperf history --csv``: Otava's CSV files and config, and (PostgreSQL) the query of its
    PostgreSQL source, give the stored levels session by session."""
    import csv

    import yaml

    loc = parse(location, "test", tmp_path)
    fill(loc, switch_history(4, 3), tmp_path)
    out = tmp_path / "otava"
    assert (
        cli_main(["history", "--history", location, "--metric", "tpot_ms", "--metric", "decode_tps", "--csv", str(out)])
        == 0
    )
    ((name, test),) = yaml.safe_load((out / "otava.yaml").read_text())["tests"].items()
    assert test["type"] == "csv" and test["time_column"] == "time"
    assert test["metrics"] == {"tpot_ms": {"direction": -1}, "decode_tps": {"direction": 1}}
    with open(test["file"], encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    levels_stored = [p.value for p in read_series(loc, metrics=["tpot_ms"])[0].points]
    assert [float(r["tpot_ms"]) for r in rows] == pytest.approx(levels_stored, rel=1e-5)
    assert rows[-1]["subject"].endswith("n_threads=1") and rows[0]["time"] == stamp(0)
    if loc.kind != "postgresql":
        assert not (out / "otava-postgres.yaml").exists()
        return
    pg_test = yaml.safe_load((out / "otava-postgres.yaml").read_text())["tests"][name]
    assert pg_test["type"] == "postgres" and pg_test["metrics"] == test["metrics"]
    conn = store.connect(loc, create=False)
    try:
        # As Otava runs it: the %{BRANCH} placeholder becomes a parameter (sessions here have none).
        got = conn.raw.execute(
            pg_test["query"].replace("s.branch = %{BRANCH}", "s.branch IS NOT DISTINCT FROM %s"), (None,)
        ).fetchall()
    finally:
        conn.raw.close()
    assert [r[3] for r in got] == pytest.approx(levels_stored, rel=1e-9)
