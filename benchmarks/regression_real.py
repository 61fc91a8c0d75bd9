"""Verdicts on the real engine across separate processes, as a stored baseline is used.

    --save FILE          keep every record (JSON lines), to judge them again later
    --rejudge FILE       judge saved records with the current rule (no measuring)
    --baseline FILE      judge new sessions against a saved baseline record
    --baseline-sessions K  record the baseline in K sessions (rejudge: the first A/A ones)

    .venv/bin/python benchmarks/regression_real.py [--preset small] [--aa 20] [--threads 10]
        [--quant 10] [--busy 10] [--runs 20]

One process records the baseline (llama.cpp, the preset in F16, all usable threads); then
each later session is a fresh process that measures and writes its record (with the machine
reference probe), and is judged against that baseline by ``regression.judge`` with the family
of one test (3 judged metrics):

  A/A      the same configuration: no REGRESSION may come out
  threads  one thread instead of all: decode and prefill REGRESSION expected
  quant    the same shape in Q8_0: prefill REGRESSION, decode IMPROVED expected (on this CPU)
  busy     the same configuration while another process keeps one core busy: no REGRESSION
           unless the machine is named as the cause (MACHINE_SLOWER)

Prints every session's verdicts and a count per scenario, and the correlation between the
reference probe's ratio and the prefill/decode ratios over all A/A and busy sessions.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.regression import STEAL_MACHINE_SHARE, CompareSettings, carry_history, judge, steal_share

SESSION = r"""
import json, sys
from pytest_llmperf import LlamaCppEngine, Workload, measure
from pytest_llmperf.models.gguf import PRESETS, ensure_model
from pytest_llmperf.core.fingerprint import Fingerprint, hardware, subject
from pytest_llmperf.baselines.records import stored
from pytest_llmperf.measuring.roofline import probe_reference
import dataclasses
preset, dtype, threads, runs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
spec = PRESETS[preset]
if dtype != spec.dtype:
    spec = dataclasses.replace(spec, dtype=dtype, name=f"{spec.name}-{dtype.lower()}")
engine = LlamaCppEngine(ensure_model(spec), threads=threads or None)
m = measure(engine, Workload(prompt_tokens=128, max_tokens=48, runs=runs, warmup=1))
rec = stored(m, Fingerprint(hardware(), subject(m.engine)), commit=None, recorded_at="").to_json()
rec["reference"] = probe_reference()
open(out, "w").write(json.dumps(rec))
"""


def session(args, dtype: str, threads: int, busy: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            subprocess.run(
                [sys.executable, "-c", SESSION, args.preset, dtype, str(threads), str(args.runs), str(out)],
                check=True,
                cwd=ROOT,
                timeout=600,
            )
        finally:
            if hog:
                hog.kill()
                hog.wait()
        return json.loads(out.read_text())


def probe_ms(rec: dict) -> float:
    return float(np.quantile(rec["reference"]["runs_ms"], 0.1))


def ratio(base: dict, cand: dict, name: str) -> float:
    return float(np.median(cand["runs"][name]) / np.median(base["runs"][name]))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--aa", type=int, default=20)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--quant", type=int, default=10)
    parser.add_argument("--busy", type=int, default=10)
    parser.add_argument("--save", type=Path, help="append every record to this JSON-lines file")
    parser.add_argument("--rejudge", type=Path, help="judge the records saved by --save again (no measuring)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a baseline record saved by --save (its first line): "
        "judge new sessions against it instead of recording one",
    )
    parser.add_argument(
        "--baseline-sessions",
        type=int,
        default=1,
        help="record the baseline in this many separate sessions (with --rejudge: the first "
        "A/A sessions become the baseline's older sessions)",
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()
    # Terminated: unwind, so subprocess.run kills the session it waits for (an orphaned
    # session would measure side by side with the next run of this script).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    saved = iter(json.loads(line) for line in args.rejudge.read_text().splitlines()) if args.rejudge else None

    def measured(dtype: str, threads: int, busy: bool = False) -> dict:
        if saved is not None:
            rec = next(saved)
            machine = rec.get("machine") or {}
            if "involuntary_switches" in machine and "involuntary_switches_per_run" not in machine:
                # Saved before the per-run figure was recorded: 1 warm-up + the runs.
                machine["involuntary_switches_per_run"] = machine["involuntary_switches"] / (
                    len(rec["runs"]["ttft_ms"]) + 1
                )
            return rec
        rec = session(args, dtype, threads, busy)
        if args.save:
            with args.save.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
        return rec

    started = time.perf_counter()
    base = record_baseline(args, measured, saved is not None)
    settings = CompareSettings(family_size=3)
    print(
        f"baseline: {args.baseline_sessions} session(s), {args.preset} F16, threads {base['subject'].get('n_threads')}, "
        f"{len(base['runs']['ttft_ms'])} runs; "
        f"TTFT {np.median(base['runs']['ttft_ms']):.1f} ms, TPOT {np.median(base['runs']['tpot_ms']):.2f} ms, "
        f"reference {probe_ms(base):.2f} ms, steal {steal_share(Measurement.read(base)) or 0:.1%}"
    )
    scenarios = [
        ("A/A", "F16", 0, False, args.aa),
        ("threads 1", "F16", 1, False, args.threads),
        ("Q8_0", "Q8_0", 0, False, args.quant),
        ("busy core", "F16", 0, True, args.busy),
    ]
    probe: list[tuple[float, float, float]] = []
    for name, dtype, threads, busy, count in scenarios:
        tally = run_scenario(name, count, functools.partial(measured, dtype, threads, busy), base, settings, probe)
        print(f"{name}: " + ", ".join(f"{k} {n}/{count}" for k, n in sorted(tally.items())), flush=True)
    if len(probe) > 2:
        p = np.array(probe)
        print(
            f"reference probe vs engine over {len(p)} A/A and busy sessions: correlation with prefill "
            f"{np.corrcoef(p[:, 0], p[:, 1])[0, 1]:.2f}, with decode {np.corrcoef(p[:, 0], p[:, 2])[0, 1]:.2f}"
        )
    print(f"total {time.perf_counter() - started:.0f} s")


def record_baseline(args: argparse.Namespace, measured, rejudging: bool) -> dict:
    """The baseline record: given (--baseline), or recorded in --baseline-sessions sessions. A
    baseline recorded while the hypervisor took the CPU is re-recorded, as the plugin's note
    tells a user to (up to 5 tries)."""
    base = json.loads(args.baseline.read_text().splitlines()[0]) if args.baseline else None
    for k in range(0 if args.baseline else args.baseline_sessions):
        for attempt in range(5):
            rec = measured("F16", 0)
            stolen = steal_share(Measurement.read(rec)) or 0.0
            if stolen < STEAL_MACHINE_SHARE:
                break
            print(f"baseline attempt {attempt + 1}: steal {stolen:.0%} during its runs; re-recording", flush=True)
        base = carry_history(base and Measurement.read(base), Measurement.read(rec)).to_json()
        if k == 0 and rejudging and args.baseline_sessions > 1:
            args.aa -= args.baseline_sessions - 1  # the saved A/A sessions that became baseline sessions
    return base


def run_scenario(name: str, count: int, measured, base: dict, settings, probe: list) -> collections.Counter[str]:
    """``count`` sessions of one scenario, each judged against ``base`` and printed; the tally of
    verdicts per phase (``probe`` gains the A/A and busy sessions' reference-probe ratios)."""
    tally: collections.Counter[str] = collections.Counter()
    for i in range(count):
        cand = measured()
        v = judge({"hw": Measurement.read(base)}, "hw", Measurement.read(cand), settings)
        by = {c.metric: c for c in v.comparisons}
        cells = [
            f"{m} {by[m].verdict.value} {by[m].change_pct:+.1f}%"
            for m in ("ttft_ms", "tpot_ms", "itl_p95_ms")
            if m in by
        ]
        for m in ("ttft_ms", "tpot_ms"):
            tally[f"{by[m].phase} {by[m].verdict.value}"] += 1
        if name in ("A/A", "busy core") and v.machine_ratio:
            probe.append((v.machine_ratio, ratio(base, cand, "ttft_ms"), ratio(base, cand, "tpot_ms")))
        print(
            f"  {name:<9} {i + 1:>2}: {v.short:<24} reference {probe_ms(cand):.2f} ms "
            f"x{v.machine_ratio or float('nan'):.2f}, steal {steal_share(Measurement.read(cand)) or 0:.1%}, "
            f"{(cand.get('machine') or {}).get('involuntary_switches_per_run', float('nan')):.0f} invol. "
            "switches/run; " + "; ".join(cells),
            flush=True,
        )
    return tally


if __name__ == "__main__":
    main()
