"""The README's third command, ``python -m pytest examples``, on the real engine: every test
body's assertions hold. A budget may break on a busy machine (that is what budgets do); any
other failure or error is a broken example."""

from __future__ import annotations

from pathlib import Path

import pytest
from inner import run

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "test_inference_perf.py"


def test_example_suite_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inference_perf=EXAMPLE.read_text(encoding="utf-8"))
    result = run(pytester)
    reports = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert {r.nodeid.split("::")[1].split("[")[0] for r in reports} == {
        "test_decode_latency",
        "test_chat_turn",
        "test_long_prompt_prefill",
        "test_prompt_length_scaling",
        "test_where_the_time_goes",
    }
    for r in reports:
        # The plugin fails a test on a budget with one plain line; a test body's failure
        # is a traceback (not a str).
        assert r.passed or (isinstance(r.longrepr, str) and "budget" in r.longrepr), (r.nodeid, str(r.longrepr))
    errors = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when != "call" and r.failed]
    assert not errors, [str(e.longrepr) for e in errors]


CHAT = EXAMPLE.with_name("test_chat_perf.py")


def test_chat_example_runs(pytester: pytest.Pytester) -> None:
    """The chat example (README's first page): a marker's messages on the plugin's engine, and a
    wrapper calling ``create_chat_completion`` on ``llmperf_llm``."""
    pytester.makepyfile(test_chat_perf=CHAT.read_text(encoding="utf-8"))
    result = run(pytester)
    reports = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert {r.nodeid.split("::")[1] for r in reports} == {"test_chat_request", "test_chat_through_my_code"}
    for r in reports:
        assert r.passed or (isinstance(r.longrepr, str) and "budget" in r.longrepr), (r.nodeid, str(r.longrepr))
    errors = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when != "call" and r.failed]
    assert not errors, [str(e.longrepr) for e in errors]


PROMPT_SET = EXAMPLE.with_name("test_prompt_set_perf.py")


def test_prompt_set_example_runs(pytester: pytest.Pytester) -> None:
    """The prompt set example: a marker's JSONL file on the plugin's engine, and the same file
    given to ``llmperf.measure()`` with a callable on ``llmperf_llm``."""
    pytester.makepyfile(test_prompt_set_perf=PROMPT_SET.read_text(encoding="utf-8"))
    (pytester.path / "prompts.jsonl").write_text(
        EXAMPLE.with_name("prompts.jsonl").read_text(encoding="utf-8"), encoding="utf-8"
    )
    result = run(pytester)
    reports = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert {r.nodeid.split("::")[1] for r in reports} == {"test_my_traffic", "test_my_traffic_through_my_code"}
    for r in reports:
        assert r.passed or (isinstance(r.longrepr, str) and "budget" in r.longrepr), (r.nodeid, str(r.longrepr))
    errors = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when != "call" and r.failed]
    assert not errors, [str(e.longrepr) for e in errors]


CONVERSATION = EXAMPLE.with_name("test_conversation_perf.py")


def test_conversation_example_runs(pytester: pytest.Pytester) -> None:
    """The conversation example: a marker's JSON conversation on the plugin's engine (all turns
    pooled, and turn 3 alone), and the same file given to ``llmperf.measure()`` with a callable
    on ``llmperf_llm``."""
    pytester.makepyfile(test_conversation_perf=CONVERSATION.read_text(encoding="utf-8"))
    (pytester.path / "conversation.json").write_text(
        EXAMPLE.with_name("conversation.json").read_text(encoding="utf-8"), encoding="utf-8"
    )
    result = run(pytester)
    reports = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when == "call"]
    assert {r.nodeid.split("::")[1] for r in reports} == {
        "test_conversation",
        "test_conversation_last_turn",
        "test_conversation_through_my_code",
    }
    for r in reports:
        assert r.passed or (isinstance(r.longrepr, str) and "budget" in r.longrepr), (r.nodeid, str(r.longrepr))
    errors = [r for r in result.reprec.getreports("pytest_runtest_logreport") if r.when != "call" and r.failed]
    assert not errors, [str(e.longrepr) for e in errors]
