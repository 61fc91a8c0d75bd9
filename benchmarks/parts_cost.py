"""What reading the fixtures' Llama's counters around each run costs a measured callable: the
same callable (``Llama.generate``, token by token, on one ``llama_cpp.Llama``) measured as today
(``CallableEngine(fn)``) and with the counter source (``CallableEngine(fn, counters=LlamaCounters(llm))``),
runs interleaved (each round the three sides below in a rotating order), one model, one process.
A third side, the plain callable again ("plain-again"), is the A/A control: its ratio to
"plain" is the noise floor of this machine, against which the counted ratio is read.

    python benchmarks/parts_cost.py [--model tiny|small|PATH] [--pairs 90] [--threads 1]

Prints per side the median TTFT and TPOT (ms) with the run count, the paired ratios counted /
plain (the A/B statistics of judge/ab: Hodges-Lehmann ratio with its 95% Wilcoxon CI, and the
pair count), the wall time of a whole run (the counters are read outside the timed region, so
only this can show them), and one reading's cost on its own. The counters are read before the
run's first clock read and after its last one: TPOT and TTFT should not move (goal: at most 1%).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_llmperf import LlamaCppEngine, Workload
from pytest_llmperf.core.measurement import RunMetrics
from pytest_llmperf.engines import CallableEngine
from pytest_llmperf.engines.llama_cpp import LlamaCounters
from pytest_llmperf.judge.paired import paired
from pytest_llmperf.measuring.metrics import run_metrics
from pytest_llmperf.models.gguf import model_path


def stream(llm):
    """Token by token (``Llama.generate``): the tiny model's byte tokens make
    ``create_completion``'s chunks wait for whole UTF-8 characters, so its stream has no token gaps."""

    def fn(prompt: str, max_tokens: int):
        for i, token in enumerate(llm.generate(llm.tokenize(prompt.encode()), temp=0.0)):
            yield token
            if i + 1 == max_tokens:
                return

    return fn


def read_cost_us(counters: LlamaCounters, n: int = 20000) -> float:
    """One ``read()`` and one ``between()`` (what a run adds: two reads and a diff), microseconds."""
    started = time.perf_counter_ns()
    for _ in range(n):
        counters.between(counters.read(), counters.read())
    return (time.perf_counter_ns() - started) / n / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--pairs", type=int, default=90, help="rounds (each runs every side once)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    workload = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.pairs, warmup=2)
    path, _ = model_path(args.model)
    engine = LlamaCppEngine(path, threads=args.threads)
    llm = engine.llm
    counters = LlamaCounters(llm)
    sides = {
        "plain": CallableEngine(stream(llm)),
        "counted": CallableEngine(stream(llm), counters=counters),
        "plain-again": CallableEngine(stream(llm)),  # the A/A control
    }
    runs: dict[str, list[RunMetrics]] = {name: [] for name in sides}
    wall_ms: dict[str, list[float]] = {name: [] for name in sides}
    moved = 0
    try:
        for i in range(workload.warmup):
            for side in sides.values():
                side.run(workload, -1 - i)
        for i in range(args.pairs):
            order = list(sides.items())
            order = order[i % 3 :] + order[: i % 3]
            if (i // 3) % 2:
                order.reverse()
            for name, side in order:
                started = time.perf_counter_ns()
                trace = side.run(workload, i)
                wall_ms[name].append((time.perf_counter_ns() - started) / 1e6)
                runs[name].append(run_metrics(trace))
                moved += name == "counted" and trace.native is not None
        one_read = read_cost_us(counters)
    finally:
        engine.close()
    tokens = statistics.median(r.output_tokens for r in runs["counted"])
    print(
        f"model {path.name}, threads {args.threads}, {args.prompt_tokens} prompt + {args.max_tokens} generated "
        f"tokens, {args.pairs} interleaved rounds; counted runs with llama.cpp counters: {moved} of {args.pairs}"
    )
    print(f"{'side':<12} {'TTFT ms':>10} {'TPOT ms':>10} {'run wall ms':>12} {'runs':>5}")
    for name, rs in runs.items():
        print(
            f"{name:<12} {statistics.median(r.ttft_ms for r in rs):>10.4g} "
            f"{statistics.median(r.tpot_ms for r in rs):>10.4g} {statistics.median(wall_ms[name]):>12.4g} {len(rs):>5}"
        )
    for b_name in ("counted", "plain-again"):
        for metric in ("tpot_ms", "ttft_ms"):
            a = [getattr(r, metric) for r in runs["plain"]]
            b = [getattr(r, metric) for r in runs[b_name]]
            c = paired(metric, a, b)
            print(
                f"{b_name} / plain {metric}: {c.ratio:.4f} (95% CI {c.ci_low:.4f}..{c.ci_high:.4f}, "
                f"{c.n_pairs} pairs; plain {c.a_median:.4g} ms, {b_name} {c.b_median:.4g} ms)"
            )
        c = paired("e2e_ms", wall_ms["plain"], wall_ms[b_name])  # the same statistics, a run's whole wall time
        print(
            f"{b_name} / plain run wall time: {c.ratio:.4f} (95% CI {c.ci_low:.4f}..{c.ci_high:.4f}, {c.n_pairs} pairs)"
        )
    print(
        f"one run's readings (2 reads + their difference), alone: {one_read:.1f} us, "
        f"{one_read / tokens:.2f} us per generated token ({tokens:.0f} tokens a run), outside the timed region; "
        f"{one_read / 1000 / statistics.median(wall_ms['counted']):.4%} of a run's wall time"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
