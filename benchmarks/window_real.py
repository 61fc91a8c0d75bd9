"""The history window on the real engine (issue 23): is the reach the gate reports true here?

    python benchmarks/window_real.py [--fill 10] [--aa 20] [--slow 10] [--keep DIR]

The suite measures the small preset (134M F16) through a user's wrapper,
``llmperf.measure(stream)``, where ``stream`` yields llama.cpp's tokens and spins
``$WORK_S`` seconds per token (0 for A/A). Each session is a separate ``python -m pytest``
process appending to one SQLite history, with 1 llama.cpp thread.

1. The baseline is recorded once (``--llmperf-update-baselines``); ``--fill`` - 1 more A/A
   sessions fill the history window.
2. ``--aa`` A/A sessions: each one's verdicts (JSON) and the reach it reports; expected: no
   REGRESSION.
3. ``--slow`` sessions with per-token work of 1.5x the decode reach reported by the first A/A
   session of step 2 (x its TPOT), each judged against a copy of the history as step 2 left
   it (so an injected session never enters another's window); expected: flagged in >= 9.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = """
import os
import time

import pytest

WORK_S = float(os.environ.get("WORK_S", "0"))


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.llmperf(prompt_tokens=64, max_tokens=32, warmup=1, max_runs={max_runs})
def test_small(llmperf, llmperf_llm):
    def stream(prompt, max_tokens):
        llmperf_llm.reset()  # no prefix reuse between runs
        for chunk in llmperf_llm(prompt, max_tokens=max_tokens, stream=True, temperature=0.0):
            if WORK_S:
                spin(WORK_S)
            yield chunk

    llmperf.measure(stream)
"""


def session(folder: Path, history: Path, index: int, *args: str, work_s: float = 0.0) -> dict:
    report = folder / f"s{index}.json"
    env = {**os.environ, "WORK_S": repr(work_s)}
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
            "1",
            "--llmperf-history",
            str(history),
            "--llmperf-json",
            str(report),
            *args,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode not in (0, 1):
        raise SystemExit(f"session {index} failed:\n{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
    doc = json.loads(report.read_text())["results"][0]
    comps = {c["metric"]: c for c in (doc.get("verdict") or {}).get("comparisons", [])}
    return {"took": time.perf_counter() - t0, "comps": comps, "runs": doc["record"]["runs"], "exit": out.returncode}


def line(i: int, kind: str, r: dict) -> str:
    parts = [f"session {i:>2} {kind:<6} {r['took']:>4.0f} s"]
    for m in ("ttft_ms", "tpot_ms"):
        c = r["comps"].get(m)
        tpot = statistics.median(r["runs"][m])
        if c is None:
            parts.append(f"{m} {tpot:.2f}")
            continue
        parts.append(
            f"{m} {tpot:.2f} {c['verdict']:<12} {c['ratio'] - 1:+.1%} detects {c.get('detectable') or 0:.1%} "
            f"({c.get('noise_source', '?')}, {c.get('noise_sessions', 0)})"
        )
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fill", type=int, default=10)
    ap.add_argument("--aa", type=int, default=20)
    ap.add_argument("--slow", type=int, default=10)
    ap.add_argument("--max-runs", type=int, default=40)
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--work-factor", type=float, default=1.5, help="per-token work as this x the decode reach")
    ap.add_argument(
        "--reach-from",
        type=Path,
        default=None,
        help="a session JSON (s<i>.json of a kept run) whose decode reach and TPOT set the work; with "
        "--fill 0 --aa 0 --keep DIR: only the slowed sessions, against that history",
    )
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="llmperf-window-real-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_real.py").write_text(SUITE.format(max_runs=args.max_runs))
    history = folder / "history.sqlite"
    i = len(list(folder.glob("s*.json")))
    for j in range(args.fill):
        i += 1
        r = session(folder, history, i, *(["--llmperf-update-baselines"] if j == 0 else []))
        print(line(i, "fill", r), flush=True)
    aa = []
    for _ in range(args.aa):
        i += 1
        r = session(folder, history, i)
        aa.append(r)
        print(line(i, "A/A", r), flush=True)
    if args.reach_from:
        doc = json.loads(args.reach_from.read_text())["results"][0]
        source = {"comps": {c["metric"]: c for c in doc["verdict"]["comparisons"]}}
        # the window's reference level: what the injected share is a share of
        tpot_ms = source["comps"]["tpot_ms"]["baseline_value"]
        where = f"by {args.reach_from.name}"
    else:
        source = aa[0]
        tpot_ms = statistics.median(aa[0]["runs"]["tpot_ms"])
        where = f"after {args.fill} sessions"
    reach = {m: source["comps"][m]["detectable"] for m in ("ttft_ms", "tpot_ms")}
    work_s = args.work_factor * reach["tpot_ms"] * tpot_ms / 1000.0
    print(
        f"reported {where}: prefill detects >= {reach['ttft_ms']:.1%}, decode >= "
        f"{reach['tpot_ms']:.1%}; injecting {work_s * 1000:.2f} ms per token ({args.work_factor}x decode reach x "
        f"TPOT {tpot_ms:.2f} ms)",
        flush=True,
    )
    slow = []
    for _ in range(args.slow):
        i += 1
        copy = folder / "history-copy.sqlite"
        shutil.copyfile(history, copy)
        r = session(folder, copy, i, work_s=work_s)
        slow.append(r)
        print(line(i, "slow", r), flush=True)
    reg = lambda rs, m: sum(r["comps"][m]["verdict"] == "REGRESSION" for r in rs)
    if aa:
        print(
            f"A/A: {sum(any(c['verdict'] == 'REGRESSION' for c in r['comps'].values()) for r in aa)} of {len(aa)} "
            f"sessions with a REGRESSION (prefill {reg(aa, 'ttft_ms')}, decode {reg(aa, 'tpot_ms')}); decode reach "
            f"reported: median {statistics.median(r['comps']['tpot_ms']['detectable'] for r in aa):.1%}, prefill "
            f"{statistics.median(r['comps']['ttft_ms']['detectable'] for r in aa):.1%}"
        )
    print(
        f"+{work_s * 1000:.2f} ms/token: decode REGRESSION in {reg(slow, 'tpot_ms')} of {len(slow)} sessions; "
        f"measured decode change median "
        f"{statistics.median(r['comps']['tpot_ms']['ratio'] for r in slow) - 1:+.1%}"
    )
    if not args.keep:
        print(f"(history in {folder})")


if __name__ == "__main__":
    main()
