"""What ``llmperf history`` and ``llmperf detect`` cost on a long history (issue 34): time and
peak memory of each command on a generated SQLite history of 1000 sessions.

    .venv/bin/python benchmarks/history_scale.py [--sessions 1000] [--tests 2] [--checkout PATH]

Writes ``--sessions`` sessions of ``--tests`` tests (20 runs of each metric; a +5% decode
step 300 sessions before the end) with the project's own history writer
(``history.append_session``) into a SQLite file in a temporary folder, then runs each command
as a fresh process (``python -m pytest_llmperf.cli``) and prints its wall time and peak RSS
(``wait4``): with the default window (the last ``WINDOW_SESSIONS`` sessions of each series)
and with ``--sessions`` covering the whole history. ``--checkout PATH`` runs the same
commands with another checkout's package first on the path (e.g. the code before the window,
for before/after figures; its ``detect`` has no ``--sessions``, so only the plain commands).
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_llmperf.cli.history_commands import WINDOW_SESSIONS
from pytest_llmperf.history import append_session
from pytest_llmperf.history.connection import parse

HW = "linux-x86_64-2cpu-bench"
RUNS = 20
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def results(rng: np.random.Generator, tests: int, shift: float) -> list[dict]:
    out = []
    for t in range(tests):
        x = np.exp(rng.normal(0, 0.03, RUNS) + rng.normal(0, 0.015))  # runs, and the session's drift
        slow = x * shift
        out.append(
            {
                "test": f"tests/test_suite.py::test_{t}",
                "nodeid": f"tests/test_suite.py::test_{t}",
                "label": "",
                "hardware_key": HW,
                "record": {
                    "hardware": {"cpu": "bench cpu", "logical_cpus": 2},
                    "subject": {"engine": "llama.cpp", "n_threads": 2, "backend_version": "0.3.36"},
                    "workload": {"prompt_tokens": 64, "max_tokens": 32, "runs": RUNS, "seed": 0},
                    "summary": {"tpot_ms": 10.0},
                    "runs": {
                        "ttft_ms": list(50 * x),
                        "prefill_tps": list(1280 / x),
                        "tpot_ms": list(10 * slow),
                        "decode_tps": list(100 / slow),
                        "itl_p50_ms": list(9.5 * slow),
                        "itl_p95_ms": list(12 * slow),
                    },
                },
                "verdict": {"status": "compared", "short": "UNCHANGED"},
            }
        )
    return out


def fill(path: Path, sessions: int, tests: int) -> float:
    loc = parse(str(path), "bench", path.parent)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for s in range(sessions):
        shift = 1.05 if s >= sessions - 300 else 1.0
        stamp = (START + datetime.timedelta(hours=s)).isoformat()
        append_session(loc, results(rng, tests, shift), stamp, ROOT, True)
    return time.perf_counter() - started


def timed(checkout: Path, *argv: str) -> tuple[float, float, int, str]:
    """Wall seconds, peak RSS (MiB), exit status and the last line of one command."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_llmperf.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    last = (out.strip().splitlines() or [""])[-1]
    return seconds, usage.ru_maxrss / 1024, proc.returncode, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--tests", type=int, default=2)
    parser.add_argument("--checkout", type=Path, default=None, help="also run the commands of this checkout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "history.sqlite"
        fill_s = fill(db, args.sessions, args.tests)
        series = args.tests * 3  # the default metrics: ttft_ms, tpot_ms, itl_p95_ms
        print(
            f"history: {args.sessions} sessions x {args.tests} tests ({series} series of the default metrics), "
            f"{db.stat().st_size / 2**20:.1f} MiB SQLite, written in {fill_s:.0f} s; default window "
            f"{WINDOW_SESSIONS} sessions"
        )
        runs = [
            ("this checkout", ROOT, "history", []),
            ("this checkout", ROOT, "detect", []),
            ("this checkout", ROOT, "history", ["--sessions", str(args.sessions)]),
            ("this checkout", ROOT, "detect", ["--sessions", str(args.sessions)]),
        ]
        if args.checkout is not None:
            runs += [
                (str(args.checkout), args.checkout, "history", []),
                (str(args.checkout), args.checkout, "detect", []),
            ]
        print(f"{'code':<22} {'command':<32} {'wall (s)':>8} {'peak RSS (MiB)':>14} {'exit':>4}  last line")
        for name, checkout, verb, extra in runs:
            seconds, rss, code, last = timed(checkout, verb, "--history", str(db), *extra)
            command = " ".join(["llmperf", verb, *extra])
            print(f"{name:<22} {command:<32} {seconds:>8.1f} {rss:>14.0f} {code:>4}  {last[:100]}", flush=True)


if __name__ == "__main__":
    main()
