"""Does the plugin measure what llama-bench measures? Side by side, pair by pair.

llama-bench is built from the llama.cpp sources vendored in the installed llama-cpp-python
sdist (same version; ``engines.servers``, cached). Each pair runs llama-bench
(``-t T -p P -n N -r R -o json``: pp P and tg N, R repetitions) and then, in this process, the
plugin's ``measure`` on the same model, threads and workload (R runs after 1 warm-up), for each
variant of the plugin's settings in a shuffled order. Printed per pair and as medians: the
plugin's prefill t/s / llama-bench's pp t/s, decode t/s / tg t/s (tg from an empty context, as
``-p P -n N`` runs it) and decode t/s / tg t/s at depth P (``-d P``: after a P-token prompt,
where the plugin's runs decode).

Variants, one cause at a time (``--variants``): ``old`` (the defaults before issue 15:
greedy sampling inside the decode loop, n_ctx 2048, flash attention off), ``nosample`` (old,
decode without the sampler between clock reads, as llama-bench's tg), ``ctx`` (nosample with
n_ctx = prompt + generated, as llama-bench sizes its context), ``fa`` (ctx with flash attention
on, what llama-bench's ``auto`` resolves to on CPU), ``default`` (the plugin's defaults now).

    .venv/bin/python benchmarks/llama_bench_agreement.py --preset small --pairs 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

from pytest_llmperf import Workload, ensure_model, measure
from pytest_llmperf.core.settings import ENGINE_DEFAULTS
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine

VARIANTS = {
    "old": {"sample": True, "n_ctx": 2048, "flash_attn": False},
    "nosample": {"sample": False, "n_ctx": 2048, "flash_attn": False},
    "ctx": {"sample": False, "n_ctx": None, "flash_attn": False},
    "fa": {"sample": False, "n_ctx": None, "flash_attn": True},
    "default": {k: ENGINE_DEFAULTS[k] for k in ("sample", "n_ctx", "flash_attn")},
}


def llama_bench(
    binary: Path, model: Path, threads: int, prompt: int, gen: int, reps: int
) -> tuple[float, float, float]:
    """(pp t/s, tg t/s from an empty context, tg t/s after ``prompt`` tokens), llama-bench's
    averages over its repetitions. ``-d 0,P``: tg at depth P decodes at the positions our runs
    decode at (after the prompt); plain tg starts at position 0 (the issue's ``-p P -n N``)."""
    out = subprocess.run(
        [
            str(binary),
            "-m",
            str(model),
            "-t",
            str(threads),
            "-p",
            str(prompt),
            "-n",
            str(gen),
            "-d",
            f"0,{prompt}",
            "-r",
            str(reps),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    rows = json.loads(out.stdout)

    def ts(n_prompt: int, n_gen: int, depth: int) -> float:
        return float(
            next(
                r["avg_ts"]
                for r in rows
                if (r["n_prompt"], r["n_gen"], r.get("n_depth", 0)) == (n_prompt, n_gen, depth)
            )
        )

    return ts(prompt, 0, 0), ts(0, gen, 0), ts(0, gen, prompt)


def load_state() -> str:
    with open("/proc/loadavg") as fh:
        return "load average " + " ".join(fh.read().split()[:3])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--model", default=None, help="a GGUF file instead of a preset")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--variants", default="default", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--llama-bench", default=None, help="llama-bench binary (default: built by engines.servers)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    if args.llama_bench:
        binary = Path(args.llama_bench)
    else:
        from pytest_llmperf.engines.servers import tool_path

        binary = tool_path("llama-bench")
    model = Path(args.model) if args.model else ensure_model(args.preset)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    workload = Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.reps, warmup=1)
    engines = {}
    for name in names:
        v = dict(VARIANTS[name])
        n_ctx = v.pop("n_ctx") or args.prompt_tokens + args.max_tokens
        engines[name] = LlamaCppEngine(model, threads=args.threads, n_ctx=n_ctx, mmap=True, **v)
    print(
        f"model {model.name}, threads {args.threads}, pp{args.prompt_tokens} tg{args.max_tokens}, "
        f"{args.reps} reps per side per pair, {args.pairs} pairs; {load_state()} at start; llama-bench {binary}"
    )
    rng = random.Random(args.seed)
    ratios: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    sampling: dict[str, list[float]] = {n: [] for n in names}
    d = args.prompt_tokens
    print(
        f"per pair: llama-bench pp{d}, tg{args.max_tokens}, tg{args.max_tokens}@d{d} t/s; per variant the "
        f"plugin's prefill/pp, decode/tg, decode/tg@d{d} ratios"
    )
    for i in range(args.pairs):
        order = list(names)
        rng.shuffle(order)
        bench_first = rng.random() < 0.5
        if bench_first:
            bench = llama_bench(binary, model, args.threads, args.prompt_tokens, args.max_tokens, args.reps)
        for name in order:
            m = measure(engines[name], workload)
            ratios[name].append((m.prefill_tps, m.decode_tps, m.decode_tps))
            if m.sampling_ms_per_token is not None:
                sampling[name].append(m.sampling_ms_per_token)
        if not bench_first:
            bench = llama_bench(binary, model, args.threads, args.prompt_tokens, args.max_tokens, args.reps)
        pp, tg, tgd = bench
        for name in names:
            p_, t_, _ = ratios[name][-1]
            ratios[name][-1] = (p_ / pp, t_ / tg, t_ / tgd)
        cells = "  ".join(f"{n} {r[0]:.3f}/{r[1]:.3f}/{r[2]:.3f}" for n in names for r in [ratios[n][-1]])
        print(f"pair {i + 1}: bench {pp:.1f} / {tg:.1f} / {tgd:.1f} t/s; {cells}", flush=True)
    print(f"{load_state()} at end")
    for name in names:
        pp_r, tg_r, tgd_r = (statistics.median(r[k] for r in ratios[name]) for k in range(3))
        s = (
            f", sampling {statistics.median(sampling[name]):.3f} ms/token (llama.cpp sampler counters)"
            if sampling[name]
            else ""
        )
        print(
            f"median plugin/llama-bench, {name} {VARIANTS[name]}: prefill/pp {pp_r:.3f}, decode/tg {tg_r:.3f}, "
            f"decode/tg@d{d} {tgd_r:.3f} ({args.pairs} pairs){s}"
        )
    for e in engines.values():
        e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
