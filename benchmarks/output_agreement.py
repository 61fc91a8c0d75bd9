"""Output agreement on real llama.cpp: A/A, F16 vs Q8_0 of one model, F16 vs other weights.

The figures an A/B reports (``measuring.agreement``), computed on engines loaded once, outside
every timed region: per comparison, the positions and prompts, top-1 agreement and KL(P_A || P_B)
(mean, p99, max; A the base, teacher-forced on A's greedy tokens), greedy parity and the first
divergence. Q8_0 is the same seeded weights quantized (``models.gguf``), loaded without
repacking (the AMX repacked Q8_0 kernel crashes on this project's machine). For scale:
llama.cpp publishes, for LLaMA-3-8B against its F16, mean KL 0.0014 for Q8_0 and 0.031 for
Q4_K_M (llama-perplexity --kl-divergence; trained weights, real text).

``served``: F16 in process against the same file served by llama-server (its top-20
log-probabilities: the figures are ``approx (top-k=20)``).

    .venv/bin/python benchmarks/output_agreement.py --preset small --prompts 8 --prompt-tokens 64 --max-tokens 64
    .venv/bin/python benchmarks/output_agreement.py --comparisons served
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from typing import Any

from pytest_llmperf import Workload, ensure_model
from pytest_llmperf.engines.http import HttpEngine
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine
from pytest_llmperf.engines.servers import serve_llama_server
from pytest_llmperf.judge.budgets import judge_agreement, parse_agreement_budgets
from pytest_llmperf.measuring.agreement import compare_outputs
from pytest_llmperf.models.gguf import PRESETS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--comparisons", default="aa,quant,seed", help="of aa, quant, seed, served")
    args = p.parse_args()
    chosen = {c.strip() for c in args.comparisons.split(",")}

    spec = PRESETS[args.preset]
    started = time.monotonic()
    paths = {
        "f16": ensure_model(dataclasses.replace(spec, dtype="F16")),
        "q8_0": ensure_model(dataclasses.replace(spec, dtype="Q8_0")),
        "seed1": ensure_model(dataclasses.replace(spec, dtype="F16", seed=1)),
    }
    print(f"models ready in {time.monotonic() - started:.0f} s")
    e: dict[str, Any] = {"f16": LlamaCppEngine(paths["f16"], threads=args.threads, name="f16")}
    if "aa" in chosen:
        e["f16b"] = LlamaCppEngine(paths["f16"], threads=args.threads, name="f16-copy")
    if "quant" in chosen:
        e["q8_0"] = LlamaCppEngine(paths["q8_0"], threads=args.threads, name="q8_0", repack=False)
    if "seed" in chosen:
        e["seed1"] = LlamaCppEngine(paths["seed1"], threads=args.threads, name="f16-seed1")
    stack = contextlib.ExitStack()
    if "served" in chosen:
        server = stack.enter_context(serve_llama_server(paths["f16"], parallel=1, threads=args.threads))
        e["served"] = HttpEngine(server.url)
    workload = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=1, warmup=0)
    ((budget, limit),) = parse_agreement_budgets(min_top1_agreement=0.9)
    print(
        f"preset {args.preset} ({spec.n_layer} layers, n_embd {spec.n_embd}, n_vocab {spec.n_vocab}), "
        f"{args.prompts} prompts of {args.prompt_tokens} tokens, {args.max_tokens} generated positions each, "
        f"{args.threads} thread(s)"
    )
    for title, a, b in (
        ("A/A: F16, two engines", "f16", "f16b"),
        ("F16 vs Q8_0 (same weights)", "f16", "q8_0"),
        ("F16 vs F16 of other weights (seed 1)", "f16", "seed1"),
        ("F16 in process vs the same F16 served by llama-server", "f16", "served"),
    ):
        if b not in e:
            continue
        t0 = time.monotonic()
        g = compare_outputs(e[a], e[b], workload, a_name=a, b_name=b, n_prompts=args.prompts)
        print(f"\n{title} ({time.monotonic() - t0:.1f} s)")
        for line in g.lines():
            print("  " + line)
        print(f"  exact figures: top-1 {g.top1_agreement!r}, KL mean {g.kl_mean!r}, p99 {g.kl_p99!r}")
        print(f"  first divergence per prompt: {list(g.first_divergence)}")
        print("  " + judge_agreement(budget, limit, g).line(a, b))
    for engine in e.values():
        engine.close()
    stack.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
