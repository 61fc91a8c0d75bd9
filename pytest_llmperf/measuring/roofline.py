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

The machine's peak memory bandwidth and FLOP rate (no API reports either) are given, or probed
once (``probe_bandwidth_gbs``: a buffer much larger than any cache copied by one thread per
core, as numpy releases the GIL; ``probe_tflops``) and cached per machine in the model cache folder; every report says whether
a figure was measured or given."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.documents import JSONValue, RefusedFile, loads, read_text
from ..core.errors import ConfigError
from ..core.fingerprint import hardware, hardware_key
from ..core.measurement import CACHE_RESIDENT, Peak, PhaseRoofline, Roofline
from ..core.workload import EngineInfo
from ..engines.llama_cpp_native import default_threads
from ..models.gguf import default_cache_dir

if TYPE_CHECKING:
    from ..core.measurement import Measurement


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


def _phase(
    name: str, bytes_moved: float, flops: float, tokens: int, seconds: float, bw: Peak, fl: Peak
) -> PhaseRoofline:
    peak_bps, peak_fps = bw.value * 1e9, fl.value * 1e12
    intensity = flops / bytes_moved
    bound_s = max(bytes_moved / peak_bps, flops / peak_fps)
    verdict = "memory-bound" if intensity < peak_fps / peak_bps else "compute-bound"
    achieved_bps = bytes_moved / seconds
    note = ""
    if verdict == "memory-bound" and achieved_bps > peak_bps:
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


def roofline(measurement: Measurement, bw: Peak, tflops: Peak) -> Roofline | None:
    """The roofline of a fresh Measurement; None when the engine does not expose the model facts
    (e.g. a served model), nothing was decoded, or it was read from a file (no workload)."""
    info: EngineInfo = measurement.engine
    per_pos, asked = info.kv_bytes_per_position(), measurement.workload
    if per_pos is None or info.model_size_bytes is None or info.n_params is None or not measurement.tpot_ms:
        return None
    if asked is None:
        return None
    w, n = _matmul_weights(info, info.model_size_bytes, info.n_params)
    layers, embd = info.n_layer, info.n_embd
    assert layers is not None and embd is not None  # kv_bytes_per_position needs both
    p = measurement.prompt_tokens or 0
    c_decode = p + (asked.max_tokens - 1) / 2
    decode = _phase(
        "decode", w + per_pos * c_decode, 2 * n + 4 * layers * embd * c_decode, 1, measurement.tpot_ms / 1e3, bw, tflops
    )
    prefill = None
    if p and measurement.prefill_ms:
        prefill = _prefill_phase(info, w, n, per_pos, p, measurement.prefill_ms, bw, tflops)
    return Roofline(bw, tflops, c_decode, w, per_pos, decode, prefill)


def _matmul_weights(info: EngineInfo, size_bytes: int, n_params: int) -> tuple[int, int]:
    """(bytes, parameters) of the weights the matrix products read: the model's less its
    embedding lookup (one row read per token, not the whole table)."""
    return size_bytes - (info.embedding_lookup_bytes or 0), n_params - (info.embedding_lookup_params or 0)


def _prefill_phase(
    info: EngineInfo, w: int, n: int, per_pos: float, p: int, prefill_ms: float, bw: Peak, tflops: Peak
) -> PhaseRoofline:
    """The prefill of ``p`` prompt tokens: the weights (``w`` bytes, ``n`` parameters) read once
    per micro-batch, every position's KV written, attention over the growing context."""
    layers, embd = info.n_layer, info.n_embd
    assert layers is not None and embd is not None  # kv_bytes_per_position needs both
    micro_batches = math.ceil(p / (info.n_batch or p))
    return _phase(
        "prefill",
        w * micro_batches + per_pos * p,
        2 * n * p + 4 * layers * embd * p * (p + 1) / 2,
        p,
        prefill_ms / 1e3,
        bw,
        tflops,
    )


PROBE_VERSION = 2


def probe_bandwidth_gbs(buffer_mib: int = 512, repeats: int = 5, threads: int | None = None) -> Peak:
    """Median copy bandwidth (read + write bytes / s) over ``repeats`` parallel buffer copies."""
    threads = threads or default_threads()
    n = buffer_mib * 2**20 // 8
    src = np.ones(n, dtype=np.float64)  # touched: pages are mapped before timing
    dst = np.zeros_like(src)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    parts = [(dst[a:b], src[a:b]) for a, b in pairwise(bounds[:-1])]
    rates = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda p: np.copyto(*p), parts))  # warm-up
        for _ in range(repeats):
            started = time.perf_counter_ns()
            list(pool.map(lambda p: np.copyto(*p), parts))
            elapsed_s = (time.perf_counter_ns() - started) / 1e9
            rates.append(2 * src.nbytes / elapsed_s / 1e9)
    return Peak(
        float(np.median(rates)),
        "measured",
        f"numpy copy of {buffer_mib} MiB on {threads} threads, read+write bytes, median of {repeats}",
    )


def _gemm_tflops(size: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b  # warm-up (BLAS threads start)
    rates = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        a @ b
        rates.append(2 * size**3 / ((time.perf_counter_ns() - started) / 1e9) / 1e12)
    return float(np.median(rates))


#: fp32 FLOPs per cycle per core by vector ISA: two FMA pipes x lanes x 2 (multiply + add).
FLOPS_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("avx", 16), ("asimd", 16), ("sse2", 8))


def _cpuinfo_flags_mhz(text: str) -> tuple[set[str], list[float]]:
    """The CPU feature flags and each core's current MHz in /proc/cpuinfo's ``text``."""
    flags = set()
    mhz = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
        elif key.strip() == "cpu MHz":
            mhz.append(float(value))
    return flags, mhz


def _max_freq_mhz() -> float | None:
    """cpu0's maximum clock (cpufreq) in MHz, None where the kernel does not say."""
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1000
    except (OSError, ValueError):
        return None


def _spec_tflops() -> tuple[float, str] | None:
    """cores x clock x FLOPs/cycle from /proc/cpuinfo: the dense peak a vendor would quote."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags, mhz = _cpuinfo_flags_mhz(text)
    max_mhz = _max_freq_mhz()
    if max_mhz is not None:
        mhz.append(max_mhz)
    per_cycle = next((n for flag, n in FLOPS_PER_CYCLE if flag in flags), None)
    if not mhz or per_cycle is None:
        return None
    cores = default_threads()
    peak = cores * max(mhz) * 1e6 * per_cycle / 1e12
    isa = next(flag for flag, n in FLOPS_PER_CYCLE if n == per_cycle and flag in flags)
    return peak, f"{cores} cores x {max(mhz):.0f} MHz x {per_cycle} fp32 FLOP/cycle ({isa})"


def probe_tflops(size: int = 1536, repeats: int = 5) -> Peak:
    """The larger of the CPU's spec peak (cores x clock x vector FLOPs/cycle) and a measured
    float32 GEMM rate (2 n^3 FLOPs per product; a GEMM can beat a nominal clock under turbo)."""
    gemm = _gemm_tflops(size, repeats)
    spec = _spec_tflops()
    detail = f"numpy float32 {size}x{size} matmul {gemm * 1e3:.0f} GFLOP/s (median of {repeats})"
    if spec is None or gemm >= spec[0]:
        return Peak(gemm, "measured", detail + (f"; spec {spec[1]} = {spec[0] * 1e3:.0f} GFLOP/s" if spec else ""))
    return Peak(spec[0], "cpu spec", f"{spec[1]} = {spec[0] * 1e3:.0f} GFLOP/s; {detail}")


#: The machine's reference figure (``baselines.records.slowdown``): the kind of its probe; two
#: references of different kinds are never compared.
REFERENCE_KIND = "numpy-sgemm-384"
REFERENCE_SIZE = 384
REFERENCE_REPS = 61


def probe_reference(reps: int = REFERENCE_REPS) -> dict[str, JSONValue]:
    """The machine's reference figure's runs: milliseconds per float32 product, ``reps`` times
    after one warm-up (taken after a measurement's runs, never inside its timed region)."""
    a = np.random.default_rng(0).standard_normal((REFERENCE_SIZE, REFERENCE_SIZE), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, a, out=out)
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        np.matmul(a, a, out=out)
        runs.append((time.perf_counter_ns() - t0) / 1e6)
    return {"kind": REFERENCE_KIND, "runs_ms": [round(v, 5) for v in runs]}


def last_level_cache_bytes() -> int | None:
    """Size of the CPU's largest cache (Linux sysfs), None where unknown: a working set below
    it can stay cached between decode steps and beat the DRAM bandwidth."""
    sizes = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for entry in base.glob("index*/size"):
        text = entry.read_text().strip() if entry.is_file() else ""
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        try:
            sizes.append(int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text))
        except (ValueError, OSError):
            continue
    return max(sizes) if sizes else None


def _given(option: str, value: float | None) -> Peak | None:
    """A peak given on the command line (``option``), None when not given."""
    if value is not None and not value > 0:
        raise ConfigError(f"{option} must be a positive number, got {value!r}")
    return Peak(float(value), "given") if value else None


def _read_cache(path: Path) -> JSONValue:
    """The peaks cache's JSON; ``{}`` for anything but a small regular JSON file (our own
    cache: it is probed again, and replaced)."""
    try:
        cached: JSONValue = loads(read_text(path, "peak cache file", "delete it", limit_mib=1))
        return cached
    except (OSError, ValueError, RefusedFile):
        return {}


def machine_peaks(
    *, given_bw_gbs: float | None = None, given_tflops: float | None = None, refresh: bool = False
) -> tuple[Peak, Peak]:
    """(bandwidth GB/s, TFLOP/s): given values win; else the cached probe for this machine,
    else a fresh probe (a few seconds), stored for next time."""
    bw = _given("--llmperf-peak-bw", given_bw_gbs)
    fl = _given("--llmperf-peak-tflops", given_tflops)
    if bw and fl:
        return bw, fl
    key = f"{hardware_key(hardware())}-v{PROBE_VERSION}"
    path = default_cache_dir() / "machine-peaks.json"
    cached = _read_cache(path)
    entry: Any = cached.get(key) if isinstance(cached, dict) and not refresh else None  # None: probed below
    try:
        m_bw, m_fl = Peak(**entry["bandwidth_gbs"]), Peak(**entry["tflops"])
    except (TypeError, KeyError):
        m_bw, m_fl = probe_bandwidth_gbs(), probe_tflops()
        cached = cached if isinstance(cached, dict) else {}
        cached[key] = {"bandwidth_gbs": asdict(m_bw), "tflops": asdict(m_fl)}
        _write_json(path, cached)
    return bw or m_bw, fl or m_fl


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    """Best effort (a read-only cache only costs a new probe next time), never half-written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
