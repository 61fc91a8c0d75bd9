"""Runs token by token (``engines.capabilities.SteppedRuns``): what ``--llmperf-against``'s pairs
need of an engine to take turns with the other side's step by step.

A stepped run pauses before its prompt and after each token; the pauses are taken out of its
clock readings, and it computes what the plain run computes. A callable is stepped only while
it shows that it computes nothing while paused (the fixtures' Llama's counters, read around
every pause); one that makes its tokens ahead of the reader, or that does not drive that Llama,
raises ``NotSteppable``.

No timing is asserted beyond what the pauses make certain: each pause sleeps 40 ms, far longer
than a step of the tiny preset (under a millisecond), and the trace must not hold them."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

from pytest_llmperf import LlamaCppEngine, Workload
from pytest_llmperf.core.errors import NotSteppable
from pytest_llmperf.engines import CallableEngine, SteppedCallableEngine
from pytest_llmperf.engines.capabilities import SteppedRuns
from pytest_llmperf.engines.llama_cpp import LlamaCounters

W = Workload(prompt_tokens=16, max_tokens=8)
PAUSE_S = 0.04


class Pauses:
    """A pause that sleeps ``PAUSE_S`` and counts itself."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        time.sleep(PAUSE_S)

    @property
    def total_ms(self) -> float:
        return self.n * PAUSE_S * 1000.0


def span_ms(trace: Any) -> float:
    return (trace.token_ns[-1] - trace.start_ns) / 1e6


@pytest.mark.parametrize("sample", [False, True], ids=["fed", "sampling"])
def test_a_stepped_run_computes_the_plain_run_and_leaves_its_pauses_out(tiny_model_path, sample: bool) -> None:
    engine = LlamaCppEngine(tiny_model_path, threads=1, sample=sample)
    try:
        assert isinstance(engine, SteppedRuns)
        plain = engine.run(W, 0)
        pauses = Pauses()
        stepped = engine.run_stepped(W, 0, pauses)
    finally:
        engine.close()
    assert pauses.n == W.max_tokens  # before the prompt, then after each token but the last
    assert stepped.token_ids == plain.token_ids and len(stepped.token_ns) == W.max_tokens
    native = stepped.native
    assert native is not None and native.prefill_tokens == 16 and native.decode_tokens == W.max_tokens - 1
    # llama.cpp's own time lies inside the steps; the 7 pauses of decode (280 ms) do not.
    decode_ms = (stepped.token_ns[-1] - stepped.token_ns[0]) / 1e6
    assert native.decode_ms <= decode_ms + 0.5
    assert span_ms(stepped) < native.prefill_ms + native.decode_ms + 0.5 * pauses.total_ms
    assert list(stepped.token_ns) == sorted(stepped.token_ns) and stepped.prefill_done_ns is not None


def tokens(llm, prompt: str, max_tokens: int):
    """``Llama.generate``'s token ids, lazily: each is made when asked. (The tiny preset's text
    is bytes that ``create_completion`` holds back to the end, so its chunks would not be one a
    token.)"""
    llm.reset()
    for n, token in enumerate(llm.generate(llm.tokenize(prompt.encode()), temp=0.0), 1):
        yield token
        if n >= max_tokens:
            return


def stream(llm):
    """A lazy wrapper: a token is made when the reader asks for it."""

    def fn(prompt: str, max_tokens: int):
        yield from tokens(llm, prompt, max_tokens)

    return fn


def ahead(llm):
    """A wrapper that makes its tokens in a thread, ahead of the reader, one every 5 ms at most (as a
    server streams them): it is still making them while the reader pauses."""

    def fn(prompt: str, max_tokens: int):
        made: queue.Queue[Any] = queue.Queue()

        def produce() -> None:
            for token in tokens(llm, prompt, max_tokens):
                made.put(token)
                time.sleep(0.005)
            made.put(None)

        worker = threading.Thread(target=produce)
        worker.start()
        try:
            while (token := made.get(timeout=60)) is not None:
                yield token
        finally:
            worker.join(timeout=60)

    return fn


def no_llama(prompt: str, max_tokens: int):
    yield from range(max_tokens)


def test_a_callable_on_the_fixtures_llama_runs_token_by_token(tiny_engine) -> None:
    llm = tiny_engine.llm
    engine = SteppedCallableEngine(stream(llm), counters=LlamaCounters(llm))
    assert isinstance(engine, SteppedRuns) and not isinstance(CallableEngine(stream(llm)), SteppedRuns)
    llm.reset()
    pauses = Pauses()
    trace = engine.run_stepped(W, 0, pauses)
    assert pauses.n == len(trace.token_ns) + 1 == W.max_tokens + 1  # before the first token, after each
    assert trace.native is not None and trace.native.decode_tokens == W.max_tokens - 1  # the first from the prompt
    assert span_ms(trace) < trace.native.prefill_ms + trace.native.decode_ms + 0.5 * pauses.total_ms


def test_a_callable_that_makes_its_tokens_ahead_of_the_reader_is_not_steppable(tiny_engine) -> None:
    llm = tiny_engine.llm
    engine = SteppedCallableEngine(ahead(llm), counters=LlamaCounters(llm))
    llm.reset()
    with pytest.raises(NotSteppable, match="ran llama.cpp while paused between tokens"):
        engine.run_stepped(W, 0, Pauses())
    plain = SteppedCallableEngine(ahead(llm), counters=LlamaCounters(llm)).run(W, 0)  # unstepped, it measures
    assert len(plain.token_ns) >= 2


def test_a_callable_that_does_not_drive_the_llama_is_not_steppable(tiny_engine) -> None:
    engine = SteppedCallableEngine(no_llama, counters=LlamaCounters(tiny_engine.llm))
    with pytest.raises(NotSteppable, match="did not call the fixtures' Llama"):
        engine.run_stepped(W, 0, Pauses())
