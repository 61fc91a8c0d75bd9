"""Chat requests on the embedded default model: the messages go through the model's own chat
template (GGUF ``tokenizer.chat_template``), and rendering + tokenizing them is part of TTFT.
On a served model (``--llmperf-api chat``) the same messages go to /v1/chat/completions."""

import pytest

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Summarize the plot of Hamlet in three sentences."},
]


@pytest.mark.llmperf(messages=MESSAGES, max_tokens=32, runs=5, ttft_ms=250, tpot_ms=30)
def test_chat_request():
    pass


def test_chat_through_my_code(llmperf, llmperf_llm):
    def reply(messages, max_tokens):  # a callable is given the messages for create_chat_completion
        yield from llmperf_llm.create_chat_completion(messages, max_tokens=max_tokens, stream=True)

    m = llmperf.measure(reply, messages=MESSAGES, max_tokens=16, runs=3, ttft_ms=250)
    assert m.prompt_tokens > 20  # the template's rendering, tokenized
