"""Does our clock agree with llama.cpp's own counters? Prints per-run ratios measured/native.

    python benchmarks/fidelity.py [--preset small] [--runs 10] [--prompt-tokens 256] [--max-tokens 64]

Measured prefill: our clock around the prompt's llama_decode calls (+ synchronize); native:
llama.cpp's t_p_eval_ms. Measured decode: TPOT (mean ITL); native: t_eval_ms / n_eval.
Engine overhead per token = TPOT - native decode per token: the ctypes call, native sampling
and our loop.
"""

from __future__ import annotations

import argparse
import statistics

from pytest_llmperf import LlamaCppEngine, Workload, ensure_model, measure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    engine = LlamaCppEngine(ensure_model(args.preset), threads=args.threads)
    info = engine.info()
    print(f"model: {info.describe()}; threads {info.threads}; llama-cpp-python {info.backend_version}")
    m = measure(
        engine, Workload(prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.runs, warmup=1)
    )
    print(
        f"{'run':>3}  {'prefill ms':>10}  {'native':>8}  {'ratio':>6}  {'TPOT ms':>8}  {'native':>8}  {'ratio':>6}  {'overhead us/tok':>15}"
    )
    for i, r in enumerate(m.runs):
        print(
            f"{i:>3}  {r.prefill_ms:>10.2f}  {r.native_prefill_ms:>8.2f}  {r.prefill_ms / r.native_prefill_ms:>6.4f}"
            f"  {r.tpot_ms:>8.3f}  {r.native_decode_ms_per_token:>8.3f}  {r.tpot_ms / r.native_decode_ms_per_token:>6.4f}"
            f"  {r.overhead_ms_per_token * 1000:>15.1f}"
        )
    prefill = statistics.median(r.prefill_ms / r.native_prefill_ms for r in m.runs)
    decode = statistics.median(r.tpot_ms / r.native_decode_ms_per_token for r in m.runs)
    print(
        f"median over {m.n_runs} runs ({args.prompt_tokens} prompt tokens, {args.max_tokens} generated): "
        f"prefill measured/native {prefill:.4f}, decode measured/native {decode:.4f}, "
        f"engine overhead {m.overhead_ms_per_token * 1000:.1f} us/token "
        f"(TPOT {m.tpot_ms:.3f} ms, native {m.native_decode_ms_per_token:.3f} ms/token)"
    )


if __name__ == "__main__":
    main()
