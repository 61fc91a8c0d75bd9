"""A prompt set on the embedded default model: the runs draw their requests from
``prompts.jsonl`` (one request a line: a prompt or chat messages, optional ``max_tokens`` and
``weight``), in an order seeded by the workload's ``seed``, so a baseline, ``--llmperf-against``
and an A/B see the same requests in the same order. The set's content hash is part of the
workload: editing the file is a workload change, never judged as a regression."""

from pathlib import Path

import pytest

PROMPTS = Path(__file__).with_name("prompts.jsonl")


@pytest.mark.llmperf(prompt_set=str(PROMPTS), max_tokens=16, runs=8, ttft_ms=250, tpot_ms=30)
def test_my_traffic():
    pass


def test_my_traffic_through_my_code(llmperf, llmperf_llm):
    def reply(request, max_tokens):  # a prompt's text, or a chat request's messages
        if isinstance(request, str):
            yield from llmperf_llm.create_completion(request, max_tokens=max_tokens, stream=True)
        else:
            yield from llmperf_llm.create_chat_completion(request, max_tokens=max_tokens, stream=True)

    m = llmperf.measure(reply, prompt_set=PROMPTS, max_tokens=8, runs=6, ttft_ms=250)
    assert len({r.prompt_tokens for r in m.runs}) > 1  # the mix, not one prompt
