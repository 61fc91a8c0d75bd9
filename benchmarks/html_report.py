"""How long a 200-test HTML report takes to render, and how big the file is.

Results are made by resampling the runs of a real session (tiny model, measured here
against a baseline recorded just before), some scaled slower or faster and judged again, so
every figure and verdict has realistic shapes and sizes:

    python benchmarks/html_report.py            # prints seconds and MB
    python benchmarks/html_report.py --tests 50 --out /tmp/report.html
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.regression import CompareSettings, judge
from pytest_llmperf.judge.result import MeasurementResult

SUITE = """
import pytest

@pytest.mark.llmperf(prompt_tokens=64, max_tokens=64, runs=20, p95_ms=50, ttft_ms=200, min_tps=100)
def test_decode(): pass
"""


def real_result(workdir: Path) -> dict:
    """One measured result, with its baseline, from a real pytest session on the tiny model."""
    (workdir / "test_bench.py").write_text(SUITE)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--llmperf-model",
        "tiny",
        "--llmperf-threads",
        "1",
    ]
    # Not checked: a breached budget exits 1 and the session JSON still holds the result.
    subprocess.run(cmd + ["--llmperf-update-baselines"], cwd=workdir, capture_output=True, timeout=300, check=False)
    subprocess.run(cmd + ["--llmperf-json", "session.json"], cwd=workdir, capture_output=True, timeout=300, check=False)
    (result,) = json.loads((workdir / "session.json").read_text())["results"]
    return result


def resampled(result: dict, index: int, rng: np.random.Generator) -> dict:
    """A plausible other test: runs resampled, scaled by a per-test factor (some slower)."""
    r = copy.deepcopy(result)
    factor = float(rng.choice([1.0, 1.0, 1.0, 1.3, 0.8])) * float(rng.uniform(0.9, 1.1))
    rec = r["record"]
    picks = rng.integers(0, len(rec["itl_ms"]), len(rec["itl_ms"]))
    rec["itl_ms"] = [[v * factor for v in rec["itl_ms"][i]] for i in picks]
    for key, values in rec["runs"].items():
        scale = 1 / factor if key.endswith("tps") else factor
        rec["runs"][key] = [values[i] * scale for i in picks]
    for key in ("ttft_ms", "prefill_tps", "tpot_ms", "decode_tps"):
        if key in rec["runs"]:
            rec["summary"][key] = float(np.median(rec["runs"][key]))
    pooled = np.concatenate(rec["itl_ms"])
    for q in (50, 95, 99):
        rec["summary"][f"itl_p{q}_ms"] = float(np.percentile(pooled, q))
    if r.get("baseline_record"):  # judged again, so the verdicts vary as a real session's do
        verdict = judge(
            {"hw": Measurement.read(r["baseline_record"])},
            "hw",
            Measurement.read(rec),
            CompareSettings(family_size=5 * 200),
        )
        r["verdict"] = verdict.to_json()
    r["test"] = f"tests/test_perf_{index // 10:02d}.py::test_case_{index}"
    return r


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished children (report workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--out", default=None, help="keep the report here")
    args = parser.parse_args()
    from pytest_llmperf.reports.html import render_html

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("LLMPERF_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".llmperf-cache"))
        base = real_result(Path(tmp))
        rng = np.random.default_rng(0)
        results = [MeasurementResult.from_json(resampled(base, i, rng)) for i in range(args.tests)]
        started, cpu = time.perf_counter(), _cpu_seconds()
        page = render_html(results, created_at="benchmark")
        seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
        out = Path(args.out) if args.out else Path(tmp) / "report.html"
        out.write_text(page, encoding="utf-8")
        mb = out.stat().st_size / 1e6
    load = os.getloadavg()[0]
    print(
        f"HTML report of {args.tests} tests: rendered in {seconds:.1f} s ({cpu:.1f} CPU-seconds over all "
        f"processes), {mb:.2f} MB (targets: < 30 s, < 10 MB; {os.cpu_count()} CPUs, load average {load:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
