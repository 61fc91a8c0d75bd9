"""A Measurement as a plain JSON record: the format of baseline entries and session reports.

Per-run values (the statistics' sampling unit) and each run's ITL samples are kept raw, so a
later comparison can resample runs; the summary is for people reading the file.

A machine-speed reference that does not depend on the subject under test.

A float32 matrix product through numpy's BLAS, on all usable cores like the engine's threads,
timed 61 times (``measuring.roofline.probe_reference``); its figure is the fast end of those
times (``QUANTILE``): the machine's speed
when it gets its cores (a slower host CPU, a lower clock), not how busy it is. It shares
nothing with llama.cpp, so a llama.cpp or model regression can never move it. Taken after
each measurement, outside its timed region; stored with every record and shown beside a
comparison, but it decides no verdict: on this project's VM its drift did not follow
llama.cpp's (docs/verdicts.md). Steal time and context switches name a busy machine."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..core import catalog
from ..core.fingerprint import Fingerprint
from ..core.formats import sig6
from ..core.measurement import JsonValue, LoadStats, Measurement
from ..core.record import Record
from ..core.workload import MEMORY_FIELDS, ChatMessage
from ..measuring.metrics import diagnose
from ..measuring.roofline import REFERENCE_KIND, kv_cache_bytes

#: Per-run metric families stored and compared (from the metric catalog).
RUN_FIELDS = catalog.RUN_FIELDS


def run_values(m: Measurement) -> dict[str, list[float]]:
    """Per-run values by field; a field the engine cannot observe (None) is left out."""
    out: dict[str, list[float]] = {}
    for name in RUN_FIELDS:
        values = [getattr(r, name) for r in m.runs]
        present = [v for v in values if v is not None]
        if len(present) == len(values):
            out[name] = [sig6(v) for v in present]
    return out


def part_values(m: Measurement) -> dict[str, list[float]]:
    """Per-run values of the parts of each phase (``catalog.PARTS``) every run has; a part
    outside llama.cpp may be below 0 in a run (clock and counter noise), so they are kept apart
    from ``runs``."""
    out: dict[str, list[float]] = {}
    for part in catalog.PARTS:
        values = [getattr(r, part.name) for r in m.runs]
        if values and all(v is not None for v in values):
            out[part.name] = [sig6(v) for v in values]
    return out


def workload_identity(m: Measurement) -> dict[str, JsonValue]:
    """What must match for two measurements to be compared (the run count may differ)."""
    w = m.workload
    return {
        "prompt": w.prompt,
        # The workload's prompt as the engine tokenized it; a measured callable's is the one the
        # test gives it (what the callable builds from it, a system prompt added, is the user's
        # code under test: a change of it is judged and named, not a new workload).
        "prompt_tokens": w.prompt_tokens if m.engine.engine == "callable" else m.prompt_tokens,
        "max_tokens": w.max_tokens,
        "seed": w.seed,
        # Load tests: a run under concurrency 4 is not comparable with one under concurrency 1.
        "concurrency": w.concurrency,
        "rate": w.rate,
        # Served: a shared prompt prefix measures the prompt cache (only present when set, so
        # older baselines keep matching).
        **({"shared_prefix_tokens": w.shared_prefix_tokens} if w.shared_prefix_tokens else {}),
        # A callable's warm prompt cache measures the cache: never the same workload as cold
        # (only present when warm, so older baselines keep matching).
        **({"prompt_cache": w.prompt_cache} if w.prompt_cache != "cold" else {}),
        # A chat request: its messages as the test gives them, one JSON text (only present when set).
        **({"messages": chat_identity(w.messages)} if w.messages is not None else {}),
    }


def chat_identity(messages: Sequence[ChatMessage]) -> str:
    """Chat messages as a workload's identity holds them: ``[[role, content], ...]`` as JSON."""
    return json.dumps([list(m) for m in messages], ensure_ascii=False)


def record(m: Measurement, fingerprint: Fingerprint, *, commit: str | None, recorded_at: str) -> dict[str, JsonValue]:
    """``m`` as it is stored (``Record.to_json``): a baseline entry, a session file's record."""
    return Record(
        recorded_at=recorded_at,
        commit=commit,
        hardware=dict(fingerprint.hardware),
        subject=dict(fingerprint.subject),
        workload={**workload_identity(m), "runs": m.workload.runs, "warmup": m.workload.warmup},
        runs=run_values(m),
        itl_ms=tuple(tuple(sig6(v) for v in r.itl_ms) for r in m.runs),
        summary={
            "n_runs": m.n_runs,
            "itl_count": m.itl.count,
            **{key: sig6(field.read(m)) for key, field in catalog.SUMMARY.items()},
        },
        **diagnosis(m),
    ).to_json()


def diagnosis(m: Measurement) -> dict[str, Any]:
    """Where the time went, when known: layers, roofline, stability, memory (optional keys)."""

    out: dict[str, Any] = {"stability": diagnose(m).as_dict()}
    parts = part_values(m)
    if parts:
        out["parts"] = parts
    if m.layers is not None:
        out["layers"] = m.layers.as_dict()
    if m.attribution is not None:  # asked for (``attribution=True``): compared when the baseline has one
        out["attribution"] = m.attribution.to_json()
    if m.roofline is not None:
        out["roofline"] = m.roofline.as_dict()
    out["memory"] = memory_record(m, kv_cache_bytes(m.engine))
    prompt = prompt_record(m)
    if prompt:
        out["prompt"] = prompt
    if m.model_loads is not None:
        out["model_loads"] = m.model_loads.as_dict()
    if m.agreement is not None:  # judged against --llmperf-against's REF
        out["agreement"] = m.agreement.as_dict()
    if m.load is not None:
        out["load"] = load_record(m.load)
    if m.system is not None:
        runs = max(1, len(m.runs) + len(m.warmup_runs))
        out["machine"] = {
            **m.system.as_dict(),
            "involuntary_switches_per_run": round(m.system.involuntary_switches / runs, 2),
        }
    return out


def prompt_record(m: Measurement) -> dict[str, JsonValue]:
    """A measured callable's prompt as llama.cpp saw it and its stream as the caller got it
    (empty when the engine is the plugin's own, whose prompt is the workload's): the cache state,
    the prompt's tokens (median run), those evaluated and reused, and the delivered figures."""
    if m.prompt_reused_tokens is None and m.delivered_items is None:
        return {}
    out: dict[str, JsonValue] = {
        "prompt_cache": m.workload.prompt_cache,
        "prompt_tokens": m.prompt_tokens,
        "evaluated_prompt_tokens": m.evaluated_prompt_tokens,
        "prompt_reused_tokens": m.prompt_reused_tokens,
        "sampler": next((r.sampler for r in m.runs if r.sampler), ""),
    }
    if m.delivered_items is not None:
        out.update(
            delivered_items=m.delivered_items,
            delivered_ttft_ms=sig6(m.delivered_ttft_ms) if m.delivered_ttft_ms is not None else None,
            delivered_e2e_ms=sig6(m.delivered_e2e_ms) if m.delivered_e2e_ms is not None else None,
            delivered_burst_tokens=m.delivered_burst_tokens,
        )
    return out


#: A record's memory figures read from the engine (``EngineInfo``): llama.cpp's reported
#: buffers and the model file's mapping (smaps), MiB.
ENGINE_MEMORY = MEMORY_FIELDS


def memory_record(m: Measurement, computed_kv_bytes: int | None) -> dict[str, JsonValue]:
    """Memory, each figure from its most direct source: peak RSS of the engine's process over
    the runs, llama.cpp's reported buffers (``buffer_source``), the model file's mapping; the KV
    cache computed from the model's shape (``kv_cache_bytes``) only beside them, labelled so."""
    memory: dict[str, JsonValue] = {"kv_cache_bytes": computed_kv_bytes}
    if m.peak_rss is not None:
        memory.update(
            peak_rss_bytes=m.peak_rss.bytes, peak_rss_scope=m.peak_rss.scope, rss_mib=sig6(m.peak_rss.bytes / 2**20)
        )
    reported = {k: sig6(getattr(m.engine, k)) for k in ENGINE_MEMORY if getattr(m.engine, k) is not None}
    if reported:
        memory.update(reported, buffer_source="llama.cpp log")
    return memory


def load_record(s: LoadStats) -> dict[str, JsonValue]:
    """A load level's figures (the HTML report's throughput-latency curve)."""
    out: dict[str, JsonValue] = {
        "concurrency": s.concurrency,
        "rate_per_s": s.rate_per_s,
        "n_requests": s.n_requests,
        "n_ok": s.n_ok,
        "output_tps": sig6(s.output_tps),
        "requests_per_s": sig6(s.requests_per_s),
        "goodput": sig6(s.goodput),
        "ttft_p50_ms": sig6(s.ttft.p50_ms),
        "ttft_p99_ms": sig6(s.ttft.p99_ms),
        "tpot_p50_ms": sig6(s.tpot.p50_ms),
        "tpot_p99_ms": sig6(s.tpot.p99_ms),
        "prompt_cache": s.prompt_cache,
    }
    if s.server is not None:
        server: dict[str, JsonValue] = {
            k: sig6(v) if isinstance(v, float) else v for k, v in vars(s.server).items() if k != "metrics"
        }
        server["metrics"] = dict(s.server.metrics or {})
        out["server"] = server
    return out


def same_workload(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    """Differences between two records' workloads, as ``key a -> b`` strings."""
    keys = (
        "prompt",
        "prompt_tokens",
        "max_tokens",
        "seed",
        "concurrency",
        "rate",
        "shared_prefix_tokens",
        "prompt_cache",
        "messages",
    )
    wa, wb = catalog.stored_section(a, "workload"), catalog.stored_section(b, "workload")
    return [f"{k} {wa.get(k)!r} -> {wb.get(k)!r}" for k in keys if wa.get(k) != wb.get(k)]


#: The probe's figure is this low quantile of its products' times: the machine's speed when
#: it gets its cores. The median reads scheduling instead: with another process on one core,
#: BLAS threads that sleep between products wait a whole time slice (seen here: a median of
#: 16.0 ms against 1.1 ms, p10 1.2 ms, while llama.cpp's spinning threads lost 10-20%).
#: Contention is read from steal time and the runs' own spread, not from the probe.
QUANTILE = 0.10


def _figure(runs_ms: list[float]) -> float:
    s = sorted(float(v) for v in runs_ms)
    return s[int(QUANTILE * (len(s) - 1))]


def slowdown(baseline: object, candidate: object) -> float | None:
    """Candidate/baseline ratio of the reference's figure (``QUANTILE`` of its times); None
    when either lacks one of the same kind or the data are not usable."""
    if not isinstance(baseline, Mapping) or not isinstance(candidate, Mapping):
        return None
    if baseline.get("kind") != REFERENCE_KIND or candidate.get("kind") != REFERENCE_KIND:
        return None
    try:
        b = _figure(baseline["runs_ms"])
        c = _figure(candidate["runs_ms"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return c / b if b > 0 and c > 0 else None
