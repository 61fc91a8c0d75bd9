"""What the engine worker costs per token: the same llama.cpp engine in process and in a worker
process, runs interleaved pair by pair (in process, worker, worker, in process, ...), one model.

    python benchmarks/worker_overhead.py [--model tiny|small|PATH] [--pairs 30] [--threads 1]

Prints per side the median TTFT and TPOT (ms) with the run count, and the paired ratios
worker / in-process (the A/B statistics of judge/ab: Hodges-Lehmann ratio with its 95% Wilcoxon CI). Both engines load the same file with the same settings; each gets
its warm-up runs first. The clock is read inside whichever process runs llama.cpp, so what
this measures is whatever the worker's boundary adds between two clock reads (it should be
nothing but scheduling noise) plus the effect of a second process on the caches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_llmperf import LlamaCppEngine, Workload
from pytest_llmperf.core.measurement import RunMetrics
from pytest_llmperf.engines.llama_cpp_native import EngineConfig
from pytest_llmperf.judge.paired import paired
from pytest_llmperf.measuring.metrics import run_metrics
from pytest_llmperf.measuring.worker import load_worker
from pytest_llmperf.models.gguf import model_path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    workload = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.pairs, warmup=2)
    path, _ = model_path(args.model)
    local = LlamaCppEngine(path, threads=args.threads)
    worker = load_worker(EngineConfig(model=str(path), threads=args.threads))
    try:
        for i in range(workload.warmup):
            local.run(workload, -1 - i)
            worker.run(workload, -1 - i)
        runs: dict[str, list[RunMetrics]] = {"in-process": [], "worker": []}
        for i in range(args.pairs):
            order = [("in-process", local), ("worker", worker)]
            if i % 2:
                order.reverse()
            for name, engine in order:
                runs[name].append(run_metrics(engine.run(workload, i)))
    finally:
        local.close()
        worker.close()
    print(
        f"model {path.name}, threads {args.threads}, {args.prompt_tokens} prompt + {args.max_tokens} generated "
        f"tokens, {args.pairs} interleaved pairs"
    )
    print(f"{'side':<12} {'TTFT ms':>10} {'TPOT ms':>10} {'runs':>5}")
    for name, rs in runs.items():
        print(
            f"{name:<12} {statistics.median(r.ttft_ms for r in rs):>10.4g} "
            f"{statistics.median(r.tpot_ms for r in rs):>10.4g} {len(rs):>5}"
        )
    for metric in ("ttft_ms", "tpot_ms"):
        a = [getattr(r, metric) for r in runs["in-process"]]
        b = [getattr(r, metric) for r in runs["worker"]]
        c = paired(metric, a, b)
        print(
            f"worker / in-process {metric}: {c.ratio:.4f} (95% CI {c.ci_low:.4f}..{c.ci_high:.4f}, "
            f"p={c.p_value:.2g}, {c.n_pairs} pairs; in-process {c.a_median:.4g} ms, worker {c.b_median:.4g} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
