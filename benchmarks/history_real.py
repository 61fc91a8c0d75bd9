"""The history on the real engine: 12 pytest sessions of the small preset with 2 llama.cpp
threads, then 8 with 1 thread, each appending to one SQLite history; then ``llmperf detect``
and ``llmperf history`` on it. Expected: one change point per phase, at session 13, with
"threads 2 -> 1" named.

Each session is a separate ``python -m pytest`` process (as in CI), with a made-up commit per
session (``$GITHUB_SHA``) so the change point names one. On a shared machine the timings
swing; the script prints what it got, every session's levels included.

Run: ``python benchmarks/history_real.py [--runs 6] [--before 12] [--after 8] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SUITE = """
import pytest

@pytest.mark.llmperf(prompt_tokens=64, max_tokens=32, runs={runs}, warmup=1)
def test_small(): pass
"""


def session(folder: Path, history: Path, threads: int, index: int) -> float:
    env = {**os.environ, "GITHUB_SHA": hashlib.sha1(f"session {index}".encode()).hexdigest()}
    env.pop("LLMPERF_HISTORY", None)
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--rootdir={folder}",
            "test_real.py",
            "--llmperf-model",
            "small",
            "--llmperf-threads",
            str(threads),
            "--llmperf-history",
            str(history),
            "--llmperf-budgets-only",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"session {index + 1} failed:\n{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--before", type=int, default=12, help="sessions with threads 2")
    ap.add_argument("--after", type=int, default=8, help="sessions with threads 1")
    ap.add_argument("--keep", type=Path, default=None, help="keep the history in this folder")
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="llmperf-history-real-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_real.py").write_text(SUITE.format(runs=args.runs))
    history = folder / "history.sqlite"
    for i in range(args.before + args.after):
        threads = 2 if i < args.before else 1
        took = session(folder, history, threads, i)
        print(f"session {i + 1:>2}: threads {threads}, {took:.0f} s", flush=True)
    from pytest_llmperf.cli import main as cli

    print(f"\n$ llmperf history --history {history} --metric ttft_ms --metric tpot_ms")
    cli(["history", "--history", str(history), "--metric", "ttft_ms", "--metric", "tpot_ms"])
    print(f"$ llmperf detect --history {history} --last {args.after + 1}")
    status = cli(["detect", "--history", str(history), "--last", str(args.after + 1)])
    print(f"exit status {status}; history kept in {folder}" if args.keep else f"exit status {status}")


if __name__ == "__main__":
    main()
