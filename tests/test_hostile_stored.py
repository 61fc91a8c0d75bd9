"""Corrupt stored data and replies (issue 34, class 3): a history row, a history file, a
baseline file or an engine worker's reply that cannot be used is one line that names it and
says what to do, never a traceback; the verdict uses what is sound and says so.

A real 8-session SQLite history: one inner pytest session records it (a baseline and
session #1 on the tiny model), SQL copies its rows into sessions #2..#8, and each case spoils
one row the way a hand edit or a disk would. Then a compare session (in process), and
``llmperf history`` / ``llmperf detect`` (subprocesses) on the spoiled file must each say one
line, exit as usual, and leave the file as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from inner import run

from pytest_llmperf import Workload
from pytest_llmperf.engines.llama_cpp_native import EngineConfig
from pytest_llmperf.measuring.worker import FAULT_ENV, EngineCrash, WorkerEngine

MODULE = "test_inner.py"
SOURCE = """
import pytest

# A shared machine's noise must not fail it: no change below 900% counts, no extra runs.
@pytest.mark.llmperf(prompt_tokens=4, max_tokens=8, runs=3, warmup=0, max_runs=3, threshold=9, tail_threshold=9)
def test_a(llmperf):
    pass
"""
HISTORY = "hist.sqlite"
ARGS = ("-rN", "--llmperf-baseline-dir=baselines", f"--llmperf-history={HISTORY}")
SESSIONS = 8
SPOILED = 3  # the measurement (and session) id the cases spoil
TEST_ID = f"{MODULE}::test_a"


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_llmperf.cli", *args],
        check=False,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))},
    )


CHECKOUT = Path(__file__).resolve().parent.parent


def grow(path: Path, sessions: int) -> None:
    """Copy session #1's rows into sessions #2..#``sessions`` (one measurement each)."""
    with sqlite3.connect(path) as db:
        (mcols,) = [[r[1] for r in db.execute("PRAGMA table_info(llmperf_measurements)") if r[1] != "id"]]
        scols = [r[1] for r in db.execute("PRAGMA table_info(llmperf_sessions)") if r[1] not in ("id", "uid")]
        vcols = [r[1] for r in db.execute("PRAGMA table_info(llmperf_values)") if r[1] != "measurement_id"]
        for i in range(2, sessions + 1):
            sid = db.execute(
                f"INSERT INTO llmperf_sessions (uid, {', '.join(scols)}) "
                f"SELECT uid || '-{i}', {', '.join(scols)} FROM llmperf_sessions WHERE id = 1"
            ).lastrowid
            rest = [c for c in mcols if c != "session_id"]
            mid = db.execute(
                f"INSERT INTO llmperf_measurements (session_id, {', '.join(rest)}) "
                f"SELECT ?, {', '.join(rest)} FROM llmperf_measurements WHERE id = 1",
                (sid,),
            ).lastrowid
            db.execute(
                f"INSERT INTO llmperf_values (measurement_id, {', '.join(vcols)}) "
                f"SELECT ?, {', '.join(vcols)} FROM llmperf_values WHERE measurement_id = 1",
                (mid,),
            )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the test module, its baseline and an 8-session history of it."""
    root = tmp_path_factory.mktemp("recorded")
    (root / MODULE).write_text(SOURCE)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--rootdir={root}",
            *ARGS,
            "--llmperf-update-baselines",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    grow(root / HISTORY, SESSIONS)
    return root


def copy_of(recorded: Path, root: Path) -> None:
    for p in recorded.iterdir():
        if p.is_dir():
            shutil.copytree(p, root / p.name, dirs_exist_ok=True)
        else:
            shutil.copy2(p, root / p.name)


@dataclass(frozen=True)
class Row:
    id: str
    sql: str  # one UPDATE on the recorded history
    says: str  # what is wrong, as the line says it


VALUES = f"UPDATE llmperf_values SET {{}} WHERE measurement_id = {SPOILED} AND metric = 'tpot_ms'"
MEASUREMENT = f"UPDATE llmperf_measurements SET {{}} WHERE id = {SPOILED}"
ROWS = [
    Row("level-not-a-number", VALUES.format("log_level = 'fast'"), "tpot_ms: log_level 'fast' is not a number"),
    Row("level-inf", VALUES.format("log_level = 9e999"), "tpot_ms: log_level inf is not a finite number"),
    Row("level-nan-text", VALUES.format("log_level = 'NaN'"), "tpot_ms: log_level 'NaN' is not a finite number"),
    Row("se-negative", VALUES.format("se = -1"), "tpot_ms: se -1.0 is not a finite number >= 0"),
    Row("n-zero", VALUES.format("n = 0"), "tpot_ms: n 0 is not a whole number >= 1"),
    Row("median-a-blob", VALUES.format("median = x'00ff'"), "tpot_ms: median b'\\x00\\xff' is not a number"),
    Row("upper-text", VALUES.format("upper = 'high'"), "tpot_ms: upper 'high' is not a number"),
    Row("subject-not-json", MEASUREMENT.format("subject = '{not json'"), "subject '{not json' is not a JSON object"),
    Row("subject-a-list", MEASUREMENT.format("subject = '[1, 2]'"), "subject '[1, 2]' is not a JSON object"),
    Row("workload-null", MEASUREMENT.format("workload = 'null'"), "workload 'null' is not a JSON object"),
]


def one_line(output: str, text: str) -> None:
    assert output.count(text) == 1, output
    assert "Traceback" not in output and "During handling" not in output, output


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_corrupt_history_row_is_left_out_in_one_line(pytester: pytest.Pytester, recorded: Path, row: Row) -> None:
    root = pytester.path
    copy_of(recorded, root)
    history = root / HISTORY
    with sqlite3.connect(history) as db:
        db.execute(row.sql)
    spoiled = history.read_bytes()
    result = run(pytester, *ARGS)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    where = f"measurement #{SPOILED} (session #{SPOILED}, {TEST_ID}, "
    line = next((ln for ln in output.splitlines() if "unreadable measurement" in ln), "")
    one_line(output, "unreadable measurement")
    assert where + row.says in line or (where in line and row.says in line), line
    assert (
        f'to delete them: sqlite3 {history} "DELETE FROM llmperf_values WHERE measurement_id IN ({SPOILED}); ' in line
    )
    assert "left out: measurement" in line and "; the verdicts used the other sessions; to delete them" in line
    result.assert_outcomes(passed=1)
    with sqlite3.connect(history) as db:  # the bad row is still there (never deleted unasked), one session more
        assert db.execute("SELECT COUNT(*) FROM llmperf_sessions").fetchone()[0] == SESSIONS + 1
        assert db.execute("SELECT COUNT(*) FROM llmperf_measurements WHERE id = ?", (SPOILED,)).fetchone()[0] == 1
    del spoiled
    for command in ("history", "detect"):
        done = cli(root, command, "--history", HISTORY)
        assert done.returncode == 0, done.stdout + done.stderr
        one_line(done.stderr, "unreadable measurement")
        assert where in done.stderr and "Traceback" not in done.stdout
    assert f"{SESSIONS} session(s)" in cli(root, "history", "--history", HISTORY).stdout  # 9 stored, 1 left out
    # The statement the line gives deletes exactly the bad measurement; the history is whole again.
    statement = line.split(f"sqlite3 {history} ")[1].strip('"')
    with sqlite3.connect(history) as db:
        db.executescript(statement)
    done = cli(root, "history", "--history", HISTORY)
    assert done.returncode == 0 and not done.stderr, done.stderr


def garble(path: Path) -> None:
    """Junk over every page but the first (the header and the schema stay intact)."""
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page:] = bytes((i * 131 + 7) % 256 for i in range(len(data) - page))
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    with path.open("r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2 + 100)


@pytest.mark.parametrize("spoil", [garble, truncate], ids=["garbled-pages", "truncated"])
def test_a_damaged_history_file_is_one_line_with_the_remedy(pytester: pytest.Pytester, recorded: Path, spoil) -> None:
    root = pytester.path
    copy_of(recorded, root)
    history = root / HISTORY
    spoil(history)
    before = history.read_bytes()
    result = run(pytester, *ARGS)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    result.assert_outcomes(passed=1)
    remedy = f"move it aside (mv {history} {history}.corrupt) and the next session starts a new history there"
    one_line(output, remedy)
    assert "this session goes on without history" in output or "history not written" in output, output
    assert history.read_bytes() == before  # never written over
    done = cli(root, "history", "--history", HISTORY)
    assert done.returncode != 0 and done.stderr.count(remedy) == 1, done.stderr
    assert "Traceback" not in done.stderr


# -- the engine worker's reply pipe -------------------------------------------------------------


@pytest.mark.parametrize("op", ["load", "run"])
def test_garbage_on_the_reply_pipe_is_one_line(tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    monkeypatch.setenv(FAULT_ENV, f"{op}:garbage")
    config = EngineConfig(model=str(tiny_model_path), threads=1)
    worker = None
    with pytest.raises(EngineCrash) as info:
        worker = WorkerEngine(config)
        pid = worker.pid
        worker.run(Workload(prompt_tokens=4, max_tokens=2, runs=1, warmup=0), 0)
    line = str(info.value)
    assert "\n" not in line and "answered with a line that is not a JSON object while" in line, line
    assert "'\\x1b[31mggml_debug: xxxx" in line and "x" * 81 not in line, line  # the text, cut short
    assert "it was killed" in line and f"model {tiny_model_path.name}" in line
    if worker is not None:
        assert not worker.alive
        worker.close()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_garbage_on_the_reply_pipe_fails_one_test(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "run:garbage")
    pytester.makepyfile(test_inner=SOURCE)
    result = run(pytester, "-rN", "--llmperf-baseline-dir=baselines", "--llmperf-history=off")
    output = result.stdout.str() + result.stderr.str()
    result.assert_outcomes(failed=1)
    one_line(output, "answered with a line that is not a JSON object while running")
    assert "JSONDecodeError" not in output


# -- baseline files with the same defects -------------------------------------------------------

BASELINE = "baselines/test_inner.json"


def spoil_entry(text: str, edit) -> str:
    data = json.loads(text)
    (entry,) = data["tests"]["test_a"].values()
    edit(entry)
    return json.dumps(data)


def runs(values) -> Callable[[dict], None]:
    return lambda e: e["runs"].__setitem__("tpot_ms", values)


def sessions(value) -> Callable[[dict], None]:
    return lambda e: e.__setitem__("sessions", value)


LEVEL = {"log_level": 1.0, "se": 0.01, "n": 3, "spread": 0.02}
ENTRIES = [
    ("run-zero", runs([0, 0, 0]), ".runs['tpot_ms'][0] is 0, not above 0 (a judged metric)"),
    ("run-negative", runs([6.5, -1, 6.6]), ".runs['tpot_ms'][1] is -1, below the minimum 0"),
    ("run-nan", runs([float("nan"), 6.5]), ".runs['tpot_ms'][0] is nan, not a finite number"),
    ("sessions-a-list", sessions([1]), ".sessions is an array, not an object"),
    (
        "session-level-text",
        sessions({"tpot_ms": [{**LEVEL, "log_level": "x"}]}),
        ".sessions['tpot_ms'][0].log_level is a string",
    ),
    (
        "session-se-negative",
        sessions({"tpot_ms": [{**LEVEL, "se": -1}]}),
        ".sessions['tpot_ms'][0].se is -1, below the minimum 0",
    ),
    (
        "session-n-zero",
        sessions({"tpot_ms": [{**LEVEL, "n": 0}]}),
        ".sessions['tpot_ms'][0].n is 0, below the minimum 1",
    ),
    (
        "session-missing-key",
        sessions({"tpot_ms": [{"se": 0.1, "n": 3, "spread": 0.1}]}),
        ".sessions['tpot_ms'][0] has no 'log_level'",
    ),
]


@pytest.mark.parametrize(("name", "edit", "says"), ENTRIES, ids=[e[0] for e in ENTRIES])
def test_a_corrupt_baseline_entry_is_one_line(pytester: pytest.Pytester, recorded: Path, name, edit, says) -> None:
    root = pytester.path
    copy_of(recorded, root)
    path = root / BASELINE
    path.write_text(spoil_entry(path.read_text(), edit))
    before = path.read_bytes()
    result = run(pytester, *ARGS)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, output
    result.assert_outcomes(failed=1)
    one_line(output, says)
    assert f"{path}: tests['test_a']" in output and "re-record it with --llmperf-update-baselines" in output
    assert path.read_bytes() == before
