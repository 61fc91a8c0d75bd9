"""The machine's peak memory bandwidth and FLOP rate: measured once, cached, or given.

No API reports either, and the roofline needs both. The bandwidth probe copies a buffer much
larger than any cache with one numpy copy per core in parallel (numpy releases the GIL while it
copies), counting read + write bytes (median of a few repeats). The FLOP peak is the larger of the
CPU's spec figure (cores x clock x vector FLOPs per cycle) and a timed float32 matrix product. Results are cached per machine (hardware
fingerprint) in the model cache folder, and every report says whether a figure was measured or
given by the user.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from ..core.documents import RefusedFile, read_text

PROBE_VERSION = 2


@dataclass(frozen=True)
class Peak:
    """A peak figure and where it came from: "measured" (with the probe's details) or "given"."""

    value: float
    source: str
    detail: str = ""


def probe_bandwidth_gbs(buffer_mib: int = 512, repeats: int = 5, threads: int | None = None) -> Peak:
    """Median copy bandwidth (read + write bytes / s) over ``repeats`` parallel buffer copies."""
    from ..engines.llama_cpp_native import default_threads

    threads = threads or default_threads()
    n = buffer_mib * 2**20 // 8
    src = np.ones(n, dtype=np.float64)  # touched: pages are mapped before timing
    dst = np.zeros_like(src)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    parts = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
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


def _spec_tflops() -> tuple[float, str] | None:
    """cores x clock x FLOPs/cycle from /proc/cpuinfo: the dense peak a vendor would quote."""
    from ..engines.llama_cpp_native import default_threads

    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return None
    flags = set()
    mhz = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
        elif key.strip() == "cpu MHz":
            mhz.append(float(value))
    try:
        mhz.append(int(open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read()) / 1000)
    except (OSError, ValueError):
        pass
    per_cycle = next((n for flag, n in FLOPS_PER_CYCLE if flag in flags), None)
    if not mhz or per_cycle is None:
        return None
    cores = default_threads()
    value = cores * max(mhz) * 1e6 * per_cycle / 1e12
    isa = next(flag for flag, n in FLOPS_PER_CYCLE if n == per_cycle and flag in flags)
    return value, f"{cores} cores x {max(mhz):.0f} MHz x {per_cycle} fp32 FLOP/cycle ({isa})"


def probe_tflops(size: int = 1536, repeats: int = 5) -> Peak:
    """The larger of the CPU's spec peak (cores x clock x vector FLOPs/cycle) and a measured
    float32 GEMM rate (2 n^3 FLOPs per product; a GEMM can beat a nominal clock under turbo)."""
    gemm = _gemm_tflops(size, repeats)
    spec = _spec_tflops()
    detail = f"numpy float32 {size}x{size} matmul {gemm * 1e3:.0f} GFLOP/s (median of {repeats})"
    if spec is None or gemm >= spec[0]:
        return Peak(gemm, "measured", detail + (f"; spec {spec[1]} = {spec[0] * 1e3:.0f} GFLOP/s" if spec else ""))
    return Peak(spec[0], "cpu spec", f"{spec[1]} = {spec[0] * 1e3:.0f} GFLOP/s; {detail}")


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


def _cache_file() -> Path:
    from ..models.gguf import default_cache_dir

    return default_cache_dir() / "machine-peaks.json"


def machine_peaks(
    *, given_bw_gbs: float | None = None, given_tflops: float | None = None, refresh: bool = False
) -> tuple[Peak, Peak]:
    """(bandwidth GB/s, TFLOP/s): given values win; else the cached probe for this machine,
    else a fresh probe (a few seconds), stored for next time."""
    from ..core.fingerprint import hardware, hardware_key

    for name, value in (("--llmperf-peak-bw", given_bw_gbs), ("--llmperf-peak-tflops", given_tflops)):
        if value is not None and not value > 0:
            raise ConfigError(f"{name} must be a positive number, got {value!r}")
    bw = Peak(float(given_bw_gbs), "given") if given_bw_gbs else None
    fl = Peak(float(given_tflops), "given") if given_tflops else None
    if bw and fl:
        return bw, fl
    key = f"{hardware_key(hardware())}-v{PROBE_VERSION}"
    path = _cache_file()
    cached: dict = {}
    try:  # our own cache: anything but a small regular JSON file is probed again, and replaced
        cached = json.loads(read_text(path, "peak cache file", "delete it", limit_mib=1))
    except (OSError, ValueError, RefusedFile):
        cached = {}
    entry = cached.get(key) if isinstance(cached, dict) and not refresh else None
    try:
        m_bw, m_fl = Peak(**entry["bandwidth_gbs"]), Peak(**entry["tflops"])
    except (TypeError, KeyError):
        m_bw, m_fl = probe_bandwidth_gbs(), probe_tflops()
        cached = cached if isinstance(cached, dict) else {}
        cached[key] = {"bandwidth_gbs": asdict(m_bw), "tflops": asdict(m_fl)}
        _write_json(path, cached)
    return bw or m_bw, fl or m_fl


def _write_json(path: Path, data: dict) -> None:
    """Best effort (a read-only cache only costs a new probe next time), never half-written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
