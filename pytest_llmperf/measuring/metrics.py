"""Traces -> metrics, exactly as docs/measurement.md defines them.

Per run: TTFT, prefill time and TPS, TPOT, decode TPS, E2E, the run's ITL p50/p95, and the
engine overhead per token against llama.cpp's own counters. Pooled over runs: ITL
percentiles. Percentiles interpolate linearly between order statistics (numpy's default).
The run, not the token, is the sampling unit for statistics; pooled ITL is for display and
budgets.

Stability (``diagnose``): is a measurement steady, and if not, what the system counters,
sampled before the first and after the last run (never inside a timed region), say about why
(steal time is the largest cause of slow sessions on a shared VM). A cause is named only when
its signal is there; an unstable measurement with no signal says so."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import resource
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np

from ..core.measurement import (
    OTHERS_PRESENT,
    LatencyStats,
    LengthBucket,
    Measurement,
    PromptLengths,
    RunMetrics,
    Stability,
    SystemDelta,
    SystemSample,
    TurnFigures,
)
from ..core.settings import usable_cpus
from ..core.workload import EngineInfo, RunTrace, Workload

NS_PER_MS = 1e6


def latency_stats(samples_ms: Sequence[float]) -> LatencyStats:
    """Distribution summary of latency samples in milliseconds."""
    values = np.asarray(samples_ms, dtype=float)
    if values.size == 0:
        raise ValueError("no latency samples")
    mean = float(values.mean())
    stdev = float(values.std(ddof=1)) if values.size > 1 else 0.0
    p50, p90, p95, p99 = (float(v) for v in np.percentile(values, [50, 90, 95, 99]))
    return LatencyStats(
        count=int(values.size),
        mean_ms=mean,
        stdev_ms=stdev,
        cv=stdev / mean if mean > 0 else 0.0,
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        p50_ms=p50,
        p90_ms=p90,
        p95_ms=p95,
        p99_ms=p99,
    )


def run_metrics(trace: RunTrace) -> RunMetrics:
    """One run's metrics from its trace (module docstring)."""
    tokens = trace.token_ns
    if len(tokens) < 2:
        raise ValueError(f"a run needs at least 2 generated tokens, got {len(tokens)}")
    itl = np.diff(np.asarray(tokens, dtype=np.int64)) / NS_PER_MS
    before_ms = trace.tokenize_ns / NS_PER_MS
    tokenize_ms = before_ms + trace.tokenize_in_run_ns / NS_PER_MS
    ttft_ms = before_ms + (tokens[0] - trace.start_ns) / NS_PER_MS
    e2e_ms = before_ms + (tokens[-1] - trace.start_ns) / NS_PER_MS
    tpot_ms = (e2e_ms - ttft_ms) / (len(tokens) - 1)
    prefill_ms, prefill_tps = _prefill(trace)
    native = trace.native
    native_decode = native.decode_ms_per_token if native else None
    python_ms = trace.python_sampling_ns / NS_PER_MS / len(tokens) if trace.python_sampling_ns is not None else None
    outside = _outside(trace, ttft_ms, tokenize_ms, tpot_ms, python_ms or 0.0)
    p50, p95 = (float(v) for v in np.percentile(itl, [50, 95]))
    return RunMetrics(
        prompt_tokens=trace.prompt_tokens,
        output_tokens=len(tokens),
        tokenize_ms=tokenize_ms,
        ttft_ms=ttft_ms,
        prefill_ms=prefill_ms,
        prefill_tps=prefill_tps,
        tpot_ms=tpot_ms,
        decode_tps=1000.0 / tpot_ms if tpot_ms > 0 else float("inf"),
        e2e_ms=e2e_ms,
        itl_p50_ms=p50,
        itl_p95_ms=p95,
        itl_ms=tuple(float(v) for v in itl),
        native_prefill_ms=native.prefill_ms if native else None,
        native_decode_ms_per_token=native_decode,
        # never below zero: where llama.cpp's counters exceed the clock, ``clock_gaps`` says by how much
        overhead_ms_per_token=max(tpot_ms - native_decode, 0.0) if native_decode is not None else None,
        sampling_ms_per_token=native.sample_ms_per_token if native else None,
        prefill_outside_ms=outside["prefill_outside_ms"],
        decode_outside_ms_per_token=outside["decode_outside_ms_per_token"],
        prompt_reused_tokens=trace.prompt_reused_tokens,
        python_sampling_ms_per_token=python_ms,
        **_delivered(trace, before_ms),
        clock_gaps=tuple((k, v) for k, v in outside.items() if k.endswith("_gap") and v is not None),
        sampler=native.sampler if native else "",
        turn=trace.turn,
        generations=trace.generations,
    )


#: Below this many ms (or ms/token), a part's difference is clock resolution, not disagreement.
CLOCK_GAP_TOLERANCE_MS = 0.001


def _outside(
    trace: RunTrace, ttft_ms: float, tokenize_ms: float, tpot_ms: float, python_ms: float
) -> dict[str, float | None]:
    """The time outside llama.cpp in each phase, never below zero; where llama.cpp's counters
    exceed the clock's time, 0 and the gap (``<part>_gap``: ms below zero)."""
    native = trace.native
    out: dict[str, float | None] = {"prefill_outside_ms": None, "decode_outside_ms_per_token": None}
    if native is None:
        return out
    raw = {
        "prefill_outside_ms": ttft_ms - tokenize_ms - native.prefill_ms if native.prefill_tokens else None,
        "decode_outside_ms_per_token": (
            tpot_ms - native.decode_ms_per_token - native.sampling_in_tpot_ms - python_ms
            if native.decode_ms_per_token is not None
            else None
        ),
    }
    for name, value in raw.items():
        if value is None:
            continue
        out[name] = max(value, 0.0)
        if value < -CLOCK_GAP_TOLERANCE_MS:
            out[name + "_gap"] = -value
    return out


class Delivered(TypedDict, total=False):
    """A run's stream as the caller received it (``RunMetrics``' ``delivered_*`` fields)."""

    delivered_items: int
    delivered_ttft_ms: float
    delivered_e2e_ms: float
    delivered_burst_tokens: int | None


def _delivered(trace: RunTrace, before_ms: float) -> Delivered:
    """The stream as the caller received it, beside the tokens as made (``RunTrace.delivered_ns``)."""
    items = trace.delivered_ns
    if not items:
        return {}
    made = np.asarray(trace.token_ns, dtype=np.int64)
    # tokens made up to each item (the first item carries every token made before it)
    upto = np.searchsorted(made, np.asarray(items, dtype=np.int64), side="right")
    carried = np.diff(np.concatenate(([0], upto)))
    return {
        "delivered_items": len(items),
        "delivered_ttft_ms": before_ms + (items[0] - trace.start_ns) / NS_PER_MS,
        "delivered_e2e_ms": before_ms + (items[-1] - trace.start_ns) / NS_PER_MS,
        "delivered_burst_tokens": int(carried.max()) if len(carried) else None,
    }


def _prefill(trace: RunTrace) -> tuple[float | None, float | None]:
    """(prefill ms, prefill tokens/s) of a run, where the engine saw the prefill end; the rate
    counts the prompt's tokens llama.cpp evaluated (a cached part is not prefill)."""
    if trace.prefill_done_ns is None:
        return None, None
    prefill_ms = (trace.prefill_done_ns - trace.start_ns) / NS_PER_MS
    evaluated = (trace.prompt_tokens or 0) - (trace.prompt_reused_tokens or 0)
    if evaluated > 0 and prefill_ms > 0:
        return prefill_ms, evaluated / prefill_ms * 1000.0
    return prefill_ms, None


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def summarize(traces: Sequence[RunTrace], workload: Workload, engine: EngineInfo, label: str = "") -> Measurement:
    """Per-run metrics, pooled ITL and medians over runs."""
    if not traces:
        raise ValueError("no runs to summarize")
    return summarize_runs(tuple(run_metrics(t) for t in traces), workload, engine, label)


def summarize_runs(
    runs: tuple[RunMetrics, ...], workload: Workload, engine: EngineInfo, label: str = ""
) -> Measurement:
    """Pooled ITL and medians over already computed runs (a measurement extended by more)."""
    ttfts = [r.ttft_ms for r in runs]

    def med(field: str) -> float | None:
        return _median([getattr(r, field) for r in runs])

    def med_all(field: str) -> float:  # a field every run has
        return float(statistics.median(getattr(r, field) for r in runs))

    return Measurement(
        label=label,
        workload=workload,
        engine=engine,
        runs=runs,
        itl=latency_stats([v for r in runs for v in r.itl_ms]),
        ttft_ms=float(statistics.median(ttfts)),
        ttft_p95_ms=float(np.percentile(ttfts, 95)),
        tpot_ms=med_all("tpot_ms"),
        decode_tps=med_all("decode_tps"),
        e2e_ms=med_all("e2e_ms"),
        tokenize_ms=med_all("tokenize_ms"),
        prefill_ms=med("prefill_ms"),
        prefill_tps=med("prefill_tps"),
        native_prefill_ms=med("native_prefill_ms"),
        native_decode_ms_per_token=med("native_decode_ms_per_token"),
        overhead_ms_per_token=med("overhead_ms_per_token"),
        prompt_tokens=runs[0].prompt_tokens,
        output_tokens=min(r.output_tokens for r in runs),
        sampling_ms_per_token=med("sampling_ms_per_token"),
        prefill_outside_ms=med("prefill_outside_ms"),
        decode_outside_ms_per_token=med("decode_outside_ms_per_token"),
        prompt_reused_tokens=_median_int([r.prompt_reused_tokens for r in runs]),
        python_sampling_ms_per_token=med("python_sampling_ms_per_token"),
        delivered_items=min((r.delivered_items for r in runs if r.delivered_items is not None), default=None),
        delivered_ttft_ms=med("delivered_ttft_ms"),
        delivered_e2e_ms=med("delivered_e2e_ms"),
        delivered_burst_tokens=max(
            (r.delivered_burst_tokens for r in runs if r.delivered_burst_tokens is not None), default=None
        ),
        prompt_lengths=prompt_lengths(runs) if workload.prompt_set is not None else None,
        turns=turn_figures(runs),
    )


def turn_figures(runs: Sequence[RunMetrics]) -> tuple[TurnFigures, ...]:
    """Each turn's figures, in turn order (empty: not a conversation)."""
    turns = sorted({r.turn for r in runs if r.turn is not None})
    return tuple(_turn(k, [r for r in runs if r.turn == k]) for k in turns)


def _turn(turn: int, runs: Sequence[RunMetrics]) -> TurnFigures:
    ttfts = [r.ttft_ms for r in runs]
    evaluated = [
        r.prompt_tokens - r.prompt_reused_tokens
        for r in runs
        if r.prompt_tokens is not None and r.prompt_reused_tokens is not None
    ]
    return TurnFigures(
        turn=turn,
        runs=len(runs),
        prompt_tokens=_median_int([r.prompt_tokens for r in runs]),
        evaluated_tokens=_median_int(list(evaluated)) if evaluated else None,
        reused_tokens=_median_int([r.prompt_reused_tokens for r in runs]),
        ttft_p50_ms=float(np.percentile(ttfts, 50)),
        ttft_p95_ms=float(np.percentile(ttfts, 95)),
        tpot_ms=float(statistics.median(r.tpot_ms for r in runs)),
    )


def of_turn(m: Measurement, turn: int) -> Measurement:
    """``m`` judged on one turn of its conversation (the ``turn`` key): that turn's runs, the
    workload naming the turn (part of its identity); the process's figures as measured."""
    runs = tuple(r for r in m.runs if r.turn == turn)
    if not runs:
        raise ValueError(f"no run of turn {turn}")
    one = summarize_runs(runs, dataclasses.replace(m.asked, turn=turn), m.engine, label=m.label)
    return dataclasses.replace(
        one, warmup_runs=tuple(r for r in m.warmup_runs if r.turn == turn), system=m.system, peak_rss=m.peak_rss
    )


#: Up to this many distinct prompt lengths, each is its own bucket; beyond, powers of two.
MAX_LENGTH_BUCKETS = 8


def length_buckets(lengths: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The buckets (lowest, highest tokens, both included) that prompt ``lengths`` (each >= 1)
    fall into, in order, none empty: each distinct length its own where there are at most
    ``MAX_LENGTH_BUCKETS`` (a set of a few prompts: one bucket per prompt length), else the powers
    of two they reach (2^k to 2^(k+1) - 1: TTFT grows with the prompt, so each bucket spans one
    doubling of it)."""
    distinct = sorted(set(lengths))
    if len(distinct) <= MAX_LENGTH_BUCKETS:
        return tuple((n, n) for n in distinct)
    return tuple((1 << k, (2 << k) - 1) for k in sorted({n.bit_length() - 1 for n in distinct}))


#: ``PromptLengths.rule``: how ``length_buckets`` chose.
LENGTH_RULES = ("one bucket per prompt length", "prompt lengths by powers of two")


def prompt_lengths(runs: Sequence[RunMetrics]) -> PromptLengths | None:
    """The figures of ``runs`` by prompt length (``PromptLengths``), where their prompts had at
    least two different known lengths; else None (one length: the measurement's own figures)."""
    lengths = [r.prompt_tokens for r in runs]
    known = [n for n in lengths if n is not None and n > 0]
    if len(known) < len(lengths) or len(set(known)) < 2:
        return None
    bounds = length_buckets(known)
    buckets = tuple(
        _bucket(low, high, [r for r in runs if low <= (r.prompt_tokens or 0) <= high]) for low, high in bounds
    )
    per_token = _per_prompt_token(runs, "prefill_ms")
    fit = _prefill_line(runs)
    return PromptLengths(
        rule=LENGTH_RULES[len(set(known)) > MAX_LENGTH_BUCKETS],
        n_runs=len(runs),
        buckets=buckets,
        ms_per_prompt_token=per_token,
        native_ms_per_prompt_token=_per_prompt_token(runs, "native_prefill_ms"),
        slope_ms_per_token=fit[0] if fit else None,
        intercept_ms=fit[1] if fit else None,
    )


def _bucket(low: int, high: int, runs: Sequence[RunMetrics]) -> LengthBucket:
    ttfts = [r.ttft_ms for r in runs]
    return LengthBucket(
        low_tokens=low,
        high_tokens=high,
        n_runs=len(runs),
        ttft_p50_ms=float(np.percentile(ttfts, 50)),
        ttft_p95_ms=float(np.percentile(ttfts, 95)),
        prefill_p50_ms=_median([r.prefill_ms for r in runs]) if all(r.prefill_ms is not None for r in runs) else None,
    )


def _evaluated(r: RunMetrics) -> int:
    """The prompt's tokens llama.cpp evaluated in run ``r`` (a cached part is not prefill)."""
    return (r.prompt_tokens or 0) - (r.prompt_reused_tokens or 0)


def _per_prompt_token(runs: Sequence[RunMetrics], field: str) -> float | None:
    """The median over runs of ``field`` (ms) per evaluated prompt token; None unless every run has it."""
    values = [getattr(r, field) for r in runs]
    if any(v is None for v in values) or any(_evaluated(r) <= 0 for r in runs):
        return None
    return float(statistics.median(v / _evaluated(r) for v, r in zip(values, runs)))


def _prefill_line(runs: Sequence[RunMetrics]) -> tuple[float, float] | None:
    """(slope ms per token, intercept ms) of the least-squares line of prefill against evaluated
    tokens, where every run has its prefill and there are two lengths at least."""
    xs = [_evaluated(r) for r in runs]
    ys = [r.prefill_ms for r in runs]
    if len(set(xs)) < 2 or any(y is None for y in ys):
        return None
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(intercept)


def _median_int(values: Sequence[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return int(statistics.median_low(present)) if present else None


#: A measurement is called unstable at a run-to-run CV above this.
UNSTABLE_CV = 0.10
#: A run is "far off" beyond the median + this many MADs of its peers (and 25% off the median).
FAR_RUN_MAD_FACTOR = 5.0


#: Steal above this share of the CPU time during the runs is named as a cause (and, beyond the
#: baseline's by ``regression.STEAL_MACHINE_SHARE``, blamed instead of the subject).
STEAL_NOTE_SHARE = 0.02


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) ticks of /proc/stat's ``cpu`` line (user nice system idle iowait irq
    softirq steal ...; guest time is already inside user)."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        ticks = [int(v) for v in fields[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    return (ticks[7], sum(ticks)) if len(ticks) == 8 and fields[0] == "cpu" else None


def _cpu_mhz() -> float | None:
    """Mean current clock over CPUs: cpufreq where the OS exposes it, else /proc/cpuinfo."""
    values = []
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"):
        with contextlib.suppress(OSError, ValueError):
            values.append(int(Path(path).read_text()) / 1000)
    if not values:
        try:
            with open("/proc/cpuinfo") as fh:
                values = [float(line.split(":")[1]) for line in fh if line.startswith("cpu MHz")]
        except (OSError, ValueError, IndexError):
            values = []
    return float(np.mean(values)) if values else None


def _schedstat_ns(pid: int) -> tuple[int, int] | None:
    """(on-CPU ns, runqueue-wait ns) summed over the threads of ``pid`` (/proc/PID/task/TID/schedstat:
    time on the CPU, time runnable but waiting for one, timeslices)."""
    run = wait = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        # A thread that ended between the listing and the read is left out.
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                fields = fh.read().split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
    return run, wait


def _process_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` in clock ticks (/proc/PID/stat; its ended threads included)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def _busy_ticks(engine_pid: int) -> tuple[int, int, int] | None:
    """(busy ticks of the whole machine, of the engine process, of this process): busy is user,
    nice, system, irq and softirq of /proc/stat's ``cpu`` line (idle, iowait and steal are not)."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        ticks = [int(v) for v in fields[1:8]]
    except (OSError, ValueError, IndexError):
        return None
    engine, own = _process_ticks(engine_pid), _process_ticks(os.getpid())
    if len(ticks) < 7 or engine is None or own is None:
        return None
    return ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6], engine, 0 if engine_pid == os.getpid() else own


def sample_system(engine_pid: int | None = None) -> SystemSample:
    """The machine's and the engine's counters now; ``engine_pid``: the engine worker's process
    (None: the engine runs in this one). Read between runs, never inside one."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    pid = os.getpid() if engine_pid is None else engine_pid
    return SystemSample(
        load,
        _cpu_mhz(),
        usage.ru_minflt,
        usage.ru_majflt,
        usage.ru_nivcsw,
        _cpu_ticks(),
        _schedstat_ns(pid),
        _busy_ticks(pid),
    )


def _cv(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=float)
    return float(np.std(v, ddof=1) / np.mean(v)) if len(v) > 1 and np.mean(v) else 0.0


def far_off(values: Sequence[float]) -> tuple[int, ...]:
    v = np.asarray(values, dtype=float)
    if len(v) < 3:
        return ()
    med = float(np.median(v))
    mad = float(np.median(np.abs(v - med)))
    return tuple(i for i, x in enumerate(v) if abs(x - med) > FAR_RUN_MAD_FACTOR * mad and abs(x - med) > 0.25 * med)


def context_slope(
    itl_runs: Sequence[Sequence[float]], prompt_tokens: int | None
) -> tuple[float | None, tuple[int, int] | None]:
    """Least-squares slope of ITL (ms) against context position, in us per token of context.

    The first gap of each run is left out (it carries first-token effects, reported apart).
    """
    base = (prompt_tokens or 0) + 1
    points = [(base + i, value) for itl in itl_runs for i, value in enumerate(itl[1:], start=1)]
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if len(set(xs)) < 3:
        return None, None
    slope_ms = float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])
    return slope_ms * 1e3, (min(xs), max(xs))


def diagnose(m: Measurement) -> Stability:
    """CV, spread, first-run/first-token effects, context slope of a Measurement; its
    ``warmup_runs`` (discarded runs) give the first-run slowdown, its ``system`` the causes."""
    system, warmup_runs = m.system, m.warmup_runs
    tpots, ttfts = _within_lengths(m, "tpot_ms"), _within_lengths(m, "ttft_ms")
    med_tpot, med_ttft = float(np.median(tpots)), float(np.median(ttfts))
    first_run, first_ttft = _first_run(warmup_runs, med_tpot, med_ttft)
    slope, span = context_slope([r.itl_ms for r in m.runs], m.prompt_tokens)
    tpot_cv, ttft_cv = _cv(tpots), _cv(ttfts)
    far = tuple(sorted(set(far_off(tpots)) | set(far_off(ttfts))))
    warnings = _warnings(_instability(len(m.runs), tpot_cv, ttft_cv, far), system, first_run)
    return Stability(
        n_runs=len(m.runs),
        tpot_cv=tpot_cv,
        tpot_spread_pct=(max(tpots) - min(tpots)) / med_tpot * 100 if med_tpot else 0.0,
        ttft_cv=ttft_cv,
        first_run_slowdown=first_run,
        first_run_ttft_slowdown=first_ttft,
        first_token_slowdown=_first_token_slowdown(m.runs),
        context_slope_us_per_token=slope,
        context_span=span,
        far_runs=far,
        warnings=tuple(warnings),
    )


def _within_lengths(m: Measurement, field: str) -> list[float]:
    """Each run's ``field``; where the prompts' lengths vary (``m.prompt_lengths``), each against
    the median of its length bucket's runs, times the median over all runs: how steady the runs
    were, not how much the mix of lengths spreads them (a set's long prompts are no unstable runs)."""
    values = [float(getattr(r, field)) for r in m.runs]
    if m.prompt_lengths is None:
        return values
    whole = float(np.median(values))
    out = list(values)
    for b in m.prompt_lengths.buckets:
        members = [i for i, r in enumerate(m.runs) if b.low_tokens <= (r.prompt_tokens or 0) <= b.high_tokens]
        median = float(np.median([values[i] for i in members])) if members else 0.0
        for i in members:
            out[i] = values[i] / median * whole if median > 0 else values[i]
    return out


def _first_run(
    warmup_runs: Sequence[RunMetrics], med_tpot: float, med_ttft: float
) -> tuple[float | None, float | None]:
    """The first (warm-up) run's TPOT and TTFT against the runs' medians; None without one."""
    if not warmup_runs:
        return None, None
    first = warmup_runs[0]
    return (first.tpot_ms / med_tpot if med_tpot else None, first.ttft_ms / med_ttft if med_ttft else None)


def _first_token_slowdown(runs: Sequence[RunMetrics]) -> float:
    """The median over runs of the first gap against the run's median gap (1.0: none to tell)."""
    first_token = [r.itl_ms[0] / float(np.median(r.itl_ms)) for r in runs if len(r.itl_ms) > 1 and np.median(r.itl_ms)]
    return float(np.median(first_token)) if first_token else 1.0


def _warnings(problems: Sequence[str], system: SystemDelta | None, first_run: float | None) -> list[str]:
    """The stability warnings: an unstable measurement, a slow first run."""
    warnings = []
    if problems:
        warnings.append(_unstable_warning(problems, system))
    if first_run is not None and first_run > 1.5:
        warnings.append(
            f"the first (warm-up) run was {first_run:.1f}x slower per token than the rest: keep warmup >= 1"
        )
    return warnings


def _instability(n_runs: int, tpot_cv: float, ttft_cv: float, far: Sequence[int]) -> list[str]:
    """What makes the runs unstable: TPOT or TTFT varying beyond ``UNSTABLE_CV``, runs far off."""
    problems = []
    if tpot_cv > UNSTABLE_CV:
        problems.append(f"TPOT varies {tpot_cv:.0%} (CV) across {n_runs} runs")
    if ttft_cv > UNSTABLE_CV:
        problems.append(f"TTFT varies {ttft_cv:.0%} (CV) across {n_runs} runs")
    if far:
        problems.append(f"run(s) {', '.join(str(i + 1) for i in far)} far off the others")
    return problems


def _unstable_warning(problems: Sequence[str], system: SystemDelta | None) -> str:
    """The warning for an unstable measurement: its problems, and the likely causes seen."""
    causes = likely_causes(system)
    why = (
        f"Likely causes: {'; '.join(causes)}."
        if causes
        else "No load, clock or page-fault signal was seen; more runs narrow the estimate."
    )
    return f"unstable measurement: {'; '.join(problems)}. {why}"


def likely_causes(system: SystemDelta | None) -> list[str]:
    """The seed's usual suspects, each only with its signal."""
    if system is None:
        return []
    return [cause for cause in (suspect(system) for suspect in SUSPECTS) if cause is not None]


def _other_load(system: SystemDelta) -> str | None:
    cpus = usable_cpus()
    loads = [x for x in (system.before.load_1m, system.after.load_1m) if x is not None]
    if loads and max(loads) > cpus:
        return f"other load: load average {max(loads):.1f} on {cpus} CPU(s) (llama.cpp's threads compete)"
    return None


def _steal(system: SystemDelta) -> str | None:
    steal = system.steal_share
    if steal is not None and steal >= STEAL_NOTE_SHARE:
        return f"the hypervisor gave {steal:.0%} of this VM's CPU time to other guests (steal)"
    return None


def _preemptions(system: SystemDelta) -> str | None:
    n = system.involuntary_switches
    if n <= 0:
        return None
    switches = f"{n} involuntary context switch{'' if n == 1 else 'es'}"
    others = system.others_cpu_share
    if others is not None and others < OTHERS_PRESENT:  # no one else ran: the engine's threads took turns
        return f"{switches} while no other process used the CPUs (the engine's own threads outnumber the cores)"
    return f"{switches} (other processes took these cores)"


def _page_faults(system: SystemDelta) -> str | None:
    if system.major_faults > 0:
        return f"{system.major_faults} major page faults (weights paged in from disk: mlock or more RAM)"
    return None


def _frequency_scaling(system: SystemDelta) -> str | None:
    mhz_before, mhz_after = system.before.cpu_mhz, system.after.cpu_mhz
    if mhz_before is not None and mhz_after is not None and abs(mhz_after - mhz_before) / mhz_before > 0.05:
        return f"frequency scaling: CPU clock {mhz_before:.0f} -> {mhz_after:.0f} MHz"
    return None


#: ``likely_causes``' suspects, in the order it names them: each the phrase for its signal, or
#: None where the run shows none.
SUSPECTS: tuple[Callable[[SystemDelta], str | None], ...] = (
    _other_load,
    _steal,
    _preemptions,
    _page_faults,
    _frequency_scaling,
)
