"""Roofline: is a phase limited by memory bandwidth or by arithmetic, and how close is it?

Terms as in the project's metrics definitions: W = model bytes as stored (``llama_model_size``),
KV(c) = 2 * n_layer * n_head_kv * head_dim * c * bytes per K/V element, FLOPs per token
~= 2 * N_params + 4 * n_layer * n_embd * c; both W and N_params leave out the token-embedding
table when the output projection has its own weights (a token looks up one row of it: no
FLOPs, one row of bytes), as "active" parameters in those definitions. Decode reads W + KV(c) per token at the mean
context position c of the generated tokens. Prefill reads the weights once per micro-batch
(``n_batch`` tokens) plus the prompt's KV, and does the FLOPs of every prompt token. A phase
whose arithmetic intensity (FLOPs / byte) is below the machine balance (peak FLOP/s / peak
bytes/s) is memory-bound; above it, compute-bound. The bound TPS is the rate at which the
binding resource would be fully used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..core.workload import EngineInfo
from .machine_peak import Peak
from ..core.formats import sig6


@dataclass(frozen=True)
class PhaseRoofline:
    phase: str
    bytes_per_token: float
    flops_per_token: float
    intensity_flop_per_byte: float
    bound_tps: float
    achieved_tps: float
    achieved_bw_gbs: float
    mbu: float
    mfu: float
    verdict: str  # "memory-bound" | "compute-bound" | "cache-resident"
    note: str = ""  # why the DRAM roofline does not apply (cache-resident), else ""

    def line(self) -> str:
        mbu = "MBU n/a (fits in cache)" if self.verdict == CACHE_RESIDENT else "MBU n/a" if self.note else f"MBU {self.mbu:.2f}"
        text = (
            f"{self.phase}: {self.verdict} (intensity {self.intensity_flop_per_byte:.3g} FLOP/byte), "
            f"achieved {self.achieved_tps:.1f} t/s of bound {self.bound_tps:.1f} t/s, "
            f"{self.achieved_bw_gbs:.1f} GB/s, {mbu}, MFU {self.mfu:.2f}"
        )
        return text + (f"; {self.note}" if self.note else "")


#: A memory-bound phase that moved its bytes faster than the measured DRAM peak: its working
#: set (weights + KV) stays in the CPU caches between tokens, so DRAM bandwidth does not bound
#: it and a "utilisation" above 100% would be no utilisation at all.
CACHE_RESIDENT = "cache-resident"


def above_peak_note(achieved_gbs: float, peak_gbs: float, bytes_per_token: float, llc_bytes: int | None) -> str:
    """What is true when a memory-bound phase moved its bytes faster than the peak: the working
    set fits in the last-level cache, or (larger than it) the peak figure is too low."""
    moved = f"{achieved_gbs:.1f} GB/s achieved > {peak_gbs:.1f} GB/s peak, {bytes_per_token / 2**20:.1f} MiB per token"
    if llc_bytes is None or bytes_per_token <= llc_bytes:
        cache = f" <= {llc_bytes / 2**20:.0f} MiB last-level cache" if llc_bytes else ""
        return f"working set fits in cache; the DRAM roofline does not bound it ({moved}{cache})"
    return (
        f"the peak bandwidth figure is too low: the working set exceeds the {llc_bytes / 2**20:.0f} MiB "
        f"last-level cache yet {moved}; re-probe on a quiet machine (llmperf profile --reprobe-peaks) or "
        f"give --llmperf-peak-bw"
    )


@dataclass(frozen=True)
class Roofline:
    peak_bw: Peak
    peak_tflops: Peak
    context_tokens: float  # mean context position of the decoded tokens
    weights_bytes: int
    kv_bytes_per_token_of_context: float
    decode: PhaseRoofline
    prefill: PhaseRoofline | None

    @property
    def machine_balance_flop_per_byte(self) -> float:
        return self.peak_tflops.value * 1e12 / (self.peak_bw.value * 1e9)

    def as_dict(self) -> dict[str, Any]:
        def phase(p: PhaseRoofline | None) -> dict[str, Any] | None:
            if p is None:
                return None
            return {k: (v if isinstance(v, str) else sig6(v)) for k, v in p.__dict__.items() if k != "phase"}

        return {
            "peak_bw_gbs": sig6(self.peak_bw.value),
            "peak_bw_source": self.peak_bw.source,
            "peak_bw_detail": self.peak_bw.detail,
            "peak_tflops": sig6(self.peak_tflops.value),
            "peak_tflops_source": self.peak_tflops.source,
            "peak_tflops_detail": self.peak_tflops.detail,
            "machine_balance_flop_per_byte": sig6(self.machine_balance_flop_per_byte),
            "context_tokens": sig6(self.context_tokens),
            "weights_bytes": self.weights_bytes,
            "decode": phase(self.decode),
            "prefill": phase(self.prefill),
        }


def kv_bytes_per_position(info: EngineInfo) -> float | None:
    """Bytes of K and V cache one context position takes across all layers."""
    if None in (info.n_layer, info.n_head, info.n_head_kv, info.n_embd, info.kv_bytes_per_element):
        return None
    head_dim = info.n_embd // info.n_head  # type: ignore[operator]
    return 2 * info.n_layer * info.n_head_kv * head_dim * info.kv_bytes_per_element  # type: ignore[operator]


def kv_cache_bytes(info: EngineInfo) -> int | None:
    """The KV cache llama.cpp allocates for the whole context (n_ctx positions)."""
    per_pos = kv_bytes_per_position(info)
    return None if per_pos is None or info.n_ctx is None else int(per_pos * info.n_ctx)


def _phase(name: str, bytes_moved: float, flops: float, tokens: int, seconds: float, bw: Peak, fl: Peak) -> PhaseRoofline:
    peak_bps, peak_fps = bw.value * 1e9, fl.value * 1e12
    intensity = flops / bytes_moved
    bound_s = max(bytes_moved / peak_bps, flops / peak_fps)
    verdict = "memory-bound" if intensity < peak_fps / peak_bps else "compute-bound"
    achieved_bps = bytes_moved / seconds
    note = ""
    if verdict == "memory-bound" and achieved_bps > peak_bps:
        from .machine_peak import last_level_cache_bytes

        llc = last_level_cache_bytes()
        note = above_peak_note(achieved_bps / 1e9, bw.value, bytes_moved / tokens, llc)
        if llc is None or bytes_moved / tokens <= llc:
            verdict = CACHE_RESIDENT
    return PhaseRoofline(
        phase=name,
        bytes_per_token=bytes_moved / tokens,
        flops_per_token=flops / tokens,
        intensity_flop_per_byte=intensity,
        bound_tps=tokens / bound_s,
        achieved_tps=tokens / seconds,
        achieved_bw_gbs=bytes_moved / seconds / 1e9,
        mbu=bytes_moved / seconds / peak_bps,
        mfu=flops / seconds / peak_fps,
        verdict=verdict,
        note=note,
    )


def roofline(measurement: Any, bw: Peak, tflops: Peak) -> Roofline | None:
    """The roofline of a Measurement; None when the engine does not expose the model facts
    (e.g. a served model) or nothing was decoded."""
    info: EngineInfo = measurement.engine
    per_pos = kv_bytes_per_position(info)
    if per_pos is None or info.model_size_bytes is None or info.n_params is None or not measurement.tpot_ms:
        return None
    w, n, layers, embd = info.model_size_bytes, info.n_params, info.n_layer, info.n_embd
    w -= info.embedding_lookup_bytes or 0
    n -= info.embedding_lookup_params or 0
    p = measurement.prompt_tokens or 0
    c_decode = p + (measurement.workload.max_tokens - 1) / 2
    decode = _phase(
        "decode",
        w + per_pos * c_decode,
        2 * n + 4 * layers * embd * c_decode,
        1,
        measurement.tpot_ms / 1e3,
        bw,
        tflops,
    )
    prefill = None
    if p and measurement.prefill_ms:
        micro_batches = math.ceil(p / (info.n_batch or p))
        prefill = _phase(
            "prefill",
            w * micro_batches + per_pos * p,
            2 * n * p + 4 * layers * embd * p * (p + 1) / 2,
            p,
            measurement.prefill_ms / 1e3,
            bw,
            tflops,
        )
    return Roofline(bw, tflops, c_decode, w, per_pos, decode, prefill)
