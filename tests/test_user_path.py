"""The user's own code, measured as the plugin's engine is (issue 46): a wrapper on the fixtures'
Llama and a Llama the test builds itself, through the plugin as a user runs it.

Nothing here asserts a timing: the figures checked are token counts and llama.cpp's own
counters (the same on a busy machine), and what the reports say about them."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from inner import run

from pytest_llmperf import EngineError, Workload, measure
from pytest_llmperf.engines import CallableEngine
from pytest_llmperf.engines.user_llama import LlamaWatch, live_llamas

WRAPPER_TESTS = """
import os
import pytest

SYSTEM = "you are a helpful assistant. " * int(os.environ.get("SYSTEM_REPEAT", "0"))


def wrapper(llm):
    def fn(prompt, max_tokens):
        for chunk in llm.create_completion(SYSTEM + prompt, max_tokens=max_tokens, stream=True, temperature=0.0):
            yield chunk["choices"][0]["text"]
    return fn


@pytest.mark.llmperf(prompt="tell me a story", max_tokens=8, runs=5, warmup=1)
def test_wrapper(llmperf, llmperf_llm):
    llmperf.measure(wrapper(llmperf_llm))


@pytest.mark.llmperf(prompt="tell me a story", max_tokens=8, runs=5, warmup=1)
def test_own_llama(llmperf):
    import llama_cpp
    from pytest_llmperf import ensure_model

    llm = llama_cpp.Llama(
        model_path=str(ensure_model("tiny")), n_ctx=512, n_batch=int(os.environ.get("OWN_N_BATCH", "512")),
        n_threads=1, verbose=False,
    )
    llmperf.measure(wrapper(llm))
"""


def _results(path) -> dict[str, dict]:
    return {r["test"].split("::")[1]: r for r in json.loads(path.read_text())["results"]}


def test_every_run_of_a_wrapper_evaluates_its_prompt_and_the_reports_say_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner_user=WRAPPER_TESTS)
    result = run(pytester, "-rA", "--llmperf-json", "s.json", "--junitxml", "j.xml", "--llmperf-markdown", "s.md")
    result.assert_outcomes(passed=2)
    results = _results(pytester.path / "s.json")
    for name in ("test_wrapper", "test_own_llama"):
        prompt = results[name]["prompt"]
        # Cold: the whole prompt evaluated in the median run, nothing reused; the record keeps it.
        assert prompt["prompt_cache"] == "cold" and prompt["prompt_reused_tokens"] == 0, prompt
        assert prompt["evaluated_prompt_tokens"] == prompt["prompt_tokens"] > 0
        assert results[name]["record"]["prompt"] == prompt
        # llama.cpp's own time of the prompt and of decode, every run (no 0, no n/a).
        parts = results[name]["record"]["parts"]
        assert all(v > 0 for v in parts["native_prefill_ms"]) and all(
            v > 0 for v in parts["native_decode_ms_per_token"]
        )
        assert all(v >= 0 for v in parts["prefill_outside_ms"]) and all(
            v >= 0 for v in parts["decode_outside_ms_per_token"]
        )
    # A Llama the test built: its settings are the fingerprint's, its memory llama.cpp's.
    own = results["test_own_llama"]["record"]
    assert own["subject"]["n_batch"] == 512 and own["subject"]["n_ctx"] == 512 and own["subject"]["n_threads"] == 1
    assert own["memory"]["kv_mib"] > 0 and own["memory"]["compute_mib"] > 0
    out = result.stdout.str()
    assert out.count("prompt tokens evaluated / reused") == 2 and "parts: not measured" not in out
    props = {
        p.get("name"): p.get("value")
        for case in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")
        for p in case.iter("property")
    }
    assert props["llmperf.prompt.prompt_cache"] == "cold" and int(props["llmperf.prompt.prompt_reused_tokens"]) == 0
    assert "### Your code's prompt and stream" in (pytester.path / "s.md").read_text()


def test_a_longer_prompt_and_a_changed_setting_of_the_users_llama_are_named_against_the_baseline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_inner_user=WRAPPER_TESTS)
    run(pytester, "--llmperf-update-baselines").assert_outcomes(passed=2)
    monkeypatch.setenv("SYSTEM_REPEAT", "6")
    monkeypatch.setenv("OWN_N_BATCH", "16")
    result = run(pytester, "--llmperf-json", "s.json")
    results = _results(pytester.path / "s.json")
    before = results["test_wrapper"]["baseline_record"]["prompt"]["prompt_tokens"]
    now = results["test_wrapper"]["record"]["prompt"]["prompt_tokens"]
    assert f"prompt tokens {before} -> {now}" in results["test_wrapper"]["verdict"]["changes"]
    assert "n_batch 512 -> 16" in results["test_own_llama"]["verdict"]["changes"], results["test_own_llama"]["verdict"]
    # The longer prompt is the wrapper's prefill: llama.cpp evaluated every token of it.
    prompt = results["test_wrapper"]["prompt"]
    assert prompt["evaluated_prompt_tokens"] == prompt["prompt_tokens"] > before
    assert result.ret in (0, 1)  # the verdicts are the statistics'; the named changes are certain


def test_warm_is_a_workload_of_its_own_and_is_said_in_every_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner_user=WRAPPER_TESTS.split("@pytest.mark")[0]
        + """
@pytest.mark.llmperf(prompt="tell me a story", max_tokens=8, runs=3, warmup=1, prompt_cache="warm")
def test_warm(llmperf, llmperf_llm):
    llmperf.measure(wrapper(llmperf_llm))
"""
    )
    result = run(pytester, "-rA", "--llmperf-json", "s.json", "--llmperf-update-baselines")
    result.assert_outcomes(passed=1)
    rec = _results(pytester.path / "s.json")["test_warm"]["record"]
    assert rec["workload"]["prompt_cache"] == "warm"
    assert rec["prompt"]["prompt_reused_tokens"] == rec["prompt"]["prompt_tokens"] - 1
    assert result.stdout.str().count("prompt cache warm (kept between runs)") == 1
    # The same test cold is another workload: not compared with the warm baseline.
    (pytester.path / "test_inner_user.py").write_text(
        (pytester.path / "test_inner_user.py").read_text().replace(', prompt_cache="warm"', "")
    )
    result = run(pytester, "--llmperf-json", "s.json")
    verdict = _results(pytester.path / "s.json")["test_warm"]["verdict"]
    assert verdict["status"] == "workload-changed" and "prompt_cache 'warm' -> None" in verdict["note"], verdict


def test_the_session_option_sets_warm_and_the_plugins_own_engine_refuses_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner_user=WRAPPER_TESTS.split("@pytest.mark")[0]
        + """
@pytest.mark.llmperf(prompt="tell me a story", max_tokens=8, runs=3, warmup=1)
def test_wrapper(llmperf, llmperf_llm):
    m = llmperf.measure(wrapper(llmperf_llm))
    assert m.workload.prompt_cache == "warm" and m.prompt_reused_tokens > 0


@pytest.mark.llmperf(prompt_tokens=8, max_tokens=4, runs=2, prompt_cache="warm")
def test_marker_only():
    pass
"""
    )
    result = run(pytester, "--llmperf-prompt-cache", "warm", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    assert result.stdout.str().count("prompt_cache='warm' measures the Llama your own code drives") >= 1


def _tokens(llm, per_run_llama: bool = False):
    def fn(prompt: str, max_tokens: int):
        ids = llm.tokenize(prompt.encode())
        for i, token in enumerate(llm.generate(ids, temp=0.0)):
            yield token
            if i + 1 >= max_tokens:
                return

    return fn


def test_a_callable_that_builds_a_llama_every_run_is_told_so_in_one_line(tiny_model_path) -> None:
    import llama_cpp

    def per_run(prompt: str, max_tokens: int):
        llm = llama_cpp.Llama(model_path=str(tiny_model_path), n_ctx=256, verbose=False)
        yield from _tokens(llm)(prompt, max_tokens)

    with pytest.raises(Exception, match=r"^.*made a new llama_cpp\.Llama in .* runs.*build it once") as info:
        measure(per_run, Workload(prompt_tokens=8, max_tokens=4, runs=3, warmup=1))
    assert "\n" not in str(info.value)


def test_a_raising_callable_leaves_its_llama_as_it_was(tiny_engine) -> None:
    llm = tiny_engine.llm

    def broken(prompt: str, max_tokens: int):
        yield from _tokens(llm)(prompt, 2)
        raise RuntimeError("the wrapper broke mid-stream")

    engine = CallableEngine(broken, watch=LlamaWatch())
    with pytest.raises(RuntimeError, match="broke mid-stream"):
        engine.run(Workload(prompt_tokens=8, max_tokens=4), 0)
    assert not {"generate", "eval", "sample", "tokenize"} & set(vars(llm))  # the wrappers are gone
    assert llm in live_llamas()


def test_a_closed_llama_is_not_watched(tiny_model_path) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(tiny_model_path), n_ctx=256, verbose=False)
    assert llm in live_llamas()
    llm.close()
    assert llm not in live_llamas()
    # Driving it would read freed memory (the process dies): one line instead.

    def fn(prompt: str, max_tokens: int):
        yield from llm.create_completion(prompt, max_tokens=max_tokens, stream=True)

    with pytest.raises(
        EngineError, match=r"^the callable drove llama_cpp\.Llama '.+' after it was closed .*keep it open"
    ):
        measure(fn, Workload(prompt="hi", max_tokens=4, runs=2))


def test_the_attribution_pass_times_the_llama_a_callable_built_with_the_prompt_it_built(tiny_model_path) -> None:
    import llama_cpp

    from pytest_llmperf.engines.capabilities import times_layers
    from pytest_llmperf.engines.user_llama import DrivenLlamaEngine
    from pytest_llmperf.measuring.runner import attribution_of

    llm = llama_cpp.Llama(model_path=str(tiny_model_path), n_ctx=512, n_batch=64, n_threads=1, verbose=False)
    system = "be brief. " * 10

    def fn(prompt: str, max_tokens: int):
        yield from _tokens(llm)(system + prompt, max_tokens)

    engine = CallableEngine(fn, watch=LlamaWatch())
    assert not times_layers(engine)  # nothing driven yet
    w = Workload(prompt="hello there", max_tokens=6, runs=2, warmup=0)
    trace = engine.run(w, 0)
    driven = engine.driven_llama()
    assert isinstance(driven, DrivenLlamaEngine) and times_layers(engine)
    assert driven.prompt_ids(w) == llm.tokenize((system + "hello there").encode())  # the prompt the code built
    assert len(driven.prompt_ids(w)) == trace.prompt_tokens
    assert driven.info().n_batch == 64 and driven.info().threads == 1
    attribution = attribution_of(engine, w)
    assert attribution.decode is not None and attribution.prefill is not None
    # The user's next run starts cold again: the whole prompt evaluated.
    after = engine.run(w, 1)
    assert after.prompt_reused_tokens == 0 and after.native is not None
    assert after.native.prefill_tokens == after.prompt_tokens
