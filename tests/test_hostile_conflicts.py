"""Values given twice: never read silently last-wins. A JSON object with a key twice (a
baseline file left by a merge, a session report, a cache, a server's event or reply) is
refused naming the key; a server whose stream contradicts itself (two models, two prompt
counts, usage against llama-server's timings) fails the run naming both values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmperf.baselines import store
from pytest_llmperf.core.documents import DuplicateKey, loads
from pytest_llmperf.core.errors import EngineError
from pytest_llmperf.engines.sse import StreamState, parse_event

URL = "http://127.0.0.1:1/v1/completions"


@pytest.mark.parametrize(
    "text, key",
    [
        ('{"a": 1, "a": 2}', "'a'"),
        ('{"tests": {"t": {"hw": {"x": 1, "x": 1}}}}', "'x'"),  # deep, and the same value twice too
        ('[{"k": [], "k": {}}]', "'k'"),
    ],
)
def test_a_json_object_giving_a_key_twice_is_refused_naming_it(text, key) -> None:
    with pytest.raises(DuplicateKey) as caught:
        loads(text)
    assert str(caught.value).startswith(f"duplicate key {key} in one JSON object (") and "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # caught where bad JSON is


def test_json_without_duplicates_reads_as_json_does() -> None:
    text = '{"a": {"b": [1, {"c": null}]}, "b": 1.5}'
    assert loads(text) == json.loads(text)


def test_a_baseline_file_with_a_test_given_twice_fails_in_one_line_naming_the_key(tmp_path: Path) -> None:
    """A merge of two branches' baseline files can leave one test's entry twice."""
    path = tmp_path / "test_x.json"
    path.write_text(
        '{"schema": "pytest-llmperf/baselines", "tests": {"test_x.py::test_a": {}, "test_x.py::test_a": {}}}'
    )
    with pytest.raises(store.BaselineError) as caught:
        store.load(path)
    line = str(caught.value)
    assert "\n" not in line and f"baseline file {path} has a duplicate key 'test_x.py::test_a'" in line
    assert "re-record with --llmperf-update-baselines" in line


def test_a_session_report_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    from pytest_llmperf.reports.session_file import read_session

    path = tmp_path / "s.json"
    path.write_text('{"schema": "pytest-llmperf/session", "schema": "other", "results": []}')
    with pytest.raises(store.BaselineError, match=r"duplicate key 'schema' in one JSON object"):
        read_session(path)


def test_a_cache_with_a_key_twice_is_probed_again(tmp_path: Path) -> None:
    from pytest_llmperf.measuring.roofline import _read_cache

    path = tmp_path / "peaks.json"
    path.write_text('{"m": {"bw": 1}, "m": {"bw": 2}}')
    assert _read_cache(path) == {}


def test_a_server_event_with_a_key_twice_fails_the_run_naming_it() -> None:
    with pytest.raises(EngineError, match=r"^malformed event from .*: duplicate key 'choices' in one JSON object"):
        parse_event('{"choices": [{"text": "a"}], "choices": []}', URL)


def _event(text: str = "a", *, finish: str | None = None, **extra: object) -> str:
    return json.dumps({"choices": [{"text": text, "finish_reason": finish}], **extra})


def _stream(*events: str, max_tokens: int = 3) -> StreamState:
    state = StreamState(URL, "completions", max_tokens)
    for i, data in enumerate(events):
        state.feed(data, 1000 * (i + 1))
    return state


def test_a_stream_naming_two_models_fails_the_run() -> None:
    with pytest.raises(EngineError, match=r"conflicting values from .* model 'tiny', then 'other'; the run is not"):
        _stream(_event(model="tiny"), _event(model="other"))
    assert _stream(_event(model="tiny"), _event(model="tiny"), _event()).model == "tiny"


@pytest.mark.parametrize(
    "first, then, named",
    [
        (
            {"prompt_tokens": 4, "completion_tokens": 1},
            {"prompt_tokens": 5, "completion_tokens": 2},
            "prompt_tokens 4, then 5",
        ),
        (
            {"prompt_tokens": 4, "completion_tokens": 3},
            {"prompt_tokens": 4, "completion_tokens": 2},
            "completion_tokens 3, then 2",
        ),
    ],
)
def test_usages_that_contradict_each_other_fail_the_run(first, then, named) -> None:
    with pytest.raises(EngineError, match=f"usage.{named}"):
        _stream(_event(usage=first), _event(usage=then))


def test_usage_growing_event_by_event_is_no_conflict() -> None:
    """Some servers send a running usage in every event (vLLM's continuous usage stats)."""
    state = _stream(*(_event(usage={"prompt_tokens": 4, "completion_tokens": n}) for n in (1, 2, 3)), "[DONE]")
    trace, source = state.trace(0)
    assert source == "usage" and len(trace.token_ns) == 3


def test_usage_against_llama_servers_timings_fails_the_run_naming_both() -> None:
    timings = {"prompt_n": 4, "prompt_ms": 1.0, "predicted_n": 2, "predicted_ms": 2.0}
    state = _stream(_event(), _event(), _event(finish="length", usage={"completion_tokens": 3}, timings=timings))
    with pytest.raises(EngineError, match=r"usage.completion_tokens 3 but timings.predicted_n 2"):
        state.trace(0)
    timings["predicted_n"] = 3
    state = _stream(_event(), _event(), _event(finish="length", usage={"completion_tokens": 3}, timings=timings))
    assert state.trace(0)[1] == "usage"
