"""The server's own clock and counts beside the client's, for a served load level.

llama-server returns per-request ``timings`` (prompt_n, prompt_ms, predicted_n, predicted_ms;
kept as the run's ``NativeCounters``) and counts what it did in ``/metrics``. The gaps say what
the client-side figures hold beyond the model's work: TTFT minus the server's prompt time is
queueing, HTTP and streaming; TPOT minus the server's time per predicted token is what the
stream adds per token. ``prompt_n`` (tokens the server evaluated) against the prompt's length
shows whether a prompt cache answered part of a prompt.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..engines.http import delta
from .metrics import RunMetrics
from ..core.workload import RunTrace


@dataclass(frozen=True)
class ServerSide:
    """Medians over the requests that carried timings; ``metrics``: /metrics over the level."""

    n_timed: int
    prompt_tokens_median: float | None  # the prompt's length (usage.prompt_tokens)
    prompt_n_min: int | None  # prompt tokens the server evaluated (the rest came from its cache)
    prompt_n_median: float | None
    prompt_n_max: int | None
    server_prompt_ms_p50: float | None
    ttft_gap_ms_p50: float | None  # client TTFT - server prompt_ms
    server_ms_per_token_p50: float | None  # predicted_ms / predicted_n
    tpot_gap_ms_p50: float | None  # client TPOT - server ms per predicted token
    metrics: Mapping[str, float] | None = None  # llamacpp:* counters' change over the level
    # Sum over requests of prompt length - prompt_n: prompt tokens the server took from its cache.
    prompt_tokens_from_cache: int | None = None

    @property
    def tokens_per_decode(self) -> float | None:
        """Generated tokens per llama_decode call (> 1: requests were batched together)."""
        m = self.metrics or {}
        n = m.get("n_decode_total")
        return m["tokens_predicted_total"] / n if n and "tokens_predicted_total" in m else None


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def server_side(
    traces: Sequence[RunTrace],
    runs: Sequence[RunMetrics],
    before: dict[str, float] | None,
    after: dict[str, float] | None,
) -> ServerSide | None:
    """None when the server gave neither timings nor metrics (not llama-server)."""
    pairs = [(t, r) for t, r in zip(traces, runs) if t.native is not None]
    metrics = delta(before, after)
    if not pairs and not metrics:
        return None
    prompt_n = [t.native.prefill_tokens for t, _ in pairs]
    per_token = [t.native.decode_ms / t.native.decode_tokens for t, _ in pairs if t.native.decode_tokens]
    return ServerSide(
        n_timed=len(pairs),
        prompt_tokens_median=_median([t.prompt_tokens for t, _ in pairs if t.prompt_tokens is not None]),
        prompt_n_min=min(prompt_n) if prompt_n else None,
        prompt_n_median=_median(prompt_n),
        prompt_n_max=max(prompt_n) if prompt_n else None,
        server_prompt_ms_p50=_median([t.native.prefill_ms for t, _ in pairs]),
        ttft_gap_ms_p50=_median([r.ttft_ms - t.native.prefill_ms for t, r in pairs]),
        server_ms_per_token_p50=_median(per_token),
        tpot_gap_ms_p50=_median(
            [r.tpot_ms - t.native.decode_ms / t.native.decode_tokens for t, r in pairs if t.native.decode_tokens]
        ),
        metrics=metrics,
        prompt_tokens_from_cache=sum(t.prompt_tokens - t.native.prefill_tokens for t, _ in pairs)
        if pairs and all(t.prompt_tokens is not None for t, _ in pairs) else None,
    )


def rows(server: ServerSide | None) -> list[tuple[str, str, str, str]]:
    """Rows for the per-test table (same columns as ``report.metrics_table``)."""
    if server is None:
        return []
    from ..core.formats import fmt

    def opt(v: Any) -> str:
        return "-" if v is None else fmt(v)

    reqs = f"{server.n_timed} requests"
    out = []
    if server.n_timed:
        out += [
            ("server prompt tokens evaluated min/p50/max", "tokens",
             f"{server.prompt_n_min} / {opt(server.prompt_n_median)} / {server.prompt_n_max}",
             f"prompt {opt(server.prompt_tokens_median)} tokens"),
            ("prompt tokens the server took from its cache", "tokens", opt(server.prompt_tokens_from_cache), reqs),
            ("server prompt time p50 (timings)", "ms", opt(server.server_prompt_ms_p50), reqs),
            ("client TTFT - server prompt time p50", "ms", opt(server.ttft_gap_ms_p50), reqs),
            ("server time per token p50 (timings)", "ms", opt(server.server_ms_per_token_p50), reqs),
            ("client TPOT - server time per token p50", "ms", opt(server.tpot_gap_ms_p50), reqs),
        ]
    m = server.metrics or {}
    if "prompt_tokens_total" in m and "tokens_predicted_total" in m:
        out.append(("server /metrics: prompt / generated tokens", "tokens",
                    f"{m['prompt_tokens_total']:.0f} / {m['tokens_predicted_total']:.0f}", "this level"))
    if server.tokens_per_decode is not None:
        out.append(("server /metrics: tokens per decode call", "", fmt(server.tokens_per_decode),
                    f"{m['n_decode_total']:.0f} decode calls"))
    return out


def curve_lines(measurements: Sequence[Any]) -> list[str]:
    """One line per load level with the server's own figures beside the client's."""
    from ..core.formats import fmt

    def opt(v: Any) -> str:
        return "-" if v is None else fmt(v)

    out = []
    for m in measurements:
        s = m.load.server if m.load is not None else None
        if s is None:
            continue
        parts = []
        if s.n_timed:
            parts += [
                f"server evaluated {opt(s.prompt_n_median)} of {opt(s.prompt_tokens_median)} prompt tokens (p50), "
                f"{opt(s.prompt_tokens_from_cache)} from its cache in all",
                f"TTFT - server prompt {opt(s.ttft_gap_ms_p50)} ms",
                f"TPOT {opt(m.load.tpot.p50_ms)} vs server {opt(s.server_ms_per_token_p50)} ms/token",
            ]
        if s.tokens_per_decode is not None:
            parts.append(f"{fmt(s.tokens_per_decode)} tokens per decode call")
        out.append(f"server side, concurrency {m.load.concurrency}: " + "; ".join(parts))
    return out
