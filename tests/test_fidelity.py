"""Our clock agrees with llama.cpp's own counters for the same runs (the 134 M preset,
whose decode is memory-bound like a real model's)."""

from __future__ import annotations

from pytest_llmperf import Workload, measure


def test_measured_prefill_and_decode_agree_with_llama_cpp(small_engine) -> None:
    m = measure(small_engine, Workload(prompt_tokens=128, max_tokens=24, runs=5, warmup=1))
    prefill = [r.prefill_ms / r.native_prefill_ms for r in m.runs]
    decode = [r.tpot_ms / r.native_decode_ms_per_token for r in m.runs]
    # Measured includes what llama.cpp's counters cannot see (the ctypes call, sampling, our
    # loop), so every ratio is >= 1; the brief's bound for that overhead is 5%. Our overhead
    # is in every run; a preemption landing outside llama.cpp's counters is in some: the
    # least disturbed run (the smallest ratio) shows ours, whatever else the machine runs.
    assert all(v >= 1.0 for v in prefill + decode), (prefill, decode)
    assert min(prefill) < 1.05, prefill
    assert min(decode) < 1.05, decode
    assert all(r.output_tokens == 24 for r in m.runs)
