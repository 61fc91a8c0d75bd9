"""The timed loop of in-process llama.cpp: prefill, then one token per ``llama_decode`` call.

Apart from the engine because two callers drive it and must time the same work: the engine's
plain runs (``LlamaCppEngine.run``, on its own context) and per-layer timing
(``measuring.layers``, on a context with the eval callback installed). One loop, so a layer
profile's overhead ratio compares like with like. Everything the loop needs (token arrays,
batches pointing into them, the feed) is prepared before the first clock read: the timed
region holds llama.cpp's work and the few Python statements that call it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..core.errors import EngineError


@dataclass(frozen=True)
class TimedDecode:
    """The clock reads of one run (``time.perf_counter_ns``).

    ``token_ns[i]``: when output token i was available: token 0 when the prompt's logits were
    ready (fed) or sampled from them (sampling), every later one right after its step (after
    ``llama_synchronize`` when fed, after sampling otherwise). Step i (i >= 1) of decode runs
    from ``token_ns[i - 1]`` to ``token_ns[i]``.
    """

    start_ns: int
    prefill_done_ns: int
    token_ns: tuple[int, ...]
    token_ids: tuple[int, ...]


def split_prompt(n_tokens: int, n_batch: int) -> list[tuple[int, int]]:
    """(start, length) chunks of at most ``n_batch`` tokens, never a trailing 1-token chunk.

    llama.cpp books a synchronize after a single queued token as decode, not prefill; a
    one-token tail would move prompt time into the decode counters.
    """
    chunks = [(s, min(n_batch, n_tokens - s)) for s in range(0, n_tokens, n_batch)]
    if len(chunks) > 1 and chunks[-1][1] == 1:
        (s1, n1), (s2, _) = chunks[-2], chunks[-1]
        chunks[-2:] = [(s1, n1 - 1), (s2 - 1, 2)]
    return chunks


def timed_decode(
    lib: Any,
    ctx: Any,
    prompt_ids: Sequence[int],
    max_tokens: int,
    n_batch: int,
    *,
    feed: Sequence[int] | None,
    sampler: Any = None,
) -> TimedDecode:
    """Prefill ``prompt_ids`` on ``ctx`` (cleared by the caller), then generate ``max_tokens``.

    ``feed``: the tokens decode is fed, one per step, no sampler between the clock reads (as
    llama-bench's tg); None: greedy sampling with ``sampler`` inside the timed loop.
    """
    # The arrays must outlive the batches that point into them (kept in ``arrays``).
    arrays = [(lib.llama_token * n)(*prompt_ids[s : s + n]) for s, n in split_prompt(len(prompt_ids), n_batch)]
    prompt_batches = [lib.llama_batch_get_one(a, len(a)) for a in arrays]
    one = (lib.llama_token * 1)()
    batch_one = lib.llama_batch_get_one(one, 1)
    decode, sample, sync = lib.llama_decode, lib.llama_sampler_sample, lib.llama_synchronize
    clock = time.perf_counter_ns
    token_ns = [0] * max_tokens
    token_ids = [0] * max_tokens
    if feed is not None:
        token_ids = list(feed)
        fed = (lib.llama_token * max_tokens)(*token_ids)
    elif sampler is None:
        raise ValueError("timed_decode needs a feed or a sampler")

    start = clock()
    for batch in prompt_batches:
        if decode(ctx, batch) != 0:
            raise EngineError(f"llama_decode failed on the prompt ({len(prompt_ids)} tokens)")
    sync(ctx)
    prefill_done = clock()
    if feed is None:
        token = sample(sampler, ctx, -1)
        token_ns[0] = clock()
        token_ids[0] = token
        for i in range(1, max_tokens):
            one[0] = token
            if decode(ctx, batch_one) != 0:
                raise EngineError(f"llama_decode failed at generated token {i + 1}")
            token = sample(sampler, ctx, -1)
            token_ns[i] = clock()
            token_ids[i] = token
    else:
        token_ns[0] = prefill_done  # the first token's logits are ready
        for i in range(1, max_tokens):
            one[0] = fed[i - 1]
            if decode(ctx, batch_one) != 0:
                raise EngineError(f"llama_decode failed at generated token {i + 1}")
            sync(ctx)
            token_ns[i] = clock()
    return TimedDecode(start, prefill_done, tuple(token_ns), tuple(token_ids))
