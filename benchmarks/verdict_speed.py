"""Cost of the verdict statistics: 1,000 comparisons of 20-run records against their baselines.

    .venv/bin/python benchmarks/verdict_speed.py [--tests 1000] [--runs 20]

Each comparison is one ``regression.judge`` call (3 judged metrics, the 2 TPS mirrors, the
machine reference), as the plugin makes once per measured test. Prints the total and the time
per test; the target is 1,000 in <= 2 s on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.regression import CompareSettings, judge, suite_check
from pytest_llmperf.judge.result import MeasurementResult


def record(rng: np.random.Generator, runs: int) -> dict:
    tpot = 10 * np.exp(rng.normal(0, 0.03, runs))
    ttft = 150 * np.exp(rng.normal(0, 0.03, runs))
    return {
        "workload": {"prompt_tokens": 128, "max_tokens": 48},
        "subject": {},
        "runs": {
            "tpot_ms": list(tpot),
            "decode_tps": list(1000 / tpot),
            "ttft_ms": list(ttft),
            "prefill_tps": list(128000 / ttft),
            "itl_p95_ms": list(tpot * 1.2),
        },
        "reference": {"kind": "numpy-sgemm-384", "runs_ms": list(rng.uniform(0.7, 0.8, 15))},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tests", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    pairs = [
        (Measurement.read(record(rng, args.runs)), Measurement.read(record(rng, args.runs))) for _ in range(args.tests)
    ]
    settings = CompareSettings(family_size=3 * args.tests, peers=args.tests)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        verdicts = [judge({"hw": base}, "hw", cand, settings) for base, cand in pairs]
        best = min(best, time.perf_counter() - started)
    print(
        f"{args.tests} comparisons ({args.runs} runs a side): {best:.2f} s, best of 3 "
        f"({best / args.tests * 1000:.2f} ms per test)"
    )
    # The session-end step, on the results as the plugin holds them (judge.result).
    results = [MeasurementResult(test=f"t{i}", verdict=v) for i, v in enumerate(verdicts)]
    started = time.perf_counter()
    suite_check(results, settings)
    print(f"session-end suite-relative check over the {args.tests}: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
