"""What an engine hands back for one run: raw clock readings and the engine's own counters.

Nothing here is derived: metrics are computed later from these readings, so the timed loop
does no arithmetic and the raw data can be re-analysed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NativeCounters:
    """llama.cpp's own timings for one run (``llama_perf_context`` after a reset)."""

    prefill_ms: float
    prefill_tokens: int
    decode_ms: float
    decode_tokens: int
    #: llama.cpp's sampler counters (``llama_perf_sampler``): time in the sampler chain and calls.
    sample_ms: float | None = None
    sample_count: int = 0

    @property
    def sample_ms_per_token(self) -> float | None:
        return self.sample_ms / self.sample_count if self.sample_count and self.sample_ms is not None else None

    @property
    def decode_ms_per_token(self) -> float | None:
        return self.decode_ms / self.decode_tokens if self.decode_tokens else None


@dataclass(frozen=True)
class RunTrace:
    """Clock readings (``time.perf_counter_ns``) of one run, all in the driving process.

    ``start_ns``: the first engine call (prefill starts, or the request is sent);
    ``prefill_done_ns``: the engine finished evaluating the prompt (None if it cannot tell);
    ``token_ns``: when each generated token became available to the caller;
    ``tokenize_ns``: how long tokenizing a literal prompt took, just before ``start_ns``
    (it counts towards TTFT and E2E, as the caller waits for it).
    """

    start_ns: int
    prefill_done_ns: int | None
    token_ns: tuple[int, ...]
    prompt_tokens: int | None
    tokenize_ns: int = 0
    native: NativeCounters | None = None
    token_ids: tuple[int, ...] = ()
