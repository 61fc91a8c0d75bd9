"""What reading the history window costs a session: a 200-test suite, SQLite and PostgreSQL.

    .venv/bin/python benchmarks/history_window.py [--tests 200] [--sessions 60]

Writes ``--sessions`` sessions of ``--tests`` tests (3 judged metrics and the rates, 20 runs
each) into a fresh SQLite file and a throw-away PostgreSQL server (tests/pgserver.py), then
times what the plugin does once per session (``history.series.read_windows``: one query,
the last ``WINDOW_READ_SESSIONS`` sessions on this hardware, no per-run values) and, per
test, the window's selection (``Windows.levels``). Target (issue 23): at most 1 s in all.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from pytest_llmperf.history import append_session
from pytest_llmperf.history.connection import parse
from pytest_llmperf.history.series import WINDOW_READ_SESSIONS, read_windows

HW = "linux-x86_64-2cpu-bench"
METRICS = ["ttft_ms", "tpot_ms", "itl_p95_ms"]


def results(rng: np.random.Generator, tests: int, runs: int = 20) -> list[dict]:
    out = []
    for t in range(tests):
        x = np.exp(rng.normal(0, 0.03, runs))
        out.append(
            {
                "test": f"tests/test_suite.py::test_{t}",
                "nodeid": f"tests/test_suite.py::test_{t}",
                "label": "",
                "hardware_key": HW,
                "record": {
                    "hardware": {"cpu": "bench cpu", "logical_cpus": 2},
                    "subject": {
                        "engine": "llama.cpp",
                        "n_threads": 2,
                        "backend_version": "0.3.36",
                        "model_sha256": "ab" * 8,
                    },
                    "workload": {"prompt_tokens": 64, "max_tokens": 32, "runs": runs, "seed": 0},
                    "summary": {"tpot_ms": 10.0},
                    "runs": {
                        "ttft_ms": list(50 * x),
                        "prefill_tps": list(1280 / x),
                        "tpot_ms": list(10 * x),
                        "decode_tps": list(100 / x),
                        "itl_p50_ms": list(9.5 * x),
                        "itl_p95_ms": list(12 * x),
                    },
                },
                "verdict": {"status": "compared", "short": "UNCHANGED"},
            }
        )
    return out


def measure(loc, tests: int, sessions: int, repeat: int) -> tuple[float, float, float, int]:
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for s in range(sessions):
        append_session(loc, results(rng, tests), f"2026-01-{1 + s // 24:02d}T{s % 24:02d}:00:00+00:00", ROOT, True)
    fill_s = time.perf_counter() - started
    entry = {
        "recorded_at": "2026-01-01T00:00:00+00:00",
        **{k: results(rng, 1)[0]["record"][k] for k in ("subject", "workload")},
    }
    reads, picks = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        windows = read_windows(loc, HW, METRICS)
        t1 = time.perf_counter()
        sizes = [len(windows.levels(f"tests/test_suite.py::test_{t}", "", entry)["tpot_ms"]) for t in range(tests)]
        picks.append(time.perf_counter() - t1)
        reads.append(t1 - t0)
    assert set(sizes) == {10}, sizes
    return fill_s, float(np.median(reads)), float(np.median(picks)), sum(len(r) for r in windows.rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{args.tests} tests x {args.sessions} sessions stored; read: the last {WINDOW_READ_SESSIONS} sessions, "
        f"{len(METRICS)} metrics; median of {args.repeat}"
    )
    print(f"{'backend':<11} {'rows read':>9} {'read (s)':>9} {'200 windows (s)':>16} {'total (s)':>9}  (filling took)")
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", lambda: str(Path(tmp) / "history.sqlite"))]
        server = None
        try:
            from pgserver import PgServer, bindir

            if bindir() is not None:
                server = PgServer().start()
                backends.append(("postgresql", server.new_database))
        except ImportError:
            pass
        try:
            for name, target in backends:
                loc = parse(target(), name, tmp)
                fill_s, read_s, pick_s, rows = measure(loc, args.tests, args.sessions, args.repeat)
                print(
                    f"{name:<11} {rows:>9} {read_s:>9.3f} {pick_s:>16.3f} {read_s + pick_s:>9.3f}  ({fill_s:.0f} s)",
                    flush=True,
                )
        finally:
            if server is not None:
                server.stop()
    if server is None:
        print("postgresql: not measured (no PostgreSQL binaries: apt-get install -y postgresql)")


if __name__ == "__main__":
    main()
