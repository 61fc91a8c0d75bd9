"""A Measurement as a plain JSON record: the format of baseline entries and session reports.

Per-run values (the statistics' sampling unit) and each run's ITL samples are kept raw, so a
later comparison can resample runs; the summary is for people reading the file.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..core import catalog
from ..core.fingerprint import Fingerprint
from ..core.formats import sig6
from ..measuring.metrics import Measurement

#: Per-run metric families stored and compared (from the metric catalog).
RUN_FIELDS = catalog.RUN_FIELDS


def run_values(m: Measurement) -> dict[str, list[float]]:
    """Per-run values by field; a field the engine cannot observe (None) is left out."""
    out: dict[str, list[float]] = {}
    for name in RUN_FIELDS:
        values = [getattr(r, name) for r in m.runs]
        if all(v is not None for v in values):
            out[name] = [sig6(v) for v in values]
    return out


def workload_identity(m: Measurement) -> dict[str, Any]:
    """What must match for two measurements to be compared (the run count may differ)."""
    w = m.workload
    return {
        "prompt": w.prompt,
        "prompt_tokens": m.prompt_tokens,
        "max_tokens": w.max_tokens,
        "seed": w.seed,
        # Load tests: a run under concurrency 4 is not comparable with one under concurrency 1.
        "concurrency": w.concurrency,
        "rate": w.rate,
        # Served: a shared prompt prefix measures the prompt cache (only present when set, so
        # older baselines keep matching).
        **({"shared_prefix_tokens": w.shared_prefix_tokens} if w.shared_prefix_tokens else {}),
    }


def record(m: Measurement, fingerprint: Fingerprint, *, commit: str | None, recorded_at: str) -> dict[str, Any]:
    return {
        "recorded_at": recorded_at,
        "commit": commit,
        "hardware": dict(fingerprint.hardware),
        "subject": dict(fingerprint.subject),
        "workload": {**workload_identity(m), "runs": m.workload.runs, "warmup": m.workload.warmup},
        "runs": run_values(m),
        "itl_ms": [[sig6(v) for v in r.itl_ms] for r in m.runs],
        "summary": {
            "n_runs": m.n_runs,
            "itl_count": m.itl.count,
            **{key: sig6(field.read(m)) for key, field in catalog.SUMMARY.items()},
        },
        **diagnosis(m),
    }


def diagnosis(m: Measurement) -> dict[str, Any]:
    """Where the time went, when known: layers, roofline, stability, memory (optional keys)."""
    from ..measuring.roofline import kv_cache_bytes

    out: dict[str, Any] = {"stability": m.stability.as_dict()}
    if m.layers is not None:
        out["layers"] = m.layers.as_dict()
    if m.roofline is not None:
        out["roofline"] = m.roofline.as_dict()
    memory = {"kv_cache_bytes": kv_cache_bytes(m.engine)}
    if m.peak_rss is not None:
        memory.update(peak_rss_bytes=m.peak_rss.bytes, peak_rss_scope=m.peak_rss.scope)
    out["memory"] = memory
    if m.load is not None:
        out["load"] = load_record(m.load)
    if m.system is not None:
        runs = max(1, len(m.runs) + len(m.warmup_runs))
        out["machine"] = {**m.system.as_dict(), "involuntary_switches_per_run": round(m.system.involuntary_switches / runs, 2)}
    return out


def load_record(s: Any) -> dict[str, Any]:
    """A load level's figures (the HTML report's throughput-latency curve)."""
    out = {
        "concurrency": s.concurrency, "rate_per_s": s.rate_per_s, "n_requests": s.n_requests, "n_ok": s.n_ok,
        "output_tps": sig6(s.output_tps), "requests_per_s": sig6(s.requests_per_s), "goodput": sig6(s.goodput),
        "ttft_p50_ms": sig6(s.ttft.p50_ms), "ttft_p99_ms": sig6(s.ttft.p99_ms),
        "tpot_p50_ms": sig6(s.tpot.p50_ms), "tpot_p99_ms": sig6(s.tpot.p99_ms),
        "prompt_cache": s.prompt_cache,
    }
    if s.server is not None:
        out["server"] = {k: sig6(v) if isinstance(v, float) else v
                         for k, v in vars(s.server).items() if k != "metrics"}
        out["server"]["metrics"] = dict(s.server.metrics or {})
    return out


def same_workload(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Differences between two records' workloads, as ``key a -> b`` strings."""
    keys = ("prompt", "prompt_tokens", "max_tokens", "seed", "concurrency", "rate", "shared_prefix_tokens")
    wa, wb = a.get("workload", {}), b.get("workload", {})
    return [f"{k} {wa.get(k)!r} -> {wb.get(k)!r}" for k in keys if wa.get(k) != wb.get(k)]
