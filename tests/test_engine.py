"""The llama.cpp engine on the tiny synthetic model: real inference, exact token counts,
independent runs, llama.cpp's own counters recorded, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmperf import EngineError, LlamaCppEngine, Workload, measure
from pytest_llmperf.engines.llama_cpp import split_prompt


def test_every_run_generates_exactly_max_tokens(tiny_engine) -> None:
    m = measure(tiny_engine, Workload(prompt_tokens=16, max_tokens=40, runs=4))
    assert [r.output_tokens for r in m.runs] == [40] * 4
    assert m.itl.count == 4 * 39


def test_native_counters_match_the_workload(tiny_engine) -> None:
    workload = Workload(prompt_tokens=48, max_tokens=20, runs=1, warmup=0)
    trace = tiny_engine.run(workload, 0)
    assert trace.prompt_tokens == 48
    assert trace.native.prefill_tokens == 48  # the whole prompt evaluated: nothing reused
    assert trace.native.decode_tokens == 19  # one decode per token after the first
    assert len(trace.token_ids) == 20
    # Without sampling in the loop (the default) the first token is ready when prefill is.
    assert trace.start_ns < trace.prefill_done_ns <= trace.token_ns[0]
    assert list(trace.token_ns) == sorted(trace.token_ns)


def test_runs_are_independent_no_prefix_reuse(tiny_engine) -> None:
    # The same 512-token prompt three times. llama.cpp's own counter says how many prompt
    # tokens it evaluated: with prefix reuse the later runs would evaluate ~none. And each run
    # starts from an empty KV cache: the greedy continuation is the same every time (a run
    # that saw the previous run's tokens would continue a different context). Counts and
    # tokens, not TTFT ratios, which a busy machine can push anywhere.
    workload = Workload(prompt_tokens=512, max_tokens=8, runs=3, warmup=0)
    traces = [tiny_engine.run(workload, i) for i in range(3)]
    assert [t.native.prefill_tokens for t in traces] == [512] * 3
    assert all(t.native.prefill_ms > 0 for t in traces)
    assert traces[1].token_ids == traces[0].token_ids == traces[2].token_ids


def test_long_prompt_is_split_without_single_token_tail(tiny_engine) -> None:
    assert split_prompt(1025, 512) == [(0, 512), (512, 511), (1023, 2)]
    assert split_prompt(10, 512) == [(0, 10)]
    trace = tiny_engine.run(Workload(prompt_tokens=tiny_engine.n_batch + 1, max_tokens=2, warmup=0), 0)
    assert trace.native.prefill_tokens == tiny_engine.n_batch + 1


def test_literal_prompt_is_tokenized_and_timed(tiny_engine) -> None:
    m = measure(tiny_engine, Workload(prompt="The quick brown fox jumps over the lazy dog", max_tokens=4, runs=2))
    assert m.prompt_tokens > 5
    assert all(r.tokenize_ms > 0 for r in m.runs)
    assert all(r.ttft_ms >= r.tokenize_ms + r.prefill_ms for r in m.runs)


def test_engine_info(tiny_engine) -> None:
    info = tiny_engine.info()
    assert info.engine == "llama.cpp"
    assert info.n_layer == 4 and info.quantization == "F32"
    assert info.model_size_bytes > 1_000_000 and info.threads >= 1
    assert info.load_ms > 0 and info.native_load_ms > 0
    assert info.backend_version


def test_context_too_small_is_a_clear_error(tiny_engine) -> None:
    with pytest.raises(EngineError, match=r"context too small: 2000 prompt \+ 100 generated tokens > n_ctx 2048"):
        tiny_engine.run(Workload(prompt_tokens=2000, max_tokens=100), 0)


def test_missing_model(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="model file not found: .*nope.gguf; give a GGUF path or a preset"):
        LlamaCppEngine(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("definitely not a model")
    with pytest.raises(EngineError, match="not a GGUF model file"):
        LlamaCppEngine(bogus)


def test_truncated_gguf(tmp_path: Path, tiny_model_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_model_path.read_bytes()[:100_000])
    with pytest.raises(EngineError, match="llama.cpp could not load"):
        LlamaCppEngine(broken)


def test_callable_engine_timestamps_each_item() -> None:
    import time

    def stream(prompt: str, max_tokens: int):
        time.sleep(0.02)
        for _ in range(max_tokens):
            time.sleep(0.005)
            yield "tok"

    m = measure(stream, Workload(prompt="hi", max_tokens=5, runs=2, warmup=0))
    assert m.engine.engine == "callable" and m.engine.model == "stream"
    assert m.output_tokens == 5
    assert m.ttft_ms >= 25  # sleeps never end early; a busy machine only adds
    # Each item timed as it arrives: >= its 5 ms sleep. The upper bound only rules out gaps
    # that are not one sleep (e.g. the first token's 20 ms counted in): 40x room for noise.
    assert 4.5 <= m.itl.p50_ms < 200
    assert m.prefill_ms is None and m.native_decode_ms_per_token is None


def test_callable_engine_too_few_tokens() -> None:
    with pytest.raises(EngineError, match="yielded 1 token"):
        measure(lambda prompt, n: iter(["only"]), Workload(runs=1, warmup=0))


# -- one timed loop: plain runs and per-layer timing -------------------------------------------


def test_layer_timing_drives_the_engines_timed_loop(tiny_engine) -> None:
    """Per-layer timing runs the engine's own timed loop (``timed_decode``) on its instrumented
    context: every step's events lie inside the loop's clock reads, each step holds one event per
    layer plus the head, and no module but the loops' (the engine's, the watch of a user's Llama)
    synchronizes llama.cpp in a timed region or reaches into the engine's private attributes."""
    import ast

    from pytest_llmperf.measuring.layers import LayerTimer

    workload = Workload(prompt_tokens=16, max_tokens=6, runs=1, warmup=0)
    timer = LayerTimer(tiny_engine, workload)
    try:
        prefill, decode, tpot_ms = timer.run()
    finally:
        timer.close()
    n_layer = tiny_engine.info().n_layer
    assert len(prefill) == 1 and len(decode) == workload.max_tokens - 1 and tpot_ms > 0
    for start, events, end in prefill + decode:
        assert [name for name, _ in events][-1] == b"result_output" and len(events) == n_layer + 1
        assert start < events[0][1] and events[-1][1] <= end
    assert [s for s, _, _ in decode[1:]] == [e for _, _, e in decode[:-1]]  # steps tile the loop's clock reads

    package = Path(__file__).resolve().parent.parent / "pytest_llmperf"
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        # The timed loops: the engine's, and the watch around a user's Llama (its prompt's logits
        # ready, once per run, inside the user's own loop: engines/user_llama.py).
        assert "llama_synchronize" not in attrs or path.name in ("llama_cpp.py", "user_llama.py"), path
        if path.name not in ("llama_cpp.py", "llama_cpp_native.py"):
            private = {
                n.attr
                for n in ast.walk(tree)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "engine"
                and n.attr.startswith("_")
            }
            assert not private, (path, private)
