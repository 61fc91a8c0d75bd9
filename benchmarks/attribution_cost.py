"""What the attribution pass costs, how its node times add up to the step, and what it reads on
two known changes.

    python benchmarks/attribution_cost.py [--models tiny,small] [--threads 1] [--repeats 3]
        [--prompt-tokens 32] [--max-tokens 16] [--no-readings]

Per model: the pass (``measuring.attribution.attribute``: one warm-up, then 5 instrumented runs,
each with an interleaved plain run) repeated ``--repeats`` times on a fresh engine, printing
its wall time, the instrumented / plain step time (the instrumentation's cost) and the share
of the instrumented step the node times cover, per phase (median and range over the repeats).
Then, unless ``--no-readings``: the reading of two known changes, both sides' passes interleaved
run by run as an A/B runs them: one block 16x wider (tests/test_attribution.py's six-equal
against slow-layer) and threads 1 -> 2 on each model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_llmperf import LlamaCppEngine, Workload
from pytest_llmperf.core.measurement import Attribution
from pytest_llmperf.judge.attribution import compare_attributions
from pytest_llmperf.measuring.attribution import AttributionPass, attribute, interleaved
from pytest_llmperf.measuring.interleave import pass_orders
from pytest_llmperf.models.gguf import ModelSpec, ensure_model, model_path

SLOW_LAYER = ModelSpec(name="slow-layer", n_layer=6, n_embd=256, n_ff=512, layer_ff=(512, 512, 512, 8192, 512, 512))
SIX_EQUAL = ModelSpec(name="six-equal", n_layer=6, n_embd=256, n_ff=512)


def passes(path: Path, threads: int, workload: Workload, repeats: int) -> list[Attribution]:
    engine = LlamaCppEngine(path, threads=threads)
    try:
        return [attribute(engine, workload) for _ in range(repeats)]
    finally:
        engine.close()


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}..{max(values):{fmt}})"


def cost_rows(name: str, got: list[Attribution]) -> list[str]:
    rows = [f"{name}: pass wall time {spread([a.wall_s for a in got], '.2f')} s"]
    for phase in ("prefill", "decode"):
        ratios = [r for a in got if (r := getattr(a, f"{phase}_overhead_ratio")) is not None]
        cover = [a.phase(phase).coverage for a in got]
        steps = [a.phase(phase).step_ms for a in got]
        nodes = got[0].phase(phase).nodes
        rows.append(
            f"  {phase}: instrumented/plain x{spread(ratios, '.2f')}; node times cover "
            f"{spread([c * 100 for c in cover], '.0f')}% of the {spread(steps, '.3g')} ms step; {nodes} nodes"
        )
    return rows


def reading(title: str, a: LlamaCppEngine, b: LlamaCppEngine, workload: Workload) -> list[str]:
    """Both passes interleaved run by run, as an A/B runs them; the engines closed after."""
    try:
        got = interleaved({"A": AttributionPass(a, workload), "B": AttributionPass(b, workload)}, *pass_orders(0))
    finally:
        a.close()
        b.close()
    change = compare_attributions(got["A"], got["B"], reason="benchmark")
    return [title, *(f"  {p}: {change.phase(p).reading}" for p in ("prefill", "decode"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--no-readings", action="store_true")
    args = parser.parse_args()
    workload = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=5)
    models = args.models.split(",")
    print(f"pp{args.prompt_tokens} tg{args.max_tokens}, threads {args.threads}, {args.repeats} passes per model")
    for name in models:
        path, _ = model_path(name)
        for line in cost_rows(name, passes(path, args.threads, workload, args.repeats)):
            print(line, flush=True)
    if args.no_readings:
        return 0
    short = Workload(prompt_tokens=args.prompt_tokens, max_tokens=8, runs=5)
    equal, wider = (LlamaCppEngine(ensure_model(s), threads=args.threads) for s in (SIX_EQUAL, SLOW_LAYER))
    for line in reading("six-equal -> slow-layer (block 3's FFN 16x as wide):", equal, wider, short):
        print(line, flush=True)
    for name in models:
        path, _ = model_path(name)
        one, two = (LlamaCppEngine(path, threads=t) for t in (1, 2))
        for line in reading(f"{name}: threads 1 -> 2:", one, two, workload):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
