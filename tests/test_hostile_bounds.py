"""Work that grew without bound on large but valid inputs (issue 34, point 2).

- ``llmperf history`` / ``detect`` read a window of each series' last sessions (default
  ``WINDOW_SESSIONS``), say when they cut one, and ``--sessions N`` widens it; the change-point
  search is linear in memory (tests/test_changepoints.py checks its statistic against the
  distance matrix; benchmarks/history_scale.py has the times of a 1000-session history).
- ``llmperf report --jobs N`` starts at most as many drawing processes as there are usable
  CPUs, and a count below 1 is one line.
- ``llmperf profile`` waits on its engine worker as long as the session's ``engine_timeout``
  setting says (``--engine-timeout``, ``LLMPERF_ENGINE_TIMEOUT``), not a fixed 600 s, and the
  hung worker is gone afterwards.

Each case asserts the exit status, the one line, the files left as they were and no process
left behind; never a time, except as a bound far above what the fixed behaviour takes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from test_hostile import session_file

from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.cli.history_commands import WINDOW_SESSIONS
from pytest_llmperf.history import append_session
from pytest_llmperf.history.connection import parse

CHECKOUT = Path(__file__).resolve().parent.parent
HW = "linux-x86_64-2cpu-abcd"


def result(tpot_ms: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    noise = np.exp(rng.normal(0, 0.01, 6))
    return {
        "test": "t.py::test_decode",
        "nodeid": "t.py::test_decode",
        "label": "",
        "hardware_key": HW,
        "record": {
            "hardware": {"cpu": "test cpu", "logical_cpus": 2},
            "subject": {"engine": "llama.cpp", "n_threads": 2},
            "workload": {"prompt_tokens": 64, "max_tokens": 16, "runs": 6},
            "summary": {"tpot_ms": tpot_ms},
            "runs": {"ttft_ms": list(5 * tpot_ms * noise), "tpot_ms": list(tpot_ms * noise)},
        },
        "verdict": None,
    }


@pytest.fixture(scope="module")
def long_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``WINDOW_SESSIONS + 30`` sessions of one test; decode 30% slower from session 10 on: a
    step that only a window wider than the default sees."""
    folder = tmp_path_factory.mktemp("history")
    path = folder / "history.sqlite"
    loc = parse(str(path), "test", folder)
    rng = np.random.default_rng(3)
    for i in range(WINDOW_SESSIONS + 30):
        tpot = (13.0 if i >= 10 else 10.0) * math.exp(rng.normal(0, 0.01))
        stamp = f"2026-{1 + i // 600:02d}-{1 + i // 24 % 25:02d}T{i % 24:02d}:00:00+00:00"
        append_session(loc, [result(tpot, i)], stamp, folder, compared=False)
    return path


def test_detect_reads_the_default_window_and_says_so(long_history: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = long_history.read_bytes()
    total = WINDOW_SESSIONS + 30
    assert cli_main(["detect", "--history", str(long_history), "--metric", "tpot_ms"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"0 change point(s) in 1 series (up to {WINDOW_SESSIONS} sessions each); 0 regression(s) in the last 5 session(s)",
        f"1 of 1 series cut to their last {WINDOW_SESSIONS} sessions (up to {total} stored); --sessions N reads more",
    ]
    args = ["detect", "--history", str(long_history), "--metric", "tpot_ms", "--sessions", str(total)]
    assert cli_main(args) == 0  # the step is older than the last 5 sessions: no gate
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "REGRESSION at session 11 of 230" in out[0], out
    assert (
        out[1]
        == f"1 change point(s) in 1 series (up to {total} sessions each); 0 regression(s) in the last 5 session(s)"
    )
    assert long_history.read_bytes() == before


def test_history_reads_the_default_window(long_history: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["history", "--history", str(long_history), "--metric", "tpot_ms"]) == 0
    out = capsys.readouterr().out
    assert "change point" not in out and out.rstrip().endswith("--sessions N reads more")
    assert cli_main(["history", "--history", str(long_history), "--metric", "tpot_ms", "--sessions", "5"]) == 0
    out = capsys.readouterr().out
    assert "cut to their last 5 sessions (up to 230 stored)" in out


@pytest.mark.parametrize("verb", ["history", "detect"])
@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_sessions_below_one_is_one_line(verb: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main([verb, "--sessions", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"llmperf {verb}: error: argument --sessions: "), err


def test_help_states_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("history", "detect"):
        with pytest.raises(SystemExit):
            cli_main([verb, "--help"])
        assert f"(default {WINDOW_SESSIONS};" in " ".join(capsys.readouterr().out.split())


# -- llmperf report --jobs ------------------------------------------------------------------------


class Result:
    """What ``test_sections`` reads of a result when drawing is stubbed."""

    test = "t.py::test_a"

    def to_json(self) -> dict:
        return {}


def test_report_jobs_are_bounded_by_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--jobs 100000`` started one process per chunk of results at once: now at most one
    per usable CPU (this process draws a chunk itself). Drawing is replaced by a stub: what is
    counted is the processes asked for."""
    from pytest_llmperf.reports import html

    started: list[int] = []

    def fake_run(argv, *, input: str, **kwargs):
        job = json.loads(input)
        started.append(len(job["results"]))
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(["s"] * len(job["results"])), stderr="")

    monkeypatch.setattr(html.subprocess, "run", fake_run)
    monkeypatch.setattr(html, "test_section", lambda i, r, trend, against, by_request: "s")
    monkeypatch.setattr(html, "usable_cpus", lambda: 3)
    results = [Result()] * 40
    for workers, processes in ((100000, 2), (None, 2), (2, 1), (1, 0)):
        started.clear()
        assert html.test_sections(results, workers) == ["s"] * 40  # type: ignore[arg-type]
        assert len(started) == processes, (workers, started)


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_report_jobs_below_one_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs: str) -> None:
    session = session_file(tmp_path / "s.json", ["t_a"])
    with pytest.raises(SystemExit) as exit_:
        cli_main(["report", session, "--jobs", jobs, "-o", str(tmp_path / "r.html")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == f"llmperf report: error: argument --jobs: must be >= 1, got {jobs} (see llmperf report --help)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


# -- llmperf profile's deadline -------------------------------------------------------------------


def processes_with(token: str) -> list[int]:
    """The processes whose environment holds ``token`` (this test's commands and their children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("how", ["environment", "flag"])
def test_profile_waits_as_long_as_the_engine_timeout_says(tmp_path: Path, how: str) -> None:
    """A hung worker (the test hook hangs it at its first run) is given up after the
    setting's seconds, not 600: one line naming them, exit 2, the worker gone."""
    token = f"llmperf-test-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")]),
        "LLMPERF_WORKER_FAULT": "run:hang",
        "LLMPERF_TEST_TOKEN": token,
        "TMPDIR": str(tmp_path / "tmp"),
    }
    (tmp_path / "tmp").mkdir()
    env.pop("LLMPERF_ENGINE_TIMEOUT", None)
    argv = [sys.executable, "-m", "pytest_llmperf.cli", "profile", "tiny", "--runs", "1", "--warmup", "0"]
    argv += ["--peak-bw", "10", "--peak-tflops", "1", "-o", str(tmp_path / "profile.txt")]
    if how == "environment":
        env["LLMPERF_ENGINE_TIMEOUT"] = "3"
    else:
        argv += ["--engine-timeout", "3"]
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stderr.strip().splitlines() if not line.startswith("llmperf: profile ")]  # progress
    assert len(lines) == 1 and lines[0].startswith(
        "llmperf: error: llama.cpp worker did not answer within 3 s while "
    ), lines
    assert "LLMPERF_ENGINE_TIMEOUT" in lines[0] and "Traceback" not in out.stdout + out.stderr
    assert elapsed < 300  # far below the 600 s of before, whatever the machine's load
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["tmp"]  # no report, no temporary file
    deadline = time.monotonic() + 10
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)  # a killed worker may take a moment to be reaped
    assert processes_with(token) == []


def test_profile_engine_timeout_below_zero_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["profile", "tiny", "--engine-timeout", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --engine-timeout:" in err, err
