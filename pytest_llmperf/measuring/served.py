"""Served load: concurrency and Poisson arrivals against an HTTP engine, per-request distributions,
goodput, sweeps, and the server's own clock and counts beside the client's.

Latency under load: many requests, ``concurrency`` in flight, or Poisson arrivals at ``rate``.

Each request is one engine run, so per-request TTFT, TPOT and E2E come from the same
definitions as a single-stream measurement. On top: the distributions over requests
(p50/p90/p95/p99), output tokens/s overall and per request, requests/s, and goodput: the share
of *all* requests (failed ones count as misses) that met the SLOs, given as the ``ttft_ms``
and ``tpot_ms`` budgets. A failed request is kept with its one-line reason, never dropped.

Closed loop (no rate): ``concurrency`` requests in flight, the next sent as soon as one
finishes. Rate mode: requests are sent at seeded exponential gaps (a Poisson process), at most
``concurrency`` at once (unbounded when not given); TTFT counts from the send. More than one in
flight needs an engine that declares ``ConcurrentRuns``. An ``AsyncRuns`` engine (the HTTP
engine: ``arun``) runs every request as a task on one asyncio event loop (httpx's AsyncClient):
at 64 in flight no thread switch sits between a line's arrival and its stamp
(benchmarks/client_overhead.py); other engines run in a thread pool.

Every request of a load run gets its own request index (levels of a sweep do not repeat
indices), so synthetic prompts never repeat: no level is answered from a prompt cache that an
earlier level filled.

The server's own clock and counts beside the client's, for a served load level.

llama-server returns per-request ``timings`` (prompt_n, prompt_ms, predicted_n, predicted_ms;
kept as the run's ``NativeCounters``) and counts what it did in ``/metrics``. The gaps say what
the client-side figures hold beyond the model's work: TTFT minus the server's prompt time is
queueing, HTTP and streaming; TPOT minus the server's time per predicted token is what the
stream adds per token. ``prompt_n`` (tokens the server evaluated) against the prompt's length
shows whether a prompt cache answered part of a prompt."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..core import catalog
from ..core.errors import ConfigError, EngineError, one_line
from ..core.measurement import LoadStats, Measurement, RunMetrics, ServerSide, TraceReplay
from ..core.progress import task
from ..core.workload import NativeCounters, RunTrace, Workload
from ..engines.capabilities import AsyncRuns, ConcurrentRuns, Engine, ServerMetrics
from ..engines.http import delta
from .metrics import latency_stats, summarize

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")

#: Budget keys that double as per-request SLOs for goodput: each phase's judged time metric.
SLO_KEYS = tuple(catalog.PHASE_METRIC.values())


def arrival_offsets_s(n: int, rate_per_s: float, seed: int) -> np.ndarray:
    """Send times of a Poisson process: the first at 0, then exponential gaps of mean 1/rate."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def schedule_s(workload: Workload, n: int) -> Sequence[float] | None:
    """When each of the ``n`` requests is sent, seconds after the first: a trace's arrival
    times (scaled by its speed), Poisson arrivals at ``rate``, or None (closed loop)."""
    if workload.trace is not None:
        return workload.trace_offsets_s
    if workload.rate:
        return [float(x) for x in arrival_offsets_s(n, workload.rate, workload.seed)]
    return None


def meets_slo(run: RunMetrics, slo: Mapping[str, float]) -> bool:
    return all(getattr(run, key) <= limit for key, limit in slo.items() if key in SLO_KEYS)


def _check_engine(engine: Engine, workers: int, rate: float | None, trace: bool = False) -> None:
    # A user's engine may match the protocol by its member alone and still say False.
    if trace and not (isinstance(engine, ConcurrentRuns) and engine.concurrent_safe is True):
        raise ConfigError(
            "a trace is replayed against a served model (an HTTP endpoint: --llmperf-endpoint, or an "
            "HttpEngine), its requests sent at their arrival times; this engine runs one request at a time"
        )
    if workers > 1 and not (isinstance(engine, ConcurrentRuns) and engine.concurrent_safe is True):
        what = f"concurrency {workers}" if not rate else f"rate {rate:g}/s with up to {workers} requests in flight"
        raise ConfigError(
            f"{what} needs an engine that takes concurrent requests (an HTTP endpoint: "
            "--llmperf-endpoint); this engine runs one request at a time (concurrency=1 works)"
        )


def measure_load(
    engine: Engine, workload: Workload, label: str = "", slo: Mapping[str, float] | None = None, first_index: int = 0
) -> Measurement:
    """Warm up (sequentially, discarded), then send ``workload.n_requests`` requests, with
    request indices ``first_index``, ``first_index + 1``... (warm-ups: negative ones)."""
    slo = {k: float(v) for k, v in (slo or {}).items() if k in SLO_KEYS}
    n = workload.n_requests
    workers = workload.concurrency or (n if workload.rate or workload.is_trace else 1)
    _check_engine(engine, workers, workload.rate if not workload.concurrency else None, workload.is_trace)
    sent_ns: list[int] = [0] * n
    outcomes, server_before, begin_ns = _send(engine, workload, n, workers, first_index, sent_ns)
    server_after = _server_metrics(engine)
    traces, errors = _outcomes(outcomes)
    m = summarize(traces, workload, engine.info(), label=label)
    stats = dataclasses.replace(
        load_stats(traces, m.runs, errors, workers, workload.rate, slo),
        server=server_side(traces, m.runs, server_before, server_after),
        prompt_cache=workload.served_cache_note if m.engine.endpoint else None,
        trace=trace_replay(workload, begin_ns, sent_ns),
    )
    return dataclasses.replace(m, load=stats)


def trace_replay(workload: Workload, begin_ns: int, sent_ns: Sequence[int]) -> TraceReplay | None:
    """A trace replay's schedule beside when the client began each request (None: no trace)."""
    if workload.trace is None:
        return None
    return TraceReplay.of(
        n_requests=len(workload.trace),
        span_s=workload.trace[-1].t_s - workload.trace[0].t_s,
        speed=workload.trace_speed or 1.0,
        scheduled_s=workload.trace_offsets_s,
        sent_s=tuple((t - begin_ns) / 1e9 for t in sent_ns),
    )


def load_stats(
    traces: Sequence[RunTrace],
    runs: Sequence[RunMetrics],
    errors: tuple[str, ...],
    workers: int,
    rate: float | None,
    slo: Mapping[str, float],
) -> LoadStats:
    """The distributions over the successful requests (``runs``, of ``traces``), the rates
    over the level's span, and goodput over every request sent (``errors``: the failed ones)."""
    n = len(traces) + len(errors)
    end = max(t.token_ns[-1] for t in traces)
    duration_s = max((end - min(t.start_ns for t in traces)) / 1e9, 1e-9)
    ttft, tpot = latency_stats([r.ttft_ms for r in runs]), latency_stats([r.tpot_ms for r in runs])
    return LoadStats(
        concurrency=workers,
        rate_per_s=rate,
        n_requests=n,
        n_ok=len(traces),
        output_tps=sum(r.output_tokens for r in runs) / duration_s,
        requests_per_s=len(traces) / duration_s,
        goodput=sum(1 for r in runs if meets_slo(r, slo)) / n,
        ttft_p50_ms=ttft.p50_ms,
        ttft_p99_ms=ttft.p99_ms,
        tpot_p50_ms=tpot.p50_ms,
        tpot_p99_ms=tpot.p99_ms,
        errors=errors,
        duration_s=duration_s,
        ttft=ttft,
        tpot=tpot,
        e2e=latency_stats([r.e2e_ms for r in runs]),
        output_tps_per_request=float(statistics.median(r.output_tokens / r.e2e_ms * 1000 for r in runs)),
        slo=slo,
    )


def _outcomes(outcomes: Sequence[RunTrace | str | None]) -> tuple[list[RunTrace], tuple[str, ...]]:
    """The successful requests' traces, and "request i: <reason>" for each failed one; every
    request failed: an EngineError with the first reason."""
    traces = [o for o in outcomes if isinstance(o, RunTrace)]
    errors = tuple(f"request {i}: {o}" for i, o in enumerate(outcomes) if not isinstance(o, RunTrace))
    if not traces:
        raise EngineError(f"all {len(outcomes)} requests failed; first: {errors[0].split(': ', 1)[1]}")
    return traces, errors


#: The measured requests as they are sent: each one's outcome (its trace, or why it failed) and
#: when the client began it (``time.perf_counter_ns``), by request.
Sent = tuple[list[RunTrace | str | None], list[int]]


def _send(
    engine: Engine, workload: Workload, n: int, workers: int, first: int, sent_ns: list[int]
) -> tuple[list[RunTrace | str | None], dict[str, float] | None, int]:
    """The warm-ups (discarded), then the ``n`` requests: each one's trace or why it failed;
    the server's metrics read between the two; the clock when the first was due (``sent_ns``:
    when the client began each one). An engine with ``AsyncRuns`` sends them as tasks of one
    event loop, any other from a thread pool."""
    outcomes: list[RunTrace | str | None] = [None] * n
    if isinstance(engine, AsyncRuns):
        server_before, begin = _run_loop(_send_async(engine, workload, workers, first, (outcomes, sent_ns)))
    else:
        for i in range(workload.warmup):
            engine.run(workload, -1 - first - i)
        server_before = _server_metrics(engine)
        begin = _send_threads(engine, workload, workers, first, (outcomes, sent_ns))
    return outcomes, server_before, begin


def _send_threads(engine: Engine, workload: Workload, workers: int, first: int, sent: Sent) -> int:
    """The requests from a thread pool, at their scheduled times (``schedule_s``) or all at once;
    fills ``sent``; returns when the first was due."""
    outcomes, sent_ns = sent
    n = len(outcomes)

    def one(i: int) -> None:
        sent_ns[i] = time.perf_counter_ns()  # the client begins it: outside the request's own clock reads
        try:
            outcomes[i] = engine.run(workload, first + i)
        except Exception as exc:  # noqa: BLE001 - a bug must not vanish in a worker thread: reported per request
            outcomes[i] = one_line(exc)

    clock = time.perf_counter_ns
    schedule = schedule_s(workload, n)
    begin = clock()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llmperf-load") as pool:
        if schedule is not None:
            for i, offset in enumerate(schedule):
                delay = begin / 1e9 + offset - clock() / 1e9
                if delay > 0:
                    time.sleep(delay)
                pool.submit(one, i)
        else:
            for i in range(n):
                pool.submit(one, i)
    return begin


async def _send_async(
    engine: AsyncRuns, workload: Workload, workers: int, first: int, sent: Sent
) -> tuple[dict[str, float] | None, int]:
    """Warm-ups one by one, then all requests as tasks of this loop, at most ``workers`` in
    flight (a semaphore). The warm-ups run on the same client: the lazy imports of its first
    request and its first connection fall outside the measured requests. Returns the
    server's metrics read between the two."""
    _import_async_stack()
    slots = asyncio.Semaphore(workers)
    client = engine.async_client()
    try:
        for i in range(workload.warmup):
            await engine.arun(workload, -1 - first - i, client)
        server_before = _server_metrics(engine)  # blocking, but nothing else runs on the loop yet
        begin = await _send_measured(engine, workload, first, sent, slots, client)
    finally:
        await client.aclose()
    return server_before, begin


async def _send_measured(
    engine: AsyncRuns, workload: Workload, first: int, sent: Sent, slots: asyncio.Semaphore, client: httpx.AsyncClient
) -> int:
    """The requests as tasks, at their scheduled times (``schedule_s``) or all at once; fills
    ``sent``; returns when the first was due."""
    outcomes, sent_ns = sent
    n = len(outcomes)

    async def one(i: int) -> None:
        async with slots:
            sent_ns[i] = time.perf_counter_ns()  # the client begins it: outside the request's own clock reads
            try:
                outcomes[i] = await engine.arun(workload, first + i, client)
            except Exception as exc:  # noqa: BLE001 - a bug must not vanish in a task: reported per request
                outcomes[i] = one_line(exc)

    clock = time.perf_counter_ns
    schedule = schedule_s(workload, n)
    begin = clock()
    tasks = []
    if schedule is not None:
        for i, offset in enumerate(schedule):
            delay = begin / 1e9 + offset - clock() / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i)))
    else:
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    await asyncio.gather(*tasks)
    return begin


def _import_async_stack() -> None:
    """What httpx imports on an async client's first request (anyio's asyncio backend), here
    and not inside the first measured request (with warmup=0 there is no warm-up to pay it)."""
    with contextlib.suppress(ImportError):
        import anyio._backends._asyncio  # noqa: F401
        import httpcore._backends.anyio  # noqa: F401


def _run_loop(coro: Coroutine[object, object, T]) -> T:
    """``asyncio.run``; in a helper thread when this thread already runs a loop (Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmperf-loop") as pool:
        return pool.submit(asyncio.run, coro).result()


def _server_metrics(engine: object) -> dict[str, float] | None:
    return engine.server_metrics() if isinstance(engine, ServerMetrics) else None


def sweep(
    engine: Engine,
    workload: Workload,
    concurrencies: Sequence[int] = (1, 2, 4, 8),
    slo: Mapping[str, float] | None = None,
) -> list[Measurement]:
    """The latency-throughput curve: one load measurement per concurrency, in order; each
    level's requests have their own indices (no prompt repeats across levels)."""
    results, first = [], 0
    with task("load sweep") as progress:
        for i, c in enumerate(concurrencies):
            progress.step(f"concurrency {c}, level", i + 1, len(concurrencies))
            level = dataclasses.replace(workload, concurrency=c)
            results.append(measure_load(engine, level, label=f"concurrency {c}", slo=slo, first_index=first))
            first += level.n_requests + level.warmup
    return results


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


#: One request that carried the server's timings: (its counters, its trace, its metrics).
Timed = tuple[NativeCounters, RunTrace, RunMetrics]


def server_side(
    traces: Sequence[RunTrace],
    runs: Sequence[RunMetrics],
    before: dict[str, float] | None,
    after: dict[str, float] | None,
) -> ServerSide | None:
    """None when the server gave neither timings nor metrics (not llama-server)."""
    timed = [(t.native, t, r) for t, r in zip(traces, runs) if t.native is not None]
    metrics = delta(before, after)
    if not timed and not metrics:
        return None
    prompt_n = [n.prefill_tokens for n, _, _ in timed]
    prompt_ms, ttft_gap_ms, ms_per_token, tpot_gap_ms = _server_times(timed)
    return ServerSide(
        n_timed=len(timed),
        prompt_tokens_median=_median([t.prompt_tokens for _, t, _ in timed if t.prompt_tokens is not None]),
        prompt_n_min=min(prompt_n, default=None),
        prompt_n_median=_median(prompt_n),
        prompt_n_max=max(prompt_n, default=None),
        server_prompt_ms_p50=prompt_ms,
        ttft_gap_ms_p50=ttft_gap_ms,
        server_ms_per_token_p50=ms_per_token,
        tpot_gap_ms_p50=tpot_gap_ms,
        metrics=metrics,
        prompt_tokens_from_cache=_from_cache(timed),
    )


def _server_times(timed: Sequence[Timed]) -> tuple[float | None, float | None, float | None, float | None]:
    """Medians of the server's prompt time, the client's TTFT beyond it, the server's time per
    predicted token and the client's TPOT beyond it (module docstring: what the gaps hold)."""
    decoded = [(n.decode_ms / n.decode_tokens, r) for n, _, r in timed if n.decode_tokens]
    return (
        _median([n.prefill_ms for n, _, _ in timed]),
        _median([r.ttft_ms - n.prefill_ms for n, _, r in timed]),
        _median([per_token for per_token, _ in decoded]),
        _median([r.tpot_ms - per_token for per_token, r in decoded]),
    )


def _from_cache(timed: Sequence[Timed]) -> int | None:
    """Prompt tokens the server took from its cache (prompt length - prompt_n, summed); None
    unless every timed request's prompt length is known."""
    lengths = [(t.prompt_tokens, n.prefill_tokens) for n, t, _ in timed if t.prompt_tokens is not None]
    return sum(length - evaluated for length, evaluated in lengths) if timed and len(lengths) == len(timed) else None
