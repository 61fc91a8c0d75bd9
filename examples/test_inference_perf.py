"""A performance suite as a user writes one: run it with ``python -m pytest examples``.

It measures the embedded synthetic model by default (no download); point it at your own
model with ``--llmperf-model path/to/model.gguf`` (or the bigger preset: ``small``). The
budgets here are loose enough for a 2-core CI runner with the tiny model.
"""

import pytest


# One line: the marker alone makes a measured test (default workload: 64-token synthetic
# prompt, 64 generated tokens, 20 runs after 1 warm-up).
@pytest.mark.llmperf(p95_ms=45, ttft_ms=500)
def test_decode_latency():
    pass


@pytest.mark.llmperf(prompt="Summarize the plot of Hamlet in three sentences.", max_tokens=32, runs=5)
def test_chat_turn(llmperf):
    m = llmperf.measure(ttft_ms=250, tpot_ms=30)
    assert m.output_tokens == 32  # EOS never ends a run early


@pytest.mark.llmperf(prompt_tokens=1024, max_tokens=16, runs=3, min_prefill_tps=500, ttft_p95_ms=5000)
def test_long_prompt_prefill():
    pass


def test_prompt_length_scaling(llmperf):
    short = llmperf.measure(prompt_tokens=64, max_tokens=16, runs=3, label="64 tokens")
    long = llmperf.measure(prompt_tokens=512, max_tokens=16, runs=3, label="512 tokens")
    assert long.ttft_ms > short.ttft_ms  # prefill grows with the prompt


# Where the time goes: time each layer (after the plain runs) and place decode on the
# roofline; the report's llmperf section shows the per-layer table and the verdict.
@pytest.mark.llmperf(layers=True, prompt_tokens=128, max_tokens=32, runs=5)
def test_where_the_time_goes(llmperf):
    m = llmperf.measure()
    assert m.layers.decode.n_layers == m.engine.n_layer
    # About 1 FLOP per byte of weights: never compute-bound. "memory-bound", or
    # "cache-resident" where the weights fit in the CPU's caches (the tiny model on many CPUs).
    assert m.roofline.decode.verdict in ("memory-bound", "cache-resident")
