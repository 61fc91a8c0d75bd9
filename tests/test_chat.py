"""Chat requests (issue 49 point 2): a workload of chat messages is rendered through the model's
own chat template (GGUF ``tokenizer.chat_template``, written into the embedded model) and
tokenized, that time a part of prefill; a measured callable is given the messages for
``Llama.create_chat_completion``; a served model gets them as they are; bad messages and a model
without a template are one line each, before anything is measured.

No timing is asserted: the parts add up to TTFT by construction (checked to float rounding)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from inner import run

from pytest_llmperf import LlamaCppEngine, Workload, measure
from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.measurement import workload_changes, workload_identity
from pytest_llmperf.engines import CallableEngine
from pytest_llmperf.engines.http import HttpEngine
from pytest_llmperf.engines.user_llama import LlamaWatch
from pytest_llmperf.models.gguf import BOS_ID, PRESETS, write_gguf
from pytest_llmperf.session.options import validate

MESSAGES = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What colour is the sky?"},
]
#: The embedded model's template rendered by hand: ChatML-like, the BOS first, the assistant's turn opened.
RENDERED = (
    "<s><|im_start|>system\nAnswer in one word.<|im_end|>\n"
    "<|im_start|>user\nWhat colour is the sky?<|im_end|>\n<|im_start|>assistant\n"
)
W = Workload(messages=MESSAGES, max_tokens=6, runs=3, warmup=1)


def _prefill_parts_add_up(r) -> None:
    assert r.native_prefill_ms is not None and r.prefill_outside_ms is not None
    gap = dict(r.clock_gaps).get("prefill_outside_ms_gap", 0.0)
    total = r.tokenize_ms + r.native_prefill_ms + r.prefill_outside_ms - gap
    assert math.isclose(total, r.ttft_ms, rel_tol=1e-9, abs_tol=1e-9)


def test_chat_messages_are_the_models_template_rendered_and_tokenized(tiny_engine) -> None:
    llm = tiny_engine.llm
    ids = llm.tokenize(RENDERED.encode(), add_bos=False, special=True)
    assert ids[0] == BOS_ID and ids[1] != BOS_ID  # one BOS: the template's
    assert tiny_engine.prompt_ids(W) == ids
    m = measure(tiny_engine, W)
    assert m.prompt_tokens == len(ids) and m.output_tokens == W.max_tokens
    for r in m.runs:
        assert r.prompt_tokens == len(ids) and r.tokenize_ms > 0  # rendering + tokenization, before the run
        _prefill_parts_add_up(r)
    assert "chat 2 messages" in W.describe()


def test_a_callable_calling_create_chat_completion_is_given_the_messages_and_measured_with_its_parts(
    tiny_engine,
) -> None:
    """A ``llmperf_llm`` wrapper: ``create_chat_completion(messages, stream=True)`` renders the
    same template; the run's prompt tokens are the rendering's, llama.cpp's counters its own."""
    llm = tiny_engine.llm
    given = []

    def chat(messages, max_tokens):
        given.append(messages)
        yield from llm.create_chat_completion(messages, max_tokens=max_tokens, stream=True, temperature=0.0)

    m = measure(CallableEngine(chat, watch=LlamaWatch()), W)
    assert given[0] == MESSAGES
    n_prompt = len(llm.tokenize(RENDERED.encode(), add_bos=False, special=True))
    for r in m.runs:
        assert r.prompt_tokens == n_prompt and r.prompt_reused_tokens == 0
        assert r.native_decode_ms_per_token is not None and r.native_decode_ms_per_token > 0
        _prefill_parts_add_up(r)


def test_a_model_without_a_chat_template_is_one_line_naming_it(tmp_path: Path) -> None:
    spec = dataclasses.replace(PRESETS["tiny"], name="plain", n_layer=1, n_embd=64, n_ff=128, chat_template=False)
    path = write_gguf(spec, tmp_path / "plain-model.gguf")
    engine = LlamaCppEngine(path, threads=1)
    try:
        with pytest.raises(ConfigError) as err:
            measure(engine, W)
        assert "\n" not in str(err.value)
        assert "the model plain-model has no chat template (tokenizer.chat_template in its GGUF)" in str(err.value)
        assert measure(engine, Workload(prompt="hello", max_tokens=2, runs=1, warmup=0)).prompt_tokens > 1
    finally:
        engine.close()
    assert spec.digest() != dataclasses.replace(spec, chat_template=True).digest()


@pytest.mark.parametrize(
    ("messages", "line"),
    [
        ([], "messages must be a non-empty list"),
        ("hello", "messages must be a non-empty list"),
        ([{"role": "robot", "content": "hi"}], "messages[0] has role 'robot'; roles: system, user, assistant"),
        ([{"role": "user", "content": 3}], "messages[0] content must be a string, got 3"),
        ([{"role": "user", "content": "a"}, {"role": "user"}], "messages[1] must be {'role': ..., 'content': ...}"),
    ],
)
def test_bad_messages_are_one_line_each(messages, line) -> None:
    with pytest.raises(ConfigError) as err:
        Workload(messages=messages)
    assert line in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as marker:
        validate({"messages": messages})
    assert str(marker.value).startswith("llmperf marker key 'messages': ") and line in str(marker.value)


def test_messages_are_a_prompt_of_their_own_kind() -> None:
    with pytest.raises(ConfigError, match=r"give either messages or a prompt \(prompt, prompt_tokens\), not both"):
        validate({"messages": MESSAGES, "prompt": "hi"})
    # A closer prompt replaces the marker's messages, and messages a prompt.
    assert "messages" not in validate({"messages": MESSAGES}).merged({"prompt": "hi"}).workload
    assert "prompt_tokens" not in validate({"prompt_tokens": 8}).merged({"messages": MESSAGES}).workload
    assert Workload.from_json(W.to_json()) == W and hash(W)


def test_a_changed_conversation_is_a_workload_change() -> None:
    def stored(w: Workload) -> dict[str, object]:
        m = SimpleNamespace(workload=w, engine=SimpleNamespace(engine="llama.cpp"), prompt_tokens=40)
        return workload_identity(m)

    other = dataclasses.replace(W, messages=[*MESSAGES[:1], {"role": "user", "content": "What colour is grass?"}])
    changed = workload_changes(stored(W), stored(other))
    assert len(changed) == 1 and changed[0].startswith("messages ") and "grass" in changed[0]
    assert workload_changes(stored(W), stored(dataclasses.replace(W, runs=9))) == []
    assert "messages" not in stored(Workload())  # a prompt's identity as before


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_served_chat_request_sends_the_messages_as_they_are_to_chat_completions(api) -> None:
    """Whatever the engine's API for prompts, a chat request goes to /v1/chat/completions."""
    engine = HttpEngine("http://127.0.0.1:9/v1", api=api)
    body = engine.body(W, 0)
    assert body["messages"] == MESSAGES and "prompt" not in body
    assert engine._target(W) == ("chat", "http://127.0.0.1:9/v1/chat/completions", engine._urls["chat"][1])
    assert engine._target(Workload(prompt="hi"))[0] == api


def test_a_stored_workloads_messages_read_back() -> None:
    """As a side's or a worker's JSON holds them: (role, content) pairs as lists."""
    stored = json.loads(json.dumps(W.to_json()))
    assert stored["messages"][0] == ["system", "Answer in one word."]
    assert Workload(**stored) == Workload.from_json(stored) == W


#: The module's prompt_tokens: the test's messages replace it (one choice, as prompt and prompt_tokens).
CHAT_SUITE = """
import pytest

pytestmark = pytest.mark.llmperf(prompt_tokens=16, max_tokens=8)

@pytest.mark.llmperf(messages=[{"role": "user", "content": "What colour is the sky?"}], max_tokens=4, runs=3)
def test_chat():
    pass
"""


def test_a_changed_conversation_is_not_judged_against_the_baseline(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=CHAT_SUITE)
    run(pytester, "--llmperf-update-baselines").assert_outcomes(passed=1)
    pytester.makepyfile(test_suite=CHAT_SUITE.replace("the sky", "grass"))
    result = run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*not comparable: the workload changed since the baseline (*messages*grass*"])


def test_a_markers_bad_messages_fail_collection_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=CHAT_SUITE.replace('"role": "user"', '"role": "robot"'))
    result = run(pytester)
    line = "test_suite.py::test_chat: llmperf marker key 'messages': messages[0] has role 'robot'; roles: system, user, assistant"
    assert line in result.stdout.lines and result.ret != 0


def test_the_users_llama_driven_by_the_plugin_renders_a_chat_request(tiny_engine) -> None:
    """Per-layer timing and attribution on the user's Llama (``DrivenLlamaEngine``) when its code
    left no prompt behind: messages rendered through the model's chat template, as
    ``create_chat_completion`` does, not read as a synthetic prompt."""
    from pytest_llmperf.engines.user_llama import DrivenLlamaEngine

    llm = tiny_engine.llm
    driven = DrivenLlamaEngine(llm, tiny_engine.info(), [])
    assert driven.prompt_ids(W) == llm.tokenize(RENDERED.encode(), add_bos=False, special=True)
    assert driven.prompt_ids(Workload(prompt="hello", max_tokens=2)) == llm.tokenize(b"hello")
