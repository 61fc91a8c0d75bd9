"""The plugin's side of the history, through inner pytest sessions on real llama.cpp (the tiny
model): every session appends its measurements; ``-n 2`` and two pytest processes at once
lose no rows, on SQLite and on a real PostgreSQL server (tests/pgserver.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from inner import run
from test_history import location, pg_server  # noqa: F401  (fixtures: both backends)

from pytest_llmperf.history import database as store
from pytest_llmperf.history.connection import parse
from pytest_llmperf.history.series import read_series

SUITE = """
import pytest

@pytest.mark.llmperf(prompt_tokens=16, max_tokens=8, runs=3, warmup=0)
def test_one(): pass

@pytest.mark.llmperf(prompt_tokens=16, max_tokens=8, runs=3, warmup=0)
def test_two(llmperf):
    llmperf.measure(label="short")
    llmperf.measure(label="long", max_tokens=12)

@pytest.mark.llmperf(prompt_tokens=16, max_tokens=8, runs=3, warmup=0)
def test_three(): pass
"""


def test_session_appends_to_the_default_history_under_the_rootdir(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMPERF_HISTORY")  # the default: <rootdir>/.llmperf/history.sqlite
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester)
    result.assert_outcomes(passed=3)
    path = pytester.path / ".llmperf" / "history.sqlite"
    result.stdout.fnmatch_lines([f"llmperf: history: session #1 (4 measurement(s)) appended to {path}"])
    assert (pytester.path / ".llmperf" / ".gitignore").read_text().splitlines()[-1] == "*"
    loc = parse(str(path), "test", pytester.path)
    assert store.counts(loc) == {"sessions": 1, "measurements": 4, "values": 24}
    series = {(s.test.split("::")[-1], s.label, s.metric): s for s in read_series(loc, metrics=None)}
    tpot = series[("test_two", "long", "tpot_ms")]
    assert tpot.phase == "decode" and tpot.points[0].n == 3 and len(tpot.points[0].runs) == 3
    assert tpot.points[0].subject["n_threads"] == 1 and tpot.points[0].workload["max_tokens"] == 12
    assert tpot.points[0].baseline == "no-baseline"  # a comparison was asked for; none stored
    assert series[("test_one", "", "ttft_ms")].phase == "prefill"

    run(pytester, "--llmperf-history", "off", "-q").assert_outcomes(passed=3)
    assert store.counts(loc)["sessions"] == 1
    report = pytester.path / "report.html"
    second = run(pytester, "--llmperf-budgets-only", "--llmperf-html", str(report))
    second.assert_outcomes(passed=3)
    assert store.counts(loc)["sessions"] == 2
    page = report.read_text()
    assert page.count('data-figure="trend"') == 4, "each measurement's recent trend (2 sessions)"
    assert read_series(loc, test="test_one", metrics=["tpot_ms"])[0].points[1].baseline is None  # not compared


def test_a_bad_location_is_one_line_before_anything_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester, "--llmperf-history", "mysql://u:pw@host/db")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-history: 'mysql://u:***@host/db' is not a supported history location*"])
    assert "pw@" not in result.stderr.str()


def test_xdist_and_concurrent_pytest_processes_lose_no_rows(location: str, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    xdist = pytester.runpytest_subprocess("-n", "2", "-p", "no:randomly", "--llmperf-history", location)
    xdist.assert_outcomes(passed=3)
    env = {**os.environ, "LLMPERF_HISTORY": location}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                f"--rootdir={pytester.path}",
                "test_suite.py",
            ],
            cwd=pytester.path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    loc = parse(location, "test", pytester.path)
    assert store.counts(loc) == {"sessions": 3, "measurements": 12, "values": 72}
    for s in read_series(loc):
        assert len(s.points) == 3 and len({p.session_id for p in s.points}) == 3
