"""Load curve on llama.cpp's llama-server (continuous batching): output tok/s at concurrency 4
against concurrency 1, with per-request TTFT/TPOT, goodput and the server's own figures.

Levels are measured interleaved (1, 4, 1, 4, ...) on one server, so a change in the machine's
load hits both alike; the ratio is the median over rounds of (tok/s at 4) / (tok/s at 1) of
the same round. Every request's prompt is unique and sent with cache_prompt=false. A Poisson
run at a given rate closes the table.

    python benchmarks/served_load.py                      # small preset (F16), 4 slots, 3 rounds
    python benchmarks/served_load.py --dtype Q8_0         # the same model in Q8_0
    python benchmarks/served_load.py --model tiny --rounds 1 --requests 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="preset or GGUF path (default: small)")
    parser.add_argument("--dtype", default=None, help="weights of the preset: F16, F32 or Q8_0 (default: the preset's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=32, help="words per synthetic prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second for the last run")
    parser.add_argument("--ttft-ms", type=float, default=1000.0, help="TTFT SLO for goodput")
    parser.add_argument("--tpot-ms", type=float, default=50.0, help="TPOT SLO for goodput")
    args = parser.parse_args()

    import dataclasses
    import os

    from pytest_llmperf import Workload, ensure_model
    from pytest_llmperf.engines.servers import serve_llama_server
    from pytest_llmperf.measuring.served import measure_load
    from pytest_llmperf.models.gguf import PRESETS
    from pytest_llmperf.reports.text import curve_lines, curve_table

    levels = [int(v) for v in args.levels.split(",")]
    if args.model in PRESETS and not os.path.exists(args.model):
        spec = PRESETS[args.model]
        path = ensure_model(dataclasses.replace(spec, dtype=args.dtype) if args.dtype else spec)
    else:
        path = args.model
    slo = {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms}
    base = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, requests=args.requests, warmup=1)
    print(
        f"llama-server: {path}, {args.parallel} slots, {args.threads} threads; {args.requests} requests per level, "
        f"{args.prompt_tokens}-word prompts, {args.max_tokens} tokens each; {base.prompt_cache}"
    )
    print(f"machine load average before: {os.getloadavg()[0]:.2f} (2 shared cores: other work runs beside this)")
    rounds: list[dict[int, object]] = []
    first = 0
    with serve_llama_server(path, parallel=args.parallel, threads=args.threads) as server:
        engine = server.engine()
        for r in range(args.rounds):
            row = {}
            for c in levels:
                w = dataclasses.replace(base, concurrency=c)
                row[c] = measure_load(engine, w, label=f"concurrency {c}", slo=slo, first_index=first)
                first += w.n_requests + w.warmup
            rounds.append(row)
            print(f"\nround {r + 1}")
            print(curve_table(list(row.values())))
            for line in curve_lines(list(row.values())):
                print(line)
        poisson = measure_load(
            engine,
            dataclasses.replace(base, rate=args.rate, concurrency=args.parallel),
            label="poisson",
            slo=slo,
            first_index=first,
        )
        print(f"\nPoisson arrivals at {args.rate:g}/s (at most {args.parallel} in flight)")
        print(curve_table([poisson]))
        for line in curve_lines([poisson]):
            print(line)
        engine.close()
    lo, hi = min(levels), max(levels)
    ratios = [row[hi].load.output_tps / row[lo].load.output_tps for row in rounds]
    tps = {c: statistics.median(row[c].load.output_tps for row in rounds) for c in levels}
    print(f"\noutput tok/s median over {len(rounds)} rounds: " + ", ".join(f"c{c} {v:.1f}" for c, v in tps.items()))
    print(
        f"throughput ratio c{hi}/c{lo} per round: "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f"; median {statistics.median(ratios):.2f}"
    )
    print(f"machine load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
