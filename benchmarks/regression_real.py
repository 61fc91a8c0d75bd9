"""Regression detection on the real engine: A/A false alarms and a real slowdown.

    python benchmarks/regression_real.py [--preset tiny] [--repeats 20] [--runs N]

A/A: the same configuration measured twice (baseline, then candidate), ``--repeats`` times;
every pair is compared with the plugin's statistics as one session of that many tests, and
the script counts REGRESSION verdicts (false alarms). Slowdown: a baseline with all threads
against a candidate with one thread; prints each metric's verdict (prefill and decode).
"""

from __future__ import annotations

import argparse
import collections
import time

from pytest_llmperf import LlamaCppEngine, Workload, ensure_model, measure
from pytest_llmperf.compare import METRICS, Verdict
from pytest_llmperf.engines.llama_cpp import default_threads
from pytest_llmperf.fingerprint import Fingerprint, hardware, subject
from pytest_llmperf.records import record
from pytest_llmperf.regression import CompareSettings, judge


def as_record(m, hw):
    return record(m, Fingerprint(hw, subject(m.engine)), commit=None, recorded_at="")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--runs", type=int, default=None, help="runs per measurement (default: Workload's)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    hw = hardware()
    workload = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens)
    if args.runs:
        workload = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.runs)
    engine = LlamaCppEngine(ensure_model(args.preset))
    print(f"model {engine.info().describe()}, threads {engine.info().n_threads}; workload: {workload.describe()}")

    started = time.perf_counter()
    pairs = []
    for _ in range(args.repeats):
        base = as_record(measure(engine, workload), hw)
        cand = as_record(measure(engine, workload), hw)
        pairs.append((base, cand))
    settings = CompareSettings(family_size=args.repeats * len(METRICS))
    counts: collections.Counter[str] = collections.Counter()
    alarms = []
    for i, (base, cand) in enumerate(pairs):
        verdict = judge({"hw": base}, "hw", cand, settings)
        for c in verdict.comparisons:
            counts[f"{c.metric}:{c.verdict.value}"] += 1
        alarms += [f"pair {i}: {line}" for line in verdict.failure_lines()]
    print(f"A/A: {args.repeats} pairs x {len(METRICS)} metrics as one session (Holm m={settings.family_size}), "
          f"{time.perf_counter() - started:.0f} s")
    for metric in METRICS:
        row = {v.value: counts.get(f"{metric}:{v.value}", 0) for v in Verdict}
        print(f"  {metric:<12} " + "  ".join(f"{k} {n}" for k, n in row.items() if n))
    print(f"A/A false alarms (REGRESSION verdicts): {len(alarms)} of {args.repeats * len(METRICS)} comparisons; "
          f"pairs with any: {len({a.split(':')[0] for a in alarms})} of {args.repeats}")
    for a in alarms:
        print("  " + a)
    engine.close()

    threads = default_threads()
    if threads < 2:
        print("slowdown check skipped: needs 2 CPUs")
        return
    base_engine = LlamaCppEngine(ensure_model(args.preset), n_threads=threads)
    base = as_record(measure(base_engine, workload), hw)
    base_engine.close()
    slow_engine = LlamaCppEngine(ensure_model(args.preset), n_threads=1)
    cand = as_record(measure(slow_engine, workload), hw)
    slow_engine.close()
    verdict = judge({"hw": base}, "hw", cand, CompareSettings(family_size=len(METRICS)))
    print(f"slowdown: threads {threads} -> 1")
    for c in verdict.comparisons:
        print(f"  {c.phase:<8} {c.label:<14} {c.verdict.value:<12} {c.change_pct:+.1f}%  p={c.p_adjusted}")
    for line in verdict.failure_lines():
        print("  " + line)


if __name__ == "__main__":
    main()
