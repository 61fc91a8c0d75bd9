"""Where the time goes, as tables: per-layer times, the roofline, stability and memory.

Everything renders from the record-shaped dicts (``records.diagnosis``), so the test report's
detail section, ``llmperf profile`` (text, Markdown) and its JSON show the same figures.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..core.formats import fmt
from ..core.formats import render_table

BAR_WIDTH = 24


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    return markdown_table(headers, rows) if markdown else render_table(headers, rows)


def _bar(share: float, widest: float, markdown: bool) -> str:
    n = round(BAR_WIDTH * share / widest) if widest else 0
    return ("█" if markdown else "#") * n


def layer_rows(layers: Mapping[str, Any], markdown: bool = False) -> tuple[list[str], list[list[str]]]:
    """One row per segment: prefill and decode median ms and share, a bar of the decode share,
    and OUTLIER where the robust rule flags it."""
    pre, dec = layers["phases"]["prefill"], layers["phases"]["decode"]
    widest = max(dec["share"]) if dec["share"] else 0.0
    outliers = set(pre["outliers"]) | set(dec["outliers"])
    rows = []
    for i, name in enumerate(dec["names"]):
        rows.append(
            [
                name,
                fmt(pre["median_ms"][i]),
                f"{pre['share'][i]:.1%}",
                fmt(dec["median_ms"][i]),
                f"{dec['share'][i]:.1%}",
                _bar(dec["share"][i], widest, markdown),
                "OUTLIER" if name in outliers else "",
            ]
        )
    headers = ["segment", "prefill ms", "share", "decode ms/token", "share", "decode share", "flag"]
    return headers, rows


def layer_summary(layers: Mapping[str, Any]) -> list[str]:
    lines = []
    for phase in ("prefill", "decode"):
        p = layers["phases"][phase]
        lines.append(
            f"{phase}: {len(p['names']) - 1} layers + output head cover {p['coverage']:.1%} of the "
            f"instrumented step (median over {p['n_steps']} steps in {p['n_runs']} runs; step median "
            f"{fmt(p['step_ms'])} ms, segment medians sum to {fmt(sum(p['median_ms']))} ms)"
        )
    ratios = [
        f"{name} {layers[key]:.3f}x"
        for name, key in (("prefill", "prefill_overhead_ratio"), ("decode", "overhead_ratio"))
        if layers.get(key) is not None
    ]
    if ratios:
        lines.append("instrumentation cost (instrumented / plain, interleaved runs; prefill time, TPOT): " + ", ".join(ratios))
    lines.append(f"outlier rule: {layers['outlier_rule']}")
    return lines


def layers_text(layers: Mapping[str, Any], markdown: bool = False) -> str:
    headers, rows = layer_rows(layers, markdown)
    notes = layer_summary(layers)
    if markdown:
        return table(headers, rows, True) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    return table(headers, rows, False) + "\n" + "\n".join(notes)


def roofline_text(roof: Mapping[str, Any], markdown: bool = False) -> str:
    headers = ["phase", "verdict", "FLOP/byte", "bound t/s", "achieved t/s", "achieved GB/s", "MBU", "MFU"]
    rows = []
    for phase in ("prefill", "decode"):
        p = roof.get(phase)
        if p:
            rows.append(
                [
                    phase,
                    p["verdict"],
                    fmt(p["intensity_flop_per_byte"]),
                    fmt(p["bound_tps"]),
                    fmt(p["achieved_tps"]),
                    fmt(p["achieved_bw_gbs"]),
                    "n/a" if p.get("note") else f"{p['mbu']:.2f}",
                    f"{p['mfu']:.2f}",
                ]
            )
    notes = [
        f"peak bandwidth {fmt(roof['peak_bw_gbs'])} GB/s ({roof['peak_bw_source']}"
        + (f": {roof['peak_bw_detail']})" if roof.get("peak_bw_detail") else ")"),
        f"peak compute {fmt(roof['peak_tflops'] * 1e3)} GFLOP/s ({roof['peak_tflops_source']}"
        + (f": {roof['peak_tflops_detail']})" if roof.get("peak_tflops_detail") else ")"),
        f"machine balance {fmt(roof['machine_balance_flop_per_byte'])} FLOP/byte; below it a phase is "
        f"memory-bound; decode at mean context {fmt(roof['context_tokens'])} tokens",
    ] + [f"{phase}: {roof[phase]['note']}" for phase in ("prefill", "decode") if (roof.get(phase) or {}).get("note")]
    if markdown:
        return table(headers, rows, True) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    return table(headers, rows, False) + "\n" + "\n".join(notes)


def stability_rows(stab: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    n = f"{stab['n_runs']} runs"
    rows = [
        ("TPOT CV / spread", "", f"{stab['tpot_cv']:.1%} / {stab['tpot_spread_pct']:.1f}%", n),
        ("TTFT CV", "", f"{stab['ttft_cv']:.1%}", n),
        ("first token / median ITL", "x", f"{stab['first_token_slowdown']:.2f}", n),
    ]
    if stab.get("first_run_slowdown") is not None:
        rows.append(("warm-up run / median TPOT", "x", f"{stab['first_run_slowdown']:.2f}", "1 warm-up run"))
    if stab.get("context_slope_us_per_token") is not None:
        lo, hi = stab["context_span"]
        rows.append(
            ("ITL slope vs context", "us/token", f"{stab['context_slope_us_per_token']:+.3g}", f"positions {lo}-{hi}")
        )
    return rows


def memory_rows(memory: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    if memory.get("peak_rss_bytes") is not None:
        scope = "during the runs" if memory.get("peak_rss_scope") == "measurement" else "process lifetime"
        rows.append(("peak RSS", "MiB", fmt(memory["peak_rss_bytes"] / 2**20), scope))
    if memory.get("kv_cache_bytes") is not None:
        rows.append(("KV cache (whole context)", "MiB", fmt(memory["kv_cache_bytes"] / 2**20), "computed"))
    return rows
