"""A multi-turn conversation on the embedded default model: each run sends the turns of
``conversation.json`` in order, turn k's chat being the system message, the user turns so far
and the model's own replies to the earlier ones, rendered through the model's chat template.
The prompt cache is kept between the turns of a run (cleared before its first), so a later turn
evaluates only its new tokens: the report says, turn by turn, the prompt tokens llama.cpp
evaluated and reused, TTFT p50/p95 and decode per token. Budgets apply over all turns pooled;
``turn=K`` judges turn K alone. The conversation's content hash is part of the workload."""

from pathlib import Path

import pytest

CONVERSATION = Path(__file__).with_name("conversation.json")


@pytest.mark.llmperf(conversation=str(CONVERSATION), max_tokens=16, runs=4, ttft_p95_ms=250, tpot_ms=30)
def test_conversation():
    pass


@pytest.mark.llmperf(conversation=str(CONVERSATION), turn=3, max_tokens=16, runs=4, ttft_ms=250)
def test_conversation_last_turn():
    pass


def test_conversation_through_my_code(llmperf, llmperf_llm):
    def reply(messages, max_tokens):  # turn k's messages, the earlier replies fed back
        yield from llmperf_llm.create_chat_completion(messages, max_tokens=max_tokens, stream=True)

    # llmperf_llm's context is fitted to the conversation's last turn before anything runs.
    m = llmperf.measure(reply, conversation=CONVERSATION, max_tokens=8, runs=3, ttft_p95_ms=250)
    assert {r.turn for r in m.runs} == {1, 2, 3}
    assert all(r.prompt_reused_tokens > 0 for r in m.runs if r.turn > 1)  # the prompt cache kept between turns
