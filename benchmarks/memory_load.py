"""Memory figures against llama.cpp's own reports, their spread across sessions, and cold against
warm model loads, on the embedded presets.

    python benchmarks/memory_load.py [--models tiny,small] [--sessions 5] [--loads 5] [--threads 1]

1. For each model, ``--sessions`` separate processes (each as a pytest session would: an engine
   worker, 64 prompt + 32 generated tokens, 5 runs) report the KV, compute and model buffers
   (llama.cpp's log, captured by the engine), the model file's mapping (smaps) and the worker's
   peak RSS over the runs; printed with their spread (max - min) across the sessions.
2. llama.cpp's own report for a context of the same size, in a process of its own
   (``Llama(verbose=True)``, its log read with a pattern of this script's): equal or not.
3. ``--loads`` warm and cold loads, interleaved (warm, cold, warm, ...), of a private copy of
   the model file (so no other process maps it and eviction can take): median load time and
   fresh-engine TTFT with the sample count, and how much of the file was resident before each
   load (mincore). A load that found the file resident counts as warm, whatever was asked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_llmperf import Workload, measure
from pytest_llmperf.engines.llama_cpp_native import EngineConfig
from pytest_llmperf.measuring.runner import with_model_loads
from pytest_llmperf.measuring.worker import load_worker
from pytest_llmperf.models.gguf import model_path

FIGURES = ("kv_mib", "compute_mib", "model_buffer_mib", "mapped_mib")
WORKLOAD = Workload(prompt_tokens=64, max_tokens=32, runs=5, warmup=1)


def one_session(model: str, threads: int) -> dict[str, object]:
    """What one session measures (an engine worker, as the plugin runs it)."""
    engine = load_worker(EngineConfig(model=model, threads=threads))
    try:
        m = measure(engine, WORKLOAD)
    finally:
        engine.close()
    info = m.engine
    return {
        **{k: getattr(info, k) for k in FIGURES},
        "rss_mib": m.peak_rss.bytes / 2**20 if m.peak_rss else None,
        "rss_scope": m.peak_rss.scope if m.peak_rss else None,
        "n_ctx": info.n_ctx,
        "n_batch": info.n_batch,
        "n_ubatch": info.n_ubatch,
        "flash_attn": info.flash_attn,
    }


def llama_cpp_report(path: str, s: dict[str, object]) -> dict[str, float]:
    code = (
        "import llama_cpp, sys; llama_cpp.Llama(sys.argv[1], n_ctx=int(sys.argv[2]), n_batch=int(sys.argv[3]), "
        "n_ubatch=int(sys.argv[4]), flash_attn=sys.argv[5] == 'True', n_threads=1, verbose=True)"
    )
    args = [path, str(s["n_ctx"]), str(s["n_batch"]), str(s["n_ubatch"]), str(s["flash_attn"])]
    err = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, check=True
    ).stderr
    out: dict[str, float] = {}
    for kind, mib in re.findall(r"(KV|compute|model) buffer size =\s+([\d.]+) MiB", err):
        out[kind] = out.get(kind, 0.0) + float(mib)
    return out


def private_copy(path: Path, folder: str) -> str:
    target = os.path.join(folder, path.name)
    shutil.copyfile(path, target)
    with open(target, "rb+") as fh:
        os.fsync(fh.fileno())  # clean pages: only those can be evicted
    return target


def loads(path: str, threads: int, n: int) -> dict[str, list]:
    config = EngineConfig(model=path, threads=threads)
    engine = load_worker(config)
    m = measure(engine, Workload(prompt_tokens=64, max_tokens=8, runs=1, warmup=0))
    engine.close()  # nothing of this process maps the file now
    out: dict[str, list] = {"warm": [], "cold": []}
    for _ in range(n):
        for kind in ("warm", "cold"):
            got = with_model_loads(engine, m, kind).model_loads
            assert got is not None
            for s in got.samples:
                out["cold" if s.cold else "warm"].append(s)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--session", help=argparse.SUPPRESS)  # one session's figures, as JSON
    args = parser.parse_args()
    if args.session:
        print(json.dumps(one_session(args.session, args.threads)))
        return 0
    for model in args.models.split(","):
        path, _ = model_path(model)
        sessions = []
        for _ in range(args.sessions):
            line = (
                subprocess.run(
                    [sys.executable, __file__, "--session", model, "--threads", str(args.threads)],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            sessions.append(json.loads(line))
        first = sessions[0]
        own = llama_cpp_report(str(path), first)
        print(
            f"\n{model} ({path.stat().st_size / 2**20:.1f} MiB file), n_ctx {first['n_ctx']}, {args.sessions} sessions:"
        )
        print(f"  {'figure':<18} {'min':>9} {'max':>9} {'spread':>8}  llama.cpp's own report")
        for key, kind in (*zip(FIGURES, ("KV", "compute", "model", None)), ("rss_mib", None)):
            values = [float(s[key]) for s in sessions if s[key] is not None]
            if not values:
                print(f"  {key:<18} n/a")
                continue
            lo, hi = min(values), max(values)
            theirs = own.get(kind) if kind else None
            agree = (
                ""
                if theirs is None
                else f"{theirs:.2f} MiB ({'equal' if all(v == theirs for v in values) else 'DIFFERS'})"
            )
            print(f"  {key:<18} {lo:9.3f} {hi:9.3f} {hi - lo:8.3f}  {agree}")
        scopes = {s["rss_scope"] for s in sessions}
        print(f"  rss_mib: the engine worker's peak over {WORKLOAD.runs} runs (scope {', '.join(map(str, scopes))})")
        with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as folder:
            got = loads(private_copy(path, folder), args.threads, args.loads)
        for kind in ("warm", "cold"):
            samples = got[kind]
            if not samples:
                print(f"  {kind} loads: none")
                continue
            share = max(s.resident_share for s in samples)
            print(
                f"  {kind} load: median {statistics.median(s.load_ms for s in samples):.1f} ms, fresh-engine TTFT "
                f"median {statistics.median(s.fresh_ttft_ms for s in samples):.1f} ms "
                f"({len(samples)} loads; at most {share:.0%} of the file resident before each)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
