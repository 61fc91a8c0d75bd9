"""Interleaved A/B on real llama.cpp, many sessions: do paired results hold on a busy machine?

Per session (small preset, synthetic prompt, ``--runs`` pairs after 1 warm-up each):

- A/A: two engines of identical settings (1 thread, as the project's tests run), ``max_slowdown=0.05``: budget failures, CIs that
  exclude 1;
- threads 2 vs 1: sessions whose prefill and decode CIs exclude 1 towards B slower;
- F16 vs Q8_0 of the same shape (1 thread): sessions with prefill slower and decode faster (CI beyond 1);
- ``--busy``: the same while another process keeps one core busy (``python -c "while True:
  pass"``, started and stopped by this script).

Against stored baselines: the same B/A ratio made as a baseline comparison would (B's median
in this session over A's median from the previous session, i.e. a recorded baseline): its
spread across sessions (sd of the log ratios) beside the paired ratios' spread.
Engines are loaded once and reused by every session (a session here is one compare_ab run).

    .venv/bin/python benchmarks/ab_sessions.py --sessions 10 --runs 10 --busy both
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import subprocess
import sys
import time

from pytest_llmperf import Workload, ensure_model
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine
from pytest_llmperf.judge.ab import Side, compare_ab
from pytest_llmperf.models.gguf import PRESETS


def load_state() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=10)
    p.add_argument("--runs", type=int, default=10, help="pairs per session")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--busy", choices=("no", "yes", "both"), default="both")
    p.add_argument("--comparisons", default="aa,threads,quant")
    p.add_argument("--preset", default="small")
    args = p.parse_args()

    chosen = [c.strip() for c in args.comparisons.split(",")]
    f16 = ensure_model(args.preset)
    e = {
        "t2": LlamaCppEngine(f16, threads=2, name="f16-t2"),
        "t1": LlamaCppEngine(f16, threads=1, name="f16-t1"),
        "t1b": LlamaCppEngine(f16, threads=1, name="f16-t1-copy"),
    }
    if "quant" in chosen:
        q8 = ensure_model(dataclasses.replace(PRESETS[args.preset], dtype="Q8_0"))
        e["q8"] = LlamaCppEngine(q8, threads=1, name="q8_0-t1")
    comparisons = {
        "aa": ("A/A f16 1 thread, two engines", "t1", "t1b", {"max_slowdown": 0.05}),
        "threads": ("threads 2 (A) vs 1 (B)", "t2", "t1", {}),
        "quant": ("F16 (A) vs Q8_0 (B), 1 thread", "t1", "q8", {}),
    }
    modes = {"no": [False], "yes": [True], "both": [False, True]}[args.busy]
    print(
        f"{args.preset} preset, pp{args.prompt_tokens} tg{args.max_tokens}, {args.runs} pairs per session, "
        f"{args.sessions} sessions per comparison and load; load average at start {load_state()}"
    )
    for busy in modes:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            time.sleep(1.0 if busy else 0.0)
            for key in chosen:
                title, a, b, budgets = comparisons[key]
                rows = []
                for s in range(args.sessions):
                    w = Workload(
                        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.runs, warmup=1, seed=s
                    )
                    r = compare_ab(Side(a, e[a]), Side(b, e[b]), w, **budgets)
                    rows.append(r)
                    print(
                        f"  [{'busy core' if busy else 'no extra load'}] {title} session {s + 1}: "
                        f"prefill {r.prefill.ratio:.3f} ({r.prefill.ci_low:.3f}..{r.prefill.ci_high:.3f}), "
                        f"decode {r.decode.ratio:.3f} ({r.decode.ci_low:.3f}..{r.decode.ci_high:.3f})"
                        f"{', BUDGET FAILED' if r.failed else ''}; load {load_state()}",
                        flush=True,
                    )
                summarize(title, key, rows, busy)
        finally:
            if hog is not None:
                hog.terminate()
                hog.wait()
    for engine in e.values():
        engine.close()
    return 0


def summarize(title: str, key: str, rows: list, busy: bool) -> None:
    n = len(rows)
    where = "one core busy" if busy else "no extra load"
    out = [f"{title} [{where}], {n} sessions:"]
    if key == "aa":
        out.append(f"budget failures at max_slowdown=0.05: {sum(bool(r.failed) for r in rows)} of {n}")
        for ph in ("prefill", "decode"):
            out.append(f"{ph} CI excludes 1: {sum(r.get(ph).excludes_one for r in rows)} of {n}")
    elif key == "threads":
        for ph in ("prefill", "decode"):
            out.append(f"{ph}: B slower with the CI above 1: {sum(r.get(ph).ci_low > 1 for r in rows)} of {n}")
    else:
        out.append(f"prefill slower (CI above 1): {sum(r.prefill.ci_low > 1 for r in rows)} of {n}")
        out.append(f"decode faster (CI below 1): {sum(r.decode.ci_high < 1 for r in rows)} of {n}")
    for ph in ("prefill", "decode"):
        paired = [math.log(r.get(ph).ratio) for r in rows]
        # Through a stored baseline: B now against A recorded in the previous session.
        metric = "ttft_ms" if ph == "prefill" else "tpot_ms"
        stored = [math.log(getattr(rows[i].b, metric) / getattr(rows[i - 1].a, metric)) for i in range(1, n)]
        spread = lambda v: statistics.stdev(v) if len(v) > 1 else float("nan")
        out.append(
            f"{ph} B/A across sessions: paired median {math.exp(statistics.median(paired)):.3f}, sd of log "
            f"{spread(paired):.3f} (range {math.exp(min(paired)):.3f}..{math.exp(max(paired)):.3f}); through "
            f"stored baselines median {math.exp(statistics.median(stored)) if stored else float('nan'):.3f}, "
            f"sd of log {spread(stored):.3f}"
            + (f" (range {math.exp(min(stored)):.3f}..{math.exp(max(stored)):.3f})" if stored else "")
        )
    print("\n".join(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
