"""Prompt sets (issue 49 points 1 and 7): a JSONL file or an inline list of requests (a prompt or
chat messages, optional max_tokens and weight); run i sends the request drawn by the weights from
(set, seed, i), on every engine; the set's content hash is part of the workload's identity; bad
input is one line naming the file and line, before anything is measured.

No timing is asserted."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from inner import run

from pytest_llmperf import Workload, measure
from pytest_llmperf.core.documents import MAX_DOCUMENT_MIB
from pytest_llmperf.core.errors import ConfigError, EngineError
from pytest_llmperf.core.measurement import workload_changes, workload_identity
from pytest_llmperf.core.prompt_sets import parse_prompt_set, prompt_set, read_prompt_set
from pytest_llmperf.core.workload import SetRequest, prompt_set_digest, prompt_set_requests
from pytest_llmperf.engines import CallableEngine
from pytest_llmperf.session.options import validate

REQUESTS = [
    {"prompt": "Hello"},
    {"prompt": "Write a long story about a lighthouse keeper and the sea, in many words.", "max_tokens": 6},
    {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Why?"}], "weight": 2},
]
JSONL = "\n".join(json.dumps(r) for r in REQUESTS) + "\n"
W = Workload(prompt_set=prompt_set_requests(REQUESTS), max_tokens=4, runs=6, warmup=1)


def test_a_jsonl_file_and_the_inline_list_are_the_same_set(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(JSONL.replace("\n", "\n\n"), encoding="utf-8")  # blank lines are skipped
    assert prompt_set(path) == prompt_set(str(path)) == prompt_set(REQUESTS) == W.prompt_set
    assert W.prompt_set[1].max_tokens == 6 and W.prompt_set[2].weight == 2.0
    assert W.prompt_set[2].messages == (("system", "Be terse."), ("user", "Why?"))
    assert "prompt set of 3 requests" in W.describe() and W.synthetic_prompt_tokens is None


def test_the_request_of_a_run_is_a_function_of_the_set_the_seed_and_the_run_index() -> None:
    again = Workload.from_json(json.loads(json.dumps(W.to_json())))  # as a side or a worker gets it
    assert again == W
    order = [W.request(i) for i in range(-1, 40)]
    assert order == [again.request(i) for i in range(-1, 40)]
    assert all(r.prompt_set is None for r in order)
    assert {r.prompt or r.messages for r in order} == {r.prompt or r.messages for r in W.each_request()}
    assert [r.max_tokens for r in W.each_request()] == [4, 6, 4]  # its own, else the workload's
    other_seed = dataclasses.replace(W, seed=1)
    assert [other_seed.request(i) for i in range(40)] != order[1:]
    assert Workload(prompt="x").request(3) == Workload(prompt="x")  # no set: the workload itself


def test_weights_are_draw_probabilities() -> None:
    heavy = Workload(prompt_set=prompt_set_requests([{"prompt": "a"}, {"prompt": "b", "weight": 9}]))
    drawn = Counter(heavy.request(i).prompt for i in range(2000))
    assert 0.85 < drawn["b"] / 2000 < 0.95  # 0.9 expected; the draws are fixed, so this cannot flap


def test_the_plugins_engine_runs_each_drawn_request(tiny_engine) -> None:
    m = measure(tiny_engine, W)
    for i, r in enumerate(m.runs):
        sent = W.request(i)
        assert r.prompt_tokens == len(tiny_engine.prompt_ids(sent)) and r.output_tokens == sent.max_tokens
    assert len({r.prompt_tokens for r in m.runs}) > 1  # the mix, not one prompt


def test_a_measured_callable_is_given_each_drawn_request() -> None:
    given_: list[tuple[object, int]] = []

    def fn(prompt, max_tokens):
        given_.append((prompt, max_tokens))
        yield from range(max_tokens)

    measure(CallableEngine(fn), W)
    expected = [W.request(i) for i in [-1, *range(W.runs)]]  # the warm-up, then the runs
    assert [n for _, n in given_] == [w.max_tokens for w in expected]
    for (prompt, _), w in zip(given_, expected):
        want = [{"role": r, "content": c} for r, c in w.messages] if w.messages else w.prompt
        assert prompt == want


def test_a_served_model_gets_each_drawn_request(llmperf_server) -> None:
    engine = llmperf_server.engine(api="completions")
    w = dataclasses.replace(W, runs=4, warmup=0)
    try:
        m = measure(engine, w)
    finally:
        engine.close()
    assert [r.output_tokens for r in m.runs] == [w.request(i).max_tokens for i in range(4)]


def test_the_sets_content_hash_is_the_workloads_identity() -> None:
    def stored(w: Workload) -> dict[str, object]:
        m = SimpleNamespace(workload=w, engine=SimpleNamespace(engine="llama.cpp"), prompt_tokens=40)
        return workload_identity(m)

    assert stored(W)["prompt_set"] == prompt_set_digest(W.prompt_set)
    assert prompt_set_digest(W.prompt_set).startswith("sha256:")
    assert stored(W)["prompt_tokens"] is None  # the median length of the runs drawn: not the set's identity
    changed = prompt_set_requests([*REQUESTS[:2], {"prompt": "Another"}])
    found = workload_changes(stored(W), stored(dataclasses.replace(W, prompt_set=changed)))
    assert len(found) == 1 and found[0].startswith("prompt_set 'sha256:")
    assert workload_changes(stored(W), stored(dataclasses.replace(W, runs=9))) == []
    assert "prompt_set" not in stored(Workload())  # every other workload's identity as before


def test_a_closer_prompt_replaces_a_prompt_set_and_both_at_once_is_an_error() -> None:
    merged = validate({"prompt_set": REQUESTS}).merged({"prompt": "hi"})
    assert "prompt_set" not in merged.workload and merged.workload["prompt"] == "hi"
    with pytest.raises(ConfigError, match="either a prompt_set or one prompt"):
        Workload(prompt_set=W.prompt_set, prompt_tokens=8)
    with pytest.raises(ConfigError, match="shared_prefix_tokens needs a synthetic prompt"):
        Workload(prompt_set=W.prompt_set, shared_prefix_tokens=2)


# -- bad input: one line naming the file and line ---------------------------------------------

BAD_LINES = [
    ("not json", "not JSON"),
    ('{"max_tokens": 8}', "a request needs either a prompt or messages"),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "a request needs either a prompt or messages"),
    (
        '{"messages": [{"role": "robot", "content": "b"}]}',
        "messages[0] has role 'robot'; roles: system, user, assistant",
    ),
    ('{"prompt": "a", "max_tokens": 0}', "max_tokens must be an integer from 2 to"),
    ('{"prompt": "a", "max_tokens": "8"}', "max_tokens must be an integer from 2 to"),
    ('{"prompt": "a", "max_tokens": 2.5}', "max_tokens must be an integer from 2 to"),
    ('{"prompt": "a", "weight": 0}', "weight must be a number > 0"),
    ('{"prompt": "a", "weight": true}', "weight must be a number > 0"),
    ('{"prompt": ""}', "prompt must be a non-empty string"),
    ('{"prompt": "a", "promt": "b"}', "unknown key 'promt'"),
    ('["a"]', "a request must be an object"),
    ('{"prompt": "a", "prompt": "b"}', "duplicate key"),
]


@pytest.mark.parametrize(("line", "says"), BAD_LINES)
def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(JSONL + line + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_prompt_set(path)
    message = str(err.value)
    assert message.startswith(f"{path}:4: ") and says in message and "\n" not in message


def test_a_missing_empty_oversized_or_binary_file_is_one_line(tmp_path: Path) -> None:
    def problem(path: Path) -> str:
        with pytest.raises(ConfigError) as err:
            read_prompt_set(path)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert problem(tmp_path / "none.jsonl") == f"prompt set {tmp_path / 'none.jsonl'}: no such file"
    (tmp_path / "empty.jsonl").write_text("\n  \n", encoding="utf-8")
    assert problem(tmp_path / "empty.jsonl").startswith(f"prompt set {tmp_path / 'empty.jsonl'} is empty")
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:  # sparse: refused by its size before a byte is read
        fh.truncate((MAX_DOCUMENT_MIB + 1) * 2**20)
    assert f"over the {MAX_DOCUMENT_MIB} MiB" in problem(big)
    (tmp_path / "bin.jsonl").write_bytes(b'{"prompt": "\xff"}\n')
    assert "not UTF-8" in problem(tmp_path / "bin.jsonl")
    assert "not a regular file" in problem(tmp_path)


def test_an_inline_lists_bad_request_is_named_by_its_index() -> None:
    with pytest.raises(ConfigError, match=r"^prompt_set\[1\]: a request needs either a prompt or messages"):
        prompt_set_requests([{"prompt": "a"}, {"weight": 1}])
    with pytest.raises(ConfigError, match="non-empty list"):
        prompt_set_requests([])


# -- property-based: the parser -----------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
MESSAGES = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text(max_size=20)), min_size=1)
REQUEST = st.builds(
    lambda prompt, max_tokens, weight: SetRequest(prompt=prompt, max_tokens=max_tokens, weight=weight),
    TEXT,
    st.none() | st.integers(2, 4096),
    st.sampled_from([1.0, 0.5, 3.0]) | st.floats(1e-3, 1e3),
) | st.builds(
    lambda messages, max_tokens: SetRequest(messages=tuple(messages), max_tokens=max_tokens),
    MESSAGES,
    st.none() | st.integers(2, 4096),
)


@given(st.lists(REQUEST, min_size=1, max_size=8))
def test_any_valid_set_round_trips(requests: list[SetRequest]) -> None:
    text = "".join(json.dumps(r.to_line(), ensure_ascii=False) + "\n" for r in requests)
    assert parse_prompt_set(text, "set.jsonl") == tuple(requests)
    stored = Workload(prompt_set=tuple(requests)).to_json()
    assert Workload.from_json(json.loads(json.dumps(stored))).prompt_set == tuple(requests)


@given(st.lists(REQUEST, min_size=1, max_size=8), st.data())
def test_any_line_made_invalid_is_named_by_its_number(requests: list[SetRequest], data: st.DataObject) -> None:
    lines = [json.dumps(r.to_line()) for r in requests]
    k = data.draw(st.integers(0, len(lines) - 1))
    lines[k] = data.draw(st.sampled_from([line for line, _ in BAD_LINES]))
    with pytest.raises(ConfigError) as err:
        parse_prompt_set("\n".join(lines), "set.jsonl")
    assert str(err.value).startswith(f"set.jsonl:{k + 1}: ")


# -- in a test session: a marker's set, its baseline, a bad file before anything is measured --

SUITE = """
import pytest

@pytest.mark.llmperf(prompt_set="prompts.jsonl", max_tokens=4, runs=3)
def test_set():
    pass
"""


def test_a_changed_set_is_not_judged_against_the_baseline(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "prompts.jsonl").write_text(JSONL, encoding="utf-8")
    run(pytester, "--llmperf-update-baselines").assert_outcomes(passed=1)
    (pytester.path / "prompts.jsonl").write_text(JSONL.replace("Hello", "Goodbye"), encoding="utf-8")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*not comparable: the workload changed since the baseline (*prompt_set 'sha256:*"])


def test_a_markers_bad_file_fails_collection_in_one_line_and_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "prompts.jsonl").write_text(JSONL + '{"prompt": "a", "max_tokens": -1}\n', encoding="utf-8")
    before = sorted(os.listdir(pytester.path))
    result = run(pytester)
    line = (
        "test_suite.py::test_set: llmperf marker key 'prompt_set': prompts.jsonl:4: "
        "max_tokens must be an integer from 2 to 16777216, got -1"
    )
    assert line in result.stdout.lines and result.ret != 0
    assert sorted(os.listdir(pytester.path)) == before  # no baseline, no report


AB_SUITE = """
import pytest

REQUESTS = {requests!r}

def test_ab(llmperf):
    res = llmperf.compare(a={{"n_batch": 64}}, b={{"n_batch": 128}}, prompt_set=REQUESTS, max_tokens=4, runs=4, warmup=1)
    a, b = [r.prompt_tokens for r in res.a.runs], [r.prompt_tokens for r in res.b.runs]
    assert a == b and len(set(a)) > 1, (a, b)  # every pair: one request, the same on both sides
"""


def test_both_sides_of_an_ab_pair_send_the_same_request(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=AB_SUITE.format(requests=REQUESTS))
    run(pytester).assert_outcomes(passed=1)


def test_a_request_beyond_the_context_fails_the_first_run(tiny_engine) -> None:
    """Every request of the set is checked at the set's first run (a warm-up), not when it is drawn."""
    train = tiny_engine._n_ctx_train()
    huge = Workload(prompt_set=prompt_set_requests([{"prompt": "a"}, {"prompt": "b", "max_tokens": train}]), runs=1)
    assert huge.request(-1).prompt == "a"  # the run that fails sends the short request
    with pytest.raises(EngineError, match=r"context too small: \d+ prompt \+ \d+ generated tokens > n_ctx"):
        tiny_engine.run(huge, -1)


# -- llmperf_llm's context fitted to a callable's workload (every request of the set) ----------

#: A long request: 312 tokens on the embedded model, beyond the 256 llmperf_llm is loaded with.
LONG = "the lighthouse keeper watched the sea " * 10

CALLABLE_SUITE = """
import pytest

REQUESTS = [{{"prompt": "Hello"}}, {{"prompt": {long!r}}}]

def test_mine(llmperf, llmperf_llm):
    def reply(request, max_tokens):
        yield from llmperf_llm.create_completion(request, max_tokens=max_tokens, stream=True)

    m = llmperf.measure(reply, prompt_set=REQUESTS, max_tokens=4, runs=6, warmup=1)
    assert max(r.prompt_tokens for r in m.runs) > 256 and llmperf_llm.n_ctx() >= 512, m.runs
"""


def test_a_callables_long_request_fits_llmperf_llm_context(pytester: pytest.Pytester, tiny_engine) -> None:
    assert len(tiny_engine.llm.tokenize(LONG.encode())) > 256
    pytester.makepyfile(test_suite=CALLABLE_SUITE.format(long=LONG))
    run(pytester).assert_outcomes(passed=1)


def test_a_set_n_ctx_too_small_for_a_callables_request_is_one_line_before_any_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=CALLABLE_SUITE.format(long=LONG))
    result = run(pytester, "--llmperf-n-ctx=256")
    result.assert_outcomes(failed=1)
    lines = [ln for ln in result.stdout.lines if "context too small" in ln]
    assert lines and "generated tokens > n_ctx 256; raise --llmperf-n-ctx or shorten the workload" in lines[0]
    assert "exceed context window" not in result.stdout.str()  # never llama-cpp-python's, inside a run


def test_fit_handed_sizes_the_llamas_own_context_and_the_engine_follows(tiny_model_path: Path) -> None:
    """Auto n_ctx: the handed Llama's context is each callable workload's largest request rounded
    up to 256 (never below what it was loaded with), messages counted as rendered; the engine's
    own runs, on that context until they need their own, still measure."""
    from pytest_llmperf import LlamaCppEngine

    engine = LlamaCppEngine(tiny_model_path, threads=1)
    try:
        llm = engine.llm
        assert llm is not None and llm.n_ctx() == 256
        long = Workload(prompt_set=prompt_set_requests([{"prompt": "Hi"}, {"prompt": LONG}]), max_tokens=4)
        engine.fit_handed(long)
        assert llm.n_ctx() == 512 == engine.info().n_ctx
        out = llm.create_completion(LONG, max_tokens=4)
        assert out["usage"]["prompt_tokens"] > 256
        assert measure(engine, Workload(prompt_tokens=16, max_tokens=4, runs=2, warmup=0)).output_tokens == 4
        chat = [{"role": "user", "content": LONG}]
        engine.fit_handed(Workload(messages=chat, max_tokens=200))
        assert llm.n_ctx() == 768  # the rendered chat prompt + 200 tokens
        engine.fit_handed(Workload(prompt="Hi", max_tokens=4))
        assert llm.n_ctx() == 256
        with pytest.raises(EngineError, match=r"context too small: \d+ prompt \+ \d+ generated tokens > n_ctx 2048"):
            engine.fit_handed(Workload(prompt=LONG, max_tokens=2000))
        assert llm.n_ctx() == 256  # nothing changed
        engine.close()
        engine.fit_handed(long)  # closed (a cold load released it): left alone, nothing read
    finally:
        engine.close()
