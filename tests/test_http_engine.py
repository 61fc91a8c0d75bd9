"""The HTTP streaming engine against a real llama.cpp server (llama-cpp-python's own, started
by the plugin's ``llmperf_server`` fixture on loopback with the tiny synthetic model)."""

from __future__ import annotations

import pytest

from pytest_llmperf import Workload, measure

#: A short literal prompt: the same text in process and through the server. (The server reuses
#: a cached prompt prefix between requests; with a short prompt that changes TTFT little.)
PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_stream_gives_exactly_max_tokens(llmperf_server, api):
    engine = llmperf_server.engine(api=api)
    m = measure(engine, Workload(prompt_tokens=8, max_tokens=24, runs=2, warmup=0))
    assert m.output_tokens == 24 and all(r.output_tokens == 24 for r in m.runs)
    info = m.engine
    assert info.engine == f"http {api}" and info.endpoint == llmperf_server.url
    # llama-cpp-python sends no usage in its stream, and events need not pair up with tokens.
    assert info.token_count in ("events", "finish_reason", "events+finish_reason")
    assert 0 < m.ttft_ms < m.e2e_ms and m.tpot_ms > 0
    engine.close()


def test_synthetic_prompts_differ_per_run(llmperf_server):
    engine = llmperf_server.engine()
    w = Workload(prompt_tokens=8, max_tokens=4)
    prompts = {engine.body(w, i)["prompt"] for i in (-2, -1, 0, 1)}  # warm-up runs have negative indices
    assert len(prompts) == 4
    assert engine.body(w, 0) == engine.body(w, 0)
    assert engine.body(w, 0)["min_tokens"] == 4 and engine.body(w, 0)["stream_options"] == {"include_usage": True}


def test_in_process_and_served_side_by_side(tiny_model_path, capsys):
    """Same workload, same threads, one after the other: the server adds latency per token.

    One thread each: llama.cpp's threads wait for each other at every operation, and on a
    small shared machine any other load turns that into long stalls."""
    from pytest_llmperf import LlamaCppEngine
    from pytest_llmperf.engines.servers import serve

    w = Workload(prompt=PROMPT, max_tokens=32, runs=5, warmup=1)
    engine = LlamaCppEngine(tiny_model_path, threads=1)
    try:
        local = measure(engine, w)
    finally:
        engine.close()
    with serve(tiny_model_path, threads=1) as server:
        served = measure(server.engine(), w)
    with capsys.disabled():
        print(
            f"\nin process: TTFT {local.ttft_ms:.2f} ms, TPOT {local.tpot_ms:.3f} ms; "
            f"served: TTFT {served.ttft_ms:.2f} ms, TPOT {served.tpot_ms:.3f} ms; "
            f"server overhead {served.tpot_ms - local.tpot_ms:+.3f} ms/token"
        )
    # Same workload, every run complete; speeds are not compared (the machine may be shared).
    assert served.output_tokens == local.output_tokens == 32
    assert served.n_runs == local.n_runs == 5 and served.workload == local.workload


SIDE_BY_SIDE = f"""
import pytest

@pytest.mark.llmperf(prompt={PROMPT!r}, max_tokens=16, runs=3, warmup=1)
def test_both(llmperf, llmperf_server):
    llmperf.measure(label="in-process")
    llmperf.measure(engine=llmperf_server.engine(), label="server")
"""


def test_report_shows_both_and_the_overhead(pytester):
    pytester.makepyfile(test_side=SIDE_BY_SIDE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--llmperf-threads=1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "test_both[[]in-process[]] *",  # ids shortened to fit 80 columns (--llmperf-columns)
            "test_both[[]server[]] *",
            "*test_side.py::test_both: in process TTFT * ms, TPOT * ms; served TTFT * ms, TPOT * ms; "
            "server overhead * ms/token*",
        ]
    )


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_chat_request_is_served_through_chat_completions(llmperf_server, api):
    """Messages go to /v1/chat/completions as they are, whatever the engine's API for prompts:
    the server renders the embedded model's own chat template, and the stream is measured."""
    engine = llmperf_server.engine(api=api)
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": PROMPT}]
    try:
        m = measure(engine, Workload(messages=messages, max_tokens=8, runs=2, warmup=0))
    finally:
        engine.close()
    assert m.output_tokens == 8 and all(r.output_tokens == 8 for r in m.runs)
    assert 0 < m.ttft_ms < m.e2e_ms


def test_a_load_request_finds_where_it_goes_once(llmperf_server, monkeypatch):
    """A load test's request (``arun``) computes its target (API, URL) once, and a chat
    request of a load test still goes to /v1/chat/completions."""
    engine = llmperf_server.engine(api="completions")
    targets = []
    found = engine._target
    monkeypatch.setattr(engine, "_target", lambda workload: targets.append(workload) or found(workload))
    messages = [{"role": "user", "content": PROMPT}]
    try:
        m = measure(engine, Workload(messages=messages, max_tokens=4, requests=3, concurrency=1, warmup=0))
    finally:
        engine.close()
    assert m.load is not None and m.load.n_ok == 3
    assert len(targets) == 3
