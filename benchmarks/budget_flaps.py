"""Budgets near their limit, before and after their CI (issue 33 point 3): pass rate and the share
of sessions the sample decided, side by side from the same sessions.

A calibration session measures one marker test with many runs and takes the true values: the
median TPOT and the p95 of TTFT over its runs. Then ``--sessions`` separate pytest sessions run
the same test with ``runs`` runs and two budgets set ``--margin`` (3%) above those values:
``tpot_ms`` (a median) and ``ttft_p95_ms`` (a percentile of the runs). Per session:

- before: the rule without a CI (the statistic of the first ``runs`` runs against the limit,
  recomputed from the session's own per-run values);
- after: what the plugin decided (met or breached by the whole 95% CI, or undecided after
  measuring up to ``max_runs``: passes, and says so).

    .venv/bin/python benchmarks/budget_flaps.py --sessions 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TEST = """import pytest


@pytest.mark.llmperf(prompt_tokens={prompt_tokens}, max_tokens={max_tokens}, runs={runs}{budgets})
def test_budget(): pass
"""


def session(root: Path, out: Path, runs: int, budgets: str, args: argparse.Namespace) -> dict:
    (root / "test_budget.py").write_text(
        TEST.format(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=runs, budgets=budgets)
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={root}", str(root)]
    cmd += ["--llmperf-json", str(out), "--llmperf-history", "off"]
    proc = subprocess.run(cmd, check=False, cwd=root, capture_output=True, text=True, timeout=1800)
    if not out.is_file():
        raise SystemExit(f"session failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    result: dict = json.loads(out.read_text())["results"][0]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--calibration-runs", type=int, default=60)
    ap.add_argument("--margin", type=float, default=0.03)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmperf-budget-") as tmp:
        root = Path(tmp)
        print(f"load: {os.getloadavg()[0]:.1f}")
        cal = session(root, root / "cal.json", args.calibration_runs, "", args)["record"]["runs"]
        true = {"tpot_ms": statistics.median(cal["tpot_ms"]), "ttft_p95_ms": float(np.percentile(cal["ttft_ms"], 95))}
        limits = {k: v * (1 + args.margin) for k, v in true.items()}
        print(
            f"true values over {args.calibration_runs} runs: TPOT median {true['tpot_ms']:.4g} ms, "
            f"TTFT p95 {true['ttft_p95_ms']:.4g} ms; budgets {args.margin:+.0%} above: "
            + ", ".join(f"{k}={v:.4g}" for k, v in limits.items())
        )
        budgets = "".join(f", {k}={v:.6g}" for k, v in limits.items())
        before = {k: 0 for k in limits}
        after_pass = {k: 0 for k in limits}
        decided = {k: 0 for k in limits}
        runs_used = []
        for i in range(args.sessions):
            r = session(root, root / f"s{i}.json", args.runs, budgets, args)
            values = r["record"]["runs"]
            first = {
                "tpot_ms": statistics.median(values["tpot_ms"][: args.runs]),
                "ttft_p95_ms": float(np.percentile(values["ttft_ms"][: args.runs], 95)),
            }
            runs_used.append(len(values["tpot_ms"]))
            for k, limit in limits.items():
                before[k] += first[k] <= limit
                failed = k in r.get("breached_budgets", [])
                undecided = any(
                    note.startswith(("decode TPOT median", "TTFT p95")) and _key(note) == k
                    for note in r.get("budget_notes", [])
                )
                after_pass[k] += not failed
                decided[k] += not undecided
            print(f"  session {i + 1}: runs {runs_used[-1]}, load {os.getloadavg()[0]:.1f}", flush=True)
        n = args.sessions
        print(
            f"\n{n} sessions, runs {args.runs} (measured up to {max(runs_used)}; median {statistics.median(runs_used)})"
        )
        for k in limits:
            print(
                f"  {k}: pass rate before {before[k]}/{n}, after {after_pass[k]}/{n}; "
                f"decided after {decided[k]}/{n} (before: every session, by a point estimate)"
            )


def _key(note: str) -> str:
    return "tpot_ms" if note.startswith("decode TPOT median") else "ttft_p95_ms"


if __name__ == "__main__":
    main()
