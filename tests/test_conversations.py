"""Multi-turn conversations (issue 49 point 3): each run sends the conversation's turns in order,
turn k's chat the system message, the user turns so far and the model's replies to the earlier
ones; the prompt cache is kept between the turns of a run (cleared before its first), so a later
turn evaluates only its new tokens, which llama.cpp's own counters confirm. Per-turn figures,
budgets over all turns pooled or on one turn (``turn``), the content hash in the identity, bad
input in one line before anything is measured, the user path (a callable on a Llama).

No timing is asserted: counts, structure and agreement with llama.cpp's counters."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from inner import run

from pytest_llmperf import Workload, measure
from pytest_llmperf.baselines.records import stored as record_of
from pytest_llmperf.core.conversations import conversation, parse_conversation
from pytest_llmperf.core.errors import ConfigError, EngineError
from pytest_llmperf.core.formats import fmt
from pytest_llmperf.core.measurement import Measurement, workload_changes, workload_identity
from pytest_llmperf.core.workload import Conversation, RunTrace, conversation_digest
from pytest_llmperf.judge.result import Outcome, outcome
from pytest_llmperf.measuring.metrics import turn_figures
from pytest_llmperf.measuring.runner import extend
from pytest_llmperf.reports import html as html_report
from pytest_llmperf.reports.text import turn_rows
from pytest_llmperf.session.options import validate

TALK = {"system": "Be brief.", "turns": ["Hello there.", "What is two plus two?", "Thanks, bye."]}
W = Workload(conversation=TALK, max_tokens=6, runs=2, warmup=1)


def _reuse_is_measured(m, turns: int = 3) -> None:
    assert [r.turn for r in m.runs] == list(range(1, turns + 1)) * m.workload.runs
    for i in range(m.workload.runs):
        mine = m.runs[i * turns : (i + 1) * turns]
        assert mine[0].prompt_reused_tokens == 0  # cleared before the run's first turn
        for before, now in itertools.pairwise(mine):
            # The previous turn's prompt is all in the cache (its reply fed back after it).
            assert now.prompt_reused_tokens >= before.prompt_tokens
            assert now.prompt_reused_tokens < now.prompt_tokens


def test_each_turn_evaluates_only_its_new_tokens_as_llama_cpps_counters_say(tiny_engine) -> None:
    m = measure(tiny_engine, W)
    assert m.n_runs == 6 and m.workload.runs == 2 and len(m.warmup_runs) == 3
    _reuse_is_measured(m)
    for r in m.runs:
        # llama.cpp's own count of the prompt tokens it evaluated: the trace's evaluated ones.
        assert r.native_prefill_ms is not None
    traces = [tiny_engine.run(W.at_turn(k), 7) for k in (1, 2, 3)]
    for t in traces:
        assert t.native is not None and t.native.prefill_tokens == t.prompt_tokens - t.prompt_reused_tokens
    assert traces[1].native.prefill_tokens < traces[1].prompt_tokens


def test_a_turn_out_of_order_is_refused(tiny_engine) -> None:
    tiny_engine.run(W.at_turn(1), 0)
    with pytest.raises(EngineError, match="turn 3 of run 0 asked without its turn 2"):
        tiny_engine.run(W.at_turn(3), 0)
    with pytest.raises(EngineError, match="turn 2 of run 5"):
        tiny_engine.run(W.at_turn(2), 5)
    tiny_engine.run(W.at_turn(1), 0)
    tiny_engine.run(Workload(prompt_tokens=8, max_tokens=2), 0)  # another request: the cache cleared
    with pytest.raises(EngineError, match="turn 2 of run 0 asked without its turn 1"):
        tiny_engine.run(W.at_turn(2), 0)
    with pytest.raises(EngineError, match="a conversation is sent turn by turn"):
        tiny_engine.run(W, 0)


def test_per_turn_figures_and_rows(tiny_engine) -> None:
    m = measure(tiny_engine, W)
    figures = turn_figures(m.runs)
    assert [f.turn for f in figures] == [1, 2, 3] and all(f.runs == 2 for f in figures)
    assert figures[0].reused_tokens == 0 and figures[1].reused_tokens >= figures[0].prompt_tokens
    assert all(f.evaluated_tokens + f.reused_tokens == f.prompt_tokens for f in figures)
    assert all(0 < f.ttft_p50_ms <= f.ttft_p95_ms and f.tpot_ms > 0 for f in figures)
    rows = turn_rows(m)
    assert [r[0] for r in rows[:3]] == [
        "turn 1 prompt tokens evaluated / reused",
        "turn 1 TTFT p50 / p95",
        "turn 1 decode median",
    ]
    assert len(rows) == 9 and all(r[3] == "2 runs" for r in rows)
    assert "conversation of 3 turns" in W.describe()


def test_the_html_section_has_the_turn_by_turn_table_of_the_stored_record(tiny_engine) -> None:
    """The HTML report's section of a conversation test: one row per turn, read from the stored
    record's ``prompt.turns`` (llama.cpp's counters, TTFT p50 / p95, decode, runs)."""
    m = measure(tiny_engine, W)
    record = json.loads(json.dumps(record_of(m).to_json()))
    page = html_report.test_section(
        0,
        outcome(m, "t.py::test_talk", "t.py::test_talk", None, 0, judged=Outcome("t", record=Measurement.read(record))),
    )
    table = page.split("<h3>Conversation, turn by turn</h3>", 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<th>(.*?)</th>", table) == list(html_report.TURN_HEADERS)
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr><td>.*?</tr>", table)]
    assert [r[0] for r in rows] == ["1", "2", "3"] and all(r[4] == "2" for r in rows)
    for row, t in zip(rows, record["prompt"]["turns"]):
        assert row[1] == f"{t['evaluated_prompt_tokens']} / {t['prompt_reused_tokens']}"
        assert row[2] == f"{fmt(t['ttft_p50_ms'])} / {fmt(t['ttft_p95_ms'])}" and row[3] == fmt(t["tpot_ms"])
    assert rows[0][1].endswith(" / 0") and int(rows[1][1].split(" / ")[1]) >= m.turns[0].prompt_tokens
    plain = measure(tiny_engine, Workload(prompt_tokens=8, max_tokens=2, runs=2, warmup=0))
    assert "turn by turn" not in html_report.test_section(0, outcome(plain, "t", "t", None, 0))


def test_turn_judges_one_turn_and_names_it_in_the_identity(tiny_engine) -> None:
    m = measure(tiny_engine, dataclasses.replace(W, turn=2))
    assert {r.turn for r in m.runs} == {2} and m.n_runs == 2
    assert m.workload.turn == 2
    pooled = measure(tiny_engine, W)
    assert pooled.n_runs == 6  # budgets read every turn pooled: p95 over all turns
    stored = workload_identity(m)
    assert stored["turn"] == 2 and "turn" not in workload_identity(pooled)


def test_more_runs_are_whole_conversations(tiny_engine) -> None:
    """A sequential measurement (``max_runs``) adds whole conversations, each from its turn 1."""
    m = extend(tiny_engine, measure(tiny_engine, W), 1)
    assert m.workload.runs == 3 and m.n_runs == 9
    _reuse_is_measured(m)
    one = extend(tiny_engine, measure(tiny_engine, dataclasses.replace(W, turn=3)), 2)
    assert one.workload.runs == 4 and [r.turn for r in one.runs] == [3] * 4
    assert [t.turn for t in one.turns] == [3] and one.turns[0].runs == 4


def test_the_conversations_content_hash_is_the_workloads_identity() -> None:
    def stored(w: Workload) -> dict[str, object]:
        return workload_identity(
            SimpleNamespace(workload=w, engine=SimpleNamespace(engine="llama.cpp"), prompt_tokens=9)
        )

    assert stored(W)["conversation"] == conversation_digest(W.conversation)
    assert stored(W)["prompt_tokens"] is None
    changed = dataclasses.replace(W, conversation={**TALK, "turns": [*TALK["turns"][:2], "Another."]})
    found = workload_changes(stored(W), stored(changed))
    assert len(found) == 1 and found[0].startswith("conversation 'sha256:")
    assert workload_changes(stored(W), stored(dataclasses.replace(W, runs=9))) == []
    assert "conversation" not in stored(Workload()) and "conversation" not in Workload().to_json()
    assert Workload.from_json(json.loads(json.dumps(W.at_turn(2).to_json()))) == W.at_turn(2)
    trace = RunTrace(start_ns=0, prefill_done_ns=None, token_ns=(1, 2), prompt_tokens=None)
    older = {k: v for k, v in trace.to_json().items() if k != "turn"}  # what an older side sends
    assert RunTrace.from_json(older) == trace and trace.turn is None
    turned = dataclasses.replace(trace, turn=2)
    assert RunTrace.from_json(json.loads(json.dumps(turned.to_json()))) == turned


def test_forms_of_a_conversation(tmp_path: Path) -> None:
    assert conversation(["a", "b"]) == Conversation(("a", "b"))
    path = tmp_path / "talk.json"
    path.write_text(json.dumps(TALK), encoding="utf-8")
    assert conversation(path) == conversation(str(path)) == W.conversation
    assert W.conversation.messages(["r1"]) == (
        ("system", "Be brief."),
        ("user", "Hello there."),
        ("assistant", "r1"),
        ("user", "What is two plus two?"),
    )
    merged = validate({"prompt": "hi"}).merged({"conversation": TALK})
    assert "prompt" not in merged.workload and merged.workload["conversation"] == W.conversation


# -- bad input: one line naming the file and line, or the inline index --------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ([], "turns must be a non-empty list"),
        (["a", 3], "turns[1] must be a non-empty string (a user message), got 3"),
        ({"turns": ["a"], "user": "x"}, "unknown key 'user'; a conversation's keys: system, turns"),
        ({"system": 1, "turns": ["a"]}, "system message must be a string"),
    ],
)
def test_a_bad_inline_conversation_is_one_line(value: object, says: str) -> None:
    with pytest.raises(ConfigError, match="llmperf marker key 'conversation': .*" + re.escape(says)):
        validate({"conversation": value})


def test_a_bad_file_is_named_by_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^talk.json:3: not JSON"):
        parse_conversation('{\n "turns": [\n  "a",,\n ]\n}', "talk.json")
    with pytest.raises(ConfigError, match=r"^talk.json: turns\[0\] must be a non-empty string"):
        parse_conversation('{"turns": [""]}', "talk.json")
    with pytest.raises(ConfigError, match="conversation .*nope.json: no such file"):
        conversation(tmp_path / "nope.json")


def test_a_conversation_beyond_the_context_fails_before_its_first_measured_run(tiny_engine) -> None:
    too_long = Workload(conversation=["word " * 600, "more"], max_tokens=8, runs=1, warmup=0)
    with pytest.raises(EngineError, match="conversation of 2 turns .*context too small"):
        measure(tiny_engine, too_long)


def test_what_a_conversation_is_not_measured_with_yet() -> None:
    with pytest.raises(ConfigError, match="a conversation with concurrency is not supported yet"):
        validate({"conversation": TALK, "concurrency": 2})
    with pytest.raises(ConfigError, match="a conversation with layers is not supported yet"):
        validate({"conversation": TALK, "layers": True})
    with pytest.raises(ConfigError, match="turn names a turn of a conversation"):
        validate({"turn": 2})
    with pytest.raises(ConfigError, match="turn 4 needs a conversation of at least 4 turns"):
        validate({"conversation": TALK, "turn": 4})


# -- the user path: a callable on a Llama --------------------------------------------------------


def test_a_served_model_gets_each_turns_chat_and_reuses_its_slots_cache(llmperf_llama_server) -> None:
    engine = llmperf_llama_server.engine(api="completions")  # a conversation goes to chat/completions
    sent: list[dict] = []
    body = engine.body
    engine.body = lambda w, i: sent.append(body(w, i)) or sent[-1]
    try:
        m = measure(engine, W)
    finally:
        engine.close()
    assert [r.turn for r in m.runs] == [1, 2, 3] * 2
    first, second = sent[3], sent[4]  # the first measured run's turns 1 and 2 (3 warm-up turns before)
    assert first["cache_prompt"] is False and second["cache_prompt"] is True
    assert [x["role"] for x in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][:2] == first["messages"] and second["messages"][2]["content"]
    # llama-server's own figures: usage's prompt tokens less those its timings say it evaluated.
    assert all(r.native_prefill_ms is not None for r in m.runs)
    _reuse_is_measured(m)


def test_a_callable_is_given_each_turns_messages_with_its_replies_fed_back(tiny_model_path) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_model_path), n_ctx=1024, n_threads=1, verbose=False)
    seen: list[list[dict[str, str]]] = []

    def reply(messages, max_tokens):
        seen.append(messages)
        yield from llm.create_chat_completion(messages, max_tokens=max_tokens, stream=True)

    try:
        m = measure(reply, W)
    finally:
        llm.close()
    _reuse_is_measured(m)
    first, second = seen[3], seen[4]  # the first measured run's turns 1 and 2 (3 warm-up turns before)
    assert [x["role"] for x in second] == ["system", "user", "assistant", "user"]
    assert second[:2] == first and second[2]["content"]  # its own reply to turn 1, fed back
    assert all(r.native_prefill_ms is not None for r in m.runs)


def test_a_conversation_beyond_a_callables_llama_is_one_line(tiny_model_path) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_model_path), n_ctx=256, n_threads=1, verbose=False)

    def reply(messages, max_tokens):
        yield from llm.create_chat_completion(messages, max_tokens=max_tokens, stream=True)

    try:
        with pytest.raises(EngineError, match=r"^conversation turn 3: Requested tokens \(\d+\) exceed context window"):
            measure(reply, dataclasses.replace(W, max_tokens=40, warmup=1))
    finally:
        llm.close()


SUITE = """
import pytest

@pytest.mark.llmperf(conversation="talk.json", max_tokens=4, runs=2, ttft_p95_ms=5000)
def test_talk():
    pass
"""


def test_a_markers_bad_file_fails_in_one_line_and_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "talk.json").write_text('{"turns": ["a", 2]}', encoding="utf-8")
    before = sorted(os.listdir(pytester.path))
    result = run(pytester)
    line = (
        "test_suite.py::test_talk: llmperf marker key 'conversation': talk.json: turns[1] must be a "
        "non-empty string (a user message), got 2"
    )
    assert line in result.stdout.lines and result.ret != 0
    assert sorted(os.listdir(pytester.path)) == before


def test_a_changed_conversation_is_not_judged_against_the_baseline(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "talk.json").write_text(json.dumps(TALK), encoding="utf-8")
    run(pytester, "--llmperf-update-baselines").assert_outcomes(passed=1)
    (pytester.path / "talk.json").write_text(json.dumps({**TALK, "system": "Be long."}), encoding="utf-8")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    assert "conversation 'sha256:" in result.stdout.str()


def test_the_session_files_have_the_turns(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "talk.json").write_text(json.dumps(TALK), encoding="utf-8")
    result = run(pytester, "-rA", "--llmperf-json", "s.json", "--junitxml", "j.xml", "--llmperf-markdown", "s.md")
    result.assert_outcomes(passed=1)
    (stored,) = json.loads((pytester.path / "s.json").read_text())["results"]
    turns = stored["prompt"]["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and all(t["runs"] == 2 for t in turns)
    assert turns[0]["prompt_reused_tokens"] == 0 and turns[1]["prompt_reused_tokens"] >= turns[0]["prompt_tokens"]
    assert stored["record"]["prompt"] == stored["prompt"]
    assert stored["record"]["workload"]["conversation"].startswith("sha256:")
    assert "### Conversations, turn by turn" in (pytester.path / "s.md").read_text()
    assert "llmperf.turn2.prompt_reused_tokens" in (pytester.path / "j.xml").read_text()
    out = result.stdout.str()
    assert "turn 3 prompt tokens evaluated / reused" in out and "cold, yet llama.cpp" not in out
