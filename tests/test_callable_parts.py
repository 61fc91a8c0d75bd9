"""The parts of each phase for a measured callable: one that drives the fixtures' ``Llama`` gets
llama.cpp's own time (its counters, read around each run) and the time outside llama.cpp, as
the plugin's engine does; one that does not is told so in one line.

Nothing here asserts a timing: the parts add up to TTFT and TPOT by construction (checked to
float rounding), agree with llama.cpp's counters read directly, and 5 ms of busy work per token
in a wrapper lands outside llama.cpp (a margin far above any noise)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import time

import pytest
from inner import run
from test_against import Runner, make_repo
from test_refs import _git_identity  # noqa: F401  (an autouse fixture, here too)

from pytest_llmperf import Workload, measure
from pytest_llmperf.core import progress
from pytest_llmperf.engines import CallableEngine, synthetic_text
from pytest_llmperf.engines.llama_cpp import LlamaCounters
from pytest_llmperf.engines.user_llama import LlamaWatch
from pytest_llmperf.reports.text import metrics_table

W = Workload(prompt_tokens=16, max_tokens=8, runs=4, warmup=1)
NOT_MEASURED = (
    "parts: not measured: the callable drove no llama_cpp.Llama of this process (a remote client, another "
    "library); llama.cpp's own time cannot be split from it"
)


def watched(fn) -> CallableEngine:
    """A callable as ``llmperf.measure(fn)`` measures it: every Llama of the process watched."""
    return CallableEngine(fn, watch=LlamaWatch())


def stream(llm, busy_ms: float = 0.0):
    """The commonest test's wrapper: ``create_completion(stream=True)``, ``busy_ms`` of CPU work per chunk."""

    def fn(prompt: str, max_tokens: int):
        for chunk in llm.create_completion(prompt, max_tokens=max_tokens, stream=True, temperature=0.0):
            end = time.perf_counter() + busy_ms / 1000.0
            while time.perf_counter() < end:
                pass
            yield chunk

    return fn


def tokens(llm, busy_ms: float = 0.0):
    """A wrapper on ``Llama.generate``: each token handed on as made (no text held back), then
    ``busy_ms`` of CPU work per token before the next is asked for."""

    def fn(prompt: str, max_tokens: int):
        ids = llm.tokenize(prompt.encode())
        for i, token in enumerate(llm.generate(ids, temp=0.0)):
            end = time.perf_counter() + busy_ms / 1000.0
            while time.perf_counter() < end:
                pass
            yield token
            if i + 1 >= max_tokens:
                return

    return fn


@contextlib.contextmanager
def own_llama(model_path, **settings):
    """A ``Llama`` the test builds itself (one thread, quiet), closed after the block."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), n_threads=1, verbose=False, **settings)
    try:
        yield llm
    finally:
        llm.close()


def counted_run(engine: CallableEngine, counters: LlamaCounters, w: Workload):
    """A first run (warm), then one run between two readings of ``counters``: (before, trace, after)."""
    engine.run(w, -1)
    before = counters.read()
    trace = engine.run(w, 0)
    after = counters.read()
    assert before is not None and after is not None and trace.native is not None
    return before, trace, after


def no_llama(prompt: str, max_tokens: int):
    yield from range(max_tokens)


#: llama.cpp times each sample in whole microseconds, and the tiny model's greedy sample takes
#: under one (8 took 3 to 8 us here): 8 can all read 0 on a fast quiet machine (a fresh-clone
#: run did); 32 all reading 0 has odds of about 0.6**32.
W32 = dataclasses.replace(W, max_tokens=32)


def test_the_counters_of_one_run_are_llama_cpps_own(tiny_engine) -> None:
    llm, lib = tiny_engine.llm, tiny_engine.lib
    engine = watched(stream(llm))
    engine.run(W32, -1)  # a first run: the next one would find its prompt cached, were it not cleared
    lib.llama_perf_context_reset(llm._ctx.ctx)
    trace = engine.run(W32, 0)
    perf = lib.llama_perf_context(llm._ctx.ctx)
    native = trace.native
    assert native is not None and native.source.startswith("llama_perf_context") and native.sampled_in_run
    prompt = llm.tokenize(synthetic_text(16, W32.seed).encode())  # what the callable was given
    # Cold: the whole prompt evaluated again, none reused; its counters are the prompt's alone.
    assert trace.prompt_tokens == len(prompt) and trace.prompt_reused_tokens == 0
    assert native.prefill_tokens == perf.n_p_eval == len(prompt) and native.prefill_ms == pytest.approx(
        perf.t_p_eval_ms
    )
    # Decode: exactly the steps between the first and the last token (the last one is not evaluated).
    assert native.decode_tokens == perf.n_eval == W32.max_tokens - 1 and native.decode_ms == pytest.approx(
        perf.t_eval_ms
    )
    assert len(trace.token_ns) == W32.max_tokens and trace.prefill_done_ns <= trace.token_ns[0]
    # llama.cpp reports a count of 0 as 1: read as 0, a run after a reset counts from nothing.
    assert LlamaCounters(llm).between(LlamaCounters(llm).read(), LlamaCounters(llm).read()) is None
    # Sampling: the run's chain (llama-cpp-python makes one per generate call) kept llama.cpp's own
    # time, one sample per token, and that is the run's sampling, not a clock around ``sample``.
    chain = lib.llama_perf_sampler(llm._sampler.sampler)
    assert chain.n_sample == native.sample_count == W32.max_tokens and chain.t_sample_ms > 0
    assert native.sample_ms == pytest.approx(chain.t_sample_ms)


def test_every_cold_run_evaluates_the_whole_prompt_and_warm_says_what_the_cache_gave(tiny_engine) -> None:
    llm = tiny_engine.llm
    cold = measure(watched(stream(llm)), W)
    n_prompt = len(llm.tokenize(synthetic_text(16, W.seed).encode()))
    for r in (*cold.warmup_runs, *cold.runs):
        assert r.prompt_tokens == n_prompt and r.prompt_reused_tokens == 0
        assert r.native_prefill_ms is not None and r.native_prefill_ms > 0
    warm = measure(watched(stream(llm)), dataclasses.replace(W, prompt_cache="warm"))
    for r in warm.runs:  # after the warm-up, the same prompt: all but the replayed last token reused
        assert r.prompt_tokens == n_prompt and r.prompt_reused_tokens == n_prompt - 1
    text = metrics_table(warm)
    assert text.count("prompt cache warm (kept between runs)") == 1
    assert f"1 / {n_prompt - 1}" in text  # evaluated / reused
    assert "prompt cache warm" not in metrics_table(cold)


def test_a_callable_on_the_fixtures_llama_gets_the_parts_and_they_add_up(tiny_engine) -> None:
    llm = tiny_engine.llm
    m = measure(watched(stream(llm)), W)
    for r in m.runs:
        assert r.native_decode_ms_per_token is not None and r.native_decode_ms_per_token > 0
        assert r.decode_outside_ms_per_token is not None and r.decode_outside_ms_per_token >= 0
        assert r.prefill_outside_ms is not None and r.prefill_outside_ms >= 0
        inside = r.native_decode_ms_per_token + (r.sampling_ms_per_token or 0.0)
        inside += r.python_sampling_ms_per_token or 0.0
        gaps = dict(r.clock_gaps)
        below = gaps.get("decode_outside_ms_per_token_gap", 0.0)
        assert math.isclose(inside + r.decode_outside_ms_per_token - below, r.tpot_ms, rel_tol=1e-9, abs_tol=1e-9)
        assert r.native_prefill_ms is not None
        total = r.tokenize_ms + r.native_prefill_ms + r.prefill_outside_ms - gaps.get("prefill_outside_ms_gap", 0.0)
        assert math.isclose(total, r.ttft_ms, rel_tol=1e-9, abs_tol=1e-9)
    text = metrics_table(m)
    for row in ("decode (llama.cpp) median", "decode outside llama.cpp median", "prefill outside llama.cpp median"):
        assert row in text
    assert "parts: not measured" not in text


def test_a_callable_that_does_not_call_the_llama_is_told_so_in_one_line(tiny_engine) -> None:
    llm = tiny_engine.llm
    engine = watched(no_llama)
    assert llm is not None and engine.run(W, 0).native is None  # the Llama did nothing
    text = metrics_table(measure(engine, W))
    assert text.count(NOT_MEASURED) == 1 and text.count("parts:") == 1
    for row in ("(llama.cpp)", "engine overhead", "outside llama.cpp median", "sampling"):
        assert row not in text


def test_work_per_token_in_the_wrapper_is_outside_llama_cpp(tiny_engine) -> None:
    """5 ms of busy work per token: the decode time outside llama.cpp grows by about that much,
    whatever the machine's load (the busy wait is at least 5 ms of wall time)."""
    llm = tiny_engine.llm
    plain = measure(watched(tokens(llm)), W)
    busy = measure(watched(tokens(llm, busy_ms=5.0)), W)
    assert plain.decode_outside_ms_per_token is not None and busy.decode_outside_ms_per_token is not None
    assert busy.decode_outside_ms_per_token - plain.decode_outside_ms_per_token > 2.5


def test_a_stream_that_holds_text_back_is_timed_by_its_tokens_and_its_delivery_is_a_figure(tiny_engine) -> None:
    """The embedded model's random byte tokens are incomplete UTF-8: ``create_completion(stream=True)``
    holds the text back and releases it at the end. Its tokens are timed where llama.cpp made them;
    what the stream did is said in one line, with the delivered figures."""
    llm = tiny_engine.llm
    m = measure(watched(stream(llm, busy_ms=5.0)), W)
    assert m.output_tokens == W.max_tokens  # tokens, not chunks
    assert m.delivered_items is not None and m.delivered_burst_tokens is not None
    assert m.delivered_e2e_ms is not None and m.delivered_e2e_ms >= m.e2e_ms
    if m.delivered_items != W.max_tokens or m.delivered_burst_tokens > 1:
        assert sum("your stream delivered" in line for line in m.token_notes) == 1
    for r in m.runs:  # the wrapper's 5 ms per item lies after each item, never between made tokens it held
        assert r.delivered_items is not None and r.delivered_e2e_ms >= r.e2e_ms


def test_a_stream_that_holds_text_back_on_purpose_is_named_with_its_bursts(tiny_engine) -> None:
    """A wrapper that buffers its stream and hands chunks on two at a time (as a detokenizer that
    waits for a word's end does): the tokens are still timed where llama.cpp made them, and what
    the caller received is said once, with the items and the largest burst."""
    llm = tiny_engine.llm
    items: list[int] = []  # per call, the items handed on

    def pairs(prompt: str, max_tokens: int):
        held = []
        items.append(0)
        for chunk in stream(llm)(prompt, max_tokens):
            held.append(chunk)
            if len(held) == 2:
                items[-1] += 1
                yield held
                held = []
        if held:
            items[-1] += 1
            yield held

    m = measure(watched(pairs), W)
    assert m.output_tokens == W.max_tokens  # tokens, not items
    # Each item but a last odd one holds two of the 8 tokens (a stream's closing chunk holds none).
    assert all(W.max_tokens // 2 <= n <= W.max_tokens // 2 + 1 for n in items)
    assert m.delivered_items in set(items) and m.delivered_burst_tokens == 2
    assert sum("your stream delivered" in line for line in m.token_notes) == 1
    for r in m.runs:
        assert r.delivered_items in set(items) and r.delivered_e2e_ms >= r.e2e_ms


def test_a_callable_that_yields_chunks_of_no_llama_is_told_its_items_are_not_tokens() -> None:
    def chunks(prompt: str, max_tokens: int):
        yield from ["ab"] * (max_tokens // 2)

    m = measure(watched(chunks), W)
    assert m.delivered_items is None and m.output_tokens == W.max_tokens // 2
    assert [line for line in m.token_notes if "its items are chunks" in line]


LLAMA_TESTS = """
import json, os
import pytest

W = dict(prompt_tokens=16, max_tokens=8, runs=3, warmup=1)


def wrapper(llm):
    def stream(prompt, max_tokens):
        yield from llm.create_completion(prompt, max_tokens=max_tokens, stream=True, temperature=0.0)
    return stream


def no_llama(prompt, max_tokens):
    yield from range(max_tokens)


@pytest.mark.llmperf(**W)
def test_wrapper(llmperf, llmperf_llm):
    m = llmperf.measure(wrapper(llmperf_llm))
    out = os.environ.get("PARTS_OUT")
    if out:  # each side of --llmperf-against writes what it measured
        side = json.loads(os.environ.get("LLMPERF_SIDE", "{}")).get("name", "here")
        with open(out, "a") as fh:
            fh.write(json.dumps({"side": side, "decode": m.native_decode_ms_per_token,
                                 "outside": m.decode_outside_ms_per_token}) + "\\n")


@pytest.mark.llmperf(**W)
def test_no_llama(llmperf, llmperf_llm):
    llmperf.measure(no_llama)
"""


def passed_section(lines: list[str], test: str) -> str:
    """``test``'s block of ``-rA``'s passes: from its ``____ test ____`` line to the next such
    line (a progress line that names the test, ``llmperf: ...::test: judging [2 s]``, is not it)."""
    start = lines.index(next(line for line in lines if re.fullmatch(rf"_+ {test} _+", line)))
    ends = [i for i, line in enumerate(lines) if i > start and re.fullmatch(r"_+ \S+ _+", line)]
    return "\n".join(lines[start : ends[0] if ends else len(lines)])


def test_the_plugin_hands_the_fixtures_llama_to_a_measured_callable(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # every step's progress line, as under load
    pytester.makepyfile(test_inner_callable_parts=LLAMA_TESTS)
    result = run(pytester, "-rA", "--llmperf-json", "session.json")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    wrapper_section = passed_section(result.stdout.lines, "test_wrapper")
    assert "decode outside llama.cpp median" in wrapper_section and "parts: not measured" not in wrapper_section
    assert out.count(NOT_MEASURED) == 1
    results = {r["test"].split("::")[1]: r for r in json.loads((pytester.path / "session.json").read_text())["results"]}
    parts = results["test_wrapper"]["record"]["parts"]
    assert parts["native_decode_ms_per_token"] and all(v > 0 for v in parts["native_decode_ms_per_token"])
    assert set(results["test_no_llama"]["record"].get("parts") or {}) <= {"tokenize_ms"}  # no llama.cpp part
    # The Llama's memory is the callable's too: llama.cpp's buffers, not rows of n/a.
    figures = results["test_wrapper"]["figures"]
    assert figures["kv_mib"] > 0 and figures["compute_mib"] > 0 and figures["model_buffer_mib"] > 0
    assert "KV buffer" in wrapper_section and "n/a" not in wrapper_section.split("KV buffer")[1].split("\n")[0]


def test_both_sides_of_against_split_a_callables_time(tmp_path, tiny_model_path) -> None:
    """Under ``--llmperf-against`` each side runs the test in its own process: its callable
    drives that process's ``llmperf_llm``, whose counters that side reads."""
    runner = Runner(tmp_path, tiny_model_path)
    repo = tmp_path / "repo"
    make_repo(repo, [("base", {"conftest.py": "", "tests/test_callable.py": LLAMA_TESTS})])
    written = tmp_path / "parts.jsonl"
    runner.env["PARTS_OUT"] = str(written)
    inner = runner.run(repo, "tests", "-rA", "--llmperf-against", "git:HEAD")
    assert inner.ret == 0, inner.out
    sides = {d["side"]: d for d in map(json.loads, written.read_text().splitlines())}
    assert set(sides) == {"REF", "current"}, sides
    for d in sides.values():
        assert d["decode"] is not None and d["decode"] > 0 and d["outside"] is not None, d
    assert inner.out.count(NOT_MEASURED) == 1  # the current side's report of test_no_llama
    runner.check_clean(repo, inner.pids)


def test_the_sides_of_a_compare_that_drive_the_fixtures_llama_get_the_parts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner_compare_parts=LLAMA_TESTS.split("@pytest.mark")[0]
        + """
def test_ab(llmperf, llmperf_llm):
    r = llmperf.compare(a=wrapper(llmperf_llm), b=no_llama, prompt_tokens=16, max_tokens=8, runs=3, warmup=1)
    assert r.a.native_decode_ms_per_token > 0 and r.a.decode_outside_ms_per_token is not None
    assert r.b.native_decode_ms_per_token is None
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_a_wrappers_extra_work_per_token_is_named_outside_llama_cpp_against_the_commit_before(
    tmp_path, tiny_model_path
) -> None:
    """The issue's red run, explained: the wrapper's 5 ms of work per token (``slow``) against
    the commit before; both sides' callables drive their ``llmperf_llm``, so the decode verdict
    says the time went outside llama.cpp."""
    from test_against import CONFTEST, VERDICT_TESTS, wrapper

    runner = Runner(tmp_path, tiny_model_path)
    repo = tmp_path / "repo"
    files = {"conftest.py": CONFTEST, "wrapper/__init__.py": wrapper(0.0), "tests/test_perf.py": VERDICT_TESTS}
    make_repo(repo, [("base", files), ("slow", {"wrapper/__init__.py": wrapper(5.0)})])
    inner = runner.run(repo, "tests", "-rA", "-k", "wrapper", "--llmperf-against", "git:HEAD~1")
    assert inner.ret == 1, inner.out
    lines = [line for line in inner.lines("where it went: decode TPOT +")]
    assert lines and "moved: outside llama.cpp +" in lines[0], inner.out
    runner.check_clean(repo, inner.pids)


def test_readings_differ_by_what_llama_cpp_did_between_them() -> None:
    from pytest_llmperf.engines.llama_cpp import LlamaReading

    counters = LlamaCounters(object())  # no llama-cpp-python context: nothing to read, nothing split
    assert counters.read() is None and counters.between(None, None) is None
    assert CallableEngine(no_llama, counters=counters).run(W, 0).native is None
    chain, new_chain = object(), object()
    before = LlamaReading(10.0, 16, 5.0, 8, chain, 1.0, 8)
    # The same sampler chain: its counts since ``before``; a new one (a new generate call): all of them.
    same = counters.between(before, LlamaReading(12.0, 20, 9.0, 16, chain, 3.0, 16))
    assert same is not None
    assert (same.prefill_ms, same.prefill_tokens, same.decode_ms, same.decode_tokens) == (2.0, 4, 4.0, 8)
    assert (same.sample_ms, same.sample_count) == (2.0, 8)
    fresh = counters.between(before, LlamaReading(10.0, 16, 9.0, 16, new_chain, 3.0, 8))
    assert fresh is not None and (fresh.sample_ms, fresh.sample_count, fresh.prefill_tokens) == (3.0, 8, 0)
    # A chain that keeps no time (llama-cpp-python's no_perf default): sampling has no figure.
    untimed = counters.between(before, LlamaReading(10.0, 16, 9.0, 16, new_chain, 0.0, 8))
    assert untimed is not None and untimed.sample_ms is None and untimed.sample_ms_per_token is None
    assert counters.between(before, before) is None  # nothing moved: the callable did not call this Llama


def test_sampling_is_llama_cpps_chain_and_a_logits_processor_is_pythons(tiny_engine) -> None:
    """A grammar's sampler is llama.cpp's sampling, named by it; 2 ms of work in a Python logits
    processor is the processors' part (at least 2 ms of wall time), not llama.cpp's, not "outside"."""
    import llama_cpp

    llm = tiny_engine.llm
    grammar = llama_cpp.LlamaGrammar.from_string("root ::= [a-z ]+", verbose=False)

    def busy(ids, scores):
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        return scores

    def completion(**kwargs):
        def fn(prompt: str, max_tokens: int):
            yield from llm.create_completion(prompt, max_tokens=max_tokens, stream=True, temperature=0.0, **kwargs)

        return fn

    w = Workload(prompt="hello there", max_tokens=8, runs=3, warmup=1)
    with_grammar = measure(watched(completion(grammar=grammar)), w)
    assert with_grammar.sampling_ms_per_token is not None and with_grammar.sampling_ms_per_token > 0
    assert all(r.sampler == "grammar" for r in with_grammar.runs)
    assert with_grammar.python_sampling_ms_per_token == 0.0  # measured: none ran
    processed = measure(watched(completion(logits_processor=llama_cpp.LogitsProcessorList([busy]))), w)
    assert processed.python_sampling_ms_per_token is not None and processed.python_sampling_ms_per_token >= 2.0
    for r in processed.runs:  # llama.cpp's chain time less the processors': the busy wait is not in it
        assert r.sampling_ms_per_token is not None and r.sampling_ms_per_token < r.python_sampling_ms_per_token
    text = metrics_table(processed)
    assert "logits processors / stopping criteria (Python)" in text


def test_the_paired_parts_name_a_grammars_sampling() -> None:
    from types import SimpleNamespace

    from pytest_llmperf.judge.parts import paired_parts

    def runs(sampler: str, sampling: float) -> list:
        return [
            SimpleNamespace(
                ttft_ms=10.0,
                tpot_ms=5.0 + sampling,
                tokenize_ms=0.1,
                native_prefill_ms=9.0 + 0.01 * i,
                prefill_outside_ms=0.9,
                native_decode_ms_per_token=5.0 + 0.001 * i,
                sampling_ms_per_token=sampling * (1 + 0.001 * i),
                python_sampling_ms_per_token=None,
                decode_outside_ms_per_token=0.1,
                sampler=sampler,
            )
            for i in range(10)
        ]

    parts = paired_parts(runs("", 0.01), runs("grammar", 2.0), alpha=0.01)
    assert [p.label for p in parts if p.metric == "sampling_ms_per_token"] == ["sampling (llama.cpp: grammar)"]


def pipeline(llm, *, before: int = 0, after: int = 0):
    """A pipeline's callable: ``before`` tokens of a router's generation on the same Llama first
    (``create_completion``, not streamed), then the answer streamed, then ``after`` tokens of a
    follow-up generation (a summary the caller never sees)."""

    def fn(prompt: str, max_tokens: int):
        if before:
            llm.create_completion("Classify this request: " + prompt, max_tokens=before, temperature=0.0)
        yield from llm.create_completion(prompt, max_tokens=max_tokens, stream=True, temperature=0.0)
        if after:
            llm.create_completion("Summarize: " + prompt, max_tokens=after, temperature=0.0)

    return fn


@pytest.mark.parametrize(("before", "after"), [(4, 0), (0, 4), (3, 3)])
def test_a_pipeline_of_generations_is_timed_by_the_one_that_made_the_most(tiny_engine, before, after) -> None:
    """A router's generation before the answer, or a follow-up after it, on the same Llama: the
    run's tokens, prompt and counters are the answer's (12 tokens asked, its own prompt), the
    router's time inside its TTFT (its llama.cpp time in the prompt eval, read from the counters),
    never its tokens among the answer's; the measurement says so in one line."""
    llm, lib = tiny_engine.llm, tiny_engine.lib
    w = dataclasses.replace(W, max_tokens=12)
    engine = watched(pipeline(llm, before=before, after=after))
    engine.run(w, -1)
    lib.llama_perf_context_reset(llm._ctx.ctx)
    trace = engine.run(w, 0)
    perf = lib.llama_perf_context(llm._ctx.ctx)
    native = trace.native
    assert native is not None and trace.generations == 1 + bool(before) + bool(after)
    answer = llm.tokenize(synthetic_text(16, w.seed).encode())
    assert len(trace.token_ns) == w.max_tokens and trace.prompt_tokens == len(answer)
    # Decode: the answer's steps alone (the last token is not evaluated), whatever ran around it.
    assert native.decode_tokens == w.max_tokens - 1
    # Before the answer's first token: every evaluation of the run so far (the router's prompt and
    # its decode steps, then what the answer's prompt did not find in the KV cache).
    evaluated = len(answer) - (trace.prompt_reused_tokens or 0)
    router = len(llm.tokenize(("Classify this request: " + synthetic_text(16, w.seed)).encode()))
    assert native.prefill_tokens == evaluated + (router + before - 1 if before else 0)
    # After its last token: the follow-up's evaluations, in the run's counters but in no figure.
    later = perf.n_p_eval + perf.n_eval - native.prefill_tokens - native.decode_tokens
    assert (later > 0) == bool(after), later
    assert trace.prefill_done_ns is not None and trace.prefill_done_ns <= trace.token_ns[0]
    m = measure(engine, w)
    assert m.output_tokens == w.max_tokens and all(r.generations == trace.generations for r in m.runs)
    notes = [n for n in m.token_notes if "llama.cpp generations per run" in n]
    assert len(notes) == 1 and f"{trace.generations} llama.cpp generations per run" in notes[0]
    assert notes[0] in metrics_table(m)


def test_one_generation_per_run_says_nothing_of_generations(tiny_engine) -> None:
    m = measure(watched(stream(tiny_engine.llm)), W)
    assert all(r.generations == 1 for r in m.runs)
    assert not any("generations" in n for n in m.token_notes)


def async_stream(llm):
    """The async wrapper of an async web stack: ``async def`` that yields each chunk."""

    async def fn(prompt: str, max_tokens: int):
        import asyncio

        for chunk in llm.create_completion(prompt, max_tokens=max_tokens, stream=True, temperature=0.0):
            yield chunk
            await asyncio.sleep(0)

    return fn


def test_an_async_generator_is_measured_like_a_generator(tiny_engine) -> None:
    """``async def fn(...): ... yield``: driven on an event loop of its own, its tokens timed
    where llama.cpp made them, its parts from the counters (it raised ``TypeError: 'async_generator'
    object is not iterable``); inside a running event loop (an async test) as well."""
    import asyncio

    llm = tiny_engine.llm
    m = measure(watched(async_stream(llm)), W)
    assert m.output_tokens == W.max_tokens and m.delivered_items is not None
    assert all(r.native_decode_ms_per_token is not None and r.prompt_reused_tokens == 0 for r in m.runs)

    async def in_a_test():
        return measure(watched(async_stream(llm)), W)

    inside = asyncio.run(in_a_test())
    assert inside.output_tokens == W.max_tokens and inside.n_runs == W.runs


def test_an_async_function_that_returns_once_is_one_line_saying_to_yield() -> None:
    from pytest_llmperf.core.errors import EngineError

    async def once(prompt: str, max_tokens: int):
        return prompt

    with pytest.raises(EngineError, match=r"^'once' is an async function that returns once: yield each token"):
        watched(once)


def test_an_async_generator_runs_run_by_run_where_pairs_pause_token_by_token(tiny_engine) -> None:
    from pytest_llmperf.core.errors import NotSteppable
    from pytest_llmperf.engines import SteppedCallableEngine

    engine = SteppedCallableEngine(async_stream(tiny_engine.llm), counters=LlamaCounters(tiny_engine.llm))
    with pytest.raises(NotSteppable, match="async generator"):
        engine.run_stepped(W, 0, lambda: None)
    assert len(engine.run(W, 0).token_ns) >= 2  # run by run it measures


def test_another_llamas_evaluations_before_the_first_token_are_llama_cpps_prefill(tiny_engine, tiny_model_path) -> None:
    """A retrieval step on an embedding model (a second Llama, ``embed``) before the answer: its
    evaluations are llama.cpp's time in the answer's TTFT, read from its own counters, not time
    outside llama.cpp (they were: 5.7 of a 7.7 ms TTFT called "outside llama.cpp")."""
    with own_llama(tiny_model_path, embedding=True, n_ctx=256) as embedder:
        llm = tiny_engine.llm

        def rag(prompt: str, max_tokens: int):
            embedder.embed(prompt * 4)
            yield from llm.create_completion(prompt, max_tokens=max_tokens, stream=True, temperature=0.0)

        before, trace, after = counted_run(watched(rag), LlamaCounters(embedder), W)
        embedded = after.prefill_tokens - before.prefill_tokens
        assert embedded > 0 and after.prefill_ms > before.prefill_ms
        answer = len(llm.tokenize(synthetic_text(16, W.seed).encode())) - (trace.prompt_reused_tokens or 0)
        assert trace.native.prefill_tokens == answer + embedded
        assert trace.native.prefill_ms >= after.prefill_ms - before.prefill_ms
        assert trace.generations == 1 and len(trace.token_ns) == W.max_tokens


def test_speculative_decoding_splits_llama_cpps_time_per_generated_token(tiny_model_path) -> None:
    """A draft model's guesses (llama-cpp-python's prompt lookup) make llama.cpp evaluate several
    tokens in one decode step: its decode time is then per generated token, the unit TPOT has
    (per evaluated token it read lower, and the rest was called outside llama.cpp)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    with own_llama(tiny_model_path, n_ctx=512, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4)) as llm:

        def fn(prompt: str, max_tokens: int):
            yield from llm.create_completion(prompt, max_tokens=max_tokens, stream=True, temperature=0.0)

        w = Workload(prompt="one two three " * 6, max_tokens=24, runs=2, warmup=0)
        first, trace, last = counted_run(watched(fn), LlamaCounters(llm), w)
        evaluated = (last.prefill_tokens + last.decode_tokens) - (first.prefill_tokens + first.decode_tokens)
        evaluated -= trace.native.prefill_tokens
        assert evaluated > len(trace.token_ns) - 1, "the draft model guessed no token: nothing to split"
        assert trace.native.decode_tokens == len(trace.token_ns) - 1


def test_a_prompt_beyond_the_users_llamas_context_is_one_line_saying_what_to_do(tiny_model_path) -> None:
    from pytest_llmperf.core.errors import EngineError

    with own_llama(tiny_model_path, n_ctx=64) as llm:
        engine = watched(stream(llm))
        with pytest.raises(
            EngineError, match=r"^Requested tokens \(\d+\) exceed context window of \d+; give that Llama"
        ):
            engine.run(dataclasses.replace(W, prompt_tokens=400), 0)


def test_a_llama_that_made_one_token_is_one_line_not_its_chunks_timed_as_tokens(tiny_engine) -> None:
    """The code asks its Llama for 1 token (or a stop sequence ends it): its stream's two chunks
    (the token, the finish) were timed as 2 tokens, and the line said it drove no Llama."""
    from pytest_llmperf.core.errors import EngineError

    llm = tiny_engine.llm

    def one(prompt: str, max_tokens: int):
        yield from llm.create_completion(prompt, max_tokens=1, stream=True, temperature=0.0)

    with pytest.raises(
        EngineError, match=r"drove llama_cpp.Llama .* but it made 1 token per run: decode needs at least 2"
    ):
        watched(one).run(W, 0)


def test_runs_that_end_early_are_said_with_their_token_counts(tiny_engine) -> None:
    """The code's own stop ends some runs early (here every other run asks half the tokens): the
    header says the runs' range, not the fewest as if every run made them, and one line says how
    many ended early (E2E follows the count)."""
    llm = tiny_engine.llm
    calls = [0]

    def stops(prompt: str, max_tokens: int):
        calls[0] += 1
        n = max_tokens if calls[0] % 2 else max_tokens // 2
        yield from llm.create_completion(prompt, max_tokens=n, stream=True, temperature=0.0)

    m = measure(watched(stops), W)
    assert sorted({r.output_tokens for r in m.runs}) == [W.max_tokens // 2, W.max_tokens]
    assert m.tokens_per_run == f"{W.max_tokens // 2} to {W.max_tokens}"
    text = metrics_table(m)
    assert f"{W.max_tokens // 2} to {W.max_tokens} generated per run" in text
    early = [n for n in m.token_notes if "runs made fewer than the" in n]
    assert len(early) == 1 and early[0].startswith(f"2 of 4 runs made fewer than the {W.max_tokens} tokens asked")
    assert not any("runs made fewer" in n for n in measure(watched(stream(llm)), W).token_notes)
