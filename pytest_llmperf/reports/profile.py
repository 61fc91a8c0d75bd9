"""The whole breakdown of one model in one report: ``llmperf profile`` without the CLI.

Plain runs first (the figures), then the instrumented per-layer runs (they perturb timing, so
never mixed with the plain ones), the roofline against the machine's peaks, stability notes
and memory. The report is a JSON-ready dict whose fields are fixed by
``schemas/profile.schema.json``; the text and Markdown renderings are made from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..baselines.records import stored
from ..core.catalog import METRICS, SUMMARY
from ..core.formats import fmt, sig6
from ..core.measurement import LayerProfile, Memory, Roofline, Stability
from ..core.progress import current, task
from ..core.settings import DEFAULT_MODEL
from ..core.workload import Workload
from ..engines.llama_cpp_native import EngineConfig, check_gguf
from ..measuring.roofline import machine_peaks
from ..measuring.runner import measure
from ..measuring.worker import DEFAULT_TIMEOUT_S, WorkerEngine
from ..models.gguf import model_path
from . import text as breakdown

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..core.measurement import Measurement

PROFILE_SCHEMA = "pytest-llmperf/profile"
PROFILE_SCHEMA_VERSION = 1
#: The pooled ITL's statistics a profile reports, in their order (``LatencyStats``' ``<name>_ms``).
ITL_STATISTICS = ("p50", "p90", "p95", "p99", "mean", "stdev")
#: The engine's facts a profile's ``model`` and ``settings`` report under their own names.
MODEL_FIELDS = ("n_params", "quantization", "n_layer", "n_embd", "n_head", "n_head_kv")
SETTINGS_FIELDS = ("threads", "n_ctx", "n_batch", "gpu_layers")


def resolve_model(model: str | None) -> tuple[Path, str]:
    """(GGUF path, display name): a preset name (or nothing: the embedded default) is written once."""
    path, name = model_path(model or DEFAULT_MODEL)
    if name is None:
        path = check_gguf(str(path))
    return path, name or path.stem


def profile(
    model: str | None = None,
    *,
    prompt_tokens: int = 128,
    max_tokens: int = 64,
    runs: int = 10,
    warmup: int = 1,
    peak_bw_gbs: float | None = None,
    peak_tflops: float | None = None,
    reprobe_peaks: bool = False,
    engine_timeout_s: float | None = None,
    **settings: object,
) -> dict[str, Any]:
    """``settings``: llama.cpp settings by name (``core.workload.LLAMA_SETTINGS``: threads, n_ctx...).
    ``engine_timeout_s``: how long the model load and each run may take in the engine worker
    (the ``engine_timeout`` setting: ``--engine-timeout``, ``LLMPERF_ENGINE_TIMEOUT``; None: its default).
    Each step is said on the process's progress sink (``core.progress``: the CLI's stderr)."""
    workload = Workload(prompt_tokens=prompt_tokens, max_tokens=max_tokens, runs=runs, warmup=warmup)
    with task(f"profile {model or DEFAULT_MODEL}") as progress:
        progress.step("preparing the model")
        path, name = resolve_model(model)
        m = _measured(path, name, workload, settings, engine_timeout_s, (peak_bw_gbs, peak_tflops, reprobe_peaks))
    return _report(m, max_tokens, warmup, stored(m).diagnosis())


def _measured(
    path: Path,
    name: str,
    workload: Workload,
    settings: dict[str, object],
    engine_timeout_s: float | None,
    peaks_given: tuple[float | None, float | None, bool],
) -> Measurement:
    """The model loaded in an engine worker, the machine's peaks, the plain runs, then the
    instrumented per-layer runs (they perturb timing, so never mixed with the plain ones)."""
    progress = current()
    progress.step("loading it into llama.cpp")
    # In an engine worker: a model that crashes llama.cpp ends with the worker's one line.
    config = EngineConfig.named(str(path), settings)
    timeout_s = DEFAULT_TIMEOUT_S if engine_timeout_s is None else engine_timeout_s
    engine = WorkerEngine(config, name=name, timeout_s=timeout_s)
    try:
        progress.step("finding the machine's peak bandwidth and FLOP rate (probed once, then cached)")
        bw, tflops, refresh = peaks_given
        peaks = machine_peaks(given_bw_gbs=bw, given_tflops=tflops, refresh=refresh)
        progress.step("measuring")  # its parts say which: the timed runs, the per-layer timing
        return measure(engine, workload, layers=True, peaks=peaks)
    finally:
        engine.close()


def _report(m: Measurement, max_tokens: int, warmup: int, found: Mapping[str, object]) -> dict[str, Any]:
    """The report's JSON-ready fields (``schemas/profile.schema.json``)."""
    info, itl = m.engine, m.itl
    return {
        "schema": PROFILE_SCHEMA,
        "schema_version": PROFILE_SCHEMA_VERSION,
        "model": {
            "name": info.model,
            "path": info.model_path,
            "size_bytes": info.model_size_bytes,
            **{k: getattr(info, k) for k in MODEL_FIELDS},
            "load_ms": sig6(info.load_ms),
            "native_load_ms": sig6(info.native_load_ms),
        },
        "settings": {**{k: getattr(info, k) for k in SETTINGS_FIELDS}, "llama_cpp_python": info.backend_version},
        "workload": {"prompt_tokens": m.prompt_tokens, "max_tokens": max_tokens, "runs": m.n_runs, "warmup": warmup},
        "prefill": {
            "ms": sig6(m.prefill_ms),
            "ms_per_token": sig6(m.prefill_ms / m.prompt_tokens) if m.prefill_ms and m.prompt_tokens else None,
            "tps": sig6(m.prefill_tps),
            "native_ms": sig6(m.native_prefill_ms),
        },
        "decode": {
            "ms_per_token": sig6(m.tpot_ms),
            "tps": sig6(m.decode_tps),
            "native_ms_per_token": sig6(m.native_decode_ms_per_token),
        },
        "ttft_ms": {"p50": sig6(m.ttft_ms), "p95": sig6(m.ttft_p95_ms)},
        "itl_ms": {"count": itl.count, **{k: sig6(getattr(itl, f"{k}_ms")) for k in ITL_STATISTICS}},
        **found,
    }


def _summary_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The speed rows; labels and units from the metric catalog."""
    n = f"{r['workload']['runs']} runs"
    itl, mdl = r["itl_ms"], r["model"]
    ttft, pooled = METRICS["ttft_ms"], METRICS["itl_ms"]

    def row(key: str, value: float) -> tuple[str, str, str, str]:
        return (SUMMARY[key].label, SUMMARY[key].unit, fmt(value), n)

    return [
        ("model load (wall / llama.cpp)", "ms", f"{fmt(mdl['load_ms'])} / {fmt(mdl['native_load_ms'])}", "1 load"),
        row("prefill_ms", r["prefill"]["ms"]),
        ("prefill per token", SUMMARY["prefill_ms"].unit, fmt(r["prefill"]["ms_per_token"]), n),
        row("prefill_tps", r["prefill"]["tps"]),
        row("tpot_ms", r["decode"]["ms_per_token"]),
        row("decode_tps", r["decode"]["tps"]),
        (f"{ttft.label} p50 / p95", ttft.unit, f"{fmt(r['ttft_ms']['p50'])} / {fmt(r['ttft_ms']['p95'])}", n),
        (f"{pooled.label} p50 / p90", pooled.unit, f"{fmt(itl['p50'])} / {fmt(itl['p90'])}", f"{itl['count']} tokens"),
        (f"{pooled.label} p95 / p99", pooled.unit, f"{fmt(itl['p95'])} / {fmt(itl['p99'])}", f"{itl['count']} tokens"),
    ]


def render(r: dict[str, Any], form: str = "table", width: int | None = None) -> str:
    """``table`` (terminal), ``markdown`` or ``json``; ``width``: the table form's tables and
    lines fitted to a terminal that wide."""
    if form == "json":
        return json.dumps(r, indent=1, sort_keys=True, allow_nan=False)
    md = form == "markdown"
    mdl, s = r["model"], r["settings"]
    facts = (
        f"{mdl['name']}: {fmt(mdl['size_bytes'] / 2**20)} MiB, {mdl['quantization']}, "
        f"{mdl['n_params'] / 1e6:.1f} M params, {mdl['n_layer']} layers, width {mdl['n_embd']}, "
        f"{mdl['n_head']} heads ({mdl['n_head_kv']} KV); threads {s['threads']}, n_ctx {s['n_ctx']}, "
        f"n_batch {s['n_batch']}, GPU layers {s['gpu_layers']}, llama-cpp-python {s['llama_cpp_python']}"
    )
    w = r["workload"]
    work = f"{w['prompt_tokens']} prompt tokens, {w['max_tokens']} generated, {w['runs']} runs (+{w['warmup']} warm-up)"
    stability = Stability.from_json(r["stability"])
    rows = _summary_rows(r) + breakdown.stability_rows(stability) + breakdown.memory_rows(Memory.read(r["memory"]))
    headers = ("metric", "unit", "value", "sample")
    fit = None if md else width
    parts: list[tuple[str, str]] = [
        ("speed", breakdown.markdown_table(headers, rows) if md else breakdown.wrapped_table(headers, rows, fit)),
        ("per-layer time", breakdown.layers_text(LayerProfile.from_json(r["layers"]), md, width=fit)),
    ]
    if r.get("roofline"):
        parts.append(("roofline", breakdown.roofline_text(Roofline.from_json(r["roofline"]), md, width=fit)))
    warnings = list(stability.warnings) or ["stable: no run far off, CV within 10%"]
    stable = "\n".join(("- " if md else "") + w for w in warnings)
    parts.append(("stability", stable if fit is None else breakdown.wrap_text(stable, fit)))
    if md:
        return (
            "\n\n".join([f"# llmperf profile: {mdl['name']}", facts, work] + [f"## {t}\n\n{b}" for t, b in parts])
            + "\n"
        )
    head = [f"llmperf profile: {facts}", f"workload: {work}"]
    if fit is not None:
        head = [breakdown.wrap_text(line, fit) for line in head]
    return "\n\n".join(head + [f"{t}:\n{b}" for t, b in parts]) + "\n"
